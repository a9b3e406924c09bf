"""L2: nearest-neighbour cosine shift (IS-OOD): D_sem(x) = min_{i in ID} d(x_sem, i_sem), D_cov likewise,
d = 1 - cos.

:func:`nearest` finds, for every query row, the nearest reference row by cosine distance and that distance;
:func:`nearest_cosine_distance` returns the distances only; :func:`shift_distances` applies LAID and measures
both axes; :func:`shift_search` also returns, for a recall-tuned approximate search (``ann_recall``), what it
achieved (:class:`isood.ann.AnnReport` per axis; :func:`level_agreement` turns one into the fraction of
held-out images whose level the approximation left unchanged). The search itself (blocked torch, faiss flat,
IVF; options and their measured defaults) lives in :mod:`isood.ann`: ``backend`` ('auto' = exact, 'torch',
'faiss-flat', 'faiss-ivf'), ``memory_mb``, ``query_chunk`` / ``reference_chunk``, ``nlist`` / ``nprobe`` /
``train_size`` / ``seed`` (IVF), ``ann_recall`` (a target recall@1: approximate search tuned on a sample of
the queries against exact search) / ``ann_sample``, ``device``.

Input handling (:func:`prepare_features`): rows with NaN/inf (or all zeros) are dropped and reported with a
warning (a dropped query row gets a NaN distance and index -1; dropped reference rows are excluded, indices
still refer to the original rows); rows that are not L2-normalised are normalised, with a warning.
"""
from __future__ import annotations

import warnings
from typing import Any, Callable, NamedTuple

import numpy as np

from isood.ann import DEFAULT_MEMORY_MB, DEFAULT_SAMPLE, AnnReport, SearchOptions, sample_rows, search_report
from isood.arrays import as_array, l2_normalise
from isood.errors import BadInputError
from isood.grid import bin_with_edges
from isood.laid import LAID

__all__ = ["Nearest", "ShiftSearch", "nearest", "nearest_cosine_distance", "shift_distances", "shift_search",
           "held_out_levels", "level_agreement", "prepare_features"]

_NORM_TOL = 1e-3
_UNIT_TOL = 1e-6  # norms this close to 1 are left as they are
_CHUNK = 16_384  # rows per block when measuring / normalising


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
    is not 1 (tolerance 1e-3) are normalised. Clean float32 unit rows (norms within 1e-6 of 1) come back as
    given, without a copy (do not modify them in place). Each is reported: ``warn=True`` as a ``UserWarning``, a
    callable is called with the message, ``False`` is silent.
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
    x = x.astype(np.float32, copy=True)
    n_drop = int(dropped.sum())
    if n_drop:
        _report(warn, f"{name}: {n_drop} of {len(x)} rows contain NaN/inf or are all zero; they are dropped "
                      "(NaN distance / excluded)")
    keep = ~dropped
    off = keep & (np.abs(norms - 1.0) > _NORM_TOL)
    if off.any():
        _report(warn, f"{name}: {int(off.sum())} of {len(x)} rows are not L2-normalised (norms "
                      f"{norms[off].min():.3g}..{norms[off].max():.3g}); normalising them")
    scale = np.where(keep, norms, np.nan).astype(np.float32)  # NaN: a dropped row becomes NaN
    for s in range(0, len(x), _CHUNK):
        x[s:s + _CHUNK] /= scale[s:s + _CHUNK, None]
    return x, dropped


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


def _kept(x: np.ndarray, dropped: np.ndarray) -> np.ndarray:
    """The rows not dropped (``x`` itself when none was: no copy of a large reference)."""
    return x if not dropped.any() else np.ascontiguousarray(x[~dropped])


