"""Nearest-neighbour cosine shift (IS-OOD): D_sem(x) = min_{i in ID} d(x_sem, i_sem), D_cov likewise,
d = 1 - cos.

:func:`nearest` finds, for every query row, the nearest reference row by cosine distance and that distance;
:func:`nearest_cosine_distance` returns the distances only; :func:`shift_distances` applies LAID and measures
both axes; :func:`shift_search` also returns, for a recall-tuned approximate search (``ann_recall``), what it
achieved (:class:`isood.features.ann.AnnReport` per axis; :func:`level_agreement` turns one into the fraction of
held-out images whose level under given edges the approximation left unchanged; ``isood.features.ann.exact_agreement``
compares with the levels and edges of an exact build). The search itself (blocked torch, fused torch,
faiss flat, IVF; options and their measured defaults) lives in :mod:`isood.features.ann`: ``backend`` ('auto' = exact:
'torch-fused' on a CUDA GPU, else 'faiss-flat'; 'torch', 'torch-fused', 'faiss-flat', 'faiss-ivf'),
``memory_mb``, ``query_chunk`` / ``reference_chunk``, ``nlist`` / ``nprobe`` / ``train_size`` / ``seed``
(IVF), ``ann_recall`` (a target recall@1: approximate search tuned on a sample of the queries against exact
search) or ``ann_levels`` (a target share of rows whose level, on the grid of ``grid_levels`` levels between
the ``grid_clip`` quantiles, exact search would not change) / ``ann_sample``, ``device``, ``precision`` (the
candidate pass of 'torch-fused': fp16, bf16 or tf32; the answer is exact whatever it is).

Input handling (:func:`prepare_features`): rows with NaN/inf (or all zeros) are dropped and reported with a
warning (a dropped query row gets a NaN distance and index -1; dropped reference rows are excluded, indices
still refer to the original rows); rows that are not L2-normalised are normalised, with a warning. A set read
block by block gets the same rows from :func:`check_rows` (a first pass) and :func:`normalise_rows`.

Streaming (:class:`ShiftStream`): the ID side is held in memory as its two normalised LAID halves (N_id x D
float32 in all), the test rows arrive chunk by chunk and only their two distances are kept. Test rows are
transformed and searched in consecutive blocks of :data:`BLOCK_ROWS` (:func:`laid_halves`, :func:`rechunk`),
held in memory (:func:`shift_search`) or streamed alike, so both give the same bytes whatever the chunks: a
BLAS product's rows depend on the product's shape (OpenBLAS: a row of ``x @ W`` computed in a 65,536-row
product and in a 70,000-row one differ in the last bit for ~7% of rows), so the blocks are fixed. A set of at
most ``BLOCK_ROWS`` rows (one block) gives the bytes of the whole-array transform of isood before streaming.
"""
from __future__ import annotations

import math
import warnings
from dataclasses import dataclass
from typing import Any, Callable, Iterable, Iterator, NamedTuple

import numpy as np

from isood.features.ann import (DEFAULT_MEMORY_MB, DEFAULT_SAMPLE, QUERY_CHUNK, AnnReport, ChunkedSearch, RecallOutOfReach,
                       SearchOptions, sample_rows, search_report)
from isood.core.arrays import as_array, l2_normalise
from isood.core.defaults import N_LEVELS, QUANTILE_CLIP
from isood.core.errors import BadInputError
from isood.science.grid import bin_with_edges
from isood.science.laid import LAID

__all__ = ["Nearest", "ShiftSearch", "ShiftStream", "RowCheck", "BLOCK_ROWS", "nearest", "nearest_cosine_distance",
           "shift_distances", "shift_search", "held_out_levels", "level_agreement", "prepare_features", "check_rows",
           "normalise_rows", "laid_halves", "rechunk"]

