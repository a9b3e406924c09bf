"""Inverted-file (IVF) search with batched exact scanning of the probed lists.

The reference rows are split into ``nlist`` lists by spherical k-means (faiss); a query probes the lists of its
most similar centroids and gets the best row among them. Unlike faiss's own IVF search (one query at a time,
memory-bound), the probed lists are scanned *by list*: the queries that probe a list are gathered and
multiplied with the list's rows in one matrix product (the idea of faiss's ``contrib.big_batch_search``), so an
approximate search runs at matrix-multiply speed, like the exact flat search it is compared with. Distances
inside the probed lists are exact; the only approximation is a nearest row in a list that was not probed.

Probing is adaptive (:class:`ProbePlan`): every query probes ``nprobe`` lists; a query whose best similarity so
far does not beat the similarity of its next centroid by ``margin`` (it lies between lists, typically a far
query with many near-ties) probes up to ``reprobe`` lists. ``margin=-inf`` (or ``reprobe == nprobe``) is plain
IVF. :mod:`isood.features.ann.tune` picks the plan for a target recall.
"""

from __future__ import annotations

import math
import os
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

import numpy as np

from isood.features.ann.exact import import_faiss
from isood.core.errors import BadInputError

__all__ = ["DEFAULT_NPROBE", "IVFIndex", "ProbePlan", "build_ivf", "default_nlist", "ivf_search", "list_maxima",
           "probe", "scan_lists"]

#: Default probed lists of the plain (untuned) IVF search (see the package docstring).
DEFAULT_NPROBE = 32
#: Queries searched per chunk (bounds the probe table: chunk x reprobe int64).
QUERY_CHUNK = 65_536