def _scatter(sims: np.ndarray, idx: np.ndarray, qmask: np.ndarray, ref_rows: np.ndarray) -> Nearest:
    """The search result of the kept query rows, put back at the query rows as given (dropped: NaN, -1)."""
    dist = np.full(len(qmask), np.nan, dtype=np.float32)
    dist[~qmask] = np.clip(1.0 - sims, 0.0, 2.0)
    index = np.full(len(qmask), -1, dtype=np.int64)
    index[~qmask] = ref_rows[idx]
    return Nearest(dist, index)


def nearest(query: Any, reference: Any, *, backend: str = "auto", memory_mb: float = DEFAULT_MEMORY_MB,
            query_chunk: int | None = None, reference_chunk: int | None = None, nlist: int | None = None,
            nprobe: int | None = None, train_size: int | None = None, seed: int = 0, device: str | None = None,
            ann_recall: float | None = None, ann_sample: int = DEFAULT_SAMPLE) -> Nearest:
    """The nearest reference row (cosine) of each query row: ``Nearest(distance (N,) float32, index (N,) int64)``.

    Options: see the module docstring and :class:`isood.ann.SearchOptions` (``ann_recall`` = its ``recall``,
    ``ann_sample`` its ``sample``; the tuning report comes from :func:`isood.ann.search_report` or
    :func:`shift_search`). Dropped query rows (NaN/inf/zero)
    get a NaN distance and index -1; dropped reference rows are excluded. Raises ``BadInputError`` on a
    dimension mismatch or an empty reference set.
    """
    options = SearchOptions(backend=backend, memory_mb=memory_mb, query_chunk=query_chunk,
                            reference_chunk=reference_chunk, nlist=nlist, nprobe=nprobe, train_size=train_size,
                            seed=seed, device=device, recall=ann_recall, sample=ann_sample)
    query, reference = as_array(query, "query"), as_array(reference, "reference")
    _check_dims(query, reference, "query", "reference")
    q, qmask = prepare_features(query, "query")
    r, rmask = prepare_features(reference, "reference")
    _check_reference(r, rmask, "reference")
    ref_rows = np.flatnonzero(~rmask)
    sims, idx, _ = search_report(_kept(q, qmask), _kept(r, rmask), options)
    return _scatter(sims, idx, qmask, ref_rows)


def nearest_cosine_distance(query: Any, reference: Any, *, backend: str = "auto",
                            memory_mb: float = DEFAULT_MEMORY_MB, query_chunk: int | None = None,
                            reference_chunk: int | None = None, nlist: int | None = None,
                            nprobe: int | None = None, train_size: int | None = None, seed: int = 0,
                            device: str | None = None, ann_recall: float | None = None,
                            ann_sample: int = DEFAULT_SAMPLE) -> np.ndarray:
    """Minimum cosine distance (1 - cos) from each query row to the reference rows: an (N,) float32 array
    (NaN for a dropped query row). Same options as :func:`nearest`, which also returns the row indices."""
    return nearest(query, reference, backend=backend, memory_mb=memory_mb, query_chunk=query_chunk,
                   reference_chunk=reference_chunk, nlist=nlist, nprobe=nprobe, train_size=train_size, seed=seed,
                   device=device, ann_recall=ann_recall, ann_sample=ann_sample).distance


class ShiftSearch(NamedTuple):
    """:func:`shift_search`'s result: ``d_sem``, ``d_cov`` (N,) float32 and, for a recall-tuned search, ``ann``
    = {'sem': AnnReport, 'cov': AnnReport} (held-out rows index the test rows as given), else None."""

    d_sem: np.ndarray
    d_cov: np.ndarray
    ann: dict[str, AnnReport] | None = None


def held_out_levels(report: AnnReport, edges: Any) -> tuple[np.ndarray, np.ndarray]:
    """Levels under ``edges`` of the held-out queries of ``report``: (from the exact distances, from the
    approximate ones)."""
    exact = bin_with_edges(np.clip(1.0 - report.check_exact, 0.0, 2.0), edges)
    return exact, bin_with_edges(np.clip(1.0 - report.check_approx, 0.0, 2.0), edges)


