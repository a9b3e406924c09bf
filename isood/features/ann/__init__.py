"""Nearest-neighbour search by inner product over clean, L2-normalised float32 rows (the engines of
``isood.features.shift``). Every search returns ``(max inner product, row index)`` per query.

Backends (:class:`SearchOptions`):

- ``torch``: exact, blocked float32 matmul (CUDA when available, else CPU) within ``memory_mb`` (the plain
  reference loop).
- ``torch-fused``: exact at matrix-multiply speed (:mod:`isood.features.ann.fused`): the reference resident on the
  device, candidates from a reduced-precision product (fp16 by default, ``precision``), an exact float32 /
  float64 re-rank of the candidates, and a certificate (the rounding error bound) that the re-ranked best is the
  exact nearest row, else a wider re-rank, else a full float32 search of that query. A Triton kernel computes the
  candidates on CUDA without writing the similarity matrix (torch kernel: the fallback, and the CPU).
- ``faiss-flat``: exact, ``faiss.IndexFlatIP`` per reference block (faiss GPU when available).
- ``faiss-ivf``: approximate inverted file (:mod:`isood.features.ann.ivf`): spherical k-means into ``nlist`` lists
  (default ``4 * sqrt(N)`` rounded to a power of two, <= N // 39: 4096 lists for 1M rows), each query probes
  ``nprobe`` lists (default 32), scanned list by list with one matrix product per list (exact inside the
  probed lists). The index holds one copy of the reference (N * D * 4 bytes) plus the list ids.
- ``auto``: exact -- ``torch-fused`` on a CUDA GPU, else ``faiss-flat``, else ``torch``. Approximate search is
  never chosen silently: it is ``backend='faiss-ivf'``, or a target ``recall`` (``--ann-recall``) or
  ``levels`` (``--ann-levels``: the share of rows whose grid level is unchanged), which tunes an adaptive probe
  plan on a sample of the queries against exact search and reports what it reached on a held-out sample
  (:mod:`isood.features.ann.tune`); :mod:`isood.features.ann.agreement` turns that sample into the share of images whose grid
  cell equals an exact build's, with a confidence interval. A ``levels`` target searches with
  :mod:`isood.features.ann.levels`: IVF answers, more lists for the queries an unprobed list could move to a lower
  level (:mod:`isood.features.ann.widen`), and an exact search of every query an edge is within reach of (the reach tuned
  on the tuning sample: an IVF distance can only overestimate), with the held-out level agreement and its
  one-sided lower confidence bound in the report.

Measured by ``bench/shift_nn.py`` on 1M x 256 clustered features, half of the queries far OOD, on 2 CPU cores
(docs/guides/benchmarks.md): exact faiss flat ~380 queries/s (at the FLOP floor); ``recall=0.995`` -> nprobe 8,
32% of the queries re-probe 256 of 4096 lists: 31x flat, recall@1 0.996, level agreement 99.94%; ``recall=0.99`` -> 45x,
0.992, 99.88%. faiss's own IVF search of the same lists is 4x at recall 0.99 (one query at a time, memory-bound),
HNSW (M 32) reaches recall@1 0.94 at 5x, IVF-PQ fast-scan + exact refine 0.965 at 42x: the far queries' nearest
rows are near-ties spread over many clusters. The exact path (``nearest``, faiss-flat) runs at 1.02x raw faiss
flat. torch and faiss are imported inside the functions that use them.

Chunked search (:class:`ChunkedSearch`): a query set given chunk by chunk against one reference (any backend;
the IVF index built once; with a recall target :class:`TunedSearch` tunes on the sampled queries first, the
queries no probed list answered are searched exactly at the end in one call). Chunks of ``block_rows`` (default
:data:`QUERY_CHUNK`) rows give the bytes of the search of the whole set (:func:`search_report` is one chunk).
"""

from __future__ import annotations

from isood.features.ann.agreement import (AGREEMENT_CONFIDENCE, AGREEMENT_RESAMPLES, Agreement, estimate_exact_edges,
                                 exact_agreement, held_out_distances, wilson_interval)
from isood.features.ann.exact import DEFAULT_MEMORY_MB, block_sizes, search_faiss_flat, search_torch
from isood.features.ann.fused import PRECISIONS, FusedIndex, FusedStats, error_bound, search_fused
from isood.features.ann.ivf import (DEFAULT_NPROBE, QUERY_CHUNK, IVFIndex, ProbePlan, build_ivf, default_nlist, ivf_search,
                           list_maxima, probe, scan_lists)
from isood.features.ann.levels import LevelPlan, LevelSearch, lower_bound, near_edge, tune_levels
from isood.features.ann.search import (BACKENDS, EXACT_BACKENDS, ChunkedSearch, ExactSearch, SearchOptions, chunk_options,
                              resolve_backend, search, search_faiss_ivf, search_report)
from isood.features.ann.tune import (DEFAULT_SAMPLE, MAX_SCAN_FRACTION, AnnReport, Fix, IvfChunks, RecallOutOfReach, Target,
                            TunedSearch, probe_ladder, reachable_target, sample_rows, search_tuned, tune_plan,
                            tune_plan_levels)

__all__ = [
    "BACKENDS", "DEFAULT_NPROBE", "DEFAULT_MEMORY_MB", "DEFAULT_SAMPLE", "MAX_SCAN_FRACTION", "QUERY_CHUNK",
    "SearchOptions", "AnnReport", "IVFIndex", "ProbePlan", "default_nlist", "block_sizes", "resolve_backend",
    "search", "search_report", "search_torch", "search_faiss_flat", "search_faiss_ivf", "build_ivf", "ivf_search",
    "probe", "scan_lists", "probe_ladder", "sample_rows", "search_tuned", "tune_plan", "ChunkedSearch",
    "chunk_options", "TunedSearch", "IvfChunks", "Fix", "RecallOutOfReach", "reachable_target", "Agreement",
    "AGREEMENT_CONFIDENCE", "AGREEMENT_RESAMPLES", "estimate_exact_edges", "exact_agreement", "held_out_distances",
    "EXACT_BACKENDS", "ExactSearch", "PRECISIONS", "FusedIndex", "FusedStats", "error_bound", "search_fused",
    "list_maxima", "Target", "tune_plan_levels", "wilson_interval", "LevelPlan", "LevelSearch", "lower_bound",
    "near_edge", "tune_levels",
]
