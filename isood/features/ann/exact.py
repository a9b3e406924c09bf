"""Exact nearest-neighbour search by inner product: blocked torch matmul and faiss flat (``IndexFlatIP``), both
within a memory budget by blocking over queries *and* reference rows."""

from __future__ import annotations

import math

import numpy as np

from isood.core.errors import BadInputError
from isood.core.devices import torch_device

__all__ = ["DEFAULT_MEMORY_MB", "block_sizes", "faiss_gpu", "import_faiss", "search_faiss_flat", "search_torch"]

#: Default memory budget (MiB) for one block of similarities / one reference block copy.
DEFAULT_MEMORY_MB = 256


def import_faiss():
    """The faiss module, or a one-line error naming the exact torch backend instead."""
    try:
        import faiss
    except ImportError as exc:  # pragma: no cover - faiss-cpu is a dependency
        raise BadInputError("the faiss backends need faiss (pip install faiss-cpu); or pass backend='torch'") from exc
    return faiss


def faiss_gpu(faiss, device: str | None) -> bool:
    """Whether faiss can use a GPU here (a GPU build with a device, and ``device`` is not 'cpu')."""
    return device != "cpu" and hasattr(faiss, "StandardGpuResources") and faiss.get_num_gpus() > 0


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
    """Exact search with faiss's flat inner-product kernel, ``rc`` reference rows at a time. On the CPU it runs
    on the arrays in place (``faiss.knn``: no copy of the reference); on a faiss GPU through ``IndexFlatIP``."""
    faiss = import_faiss()
    gpu = faiss_gpu(faiss, device)
    if gpu:  # pragma: no cover - no GPU in CI
        index = faiss.index_cpu_to_gpu(faiss.StandardGpuResources(), 0, faiss.IndexFlatIP(q.shape[1]))
    best = np.full(len(q), -np.inf, dtype=np.float32)
    arg = np.full(len(q), -1, dtype=np.int64)
    for r0 in range(0, len(r), rc):
        block = np.ascontiguousarray(r[r0:r0 + rc])
        if gpu:  # pragma: no cover
            index.reset()
            index.add(block)
        for q0 in range(0, len(q), qc):
            qb = np.ascontiguousarray(q[q0:q0 + qc])
            sims, idx = index.search(qb, 1) if gpu else faiss.knn(qb, block, 1, metric=faiss.METRIC_INNER_PRODUCT)
            m, i = sims[:, 0], idx[:, 0]
            better = (i >= 0) & (m > best[q0:q0 + qc])
            best[q0:q0 + qc][better] = m[better]
            arg[q0:q0 + qc][better] = i[better] + r0
    return best, arg
