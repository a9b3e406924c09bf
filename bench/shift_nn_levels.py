"""``bench/shift_nn.py --levels``: ``ann_levels`` (isood.features.ann.levels) against exact faiss flat on two CLIP-like
generators written for this benchmark (bench/shift_nn_worlds.py: "clip" at dim 256 and "heavy" at dim 384, a
structure the search was never tuned on).

Per generator: isood's ``search_report(..., SearchOptions(levels=T))`` (the search of ``nearest(..., ann_levels=T)``) over all the queries, end to end (index build, exact
samples, tuning, search, the exact search of the queries near an edge), timed; exact faiss ``IndexFlatIP`` (same
threads) on ``--check`` random queries that isood did not sample, timed and extrapolated linearly to all the
queries (said so in the output); the level agreement of those checked queries at the build's edges (8
equal-width levels between the 1st and 99th percentiles of isood's distances, which are the exact build's up to
the conformal chance) with its one-sided 95% lower bound (Wilson), and isood's own held-out estimate.
"""
from __future__ import annotations

import time

import numpy as np

from shift_nn_worlds import WORLDS

from isood.features.ann import SearchOptions, sample_rows, search_report
from isood.features.ann.levels import lower_bound
from isood.science.grid import bin_with_edges, level_edges

__all__ = ["run_levels"]


def _exact_flat(ref: np.ndarray, q: np.ndarray) -> tuple[np.ndarray, float, float]:
    """Exact similarities of ``q``, wall seconds and CPU seconds (all threads) of the search."""
    import faiss

    t, c = time.perf_counter(), time.process_time()
    index = faiss.IndexFlatIP(ref.shape[1])
    index.add(ref)
    sims, _ = index.search(q, 1)
    return sims[:, 0], time.perf_counter() - t, time.process_time() - c


def run_levels(n_ref: int, n_query: int, n_check: int, *, target: float = 0.999, sample: int = 4000,
               worlds: tuple[str, ...] = ("clip", "heavy"), seed: int = 0) -> list[str]:
    """One line per generator: ratio, agreement, bound (module docstring)."""
    lines = []
    for name in worlds:
        t = time.perf_counter()
        ref, q = WORLDS[name](n_ref, n_query, seed=seed)
        made = time.perf_counter() - t
        sampled = np.concatenate(sample_rows(len(q), sample, seed))
        free = np.setdiff1d(np.arange(len(q)), sampled)
        check = np.sort(np.random.default_rng(seed + 7).choice(free, min(n_check, len(free)), replace=False))
        ex_sims, ex_seconds, ex_cpu = _exact_flat(ref, np.ascontiguousarray(q[check]))
        t, c = time.perf_counter(), time.process_time()
        sims, _, rep = search_report(q, ref, SearchOptions(levels=target, sample=sample, seed=seed))
        ann_seconds, ann_cpu = time.perf_counter() - t, time.process_time() - c
        distance = np.clip(1.0 - sims, 0.0, 2.0)
        report = rep.as_dict() if rep is not None else {}
        edges = level_edges(distance, 8)
        ex_d = np.clip(1.0 - ex_sims.astype(np.float64), 0.0, 2.0)
        agree = bin_with_edges(distance[check], edges) == bin_with_edges(ex_d, edges)
        k, n = int(agree.sum()), len(agree)
        exact_all = ex_seconds * len(q) / len(check)
        ratio = exact_all / ann_seconds
        cpu_ratio = ex_cpu * len(q) / len(check) / max(ann_cpu, 1e-9)  # the same ratio in CPU seconds
        recall = float(np.mean(np.isclose(sims[check], ex_sims, rtol=0, atol=1e-6)))
        line = (f"{name}: {n_ref} ref x {len(q)} queries x {ref.shape[1]} (made in {made:.0f} s): ann_levels "
                f"{target:g} {ann_seconds:.1f} s end to end; exact faiss IndexFlatIP {ex_seconds:.1f} s on {n} "
                f"queries -> {exact_all:.0f} s for all (linear extrapolation): {ratio:.1f}x ({cpu_ratio:.1f}x in CPU "
                f"seconds); level agreement on the {n} checked queries {k / n:.5f} (one-sided 95% lower bound "
                f"{lower_bound(k, n):.5f}), recall@1 {recall:.4f}; isood's held-out estimate "
                f"{report.get('levels_heldout', float('nan')):.5f} (bound "
                f"{report.get('levels_heldout_lower', float('nan')):.5f}, {report.get('check_queries')} queries, "
                f"recall@1 {report.get('recall_heldout', float('nan')):.4f}); widened "
                f"{report.get('widened_share', 0.0):.2%}, searched exactly near an edge "
                f"{report.get('exact_share', float('nan')):.3%}; build {report.get('build_seconds')} s, tuning "
                f"{report.get('tune_seconds')} s, search {report.get('search_seconds')} s; plan "
                f"{report.get('plan')} of {report.get('nlist')} lists; uncovered {report.get('uncovered')}")
        print(line, flush=True)
        lines.append(line)
    return lines
