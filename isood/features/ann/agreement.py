"""How far a grid built from approximate shifts is from the grid an exact build would give.

An approximate search (:mod:`isood.features.ann.tune`) can only overestimate a distance, and it changes the grid twice:
an image's own distance may cross a level edge, and the edges themselves move, since they are quantiles of all
the (approximate) distances. A user needs the share of images whose cell differs from an exact build's, so that
is what :func:`exact_agreement` estimates, from the held-out sample of the tuned search (exact and approximate
distance of each held-out image):

- exact edges: the approximate build's end edges (quantiles ``clip`` of its distances) moved by the held-out
  sample's difference between the same quantiles of its approximate and of its exact distances, times the share
  of the build's distances that are approximate (a difference estimator: the pairs mostly agree, so the
  difference is less noisy than the exact quantiles of the sample alone), cut into equal widths
  (:func:`estimate_exact_edges`);
- an image the search answered approximately is in the build at level ``bin(approximate, approximate edges)``
  and would be at ``bin(exact, exact edges)``; the images of the tuning and held-out samples hold their exact
  distances in the build (the tuned search writes them), so theirs differ only through the edges. The share
  that differs is the two, weighted by their counts among all the searched images;
- a confidence interval (default 95%): the union of a bootstrap percentile interval (resampling the held-out
  images: the images' sampling and the edge estimate at once) and a Wilson score interval at the estimated edges
  (which stays honest where no held-out image differs, where a bootstrap collapses to a point).

The agreement at the approximate build's own edges (the distances' effect alone) is reported too, with the edge
shift. Pure: arrays in, numbers out.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from statistics import NormalDist
from typing import Mapping, Sequence

import numpy as np

from isood.features.ann.tune import AnnReport
from isood.core.errors import BadInputError
from isood.science.grid import bin_with_edges

__all__ = ["AGREEMENT_CONFIDENCE", "AGREEMENT_RESAMPLES", "Agreement", "held_out_distances", "estimate_exact_edges",
           "exact_agreement", "wilson_interval"]

#: Confidence of the reported interval.
AGREEMENT_CONFIDENCE = 0.95
#: Bootstrap resamples of the held-out images behind it.
AGREEMENT_RESAMPLES = 1000


@dataclass(frozen=True)
class Agreement:
    """:func:`exact_agreement`: per axis (``sem``, ``cov``) and for the cell (both axes), the estimated share of
    the searched images whose level / cell equals an exact build's, with its confidence interval (low, high);
    the same at the approximate build's own edges (``*_fixed_edges``); per axis the estimated exact edges and
    the largest move of an edge."""

    levels: dict[str, float]
    levels_ci: dict[str, tuple[float, float]]
    cell: float
    cell_ci: tuple[float, float]
    levels_fixed_edges: dict[str, float]
    cell_fixed_edges: float
    exact_edges: dict[str, np.ndarray]
    edge_shift: dict[str, float]
    confidence: float
    held_out: int
    weight_approximate: float  # share of the searched images the search answered approximately


def held_out_distances(report: AnnReport) -> tuple[np.ndarray, np.ndarray]:
    """The held-out images' (exact, approximate) cosine distances, as the search turns similarities into them."""
    return np.clip(1.0 - report.check_exact, 0.0, 2.0), np.clip(1.0 - report.check_approx, 0.0, 2.0)


def estimate_exact_edges(approx_edges: Sequence[float] | np.ndarray, exact: np.ndarray, approx: np.ndarray,
                         clip: Sequence[float], weight: float = 1.0) -> np.ndarray:
    """The edges an exact build would get (module docstring), from the approximate build's ``approx_edges`` and
    a sample's paired ``exact`` / ``approx`` distances; ``clip`` are the quantiles the end edges are at, and
    ``weight`` the share of the build's distances that are approximate (the others are exact already, so they
    move the quantiles by that share of the sample's difference)."""
    e = np.asarray(approx_edges, dtype=np.float64)
    ok = np.isfinite(exact) & np.isfinite(approx)
    if not ok.any():
        return e.copy()
    q = [float(clip[0]), float(clip[1])]
    shift = weight * (np.quantile(approx[ok].astype(np.float64), q) - np.quantile(exact[ok].astype(np.float64), q))
    lo, hi = e[0] - shift[0], e[-1] - shift[1]
    if hi < lo:  # a sample too small to order the two: they are within noise of each other
        lo = hi = (lo + hi) / 2
    return np.linspace(lo, hi, len(e))


def wilson_interval(k: float, n: int, confidence: float = AGREEMENT_CONFIDENCE) -> tuple[float, float]:
    """Wilson score interval (two-sided, ``confidence``) of a binomial proportion ``k / n`` ((0, 1) for n = 0):
    e.g. the held-out recall@1 of a tuned search."""
    return _wilson(k, n, NormalDist().inv_cdf(1.0 - (1.0 - float(confidence)) / 2))


def _wilson(k: float, n: int, z: float) -> tuple[float, float]:
    """Wilson score interval of a binomial proportion ``k / n``."""
    if n <= 0:
        return 0.0, 1.0
    p = k / n
    mid = (p + z * z / (2 * n)) / (1 + z * z / n)
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / (1 + z * z / n)
    return max(0.0, mid - half), min(1.0, mid + half)


