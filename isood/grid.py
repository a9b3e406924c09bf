"""The IS-OOD shift grid: n levels per axis of equal width over a robust range, and the n x n cell table.

Levels (IS-OOD, "8 levels per axis, intervals of equal width over the observed range"): the range is
``[quantile(values, lo), quantile(values, hi)]`` (default ``clip=(0.01, 0.99)`` so a handful of outliers
cannot stretch the intervals), cut into ``n_levels`` intervals of equal width; values below / above the range
are folded into the first / last level. NaN values get level -1. Cells are named ``cov_{c}_sem_{s}``
(0-based); a cell with fewer than ``na_threshold`` (default 10) images is N/A.
"""
from __future__ import annotations

from typing import Any

import numpy as np
import pandas as pd

from isood.errors import IsoodError

__all__ = ["assign_levels", "cell_name", "cell_table", "DEFAULT_CLIP"]

#: Default quantile clip of :func:`assign_levels`: the range spans the 1st..99th percentile.
DEFAULT_CLIP = (0.01, 0.99)


def assign_levels(values: Any, n_levels: int = 8, **options: Any) -> tuple[np.ndarray, np.ndarray]:
    """Bin values into ``n_levels`` equal-width levels. Returns ``(levels int64 (N,), edges float64 (n_levels+1,))``.

    Options: ``clip=(lo, hi)`` quantiles of the finite values that bound the range (default (0.01, 0.99);
    ``(0, 1)`` = observed min..max); ``edges=`` reuse given non-decreasing edges of length n_levels + 1 (e.g.
    those of the image splits, to bin Syn-IS prompts on the same scale) instead of computing them. A value ``v`` gets level ``i`` when
    ``edges[i] <= v < edges[i+1]``; values outside the edges are folded into levels 0 / n_levels-1; NaN -> -1.
    If every finite value is equal, all get level 0.
    """
    unknown = set(options) - {"clip", "edges"}
    if unknown:
        raise IsoodError(f"assign_levels: unknown option(s) {sorted(unknown)}; known: clip, edges")
    v = np.asarray(values, dtype=np.float64)
    if v.ndim != 1:
        raise IsoodError(f"assign_levels: expected a 1-D array of values, got shape {v.shape}")
    finite = np.isfinite(v)
    edges = options.get("edges")
    if edges is not None:
        edges = np.asarray(edges, dtype=np.float64)
        if edges.ndim != 1 or len(edges) < 2 or not np.isfinite(edges).all() or np.any(np.diff(edges) < 0):
            raise IsoodError(f"assign_levels: edges must be a finite, non-decreasing 1-D array of length >= 2, got {edges!r}")
        if n_levels != len(edges) - 1:
            raise IsoodError(f"assign_levels: n_levels={n_levels} does not match {len(edges)} edges; pass n_levels=len(edges)-1")
        n_levels = len(edges) - 1
    else:
        if int(n_levels) != n_levels or n_levels < 1:
            raise IsoodError(f"assign_levels: n_levels must be a positive integer, got {n_levels}")
        n_levels = int(n_levels)
        clip = options.get("clip", DEFAULT_CLIP)
        lo_q, hi_q = (float(c) for c in clip)
        if not 0.0 <= lo_q < hi_q <= 1.0:
            raise IsoodError(f"assign_levels: clip must be quantiles 0 <= lo < hi <= 1, got {clip!r}")
        if not finite.any():
            raise IsoodError("assign_levels: no finite values to bin; pass finite shift values or edges=")
        lo, hi = np.quantile(v[finite], [lo_q, hi_q])
        edges = np.linspace(lo, hi, n_levels + 1)
    levels = np.full(v.shape, -1, dtype=np.int64)
    if edges[-1] > edges[0]:
        levels[finite] = np.searchsorted(edges[1:-1], v[finite], side="right")
    else:
        levels[finite] = 0
    return levels, edges


def cell_name(cov: int, sem: int) -> str:
    """Name of a grid cell: ``cov_{c}_sem_{s}`` (0-based levels)."""
    return f"cov_{int(cov)}_sem_{int(sem)}"


def cell_table(cov_levels: Any, sem_levels: Any, n_levels: int = 8, na_threshold: int = 10) -> pd.DataFrame:
    """Count images per cell: a DataFrame with every one of the n_levels^2 cells, ordered by (cov, sem).

    Columns: ``cell`` (name), ``cov_level``, ``sem_level``, ``n`` (images), ``na`` (n < na_threshold).
    Images with level -1 on either axis (NaN shift) are not counted.
    """
    cov = np.asarray(cov_levels, dtype=np.int64)
    sem = np.asarray(sem_levels, dtype=np.int64)
    if cov.shape != sem.shape or cov.ndim != 1:
        raise IsoodError(f"cell_table: cov_levels and sem_levels must be 1-D of one length, got {cov.shape} and {sem.shape}")
    if np.any(cov >= n_levels) or np.any(sem >= n_levels) or np.any(cov < -1) or np.any(sem < -1):
        raise IsoodError(f"cell_table: levels must be in -1..{n_levels - 1}; pass n_levels matching assign_levels")
    ok = (cov >= 0) & (sem >= 0)
    counts = np.bincount(cov[ok] * n_levels + sem[ok], minlength=n_levels * n_levels)
    c_idx, s_idx = np.divmod(np.arange(n_levels * n_levels), n_levels)
    return pd.DataFrame({
        "cell": [cell_name(c, s) for c, s in zip(c_idx, s_idx)],
        "cov_level": c_idx,
        "sem_level": s_idx,
        "n": counts.astype(np.int64),
        "na": counts < na_threshold,
    })