def level_agreement(report: AnnReport, edges: Any) -> float:
    """Fraction of the held-out queries of ``report`` whose level under ``edges`` is the same for the
    approximate distance as for the exact one (1.0 when nothing was held out: the search was exact)."""
    exact, approx = held_out_levels(report, edges)
    return float(np.mean(exact == approx)) if len(exact) else 1.0


def shift_search(test_features: Any, id_features: Any, laid: LAID, *, backend: str = "auto",
                 memory_mb: float = DEFAULT_MEMORY_MB, query_chunk: int | None = None,
                 reference_chunk: int | None = None, nlist: int | None = None, nprobe: int | None = None,
                 train_size: int | None = None, seed: int = 0, device: str | None = None,
                 ann_recall: float | None = None, ann_sample: int = DEFAULT_SAMPLE) -> ShiftSearch:
    """IS-OOD shift of each test image with the search reports: :class:`ShiftSearch` (see
    :func:`shift_distances`; with ``ann_recall`` both axes are tuned and checked on the same sampled rows)."""
    options = SearchOptions(backend=backend, memory_mb=memory_mb, query_chunk=query_chunk,
                            reference_chunk=reference_chunk, nlist=nlist, nprobe=nprobe, train_size=train_size,
                            seed=seed, device=device, recall=ann_recall, sample=ann_sample)
    test = as_array(test_features, "test features")
    ids = as_array(id_features, "ID features")
    _check_dims(test, ids, "test features", "ID features")
    if test.shape[1] != laid.dim:
        raise BadInputError(f"feature dimension mismatch: features have {test.shape[1]}, LAID W is "
                            f"{laid.dim}x{laid.dim}; pass the LAID fitted for this encoder")
    t, tmask = prepare_features(test, "test features")
    i, imask = prepare_features(ids, "ID features")
    _check_reference(i, imask, "ID features")
    ref_rows, kept = np.flatnonzero(~imask), np.flatnonzero(~tmask)
    t_sem, t_cov = laid.transform(_kept(t, tmask))
    i_sem, i_cov = laid.transform(_kept(i, imask))
    rows = sample_rows(len(kept), ann_sample, seed) if ann_recall is not None else None
    out, reports = [], {}
    for axis, q, r in (("sem", t_sem, i_sem), ("cov", t_cov, i_cov)):
        sims, idx, report = search_report(l2_normalise(q), l2_normalise(r), options, rows=rows)
        out.append(_scatter(sims, idx, tmask, ref_rows).distance)
        if report is not None:
            report.check_rows = kept[report.check_rows]  # held-out rows as test rows as given
            reports[axis] = report
    return ShiftSearch(out[0], out[1], reports or None)


def shift_distances(test_features: Any, id_features: Any, laid: LAID, *, backend: str = "auto",
                    memory_mb: float = DEFAULT_MEMORY_MB, query_chunk: int | None = None,
                    reference_chunk: int | None = None, nlist: int | None = None, nprobe: int | None = None,
                    train_size: int | None = None, seed: int = 0, device: str | None = None,
                    ann_recall: float | None = None, ann_sample: int = DEFAULT_SAMPLE) -> tuple[np.ndarray, np.ndarray]:
    """IS-OOD shift of each test image: ``(D_sem, D_cov)``, each (N,) float32.

    D_sem(x) = min over ID images i of d(x_sem, i_sem), D_cov(x) = min_i d(x_cov, i_cov), with (sem, cov) =
    ``laid.transform(f)`` re-normalised per half and d the cosine distance. Search options as for
    :func:`nearest`. Test rows with NaN/inf get NaN.
    """
    found = shift_search(test_features, id_features, laid, backend=backend, memory_mb=memory_mb,
                         query_chunk=query_chunk, reference_chunk=reference_chunk, nlist=nlist, nprobe=nprobe,
                         train_size=train_size, seed=seed, device=device, ann_recall=ann_recall,
                         ann_sample=ann_sample)
    return found.d_sem, found.d_cov
