"""Benchmark of nearest-neighbour cosine shift (isood.shift + isood.ann): exact torch, exact faiss flat, approximate faiss IVF.

Reference: N x D clustered, CLIP-like features (a shared "cone" direction + class centroids + noise, L2-normalised,
float32). Queries: half new samples of reference classes, half samples of new classes rotated away from a
reference class by graded angles (the semantic-shift use case, near to far OOD).

Measured: queries/s of each backend (exact ones on a subset of the queries — stated in the output — because
faiss flat does ~300 queries/s at 1M x 256 on 2 cores), IVF build time, and for IVF against the exact answer on
the exact subset: recall@1 (same nearest row) and level agreement (assign_levels of the IVF distances vs of the
exact distances, each with its own edges as a user would get; also with the exact edges). Prints one summary
line and appends a row to bench/RESULTS.md (``--no-record`` to skip).

    python bench/shift_nn.py            # 1M x 256 reference, 20k queries (a few minutes on 2 cores)
    python bench/shift_nn.py --quick    # tiny smoke run (seconds)
    python bench/shift_nn.py --full     # 2M x 256 reference, 50k queries
"""
from __future__ import annotations

import argparse
import datetime as _dt
import os
import platform
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from _results import floor_text, peaks  # noqa: E402

from isood.ann import DEFAULT_NPROBE, build_ivf_index, default_nlist, ivf_search  # noqa: E402
from isood.grid import assign_levels, bin_with_edges  # noqa: E402
from isood.shift import nearest  # noqa: E402

TARGET_SPEEDUP, TARGET_RECALL, TARGET_AGREEMENT = 20.0, 0.99, 0.995
SIZES = {  # n_ref, n_query, dim, n_classes, exact_queries (flat), torch_queries
    "quick": (50_000, 2_000, 64, 100, 1_000, 500),
    "default": (1_000_000, 20_000, 256, 1_000, 2_000, 500),
    "full": (2_000_000, 50_000, 256, 2_000, 5_000, 1_000),
}


def _unit(x: np.ndarray) -> np.ndarray:
    x /= np.linalg.norm(x, axis=1, keepdims=True)
    return x


def make_data(n_ref: int, n_query: int, dim: int, n_classes: int, seed: int, noise: float = 0.6,
              cone: float = 1.5, spectrum: float = 1.0) -> tuple[np.ndarray, np.ndarray]:
    """Clustered CLIP-like reference and shifted queries (see the module docstring), float32, unit rows.

    Within-class noise has total norm ~``noise`` and a power-law spectrum (variance of the i-th principal
    direction ~ i^-spectrum, in a random basis), like the fast-decaying spectrum of CLIP embeddings;
    ``spectrum=0`` gives isotropic noise, the hardest case for IVF.
    """
    rng = np.random.default_rng(seed)
    cone_dir = _unit(rng.standard_normal((1, dim)))
    centres = _unit(cone * cone_dir + _unit(rng.standard_normal((n_classes, dim)).astype(np.float32)))
    centres = centres.astype(np.float32)
    scale = np.arange(1, dim + 1, dtype=np.float64) ** (-spectrum / 2.0)
    scale *= noise / np.sqrt(np.sum(scale ** 2))
    basis = np.linalg.qr(rng.standard_normal((dim, dim)))[0]
    mix = (scale[:, None] * basis.T).astype(np.float32)  # noise = z @ mix, z ~ N(0, I)

    def noise_rows(n: int) -> np.ndarray:
        return rng.standard_normal((n, dim), dtype=np.float32) @ mix

    ref = np.empty((n_ref, dim), dtype=np.float32)
    block = 200_000
    for s in range(0, n_ref, block):
        e = min(n_ref, s + block)
        ref[s:e] = centres[rng.integers(0, n_classes, e - s)] + noise_rows(e - s)
    _unit(ref)
    n_id = n_query // 2
    q_centres = centres[rng.integers(0, n_classes, n_query)].copy()
    angles = np.zeros(n_query, dtype=np.float32)
    angles[n_id:] = rng.uniform(0.1, 1.4, n_query - n_id)  # new classes 6..80 degrees away from a reference class
    u = rng.standard_normal((n_query, dim)).astype(np.float32)
    u -= np.sum(u * q_centres, axis=1, keepdims=True) * q_centres
    _unit(u)
    q_centres = np.cos(angles)[:, None] * q_centres + np.sin(angles)[:, None] * u
    query = q_centres + noise_rows(n_query)
    _unit(query)
    return ref, query[rng.permutation(n_query)]


