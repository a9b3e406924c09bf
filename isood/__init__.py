"""isood: build out-of-distribution benchmarks graded by semantic and covariate shift, and evaluate detectors.

The main entry points are re-exported here lazily (importing ``isood`` loads nothing heavy)::

    import isood
    laid = isood.fit_laid(anchor, semantic_shift, covariate_shift)
    d_sem, d_cov = isood.shift_distances(test_features, id_features, laid)
    levels, edges = isood.assign_levels(d_sem)
    result = isood.evaluate_scores(id_scores, ood_scores, images, cells=cells)
    ev = isood.evaluate(model, id_test="val/", ood={"near:ssb": "imports/ssb"}, roots={"ssb": "/data"})
    ev.per_set, ev.per_cell, ev.table1                  # pandas frames, nothing written
    splits = isood.read("out/splits", kind="splits")   # a typed view (isood.kinds.SplitsView)
    ds = isood.load_dataset("out/splits", split="test")  # datasets.Dataset with an Image column

The layers (README, "Development"): foundations (``isood.errors``, ``defaults``, ``arrays``, ``files``,
``devices``, ``progress``, ``parts``, ``batch_engine``, ``lazy``, ``content``, ``textio``) -> ``manifests`` and
``wordnet_tools`` -> pure science, numpy in and out (``laid``, ``grid``, ``simulate``,
``evaluation.metrics/cells/levels/detectors``) -> adapters and I/O (``kinds``, ``shift`` and ``ann`` (the torch /
faiss search backends), ``clip``, ``images``, ``featurestore``, ``labels``, ``laid_training``, ``evaluation.*``,
``generation.*``) -> stages (``stages.*``, ``evaluation.job``, ``generation.syn``, ``wordnet_tools.jobs``) ->
engines (``engines.ray``) -> ``cli``, ``demo``.

isood needs Python >= 3.11 (``tomllib``, and the versions of torch it pins); an older interpreter gets one line.
"""

from __future__ import annotations

import sys

if sys.version_info < (3, 11):  # pragma: no cover - tested with a Python 3.10 interpreter (tests/test_python.py)
    raise ImportError(f"isood needs Python >= 3.11, this is {sys.version.split()[0]}: install it with a newer Python")

from isood.lazy import lazy_exports  # noqa: E402

_EXPORTS = {
    "IsoodError": "isood.errors",
    "LAID": "isood.laid",
    "fit_laid": "isood.laid",
    "nearest": "isood.shift",
    "nearest_cosine_distance": "isood.shift",
    "shift_distances": "isood.shift",
    "assign_levels": "isood.grid",
    "bin_with_edges": "isood.grid",
    "cell_table": "isood.grid",
    "make_planted_world": "isood.simulate",
    "evaluate_scores": "isood.evaluation.cells",
    "evaluate": "isood.evaluation.job",
    "write_evaluation": "isood.evaluation.write",
    "get_detector": "isood.evaluation.detectors",
    "register_detector": "isood.evaluation.detectors",
    "load_clip": "isood.clip",
    "encode_texts": "isood.clip",
    "list_images": "isood.images",
    "load_features": "isood.featurestore",
    "extract_features": "isood.featurestore",
    "load_labels": "isood.labels",
    "BuildConfig": "isood.stages.splits",
    "build_splits": "isood.stages.splits",
    "read": "manifests",
    "Benchmark": "isood.benchmarks.api",
    "load_dataset": "isood.image_datasets",
}
#: Sub-modules reachable as attributes without an import statement (``isood.detectors.KNN(k=50)``).
_MODULES = ("detectors", "benchmarks")
__all__ = ["__version__", *sorted(_EXPORTS), *_MODULES]
_getattr, __dir__ = lazy_exports(__name__, _EXPORTS, extra=("__version__", *_MODULES))


def __getattr__(name: str):
    if name == "__version__":
        from importlib.metadata import PackageNotFoundError, version

        try:
            return version("isood")
        except PackageNotFoundError:  # a source tree that is not installed
            return "0+unknown"
    if name in _MODULES:
        import importlib

        return importlib.import_module(f"isood.{name}")
    return _getattr(name)
