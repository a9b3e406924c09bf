"""L2: nearest-neighbour cosine shift (IS-OOD): D_sem(x) = min_{i in ID} d(x_sem, i_sem), D_cov likewise,
d = 1 - cos.

:func:`nearest` finds, for every query row, the nearest reference row by cosine distance and that distance;
:func:`nearest_cosine_distance` returns the distances only; :func:`shift_distances` applies LAID and measures
both axes. The search itself (blocked torch, faiss flat, faiss IVF; options and their measured defaults) lives in
:mod:`isood.ann`: ``backend`` ('auto' = exact, 'torch', 'faiss-flat', 'faiss-ivf'), ``memory_mb``,
``query_chunk`` / ``reference_chunk``, ``nlist`` / ``nprobe`` / ``train_size`` / ``seed`` (IVF), ``device``.

Input handling (:func:`prepare_features`): rows with NaN/inf (or all zeros) are dropped and reported with a
warning (a dropped query row gets a NaN distance and index -1; dropped reference rows are excluded, indices
still refer to the original rows); rows that are not L2-normalised are normalised, with a warning.
"""
from __future__ import annotations

import warnings
from typing import Any, Callable, NamedTuple

import numpy as np

from isood.ann import DEFAULT_MEMORY_MB, SearchOptions, search
from isood.arrays import as_array, l2_normalise
from isood.errors import BadInputError
from isood.laid import LAID

__all__ = ["Nearest", "nearest", "nearest_cosine_distance", "shift_distances", "prepare_features"]

_NORM_TOL = 1e-3


class Nearest(NamedTuple):
    """Per query row: the cosine ``distance`` (float32, NaN for a dropped row) to the nearest reference row and
    that row's ``index`` in the reference as given (int64, -1 for a dropped query row)."""

    distance: np.ndarray
    index: np.ndarray


def _report(warn: bool | Callable[[str], None], message: str) -> None:
    if callable(warn):
        warn(message)
    elif warn:
        warnings.warn(message, stacklevel=3)


def prepare_features(x: Any, name: str = "features", *,
                     warn: bool | Callable[[str], None] = True) -> tuple[np.ndarray, np.ndarray]:
    """Validate and L2-normalise features (N, D). Returns ``(x_normalised float32, dropped_mask (N,) bool)``.

    Rows with NaN/inf or zero norm are dropped (their output row is NaN, ``dropped_mask`` True); rows whose norm
    is not 1 (tolerance 1e-3) are normalised. Each is reported: ``warn=True`` as a ``UserWarning``, a callable
    is called with the message, ``False`` is silent.
    """
    x = as_array(x, name)
    if x.ndim != 2:
        raise BadInputError(f"{name}: expected a 2-D array (N, D), got shape {x.shape}; reshape single vectors to (1, D)")
    if x.shape[1] == 0:
        raise BadInputError(f"{name}: features have dimension 0; pass (N, D) features with D >= 1")
    x = x.astype(np.float32, copy=True)
    with np.errstate(invalid="ignore", over="ignore"):
        norms = np.linalg.norm(x.astype(np.float64), axis=1)
    dropped = ~np.isfinite(x).all(axis=1) | ~(norms > 0)
    n_drop = int(dropped.sum())
    if n_drop:
        _report(warn, f"{name}: {n_drop} of {len(x)} rows contain NaN/inf or are all zero; they are dropped "
                      "(NaN distance / excluded)")
    keep = ~dropped
    off = keep & (np.abs(norms - 1.0) > _NORM_TOL)
    if off.any():
        _report(warn, f"{name}: {int(off.sum())} of {len(x)} rows are not L2-normalised (norms "
                      f"{norms[off].min():.3g}..{norms[off].max():.3g}); normalising them")
    x[keep] /= norms[keep, None].astype(np.float32)
    x[dropped] = np.nan
    return x, dropped


def _check_dims(q: np.ndarray, r: np.ndarray, qname: str, rname: str) -> None:
    """Shape checks that must fail before any warning about the rows is emitted."""
    for x, name in ((q, qname), (r, rname)):
        if x.ndim != 2:
            raise BadInputError(f"{name}: expected a 2-D array (N, D), got shape {x.shape}; reshape single vectors "
                                "to (1, D)")
    if q.shape[1] != r.shape[1]:
        raise BadInputError(f"feature dimension mismatch: {qname} has {q.shape[1]}, {rname} has {r.shape[1]}; pass "
                            "features from the same encoder")


def _check_reference(r: np.ndarray, rmask: np.ndarray, rname: str) -> None:
    if len(r) == 0 or rmask.all():
        raise BadInputError(f"{rname} set is empty (no finite rows); pass at least one reference (ID) feature row")


