"""Approximate search for a level-agreement target (``ann_levels``): IVF answers, and an exact search of every
query whose level the approximation could have changed.

A grid level needs the nearest distance only to within a level: an IVF search can only *overestimate* a
distance (the nearest row may sit in a list that was not probed), so a query's level can change only when an
internal edge lies within the overestimate below its distance (or an end edge within it either side: the end
edges are quantiles of all the distances). :class:`LevelSearch`:

1. builds the IVF index and searches two disjoint samples of the queries exactly (tuning, held-out);
2. on the tuning sample picks the probed lists ``nprobe``, the widening (``wide`` lists for the queries whose
   best unprobed centroid is within ``gap`` of the similarity their level's lower edge asks for,
   :mod:`isood.features.ann.widen`), a margin scale ``h`` and a bound ``tau`` of the cheapest plan: a query's *reach* is
   ``tau * w`` with ``w = exp(-m / h)``, ``m`` = its best similarity after its lists minus the similarity of its
   next centroid (a query far ahead of the lists it did not probe gains little from them); ``tau`` is the
   smallest that leaves at most the target's share (plus one binomial standard error) of the tuning queries at
   another level with no edge within reach, at the sample's edges and at those edges moved by up to their slack
   (``EDGE_SHIFTS``: the build's edges are not the sample's); cost = the share of the reference rows scanned
   (``SCAN_WEIGHT``) + the share of queries an edge is within reach of (searched exactly);
3. searches every query with ``nprobe`` lists, the queries the widening rule picks (at the edges of the
   distances found before their chunk) with lists ``nprobe .. wide`` too, keeps the queries an edge may be
   within reach of (edges of the distances found so far, widened by ``EDGE_Z`` standard errors of their end
   quantiles), and at the end, at the final edges, searches exactly every kept query an edge is within reach of
   by its own answer (repeated until the edges settle; a sampled query too, so that the held-out check
   measures what every other query gets);
4. reports the level agreement of the held-out queries at the build's own edges and its one-sided lower
   confidence bound (Wilson), from held-out queries only, and the queries an edge reached that were not kept
   (``uncovered``: 0 unless a streamed build's edges moved beyond their estimate).

So a query keeps an approximate distance only where, by the tuned reach, no exact answer could move it to another
level; a query whose overestimate exceeds its reach (the tuning sample bounds how often) may change level, which the
held-out check measures. Torch-free; faiss builds the index.
"""
from __future__ import annotations

import math
import time
from statistics import NormalDist
from typing import Callable

import numpy as np

from isood.features.ann.ivf import QUERY_CHUNK, IVFIndex, build_ivf, list_maxima, probe, scan_lists
from isood.features.ann.widen import gap_candidates, list_rows, widen_stat
from isood.features.ann.tune import MAX_SCAN_FRACTION, MIN_SAMPLE, _needed, AnnReport, Fix, ProbePlan, Target, probe_ladder
from isood.core.errors import BadInputError
from isood.science.grid import bin_with_edges, level_edges

__all__ = ["LevelPlan", "LevelSearch", "near_edge", "lower_bound", "tune_levels", "EDGE_Z", "KMEANS_ITER", "SCALES",
           "SCAN_WEIGHT"]

Exact = Callable[[np.ndarray], tuple[np.ndarray, np.ndarray]]

#: Margin scales ``h`` tried by the tuner (``inf``: one bound for every query).
SCALES = (0.05, 0.1, 0.2, math.inf)
#: Standard errors of the sample's end quantiles by which the provisional edges are widened.
EDGE_Z = 4.0
#: Shifts of the edges, in units of their slack, at which a tuning query must keep its level.
EDGE_SHIFTS = (-1.0, -0.5, 0.0, 0.5, 1.0)
#: A list scanned costs this many times its share of an exact search (scanning lists is less efficient:
#: 1 / 0.6 measured on 2 cores at 2048 lists of 200k rows).
SCAN_WEIGHT = 1.7
#: A widened query may probe this many times the lists (``MAX_SCAN_FRACTION``) every query may probe.
WIDE_FACTOR = 2
#: k-means iterations of the index (the lists only have to be compact enough to probe; the answer's level is
#: what is checked): 8 cost 40% of the default 20 and gave the same recall@1 at 128 of 2048 lists (clip world).
KMEANS_ITER = 8
#: One-sided confidence of the reported lower bound of the held-out level agreement.
BOUND_CONFIDENCE = 0.95


