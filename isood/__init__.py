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

The package's folders are its layers, each importing only those below it (pyproject.toml's import-linter
contract; docs/development.md): ``core`` -> ``manifests`` and ``wordnet_tools`` -> ``science`` (numpy only) ->
``kinds`` -> ``features`` -> ``classifiers``, ``report``, ``generation`` -> ``stages`` (one per command) ->
``engines``, ``benchmarks`` -> ``cli``, ``dev``. ``isood.laid``, ``isood.shift``, ``isood.grid``,
``isood.detectors`` and ``isood.evaluation`` are public names over them.

isood needs Python >= 3.11 (``tomllib``, and the versions of torch it pins); an older interpreter gets one line.
"""

from __future__ import annotations

import sys

if sys.version_info < (3, 11):  # pragma: no cover - tested with a Python 3.10 interpreter (tests/test_python.py)
    raise ImportError(f"isood needs Python >= 3.11, this is {sys.version.split()[0]}: install it with a newer Python")

from isood.core.lazy import lazy_exports  # noqa: E402

_EXPORTS = {
    "IsoodError": "isood.core.errors",
    "LAID": "isood.science.laid",
    "fit_laid": "isood.science.laid",
    "nearest": "isood.features.shift",
    "nearest_cosine_distance": "isood.features.shift",
    "shift_distances": "isood.features.shift",
    "assign_levels": "isood.science.grid",
    "bin_with_edges": "isood.science.grid",
    "cell_table": "isood.science.grid",
    "make_planted_world": "isood.science.simulate",
    "evaluate_scores": "isood.science.cells",
    "evaluate": "isood.stages.evaluate.api",
    "write_evaluation": "isood.stages.evaluate.write",
    "get_detector": "isood.science.detectors",
    "register_detector": "isood.science.detectors",
    "load_clip": "isood.features.clip",
    "encode_texts": "isood.features.clip",
    "list_images": "isood.features.listing",
    "load_features": "isood.features.featurestore",
    "extract_features": "isood.features.featurestore",
    "load_labels": "isood.features.labels",
    "SplitsOptions": "isood.stages.splits",
    "build_splits": "isood.stages.splits",
    "read": "isood.kinds",
    "Benchmark": "isood.benchmarks.api",
    "load_dataset": "isood.features.image_datasets",
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
