"""Statistics of a per-level metric curve ``x_i`` against the level ``i = 1..n`` (IS-OOD's Table 1):
the Pearson correlation and the least-squares sensitivity, and when a curve counts as constant. Both return
``nan`` when fewer than two levels are available (or when the values are constant, for the correlation)."""

from __future__ import annotations

from typing import Sequence

import numpy as np

from isood.core.errors import BadInputError

__all__ = ["level_correlation", "level_sensitivity", "CONSTANT_RTOL", "is_constant"]

def _levels(values_per_level: Sequence[float] | np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    x = np.asarray(values_per_level, dtype=np.float64).ravel()
    if x.size == 0:
        raise BadInputError("values_per_level is empty: pass one value per level (NaN for an N/A level)")
    i = np.arange(1, x.size + 1, dtype=np.float64)
    keep = np.isfinite(x)
    return i[keep], x[keep]


def level_correlation(values_per_level: Sequence[float] | np.ndarray) -> float:
    """Pearson correlation between a per-level metric ``x_i`` and the level index ``i = 1..n``
    (IS-OOD; ARCHITECTURE.md).

    ``values_per_level[j]`` is the metric of level ``j + 1`` (mean over its non-N/A cells); NaN marks an N/A
    level and is skipped (the other levels keep their index). Returns ``nan`` with fewer than two levels or
    values constant up to ``CONSTANT_RTOL`` (``is_constant``: the correlation is undefined; a mean over 7 and one
    over 8 identical cells may differ in the last bit, and Pearson's r of such a curve is noise, up to +-0.65).
    """
    i, x = _levels(values_per_level)
    if x.size < 2 or is_constant(x):
        return float("nan")
    return float(np.corrcoef(i, x)[0, 1])


CONSTANT_RTOL = 1e-12
"""A level curve whose values spread by no more than this, relative to their magnitude, is constant."""


def is_constant(values, axis: int = 0):
    """Whether ``values`` are constant along ``axis`` up to rounding: ``max - min <= CONSTANT_RTOL * max|x|``
    (exactly equal values included; an all-zero curve is constant). A bool, or an array of them for 2-D input."""
    x = np.asarray(values, dtype=np.float64)
    spread = x.max(axis=axis) - x.min(axis=axis)
    return spread <= CONSTANT_RTOL * np.abs(x).max(axis=axis)


def level_sensitivity(values_per_level: Sequence[float] | np.ndarray) -> float:
    """``|slope|`` of the least-squares line of the per-level metric ``x_i`` on the level ``i = 1..n``
    (IS-OOD; ARCHITECTURE.md): ``|sum (i - mean i)(x_i - mean x) / sum (i - mean i)^2|``. NaN levels are skipped;
    ``nan`` with fewer than two levels."""
    i, x = _levels(values_per_level)
    if x.size < 2:
        return float("nan")
    di = i - i.mean()
    return float(abs(np.dot(di, x - x.mean()) / np.dot(di, di)))
