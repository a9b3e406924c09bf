"""Approximate search tuned to a target: recall@1 (the ``ann_recall`` knob) or the share of rows whose grid
level is unchanged (``ann_levels``).

:func:`search_tuned` builds the IVF index, searches two disjoint seeded samples of the queries exactly (faiss
flat / torch): the *tuning* sample picks the cheapest :class:`~isood.features.ann.ivf.ProbePlan` whose recall@1 on it
reaches the target plus one binomial standard error (:func:`tune_plan`), the *held-out* sample measures what the
full search achieved (recall@1, and the distances a caller needs for level agreement). Both samples get their
exact answers in the output. A target that no plan reaches while scanning at most ``MAX_SCAN_FRACTION`` of the
lists (beyond that exact search is as fast) is refused with one line.

With a *levels* target (:func:`tune_plan_levels`) a query counts as answered when its approximate distance
falls in the same grid level as its exact one: ``grid_levels`` equal-width levels between the ``grid_clip``
quantiles of the tuning sample's exact distances (the grid of ``isood.science.grid``). Near-tie neighbours give the
same distance, so a plan that misses the nearest row of many far queries can still leave their levels
unchanged: the plan is cheaper than the one recall@1 asks for at the same agreement. The grid of the build
itself comes from all the distances; ``isood.features.ann.agreement`` estimates the agreement of that grid with an exact
build from the held-out sample.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field
from typing import Callable, Mapping

import numpy as np

from isood.features.ann.ivf import (QUERY_CHUNK, IVFIndex, ProbePlan, build_ivf, ivf_search, list_maxima, probe,
                           scan_lists)
from isood.core.defaults import N_LEVELS, QUANTILE_CLIP
from isood.core.errors import BadInputError
from isood.science.grid import assign_levels, bin_with_edges

__all__ = ["AnnReport", "MAX_SCAN_FRACTION", "DEFAULT_SAMPLE", "Fix", "IvfChunks", "TunedSearch", "probe_ladder",
           "RecallOutOfReach", "reachable_target", "sample_rows", "search_tuned", "tune_plan", "tune_plan_levels",
           "Target"]

#: A plan may probe at most this fraction of the lists (a wider scan is no faster than exact search).
MAX_SCAN_FRACTION = 0.125
#: Queries in each of the tuning and held-out samples (at most a quarter of the queries each).
DEFAULT_SAMPLE = 2000
#: Samples smaller than this are not worth tuning on: the whole search is then exact.
MIN_SAMPLE = 10

Exact = Callable[[np.ndarray], tuple[np.ndarray, np.ndarray]]


@dataclass(frozen=True)
class Target:
    """What a tuned search must reach on its held-out queries: ``recall`` (recall@1) or ``levels`` (the share
    of queries whose level, among ``grid_levels`` levels between the ``grid_clip`` quantiles, is unchanged)."""

    recall: float | None = None
    levels: float | None = None
    grid_levels: int = N_LEVELS
    grid_clip: tuple[float, float] = QUANTILE_CLIP

    def __post_init__(self) -> None:
        if (self.recall is None) == (self.levels is None):
            raise BadInputError("a tuned search needs one target: ann_recall or ann_levels")

    @property
    def value(self) -> float:
        value = self.recall if self.recall is not None else self.levels
        assert value is not None  # __post_init__: exactly one target
        return float(value)

    @property
    def option(self) -> str:
        """The command-line option of the target."""
        return "--ann-recall" if self.recall is not None else "--ann-levels"

    @property
    def measure(self) -> str:
        return "recall@1" if self.recall is not None else "level agreement"


@dataclass
class AnnReport:
    """What a tuned approximate search did and achieved (JSON-able via :meth:`as_dict`; the held-out arrays
    stay in memory for level agreement)."""

    target_recall: float | None  # None for an ann_levels target
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
    target_levels: float | None = None  # an ann_levels target (target_recall is None then)
    levels_tune: float | None = None  # level agreement on the tuning queries (their own grid), levels target
    levels: dict | None = None  # a level search's plan and held-out agreement (isood.features.ann.levels)

    def as_dict(self) -> dict:
        plan = self.plan.as_dict() if self.plan is not None else {"nprobe": None, "reprobe": None, "margin": None}
        out = {"backend": "faiss-ivf", "target_recall": self.target_recall, "nlist": self.nlist, **plan,
               "reprobed_fraction": round(self.reprobed, 6), "tune_queries": self.tune_queries,
               "check_queries": self.check_queries, "queries": self.n_queries, "recall_tune": self.recall_tune,
               "recall_heldout": self.recall_check, "build_seconds": round(self.build_seconds, 3),
               "tune_seconds": round(self.tune_seconds, 3), "search_seconds": round(self.search_seconds, 3),
               "index_bytes": self.index_bytes}
        if self.target_levels is not None:
            out.update(target_levels=self.target_levels, levels_tune=self.levels_tune)
        if self.levels is not None:
            out.update(self.levels)
        return out


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


def _cheapest(limit: int, need: float, hits: Callable[[int], np.ndarray],
              best_after: Callable[[int], np.ndarray], csims: np.ndarray) -> tuple[float, ProbePlan, float] | None:
    """The cheapest plan (fewest lists scanned per query on average) whose share of answered queries is
    >= ``need``: ``hits(p)`` says which queries ``p`` lists answer, ``best_after(p)`` their best similarity
    after ``p`` lists (the margin rule's left side). (cost, plan, share reached) or None."""
    n = len(csims)
    best: tuple[float, ProbePlan, float] | None = None
    for p1 in probe_ladder(limit):
        hit1 = hits(p1)
        if hit1.mean() >= need:
            cand = (float(p1), ProbePlan(p1), float(hit1.mean()))
            best = cand if best is None or cand[0] < best[0] else best
            break
        if p1 >= limit or (best is not None and p1 >= best[0]):
            continue
        m = best_after(p1) - csims[:, p1]
        for p2 in (p for p in probe_ladder(limit) if p > p1):
            hit2 = hits(p2)
            split = _best_split(m, hit1, hit2, need)
            if split is None:
                continue
            k, margin = split
            cost = p1 + k / n * (p2 - p1)
            if best is None or cost < best[0]:
                reached = float(np.where(m < margin, hit2, hit1).mean())
                best = (cost, ProbePlan(p1, p2, margin), reached)
    return best


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
    best = _cheapest(limit, need, lambda p: rank < p,
                     lambda p: scan_lists(index, query, lists[:, :p], threads=threads)[0], csims)
    if best is None:
        raise RecallOutOfReach(recall, need, {"": float(np.mean(rank < limit))}, n, limit, index.nlist)
    return best[1], best[2]


def tune_plan_levels(index: IVFIndex, query: np.ndarray, exact_sims: np.ndarray, *, target: Target,
                     max_fraction: float = MAX_SCAN_FRACTION,
                     threads: int | None = None) -> tuple[ProbePlan, float]:
    """The cheapest plan whose level agreement on the sample ``query`` (exact similarities ``exact_sims``) is
    >= ``target.levels`` + one standard error: a query agrees when its approximate distance falls in the level
    of its exact one, among ``target.grid_levels`` equal-width levels between the ``target.grid_clip`` quantiles
    of the sample's exact distances (a query no probed list answers is searched exactly: it agrees). Returns
    (plan, in-sample agreement); a target no plan within ``max_fraction`` of the lists reaches is refused."""
    n = len(query)
    assert target.levels is not None  # a levels target (TunedSearch calls this only then)
    need = _needed(float(target.levels), n)
    limit = max(1, int(index.nlist * max_fraction))
    csims, lists = probe(index, query, limit)
    best_seen = np.maximum.accumulate(list_maxima(index, query, lists, threads=threads), axis=1)
    exact_d = np.clip(1.0 - np.asarray(exact_sims, np.float64), 0.0, 2.0)
    truth, edges = assign_levels(exact_d, target.grid_levels, clip=target.grid_clip)

    def hits(p: int) -> np.ndarray:
        s = best_seen[:, p - 1]
        return ~np.isfinite(s) | (bin_with_edges(np.clip(1.0 - s.astype(np.float64), 0.0, 2.0), edges) == truth)

    best = _cheapest(limit, need, hits, lambda p: best_seen[:, p - 1], csims)
    if best is None:
        raise RecallOutOfReach(float(target.levels), need, {"": float(hits(limit).mean())}, n, limit, index.nlist,
                               target=Target(levels=target.levels))
    return best[1], best[2]


class RecallOutOfReach(BadInputError):
    """A target no probe plan reaches, in one line: the recall@1 (or level agreement, ``target``) it needs on
    the ``n`` tuning queries, the best reached there (per axis: ``reached``, '' for a single search), probing
    ``limit`` of ``nlist`` lists, and the highest target that every axis reaches (:func:`reachable_target`).
    :meth:`combine` joins the refusals of the axes of one shift search."""

    def __init__(self, recall: float, need: float, reached: dict[str, float], n: int, limit: int, nlist: int, *,
                 target: "Target | None" = None):
        self.recall, self.need, self.reached, self.n, self.limit, self.nlist = recall, need, reached, n, limit, nlist
        self.target = target or Target(recall=recall)
        option, measure = self.target.option, self.target.measure
        top = reachable_target(min(reached.values()), n)
        what = f"pass {option} {top:.4f} or lower" if top > 0 else f"search exactly (no {option})"
        shown = " / ".join(f"{axis} {r:.4f}" if axis else f"{r:.4f}" for axis, r in reached.items())
        super().__init__(
            f"{option} {recall:g} is out of reach: on the {n} tuning queries it needs {measure} >= {need:.4f} "
            f"(the target plus one standard error, so that it holds beyond the sample) and the best plan, probing "
            f"{limit} of {nlist} lists (beyond that exact search is as fast), reaches {shown}; {what} "
            f"({option[2:].replace('-', '_')} in the API)")

    @classmethod
    def combine(cls, errors: Mapping[str, "RecallOutOfReach"]) -> "RecallOutOfReach":
        """One refusal for the axes (name -> refusal) of one search (same target and tuning queries)."""
        first = next(iter(errors.values()))
        reached = {axis: min(e.reached.values()) for axis, e in errors.items()}
        return cls(first.recall, first.need, reached, first.n, first.limit, first.nlist, target=first.target)


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
    :func:`~isood.features.ann.ivf.ivf_search` on the whole set."""

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
    to tune on (default ``exact``). The target is ``recall`` (recall@1) or a :class:`Target` (``target``: a
    recall or a levels target)."""

    def __init__(self, reference: np.ndarray, sample: np.ndarray, rows: tuple[np.ndarray, np.ndarray], *,
                 n_query: int, recall: float | None = None, exact: Exact, exact_chunk: Exact | None = None,
                 nlist: int | None = None, train_size: int | None = None, seed: int = 0,
                 threads: int | None = None, query_chunk: int = QUERY_CHUNK, target: Target | None = None):
        self.target = target if target is not None else Target(recall=recall)
        self.rows, self.n_query, self.recall, self.exact = rows, int(n_query), self.target.recall, exact
        self.exact_chunk = exact_chunk or exact
        self.levels_tune: float | None = None
        self.ivf: IvfChunks | None = None
        self.done = 0
        n_t = len(rows[0])
        if n_t < MIN_SAMPLE:  # too few queries to tune on: exact search is as cheap
            return
        t0 = time.perf_counter()
        index = build_ivf(reference, nlist=nlist, train_size=train_size, seed=seed)
        t1 = time.perf_counter()
        self.ex_sims, self.ex_idx = exact(np.ascontiguousarray(sample))
        tune_q = np.ascontiguousarray(sample[:n_t])
        if self.target.levels is not None:
            plan, self.levels_tune = tune_plan_levels(index, tune_q, self.ex_sims[:n_t], target=self.target,
                                                      threads=threads)
        else:
            plan, _ = tune_plan(index, tune_q, self.ex_idx[:n_t], recall=self.target.value, threads=threads)
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
            return [], AnnReport(self.recall, 0, None, self.n_query, 0, 1.0, 1.0, n_queries=self.n_query,
                                 target_levels=self.target.levels,
                                 levels_tune=1.0 if self.target.levels is not None else None)
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
            n_queries=self.n_query, target_levels=self.target.levels, levels_tune=self.levels_tune)
        return [missing, (self.both, self.ex_sims, self.ex_idx)], report


