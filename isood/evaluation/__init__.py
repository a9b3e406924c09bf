"""``isood.evaluation``: the public names of OOD evaluation per shift cell, kept stable for users. The code lives in
the layers: metrics, per-cell evaluation, level curves, Table 1 and detectors in :mod:`isood.science`; model
adapters, output capture and scoring in :mod:`isood.classifiers`; the ``isood evaluate`` job and its writer in
:mod:`isood.stages.evaluate`.

Bring your own scores (no model needed)::

    import manifests
    from isood.evaluation import evaluate_scores

    splits = manifests.read("out/splits", kind="splits")
    result = evaluate_scores(id_scores, ood_scores, splits.images, splits=splits)
    result.per_cell, result.levels, result.summary

``write_evaluation(result, out)`` writes it as an ``evaluation`` manifest with heatmaps and a report.
Names are re-exported lazily: importing this package loads nothing heavy.
"""

from __future__ import annotations

from isood.core.lazy import lazy_exports

_MODULES = {
    "CellEvaluation": "science.cells", "EmptyCellError": "science.cells", "evaluate_cells": "science.cells",
    "evaluate_scores": "science.cells", "level_curves": "science.levels", "all_level_curves": "science.levels",
    "summary_table": "science.levels", "detector_means": "science.levels",
    "METRICS": "science.metrics", "Metric": "science.metrics",
    "Detector": "science.detectors", "ForwardOutputs": "science.detectors", "get_detector": "stages.evaluate.options",
    "register_detector": "science.detectors", "available_detectors": "science.detectors",
    "parse_detectors": "stages.evaluate.options", "from_pytorch_ood": "classifiers.pytorch_ood",
    "ModelAdapter": "classifiers.adapter", "wrap_model": "classifiers.models", "load_classifier": "classifiers.named",
    "randomized_copy": "classifiers.models", "extract_outputs": "classifiers.capture",
    "run_detectors": "classifiers.scoring", "DetectorScores": "classifiers.scoring",
    "write_evaluation": "stages.evaluate.write", "EvaluateOptions": "stages.evaluate.options",
    "EvaluateResult": "stages.evaluate.job", "run_evaluate": "stages.evaluate.job", "evaluate": "stages.evaluate.api",
    "Evaluation": "stages.evaluate.api", "table1": "science.conventions", "release_summary": "science.conventions",
    "release_results_csv": "science.conventions", "evaluate_set": "science.sets", "set_table": "science.sets",
}
_EXPORTS = {name: f"isood.{module}" for name, module in _MODULES.items()}
__all__ = sorted(_EXPORTS)
__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS)