_NORM_TOL = 1e-3
_UNIT_TOL = 1e-6  # norms this close to 1 are left as they are
_CHUNK = 16_384  # rows per block when measuring / normalising
#: Test rows per LAID transform and search block (the IVF query chunk). A BLAS product's row depends on the
#: shape of the product it is computed in (OpenBLAS: the last bits of ``x @ W``), so a test set is transformed
#: and searched in consecutive blocks of this many rows, held in memory or streamed: both give the same bytes.
BLOCK_ROWS = QUERY_CHUNK


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
            ann_recall: float | None = None, ann_sample: int = DEFAULT_SAMPLE,
            precision: str | None = None, ann_levels: float | None = None, grid_levels: int = N_LEVELS,
            grid_clip: tuple[float, float] = QUANTILE_CLIP) -> Nearest:
    """The nearest reference row (cosine) of each query row: ``Nearest(distance (N,) float32, index (N,) int64)``.

    Options: see the module docstring and :class:`isood.features.ann.SearchOptions` (``ann_recall`` = its ``recall``,
    ``ann_levels`` its ``levels``, ``ann_sample`` its ``sample``; the tuning report comes from
    :func:`isood.features.ann.search_report` or
    :func:`shift_search`). Dropped query rows (NaN/inf/zero)
    get a NaN distance and index -1; dropped reference rows are excluded. Raises ``BadInputError`` on a
    dimension mismatch or an empty reference set.
    """
    options = SearchOptions(backend=backend, memory_mb=memory_mb, query_chunk=query_chunk,
                            reference_chunk=reference_chunk, nlist=nlist, nprobe=nprobe, train_size=train_size,
                            seed=seed, device=device, recall=ann_recall, sample=ann_sample,
                            precision=precision, levels=ann_levels, grid_levels=grid_levels, grid_clip=grid_clip)
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
                            ann_sample: int = DEFAULT_SAMPLE, precision: str | None = None,
                            ann_levels: float | None = None, grid_levels: int = N_LEVELS,
                            grid_clip: tuple[float, float] = QUANTILE_CLIP) -> np.ndarray:
    """Minimum cosine distance (1 - cos) from each query row to the reference rows: an (N,) float32 array
    (NaN for a dropped query row). Same options as :func:`nearest`, which also returns the row indices."""
    return nearest(query, reference, backend=backend, memory_mb=memory_mb, query_chunk=query_chunk,
                   reference_chunk=reference_chunk, nlist=nlist, nprobe=nprobe, train_size=train_size, seed=seed,
                   device=device, ann_recall=ann_recall, ann_sample=ann_sample, precision=precision,
                   ann_levels=ann_levels, grid_levels=grid_levels, grid_clip=grid_clip).distance


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


