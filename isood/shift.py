"""Nearest-neighbour cosine shift (IS-OOD): D_sem(x) = min_{i in ID} d(x_sem, i_sem), D_cov likewise, d = 1 - cos.

:func:`nearest_cosine_distance` is the engine: the minimum cosine distance from every query row to a reference
set, computed in blocks over queries *and* reference so memory stays within ``memory_mb``. Backends:

- ``torch``: exact, blocked matmul (CUDA when available, else CPU).
- ``faiss-flat``: exact, ``faiss.IndexFlatIP`` per reference block (faiss GPU when available).
- ``faiss-ivf``: approximate, ``faiss.IndexIVFFlat`` (inner product) with ``nlist`` lists and ``nprobe`` probed
  lists. Defaults (measured by ``bench/shift_nn.py`` on 1M x 256 clustered features, see bench/RESULTS.md):
  ``nlist = 4 * sqrt(N)`` rounded to a power of two and clipped to [1, N // 39] (faiss wants >= 39 training
  points per list; 4096 lists for 1M rows), k-means on ``max(40 * nlist, 10_000)`` sampled rows, ``nprobe = 32``
  (~0.8% of the rows scanned at 1M; measured on 2 busy CPU cores: 38x faiss-flat queries/s wall-clock, 22x per
  CPU-second, recall@1 0.96 — 1.00 for the nearer half of the queries, misses are near-ties of far-OOD queries —
  and 99.6% of grid levels unchanged). The IVF index holds one copy of the reference (memory ~ N * D * 4 bytes).
- ``auto``: exact — ``torch`` on a CUDA GPU, else ``faiss-flat`` when faiss is installed, else ``torch``.
  Approximate search is never chosen silently.

Input handling (:func:`prepare_features`): rows with NaN/inf (or all zeros) are dropped and reported with a
warning (a dropped query row gets a NaN distance; dropped reference rows are excluded); rows that are not
L2-normalised are normalised, with a warning.
"""
from __future__ import annotations

import math
import warnings
from typing import Any

import numpy as np
import torch

from isood.errors import IsoodError

__all__ = ["nearest_cosine_distance", "prepare_features", "shift_distances", "build_ivf_index", "ivf_search",
           "BACKENDS", "default_nlist", "DEFAULT_NPROBE"]

BACKENDS = ("auto", "torch", "faiss-flat", "faiss-ivf")
#: Default IVF nprobe (see the module docstring and bench/RESULTS.md).
DEFAULT_NPROBE = 32
#: Default memory budget (MiB) for one block of similarities / one reference block copy.
DEFAULT_MEMORY_MB = 256
_NORM_TOL = 1e-3


