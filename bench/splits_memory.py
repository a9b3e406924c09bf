"""Peak resident memory of `isood build-splits` per test image and per ID image (the whole process: load,
clean, LAID, search, grid, manifest write), on synthetic 512-d features.

The test set is a features manifest in shards of 10,000 rows (``features-NNNNN.npy``, written by the feature
store's writers; paths ``<wnid>/<wnid>_<i>.JPEG`` over 10,450 wnids, like ImageNet-21K-P), the ID set a
``features.npy`` + ``index.parquet`` folder, LAID a random rotation. Each build runs in a child process
(``python -c 'from isood.cli import main; main()' build-splits ...``, exact faiss-flat search) and its peak RSS
is the child's ``ru_maxrss`` (os.wait4): its own memory plus the pages of memory-mapped files it held at the
peak. Three builds: (test N/4, ID n), (test N, ID n), (test N/4, ID 2n) give, by differences, bytes per test
image, bytes per ID image, and the fixed rest (N/4 spans more than one 65,536-row block, so the blocks' memory is
in the fixed rest). ``--code DIR`` runs another checkout (e.g. the previous commit,
``git archive HEAD | tar -x -C DIR``) to compare before/after on the same data.

    python bench/splits_memory.py                           # N = 1,000,000 test rows, n = 10,000 ID rows
    python bench/splits_memory.py --quick                   # N = 400,000
    python bench/splits_memory.py --code /tmp/isood-old --label before
"""
from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from _results import gb, record, summary  # noqa: E402

DIM, SHARD, N_WNIDS = 512, 10_000, 10_450
ROOT = Path(__file__).resolve().parents[1]
CHILD = "from isood.cli import main; main()"


def _wnids(n: int, seed: int) -> list[str]:
    cls = np.sort(np.random.default_rng(seed).integers(0, N_WNIDS, n))
    return [f"n{9_000_000 + 37 * int(c):08d}" for c in cls]


def _unit_rows(rng: np.random.Generator, n: int) -> np.ndarray:
    x = rng.standard_normal((n, DIM), dtype=np.float32)
    x /= np.linalg.norm(x, axis=1, keepdims=True)
    return x


def write_test(out: Path, n: int, *, seed: int = 0, link_from: Path | None = None) -> Path:
    """A features manifest of ``n`` unit rows in shards of :data:`SHARD` (hard links to the shards of
    ``link_from`` when given: the first ``n`` rows of that set)."""
    import pandas as pd

    from isood.features.featurestore import SHARD_NAME, SHARD_ROWS_NAME, read_shard_rows, write_features_manifest, write_shard

    out.mkdir(parents=True)
    rng, wnids, shard_rows = np.random.default_rng(seed), _wnids(n, seed), {}
    for k, s in enumerate(range(0, n, SHARD)):
        m = min(SHARD, n - s)
        if link_from is not None:
            for name in (SHARD_NAME.format(k), SHARD_ROWS_NAME.format(k)):
                os.link(link_from / name, out / name)
            shard_rows[k] = read_shard_rows(out / SHARD_ROWS_NAME.format(k))[0]
            continue
        rows = pd.DataFrame({"path": [f"{w}/{w}_{i}.JPEG" for i, w in zip(range(s, s + m), wnids[s:s + m])],
                             "wnid": wnids[s:s + m], "row": np.arange(m, dtype=np.int64), "error": ""})
        write_shard(out, k, f"bench{k}", rows, _unit_rows(rng, m))
        shard_rows[k] = rows
    config = {"images": str(out / "images"), "source_kind": "folder", "clip": "bench", "clip_identity": "bench",
              "embed_dim": DIM, "shard_size": SHARD}
    write_features_manifest(out, shard_rows, config, [])
    return out


def write_id(out: Path, n: int, *, seed: int = 1) -> Path:
    import pandas as pd

    out.mkdir(parents=True)
    np.save(out / "features.npy", _unit_rows(np.random.default_rng(seed), n))
    pd.DataFrame({"path": [f"{w}/{w}_{i}.JPEG" for i, w in enumerate(_wnids(n, seed))]}).to_parquet(
        out / "index.parquet")
    return out


