"""The search entry point: options, backend resolution, and dispatch to the exact / IVF / tuned searches."""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

import numpy as np

from isood.features.ann.exact import DEFAULT_MEMORY_MB, block_sizes, faiss_gpu, import_faiss, search_faiss_flat, search_torch
from isood.features.ann.fused import FusedIndex, check_precision
from isood.features.ann.levels import LevelSearch
from isood.features.ann.ivf import QUERY_CHUNK, ProbePlan, build_ivf
from isood.features.ann.tune import DEFAULT_SAMPLE, AnnReport, Fix, IvfChunks, Target, TunedSearch, sample_rows
from isood.core.defaults import N_LEVELS, QUANTILE_CLIP
from isood.core.errors import BadInputError
from isood.science.grid import check_levels

__all__ = ["BACKENDS", "EXACT_BACKENDS", "SearchOptions", "ChunkedSearch", "ExactSearch", "chunk_options",
           "resolve_backend", "search", "search_report", "search_faiss_ivf"]

BACKENDS = ("auto", "torch", "torch-fused", "faiss-flat", "faiss-ivf")
#: The backends that always answer exactly.
EXACT_BACKENDS = ("torch", "torch-fused", "faiss-flat")


@dataclass(frozen=True)
class SearchOptions:
    """How to search: ``backend`` (one of :data:`BACKENDS`), ``memory_mb`` (budget for one similarity block /
    reference block copy), ``query_chunk`` / ``reference_chunk`` (explicit block sizes, override the budget),
    ``nlist`` / ``nprobe`` / ``train_size`` / ``seed`` (IVF), ``recall`` (a target recall@1 in (0, 1]: IVF
    tuned on a sample of the queries, see :mod:`isood.features.ann.tune`; with ``backend='auto'`` it asks for
    approximate search), ``sample`` (queries in each tuning / held-out sample), ``device`` ('cpu',
    'cuda[:N]', None = GPU when present), ``precision`` (the candidate pass of ``torch-fused``: fp16, bf16 or
    tf32; None = fp16; the answer is exact whatever it is, :mod:`isood.features.ann.fused`), ``levels`` (a target share
    of queries whose grid level is unchanged, in (0, 1]: IVF tuned to it instead of a recall, on the grid of
    ``grid_levels`` levels between the ``grid_clip`` quantiles; pass ``recall`` or ``levels``, not both)."""

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
    precision: str | None = None
    levels: float | None = None
    grid_levels: int = N_LEVELS
    grid_clip: tuple[float, float] = QUANTILE_CLIP

    def __post_init__(self) -> None:
        if self.backend not in BACKENDS:
            raise BadInputError(f"unknown shift backend {self.backend!r}; pass one of {', '.join(BACKENDS)}")
        check_precision(self.precision)
        for name in ("query_chunk", "reference_chunk", "nlist", "nprobe", "train_size", "sample"):
            value = getattr(self, name)
            if value is not None and (isinstance(value, bool) or int(value) != value or value < 1):
                raise BadInputError(f"{name} must be a positive integer or None, got {value!r}")
        check_levels(self.grid_levels, "grid_levels")
        if self.recall is not None:
            r = self.recall
            try:
                value = float(r)
            except (TypeError, ValueError):
                value = math.nan
            if isinstance(r, bool) or not 0.0 < value <= 1.0:
                raise BadInputError(f"ann recall must be a number in (0, 1] (e.g. 0.99), got {r!r}")
            if self.backend in EXACT_BACKENDS:
                raise BadInputError(f"ann recall {r:g} asks for approximate search but backend {self.backend!r} is "
                                    "exact; pass backend 'auto' or 'faiss-ivf', or drop the recall target")
            if self.nprobe is not None:
                raise BadInputError(f"pass either nprobe ({self.nprobe}) or an ann recall target ({r:g}), not both")
        if self.levels is not None:
            t = self.levels
            try:
                value = float(t)
            except (TypeError, ValueError):
                value = math.nan
            if isinstance(t, bool) or not 0.0 < value <= 1.0:
                raise BadInputError(f"ann levels must be a number in (0, 1] (e.g. 0.999: the share of images whose "
                                    f"grid level an exact search would not change), got {t!r}")
            if self.recall is not None:
                raise BadInputError(f"pass either an ann recall target ({self.recall:g}) or an ann levels target "
                                    f"({value:g}), not both")
            if self.backend in EXACT_BACKENDS:
                raise BadInputError(f"ann levels {value:g} asks for approximate search but backend {self.backend!r} "
                                    "is exact; pass backend 'auto' or 'faiss-ivf', or drop the levels target")
            if self.nprobe is not None:
                raise BadInputError(f"pass either nprobe ({self.nprobe}) or an ann levels target ({value:g}), not both")

    @property
    def approximate(self) -> bool:
        """Whether a target (recall or levels) asks for a tuned approximate search."""
        return self.recall is not None or self.levels is not None

    @property
    def target(self) -> Target | None:
        """The tuned search's target, or None for an untuned search."""
        if not self.approximate:
            return None
        return Target(recall=None if self.recall is None else float(self.recall),
                      levels=None if self.levels is None else float(self.levels),
                      grid_levels=int(self.grid_levels),
                      grid_clip=(float(self.grid_clip[0]), float(self.grid_clip[1])))