class LevelPlan:
    """What the tuner chose: ``nprobe`` lists per query, ``wide`` lists for a query the widening rule picks
    (``gap``, :mod:`isood.features.ann.widen`; ``wide == nprobe``: none), margin scale ``scale``, bound ``tau``, the
    provisional ``edges`` and their ``slack`` (per edge), the estimated shares of queries widened and searched
    exactly, and the estimated share of the reference rows a query scans."""

    def __init__(self, nprobe: int, scale: float, tau: float, edges: np.ndarray, slack: np.ndarray,
                 exact_share: float, *, wide: int | None = None, gap: float = math.inf):
        self.nprobe, self.scale, self.tau = int(nprobe), float(scale), float(tau)
        self.wide, self.gap = int(wide or nprobe), float(gap)
        self.edges, self.slack, self.exact_share = edges, slack, float(exact_share)
        self.widened_share, self.scan_share = 0.0, 0.0
        self.shift = [0.0, 0.0]  # how far the end quantiles of the sample's IVF answers are from its exact ones

    def weight(self, margin: np.ndarray) -> np.ndarray:
        """``w`` of queries with these margins (1 for the scale ``inf``), capped to keep it finite."""
        if math.isinf(self.scale):
            return np.ones_like(margin, dtype=np.float64)
        return np.exp(np.minimum(-np.asarray(margin, np.float64) / self.scale, 50.0))

    def as_dict(self) -> dict:
        return {"nprobe": self.nprobe, "wide": self.wide, "gap": None if math.isinf(self.gap) else self.gap,
                "margin_scale": None if math.isinf(self.scale) else self.scale, "tau": self.tau}


def near_edge(distance: np.ndarray, reach: np.ndarray, edges: np.ndarray, slack: np.ndarray | float = 0.0) -> np.ndarray:
    """Whether an exact answer could change each query's level: an internal edge (anywhere within ``slack``
    of ``edges``) in ``(distance - reach, distance]``, or an end edge within ``reach`` either side; NaN / inf
    distances (no list answered) count as near."""
    d = np.asarray(distance, np.float64)
    r = np.asarray(reach, np.float64)
    e = np.asarray(edges, np.float64)
    s = np.broadcast_to(np.asarray(slack, np.float64), e.shape)
    out = ~np.isfinite(d)
    with np.errstate(invalid="ignore"):
        for j in range(1, len(e) - 1):
            out |= (e[j] - s[j] <= d) & (e[j] + s[j] > d - r)
        for j in (0, len(e) - 1):
            out |= np.abs(d - e[j]) < r + s[j]
    return out


def lower_bound(k: int, n: int, confidence: float = BOUND_CONFIDENCE) -> float:
    """One-sided lower confidence bound (Wilson score) of a proportion ``k / n`` (0.0 for n = 0)."""
    if n <= 0:
        return 0.0
    z = NormalDist().inv_cdf(float(confidence))
    p = k / n
    mid = (p + z * z / (2 * n)) / (1 + z * z / n)
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / (1 + z * z / n)
    return max(0.0, mid - half)


def _distance(sims: np.ndarray) -> np.ndarray:
    return np.clip(1.0 - np.asarray(sims, np.float64), 0.0, 2.0)


def _edges(exact_d: np.ndarray, target: Target) -> tuple[np.ndarray, np.ndarray]:
    """Provisional edges from the exact sample and their slack: the end quantiles' spread over EDGE_Z
    binomial standard errors of their rank, interpolated to the inner edges."""
    edges = level_edges(exact_d, target.grid_levels, clip=target.grid_clip)
    n = len(exact_d)
    spread = []
    for c in target.grid_clip:
        se = EDGE_Z * math.sqrt(max(c * (1 - c), 1.0 / n) / n)
        lo, hi = np.quantile(exact_d, [max(0.0, c - se), min(1.0, c + se)])
        spread.append(max(abs(hi - np.quantile(exact_d, c)), abs(np.quantile(exact_d, c) - lo)))
    t = np.linspace(0.0, 1.0, len(edges))
    return edges, (1 - t) * spread[0] + t * spread[1]