def _differs(exact: Mapping[str, np.ndarray], approx: Mapping[str, np.ndarray], approx_edges: Mapping[str, np.ndarray],
             exact_edges: Mapping[str, np.ndarray]) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    """Per axis and for the cell ('cell': either axis), whether each image's level differs from the exact
    build's (approximately answered, sampled)."""
    out: dict[str, tuple[np.ndarray, np.ndarray]] = {}
    for axis in exact:
        truth = bin_with_edges(exact[axis], exact_edges[axis])
        out[axis] = (bin_with_edges(approx[axis], approx_edges[axis]) != truth,
                     bin_with_edges(exact[axis], approx_edges[axis]) != truth)
    parts = list(out.values())
    out["cell"] = (np.logical_or.reduce([a for a, _ in parts]), np.logical_or.reduce([s for _, s in parts]))
    return out


def exact_agreement(reports: Mapping[str, AnnReport], approx_edges: Mapping[str, Sequence[float] | np.ndarray], *,
                    clip: Sequence[float], confidence: float = AGREEMENT_CONFIDENCE,
                    resamples: int = AGREEMENT_RESAMPLES, seed: int = 0) -> Agreement:
    """The agreement of a build from the tuned searches ``reports`` (per axis; the same held-out images) and its
    edges ``approx_edges`` (per axis, quantiles ``clip``) with an exact build (module docstring)."""
    axes = list(reports)
    first = reports[axes[0]]
    for axis in axes[1:]:
        if not np.array_equal(reports[axis].check_rows, first.check_rows):
            raise BadInputError("the axes' approximate searches were checked on different held-out images; "
                                "search both axes with one sample (isood.features.shift.ShiftStream)")
    n = len(first.check_rows)
    total = max(int(first.n_queries), 1)
    sampled = int(first.tune_queries) + int(first.check_queries) if n else total
    w = min(1.0, max(0.0, (total - sampled) / total))  # share answered approximately
    e_a = {a: np.asarray(approx_edges[a], dtype=np.float64) for a in axes}
    dist = {a: held_out_distances(reports[a]) for a in axes}
    exact = {a: d[0] for a, d in dist.items()}
    approx = {a: d[1] for a, d in dist.items()}
    keys = axes + ["cell"]
    if n == 0:  # nothing held out: the search was exact
        return Agreement({a: 1.0 for a in axes}, {a: (1.0, 1.0) for a in axes}, 1.0, (1.0, 1.0),
                         {a: 1.0 for a in axes}, 1.0, {a: e_a[a].copy() for a in axes}, {a: 0.0 for a in axes},
                         float(confidence), 0, 0.0)
    e_x = {a: estimate_exact_edges(e_a[a], exact[a], approx[a], clip, w) for a in axes}
    diff = _differs(exact, approx, e_a, e_x)
    share = {k: w * float(np.mean(diff[k][0])) + (1 - w) * float(np.mean(diff[k][1])) for k in keys}
    fixed = _differs(exact, approx, e_a, e_a)
    fixed_share = {k: w * float(np.mean(fixed[k][0])) for k in keys}  # sampled images: exact at fixed edges

    rng = np.random.default_rng(seed)
    boot = {k: np.empty(int(resamples)) for k in keys}
    for b in range(int(resamples)):
        idx = rng.integers(0, n, n)
        ex_b = {a: exact[a][idx] for a in axes}
        ap_b = {a: approx[a][idx] for a in axes}
        d_b = _differs(ex_b, ap_b, e_a, {a: estimate_exact_edges(e_a[a], ex_b[a], ap_b[a], clip, w) for a in axes})
        for k in keys:
            boot[k][b] = w * np.mean(d_b[k][0]) + (1 - w) * np.mean(d_b[k][1])
    alpha = 1.0 - float(confidence)
    z = NormalDist().inv_cdf(1.0 - alpha / 2)
    ci = {}
    for k in keys:
        lo_b, hi_b = np.quantile(boot[k], [alpha / 2, 1 - alpha / 2]) if resamples else (share[k], share[k])
        wa, ws = _wilson(float(np.sum(diff[k][0])), n, z), _wilson(float(np.sum(diff[k][1])), n, z)
        lo = min(float(lo_b), w * wa[0] + (1 - w) * ws[0])
        hi = max(float(hi_b), w * wa[1] + (1 - w) * ws[1])
        ci[k] = (1.0 - hi, 1.0 - lo)  # agreement = 1 - share that differs
    return Agreement(
        levels={a: 1.0 - share[a] for a in axes}, levels_ci={a: ci[a] for a in axes},
        cell=1.0 - share["cell"], cell_ci=ci["cell"],
        levels_fixed_edges={a: 1.0 - fixed_share[a] for a in axes}, cell_fixed_edges=1.0 - fixed_share["cell"],
        exact_edges=e_x, edge_shift={a: float(np.max(np.abs(e_x[a] - e_a[a]))) for a in axes},
        confidence=float(confidence), held_out=n, weight_approximate=w)

