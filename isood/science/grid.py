"""The IS-OOD shift grid: n levels per axis of equal width over a robust range, and the n x n cell table.

Levels (IS-OOD, "8 levels per axis, intervals of equal width over the observed range"): the range is
``[quantile(values, lo), quantile(values, hi)]`` (default ``clip=QUANTILE_CLIP = (0.01, 0.99)`` so a handful of
outliers cannot stretch the intervals), cut into ``n_levels`` intervals of equal width; values below / above the
range are folded into the first / last level. NaN values get level -1. Cells are named ``cov_{c}_sem_{s}``
(0-based); a cell with fewer than ``na_threshold`` (default ``NA_THRESHOLD`` = 10) images is N/A.

:func:`assign_levels` computes the edges from the values and bins them; :func:`bin_with_edges` bins values with
edges computed elsewhere (e.g. Syn-IS prompts on the scale of the image splits). :func:`edges_table` is the one
home of the manifests' ``edges`` table (axis, level, lower, upper) and :func:`axis_edges` reads it back.
"""
from __future__ import annotations

import re
from typing import Any, Sequence

import numpy as np
import pandas as pd

from isood.core.defaults import LEVELS_NOTE, MAX_LEVELS, NA_THRESHOLD, N_LEVELS, QUANTILE_CLIP
from isood.core.errors import BadInputError

__all__ = ["check_levels", "assign_levels", "level_edges", "bin_with_edges", "cell_name", "cell_names", "is_na",
           "cell_table",
           "edges_table", "axis_edges", "parse_cell_name", "AXES"]

#: The two shift axes, in the order of the edges table.
AXES = ("sem", "cov")
_CELL_RE = re.compile(r"cov_(\d+)_sem_(\d+)")


def check_levels(n_levels: Any, option: str = "--levels") -> int:
    """``n_levels`` when it is an integer from 1 to ``MAX_LEVELS`` (the commands' bound), else a one-line
    ``BadInputError`` naming ``option``; checked before any work (an import writes a list per cell)."""
    if isinstance(n_levels, bool) or not isinstance(n_levels, (int, np.integer)) or not 1 <= n_levels <= MAX_LEVELS:
        raise BadInputError(f"{option} must be an integer in [1, {MAX_LEVELS}], got {n_levels!r} ({LEVELS_NOTE})")
    return int(n_levels)


def _values(values: Any, where: str) -> np.ndarray:
    v = np.asarray(values, dtype=np.float64)
    if v.ndim != 1:
        raise BadInputError(f"{where}: expected a 1-D array of values, got shape {v.shape}")
    return v


def level_edges(values: Any, n_levels: int = N_LEVELS, *, clip: Sequence[float] = QUANTILE_CLIP) -> np.ndarray:
    """The ``n_levels + 1`` equal-width edges over ``[quantile(finite values, clip[0]), quantile(.., clip[1])]``.

    ``clip=(0, 1)`` spans the observed min..max. Raises ``BadInputError`` when no value is finite.
    """
    v = _values(values, "assign_levels")
    if isinstance(n_levels, bool) or int(n_levels) != n_levels or n_levels < 1:
        raise BadInputError(f"assign_levels: n_levels must be a positive integer, got {n_levels}")
    try:
        lo_q, hi_q = (float(c) for c in clip)
    except (TypeError, ValueError):
        raise BadInputError(f"assign_levels: clip must be two quantiles (lo, hi), got {clip!r}") from None
    if not 0.0 <= lo_q < hi_q <= 1.0:
        raise BadInputError(f"assign_levels: clip must be quantiles 0 <= lo < hi <= 1, got {clip!r}")
    finite = np.isfinite(v)
    if not finite.any():
        raise BadInputError("assign_levels: no finite values to bin; pass finite shift values")
    lo, hi = np.quantile(v[finite], [lo_q, hi_q])
    return np.linspace(lo, hi, int(n_levels) + 1)


def bin_with_edges(values: Any, edges: Any) -> np.ndarray:
    """Levels (int64, (N,)) of ``values`` in the intervals of ``edges`` (finite, non-decreasing, length >= 2).

    ``v`` gets level ``i`` when ``edges[i] <= v < edges[i+1]``; values outside the edges fold into levels
    0 / len(edges) - 2; NaN/inf -> -1. When every edge is equal, every finite value gets level 0.
    """
    v = _values(values, "bin_with_edges")
    e = np.asarray(edges, dtype=np.float64)
    if e.ndim != 1 or len(e) < 2 or not np.isfinite(e).all() or np.any(np.diff(e) < 0):
        raise BadInputError(f"bin_with_edges: edges must be a finite, non-decreasing 1-D array of length >= 2, "
                            f"got {e!r}")
    finite = np.isfinite(v)
    levels = np.full(v.shape, -1, dtype=np.int64)
    if e[-1] > e[0]:
        levels[finite] = np.searchsorted(e[1:-1], v[finite], side="right")
    else:
        levels[finite] = 0
    return levels


def assign_levels(values: Any, n_levels: int = N_LEVELS, *,
                  clip: Sequence[float] = QUANTILE_CLIP) -> tuple[np.ndarray, np.ndarray]:
    """Bin values into ``n_levels`` equal-width levels over their clipped range (module docstring).

    Returns ``(levels int64 (N,), edges float64 (n_levels + 1,))``; NaN -> level -1; if every finite value is
    equal, all get level 0. To bin on given edges use :func:`bin_with_edges`.
    """
    edges = level_edges(values, n_levels, clip=clip)
    return bin_with_edges(values, edges), edges


