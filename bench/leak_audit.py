"""The leak-aware commands at release size: the filter presets' counts on ImageNet-21K-P, then `isood wordnet
audit` and `isood splits clean` of a release-shaped splits manifest (default 12,000,000 rows of 10,450 ImageNet-21K-P
winter21 classes over 64 cells with one list file per cell, as an import of the IS-OOD release).

Prints the kept candidates of `isood wordnet filter --candidates 21k-p|21k-p-w21` per preset, with and without
--sisters-only (WordNet 3.0; the ImageNet-OOD paper reports 5,074 with the 21K-P semantic tree), and the wall time
and peak RSS of each command, run as its own process. The peak is the command's own VmHWM, read by the command
as it exits: ``ru_maxrss`` of a child (``os.wait4``) also counts the resident size of this process when it
spawned the child (here the 12M-row manifest it built: ~2.3 GB), which made every command look that large.
Target: < 2 GB each. One SUMMARY line and a row in bench/results.local.md (``--no-record`` to skip).
``--quick``: 1,000,000 rows; ``--full``: the default size. Run: .venv/bin/python bench/leak_audit.py
"""

import argparse
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _results import gb, record, summary  # noqa: E402

#: The isood CLI in a child that prints its own peak RSS (VmHWM: this process only) as it exits.
ISOOD = [sys.executable, "-c", "import atexit, sys\n"
         "def _peak():\n"
         "    for line in open('/proc/self/status'):\n"
         "        if line.startswith('VmHWM:'):\n"
         "            sys.stderr.write(f'\\nBENCH_PEAK_KB {line.split()[1]}\\n')\n"
         "atexit.register(_peak)\n"
         "from isood.cli import main; sys.argv[0] = 'isood'; main()"]
TARGET_RSS = 2e9


def preset_counts() -> dict[tuple[str, str, bool], int]:
    """Kept candidates per (list, preset, sisters_only)."""
    from wordnet_tools.class_filter import filter_classes
    from wordnet_tools.hierarchy import load_hierarchy
    from wordnet_tools.rules import PRESETS, resolve_exclude
    from wordnet_tools.synsets import load_synset_list

    h, ids, out = load_hierarchy(), load_synset_list("1k"), {}
    for cand in ("21k-p", "21k-p-w21"):
        wnids = load_synset_list(cand)
        for preset in PRESETS:
            for sisters in (False, True):
                df = filter_classes(wnids, ids, h, exclude=resolve_exclude(None, preset), sisters_only=sisters)
                out[(cand, preset, sisters)] = int((df["decision"] == "keep").sum())
    return out


def release_manifest(root: Path, rows: int, seed: int = 0) -> None:
    """A splits manifest shaped like an import of the release: paths, wnids, NaN shifts, levels, cells."""
    import numpy as np
    import pyarrow as pa
    import pyarrow.compute as pc

    import manifests
    from isood.science.grid import cell_table, edges_table
    from isood.kinds import SPLITS
    from wordnet_tools.synsets import load_synset_list

    rng = np.random.default_rng(seed)
    classes = pa.array(load_synset_list("21k-p-w21"))
    wnid = classes.take(pa.array(rng.integers(0, len(classes), rows)))
    cov, sem = rng.integers(0, 8, rows), rng.integers(0, 8, rows)
    text = lambda a: pc.cast(pa.array(a), pa.string())  # noqa: E731
    images = pa.table({
        "path": pc.binary_join_element_wise("imagenet21k_val/", wnid, "/", wnid, "_", text(np.arange(rows)), ".JPEG",
                                            ""),
        "wnid": wnid, "d_sem": pa.array(np.full(rows, np.nan)), "d_cov": pa.array(np.full(rows, np.nan)),
        "sem_level": sem, "cov_level": cov,
        "cell": pc.binary_join_element_wise("cov_", text(cov), "_sem_", text(sem), ""),
        "subset": pa.repeat(pa.scalar("val"), rows)})
    lists = []  # one list file per cell, as an import keeps them
    code = cov * 8 + sem
    order = np.argsort(code, kind="stable")
    bounds = np.searchsorted(code[order], np.arange(65))
    for k in range(64):
        rel = f"lists/val/cov_{k // 8}_sem_{k % 8}.txt"
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        paths = images["path"].take(pa.array(order[bounds[k]:bounds[k + 1]])).to_pylist()
        (root / rel).write_text("".join(f"{p}\n" for p in paths))
        lists.append(rel)
    manifests.write_manifest(root, kind=SPLITS, tables={"images": images, "cells": cell_table(cov, sem, 8, 10),
                                                        "edges": edges_table(np.full(9, np.nan), np.full(9, np.nan))},
                             existing_files=lists, config={"na_threshold": 10, "import": "bench"},
                             argv=["bench/leak_audit.py"])


