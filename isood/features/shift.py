"""Nearest-neighbour cosine shift (IS-OOD): the search and the streamed measurement of
D_sem(x) = min_{i in ID} d(x_sem, i_sem), D_cov likewise, d = 1 - cos.

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

The rows searched are checked and normalised as :func:`isood.science.shift.prepare_features` says (dropped
query rows get a NaN distance and index -1; dropped reference rows are excluded, indices still refer to the
original rows).

Streaming (:class:`ShiftStream`): the ID side is held in memory as its two normalised LAID halves (N_id x D
float32 in all), the test rows arrive chunk by chunk and only their two distances are kept. Test rows are
transformed and searched in consecutive blocks of :data:`isood.science.shift.BLOCK_ROWS`
(:func:`isood.science.shift.laid_halves`, :func:`isood.science.shift.rechunk`), held in memory
(:func:`shift_search`) or streamed alike, so both give the same bytes whatever the chunks.
"""
from __future__ import annotations

from typing import Any, Callable, Iterable, Iterator, NamedTuple

import numpy as np

from isood.features.ann import (DEFAULT_MEMORY_MB, DEFAULT_SAMPLE, AnnReport, ChunkedSearch, RecallOutOfReach,
                                SearchOptions, sample_rows, search_report)
from isood.core.arrays import as_array
from isood.core.defaults import N_LEVELS, QUANTILE_CLIP
from isood.core.errors import BadInputError
from isood.science.grid import bin_with_edges
from isood.science.laid import LAID
from isood.science.shift import BLOCK_ROWS, Nearest, laid_halves, prepare_features, rechunk

__all__ = ["ShiftSearch", "ShiftStream", "nearest", "nearest_cosine_distance", "shift_distances", "shift_search",
           "held_out_levels", "level_agreement"]

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


class ShiftStream:
    """IS-OOD shift of ``n_test`` test rows that arrive chunk by chunk, against ID rows held in memory.

    Built from the ID features (prepared as :func:`prepare_features` does, transformed by ``laid``: the
    ``reference`` halves, ``reference_bytes`` of them, are all it keeps of the ID side) and the search options
    of :func:`nearest`; :meth:`measure` reads the test rows (clean float32 unit rows, in order, in chunks of
    any size) and returns a :class:`ShiftSearch`. The rows are transformed and searched in consecutive blocks of
    ``block_rows`` (default :data:`isood.science.shift.BLOCK_ROWS`) rows, so the result does not depend on how
    they were chunked, and equals :func:`shift_search` of the same rows held in memory. With ``ann_recall`` /
    ``ann_levels`` the tuning and held-out queries are rows of :func:`isood.features.ann.sample_rows` (``n_test``,
    ``ann_sample``, ``seed``), gathered in a first pass over the test rows; each axis's IVF index (or resident
    'torch-fused' reference) is built once."""

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
