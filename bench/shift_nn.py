"""Benchmark of nearest-neighbour cosine shift: exact faiss flat / torch / isood's exact path, isood's IVF (batched
list scanning; uniform nprobe and tuned to a recall target) and the indexes the field uses (faiss IVFFlat's own
search, faiss HNSWFlat, faiss IVF-PQ fast-scan + exact refine).

Reference: N x D clustered, CLIP-like features (a shared "cone" direction + class centroids + power-law noise,
L2-normalised, float32). Queries: half new samples of reference classes, half samples of new classes rotated away
from a reference class by 6..80 degrees (near to far OOD, the semantic-shift use case).

Per index: build time, memory (index bytes where known, RSS growth while building), queries/s (wall-clock and
per CPU-second; the machine is shared) and its ratio to exact faiss flat, recall@1 and level agreement against
the exact answer on the first ``--exact-queries`` queries. Level agreement = the fraction of those queries whose
level (8 equal-width levels between the 1st and 99th percentile of the exact distances, ``isood.science.grid``) is the same
with the approximate distance as with the exact one. isood's IVF searches all the queries in one batch (as
build-splits does); faiss's indexes search the exact subset. The tuned rows are tuned on a second sample of
``--tune-queries`` queries, disjoint from the measured ones. Prints a table, one SUMMARY line, appends a row to
bench/results.local.md (``--no-record`` to skip).

    python bench/shift_nn.py            # 1M x 256 reference, 20k queries (~10 minutes on 2 cores)
    python bench/shift_nn.py --quick    # tiny smoke run (seconds)
    python bench/shift_nn.py --full     # 2M x 256 reference, 50k queries
    python bench/shift_nn.py --skip hnsw,pq   # leave out some of the field's indexes
    python bench/shift_nn.py --levels   # ann_levels vs exact flat on two CLIP-like generators, 200k x 400k
    python bench/shift_nn.py --gpu      # exact search on the device: 1M queries x 1.28M x 256
    python bench/shift_nn.py --gpu --quick --device cpu   # the same at tiny sizes on the CPU (checks the script)

``--gpu`` (:func:`run_gpu`, also called by ``bench/gpu_suite.py``): ``torch-fused`` (``isood.features.ann.fused``: fp16
candidates, exact re-rank, certificate) on ``--device`` over all the queries, the reference resident; beside it
the exact float32 torch search (``backend='torch'``) on the same device on a subset (extrapolated), and the
exactness on a sample against a float64 brute force on the device: the share of rows within 1e-6 of the float64
distance and in the same level (8 equal-width levels between the 1st and 99th percentile of the sample's exact
distances) as the exact one; target >= 99.99% each. Prints one SUMMARY line; appends a row to bench/results.local.md.
"""
from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from _results import floor_text, peaks, record, rss_bytes, summary  # noqa: E402
from shift_nn_indexes import FIELD_INDEXES, Row, Truth  # noqa: E402

from isood.features.ann import ProbePlan, build_ivf, default_nlist, ivf_search, tune_plan  # noqa: E402
from isood.core.errors import BadInputError  # noqa: E402
from isood.features.shift import nearest  # noqa: E402

TARGET_SPEEDUP, TARGET_RECALL, TARGET_AGREEMENT = 20.0, 0.99, 0.999
#: --gpu: exactness target (share of rows within 1e-6 of float64 and in the same level) and the time target of
#: 1M queries x 1.28M x 256 on one H100: 3 s (>= 7x the 21.1 s measured there without the fused search;
#: 0.8 s is the bf16 matmul floor).
TARGET_EXACT, TARGET_GPU_SECONDS = 0.9999, 3.0
SIZES = {  # n_ref, n_query, dim, n_classes, exact (flat) queries, torch queries, tuning queries
    "quick": (50_000, 4_000, 64, 100, 1_000, 300, 1_000),
    "default": (1_000_000, 20_000, 256, 1_000, 5_000, 500, 2_000),
    "full": (2_000_000, 50_000, 256, 2_000, 5_000, 1_000, 2_000),
}
#: --gpu sizes: n_ref, n_query, dim, n_classes, float32-baseline queries, float64-checked queries
GPU_SIZES = {"gpu": (1_280_000, 1_000_000, 256, 1_000, 50_000, 10_000),
             "smoke": (20_000, 4_000, 64, 100, 1_000, 1_000)}


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


class Timer:
    """Wall-clock and process CPU time of a block (the machine is shared: CPU time is less disturbed by others)."""

    def __enter__(self):
        self.w, self.c = time.perf_counter(), time.process_time()
        return self

    def __exit__(self, *exc):
        self.wall, self.cpu = time.perf_counter() - self.w, time.process_time() - self.c