def search_tuned(query: np.ndarray, reference: np.ndarray, *, recall: float | None = None, exact: Exact,
                 rows: tuple[np.ndarray, np.ndarray] | None = None, sample: int = DEFAULT_SAMPLE,
                 nlist: int | None = None, train_size: int | None = None, seed: int = 0,
                 threads: int | None = None, levels: float | None = None, grid_levels: int = N_LEVELS,
                 grid_clip: tuple[float, float] = QUANTILE_CLIP) -> tuple[np.ndarray, np.ndarray, AnnReport]:
    """Tuned IVF search of clean, L2-normalised ``query`` rows in ``reference`` (module docstring):
    (similarity, row, report). ``exact(q) -> (sims, rows)`` is the exact search of some queries. The target
    is ``recall`` (recall@1) or ``levels`` (level agreement on the grid of ``grid_levels`` / ``grid_clip``)."""
    rows = rows if rows is not None else sample_rows(len(query), sample, seed)
    target = Target(recall=recall, levels=levels, grid_levels=grid_levels,
                    grid_clip=(float(grid_clip[0]), float(grid_clip[1])))
    tuned = TunedSearch(reference, query[np.concatenate(rows)], rows, n_query=len(query), target=target,
                        exact=exact, nlist=nlist, train_size=train_size, seed=seed, threads=threads)
    sims, idx = tuned.search(query)
    fixes, report = tuned.finish()
    for at, s, i in fixes:
        sims[at], idx[at] = s, i
    return sims, idx, report