def default_nlist(n_reference: int) -> int:
    """IVF list count for ``n_reference`` rows: 4 * sqrt(N) rounded to a power of two, at most N // 39, >= 1."""
    if n_reference < 39:
        return 1
    target = 4.0 * math.sqrt(n_reference)
    nlist = 2 ** int(round(math.log2(target)))
    return int(max(1, min(nlist, n_reference // 39)))


def _as_numpy(x: Any, name: str) -> np.ndarray:
    if isinstance(x, torch.Tensor):
        x = x.detach().cpu().numpy()
    try:
        x = np.asarray(x)
    except Exception as exc:
        raise IsoodError(f"{name}: cannot read as an array ({exc})") from exc
    if x.dtype == object or not np.issubdtype(x.dtype, np.number):
        raise IsoodError(f"{name}: expected a numeric (N, D) array, got dtype {x.dtype}")
    return x


def prepare_features(x: Any, name: str = "features", *, warn: bool = True) -> tuple[np.ndarray, np.ndarray]:
    """Validate and L2-normalise features (N, D). Returns ``(x_normalised float32, dropped_mask (N,) bool)``.

    Rows with NaN/inf or zero norm are dropped (their output row is NaN, ``dropped_mask`` True) and reported with
    a warning; rows whose norm is not 1 (tolerance 1e-3) are normalised, with a warning.
    """
    x = _as_numpy(x, name)
    if x.ndim != 2:
        raise IsoodError(f"{name}: expected a 2-D array (N, D), got shape {x.shape}; reshape single vectors to (1, D)")
    if x.shape[1] == 0:
        raise IsoodError(f"{name}: features have dimension 0; pass (N, D) features with D >= 1")
    x = x.astype(np.float32, copy=True)
    with np.errstate(invalid="ignore", over="ignore"):
        norms = np.linalg.norm(x.astype(np.float64), axis=1)
    dropped = ~np.isfinite(x).all(axis=1) | ~(norms > 0)
    n_drop = int(dropped.sum())
    if n_drop and warn:
        warnings.warn(f"{name}: {n_drop} of {len(x)} rows contain NaN/inf or are all zero; they are dropped (NaN distance / excluded)", stacklevel=3)
    keep = ~dropped
    off = keep & (np.abs(norms - 1.0) > _NORM_TOL)
    n_off = int(off.sum())
    if n_off and warn:
        warnings.warn(f"{name}: {n_off} of {len(x)} rows are not L2-normalised (norms {norms[off].min():.3g}..{norms[off].max():.3g}); normalising them", stacklevel=3)
    x[keep] /= norms[keep, None].astype(np.float32)
    x[dropped] = np.nan
    return x, dropped


def _l2_normalise(x: np.ndarray) -> np.ndarray:
    n = np.linalg.norm(x, axis=1, keepdims=True)
    n[n == 0] = 1.0
    return np.ascontiguousarray(x / n, dtype=np.float32)


def _blocks(n_query: int, n_ref: int, dim: int, memory_mb: float, query_chunk: int | None, reference_chunk: int | None) -> tuple[int, int]:
    budget = max(1.0, float(memory_mb)) * 2**20
    qc = int(query_chunk) if query_chunk else max(1, min(n_query, 4096))
    if reference_chunk:
        rc = int(reference_chunk)
    else:  # similarity block qc x rc plus a reference block rc x dim, float32
        rc = int(budget // (4 * (qc + dim)))
        if rc < 1024 and not query_chunk:  # keep blocks reasonably shaped under a tiny budget
            qc = max(1, min(qc, int(budget // (4 * (1024 + dim)))))
            rc = int(budget // (4 * (qc + dim)))
    return max(1, min(qc, n_query)), max(1, min(rc, n_ref))


def _search_torch(q: np.ndarray, r: np.ndarray, qc: int, rc: int, device: str | None) -> tuple[np.ndarray, np.ndarray]:
    dev = torch.device(device or ("cuda" if torch.cuda.is_available() else "cpu"))
    best = torch.full((len(q),), -math.inf, dtype=torch.float32, device=dev)
    arg = torch.full((len(q),), -1, dtype=torch.int64, device=dev)
    q_all = torch.from_numpy(q).to(dev)
    with torch.no_grad():
        for r0 in range(0, len(r), rc):
            rb = torch.from_numpy(r[r0:r0 + rc]).to(dev)
            for q0 in range(0, len(q), qc):
                sims = q_all[q0:q0 + qc] @ rb.T
                m, i = sims.max(dim=1)
                better = m > best[q0:q0 + qc]
                best[q0:q0 + qc] = torch.where(better, m, best[q0:q0 + qc])
                arg[q0:q0 + qc] = torch.where(better, i + r0, arg[q0:q0 + qc])
    return best.cpu().numpy(), arg.cpu().numpy()


def _faiss():
    try:
        import faiss
    except ImportError as exc:  # pragma: no cover - faiss-cpu is a dependency
        raise IsoodError("the faiss backends need faiss (pip install faiss-cpu); or pass backend='torch'") from exc
    return faiss


def _faiss_gpu(faiss, device: str | None) -> bool:
    return device != "cpu" and hasattr(faiss, "StandardGpuResources") and faiss.get_num_gpus() > 0


def _search_faiss_flat(q: np.ndarray, r: np.ndarray, qc: int, rc: int, device: str | None) -> tuple[np.ndarray, np.ndarray]:
    faiss = _faiss()
    dim = q.shape[1]
    index = faiss.IndexFlatIP(dim)
    if _faiss_gpu(faiss, device):  # pragma: no cover - no GPU in CI
        index = faiss.index_cpu_to_gpu(faiss.StandardGpuResources(), 0, index)
    best = np.full(len(q), -np.inf, dtype=np.float32)
    arg = np.full(len(q), -1, dtype=np.int64)
    for r0 in range(0, len(r), rc):
        index.reset()
        index.add(np.ascontiguousarray(r[r0:r0 + rc]))
        for q0 in range(0, len(q), qc):
            sims, idx = index.search(np.ascontiguousarray(q[q0:q0 + qc]), 1)
            m, i = sims[:, 0], idx[:, 0]
            better = (i >= 0) & (m > best[q0:q0 + qc])
            best[q0:q0 + qc][better] = m[better]
            arg[q0:q0 + qc][better] = i[better] + r0
    return best, arg


def build_ivf_index(reference: np.ndarray, *, nlist: int | None = None, train_size: int | None = None,
                    seed: int = 0, device: str | None = None):
    """A trained, filled ``faiss.IndexIVFFlat`` (inner product) over clean, L2-normalised float32 rows.

    k-means is trained on a seeded sample of ``train_size`` rows (default ``max(40 * nlist, 10_000)``, at most N).
    The index is moved to a faiss GPU when one is available and ``device != 'cpu'``.
    """
    faiss = _faiss()
    r = np.ascontiguousarray(reference, dtype=np.float32)
    n, dim = r.shape
    nlist = int(nlist) if nlist else default_nlist(n)
    if nlist < 1 or nlist > n:
        raise IsoodError(f"faiss-ivf: nlist must be in [1, {n}] (number of reference rows), got {nlist}")
    quantizer = faiss.IndexFlatIP(dim)
    index = faiss.IndexIVFFlat(quantizer, dim, nlist, faiss.METRIC_INNER_PRODUCT)
    index.cp.seed = int(seed)
    n_train = min(n, int(train_size) if train_size else max(40 * nlist, 10_000))
    rng = np.random.default_rng(seed)
    sample = r if n_train >= n else r[np.sort(rng.choice(n, size=n_train, replace=False))]
    index.train(np.ascontiguousarray(sample))
    index.add(r)
    if _faiss_gpu(faiss, device):  # pragma: no cover - no GPU in CI
        index = faiss.index_cpu_to_gpu(faiss.StandardGpuResources(), 0, index)
    return index


def ivf_search(index, query: np.ndarray, *, nprobe: int | None = None, query_chunk: int = 4096) -> tuple[np.ndarray, np.ndarray]:
    """Search an index from :func:`build_ivf_index`: (max cosine similarity, row index; -1 if nothing probed)."""
    nprobe = int(nprobe) if nprobe else DEFAULT_NPROBE
    index.nprobe = max(1, min(nprobe, int(index.nlist)))
    q = np.ascontiguousarray(query, dtype=np.float32)
    best = np.empty(len(q), dtype=np.float32)
    arg = np.empty(len(q), dtype=np.int64)
    for q0 in range(0, len(q), query_chunk):
        sims, idx = index.search(q[q0:q0 + query_chunk], 1)
        best[q0:q0 + query_chunk], arg[q0:q0 + query_chunk] = sims[:, 0], idx[:, 0]
    return best, arg


def _search_faiss_ivf(q: np.ndarray, r: np.ndarray, qc: int, nlist: int | None, nprobe: int | None,
                      train_size: int | None, seed: int, device: str | None) -> tuple[np.ndarray, np.ndarray]:
    index = build_ivf_index(r, nlist=nlist, train_size=train_size, seed=seed, device=device)
    best, arg = ivf_search(index, q, nprobe=nprobe, query_chunk=qc)
    missing = arg < 0  # every probed list was empty: fall back to exact search for those rows
    if missing.any():
        best[missing], arg[missing] = _search_faiss_flat(q[missing], r, qc, len(r), device)
    return best, arg


def _resolve_backend(backend: str, device: str | None) -> str:
    if backend not in BACKENDS:
        raise IsoodError(f"unknown shift backend {backend!r}; pass one of {', '.join(BACKENDS)}")
    if backend != "auto":
        return backend
    if device != "cpu" and torch.cuda.is_available():
        return "torch"
    try:
        import faiss  # noqa: F401
    except ImportError:  # pragma: no cover
        return "torch"
    return "faiss-flat"


def _nearest_prepared(q: np.ndarray, r: np.ndarray, *, backend: str = "auto", memory_mb: float = DEFAULT_MEMORY_MB,
                      query_chunk: int | None = None, reference_chunk: int | None = None, nlist: int | None = None,
                      nprobe: int | None = None, train_size: int | None = None, seed: int = 0,
                      device: str | None = None) -> tuple[np.ndarray, np.ndarray]:
    """Search clean, normalised float32 rows; returns (max cosine similarity, reference index) per query."""
    backend = _resolve_backend(backend, device)
    if len(q) == 0:
        return np.empty(0, np.float32), np.empty(0, np.int64)
    qc, rc = _blocks(len(q), len(r), q.shape[1], memory_mb, query_chunk, reference_chunk)
    if backend == "torch":
        return _search_torch(q, r, qc, rc, device)
    if backend == "faiss-flat":
        return _search_faiss_flat(q, r, qc, rc, device)
    return _search_faiss_ivf(q, r, qc, nlist, nprobe, train_size, seed, device)


def _check_dims(q: np.ndarray, r: np.ndarray, qname: str, rname: str) -> None:
    """Shape checks that must fail before any warning about the rows is emitted."""
    for x, name in ((q, qname), (r, rname)):
        if x.ndim != 2:
            raise IsoodError(f"{name}: expected a 2-D array (N, D), got shape {x.shape}; reshape single vectors to (1, D)")
    if q.shape[1] != r.shape[1]:
        raise IsoodError(f"feature dimension mismatch: {qname} has {q.shape[1]}, {rname} has {r.shape[1]}; pass features from the same encoder")


def _check_pair(q: np.ndarray, r: np.ndarray, rmask: np.ndarray, qname: str, rname: str) -> None:
    if q.shape[1] != r.shape[1]:
        raise IsoodError(f"feature dimension mismatch: {qname} has {q.shape[1]}, {rname} has {r.shape[1]}; pass features from the same encoder")
    if len(r) == 0 or rmask.all():
        raise IsoodError(f"{rname} set is empty (no finite rows); pass at least one reference (ID) feature row")


def nearest_cosine_distance(query: Any, reference: Any, **options: Any) -> np.ndarray | tuple[np.ndarray, np.ndarray]:
    """Minimum cosine distance (1 - cos) from each query row to the reference rows: an (N,) float32 array.

    Options: ``backend`` ('auto' | 'torch' | 'faiss-flat' | 'faiss-ivf', default 'auto' = exact),
    ``memory_mb`` (budget for one similarity block / reference block copy, default 256), ``query_chunk`` and
    ``reference_chunk`` (explicit block sizes, override the budget), ``nlist``/``nprobe``/``train_size``/``seed``
    (IVF; defaults in the module docstring), ``device`` ('cpu', 'cuda' or None = GPU when present),
    ``return_index`` (also return the index of the nearest reference row, -1 for dropped queries).
    Dropped query rows (NaN/inf) get NaN; dropped reference rows are excluded (indices still refer to the
    original rows). Raises :class:`IsoodError` on a dimension mismatch or an empty reference set.
    """
    return_index = bool(options.pop("return_index", False))
    unknown = set(options) - {"backend", "memory_mb", "query_chunk", "reference_chunk", "nlist", "nprobe", "train_size", "seed", "device"}
    if unknown:
        raise IsoodError(f"nearest_cosine_distance: unknown option(s) {sorted(unknown)}")
    query, reference = _as_numpy(query, "query"), _as_numpy(reference, "reference")
    _check_dims(query, reference, "query", "reference")
    q, qmask = prepare_features(query, "query")
    r, rmask = prepare_features(reference, "reference")
    _check_pair(q, r, rmask, "query", "reference")
    ref_rows = np.flatnonzero(~rmask)
    sims, idx = _nearest_prepared(np.ascontiguousarray(q[~qmask]), np.ascontiguousarray(r[ref_rows]), **options)
    dist = np.full(len(q), np.nan, dtype=np.float32)
    dist[~qmask] = np.clip(1.0 - sims, 0.0, 2.0)
    if not return_index:
        return dist
    index = np.full(len(q), -1, dtype=np.int64)
    index[~qmask] = ref_rows[idx]
    return dist, index


def shift_distances(test_features: Any, id_features: Any, laid: Any, **options: Any) -> tuple[np.ndarray, np.ndarray]:
    """IS-OOD shift of each test image: ``(D_sem, D_cov)``, each (N,) float32.

    D_sem(x) = min over ID images i of d(x_sem, i_sem), D_cov(x) = min_i d(x_cov, i_cov), with (sem, cov) =
    ``laid.transform(f)`` re-normalised per half and d the cosine distance. Options as for
    :func:`nearest_cosine_distance` (``return_index`` excepted). Test rows with NaN/inf get NaN.
    """
    if options.pop("return_index", False):
        raise IsoodError("shift_distances does not return indices; call nearest_cosine_distance for that")
    test_features, id_features = _as_numpy(test_features, "test features"), _as_numpy(id_features, "ID features")
    _check_dims(test_features, id_features, "test features", "ID features")
    if test_features.shape[1] != laid.dim:
        raise IsoodError(f"feature dimension mismatch: features have {test_features.shape[1]}, LAID W is {laid.dim}x{laid.dim}; pass the LAID fitted for this encoder")
    t, tmask = prepare_features(test_features, "test features")
    i, imask = prepare_features(id_features, "ID features")
    _check_pair(t, i, imask, "test features", "ID features")
    t_sem, t_cov = laid.transform(t[~tmask])
    i_sem, i_cov = laid.transform(i[~imask])
    out = []
    for q, r in ((t_sem, i_sem), (t_cov, i_cov)):
        sims, _ = _nearest_prepared(_l2_normalise(q), _l2_normalise(r), **options)
        d = np.full(len(t), np.nan, dtype=np.float32)
        d[~tmask] = np.clip(1.0 - sims, 0.0, 2.0)
        out.append(d)
    return out[0], out[1]