def exact_truth(ref: np.ndarray, query: np.ndarray, n_exact: int, n_tune: int) -> tuple[Truth, dict]:
    """Raw faiss IndexFlatIP over the whole reference: the exact answer of the measured and the tuning queries,
    and its rate on the measured ones (the 1x of every ratio)."""
    import faiss

    flat = faiss.IndexFlatIP(ref.shape[1])
    flat.add(ref)
    with Timer() as t:
        sims, idx = flat.search(np.ascontiguousarray(query[:n_exact]), 1)
    tune_sims, tune_idx = flat.search(np.ascontiguousarray(query[n_exact:n_exact + n_tune]), 1)
    truth = Truth(sims[:, 0], idx[:, 0], tune_idx[:, 0], n_exact / t.wall, n_exact / t.cpu, t.wall)
    return truth, {"index": flat}


def exact_path_ratio(flat, ref: np.ndarray, query: np.ndarray, n: int, rounds: int = 4) -> tuple[float, float, float]:
    """isood's exact path (``nearest(backend='faiss-flat')``: checks, normalisation, blocked search) vs raw faiss
    flat on the same ``n`` queries, alternating ``rounds`` times, best of each: (raw s, isood s, ratio)."""
    q = np.ascontiguousarray(query[:n])
    raw, ours = [], []
    for _ in range(rounds):
        with Timer() as t:
            flat.search(q, 1)
        raw.append(t.wall)
        with Timer() as t:
            nearest(q, ref, backend="faiss-flat", device="cpu")
        ours.append(t.wall)
    return min(raw), min(ours), min(ours) / min(raw)


def isood_ivf_rows(ref: np.ndarray, query: np.ndarray, truth: Truth, *, nlist: int, nprobes: list[int],
                   targets: list[float], seed: int, n_exact: int,
                   train_size: int | None = None) -> tuple[list[Row], np.ndarray]:
    """isood's IVF: build once, then uniform nprobe rows and one row per recall target (tuned on the tuning
    sample), each searching every query in one batch. Returns the rows and the k-means centroids."""
    rss0 = rss_bytes()
    with Timer() as t:
        index = build_ivf(ref, nlist=nlist, seed=seed, train_size=train_size)
    build = dict(build_s=t.wall, index_bytes=index.nbytes, rss_bytes=rss_bytes() - rss0)
    tune_q = np.ascontiguousarray(query[n_exact:n_exact + len(truth.tune_idx)])
    rows = []
    plans = [(f"nprobe {p}", ProbePlan(p)) for p in nprobes]
    for target in targets:
        try:
            with Timer() as tt:
                plan, _ = tune_plan(index, tune_q, truth.tune_idx, recall=target)
        except BadInputError as e:
            rows.append(Row("isood ivf tuned", f"target {target}: out of reach", note=str(e)[:90], **build))
            continue
        p = plan.as_dict()
        plans.append((f"target {target}: nprobe {p['nprobe']}->{p['reprobe']}", plan))
        print(f"tuned for recall@1 {target} in {tt.wall:.1f} s: {p}", flush=True)
    for label, plan in plans:
        with Timer() as t:
            sims, idx, reprobed = ivf_search(index, query, plan)
        name = "isood ivf tuned" if label.startswith("target") else "isood ivf"
        rows.append(truth.row(name, f"nlist {index.nlist}, {label}" + (f", {reprobed:.0%} reprobed" if reprobed else ""),
                              sims[:n_exact], idx[:n_exact], len(query) / t.wall, len(query) / t.cpu, **build))
    return rows, index.centroids


def _sync(device: str) -> None:
    import torch

    if str(device).startswith("cuda"):
        torch.cuda.synchronize()


def float64_best(query: np.ndarray, ref: np.ndarray, device: str, rows: int = 512) -> np.ndarray:
    """The float64 max inner product of each query over the reference, on ``device`` (``rows`` queries at a
    time, the reference in float64 there once)."""
    import torch

    r = torch.from_numpy(ref).to(device).double()
    out = np.empty(len(query))
    for s0 in range(0, len(query), rows):
        q = torch.from_numpy(np.ascontiguousarray(query[s0:s0 + rows])).to(device).double()
        out[s0:s0 + len(q)] = (q @ r.T).max(dim=1).values.cpu().numpy()
    del r
    return out


