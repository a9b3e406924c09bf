"""L2: nearest-neighbour search by inner product over clean, L2-normalised float32 rows (the engines of
``isood.shift``): exact blocked torch matmul, exact faiss flat, approximate faiss IVF.

Every search returns ``(max inner product, row index)`` per query. Memory stays within ``memory_mb`` by
blocking over queries *and* reference rows. Backends:

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

torch and faiss are imported inside the functions that use them.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from isood.errors import BadInputError
from isood.runtime import torch_device

__all__ = ["BACKENDS", "DEFAULT_NPROBE", "DEFAULT_MEMORY_MB", "SearchOptions", "default_nlist", "block_sizes",
           "resolve_backend", "search", "search_torch", "search_faiss_flat", "search_faiss_ivf", "build_ivf_index",
           "ivf_search"]

BACKENDS = ("auto", "torch", "faiss-flat", "faiss-ivf")
#: Default IVF nprobe (see the module docstring and bench/RESULTS.md).
DEFAULT_NPROBE = 32
#: Default memory budget (MiB) for one block of similarities / one reference block copy.
DEFAULT_MEMORY_MB = 256


@dataclass(frozen=True)
class SearchOptions:
    """How to search: ``backend`` (one of :data:`BACKENDS`), ``memory_mb`` (budget for one similarity block /
    reference block copy), ``query_chunk`` / ``reference_chunk`` (explicit block sizes, override the budget),
    ``nlist`` / ``nprobe`` / ``train_size`` / ``seed`` (IVF), ``device`` ('cpu', 'cuda[:N]', None = GPU when
    present)."""

    backend: str = "auto"
    memory_mb: float = DEFAULT_MEMORY_MB
    query_chunk: int | None = None
    reference_chunk: int | None = None
    nlist: int | None = None
    nprobe: int | None = None
    train_size: int | None = None
    seed: int = 0
    device: str | None = None

    def __post_init__(self) -> None:
        if self.backend not in BACKENDS:
            raise BadInputError(f"unknown shift backend {self.backend!r}; pass one of {', '.join(BACKENDS)}")
        for name in ("query_chunk", "reference_chunk", "nlist", "nprobe", "train_size"):
            value = getattr(self, name)
            if value is not None and (isinstance(value, bool) or int(value) != value or value < 1):
                raise BadInputError(f"{name} must be a positive integer or None, got {value!r}")


def default_nlist(n_reference: int) -> int:
    """IVF list count for ``n_reference`` rows: 4 * sqrt(N) rounded to a power of two, at most N // 39, >= 1."""
    if n_reference < 39:
        return 1
    target = 4.0 * math.sqrt(n_reference)
    nlist = 2 ** int(round(math.log2(target)))
    return int(max(1, min(nlist, n_reference // 39)))


def block_sizes(n_query: int, n_ref: int, dim: int, memory_mb: float, query_chunk: int | None = None,
                reference_chunk: int | None = None) -> tuple[int, int]:
    """(query rows, reference rows) per block: a qc x rc similarity block plus an rc x dim reference block,
    float32, fit in ``memory_mb``; explicit chunks win."""
    budget = max(1.0, float(memory_mb)) * 2**20
    qc = int(query_chunk) if query_chunk else max(1, min(n_query, 4096))
    if reference_chunk:
        rc = int(reference_chunk)
    else:
        rc = int(budget // (4 * (qc + dim)))
        if rc < 1024 and not query_chunk:  # keep blocks reasonably shaped under a tiny budget
            qc = max(1, min(qc, int(budget // (4 * (1024 + dim)))))
            rc = int(budget // (4 * (qc + dim)))
    return max(1, min(qc, n_query)), max(1, min(rc, n_ref))


def _faiss():
    try:
        import faiss
    except ImportError as exc:  # pragma: no cover - faiss-cpu is a dependency
        raise BadInputError("the faiss backends need faiss (pip install faiss-cpu); or pass backend='torch'") from exc
    return faiss


def _faiss_gpu(faiss, device: str | None) -> bool:
    return device != "cpu" and hasattr(faiss, "StandardGpuResources") and faiss.get_num_gpus() > 0


def resolve_backend(backend: str, device: str | None) -> str:
    """``auto`` -> ``torch`` on a CUDA GPU (unless ``device='cpu'``), else ``faiss-flat`` when faiss is
    installed, else ``torch``; other backends are returned as given (after a check)."""
    import torch

    if backend not in BACKENDS:
        raise BadInputError(f"unknown shift backend {backend!r}; pass one of {', '.join(BACKENDS)}")
    if backend != "auto":
        return backend
    if device != "cpu" and torch.cuda.is_available():
        return "torch"
    try:
        import faiss  # noqa: F401
    except ImportError:  # pragma: no cover
        return "torch"
    return "faiss-flat"


def search_torch(q: np.ndarray, r: np.ndarray, qc: int, rc: int, device: str | None) -> tuple[np.ndarray, np.ndarray]:
    """Exact blocked search with torch on ``device`` (None/'auto': CUDA when present)."""
    import torch

    dev = torch_device(device)
    best = torch.full((len(q),), -math.inf, dtype=torch.float32, device=dev)
    arg = torch.full((len(q),), -1, dtype=torch.int64, device=dev)
    q_all = torch.from_numpy(q).to(dev)
    with torch.no_grad():
        for r0 in range(0, len(r), rc):
            rb = torch.from_numpy(r[r0:r0 + rc]).to(dev)
            for q0 in range(0, len(q), qc):
                m, i = (q_all[q0:q0 + qc] @ rb.T).max(dim=1)
                better = m > best[q0:q0 + qc]
                best[q0:q0 + qc] = torch.where(better, m, best[q0:q0 + qc])
                arg[q0:q0 + qc] = torch.where(better, i + r0, arg[q0:q0 + qc])
    return best.cpu().numpy(), arg.cpu().numpy()


def search_faiss_flat(q: np.ndarray, r: np.ndarray, qc: int, rc: int,
                      device: str | None) -> tuple[np.ndarray, np.ndarray]:
    """Exact search with ``faiss.IndexFlatIP``, one reference block at a time."""
    faiss = _faiss()
    index = faiss.IndexFlatIP(q.shape[1])
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
        raise BadInputError(f"faiss-ivf: nlist must be in [1, {n}] (number of reference rows), got {nlist}")
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


def ivf_search(index, query: np.ndarray, *, nprobe: int | None = None,
               query_chunk: int = 4096) -> tuple[np.ndarray, np.ndarray]:
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


def search_faiss_ivf(q: np.ndarray, r: np.ndarray, qc: int, options: SearchOptions) -> tuple[np.ndarray, np.ndarray]:
    """Approximate IVF search; queries whose probed lists were all empty fall back to the exact flat search."""
    index = build_ivf_index(r, nlist=options.nlist, train_size=options.train_size, seed=options.seed,
                            device=options.device)
    best, arg = ivf_search(index, q, nprobe=options.nprobe, query_chunk=qc)
    missing = arg < 0
    if missing.any():
        best[missing], arg[missing] = search_faiss_flat(q[missing], r, qc, len(r), options.device)
    return best, arg


def search(q: np.ndarray, r: np.ndarray, options: SearchOptions = SearchOptions()) -> tuple[np.ndarray, np.ndarray]:
    """Max inner product and its reference row for each query row (both clean, L2-normalised float32)."""
    backend = resolve_backend(options.backend, options.device)
    if len(q) == 0:
        return np.empty(0, np.float32), np.empty(0, np.int64)
    qc, rc = block_sizes(len(q), len(r), q.shape[1], options.memory_mb, options.query_chunk, options.reference_chunk)
    if backend == "torch":
        return search_torch(q, r, qc, rc, options.device)
    if backend == "faiss-flat":
        return search_faiss_flat(q, r, qc, rc, options.device)
    return search_faiss_ivf(q, r, qc, options)
