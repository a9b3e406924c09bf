"""Build a splits-like manifest with 14M synthetic rows through manifests.write_manifest: wall time, peak memory.

The IS-OOD test pool (ImageNet-21K-P) is ~13-14M images, and `isood build-splits` writes one row per image:
path, wnid, d_sem, d_cov, sem_level, cov_level, cell (isood.stages.splits). This script makes such a table
(10,450 wnids, paths ``<wnid>/<wnid>_<i>.JPEG``, seeded shifts and levels) the way build-splits holds it (a
pandas DataFrame; ``--input arrow`` for a pyarrow Table), then times ``write_manifest`` (plus the small cells
and edges tables) and reads the peak resident memory while writing (VmHWM, reset after the table is built; ``ru_maxrss`` where
that is not possible): the process with its table resident, plus what the writer adds. tracemalloc would miss
Arrow's allocations (not Python objects), hence RSS. Target: peak < 2 GB.

    python bench/manifest_build.py                 # 14,000,000 rows
    python bench/manifest_build.py --rows 1000000  # quick
"""
from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from _results import floor_text, gb, peak_rss_bytes, peaks, phase_peak_bytes, record, reset_peak, rss_bytes, summary  # noqa: E402

TARGET_BYTES = 2e9
N_WNIDS = 10_450  # ImageNet-21K-P winter21 classes
LEVELS = 8


def make_table(n: int, seed: int = 0):
    """The images table as a pyarrow Table (built column by column in Arrow: no Python string per row)."""
    import numpy as np
    import pyarrow as pa
    import pyarrow.compute as pc

    rng = np.random.default_rng(seed)
    wnids = pa.array([f"n{9_000_000 + 37 * k:08d}" for k in range(N_WNIDS)])
    cls = rng.integers(0, N_WNIDS, n, dtype=np.int32)
    order = np.argsort(cls, kind="stable")  # sorted by class, as a dataset listing is
    cls = cls[order]
    wnid = wnids.take(pa.array(cls))
    path = pc.binary_join_element_wise(wnid, "/", wnid, "_", pc.cast(pa.array(np.arange(n, dtype=np.int64)), pa.string()),
                                       ".JPEG", "")
    d_sem = rng.random(n, dtype=np.float32) * 0.4
    d_cov = rng.random(n, dtype=np.float32) * 0.6
    sem = np.minimum((d_sem / 0.4 * LEVELS).astype(np.int64), LEVELS - 1)
    cov = np.minimum((d_cov / 0.6 * LEVELS).astype(np.int64), LEVELS - 1)
    from isood.science.grid import cell_names

    c_idx, s_idx = np.divmod(np.arange(LEVELS * LEVELS), LEVELS)
    names = pa.array(cell_names(c_idx, s_idx))
    cell = names.take(pa.array(cov * LEVELS + sem))
    return pa.table({"path": path, "wnid": wnid, "d_sem": d_sem, "d_cov": d_cov, "sem_level": sem, "cov_level": cov,
                     "cell": cell})


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rows", type=int, default=14_000_000)
    p.add_argument("--input", choices=("pandas", "arrow"), default="pandas",
                   help="how the table is handed to write_manifest (build-splits hands a pandas DataFrame)")
    p.add_argument("--full", action="store_true", help="same size (14M is the real size); kept for run_all --full")
    p.add_argument("--out", type=Path, help="write here (default: a temporary directory)")
    p.add_argument("--no-record", action="store_true", help="do not append to bench/results.local.md")
    a = p.parse_args(argv)

    import numpy as np
    import pyarrow as pa

    import manifests

    rss0 = rss_bytes()
    t = time.perf_counter()
    table = make_table(a.rows)
    if a.input == "pandas":
        table = table.to_pandas()
    build_s = time.perf_counter() - t
    table_bytes = int(table.nbytes if isinstance(table, pa.Table) else table.memory_usage(deep=True).sum())
    rss_built = rss_bytes()
    peak_build = peak_rss_bytes()
    from isood.science.grid import cell_table, edges_table

    levels = table.select(["cov_level", "sem_level"]) if isinstance(table, pa.Table) else table
    cells = cell_table(np.asarray(levels["cov_level"]), np.asarray(levels["sem_level"]), LEVELS)
    edges = edges_table(np.linspace(0.0, 0.4, LEVELS + 1), np.linspace(0.0, 0.6, LEVELS + 1))
    print(f"{a.rows:,} rows as {a.input} ({gb(table_bytes)} of columns) built in {build_s:.1f} s; "
          f"RSS {gb(rss0)} -> {gb(rss_built)}", flush=True)

    with tempfile.TemporaryDirectory() as tmp:
        out = a.out or Path(tmp) / "splits"
        exact = reset_peak()  # from here on the peak is the writer's (with the table resident)
        t = time.perf_counter()
        m = manifests.write_manifest(out, kind="splits", tables={"images": table, "cells": cells, "edges": edges},
                                     config={"bench": "manifest_build"}, summary={"test_images": a.rows}, argv=[])
        write_s = time.perf_counter() - t
        peak = phase_peak_bytes() if exact else peak_rss_bytes()
        parquet = out / m.meta["tables"]["images"]["path"]
        file_bytes = parquet.stat().st_size
        t = time.perf_counter()
        ok = manifests.verify(out).ok
        verify_s = time.perf_counter() - t
    writer = max(0, peak - rss0 - table_bytes)  # what the writer adds to the table and the loaded libraries
    pk = peaks("cpu")
    # traffic the writer cannot avoid: read the columns once, write (and re-read to hash) the file
    floor = floor_text(0.0, table_bytes + 2 * file_bytes, pk, write_s)
    verdict = "meets" if peak < TARGET_BYTES else "misses"
    print(f"write_manifest {write_s:.1f} s ({a.rows / write_s:,.0f} rows/s), images.parquet {file_bytes / 1e6:.0f} MB, "
          f"verify {verify_s:.1f} s ({'ok' if ok else 'FAILED'}); {floor}", flush=True)
    summary("manifest_build", f"{a.rows:,} rows ({a.input}) -> write_manifest {write_s:.1f} s "
            f"({a.rows / write_s / 1e6:.2f} M rows/s), peak RSS while writing {gb(peak)} (target < 2 GB: {verdict}; "
            f"= table {gb(table_bytes)} + libraries {gb(rss0)} + writer {gb(writer)}; synthetic build peak {gb(peak_build)}), "
            f"parquet {file_bytes / 1e6:.0f} MB, verify {verify_s:.1f} s; {floor}")
    if not a.no_record:
        record("manifest_build.py", f"{a.rows:,} rows, {a.input} input, 10,450 wnids, 64 cells",
               f"write {write_s:.1f} s, peak RSS while writing {gb(peak)} ({verdict} < 2 GB) = table {gb(table_bytes)} + libraries {gb(rss0)} + "
               f"writer {gb(writer)}, parquet {file_bytes / 1e6:.0f} MB, verify {verify_s:.1f} s; {floor}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