def run_gpu(device: str = "cuda", smoke: bool = False, *, precision: str = "fp16", seed: int = 0,
            record_row: bool = True) -> list[str]:
    """Exact search on the device (module docstring, ``--gpu``); returns the SUMMARY line(s)."""
    import torch

    from isood.features.ann import FusedIndex
    from isood.science.grid import assign_levels, bin_with_edges

    n_ref, n_query, dim, n_classes, n_base, n_check = GPU_SIZES["smoke" if smoke else "gpu"]
    t0 = time.perf_counter()
    ref, query = make_data(n_ref, n_query, dim, n_classes, seed)
    print(f"data: reference {n_ref:,} x {dim}, {n_query:,} queries ({time.perf_counter() - t0:.1f} s)", flush=True)
    with Timer() as tb:
        index = FusedIndex(ref, device=device, precision=precision)
        _sync(device)
    index.search(query[:min(1_000, n_query)])  # warm-up: kernels compiled / chosen
    index.stats.__init__()
    _sync(device)
    with Timer() as ts:
        sims, idx = index.search(query)
        _sync(device)
    stats = index.stats.as_dict()
    flop = 2.0 * n_query * n_ref * dim
    with Timer() as t32:
        nearest(query[:n_base], ref, backend="torch", device=device)
        _sync(device)
    base_s = t32.wall * n_query / n_base
    check = np.random.default_rng(seed).choice(n_query, size=min(n_check, n_query), replace=False)
    best = float64_best(query[check], ref, device)
    same_d = float(np.mean(np.abs(sims[check].astype(np.float64) - best) <= 1e-6))
    levels, edges = assign_levels(1.0 - best)
    same_l = float(np.mean(bin_with_edges(1.0 - sims[check].astype(np.float64), edges) == levels))
    name = torch.cuda.get_device_name(0) if str(device).startswith("cuda") else str(device)
    def verdict(ok: bool) -> str:
        return "not judged (smoke)" if smoke else ("met" if ok else "NOT met")

    text = (f"{'smoke' if smoke else 'gpu'} on {name}: ref {n_ref:,}x{dim}, {n_query:,} queries | torch-fused "
            f"{precision} {ts.wall:.1f} s ({n_query / ts.wall:,.0f} q/s, {flop / ts.wall / 1e12:.1f} TFLOP/s "
            f"effective; upload {tb.wall:.1f} s) vs target <= {TARGET_GPU_SECONDS:.0f} s: "
            f"{verdict(ts.wall <= TARGET_GPU_SECONDS)} | float32 torch exact {base_s:.1f} s (from {n_base:,} "
            f"queries): fused speed-up {base_s / ts.wall:.1f}x | on {len(check):,} rows vs float64: same distance within 1e-6 "
            f"{same_d:.4%}, same level {same_l:.4%} vs target >= {TARGET_EXACT:.2%}: "
            f"{verdict(min(same_d, same_l) >= TARGET_EXACT)} | "
            f"certified {stats['certified']:,}, widened {stats['widened']:,}, full search {stats['fallback']:,}")
    line = summary("shift_nn.gpu", text)
    if record_row and not smoke:
        record("shift_nn.py --gpu", f"ref {n_ref:,}x{dim}, queries {n_query:,}", text, device=device)
    return [line]


