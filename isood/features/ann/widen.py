"""The second stage of the level-targeted search (:mod:`isood.features.ann.levels`): which queries probe more lists.

An inverted-file answer can only *overestimate* a distance, so a query whose level is ``b`` keeps it unless
some reference row is closer than the lower edge of ``b``: the exact nearest distance is not needed, only
evidence that no unprobed list holds a row above the edge's similarity. The lists a query did not probe are
ranked by their centroid similarity; the best of them, ``next``, stands for what they may hold. A query is
*widened* (its lists ``nprobe .. wide`` scanned too) when

    ``next - (1 - lower edge) >= gap``

(:func:`widen_stat`: how far the best unprobed centroid is above the similarity the level's lower edge asks
for). A query in the lowest level cannot move down and is never widened; one with no answer always is. Near
queries (a nearest row far ahead of every unprobed centroid) stop after ``nprobe`` lists, far queries (their
nearest rows near-ties spread over many lists) go on to ``wide``: most of the scan a single probe count would
spend on every query goes to the queries whose level needs it. ``gap`` is tuned on the tuning sample
(:func:`gap_candidates`), with the edges widened by their slack so that the rule holds at any edge within it.
Pure numpy.
"""
from __future__ import annotations

import math

import numpy as np

__all__ = ["widen_stat", "gap_candidates", "list_rows", "GAP_MISSES"]

#: Tuning queries that change level at ``nprobe`` lists which a candidate ``gap`` may leave unwidened (the
#: exact search near an edge catches them or the tuner's allowance does): 0, 1, 2, 4, ... of them.
GAP_MISSES = (0, 1, 2, 4, 8, 16)


def widen_stat(distance: np.ndarray, next_sim: np.ndarray, edges: np.ndarray,
               slack: np.ndarray | float = 0.0) -> np.ndarray:
    """Per query: the similarity of its best unprobed centroid ``next_sim`` minus the similarity of the lower
    edge of the highest level its ``distance`` may be in (inner edges anywhere within ``slack``; the edge taken
    at its highest), ``-inf`` where no inner edge can be at or below the distance (the lowest level), ``+inf``
    where the distance is not finite (no probed list answered)."""
    d = np.asarray(distance, np.float64)
    e = np.asarray(edges, np.float64)
    s = np.broadcast_to(np.asarray(slack, np.float64), e.shape)
    inner_lo, inner_hi = (e - s)[1:-1], (e + s)[1:-1]
    finite = np.isfinite(d)
    # the highest inner edge j with e_j - s_j <= d (edges are non-decreasing, so are e - s up to rounding)
    j = np.searchsorted(np.maximum.accumulate(inner_lo), np.where(finite, d, 0.0), side="right") - 1
    top = np.where(j >= 0, inner_hi[np.maximum(j, 0)], math.nan)
    stat = np.asarray(next_sim, np.float64) - (1.0 - top)
    stat = np.where(j >= 0, stat, -math.inf)
    return np.where(finite, stat, math.inf)


def gap_candidates(stat: np.ndarray, changed: np.ndarray) -> list[float]:
    """Gaps to try: for each count in :data:`GAP_MISSES`, the largest gap that widens all the ``changed``
    tuning queries but that many (those of the lowest ``stat``), and ``inf`` (no query widened)."""
    r = np.sort(np.asarray(stat, np.float64)[np.asarray(changed, bool)])
    r = r[np.isfinite(r) | (r > 0)]  # +inf (no answer) is always widened; -inf never changes level
    out = {math.inf}
    for k in GAP_MISSES:
        if k < len(r):
            out.add(float(r[k]))
    return sorted(out)


def list_rows(sizes: np.ndarray, lists: np.ndarray, n_rows: int) -> np.ndarray:
    """(nq, p) share of the ``n_rows`` reference rows a query has scanned after its first 1..p ``lists``."""
    valid = lists >= 0
    rows = np.where(valid, np.asarray(sizes)[np.where(valid, lists, 0)], 0)
    return np.cumsum(rows, axis=1) / max(1, int(n_rows))
