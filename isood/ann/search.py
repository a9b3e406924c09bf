"""The search entry point: options, backend resolution, and dispatch to the exact / IVF / tuned searches."""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from isood.ann.exact import DEFAULT_MEMORY_MB, block_sizes, faiss_gpu, import_faiss, search_faiss_flat, search_torch
from isood.ann.ivf import ProbePlan, build_ivf, ivf_search
from isood.ann.tune import DEFAULT_SAMPLE, AnnReport, search_tuned
from isood.errors import BadInputError

__all__ = ["BACKENDS", "SearchOptions", "resolve_backend", "search", "search_report", "search_faiss_ivf"]

BACKENDS = ("auto", "torch", "faiss-flat", "faiss-ivf")


@dataclass(frozen=True)
class SearchOptions:
    """How to search: ``backend`` (one of :data:`BACKENDS`), ``memory_mb`` (budget for one similarity block /
    reference block copy), ``query_chunk`` / ``reference_chunk`` (explicit block sizes, override the budget),
    ``nlist`` / ``nprobe`` / ``train_size`` / ``seed`` (IVF), ``recall`` (a target recall@1 in (0, 1]: IVF
    tuned on a sample of the queries, see :mod:`isood.ann.tune`; with ``backend='auto'`` it asks for
    approximate search), ``sample`` (queries in each tuning / held-out sample), ``device`` ('cpu',
    'cuda[:N]', None = GPU when present)."""

    backend: str = "auto"
    memory_mb: float = DEFAULT_MEMORY_MB
    query_chunk: int | None = None
    reference_chunk: int | None = None
    nlist: int | None = None
    nprobe: int | None = None
    train_size: int | None = None
    seed: int = 0
    device: str | None = None
    recall: float | None = None
    sample: int = DEFAULT_SAMPLE

    def __post_init__(self) -> None:
        if self.backend not in BACKENDS:
            raise BadInputError(f"unknown shift backend {self.backend!r}; pass one of {', '.join(BACKENDS)}")
        for name in ("query_chunk", "reference_chunk", "nlist", "nprobe", "train_size", "sample"):
            value = getattr(self, name)
            if value is not None and (isinstance(value, bool) or int(value) != value or value < 1):
                raise BadInputError(f"{name} must be a positive integer or None, got {value!r}")
        if self.recall is not None:
            r = self.recall
            try:
                value = float(r)
            except (TypeError, ValueError):
                value = math.nan
            if isinstance(r, bool) or not 0.0 < value <= 1.0:
                raise BadInputError(f"ann recall must be a number in (0, 1] (e.g. 0.99), got {r!r}")
            if self.backend in ("torch", "faiss-flat"):
                raise BadInputError(f"ann recall {r:g} asks for approximate search but backend {self.backend!r} is "
                                    "exact; pass backend 'auto' or 'faiss-ivf', or drop the recall target")
            if self.nprobe is not None:
                raise BadInputError(f"pass either nprobe ({self.nprobe}) or an ann recall target ({r:g}), not both")


def resolve_backend(backend: str, device: str | None) -> str:
    """``auto`` -> ``torch`` on a CUDA GPU (unless ``device='cpu'``), else ``faiss-flat`` when faiss is
    installed, else ``torch``; other backends are returned as given (after a check)."""
    if backend not in BACKENDS:
        raise BadInputError(f"unknown shift backend {backend!r}; pass one of {', '.join(BACKENDS)}")
    if backend != "auto":
        return backend
    if device != "cpu":
        import torch

        if torch.cuda.is_available():
            return "torch"
    try:
        import faiss  # noqa: F401
    except ImportError:  # pragma: no cover
        return "torch"
    return "faiss-flat"


def _exact(q: np.ndarray, r: np.ndarray, options: SearchOptions, backend: str) -> tuple[np.ndarray, np.ndarray]:
    qc, rc = block_sizes(len(q), len(r), r.shape[1], options.memory_mb, options.query_chunk, options.reference_chunk)
    if backend == "torch":
        return search_torch(q, r, qc, rc, options.device)
    if not options.reference_chunk and not faiss_gpu(import_faiss(), options.device):
        rc = len(r)  # faiss.knn reads the reference in place, its similarity blocks are its own (~16 MB)
    return search_faiss_flat(q, r, qc, rc, options.device)


def search_faiss_ivf(q: np.ndarray, r: np.ndarray, options: SearchOptions) -> tuple[np.ndarray, np.ndarray]:
    """Plain IVF search (``nprobe`` lists per query); queries whose probed lists were all empty fall back to the
    exact flat search."""
    index = build_ivf(r, nlist=options.nlist, train_size=options.train_size, seed=options.seed)
    best, arg, _ = ivf_search(index, q, ProbePlan(int(options.nprobe)) if options.nprobe else None)
    missing = arg < 0
    if missing.any():
        best[missing], arg[missing] = _exact(np.ascontiguousarray(q[missing]), r, options, "faiss-flat")
    return best, arg


def search_report(q: np.ndarray, r: np.ndarray, options: SearchOptions = SearchOptions(), *,
                  rows: tuple[np.ndarray, np.ndarray] | None = None
                  ) -> tuple[np.ndarray, np.ndarray, AnnReport | None]:
    """Max inner product and its reference row for each query row (both clean, L2-normalised float32), and
    the report of a recall-tuned search (None otherwise). ``rows``: the (tuning, held-out) query rows."""
    if len(q) == 0:
        return np.empty(0, np.float32), np.empty(0, np.int64), None
    if options.recall is not None:
        exact_backend = resolve_backend("auto", options.device)
        return search_tuned(q, r, recall=float(options.recall), rows=rows, sample=options.sample,
                            nlist=options.nlist, train_size=options.train_size, seed=options.seed,
                            exact=lambda x: _exact(x, r, options, exact_backend))
    backend = resolve_backend(options.backend, options.device)
    if backend == "faiss-ivf":
        return (*search_faiss_ivf(q, r, options), None)
    return (*_exact(q, r, options, backend), None)


def search(q: np.ndarray, r: np.ndarray, options: SearchOptions = SearchOptions()) -> tuple[np.ndarray, np.ndarray]:
    """Max inner product and its reference row for each query row (both clean, L2-normalised float32)."""
    sims, idx, _ = search_report(q, r, options)
    return sims, idx
