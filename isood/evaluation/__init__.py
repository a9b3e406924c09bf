"""OOD evaluation per shift cell: metrics (``metrics``, a registry keyed by table column), per-cell evaluation of
score arrays (``cells``), level curves and Table 1 (``levels``), detectors (``detectors``), model adapters
(``models``), output capture and cache (``capture``), scoring (``scoring``), plots, the report and the
``isood evaluate`` job (``job``).

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

from isood.lazy import lazy_exports

_MODULES = {
    "CellEvaluation": "cells", "EmptyCellError": "cells", "evaluate_cells": "cells", "evaluate_scores": "cells",
    "level_curves": "levels", "all_level_curves": "levels", "summary_table": "levels", "detector_means": "levels",
    "METRICS": "metrics", "Metric": "metrics",
    "Detector": "detectors", "ForwardOutputs": "detectors", "get_detector": "options",
    "register_detector": "detectors", "available_detectors": "detectors", "parse_detectors": "options",
    "from_pytorch_ood": "pytorch_ood",
    "ModelAdapter": "models", "wrap_model": "models", "load_classifier": "classifiers", "randomized_copy": "models",
    "extract_outputs": "capture", "run_detectors": "scoring", "DetectorScores": "scoring",
    "write_evaluation": "write", "EvaluateOptions": "job", "EvaluateResult": "job", "run_evaluate": "job",
    "evaluate": "job", "Evaluation": "job", "table1": "conventions", "release_summary": "conventions",
    "release_results_csv": "conventions", "evaluate_set": "sets", "set_table": "sets",
}
_EXPORTS = {name: f"{__name__}.{module}" for name, module in _MODULES.items()}
__all__ = sorted(_EXPORTS)
__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS)
