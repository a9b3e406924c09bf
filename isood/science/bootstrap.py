"""Bootstrap replicates of the OOD metrics (AUROC, FPR@95 exact and OpenOOD's) of one ID set against many OOD
groups, computed from resample counts in O(n) per replicate, and the percentile interval of replicates."""

from __future__ import annotations

import warnings
from typing import Sequence

import numpy as np

from isood.core.errors import BadInputError

from .ood_metrics import check_scores

__all__ = ["BOOTSTRAP_METRICS", "RESAMPLED_METRICS", "bootstrap_replicates", "percentile_interval"]

BOOTSTRAP_METRICS = ("auroc", "fpr95")
"""What ``bootstrap_replicates`` resamples by default (Table 1's: AUROC and FPR@95, OOD positive)."""
RESAMPLED_METRICS = BOOTSTRAP_METRICS + ("fpr95_openood",)
"""Every metric ``bootstrap_replicates`` can resample (also OpenOOD's FPR@95, the release convention's)."""
_CHUNK_ELEMENTS = 1 << 22  # replicates are computed in chunks of at most this many (replicate, image) pairs


def _draws(rng: np.random.Generator, n: int, rows: int) -> np.ndarray:
    """``rows`` bootstrap resamples of ``n`` items as counts (rows x n): row r counts how often each item is
    drawn by ``rng.integers(0, n, n)`` (one call per replicate, so a chunk never changes the stream)."""
    return np.stack([np.bincount(rng.integers(0, n, n), minlength=n) for _ in range(rows)]).astype(np.float64)