def _moved(found_d: np.ndarray, exact_d: np.ndarray, edges: np.ndarray, slack: np.ndarray) -> np.ndarray:
    """Whether each tuning query is at another level than its exact distance's at the edges, or at the edges
    moved by up to their ``slack`` either way (the build's edges are not the sample's: a rule tuned only at
    the sample's own edges overfits their place)."""
    out = np.zeros(len(found_d), bool)
    for shift in EDGE_SHIFTS:
        e = np.maximum.accumulate(edges + shift * slack)
        out |= bin_with_edges(found_d, e) != bin_with_edges(exact_d, e)
    return out


def tune_levels(index: IVFIndex, query: np.ndarray, exact_sims: np.ndarray, sample_d: np.ndarray, *,
                target: Target, threads: int | None = None) -> LevelPlan:
    """The cheapest :class:`LevelPlan` (module docstring) for the tuning ``query`` rows (exact similarities
    ``exact_sims``); ``sample_d``: the exact distances of the tuning sample (the provisional edges)."""
    n = len(query)
    first = max(1, int(index.nlist * MAX_SCAN_FRACTION))  # the lists every query may probe
    limit = min(index.nlist, WIDE_FACTOR * first)  # and a widened one
    csims, lists = probe(index, query, min(limit + 1, index.nlist))
    seen = np.maximum.accumulate(list_maxima(index, query, lists[:, :limit], threads=threads), axis=1)
    rows = list_rows(np.diff(index.offsets), lists[:, :limit], len(index.ids))
    edges, slack = _edges(sample_d, target)
    exact_s = np.asarray(exact_sims, np.float64)
    exact_d = _distance(exact_s)
    allowed = int(math.floor((1.0 - _needed(float(target.levels or 1.0), n)) * n + 1e-9))
    ladder = probe_ladder(limit)
    nxt = {p: (csims[:, p] if p < csims.shape[1] else np.full(n, -1.0)).astype(np.float64) for p in ladder}
    found = {p: seen[:, p - 1].astype(np.float64) for p in ladder}
    changed = {p: np.isfinite(found[p]) & _moved(_distance(found[p]), exact_d, edges, slack) for p in ladder}
    best: tuple[float, LevelPlan] | None = None
    for p in [k for k in ladder if k <= first]:
        stat = widen_stat(_distance(found[p]), nxt[p], edges, slack)
        for wide in [w for w in ladder if w >= 2 * p] or [p]:
            for gap in gap_candidates(stat, changed[p]) if wide > p else [math.inf]:
                widened = stat >= gap
                f = np.where(widened, found[wide], found[p])
                ok = np.isfinite(f)
                over = np.where(ok, exact_s - f, 0.0)
                margin = np.where(ok, f - np.where(widened, nxt[wide], nxt[p]), 0.0)
                moved = np.where(widened, changed[wide], changed[p])
                scan = float(np.mean(np.where(widened, rows[:, wide - 1], rows[:, p - 1])))
                for h in SCALES:
                    plan = LevelPlan(p, h, 0.0, edges, slack, 0.0, wide=wide, gap=gap)
                    w = plan.weight(margin)
                    ratio = np.sort(over[moved] / w[moved])[::-1]
                    plan.tau = max(0.0, float(ratio[allowed]) * (1 + 1e-6)) if allowed < len(ratio) else 0.0
                    plan.exact_share = float(np.mean(near_edge(_distance(f), plan.tau * w, edges) | ~ok))
                    plan.widened_share, plan.scan_share = float(np.mean(widened)), scan
                    cost = SCAN_WEIGHT * scan + plan.exact_share
                    if best is None or cost < best[0]:
                        plan.shift = [float(abs(np.quantile(_distance(f[ok]), c) -
                                                np.quantile(_distance(exact_s[ok]), c))) if ok.any() else 0.0
                                      for c in target.grid_clip]
                        best = (cost, plan)
    assert best is not None
    return best[1]