def cell_name(cov: int, sem: int) -> str:
    """Name of a grid cell: ``cov_{c}_sem_{s}`` (0-based levels)."""
    return f"cov_{int(cov)}_sem_{int(sem)}"


def parse_cell_name(name: Any) -> tuple[int, int] | None:
    """The inverse of :func:`cell_name`: ``'cov_{c}_sem_{s}'`` -> ``(c, s)``; None for a missing name (None, NaN,
    ''); a one-line error for anything else."""
    if name is None or (isinstance(name, float) and np.isnan(name)) or name == "":
        return None
    m = _CELL_RE.fullmatch(str(name))
    if not m:
        raise BadInputError(f"cell name {name!r} is not of the form cov_{{c}}_sem_{{s}}: pass grid cell names")
    return int(m.group(1)), int(m.group(2))


def cell_names(cov_levels: Any, sem_levels: Any) -> list[str]:
    """:func:`cell_name` of every (cov, sem) pair, vectorised (a level of -1 gives e.g. ``cov_-1_sem_3``)."""
    cov = np.asarray(cov_levels, dtype=np.int64).ravel()
    sem = np.asarray(sem_levels, dtype=np.int64).ravel()
    if cov.shape != sem.shape:
        raise BadInputError(f"cell_names: cov_levels and sem_levels differ in length ({len(cov)} vs {len(sem)})")
    return np.char.add(np.char.add("cov_", cov.astype(str)), np.char.add("_sem_", sem.astype(str))).tolist()


def is_na(n: Any, na_threshold: int = NA_THRESHOLD) -> np.ndarray:
    """The one N/A rule of the grid (IS-OOD): a cell holding fewer than ``na_threshold`` images is N/A.
    ``n``: image counts (scalar or array); returns booleans of the same shape. Every set (a build-splits
    grid, an import, Syn-IS, the leak-free images) is decided by this rule on the counts it actually has."""
    return np.asarray(n) < int(na_threshold)


def cell_table(cov_levels: Any, sem_levels: Any, n_levels: int = N_LEVELS,
               na_threshold: int = NA_THRESHOLD) -> pd.DataFrame:
    """Count images per cell: a DataFrame with every one of the n_levels^2 cells, ordered by (cov, sem).

    Columns: ``cell`` (name), ``cov_level``, ``sem_level``, ``n`` (images), ``na`` (n < na_threshold).
    Images with level -1 on either axis (NaN shift) are not counted.
    """
    cov = np.asarray(cov_levels, dtype=np.int64)
    sem = np.asarray(sem_levels, dtype=np.int64)
    if cov.shape != sem.shape or cov.ndim != 1:
        raise BadInputError(f"cell_table: cov_levels and sem_levels must be 1-D of one length, got {cov.shape} "
                            f"and {sem.shape}")
    if np.any(cov >= n_levels) or np.any(sem >= n_levels) or np.any(cov < -1) or np.any(sem < -1):
        raise BadInputError(f"cell_table: levels must be in -1..{n_levels - 1}; pass n_levels matching "
                            "assign_levels")
    ok = (cov >= 0) & (sem >= 0)
    counts = np.bincount(cov[ok] * n_levels + sem[ok], minlength=n_levels * n_levels)
    c_idx, s_idx = np.divmod(np.arange(n_levels * n_levels), n_levels)
    return pd.DataFrame({
        "cell": cell_names(c_idx, s_idx),
        "cov_level": c_idx,
        "sem_level": s_idx,
        "n": counts.astype(np.int64),
        "na": is_na(counts, na_threshold),
    })


def edges_table(sem_edges: Any, cov_edges: Any) -> pd.DataFrame:
    """The manifests' edges table: one row per (axis, level) with the level's ``lower`` and ``upper`` bound.

    Rows: the semantic levels first, then the covariate ones. Bounds may be NaN (an import without shifts).
    """
    sem, cov = np.asarray(sem_edges, dtype=np.float64), np.asarray(cov_edges, dtype=np.float64)
    for name, e in (("sem_edges", sem), ("cov_edges", cov)):
        if e.ndim != 1 or len(e) < 2:
            raise BadInputError(f"edges_table: {name} must be a 1-D array of n_levels + 1 edges, got shape {e.shape}")
    return pd.DataFrame({
        "axis": ["sem"] * (len(sem) - 1) + ["cov"] * (len(cov) - 1),
        "level": np.concatenate([np.arange(len(sem) - 1), np.arange(len(cov) - 1)]).astype(np.int64),
        "lower": np.concatenate([sem[:-1], cov[:-1]]),
        "upper": np.concatenate([sem[1:], cov[1:]]),
    })


def axis_edges(edges: pd.DataFrame, axis: str) -> np.ndarray:
    """The ``n_levels + 1`` edges of one axis ('sem' or 'cov') from an :func:`edges_table` (its inverse)."""
    if axis not in AXES:
        raise BadInputError(f"unknown axis {axis!r}; pass 'sem' or 'cov'")
    missing = {"axis", "level", "lower", "upper"} - set(edges.columns)
    if missing:
        raise BadInputError(f"edges table lacks column(s) {sorted(missing)}; pass a table made by edges_table")
    part = edges[edges["axis"] == axis].sort_values("level")
    if part.empty:
        raise BadInputError(f"edges table has no rows for axis {axis!r}")
    return np.concatenate([part["lower"].to_numpy(), part["upper"].to_numpy()[-1:]]).astype(np.float64)
