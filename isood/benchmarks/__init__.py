"""Named benchmarks (``isood benchmarks``, ``isood evaluate --benchmark``) and the ``Benchmark`` object.

``registry``: the benchmark descriptions (TOML data files; yours in ``$ISOOD_BENCHMARKS``); ``resolve``: a
description under a data root -> the inputs of an evaluation (lists imported once, cached by content); ``api``:
``Benchmark.from_name`` / ``from_manifests`` / ``evaluate``.
"""

from isood.core.lazy import lazy_exports

_EXPORTS = {
    "Benchmark": "isood.benchmarks.api",
    "BenchmarkSpec": "isood.benchmarks.registry",
    "available_benchmarks": "isood.benchmarks.registry",
    "get_benchmark": "isood.benchmarks.registry",
    "resolve_benchmark": "isood.benchmarks.resolve",
}
__all__ = sorted(_EXPORTS)
__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS)
