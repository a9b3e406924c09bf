"""The rows the nearest-neighbour shift is measured on: the result type, row checks, normalisation, LAID halves.

IS-OOD's shift is D_sem(x) = min_{i in ID} d(x_sem, i_sem), D_cov likewise, d = 1 - cos. This module holds its
numpy parts; the search itself (torch, faiss, IVF) and the streamed measurement are in :mod:`isood.features.shift`.

Input handling (:func:`prepare_features`): rows with NaN/inf (or all zeros) are dropped and reported with a
warning (a dropped query row gets a NaN distance and index -1 in :class:`Nearest`; dropped reference rows are
excluded, indices still refer to the original rows); rows that are not L2-normalised are normalised, with a
warning. A set read block by block gets the same rows from :func:`check_rows` (a first pass, giving a
:class:`RowCheck`) and :func:`normalise_rows`.

Fixed blocks (:func:`laid_halves`, :func:`rechunk`): test rows are transformed by LAID in consecutive blocks of
:data:`BLOCK_ROWS`, held in memory or streamed alike, so both give the same bytes whatever the chunks: a BLAS
product's rows depend on the product's shape (OpenBLAS: a row of ``x @ W`` computed in a 65,536-row product and
in a 70,000-row one differ in the last bit for ~7% of rows), so the blocks are fixed. A set of at most
``BLOCK_ROWS`` rows (one block) gives the bytes of the whole-array transform.
"""
from __future__ import annotations

import math
import warnings
from dataclasses import dataclass
from typing import Any, Callable, Iterable, Iterator, NamedTuple

import numpy as np

from isood.core.arrays import as_array, l2_normalise
from isood.core.errors import BadInputError
from isood.science.laid import LAID

__all__ = ["Nearest", "RowCheck", "BLOCK_ROWS", "prepare_features", "check_rows", "normalise_rows", "laid_halves",
           "rechunk"]

_NORM_TOL = 1e-3
_UNIT_TOL = 1e-6  # norms this close to 1 are left as they are
_CHUNK = 16_384  # rows per block when measuring / normalising
#: Test rows per LAID transform and search block (equal to the IVF search's query chunk,
#: ``isood.features.ann.QUERY_CHUNK``). A BLAS product's row depends on the shape of the product it is computed in
#: (OpenBLAS: the last bits of ``x @ W``), so a test set is transformed and searched in consecutive blocks of this
#: many rows, held in memory or streamed: both give the same bytes.
BLOCK_ROWS = 65_536


class Nearest(NamedTuple):
    """Per query row: the cosine ``distance`` (float32, NaN for a dropped row) to the nearest reference row and
    that row's ``index`` in the reference as given (int64, -1 for a dropped query row)."""

    distance: np.ndarray
    index: np.ndarray  # type: ignore[assignment]  # the public field shadows tuple.index (mypy flags the shadowing)


def _report(warn: bool | Callable[[str], None], message: str) -> None:
    if callable(warn):
        warn(message)
    elif warn:
        warnings.warn(message, stacklevel=3)


@dataclass(frozen=True, eq=False)
class RowCheck:
    """What :func:`prepare_features` decides about a whole set of rows, gathered block by block
    (:func:`check_rows`): ``n`` rows, ``dropped`` (N,) bool (NaN/inf or zero norm), ``n_off`` kept rows whose
    norm is off 1 by more than 1e-3 (norms ``off_min``..``off_max``), ``as_given`` (float32 unit rows that come
    back as they are; otherwise every kept row is divided by its norm)."""

    n: int
    dropped: np.ndarray
    n_off: int
    off_min: float
    off_max: float
    as_given: bool

    def messages(self, name: str) -> list[str]:
        """The warnings :func:`prepare_features` gives for these rows."""
        if self.as_given:
            return []
        out, n_drop = [], int(self.dropped.sum())
        if n_drop:
            out.append(f"{name}: {n_drop} of {self.n} rows contain NaN/inf or are all zero; they are dropped "
                       "(NaN distance / excluded)")
        if self.n_off:
            out.append(f"{name}: {self.n_off} of {self.n} rows are not L2-normalised (norms "
                       f"{self.off_min:.3g}..{self.off_max:.3g}); normalising them")
        return out


def check_rows(blocks: Iterable[np.ndarray]) -> RowCheck:
    """:class:`RowCheck` of the rows of ``blocks`` (consecutive blocks of one set, in order)."""
    n, dropped, n_off, lo, hi, as_given = 0, [], 0, math.inf, -math.inf, True
    for x in blocks:
        norms, finite = _row_norms(x)
        bad = ~finite | ~(norms > 0)
        off = ~bad & (np.abs(norms - 1.0) > _NORM_TOL)
        if off.any():
            n_off, lo, hi = n_off + int(off.sum()), min(lo, float(norms[off].min())), max(hi, float(norms[off].max()))
        as_given = as_given and x.dtype == np.float32 and not bad.any() and bool(np.all(np.abs(norms - 1.0) <= _UNIT_TOL))
        n += len(x)
        dropped.append(bad)
    mask = np.concatenate(dropped) if dropped else np.zeros(0, dtype=bool)
    return RowCheck(n, mask, n_off, lo, hi, as_given)