def run(args: list[str]) -> tuple[float, int]:
    """Wall seconds and peak RSS (bytes: the command's own VmHWM) of one `isood` command in its own process."""
    t = time.perf_counter()
    proc = subprocess.run(ISOOD + args, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    seconds = time.perf_counter() - t
    if proc.returncode != 0:
        raise SystemExit(f"isood {' '.join(args)} failed: {proc.stderr[-400:]}")
    peaks = [int(line.split()[1]) for line in proc.stderr.splitlines() if line.startswith("BENCH_PEAK_KB ")]
    if not peaks:
        raise SystemExit(f"isood {' '.join(args)} printed no peak (needs Linux /proc)")
    return seconds, peaks[-1] * 1024


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rows", type=int, default=12_000_000)
    ap.add_argument("--quick", action="store_true", help="1,000,000 rows")
    ap.add_argument("--full", action="store_true", help="the default size (12,000,000 rows)")
    ap.add_argument("--no-record", action="store_true", help="do not append to bench/results.local.md")
    args = ap.parse_args(argv)
    rows = 1_000_000 if args.quick else args.rows
    load = os.getloadavg()[0]
    counts = preset_counts()
    for (cand, preset, sisters), n in counts.items():
        print(f"wordnet filter --candidates {cand} --preset {preset}{' --sisters-only' if sisters else ''}: {n} kept")
    with tempfile.TemporaryDirectory(prefix="isood-leak-bench-") as tmp:
        root = Path(tmp)
        t = time.perf_counter()
        release_manifest(root / "splits", rows)
        print(f"release-shaped splits manifest: {rows:,} rows in {time.perf_counter() - t:.1f} s")
        t_audit, m_audit = run(["wordnet", "audit", str(root / "splits"), "--out", str(root / "audit")])
        print(f"isood wordnet audit: {t_audit:.1f} s, peak RSS {gb(m_audit)}")
        t_clean, m_clean = run(["splits", "clean", str(root / "splits"), "--audit", str(root / "audit"),
                                "--out", str(root / "clean")])
        print(f"isood splits clean: {t_clean:.1f} s, peak RSS {gb(m_clean)}")
    paper, release = counts[("21k-p", "imagenet-ood-paper", False)], counts[("21k-p", "imagenet-ood-release", False)]
    meets = "meet" if max(m_audit, m_clean) < TARGET_RSS else "miss"
    text = (f"21k-p vs 1k kept: paper preset {paper} (paper reports 5074), release preset {release}; "
            f"{rows:,} rows: audit {t_audit:.1f} s / {gb(m_audit)}, clean {t_clean:.1f} s / {gb(m_clean)} "
            f"(peaks: each command's own VmHWM; target < {gb(TARGET_RSS)} each: {meets}; load average "
            f"{load:.1f} at the start)")
    summary("leak_audit", text)
    if not args.no_record:
        record("leak_audit.py" + (" quick" if args.quick else ""),
               f"{rows:,} rows, 10,450 classes, 64 cells; WordNet 3.0", text)


if __name__ == "__main__":
    main()