def bootstrap_replicates(id_scores, ood_groups: Sequence, *, n_boot: int = 1000, seed: int = 0,
                         metrics: Sequence[str] = BOOTSTRAP_METRICS) -> dict[str, np.ndarray]:
    """Bootstrap replicates of AUROC and FPR@95 (``fpr_at_tpr``'s exact OOD-positive convention; with
    ``metrics`` any of ``RESAMPLED_METRICS``, also ``fpr95_openood``, OpenOOD's procedure) of one ID set
    against each OOD group (e.g. the cells of a grid), resampling the ID set and every group with replacement.

    ``id_scores``: ``(n_id,)`` or ``(D, n_id)`` (D detectors scored on the same images: they share every
    resample); ``ood_groups``: per group ``(n_g,)`` or ``(D, n_g)``. Returns ``{metric: (G, n_boot)}`` (or
    ``(D, G, n_boot)`` for 2-D input).

    The draws, a contract a reference can repeat: replicate ``r`` resamples the ID set by
    ``rng_0.integers(0, n_id, n_id)`` and group ``g`` by ``rng_{g+1}.integers(0, n_g, n_g)``, where
    ``rng_k = numpy.random.default_rng([seed, k])`` and the generators advance one call per replicate, in
    replicate order. One ID resample per replicate serves every group (a replicate of a whole grid, which level
    means and Table 1 need). Each replicate's value equals the metric computed on the resampled arrays (ties
    count one half for AUROC), computed from counts in O(n) per replicate after one sort. Deterministic for a
    seed, whatever the chunking."""
    unknown = [m for m in metrics if m not in RESAMPLED_METRICS]
    if unknown:
        raise BadInputError(f"cannot bootstrap {', '.join(unknown)}: pass some of {', '.join(RESAMPLED_METRICS)}")
    if isinstance(n_boot, bool) or not isinstance(n_boot, (int, np.integer)) or n_boot < 1:
        raise BadInputError(f"n_boot must be an integer >= 1, got {n_boot!r}")
    one = np.ndim(id_scores) == 1
    id_s = np.atleast_2d(np.asarray(id_scores, dtype=np.float64))
    for row in id_s:
        check_scores(row, "id_scores")
    groups = [np.atleast_2d(np.asarray(g, dtype=np.float64)) for g in ood_groups]
    for i, g in enumerate(groups):
        if g.shape[0] != id_s.shape[0]:
            raise BadInputError(f"ood group {i} has {g.shape[0]} detector rows but id_scores {id_s.shape[0]}")
        for row in g:
            check_scores(row, f"ood group {i}")
    d, n_id = id_s.shape
    id_order = np.argsort(id_s, axis=1, kind="stable")
    id_sorted = np.take_along_axis(id_s, id_order, axis=1)
    prep = []  # per group and detector: AUROC positions (lo, hi), FPR order and positions, distinct OOD values
    for g in groups:
        per = []
        for k in range(d):
            order = np.argsort(g[k], kind="stable")
            values, starts = np.unique(g[k][order], return_index=True)
            per.append((np.searchsorted(id_sorted[k], g[k], "left"), np.searchsorted(id_sorted[k], g[k], "right"),
                        order, np.searchsorted(id_sorted[k], g[k][order], "right"),
                        (starts, np.searchsorted(id_sorted[k], values, "left"),
                         np.searchsorted(id_sorted[k], values, "right"))))
        prep.append(per)
    out = {m: np.empty((d, len(groups), int(n_boot))) for m in metrics}
    rng_id = np.random.default_rng([seed, 0])
    rngs = [np.random.default_rng([seed, i + 1]) for i in range(len(groups))]
    largest = max([n_id, *(g.shape[1] for g in groups)])
    chunk = max(1, min(int(n_boot), _CHUNK_ELEMENTS // largest))
    rows = np.arange(chunk)
    for start in range(0, int(n_boot), chunk):
        b = min(chunk, int(n_boot) - start)
        id_counts = _draws(rng_id, n_id, b)
        cum_id = []
        for k in range(d):
            c = np.zeros((b, n_id + 1))
            np.cumsum(id_counts[:, id_order[k]], axis=1, out=c[:, 1:])
            cum_id.append(c)
        for gi, g in enumerate(groups):
            n_g = g.shape[1]
            counts = _draws(rngs[gi], n_g, b)
            for k, (lo, hi, order, pos, distinct) in enumerate(prep[gi]):
                c = cum_id[k]
                if "auroc" in out:
                    above = n_id - 0.5 * (c[:, hi] + c[:, lo])  # ID above each OOD score, ties one half
                    out["auroc"][k, gi, start:start + b] = (counts * above).sum(axis=1) / (n_id * n_g)
                if "fpr95" in out:
                    tpr = np.cumsum(counts[:, order], axis=1) / n_g
                    first = np.argmax(tpr >= 0.95 - 1e-12, axis=1)  # the first OOD score reaching 95% TPR
                    out["fpr95"][k, gi, start:start + b] = c[rows[:b], pos[first]] / n_id
                if "fpr95_openood" in out:
                    out["fpr95_openood"][k, gi, start:start + b] = _openood_fpr(counts[:, order], c, distinct,
                                                                                n_id, n_g)
    return {m: (v[0] if one else v) for m, v in out.items()}


def _openood_fpr(ood_counts: np.ndarray, cum_id: np.ndarray, distinct: tuple, n_id: int, n_g: int) -> np.ndarray:
    """``fpr_at_tpr(convention='openood')`` of each replicate (row) from counts: ``ood_counts`` (rows x OOD images
    in ascending score order), ``cum_id`` (rows x n_id + 1: cumulative ID counts in ascending score order) and
    ``distinct`` (the start of each distinct OOD score in that order, and its ID positions left / right).

    ``roc_curve(is_ood, -score)`` has one point per distinct score drawn at least once, ascending; its default
    ``drop_intermediate`` drops a point whose increment (ID drawn, OOD drawn at that score) equals the next
    point's (neither the first nor the last). The first point reaching 95% TPR is an OOD score; OpenOOD reads the
    FPR at the first kept point from there: the end of the run of equal increments that starts at it, with no ID
    score drawn in between."""
    starts, lo, hi = distinct
    rows = np.arange(ood_counts.shape[0])
    o = np.add.reduceat(ood_counts, starts, axis=1)  # OOD drawn per distinct score
    a = cum_id[:, hi] - cum_id[:, lo]  # ID drawn at each of those scores (ties)
    cum_o = np.cumsum(o, axis=1)
    k = np.argmax(cum_o / n_g >= 0.95, axis=1)
    n_values = o.shape[1]
    present = np.where((o + a) > 0, np.arange(n_values), n_values)
    following = np.minimum.accumulate(present[:, ::-1], axis=1)[:, ::-1]  # next drawn score at or after each
    following = np.concatenate([following[:, 1:], np.full((len(rows), 1), n_values)], axis=1)
    first = (cum_id[rows, lo[k]] == 0) & (cum_o[rows, k] == o[rows, k])  # no point before it: always kept
    active = ~first
    while active.any():
        nxt = following[rows, k]
        ok = active & (nxt < n_values)
        nxt = np.where(ok, nxt, k)
        between = cum_id[rows, lo[nxt]] - cum_id[rows, hi[k]]  # ID drawn strictly between the two scores
        same = ok & (between == 0) & (o[rows, nxt] == o[rows, k]) & (a[rows, nxt] == a[rows, k])
        k = np.where(same, nxt, k)
        active = same
    return cum_id[rows, hi[k]] / n_id


def percentile_interval(replicates, level: float = 0.95, axis: int = -1) -> tuple[np.ndarray, np.ndarray]:
    """The percentile bootstrap interval of ``replicates`` along ``axis``: the ``(1 - level) / 2`` and
    ``(1 + level) / 2`` quantiles (``numpy.quantile``, linear interpolation); NaN replicates are ignored, an
    all-NaN slice gives NaN."""
    if not 0.0 < float(level) < 1.0:
        raise BadInputError(f"interval level must be in (0, 1), got {level}: pass e.g. 0.95")
    r = np.asarray(replicates, dtype=np.float64)
    q = [(1.0 - float(level)) / 2.0, (1.0 + float(level)) / 2.0]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # an all-NaN slice: NaN, as documented
        low, high = np.nanquantile(r, q, axis=axis)
    return low, high