class _Timer:
    """Wall-clock and process CPU time of a block (the machine is shared: CPU time is less disturbed by others)."""

    def __enter__(self):
        self.w, self.c = time.perf_counter(), time.process_time()
        return self

    def __exit__(self, *exc):
        self.wall, self.cpu = time.perf_counter() - self.w, time.process_time() - self.c


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    size = p.add_mutually_exclusive_group()
    size.add_argument("--quick", action="store_true", help="tiny smoke run")
    size.add_argument("--full", action="store_true", help="2M x 256 reference, 50k queries")
    p.add_argument("--n-ref", type=int)
    p.add_argument("--n-query", type=int)
    p.add_argument("--dim", type=int)
    p.add_argument("--exact-queries", type=int, help="queries searched exactly by faiss flat (ground truth + timing)")
    p.add_argument("--torch-queries", type=int, help="queries timed with the torch backend")
    p.add_argument("--nlist", type=int, help="IVF lists (default: isood.ann.default_nlist)")
    p.add_argument("--nprobe", type=int, nargs="+", default=[16, 32, 64], help="nprobe values to sweep (the default is always added)")
    p.add_argument("--train-size", type=int, help="IVF k-means training rows (default: isood.ann's)")
    p.add_argument("--noise", type=float, default=0.6, help="within-class noise norm (centres have norm 1)")
    p.add_argument("--spectrum", type=float, default=1.0, help="power-law exponent of the noise spectrum (0 = isotropic)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--no-record", action="store_true", help="do not append to bench/RESULTS.md")
    a = p.parse_args(argv)

    mode = "quick" if a.quick else "full" if a.full else "default"
    n_ref, n_query, dim, n_classes, n_exact, n_torch = SIZES[mode]
    n_ref, n_query, dim = a.n_ref or n_ref, a.n_query or n_query, a.dim or dim
    n_exact = min(a.exact_queries or n_exact, n_query)
    n_torch = min(a.torch_queries or n_torch, n_query)
    nlist = a.nlist or default_nlist(n_ref)
    nprobes = sorted(set(a.nprobe) | {DEFAULT_NPROBE})

    t0 = time.perf_counter()
    ref, query = make_data(n_ref, n_query, dim, n_classes, a.seed, noise=a.noise, spectrum=a.spectrum)
    print(f"data: reference {n_ref:,} x {dim}, {n_query:,} queries, {n_classes} classes ({time.perf_counter() - t0:.1f} s)", flush=True)

    with _Timer() as t:
        d_exact, i_exact = nearest(query[:n_exact], ref, backend="faiss-flat", device="cpu")
    flat_qps, flat_cpu = n_exact / t.wall, n_exact / t.cpu
    flat_s = t.wall  # exact search cannot beat 2*q*N*D FLOPs, nor one read of the reference and the queries
    floor = floor_text(2.0 * n_exact * n_ref * dim, 4.0 * (n_ref + n_exact) * dim, peaks("cpu"), flat_s)
    print(f"faiss-flat: {n_exact:,} queries, {flat_qps:,.0f} q/s ({flat_cpu:,.0f} per CPU-second)", flush=True)

    with _Timer() as t:
        d_torch, i_torch = nearest(query[:n_torch], ref, backend="torch", device="cpu")
    torch_qps, torch_cpu = n_torch / t.wall, n_torch / t.cpu
    torch_match = float(np.mean(i_torch == i_exact[:n_torch]))
    print(f"torch: {n_torch:,} queries, {torch_qps:,.0f} q/s ({torch_cpu:,.0f} per CPU-second), same nearest row as "
          f"faiss-flat: {torch_match:.4f}, max |d diff| {np.abs(d_torch - d_exact[:n_torch]).max():.1e}", flush=True)

    with _Timer() as t:
        index = build_ivf_index(ref, nlist=nlist, train_size=a.train_size, seed=a.seed, device="cpu")
    build_s = t.wall
    print(f"faiss-ivf: nlist {nlist}, built in {build_s:.1f} s", flush=True)

    lv_exact, edges_exact = assign_levels(d_exact)
    rows = []
    for nprobe in nprobes:
        with _Timer() as t:
            sims, idx = ivf_search(index, query, nprobe=nprobe)
        qps, cpu_qps = n_query / t.wall, n_query / t.cpu
        d_ivf = np.clip(1.0 - sims, 0.0, 2.0)[:n_exact]
        hit = idx[:n_exact] == i_exact
        recall = float(np.mean(hit))
        near = d_exact < np.median(d_exact)  # the half of the queries closest to the reference
        agree_own = float(np.mean(assign_levels(d_ivf)[0] == lv_exact))
        agree_shared = float(np.mean(bin_with_edges(d_ivf, edges_exact) == lv_exact))
        speedup, speedup_cpu = qps / flat_qps, cpu_qps / flat_cpu
        ok = speedup >= TARGET_SPEEDUP and recall >= TARGET_RECALL and agree_own >= TARGET_AGREEMENT
        rows.append(dict(nprobe=nprobe, qps=qps, speedup=speedup, speedup_cpu=speedup_cpu, recall=recall,
                         agree=agree_own, agree_shared=agree_shared, err=float(np.mean(d_ivf - d_exact)), ok=ok))
        print(f"  nprobe {nprobe:3d}: {qps:,.0f} q/s = {speedup:.1f}x flat ({speedup_cpu:.1f}x per CPU-second), "
              f"recall@1 {recall:.4f} (nearer half {np.mean(hit[near]):.4f}, farther half {np.mean(hit[~near]):.4f}), "
              f"mean distance excess {rows[-1]['err']:.1e}, level agreement {agree_own * 100:.2f}% (own edges) / "
              f"{agree_shared * 100:.2f}% (exact edges){'  [meets all targets]' if ok else ''}", flush=True)

    head = next(r for r in rows if r["nprobe"] == DEFAULT_NPROBE)
    best = next((r for r in rows if r["ok"]), None)
    total_s = time.perf_counter() - t0
    summary = (f"shift_nn {mode}: ref {n_ref:,}x{dim}, {n_query:,} queries | torch {torch_qps:,.0f} q/s, "
               f"faiss-flat {flat_qps:,.0f} q/s, ivf(nlist={nlist}, nprobe={DEFAULT_NPROBE}) {head['qps']:,.0f} q/s = "
               f"{head['speedup']:.1f}x flat ({head['speedup_cpu']:.1f}x per CPU-s; target {TARGET_SPEEDUP:.0f}x), recall@1 {head['recall']:.4f} "
               f"(target {TARGET_RECALL}), level agreement {head['agree'] * 100:.2f}% (target {TARGET_AGREEMENT * 100:.1f}%) | "
               f"build {build_s:.0f} s, total {total_s:.0f} s | faiss-flat {flat_s:.1f} s vs {floor} | "
               + (f"smallest nprobe meeting all targets: {best['nprobe']}" if best else "no swept nprobe meets all targets"))
    print("SUMMARY " + summary)

    if not a.no_record:
        results = Path(__file__).resolve().parent / "RESULTS.md"
        if not results.exists():
            results.write_text("# Benchmark results\n\nOne row per run; appended by the bench scripts.\n\n")
        machine = f"{platform.machine()} {platform.system()} {os.cpu_count()} CPUs, Python {platform.python_version()}"
        sweep = "; ".join(f"nprobe {r['nprobe']}: {r['speedup']:.1f}x ({r['speedup_cpu']:.1f}x CPU), R@1 {r['recall']:.4f}, "
                          f"agree {r['agree'] * 100:.2f}%" for r in rows)
        line = (f"- {_dt.date.today().isoformat()} | shift_nn.py {mode} | {machine} | ref {n_ref:,}x{dim}, queries {n_query:,} "
                f"(exact timed on {n_exact:,}, torch on {n_torch:,}) | torch {torch_qps:,.0f} q/s, faiss-flat {flat_qps:,.0f} q/s, "
                f"ivf nlist {nlist} built in {build_s:.0f} s | {sweep} | flat {flat_s:.1f} s vs {floor} | default nprobe {DEFAULT_NPROBE}"
                f"{' meets' if head['ok'] else ' misses'} the targets ({TARGET_SPEEDUP:.0f}x, R@1 {TARGET_RECALL}, {TARGET_AGREEMENT * 100:.1f}%)\n")
        with results.open("a") as fh:
            fh.write(line)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