def _scatter(sims: np.ndarray, idx: np.ndarray, qmask: np.ndarray, ref_rows: np.ndarray) -> Nearest:
    """The search result of the kept query rows, put back at the query rows as given (dropped: NaN, -1)."""
    dist = np.full(len(qmask), np.nan, dtype=np.float32)
    dist[~qmask] = np.clip(1.0 - sims, 0.0, 2.0)
    index = np.full(len(qmask), -1, dtype=np.int64)
    index[~qmask] = ref_rows[idx]
    return Nearest(dist, index)


def nearest(query: Any, reference: Any, *, backend: str = "auto", memory_mb: float = DEFAULT_MEMORY_MB,
            query_chunk: int | None = None, reference_chunk: int | None = None, nlist: int | None = None,
            nprobe: int | None = None, train_size: int | None = None, seed: int = 0,
            device: str | None = None) -> Nearest:
    """The nearest reference row (cosine) of each query row: ``Nearest(distance (N,) float32, index (N,) int64)``.

    Options: see the module docstring and :class:`isood.ann.SearchOptions`. Dropped query rows (NaN/inf/zero)
    get a NaN distance and index -1; dropped reference rows are excluded. Raises ``BadInputError`` on a
    dimension mismatch or an empty reference set.
    """
    options = SearchOptions(backend=backend, memory_mb=memory_mb, query_chunk=query_chunk,
                            reference_chunk=reference_chunk, nlist=nlist, nprobe=nprobe, train_size=train_size,
                            seed=seed, device=device)
    query, reference = as_array(query, "query"), as_array(reference, "reference")
    _check_dims(query, reference, "query", "reference")
    q, qmask = prepare_features(query, "query")
    r, rmask = prepare_features(reference, "reference")
    _check_reference(r, rmask, "reference")
    ref_rows = np.flatnonzero(~rmask)
    sims, idx = search(np.ascontiguousarray(q[~qmask]), np.ascontiguousarray(r[ref_rows]), options)
    return _scatter(sims, idx, qmask, ref_rows)


def nearest_cosine_distance(query: Any, reference: Any, *, backend: str = "auto",
                            memory_mb: float = DEFAULT_MEMORY_MB, query_chunk: int | None = None,
                            reference_chunk: int | None = None, nlist: int | None = None,
                            nprobe: int | None = None, train_size: int | None = None, seed: int = 0,
                            device: str | None = None) -> np.ndarray:
    """Minimum cosine distance (1 - cos) from each query row to the reference rows: an (N,) float32 array
    (NaN for a dropped query row). Same options as :func:`nearest`, which also returns the row indices."""
    return nearest(query, reference, backend=backend, memory_mb=memory_mb, query_chunk=query_chunk,
                   reference_chunk=reference_chunk, nlist=nlist, nprobe=nprobe, train_size=train_size, seed=seed,
                   device=device).distance


def shift_distances(test_features: Any, id_features: Any, laid: LAID, *, backend: str = "auto",
                    memory_mb: float = DEFAULT_MEMORY_MB, query_chunk: int | None = None,
                    reference_chunk: int | None = None, nlist: int | None = None, nprobe: int | None = None,
                    train_size: int | None = None, seed: int = 0,
                    device: str | None = None) -> tuple[np.ndarray, np.ndarray]:
    """IS-OOD shift of each test image: ``(D_sem, D_cov)``, each (N,) float32.

    D_sem(x) = min over ID images i of d(x_sem, i_sem), D_cov(x) = min_i d(x_cov, i_cov), with (sem, cov) =
    ``laid.transform(f)`` re-normalised per half and d the cosine distance. Search options as for
    :func:`nearest`. Test rows with NaN/inf get NaN.
    """
    options = SearchOptions(backend=backend, memory_mb=memory_mb, query_chunk=query_chunk,
                            reference_chunk=reference_chunk, nlist=nlist, nprobe=nprobe, train_size=train_size,
                            seed=seed, device=device)
    test = as_array(test_features, "test features")
    ids = as_array(id_features, "ID features")
    _check_dims(test, ids, "test features", "ID features")
    if test.shape[1] != laid.dim:
        raise BadInputError(f"feature dimension mismatch: features have {test.shape[1]}, LAID W is "
                            f"{laid.dim}x{laid.dim}; pass the LAID fitted for this encoder")
    t, tmask = prepare_features(test, "test features")
    i, imask = prepare_features(ids, "ID features")
    _check_reference(i, imask, "ID features")
    ref_rows = np.flatnonzero(~imask)
    t_sem, t_cov = laid.transform(t[~tmask])
    i_sem, i_cov = laid.transform(i[ref_rows])
    out = []
    for q, r in ((t_sem, i_sem), (t_cov, i_cov)):
        sims, idx = search(l2_normalise(q), l2_normalise(r), options)
        out.append(_scatter(sims, idx, tmask, ref_rows).distance)
    return out[0], out[1]
