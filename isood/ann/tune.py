"""Approximate search tuned to a target recall@1 (the ``ann_recall`` knob).

:func:`search_tuned` builds the IVF index, searches two disjoint seeded samples of the queries exactly (faiss
flat / torch): the *tuning* sample picks the cheapest :class:`~isood.ann.ivf.ProbePlan` whose recall@1 on it
reaches the target plus one binomial standard error (:func:`tune_plan`), the *held-out* sample measures what the
full search achieved (recall@1, and the distances a caller needs for level agreement). Both samples get their
exact answers in the output. A target that no plan reaches while scanning at most ``MAX_SCAN_FRACTION`` of the
lists (beyond that exact search is as fast) is refused with one line.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field
from typing import Callable

import numpy as np

from isood.ann.ivf import IVFIndex, ProbePlan, build_ivf, ivf_search, probe, scan_lists
from isood.errors import BadInputError

__all__ = ["AnnReport", "MAX_SCAN_FRACTION", "DEFAULT_SAMPLE", "probe_ladder", "sample_rows", "search_tuned",
           "tune_plan"]

#: A plan may probe at most this fraction of the lists (a wider scan is no faster than exact search).
MAX_SCAN_FRACTION = 0.125
#: Queries in each of the tuning and held-out samples (at most a quarter of the queries each).
DEFAULT_SAMPLE = 2000
#: Samples smaller than this are not worth tuning on: the whole search is then exact.
MIN_SAMPLE = 10

Exact = Callable[[np.ndarray], tuple[np.ndarray, np.ndarray]]


@dataclass
class AnnReport:
    """What a tuned approximate search did and achieved (JSON-able via :meth:`as_dict`; the held-out arrays
    stay in memory for level agreement)."""

    target_recall: float
    nlist: int
    plan: ProbePlan | None
    tune_queries: int
    check_queries: int
    recall_tune: float
    recall_check: float
    reprobed: float = 0.0
    build_seconds: float = 0.0
    tune_seconds: float = 0.0
    search_seconds: float = 0.0
    index_bytes: int = 0
    check_rows: np.ndarray = field(default_factory=lambda: np.empty(0, np.int64), repr=False)
    check_exact: np.ndarray = field(default_factory=lambda: np.empty(0, np.float32), repr=False)
    check_approx: np.ndarray = field(default_factory=lambda: np.empty(0, np.float32), repr=False)

    def as_dict(self) -> dict:
        plan = self.plan.as_dict() if self.plan is not None else {"nprobe": None, "reprobe": None, "margin": None}
        return {"backend": "faiss-ivf", "target_recall": self.target_recall, "nlist": self.nlist, **plan,
                "reprobed_fraction": round(self.reprobed, 6), "tune_queries": self.tune_queries,
                "check_queries": self.check_queries, "recall_tune": self.recall_tune,
                "recall_heldout": self.recall_check, "build_seconds": round(self.build_seconds, 3),
                "tune_seconds": round(self.tune_seconds, 3), "search_seconds": round(self.search_seconds, 3),
                "index_bytes": self.index_bytes}


def probe_ladder(limit: int) -> list[int]:
    """1, 2, 3, 4, 6, 8, 12, 16, ... up to ``limit`` (and ``limit`` itself)."""
    steps, k = set(), 1
    while k <= limit:
        steps.update({k, 3 * k // 2} if k > 1 else {1})
        k *= 2
    return sorted({s for s in steps if s <= limit} | {max(1, limit)})


def sample_rows(n_query: int, sample: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """Two disjoint seeded samples of query rows (tuning, held-out), each ``min(sample, n_query // 4)``."""
    n = min(int(sample), n_query // 4)
    perm = np.random.default_rng(seed + 1).permutation(n_query)
    return np.sort(perm[:n]), np.sort(perm[n:2 * n])


def _best_split(m: np.ndarray, hit1: np.ndarray, hit2: np.ndarray, need: float) -> tuple[int, float] | None:
    """Fewest queries to re-probe (those of lowest margin ``m``) for mean recall >= ``need``: (k, margin)."""
    n = len(m)
    order = np.argsort(m, kind="stable")
    gain = np.concatenate([[0], np.cumsum(hit2[order].astype(np.int64) - hit1[order].astype(np.int64))])
    ok = np.flatnonzero(hit1.sum() + gain >= need * n - 1e-9)
    if not len(ok):
        return None
    k = int(ok[0])
    ms = m[order]
    margin = -math.inf if k == 0 else math.inf if k == n else float((ms[k - 1] + ms[k]) / 2)
    if 0 < k < n and not ms[k - 1] < margin:  # equal margins: re-probe them all
        margin = float(np.nextafter(ms[k - 1], np.inf))
    return k, margin


def tune_plan(index: IVFIndex, query: np.ndarray, exact_rows: np.ndarray, *, recall: float,
              max_fraction: float = MAX_SCAN_FRACTION, threads: int | None = None) -> tuple[ProbePlan, float]:
    """The cheapest plan (fewest lists scanned per query on average) whose recall@1 on the sample ``query``
    (exact nearest rows ``exact_rows``) is >= ``recall`` + one standard error; returns (plan, in-sample
    recall). Raises ``BadInputError`` (one line) when no plan within ``max_fraction`` of the lists reaches it."""
    n = len(query)
    need = min(1.0, recall + math.sqrt(recall * (1.0 - recall) / max(n, 1)))
    limit = max(1, int(index.nlist * max_fraction))
    csims, lists = probe(index, query, limit)
    nn_list = index.list_of_row[exact_rows]
    found = lists == nn_list[:, None]
    rank = np.where(found.any(axis=1), found.argmax(axis=1), limit)
    best: tuple[float, ProbePlan, float] | None = None
    for p1 in probe_ladder(limit):
        hit1 = rank < p1
        if hit1.mean() >= need:
            cand = (float(p1), ProbePlan(p1), float(hit1.mean()))
            best = cand if best is None or cand[0] < best[0] else best
            break
        if p1 >= limit or (best is not None and p1 >= best[0]):
            continue
        s1, _ = scan_lists(index, query, lists[:, :p1], threads=threads)
        m = s1 - csims[:, p1]
        for p2 in (p for p in probe_ladder(limit) if p > p1):
            split = _best_split(m, hit1, rank < p2, need)
            if split is None:
                continue
            k, margin = split
            cost = p1 + k / n * (p2 - p1)
            if best is None or cost < best[0]:
                reached = float(np.where(m < margin, rank < p2, hit1).mean())
                best = (cost, ProbePlan(p1, p2, margin), reached)
    if best is None:
        raise BadInputError(
            f"recall@1 target {recall:g} is out of reach: IVF reaches {np.mean(rank < limit):.4f} on {n} sampled "
            f"queries probing {limit} of {index.nlist} lists (beyond that exact search is as fast); pass a lower "
            "target (--ann-recall / ann_recall) or search exactly (backend auto / faiss-flat)")
    return best[1], best[2]


def search_tuned(query: np.ndarray, reference: np.ndarray, *, recall: float, exact: Exact,
                 rows: tuple[np.ndarray, np.ndarray] | None = None, sample: int = DEFAULT_SAMPLE,
                 nlist: int | None = None, train_size: int | None = None, seed: int = 0,
                 threads: int | None = None) -> tuple[np.ndarray, np.ndarray, AnnReport]:
    """Tuned IVF search of clean, L2-normalised ``query`` rows in ``reference`` (module docstring):
    (similarity, row, report). ``exact(q) -> (sims, rows)`` is the exact search of some queries."""
    tune_rows, check_rows = rows if rows is not None else sample_rows(len(query), sample, seed)
    if len(tune_rows) < MIN_SAMPLE:  # too few queries to tune on: exact search is as cheap
        sims, idx = exact(query)
        return sims, idx, AnnReport(recall, 0, None, len(query), 0, 1.0, 1.0)
    t0 = time.perf_counter()
    index = build_ivf(reference, nlist=nlist, train_size=train_size, seed=seed)
    t1 = time.perf_counter()
    both = np.concatenate([tune_rows, check_rows])
    ex_sims, ex_idx = exact(np.ascontiguousarray(query[both]))
    n_t = len(tune_rows)
    plan, _ = tune_plan(index, np.ascontiguousarray(query[tune_rows]), ex_idx[:n_t], recall=recall, threads=threads)
    t2 = time.perf_counter()
    sims, idx, reprobed = ivf_search(index, query, plan, threads=threads)
    missing = np.flatnonzero(idx < 0)
    if len(missing):  # every probed list was empty
        sims[missing], idx[missing] = exact(np.ascontiguousarray(query[missing]))
    t3 = time.perf_counter()
    report = AnnReport(
        recall, index.nlist, plan, n_t, len(check_rows), float(np.mean(idx[tune_rows] == ex_idx[:n_t])),
        float(np.mean(idx[check_rows] == ex_idx[n_t:])) if len(check_rows) else float("nan"), reprobed,
        t1 - t0, t2 - t1, t3 - t2, index.nbytes, check_rows, ex_sims[n_t:].copy(), sims[check_rows].copy())
    sims[both], idx[both] = ex_sims, ex_idx  # the sampled queries keep their exact answers
    return sims, idx, report
