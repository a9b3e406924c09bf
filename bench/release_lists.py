"""IS-OOD release at full size: import, export, verify and `datasets.load_dataset` of release-shaped lists.

Generates an `imagenet21k` release folder like the official one (64 cells x {train, val}, lines such as
`./imagenet21k_train/n01234567/n01234567_1234.JPEG`, ~96% of the rows in train, cells from a few rows (N/A) to
over a million, 12M rows by default), then runs each step in a fresh subprocess and reports its wall time and
peak RSS (the child's own VmHWM, so libraries are included):

    import     isood import isood-lists REL --out M          (pooled N/A, streamed)
    export     isood export openood M --out E                (release layout + OpenOOD imglists)
    verify     isood verify M                                (every sha256)
    load       datasets.load_dataset(M) + one cell config    (the 12M-row `all` config and the largest cell)

Targets: each < 2 GB peak RSS and < 60 s on 2 cores. Prints a SUMMARY line and appends a row to
bench/results.local.md. `--rows 200000` for a quick run; `--keep DIR` keeps the files.

    python bench/release_lists.py [--rows 12000000] [--keep DIR] [--no-record]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from _results import gb, phase_peak_bytes, record, summary  # noqa: E402

STEPS = ("import", "export", "verify", "load")
TARGET_S, TARGET_RSS = 60.0, 2e9


def cell_sizes(total: int, n_levels: int = 8, seed: int = 0):
    """Rows per (subset, cov, sem): a skewed grid (most rows at high semantic shift, a few tiny cells) that sums
    to `total`, ~4% of every cell in val."""
    import numpy as np

    rng = np.random.default_rng(seed)
    weight = rng.lognormal(0.0, 1.6, size=(n_levels, n_levels))
    weight[rng.random((n_levels, n_levels)) < 0.12] = 0.0  # empty or nearly empty cells, as in the release
    weight /= weight.sum()
    cells = np.floor(weight * total).astype(np.int64)
    cells[0, 0] += total - cells.sum()
    val = np.floor(cells * 0.04).astype(np.int64)
    return {"train": cells - val, "val": val}


def write_release(root: Path, total: int, *, n_wnids: int = 12_000, seed: int = 0) -> int:
    """Write `root/{train,val}/cov_{c}_sem_{s}.txt` with `total` unique paths; returns the bytes written."""
    import numpy as np
    import pyarrow as pa
    import pyarrow.compute as pc

    rng = np.random.default_rng(seed)
    wnids = pa.array([f"n{x:08d}" for x in rng.choice(10 ** 8, size=n_wnids, replace=False)])
    nbytes, serial = 0, 0
    for subset, grid in cell_sizes(total, seed=seed).items():
        for (c, s), n in np.ndenumerate(grid):
            f = root / subset / f"cov_{c}_sem_{s}.txt"
            f.parent.mkdir(parents=True, exist_ok=True)
            w = pc.take(wnids, pa.array(rng.integers(0, n_wnids, size=int(n))))
            k = pc.cast(pa.array(np.arange(serial, serial + int(n))), pa.string())
            serial += int(n)
            name = pc.binary_join_element_wise(w, pc.binary_join_element_wise(k, ".JPEG", ""), "_")
            path = pc.binary_join_element_wise(f"./imagenet21k_{subset}", w, name, "/")
            text = pc.binary_join_element_wise(path, "", "\n")  # `path\n`, one chunk, offset 0
            offsets = np.frombuffer(text.buffers()[1], dtype=np.int32)
            with open(f, "wb") as out:
                out.write(memoryview(text.buffers()[2])[offsets[0]:offsets[len(text)]] if len(text) else b"")
            nbytes += f.stat().st_size
    return nbytes


def child(step: str, work: Path) -> None:
    """Run one step in this (fresh) process; print its wall time and peak RSS as JSON."""
    t = time.perf_counter()
    if step == "import":
        from isood.stages.interop import import_isood_lists

        import_isood_lists(work / "imagenet21k", work / "m", argv=["bench"])
    elif step == "export":
        from isood.stages.interop import export_openood

        export_openood(work / "m", work / "e")
    elif step == "verify":
        import manifests

        assert manifests.verify(work / "m").ok
    else:
        import datasets

        import pyarrow.parquet as pq

        cells = pq.read_table(work / "m/data/cells.parquet").to_pandas()
        biggest = cells.sort_values("n").iloc[-1]  # the largest pooled cell
        ds = datasets.load_dataset(str(work / "m"), cache_dir=str(work / "hf"))
        cell = datasets.load_dataset(str(work / "m"), biggest["cell"], cache_dir=str(work / "hf"))
        assert ds["test"].num_rows == int(cells["n"].sum()) and cell["test"].num_rows == int(biggest["n"])
    # VmHWM: this process's own peak (ru_maxrss would include the parent's resident size at fork time)
    print(json.dumps({"step": step, "wall_s": time.perf_counter() - t, "peak_rss": phase_peak_bytes()}), flush=True)


def run_step(step: str, work: Path) -> dict:
    env = {**os.environ, "HF_DATASETS_OFFLINE": "1", "HF_HUB_OFFLINE": "1"}
    res = subprocess.run([sys.executable, __file__, "--child", step, "--work", str(work)], capture_output=True,
                         text=True, env=env)
    if res.returncode != 0:
        raise SystemExit(f"{step} failed:\n{res.stderr[-3000:]}")
    return json.loads(res.stdout.strip().splitlines()[-1])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--rows", type=int, default=12_000_000)
    ap.add_argument("--keep", type=Path, default=None, help="work in this folder and keep it")
    ap.add_argument("--no-record", action="store_true", help="do not append to bench/results.local.md")
    ap.add_argument("--child", choices=STEPS, help=argparse.SUPPRESS)
    ap.add_argument("--work", type=Path, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        return child(args.child, args.work)
    work = args.keep or Path(tempfile.mkdtemp(prefix="isood-release-bench-"))
    try:
        t = time.perf_counter()
        nbytes = write_release(work / "imagenet21k", args.rows)
        print(f"generated {args.rows:,} rows ({nbytes / 1e6:.0f} MB of lists) in {time.perf_counter() - t:.1f} s",
              flush=True)
        load = os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan")
        results = {}
        for step in STEPS:
            results[step] = r = run_step(step, work)
            print(f"{step:7s} {r['wall_s']:6.1f} s  peak RSS {gb(r['peak_rss'])}", flush=True)
        ok = all(r["wall_s"] < TARGET_S and r["peak_rss"] < TARGET_RSS for r in results.values())
        text = ("; ".join(f"{s} {r['wall_s']:.1f} s / {gb(r['peak_rss'])}" for s, r in results.items())
                + f" (targets < {TARGET_S:.0f} s and < {gb(TARGET_RSS)} each: {'meet' if ok else 'MISS'}; "
                f"load average {load:.1f} at the start)")
        sizes = f"{args.rows:,} rows, 128 lists (64 cells x train/val), {nbytes / 1e6:.0f} MB of lists"
        summary("release_lists", f"{sizes} | {text}")
        if not args.no_record:
            record("release_lists.py", sizes, text)
    finally:
        if args.keep is None:
            shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
