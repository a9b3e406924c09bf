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
from typing import Callable, Mapping

import numpy as np

from isood.ann.ivf import QUERY_CHUNK, IVFIndex, ProbePlan, build_ivf, ivf_search, probe, scan_lists
from isood.errors import BadInputError

__all__ = ["AnnReport", "MAX_SCAN_FRACTION", "DEFAULT_SAMPLE", "Fix", "IvfChunks", "TunedSearch", "probe_ladder",
           "RecallOutOfReach", "reachable_target", "sample_rows", "search_tuned", "tune_plan"]

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
    n_queries: int = 0  # every query searched (tuning and held-out ones included)

    def as_dict(self) -> dict:
        plan = self.plan.as_dict() if self.plan is not None else {"nprobe": None, "reprobe": None, "margin": None}
        return {"backend": "faiss-ivf", "target_recall": self.target_recall, "nlist": self.nlist, **plan,
                "reprobed_fraction": round(self.reprobed, 6), "tune_queries": self.tune_queries,
                "check_queries": self.check_queries, "queries": self.n_queries, "recall_tune": self.recall_tune,
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
    need = _needed(recall, n)
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
        raise RecallOutOfReach(recall, need, {"": float(np.mean(rank < limit))}, n, limit, index.nlist)
    return best[1], best[2]


class RecallOutOfReach(BadInputError):
    """A recall target no probe plan reaches, in one line: the recall@1 it needs on the ``n`` tuning queries,
    the best reached there (per axis: ``reached``, '' for a single search), probing ``limit`` of ``nlist``
    lists, and the highest target that every axis reaches (:func:`reachable_target`). :meth:`combine` joins the
    refusals of the axes of one shift search."""

    def __init__(self, recall: float, need: float, reached: dict[str, float], n: int, limit: int, nlist: int):
        self.recall, self.need, self.reached, self.n, self.limit, self.nlist = recall, need, reached, n, limit, nlist
        top = reachable_target(min(reached.values()), n)
        what = f"pass --ann-recall {top:.4f} or lower" if top > 0 else "search exactly (no --ann-recall)"
        shown = " / ".join(f"{axis} {r:.4f}" if axis else f"{r:.4f}" for axis, r in reached.items())
        super().__init__(
            f"--ann-recall {recall:g} is out of reach: on the {n} tuning queries it needs recall@1 >= {need:.4f} "
            f"(the target plus one standard error, so that it holds beyond the sample) and the best plan, probing "
            f"{limit} of {nlist} lists (beyond that exact search is as fast), reaches {shown}; {what} "
            "(ann_recall in the API)")

    @classmethod
    def combine(cls, errors: Mapping[str, "RecallOutOfReach"]) -> "RecallOutOfReach":
        """One refusal for the axes (name -> refusal) of one search (same target and tuning queries)."""
        first = next(iter(errors.values()))
        reached = {axis: min(e.reached.values()) for axis, e in errors.items()}
        return cls(first.recall, first.need, reached, first.n, first.limit, first.nlist)


def _needed(recall: float, n: int) -> float:
    """The in-sample recall@1 a plan needs on ``n`` tuning queries for target ``recall``: the target plus one
    binomial standard error (at most 1)."""
    return min(1.0, recall + math.sqrt(recall * (1.0 - recall) / max(n, 1)))


def reachable_target(reached: float, n: int) -> float:
    """The largest target (a multiple of 0.0001) whose :func:`_needed` recall on ``n`` tuning queries is at most
    ``reached`` (0.0 when none is): the ``--ann-recall`` to suggest when a target is out of reach."""
    grid = np.arange(0, int(math.floor(reached * 10_000)) + 1) / 10_000  # _needed of each, vectorised:
    ok = grid[np.minimum(1.0, grid + np.sqrt(grid * (1.0 - grid) / max(n, 1))) <= reached + 1e-12]
    return float(ok.max()) if len(ok) else 0.0


class IvfChunks:
    """An IVF search of a query set given chunk by chunk (consecutive rows, in order). The queries whose probed
    lists were all empty are kept and searched exactly at the end, in one call (:meth:`missing`), as a search of
    the whole set does. Chunks of ``query_chunk`` rows (the last may be shorter) give the bytes of
    :func:`~isood.ann.ivf.ivf_search` on the whole set."""

    def __init__(self, index: IVFIndex, plan: ProbePlan | int | None, *, threads: int | None = None,
                 query_chunk: int = QUERY_CHUNK):
        self.index, self.plan, self.threads, self.query_chunk = index, plan, threads, int(query_chunk)
        self.done = 0
        self.n_again = 0
        self._rows: list[np.ndarray] = []
        self._queries: list[np.ndarray] = []

    def search(self, q: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(similarity, row) of the next chunk of queries; -inf / -1 where no probed list had a row (see
        :meth:`missing`)."""
        best, arg, again = ivf_search(self.index, q, self.plan, query_chunk=self.query_chunk, threads=self.threads)
        self.n_again += int(round(again * len(q)))
        missing = np.flatnonzero(arg < 0)
        if len(missing):
            self._rows.append(self.done + missing)
            self._queries.append(np.array(q[missing], dtype=np.float32))
        self.done += len(q)
        return best, arg

    def missing(self, exact: Exact) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(rows, similarity, row) of the queries no probed list answered, searched with ``exact``."""
        if not self._rows:
            return np.empty(0, np.int64), np.empty(0, np.float32), np.empty(0, np.int64)
        rows = np.concatenate(self._rows)
        sims, idx = exact(np.ascontiguousarray(np.concatenate(self._queries)))
        return rows, sims, idx


#: A fix of a chunked search's answers: (query rows, similarity, reference row), applied in order.
Fix = tuple[np.ndarray, np.ndarray, np.ndarray]


class TunedSearch:
    """:func:`search_tuned` in phases, for a query set of ``n_query`` rows given chunk by chunk: built with the
    sampled queries (``sample``: the queries at the tuning rows then at the held-out rows of ``rows``), it builds
    the index, searches the sample exactly and tunes the plan; :meth:`search` searches the next chunk;
    :meth:`finish` returns the fixes to apply in order (queries no probed list answered; the sampled queries'
    exact answers) and the report. ``exact_chunk`` searches a whole chunk exactly when the sample is too small
    to tune on (default ``exact``)."""

    def __init__(self, reference: np.ndarray, sample: np.ndarray, rows: tuple[np.ndarray, np.ndarray], *,
                 n_query: int, recall: float, exact: Exact, exact_chunk: Exact | None = None,
                 nlist: int | None = None, train_size: int | None = None, seed: int = 0,
                 threads: int | None = None, query_chunk: int = QUERY_CHUNK):
        self.rows, self.n_query, self.recall, self.exact = rows, int(n_query), recall, exact
        self.exact_chunk = exact_chunk or exact
        self.ivf: IvfChunks | None = None
        self.done = 0
        n_t = len(rows[0])
        if n_t < MIN_SAMPLE:  # too few queries to tune on: exact search is as cheap
            return
        t0 = time.perf_counter()
        index = build_ivf(reference, nlist=nlist, train_size=train_size, seed=seed)
        t1 = time.perf_counter()
        self.ex_sims, self.ex_idx = exact(np.ascontiguousarray(sample))
        plan, _ = tune_plan(index, np.ascontiguousarray(sample[:n_t]), self.ex_idx[:n_t], recall=recall,
                            threads=threads)
        self.seconds = [t1 - t0, time.perf_counter() - t1, 0.0]  # build, tune, search
        self.plan = plan
        self.ivf = IvfChunks(index, plan, threads=threads, query_chunk=query_chunk)
        self.both = np.concatenate(rows)
        self.approx_sims = np.empty(len(self.both), np.float32)
        self.approx_idx = np.empty(len(self.both), np.int64)

    def search(self, q: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(similarity, row) of the next chunk of queries (before the fixes of :meth:`finish`)."""
        start, self.done = self.done, self.done + len(q)
        if self.ivf is None:
            return self.exact_chunk(q)
        t = time.perf_counter()
        sims, idx = self.ivf.search(q)
        self.seconds[2] += time.perf_counter() - t
        here = np.flatnonzero((self.both >= start) & (self.both < self.done))
        self.approx_sims[here], self.approx_idx[here] = sims[self.both[here] - start], idx[self.both[here] - start]
        return sims, idx

    def finish(self) -> tuple[list[Fix], AnnReport]:
        """The fixes to apply to the answers, in order, and the report (once every chunk was searched)."""
        if self.done != self.n_query:
            raise BadInputError(f"tuned search: {self.done} queries searched, {self.n_query} expected")
        if self.ivf is None:
            return [], AnnReport(self.recall, 0, None, self.n_query, 0, 1.0, 1.0, n_queries=self.n_query)
        t = time.perf_counter()
        missing = self.ivf.missing(self.exact)
        self.seconds[2] += time.perf_counter() - t
        hit = np.isin(self.both, missing[0])
        if hit.any():  # sampled queries that no probed list answered: their approximate answer is the exact one
            at = np.searchsorted(missing[0], self.both[hit])
            self.approx_sims[hit], self.approx_idx[hit] = missing[1][at], missing[2][at]
        n_t, check_rows = len(self.rows[0]), self.rows[1]
        same = self.approx_idx == self.ex_idx
        build, tune, search = self.seconds
        report = AnnReport(
            self.recall, self.ivf.index.nlist, self.plan, n_t, len(check_rows), float(np.mean(same[:n_t])),
            float(np.mean(same[n_t:])) if len(check_rows) else float("nan"), self.ivf.n_again / self.n_query,
            build_seconds=build, tune_seconds=tune, search_seconds=search, index_bytes=self.ivf.index.nbytes,
            check_rows=check_rows, check_exact=self.ex_sims[n_t:].copy(), check_approx=self.approx_sims[n_t:].copy(),
            n_queries=self.n_query)
        return [missing, (self.both, self.ex_sims, self.ex_idx)], report


def search_tuned(query: np.ndarray, reference: np.ndarray, *, recall: float, exact: Exact,
                 rows: tuple[np.ndarray, np.ndarray] | None = None, sample: int = DEFAULT_SAMPLE,
                 nlist: int | None = None, train_size: int | None = None, seed: int = 0,
                 threads: int | None = None) -> tuple[np.ndarray, np.ndarray, AnnReport]:
    """Tuned IVF search of clean, L2-normalised ``query`` rows in ``reference`` (module docstring):
    (similarity, row, report). ``exact(q) -> (sims, rows)`` is the exact search of some queries."""
    rows = rows if rows is not None else sample_rows(len(query), sample, seed)
    tuned = TunedSearch(reference, query[np.concatenate(rows)], rows, n_query=len(query), recall=recall,
                        exact=exact, nlist=nlist, train_size=train_size, seed=seed, threads=threads)
    sims, idx = tuned.search(query)
    fixes, report = tuned.finish()
    for at, s, i in fixes:
        sims[at], idx[at] = s, i
    return sims, idx, report