def print_table(rows: list[Row]) -> None:
    print(f"\n{'index':<22} {'parameters':<62} {'build s':>8} {'index MB':>9} {'RSS+ MB':>8} {'q/s':>8} "
          f"{'x flat':>7} {'x CPU':>6} {'R@1':>7} {'levels':>7}")
    for r in rows:
        print(r.line(), flush=True)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    size = p.add_mutually_exclusive_group()
    size.add_argument("--quick", action="store_true", help="tiny smoke run")
    size.add_argument("--full", action="store_true", help="2M x 256 reference, 50k queries")
    p.add_argument("--gpu", action="store_true", help="exact search on --device: 1M x 1.28M x 256 (--quick: tiny)")
    p.add_argument("--device", default="cuda", help="--gpu: the device (cuda, cpu)")
    p.add_argument("--precision", default="fp16", help="--gpu: the candidate precision of torch-fused")
    p.add_argument("--n-ref", type=int)
    p.add_argument("--n-query", type=int)
    p.add_argument("--dim", type=int)
    p.add_argument("--exact-queries", type=int, help="queries searched exactly by faiss flat (truth + 1x timing)")
    p.add_argument("--torch-queries", type=int, help="queries timed with the exact torch backend")
    p.add_argument("--nlist", type=int, help="IVF lists (default: isood.features.ann.default_nlist)")
    p.add_argument("--train-size", type=int, help="IVF k-means training rows (default: isood.features.ann's)")
    p.add_argument("--nprobe", type=int, nargs="+", default=[32, 128, 256], help="uniform nprobe rows")
    p.add_argument("--targets", type=float, nargs="+", default=[0.98, 0.99, 0.995, 0.999], help="recall targets")
    p.add_argument("--skip", default="", help="comma list of field indexes to leave out: " + ",".join(FIELD_INDEXES))
    p.add_argument("--noise", type=float, default=0.6, help="within-class noise norm (centres have norm 1)")
    p.add_argument("--spectrum", type=float, default=1.0, help="power-law exponent of the noise spectrum (0 = isotropic)")
    p.add_argument("--levels", action="store_true",
                   help="ann_levels 0.999 vs exact faiss IndexFlatIP on two CLIP-like generators (shift_nn_levels.py)")
    p.add_argument("--check", type=int, default=4_000, help="--levels: queries searched exactly (timing + agreement)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--no-record", action="store_true", help="do not append to bench/results.local.md")
    a = p.parse_args(argv)
    if a.levels:
        from shift_nn_levels import run_levels

        n_ref, n_query = (a.n_ref or (20_000 if a.quick else 200_000)), (a.n_query or (40_000 if a.quick else 400_000))
        lines = run_levels(n_ref, n_query, min(a.check, n_query // 4), seed=a.seed)
        if not a.no_record:
            record("shift_nn.py --levels", f"{n_ref} x {n_query}", " | ".join(lines))
        return 0
    if a.gpu:
        run_gpu(a.device, a.quick, precision=a.precision, seed=a.seed, record_row=not a.no_record)
        return 0
    mode = "quick" if a.quick else "full" if a.full else "default"
    n_ref, n_query, dim, n_classes, n_exact, n_torch, n_tune = SIZES[mode]
    n_ref, n_query, dim = a.n_ref or n_ref, a.n_query or n_query, a.dim or dim
    n_exact = min(a.exact_queries or n_exact, n_query // 2)
    n_torch = min(a.torch_queries or n_torch, n_query)
    n_tune = min(n_tune, n_query - n_exact)
    nlist = a.nlist or default_nlist(n_ref)

    t0 = time.perf_counter()
    ref, query = make_data(n_ref, n_query, dim, n_classes, a.seed, noise=a.noise, spectrum=a.spectrum)
    print(f"data: reference {n_ref:,} x {dim}, {n_query:,} queries, {n_classes} classes ({time.perf_counter() - t0:.1f} s)", flush=True)
    truth, held = exact_truth(ref, query, n_exact, n_tune)
    floor = floor_text(2.0 * n_exact * n_ref * dim, 4.0 * (n_ref + n_exact) * dim, peaks("cpu"), truth.flat_s)
    print(f"faiss-flat: {n_exact:,} queries, {truth.flat_qps:,.0f} q/s ({truth.flat_cpu:,.0f} per CPU-second); {floor}", flush=True)
    raw_s, ours_s, exact_ratio = exact_path_ratio(held["index"], ref, query, min(n_exact, 2_000))
    del held
    print(f"isood exact path (nearest, faiss-flat): {ours_s:.2f} s vs raw faiss flat {raw_s:.2f} s = {exact_ratio:.2f}x", flush=True)
    with Timer() as t:
        _, i_torch = nearest(query[:n_torch], ref, backend="torch", device="cpu")
    torch_qps = n_torch / t.wall
    print(f"torch: {torch_qps:,.0f} q/s, same nearest row as faiss-flat: {np.mean(i_torch == truth.idx[:n_torch]):.4f}", flush=True)

    rows, centroids = isood_ivf_rows(ref, query, truth, nlist=nlist, nprobes=a.nprobe, targets=a.targets,
                                     seed=a.seed, n_exact=n_exact, train_size=a.train_size)
    print_table(rows)
    skip = {s for s in a.skip.split(",") if s}
    for name, run in FIELD_INDEXES.items():
        if name not in skip:
            new = run(ref, np.ascontiguousarray(query[:n_exact]), truth, centroids=centroids, nprobes=a.nprobe,
                      seed=a.seed)
            for r in new:
                print(r.line(), flush=True)
            rows += new
    print_table(rows)

    meets = [r for r in rows if r.meets(TARGET_SPEEDUP, TARGET_RECALL, TARGET_AGREEMENT)]
    best = max(meets, key=lambda r: r.qps) if meets else None
    total_s = time.perf_counter() - t0
    targets = f"targets {TARGET_SPEEDUP:.0f}x flat, R@1 {TARGET_RECALL}, levels {TARGET_AGREEMENT:.1%}"
    text = (f"{mode}: ref {n_ref:,}x{dim}, {n_query:,} queries | faiss-flat {truth.flat_qps:,.0f} q/s, torch {torch_qps:,.0f} "
            f"q/s, isood exact path {exact_ratio:.2f}x raw flat | "
            + (f"fastest meeting {targets}: {best.name} ({best.params}) {best.qps:,.0f} q/s = {best.speedup:.1f}x flat "
               f"({best.speedup_cpu:.1f}x per CPU-s), R@1 {best.recall:.4f}, levels {best.agreement:.2%}"
               if best else f"no index meets {targets}") + f" | total {total_s:.0f} s")
    summary("shift_nn", text)
    if not a.no_record:
        curve = "; ".join(r.short() for r in rows)
        record(f"shift_nn.py {mode}", f"ref {n_ref:,}x{dim}, queries {n_query:,} (truth on {n_exact:,})",
               f"{text} | flat {truth.flat_s:.1f} s vs {floor} | {curve}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