def run_build(code: Path, test: Path, ids: Path, laid: Path, out: Path) -> tuple[int, float]:
    """(peak RSS bytes, seconds) of one build-splits child process running the checkout ``code``."""
    env = {**os.environ, "PYTHONPATH": str(code)}
    args = [sys.executable, "-c", CHILD, "build-splits", "--id", str(ids), "--test", str(test), "--laid", str(laid),
            "--out", str(out), "--backend", "faiss-flat"]
    t = time.perf_counter()
    with open(out.with_suffix(".log"), "w") as log:
        proc = subprocess.Popen(args, env=env, stdout=log, stderr=subprocess.STDOUT, cwd=str(code))
        _, status, usage = os.wait4(proc.pid, 0)
    seconds = time.perf_counter() - t
    proc.returncode = os.waitstatus_to_exitcode(status)
    if proc.returncode != 0:
        raise SystemExit(f"build-splits failed ({proc.returncode}); see {out.with_suffix('.log')}")
    return usage.ru_maxrss * 1024, seconds


def measure_memory(*, test_rows: int, id_rows: int, code: Path = ROOT, data: Path | None = None) -> dict:
    """Three builds (module docstring): ``mem_test_row``, ``mem_id_row`` (bytes), ``mem_fixed`` and ``runs``
    {(test, ID): (peak bytes, seconds)}. ``data``: where the synthetic sets are kept (reused when present)."""
    big, small, n_id = test_rows, test_rows // 4, id_rows
    sizes = ((small, n_id), (big, n_id), (small, 2 * n_id))
    with tempfile.TemporaryDirectory() as tmp:
        data = data or Path(tmp)
        t = time.perf_counter()
        if not (data / "laid.safetensors").exists():
            from isood.science.laid import LAID
            from isood.science.simulate import random_orthogonal

            test_big = write_test(data / f"test-{big}", big)
            write_test(data / f"test-{small}", small, link_from=test_big)
            for n in (n_id, 2 * n_id):
                write_id(data / f"id-{n}", n)
            LAID(random_orthogonal(DIM, seed=0)).save(data / "laid.safetensors")
        print(f"data in {time.perf_counter() - t:.0f} s under {data}", flush=True)
        runs = {}
        for n_test, n_ref in sizes:
            runs[n_test, n_ref] = run_build(code, data / f"test-{n_test}", data / f"id-{n_ref}",
                                            data / "laid.safetensors", Path(tmp) / f"out-{n_test}-{n_ref}")
            print(f"test {n_test:,} x ID {n_ref:,}: peak RSS {gb(runs[n_test, n_ref][0])}, "
                  f"{runs[n_test, n_ref][1]:.0f} s", flush=True)
    per_test = (runs[big, n_id][0] - runs[small, n_id][0]) / (big - small)
    per_id = (runs[small, 2 * n_id][0] - runs[small, n_id][0]) / n_id
    fixed = runs[small, n_id][0] - per_test * small - per_id * n_id
    return {"mem_test_row": per_test, "mem_id_row": per_id, "mem_fixed": fixed, "runs": runs}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--test-rows", type=int, default=1_000_000, help="N (a multiple of 40,000)")
    p.add_argument("--id-rows", type=int, default=10_000, help="n")
    p.add_argument("--quick", action="store_true", help="N = 400,000")
    p.add_argument("--code", type=Path, default=ROOT, help="checkout to run (default: this one)")
    p.add_argument("--label", default="", help="recorded with the row (e.g. before / after)")
    p.add_argument("--data", type=Path, help="keep the synthetic data here (reused when present)")
    p.add_argument("--no-record", action="store_true", help="do not append to bench/results.local.md")
    a = p.parse_args(argv)
    big, n_id = (400_000 if a.quick else a.test_rows), a.id_rows
    load = os.getloadavg()[0]  # wall times are noisy on shared cores; the peaks are not
    m = measure_memory(test_rows=big, id_rows=n_id, code=a.code, data=a.data)
    per_test, per_id, fixed, runs = m["mem_test_row"], m["mem_id_row"], m["mem_fixed"], m["runs"]
    label = f" {a.label}" if a.label else ""
    text = (f"build-splits{label}: peak RSS {gb(runs[big, n_id][0])} for {big:,} test x {n_id:,} ID images; "
            f"{per_test:,.0f} B per test image (features {DIM * 4:,} B), {per_id:,.0f} B per ID image "
            f"(features + LAID halves {2 * DIM * 4:,} B), fixed {gb(fixed)}; at 11,797,647 x 1,281,167: "
            f"{gb(per_test * 11_797_647 + per_id * 1_281_167 + fixed)}")
    summary("splits_memory", text)
    if not a.no_record:
        runs_text = "; ".join(f"{t:,} x {r:,}: {gb(v[0])}, {v[1]:.0f} s" for (t, r), v in runs.items())
        record("splits_memory.py" + label, f"{DIM}-d, test {big // 4:,} / {big:,} rows in {SHARD:,}-row shards, ID "
               f"{n_id:,} / {2 * n_id:,} rows, faiss-flat", f"{text} | {runs_text} (load average {load:.1f} at the start)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