def resolve_backend(backend: str, device: str | None) -> str:
    """``auto`` -> ``torch-fused`` on a CUDA GPU (unless ``device='cpu'``: exact, at matrix-multiply speed),
    else ``faiss-flat`` when faiss is installed, else ``torch``; other backends are returned as given (after a
    check)."""
    if backend not in BACKENDS:
        raise BadInputError(f"unknown shift backend {backend!r}; pass one of {', '.join(BACKENDS)}")
    if backend != "auto":
        return backend
    if device != "cpu":
        import torch

        if torch.cuda.is_available():
            return "torch-fused"
    try:
        import faiss  # noqa: F401
    except ImportError:  # pragma: no cover
        return "torch"
    return "faiss-flat"


def _exact(q: np.ndarray, r: np.ndarray, options: SearchOptions, backend: str) -> tuple[np.ndarray, np.ndarray]:
    if backend == "torch-fused":
        return FusedIndex(r, device=options.device, precision=options.precision, memory_mb=options.memory_mb).search(q)
    qc, rc = block_sizes(len(q), len(r), r.shape[1], options.memory_mb, options.query_chunk, options.reference_chunk)
    if backend == "torch":
        return search_torch(q, r, qc, rc, options.device)
    if not options.reference_chunk and not faiss_gpu(import_faiss(), options.device):
        rc = len(r)  # faiss.knn reads the reference in place, its similarity blocks are its own (~16 MB)
    return search_faiss_flat(q, r, qc, rc, options.device)


class ExactSearch:
    """Exact search of query sets in one ``reference`` with ``backend`` (resolved): ``search(q, options)``
    (``options``: e.g. the block sizes of a whole search, default those given here). The fused backend's
    reference is uploaded once, on the first search, and stays on the device (``fused``)."""

    def __init__(self, reference: np.ndarray, options: SearchOptions, backend: str):
        self.reference, self.options, self.backend = reference, options, backend
        self.fused: FusedIndex | None = None

    def __call__(self, q: np.ndarray, options: SearchOptions | None = None) -> tuple[np.ndarray, np.ndarray]:
        if self.backend != "torch-fused":
            return _exact(q, self.reference, options or self.options, self.backend)
        if self.fused is None:
            o = self.options
            self.fused = FusedIndex(self.reference, device=o.device, precision=o.precision, memory_mb=o.memory_mb)
        return self.fused.search(q)


def chunk_options(options: SearchOptions, n_query: int, reference: np.ndarray) -> SearchOptions:
    """``options`` with the query block of an exact search of ``n_query`` queries made explicit, so that a chunk
    of those queries is searched in the blocks (and with the reference blocks) of the whole search."""
    if options.query_chunk:
        return options
    qc, _ = block_sizes(max(1, int(n_query)), len(reference), reference.shape[1], options.memory_mb, None,
                        options.reference_chunk)
    return replace(options, query_chunk=qc)


def search_faiss_ivf(q: np.ndarray, r: np.ndarray, options: SearchOptions) -> tuple[np.ndarray, np.ndarray]:
    """Plain IVF search (``nprobe`` lists per query); queries whose probed lists were all empty fall back to the
    exact flat search."""
    search = ChunkedSearch(r, replace(options, backend="faiss-ivf", recall=None, levels=None), n_query=len(q))
    return search.whole(q)[:2]