class LevelSearch:
    """The level-targeted search (module docstring) of ``n_query`` queries given chunk by chunk, with the
    interface of :class:`isood.features.ann.TunedSearch`: ``sample`` holds the queries at ``rows`` (tuning, then
    held-out); :meth:`search` answers a chunk, :meth:`finish` returns the fixes (the queries near an edge and
    the sampled ones, searched exactly) and the report."""

    def __init__(self, reference: np.ndarray, sample: np.ndarray, rows: tuple[np.ndarray, np.ndarray], *,
                 n_query: int, target: Target, exact: Exact, exact_chunk: Exact | None = None,
                 nlist: int | None = None, train_size: int | None = None, seed: int = 0,
                 threads: int | None = None, query_chunk: int = QUERY_CHUNK):
        if target.levels is None:
            raise BadInputError("a level search needs an ann_levels target")
        self.target, self.rows, self.n_query, self.exact = target, rows, int(n_query), exact
        self.exact_chunk = exact_chunk or exact
        self.threads, self.query_chunk = threads, int(query_chunk)
        self.done = 0
        self.index: IVFIndex | None = None
        n_t = len(rows[0])
        if n_t < 2 * MIN_SAMPLE:  # too few queries to tune and calibrate on: exact search is as cheap
            return
        t0 = time.perf_counter()
        self.index = build_ivf(reference, nlist=nlist, train_size=train_size, seed=seed, niter=KMEANS_ITER)
        t1 = time.perf_counter()
        self.ex_sims, self.ex_idx = exact(np.ascontiguousarray(sample))
        self.plan = tune_levels(self.index, np.ascontiguousarray(sample[:n_t]), self.ex_sims[:n_t],
                                _distance(self.ex_sims[:n_t]), target=target, threads=threads)
        self.seconds = [t1 - t0, time.perf_counter() - t1, 0.0]
        self.found = np.empty(self.n_query, np.float32)
        self.widened = 0
        self.reach = np.empty(self.n_query, np.float64)
        self.kept_rows: list[np.ndarray] = []
        self.kept_q: list[np.ndarray] = []
        self.both = np.concatenate(rows)
        order = np.argsort(self.both)
        self.both_sorted, self.ex_sorted = self.both[order], self.ex_sims[order]

    def search(self, q: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(similarity, row) of the next chunk of queries (before the fixes of :meth:`finish`)."""
        start, self.done = self.done, self.done + len(q)
        if self.index is None:
            return self.exact_chunk(q)
        t = time.perf_counter()
        q = np.ascontiguousarray(q, dtype=np.float32)
        plan, p = self.plan, self.plan.nprobe
        sims = np.empty(len(q), np.float32)
        idx = np.empty(len(q), np.int64)
        edges, slack = self._provisional(start)  # the distances before this chunk
        for a in range(0, len(q), self.query_chunk):
            part = q[a:a + self.query_chunk]
            csims, lists = probe(self.index, part, min(p + 1, self.index.nlist))
            s, i = scan_lists(self.index, part, lists[:, :p], threads=self.threads)
            nxt = csims[:, p] if p < csims.shape[1] else np.full(len(part), -1.0, np.float32)
            nxt = nxt.astype(np.float64)
            if plan.wide > p:  # the widening rule (isood.features.ann.widen): lists p .. wide of the queries it picks
                more = np.flatnonzero(widen_stat(_distance(s), nxt, edges, slack) >= plan.gap)
                if len(more):
                    c2, l2 = probe(self.index, part[more], min(plan.wide + 1, self.index.nlist))
                    s2, i2 = scan_lists(self.index, part[more], l2[:, p:plan.wide], threads=self.threads)
                    better = s2 > s[more]
                    s[more[better]], i[more[better]] = s2[better], i2[better]
                    nxt[more] = c2[:, plan.wide] if plan.wide < c2.shape[1] else -1.0
                    self.widened += len(more)
            margin = np.where(np.isfinite(s), s.astype(np.float64) - nxt, 0.0)
            sims[a:a + len(part)], idx[a:a + len(part)] = s, i
            self.reach[start + a:start + a + len(part)] = plan.tau * plan.weight(margin)
        self.found[start:self.done] = sims
        edges, slack = self._provisional()
        near = near_edge(_distance(sims), self.reach[start:self.done], edges, slack) | (idx < 0)
        rows = np.flatnonzero(near)
        if len(rows):
            self.kept_rows.append(start + rows)
            self.kept_q.append(np.array(q[rows], dtype=np.float32))
        self.seconds[2] += time.perf_counter() - t
        return sims, idx

    def _provisional(self, upto: int | None = None) -> tuple[np.ndarray, np.ndarray]:
        """Edges of the distances found so far (of the first ``upto`` queries, default all searched; the
        sampled queries' exact ones in), widened by EDGE_Z standard errors of their end quantiles and by the
        sample's IVF overestimate of them."""
        upto = self.done if upto is None else int(upto)
        seen = self.found[:upto].copy()
        inside = self.both[self.both < upto]
        at = np.searchsorted(self.both_sorted, inside)
        seen[inside] = self.ex_sorted[at]
        d = _distance(seen)
        d = d[np.isfinite(seen)]
        if upto < self.n_query:  # distances still to come: the exact sample's edges weigh in
            d = np.concatenate([d, _distance(self.ex_sims)])
        edges, slack = _edges(d, self.target)
        t = np.linspace(0.0, 1.0, len(edges))
        return edges, slack + (1 - t) * self.plan.shift[0] + t * self.plan.shift[1]

    def finish(self) -> tuple[list[Fix], AnnReport]:
        """The fixes to apply to the answers, in order, and the report (once every chunk was searched)."""
        if self.done != self.n_query:
            raise BadInputError(f"level search: {self.done} queries searched, {self.n_query} expected")
        target = self.target
        if self.index is None:
            return [], AnnReport(None, 0, None, self.n_query, 0, 1.0, 1.0, n_queries=self.n_query,
                                 target_levels=target.levels, levels_tune=1.0)
        t = time.perf_counter()
        kept = np.concatenate(self.kept_rows) if self.kept_rows else np.empty(0, np.int64)
        kept_q = np.concatenate(self.kept_q) if self.kept_q else np.empty((0, 0), np.float32)
        approx = self.found.copy()  # what each query is answered (before the sampled rows get their exact answer)
        exact_done = np.zeros(self.n_query, bool)
        searched = np.zeros(len(kept), bool)
        k_sims, k_idx = np.full(len(kept), np.nan, np.float32), np.full(len(kept), -1, np.int64)
        while True:  # the final edges, and an exact answer for every kept query an edge is within reach of
            final = approx.copy()
            final[self.both] = self.ex_sims
            edges = level_edges(_distance(final), target.grid_levels, clip=target.grid_clip)
            # decided on each kept query's own answer (a sampled one's exact answer is only the check's)
            mine = approx[kept]
            todo = ~searched & (near_edge(_distance(mine), self.reach[kept], edges) | ~np.isfinite(mine))
            if not todo.any():
                break
            k_sims[todo], k_idx[todo] = self.exact(np.ascontiguousarray(kept_q[todo]))
            searched |= todo
            approx[kept[todo]] = k_sims[todo]
        self.seconds[2] += time.perf_counter() - t
        kept, k_sims, k_idx = kept[searched], k_sims[searched], k_idx[searched]
        exact_done = np.zeros(self.n_query, bool)
        exact_done[kept] = True
        exact_done[self.both] = True
        uncovered = int(np.sum((near_edge(_distance(final), self.reach, edges) | ~np.isfinite(final)) & ~exact_done))
        n_t, check = len(self.rows[0]), self.rows[1]
        ex_d = _distance(self.ex_sims)
        ap_d = _distance(approx[self.both])
        agree = bin_with_edges(ap_d, edges) == bin_with_edges(ex_d, edges)
        k_held, n_held = int(agree[n_t:].sum()), len(check)
        same = np.isclose(approx[self.both], self.ex_sims, rtol=0, atol=1e-6)
        build, tune, search = self.seconds
        report = AnnReport(
            None, self.index.nlist, ProbePlan(self.plan.nprobe), n_t, n_held, float(np.mean(same[:n_t])),
            float(np.mean(same[n_t:])) if n_held else float("nan"), 0.0, build_seconds=build,
            tune_seconds=tune, search_seconds=search, index_bytes=self.index.nbytes, check_rows=check,
            check_exact=self.ex_sims[n_t:].copy(), check_approx=approx[check].copy(), n_queries=self.n_query,
            target_levels=target.levels, levels_tune=float(np.mean(agree[:n_t])))
        report.levels = {"plan": self.plan.as_dict(), "exact_share": len(kept) / max(self.n_query, 1),
                         "kept_share": len(searched) / max(self.n_query, 1),
                         "widened_share": self.widened / max(self.n_query, 1),
                         "widened_share_tuned": self.plan.widened_share, "scan_share_tuned": self.plan.scan_share,
                         "exact_share_tuned": self.plan.exact_share, "uncovered": uncovered,
                         "levels_heldout": k_held / n_held if n_held else 1.0,
                         "levels_heldout_lower": lower_bound(k_held, n_held), "bound_confidence": BOUND_CONFIDENCE,
                         "tuning_agreement_needed": _needed(float(target.levels or 1.0), n_t)}
        fixes: list[Fix] = [(kept, k_sims, k_idx), (self.both, self.ex_sims, self.ex_idx)]
        return fixes, report
