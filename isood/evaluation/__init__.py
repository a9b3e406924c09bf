"""OOD evaluation per shift cell: detectors (``detectors``), metrics (``metrics``), the one-pass runner
(``runner``), per-cell evaluation of score arrays (``cells``), plots, the HTML/markdown report and the
``isood evaluate`` job.

Bring your own scores (no model needed)::

    from isood.evaluation import evaluate_scores
    result = evaluate_scores(id_scores, ood_scores, images_table, na=cells_table)
    result.per_cell, result.levels, result.summary

``write_evaluation(result, out)`` writes it as an ``evaluation`` manifest with heatmaps and a report.
"""

from .cells import CellEvaluation, evaluate_cells, evaluate_scores, level_curves, summary_table


def __getattr__(name):  # the writer pulls in matplotlib and manifests: import it on first use
    if name == "write_evaluation":
        from .job import write_evaluation

        return write_evaluation
    raise AttributeError(f"module 'isood.evaluation' has no attribute {name!r}")


__all__ = ["CellEvaluation", "evaluate_cells", "evaluate_scores", "level_curves", "summary_table",
           "write_evaluation"]