class ChunkedSearch:
    """:func:`search_report` of a query set of ``n_query`` rows given chunk by chunk (consecutive rows, in
    order): :meth:`search` answers a chunk, :meth:`finish` returns the fixes to apply to the answers (in order)
    and the report. The reference is searched as given (the IVF index, when there is one, is built once). With a
    recall target, ``rows`` are the (tuning, held-out) query rows and ``sample`` the queries at them (tuning
    then held-out). Chunks of ``block_rows`` rows (a multiple of the exact search's query block; the last may be
    shorter) give the bytes of the search of the whole set."""

    def __init__(self, reference: np.ndarray, options: SearchOptions = SearchOptions(), *, n_query: int,
                 sample: np.ndarray | None = None, rows: tuple[np.ndarray, np.ndarray] | None = None,
                 block_rows: int = QUERY_CHUNK):
        self.reference, self.options = reference, options
        whole = chunk_options(options, n_query, reference)
        self.tuned: TunedSearch | LevelSearch | None = None
        self.ivf: IvfChunks | None = None
        if options.approximate:
            exact = ExactSearch(reference, options, resolve_backend("auto", options.device))
            if rows is None or sample is None:
                raise BadInputError("a tuned chunked search needs the sampled rows and their queries")
            target = options.target
            assert target is not None  # options.approximate
            if target.levels is not None:
                self.tuned = LevelSearch(
                    reference, sample, rows, n_query=n_query, target=target, exact=exact,
                    exact_chunk=lambda x: exact(x, whole), nlist=options.nlist, train_size=options.train_size,
                    seed=options.seed, query_chunk=block_rows)
                return
            self.tuned = TunedSearch(
                reference, sample, rows, n_query=n_query, target=target,
                exact=exact, exact_chunk=lambda x: exact(x, whole), nlist=options.nlist,
                train_size=options.train_size, seed=options.seed, query_chunk=block_rows)
            return
        self.backend = resolve_backend(options.backend, options.device)
        self.exact = ExactSearch(reference, options, self.backend)
        if self.backend == "faiss-ivf":
            index = build_ivf(reference, nlist=options.nlist, train_size=options.train_size, seed=options.seed)
            self.ivf = IvfChunks(index, ProbePlan(int(options.nprobe)) if options.nprobe else None,
                                 query_chunk=block_rows)
        self.whole_options = whole

    def search(self, q: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Max inner product and its reference row for each query of the next chunk (before the fixes)."""
        if self.tuned is not None:
            return self.tuned.search(q)
        if self.ivf is not None:
            return self.ivf.search(q)
        return self.exact(q, self.whole_options)

    def finish(self) -> tuple[list[Fix], AnnReport | None]:
        """The fixes to apply to the answers, in order, and the report of a recall-tuned search (else None)."""
        if self.tuned is not None:
            return self.tuned.finish()
        if self.ivf is not None:
            return [self.ivf.missing(lambda x: _exact(x, self.reference, self.options, "faiss-flat"))], None
        return [], None

    def whole(self, q: np.ndarray) -> tuple[np.ndarray, np.ndarray, AnnReport | None]:
        """Search all the queries at once (one chunk) and apply the fixes."""
        sims, idx = self.search(q)
        fixes, report = self.finish()
        for at, s, i in fixes:
            sims[at], idx[at] = s, i
        return sims, idx, report


def search_report(q: np.ndarray, r: np.ndarray, options: SearchOptions = SearchOptions(), *,
                  rows: tuple[np.ndarray, np.ndarray] | None = None
                  ) -> tuple[np.ndarray, np.ndarray, AnnReport | None]:
    """Max inner product and its reference row for each query row (both clean, L2-normalised float32), and
    the report of a recall-tuned search (None otherwise). ``rows``: the (tuning, held-out) query rows."""
    if len(q) == 0:
        return np.empty(0, np.float32), np.empty(0, np.int64), None
    sample = None
    if options.approximate:
        rows = rows if rows is not None else sample_rows(len(q), options.sample, options.seed)
        sample = q[np.concatenate(rows)]
    return ChunkedSearch(r, options, n_query=len(q), sample=sample, rows=rows).whole(q)


def search(q: np.ndarray, r: np.ndarray, options: SearchOptions = SearchOptions()) -> tuple[np.ndarray, np.ndarray]:
    """Max inner product and its reference row for each query row (both clean, L2-normalised float32)."""
    sims, idx, _ = search_report(q, r, options)
    return sims, idx