class ShiftStream:
    """IS-OOD shift of ``n_test`` test rows that arrive chunk by chunk, against ID rows held in memory.

    Built from the ID features (prepared as :func:`prepare_features` does, transformed by ``laid``: the
    ``reference`` halves, ``reference_bytes`` of them, are all it keeps of the ID side) and the search options
    of :func:`nearest`; :meth:`measure` reads the test rows (clean float32 unit rows, in order, in chunks of
    any size) and returns a :class:`ShiftSearch`. The rows are transformed and searched in consecutive blocks of
    ``block_rows`` (default :data:`BLOCK_ROWS`) rows, so the result does not depend on how they were chunked, and
    equals :func:`shift_search` of the same rows held in memory. With ``ann_recall`` / ``ann_levels`` the tuning
    and held-out queries are rows of :func:`isood.features.ann.sample_rows` (``n_test``, ``ann_sample``, ``seed``),
    gathered in a first pass over the test rows; each axis's IVF index (or resident 'torch-fused' reference) is
    built once."""

    def __init__(self, id_features: Any, laid: LAID, *, n_test: int, block_rows: int | None = None,
                 backend: str = "auto", memory_mb: float = DEFAULT_MEMORY_MB, query_chunk: int | None = None,
                 reference_chunk: int | None = None, nlist: int | None = None, nprobe: int | None = None,
                 train_size: int | None = None, seed: int = 0, device: str | None = None,
                 ann_recall: float | None = None, ann_sample: int = DEFAULT_SAMPLE,
                 precision: str | None = None, ann_levels: float | None = None, grid_levels: int = N_LEVELS,
                 grid_clip: tuple[float, float] = QUANTILE_CLIP):
        self.options = SearchOptions(backend=backend, memory_mb=memory_mb, query_chunk=query_chunk,
                                     reference_chunk=reference_chunk, nlist=nlist, nprobe=nprobe,
                                     train_size=train_size, seed=seed, device=device, recall=ann_recall,
                                     sample=ann_sample, precision=precision, levels=ann_levels,
                                     grid_levels=grid_levels, grid_clip=grid_clip)
        ids = as_array(id_features, "ID features")
        if ids.ndim == 2 and ids.shape[1] != laid.dim:
            raise BadInputError(f"feature dimension mismatch: features have {ids.shape[1]}, LAID W is "
                                f"{laid.dim}x{laid.dim}; pass the LAID fitted for this encoder")
        i, imask = prepare_features(ids, "ID features")
        _check_reference(i, imask, "ID features")
        self.laid, self.n_test, self.block_rows = laid, int(n_test), int(block_rows or BLOCK_ROWS)
        self.reference = laid_halves(_kept(i, imask), laid, block_rows=self.block_rows)
        self.rows = sample_rows(self.n_test, ann_sample, seed) if self.options.approximate else None

    @property
    def reference_bytes(self) -> int:
        """Memory of the ID side kept for the search: the two normalised LAID halves."""
        return int(sum(r.nbytes for r in self.reference))

    def _blocks(self, chunks: Iterable[np.ndarray]) -> Iterator[tuple[int, np.ndarray]]:
        start = 0
        for block in rechunk(chunks, self.block_rows):
            if block.ndim != 2 or block.shape[1] != self.laid.dim:
                raise BadInputError(f"test rows of shape {block.shape} do not match LAID W {self.laid.dim}x"
                                    f"{self.laid.dim}")
            yield start, block
            start += len(block)
        if start != self.n_test:
            raise BadInputError(f"{start} test rows were read, {self.n_test} expected; was the feature set "
                                "changed while it was read?")

    def _gather(self, chunks: Iterable[np.ndarray]) -> list[np.ndarray]:
        """Both halves of the sampled test rows (tuning rows, then held-out rows)."""
        assert self.rows is not None, "measure gathers only with ann_recall (rows sampled)"
        both = np.concatenate(self.rows)
        out = [np.empty((len(both), r.shape[1]), np.float32) for r in self.reference]
        for start, block in self._blocks(chunks):
            here = np.flatnonzero((both >= start) & (both < start + len(block)))
            if len(here):
                for o, h in zip(out, laid_halves(block, self.laid, block_rows=self.block_rows)):
                    o[here] = h[both[here] - start]
        return out

    def measure(self, chunks: Callable[[], Iterable[np.ndarray]], *,
                on_rows: Callable[[int], None] | None = None) -> ShiftSearch:
        """The shift of every test row: ``chunks()`` yields the test rows (called twice with ``ann_recall`` /
        ``ann_levels``); ``on_rows(n)`` hears of each block of ``n`` rows searched."""
        if self.n_test == 0:
            return ShiftSearch(np.empty(0, np.float32), np.empty(0, np.float32), None)
        samples: list[np.ndarray | None] = [None, None]
        if self.rows is not None:
            samples = list(self._gather(chunks()))
        searches, refused = [], {}
        for axis, r, smp in zip(("sem", "cov"), self.reference, samples):
            try:
                searches.append(ChunkedSearch(r, self.options, n_query=self.n_test, sample=smp, rows=self.rows,
                                              block_rows=self.block_rows))
            except RecallOutOfReach as e:  # tune the other axis too: one refusal, with a target both reach
                refused[axis] = e
        if refused:
            raise RecallOutOfReach.combine(refused)
        sims = [np.empty(self.n_test, np.float32) for _ in searches]
        for start, block in self._blocks(chunks()):
            for search, out, half in zip(searches, sims, laid_halves(block, self.laid, block_rows=self.block_rows)):
                out[start:start + len(block)] = search.search(half)[0]
            if on_rows is not None:
                on_rows(len(block))
        reports = {}
        for axis, search, out in zip(("sem", "cov"), searches, sims):
            fixes, report = search.finish()
            for at, s, _ in fixes:
                out[at] = s
            if report is not None:
                reports[axis] = report
        d_sem, d_cov = (np.clip(1.0 - s, 0.0, 2.0) for s in sims)
        return ShiftSearch(d_sem, d_cov, reports or None)