def default_nlist(n_reference: int) -> int:
    """IVF list count for ``n_reference`` rows: 4 * sqrt(N) rounded to a power of two, at most N // 39, >= 1."""
    if n_reference < 39:
        return 1
    target = 4.0 * math.sqrt(n_reference)
    nlist = 2 ** int(round(math.log2(target)))
    return int(max(1, min(nlist, n_reference // 39)))


@dataclass(frozen=True)
class ProbePlan:
    """How many lists a query probes: ``nprobe`` each, up to ``reprobe`` for a query whose best similarity after
    ``nprobe`` lists is below (next centroid similarity + ``margin``)."""

    nprobe: int
    reprobe: int | None = None
    margin: float = -math.inf

    def __post_init__(self) -> None:
        if self.nprobe < 1 or (self.reprobe is not None and self.reprobe < self.nprobe):
            raise BadInputError(f"probe plan: need 1 <= nprobe <= reprobe, got nprobe={self.nprobe}, "
                                f"reprobe={self.reprobe}")

    @property
    def widest(self) -> int:
        return self.reprobe or self.nprobe

    def as_dict(self) -> dict:
        return {"nprobe": int(self.nprobe), "reprobe": int(self.widest),
                "margin": None if math.isinf(self.margin) else float(self.margin)}


@dataclass(frozen=True, eq=False)
class IVFIndex:
    """Reference rows grouped by list: ``centroids`` (nlist, D) unit rows, ``vectors`` (N, D) the rows in list
    order, ``ids`` (N,) their row numbers in the reference as given, ``offsets`` (nlist + 1,) list bounds."""

    centroids: np.ndarray
    vectors: np.ndarray
    ids: np.ndarray
    offsets: np.ndarray

    @property
    def nlist(self) -> int:
        return len(self.centroids)

    @property
    def list_of_row(self) -> np.ndarray:
        """The list of each reference row (by its row number as given)."""
        lists = np.repeat(np.arange(self.nlist, dtype=np.int64), np.diff(self.offsets))
        out = np.empty(len(self.ids), dtype=np.int64)
        out[self.ids] = lists
        return out

    @property
    def nbytes(self) -> int:
        return int(self.centroids.nbytes + self.vectors.nbytes + self.ids.nbytes + self.offsets.nbytes)


def build_ivf(reference: np.ndarray, *, nlist: int | None = None, train_size: int | None = None,
              seed: int = 0, niter: int = 20) -> IVFIndex:
    """Spherical k-means (faiss, ``niter`` iterations) on a seeded sample of ``train_size`` rows (default
    ``max(40 * nlist, 10_000)``, at most N) into ``nlist`` lists (default :func:`default_nlist`), then every
    row assigned to its most similar centroid. Rows are clean, L2-normalised float32."""
    faiss = import_faiss()
    r = np.ascontiguousarray(reference, dtype=np.float32)
    n, dim = r.shape
    nlist = int(nlist) if nlist else default_nlist(n)
    if nlist < 1 or nlist > n:
        raise BadInputError(f"faiss-ivf: nlist must be in [1, {n}] (number of reference rows), got {nlist}")
    n_train = min(n, int(train_size) if train_size else max(40 * nlist, 10_000))
    rng = np.random.default_rng(seed)
    sample = r if n_train >= n else r[np.sort(rng.choice(n, size=n_train, replace=False))]
    kmeans = faiss.Kmeans(dim, nlist, niter=niter, seed=int(seed), spherical=True, verbose=False,
                          max_points_per_centroid=max(256, -(-n_train // nlist)))
    kmeans.train(np.ascontiguousarray(sample))
    quantizer = faiss.IndexFlatIP(dim)
    quantizer.add(kmeans.centroids)
    _, assign = quantizer.search(r, 1)
    assign = assign[:, 0]
    order = np.argsort(assign, kind="stable")
    offsets = np.searchsorted(assign[order], np.arange(nlist + 1)).astype(np.int64)
    return IVFIndex(np.ascontiguousarray(kmeans.centroids), r[order], order.astype(np.int64), offsets)


def probe(index: IVFIndex, query: np.ndarray, n: int) -> tuple[np.ndarray, np.ndarray]:
    """(centroid similarities, list ids) of the ``n`` most similar lists of each query, best first."""
    faiss = import_faiss()
    quantizer = faiss.IndexFlatIP(index.centroids.shape[1])
    quantizer.add(index.centroids)
    return quantizer.search(np.ascontiguousarray(query, dtype=np.float32), max(1, min(int(n), index.nlist)))


def _scan_some(index: IVFIndex, query: np.ndarray, qids: np.ndarray, lims: np.ndarray,
               lists: range) -> tuple[np.ndarray, np.ndarray]:
    """Best (similarity, row) per query over the given lists only (one worker's share)."""
    best = np.full(len(query), -np.inf, dtype=np.float32)
    arg = np.full(len(query), -1, dtype=np.int64)
    vec, ids, off = index.vectors, index.ids, index.offsets
    for lst in lists:
        a, b = lims[lst + 1], lims[lst + 2]  # bucket 0 holds the -1 entries
        o0, o1 = off[lst], off[lst + 1]
        if a == b or o0 == o1:
            continue
        qi = qids[a:b]
        sims = query[qi] @ vec[o0:o1].T
        j = sims.argmax(axis=1)
        m = sims[np.arange(len(qi)), j]
        better = m > best[qi]
        best[qi[better]] = m[better]
        arg[qi[better]] = ids[o0 + j[better]]
    return best, arg


def _group_by_list(lists: np.ndarray, nlist: int) -> tuple[np.ndarray, np.ndarray]:
    """(query ids grouped by list, bounds): the queries of list ``l`` are ``qids[lims[l + 1]:lims[l + 2]]``
    (bucket 0 holds the -1 entries). A linear-time bucket sort (faiss) when there are more entries than lists."""
    table = np.ascontiguousarray(lists, dtype=np.int64) + 1
    if table.size > nlist + 1:
        lims = import_faiss().matrix_bucket_sort_inplace(table, nbucket=nlist + 1, nt=1)
        return table.ravel(), lims
    flat = table.ravel()
    order = np.argsort(flat, kind="stable")
    return order // max(1, table.shape[1]), np.searchsorted(flat[order], np.arange(nlist + 2))


def scan_lists(index: IVFIndex, query: np.ndarray, lists: np.ndarray, *,
               threads: int | None = None) -> tuple[np.ndarray, np.ndarray]:
    """Exact best (similarity, reference row) of each query over its lists ``lists`` (nq, p) (-1 = none),
    scanned list by list with one matrix product per list; -inf / -1 where no probed list had a row.
    ``threads`` workers (default: the CPUs) share the lists, each with a single-threaded BLAS."""
    from threadpoolctl import threadpool_limits

    nq = len(query)
    qids, lims = _group_by_list(lists, index.nlist)
    threads = max(1, int(threads or os.cpu_count() or 1))
    shares = [range(t, index.nlist, threads) for t in range(threads)]
    with threadpool_limits(limits=1, user_api="blas"):
        if threads == 1:
            parts = [_scan_some(index, query, qids, lims, shares[0])]
        else:
            with ThreadPoolExecutor(threads) as pool:
                parts = list(pool.map(lambda s: _scan_some(index, query, qids, lims, s), shares))
    best, arg = parts[0] if parts else (np.full(nq, -np.inf, np.float32), np.full(nq, -1, np.int64))
    for b, a in parts[1:]:
        m = b > best
        best[m], arg[m] = b[m], a[m]
    return best, arg


def _maxima_some(index: IVFIndex, query: np.ndarray, qids: np.ndarray, lims: np.ndarray, lists: range,
                 dense: np.ndarray) -> None:
    """Best similarity of each query in each of the given lists (one worker's share), into ``dense``."""
    vec, off = index.vectors, index.offsets
    for lst in lists:
        a, b = lims[lst + 1], lims[lst + 2]
        o0, o1 = off[lst], off[lst + 1]
        if a == b or o0 == o1:
            continue
        qi = qids[a:b]
        dense[qi, lst] = (query[qi] @ vec[o0:o1].T).max(axis=1)


def list_maxima(index: IVFIndex, query: np.ndarray, lists: np.ndarray, *,
                threads: int | None = None) -> np.ndarray:
    """(nq, p) float32: the best similarity of each query in each of its probed lists ``lists`` (nq, p), in
    probe order (-inf for an empty list or -1). The running maximum along a row is what the first ``k`` lists
    give that query. Lists are scanned as :func:`scan_lists` scans them (one product per list)."""
    from threadpoolctl import threadpool_limits

    nq = len(query)
    out = np.full(lists.shape, -np.inf, dtype=np.float32)
    step = max(1, (1 << 24) // max(1, index.nlist))  # a dense (queries, lists) block of at most 64 MB
    threads = max(1, int(threads or os.cpu_count() or 1))
    for q0 in range(0, nq, step):
        part, q = lists[q0:q0 + step], query[q0:q0 + step]
        dense = np.full((len(q), index.nlist), -np.inf, dtype=np.float32)
        qids, lims = _group_by_list(part, index.nlist)
        shares = [range(t, index.nlist, threads) for t in range(threads)]
        with threadpool_limits(limits=1, user_api="blas"):
            if threads == 1:
                _maxima_some(index, q, qids, lims, shares[0], dense)
            else:
                with ThreadPoolExecutor(threads) as pool:
                    list(pool.map(lambda s: _maxima_some(index, q, qids, lims, s, dense), shares))
        valid = part >= 0
        out[q0:q0 + step] = np.where(valid, dense[np.arange(len(q))[:, None], np.where(valid, part, 0)], -np.inf)
    return out


def _search_chunk(index: IVFIndex, q: np.ndarray, plan: ProbePlan,
                  threads: int | None) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """One chunk of queries: ``nprobe`` lists each, then the widest set for the queries the margin rule picks
    (probed again from scratch: re-scanning their first lists costs ``nprobe / reprobe`` and keeps the two
    probe orders from having to agree)."""
    widest = min(plan.widest, index.nlist)
    first = min(plan.nprobe, widest)
    csims, lists = probe(index, q, first + 1 if widest > first else first)
    best, arg = scan_lists(index, q, lists[:, :first], threads=threads)
    again = np.zeros(len(q), dtype=bool)
    if widest > first:
        again = best < csims[:, first] + plan.margin
        rows = np.flatnonzero(again)
        if len(rows):
            _, wide = probe(index, q[rows], widest)
            b2, a2 = scan_lists(index, q[rows], wide, threads=threads)
            better = b2 > best[rows]
            best[rows[better]], arg[rows[better]] = b2[better], a2[better]
    return best, arg, again


def ivf_search(index: IVFIndex, query: np.ndarray, plan: ProbePlan | int | None = None, *,
               query_chunk: int = QUERY_CHUNK, threads: int | None = None) -> tuple[np.ndarray, np.ndarray, float]:
    """Search clean, L2-normalised queries with ``plan`` (a :class:`ProbePlan`, an nprobe, or None =
    :data:`DEFAULT_NPROBE`): (max cosine similarity, row index; -inf / -1 if no probed list had a row, fraction
    of the queries that probed the wider set)."""
    if plan is None or isinstance(plan, (int, np.integer)):
        plan = ProbePlan(int(plan or DEFAULT_NPROBE))
    q = np.ascontiguousarray(query, dtype=np.float32)
    best = np.empty(len(q), dtype=np.float32)
    arg = np.empty(len(q), dtype=np.int64)
    n_again = 0
    for q0 in range(0, len(q), query_chunk):
        b, a, again = _search_chunk(index, q[q0:q0 + query_chunk], plan, threads)
        best[q0:q0 + query_chunk], arg[q0:q0 + query_chunk] = b, a
        n_again += int(again.sum())
    return best, arg, (n_again / len(q) if len(q) else 0.0)