def _divided(x: np.ndarray, norms: np.ndarray, dropped: np.ndarray) -> np.ndarray:
    """A float32 copy of ``x`` with each row divided by its norm (a dropped row becomes NaN)."""
    x = x.astype(np.float32, copy=True)
    scale = np.where(~dropped, norms, np.nan).astype(np.float32)
    for s in range(0, len(x), _CHUNK):
        x[s:s + _CHUNK] /= scale[s:s + _CHUNK, None]
    return x


def normalise_rows(x: np.ndarray, *, as_given: bool) -> np.ndarray:
    """The rows of ``x`` (a block of a set) as :func:`prepare_features` returns them for the whole set, whose
    :class:`RowCheck` says ``as_given``: as they are, or divided by their norms (dropped rows NaN)."""
    if as_given:
        return x
    norms, finite = _row_norms(x)
    return _divided(x, norms, ~finite | ~(norms > 0))


def prepare_features(x: Any, name: str = "features", *,
                     warn: bool | Callable[[str], None] = True) -> tuple[np.ndarray, np.ndarray]:
    """Validate and L2-normalise features (N, D). Returns ``(x_normalised float32, dropped_mask (N,) bool)``.

    Rows with NaN/inf or zero norm are dropped (their output row is NaN, ``dropped_mask`` True); rows whose norm
    is not 1 (tolerance 1e-3) are normalised. Clean float32 unit rows (norms within 1e-6 of 1) come back as
    given, without a copy (do not modify them in place). Each is reported: ``warn=True`` as a ``UserWarning``, a
    callable is called with the message, ``False`` is silent. A set read block by block gets the same rows from
    :func:`check_rows` + :func:`normalise_rows`.
    """
    x = as_array(x, name)
    if x.ndim != 2:
        raise BadInputError(f"{name}: expected a 2-D array (N, D), got shape {x.shape}; reshape single vectors to (1, D)")
    if x.shape[1] == 0:
        raise BadInputError(f"{name}: features have dimension 0; pass (N, D) features with D >= 1")
    norms, finite = _row_norms(x)
    dropped = ~finite | ~(norms > 0)
    if x.dtype == np.float32 and not dropped.any() and np.all(np.abs(norms - 1.0) <= _UNIT_TOL):
        return x, dropped  # already clean unit rows: no copy (dividing would change them by < 1e-6)
    off = ~dropped & (np.abs(norms - 1.0) > _NORM_TOL)
    check = RowCheck(len(x), dropped, int(off.sum()), float(norms[off].min()) if off.any() else math.inf,
                     float(norms[off].max()) if off.any() else -math.inf, False)
    for message in check.messages(name):
        _report(warn, message)
    return _divided(x, norms, dropped), dropped


def _row_norms(x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(L2 norm in float64, all-finite flag) of each row, a block of rows at a time (no N x D float64 copy).
    For float32/float16 rows the sum of squares cannot overflow float64, so a row is finite iff its norm is."""
    norms = np.empty(len(x), dtype=np.float64)
    finite = np.empty(len(x), dtype=bool)
    narrow = x.dtype in (np.float32, np.float16)
    with np.errstate(invalid="ignore", over="ignore"):
        for s in range(0, len(x), _CHUNK):
            block = x[s:s + _CHUNK]
            norms[s:s + _CHUNK] = np.sqrt(np.einsum("ij,ij->i", block, block, dtype=np.float64))
            finite[s:s + _CHUNK] = np.isfinite(norms[s:s + _CHUNK]) if narrow else np.isfinite(block).all(axis=1)
    return norms, finite


def laid_halves(x: np.ndarray, laid: LAID, *, block_rows: int | None = None) -> tuple[np.ndarray, np.ndarray]:
    """The L2-normalised semantic and covariate halves of ``laid.transform(x)`` (float32, C-contiguous),
    computed ``block_rows`` (default :data:`BLOCK_ROWS`) rows at a time: one block of the product at a time in
    memory, and the rows of a set come out the same whether it is transformed at once or block by block."""
    block = int(block_rows or BLOCK_ROWS)
    k = laid.semantic_dim
    sem = np.empty((len(x), k), np.float32)
    cov = np.empty((len(x), laid.dim - k), np.float32)
    for s in range(0, len(x), block):
        a, b = laid.transform(x[s:s + block])
        sem[s:s + block], cov[s:s + block] = l2_normalise(a), l2_normalise(b)
    return sem, cov


def rechunk(chunks: Iterable[np.ndarray], rows: int) -> Iterator[np.ndarray]:
    """The rows of ``chunks`` (in order) in consecutive blocks of exactly ``rows`` rows (the last may be
    shorter); a chunk already that long is cut into views, without a copy."""
    pending: list[np.ndarray] = []
    have = 0
    for chunk in chunks:
        if not len(chunk):
            continue
        pending.append(chunk)
        have += len(chunk)
        while have >= rows:
            buf = pending[0] if len(pending) == 1 else np.concatenate(pending)
            yield buf[:rows]
            pending, have = ([buf[rows:]] if have > rows else []), have - rows
    if have:
        yield pending[0] if len(pending) == 1 else np.concatenate(pending)