def shift_search(test_features: Any, id_features: Any, laid: LAID, *, backend: str = "auto",
                 memory_mb: float = DEFAULT_MEMORY_MB, query_chunk: int | None = None,
                 reference_chunk: int | None = None, nlist: int | None = None, nprobe: int | None = None,
                 train_size: int | None = None, seed: int = 0, device: str | None = None,
                 ann_recall: float | None = None, ann_sample: int = DEFAULT_SAMPLE,
                 precision: str | None = None, ann_levels: float | None = None, grid_levels: int = N_LEVELS,
                 grid_clip: tuple[float, float] = QUANTILE_CLIP) -> ShiftSearch:
    """IS-OOD shift of each test image with the search reports: :class:`ShiftSearch` (see
    :func:`shift_distances`; with ``ann_recall`` / ``ann_levels`` both axes are tuned and checked on the same
    sampled rows).
    The test set is held in memory; :class:`ShiftStream` measures one that arrives chunk by chunk."""
    SearchOptions(backend=backend, query_chunk=query_chunk, reference_chunk=reference_chunk, nlist=nlist,
                  nprobe=nprobe, train_size=train_size, recall=ann_recall, sample=ann_sample, precision=precision,
                  levels=ann_levels, grid_levels=grid_levels, grid_clip=grid_clip)  # checked first
    test = as_array(test_features, "test features")
    ids = as_array(id_features, "ID features")
    _check_dims(test, ids, "test features", "ID features")
    if test.shape[1] != laid.dim:
        raise BadInputError(f"feature dimension mismatch: features have {test.shape[1]}, LAID W is "
                            f"{laid.dim}x{laid.dim}; pass the LAID fitted for this encoder")
    t, tmask = prepare_features(test, "test features")
    kept = np.flatnonzero(~tmask)
    stream = ShiftStream(ids, laid, n_test=len(kept), backend=backend, memory_mb=memory_mb, query_chunk=query_chunk,
                         reference_chunk=reference_chunk, nlist=nlist, nprobe=nprobe, train_size=train_size,
                         seed=seed, device=device, ann_recall=ann_recall, ann_sample=ann_sample, precision=precision,
                         ann_levels=ann_levels, grid_levels=grid_levels, grid_clip=grid_clip)
    found = stream.measure(lambda: [_kept(t, tmask)])
    out = []
    for d in (found.d_sem, found.d_cov):
        full = np.full(len(tmask), np.nan, dtype=np.float32)
        full[kept] = d
        out.append(full)
    for report in (found.ann or {}).values():
        report.check_rows = kept[report.check_rows]  # held-out rows as test rows as given
    return ShiftSearch(out[0], out[1], found.ann)


def shift_distances(test_features: Any, id_features: Any, laid: LAID, *, backend: str = "auto",
                    memory_mb: float = DEFAULT_MEMORY_MB, query_chunk: int | None = None,
                    reference_chunk: int | None = None, nlist: int | None = None, nprobe: int | None = None,
                    train_size: int | None = None, seed: int = 0, device: str | None = None,
                    ann_recall: float | None = None, ann_sample: int = DEFAULT_SAMPLE,
                    precision: str | None = None, ann_levels: float | None = None, grid_levels: int = N_LEVELS,
                    grid_clip: tuple[float, float] = QUANTILE_CLIP) -> tuple[np.ndarray, np.ndarray]:
    """IS-OOD shift of each test image: ``(D_sem, D_cov)``, each (N,) float32.

    D_sem(x) = min over ID images i of d(x_sem, i_sem), D_cov(x) = min_i d(x_cov, i_cov), with (sem, cov) =
    ``laid.transform(f)`` re-normalised per half and d the cosine distance. Search options as for
    :func:`nearest`. Test rows with NaN/inf get NaN.
    """
    found = shift_search(test_features, id_features, laid, backend=backend, memory_mb=memory_mb,
                         query_chunk=query_chunk, reference_chunk=reference_chunk, nlist=nlist, nprobe=nprobe,
                         train_size=train_size, seed=seed, device=device, ann_recall=ann_recall,
                         ann_sample=ann_sample, precision=precision, ann_levels=ann_levels, grid_levels=grid_levels,
                         grid_clip=grid_clip)
    return found.d_sem, found.d_cov
