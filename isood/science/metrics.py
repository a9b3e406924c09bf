"""The registry of the per-cell OOD metrics, and every metric name in one namespace.

``METRICS`` is the registry of what a per-cell table holds: its keys ARE the table's column names (``auroc``,
``fpr95`` (exact, OOD positive), ``fpr95_openood`` (OpenOOD's procedure), ``fpr95_id``, ``aupr_in``, ``aupr_out``,
``autc``, ``aufpr``, ``aufnr``, ``der95``, ``der99``, ``auroc_m``, ``adr``), each with the function computing it
from one cell's ``CellInputs``, whether lower is better, its label and what it needs (scores only, correctness
flags, or the ID training scores too).

The metric functions live in :mod:`isood.science.ood_metrics` (score convention: a HIGHER score means MORE
in-distribution), the per-level statistics of Table 1 in :mod:`isood.science.level_stats`, the bootstrap in
:mod:`isood.science.bootstrap`; this module's namespace holds them all (``__all__``), which is what the public
``isood.evaluation.metrics`` re-exports.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Mapping, NamedTuple

import numpy as np

from isood.core.errors import BadInputError

from .bootstrap import BOOTSTRAP_METRICS, RESAMPLED_METRICS, bootstrap_replicates, percentile_interval
from .level_stats import CONSTANT_RTOL, is_constant, level_correlation, level_sensitivity
from .ood_metrics import (FPR_CONVENTIONS, AUTCResult, adr, aupr_in, aupr_out, auroc, auroc_model, autc, check_flags,
                          check_scores, der, der_at_threshold, der_threshold, fpr_at_tpr)

__all__ = [
    "FPR_CONVENTIONS", "AUTCResult", "auroc", "fpr_at_tpr", "aupr_in", "aupr_out", "autc", "der",
    "der_threshold", "der_at_threshold", "auroc_model", "adr", "level_correlation", "level_sensitivity",
    "check_scores", "check_flags", "CellInputs", "Metric", "METRICS", "SCORES", "CORRECTNESS", "TRAINING",
    "metric", "metric_names", "metric_label", "lower_is_better", "DER_RATES", "BOOTSTRAP_METRICS",
    "bootstrap_replicates", "percentile_interval", "CONSTANT_RTOL", "is_constant", "RESAMPLED_METRICS",
]


SCORES, CORRECTNESS, TRAINING = "scores", "correctness", "training"
"""What a metric needs: the two score arrays; also the correctness flags (``id_correct``); also the ID training
scores and flags (DER's threshold)."""
DER_RATES = {"der95": 0.95, "der99": 0.99}


class CellInputs(NamedTuple):
    """What the metrics of one grid cell are computed from: the ID test scores, the cell's scores, optional
    correctness flags (``ood_correct`` None = all wrong) and DER thresholds (accept rate -> gamma)."""

    id_scores: np.ndarray
    ood_scores: np.ndarray
    id_correct: np.ndarray | None = None
    ood_correct: np.ndarray | None = None
    der_thresholds: Mapping[float, float] | None = None


@dataclass(frozen=True)
class Metric:
    """One per-cell metric: ``name`` is its column in every table; ``function(CellInputs) -> float``."""

    name: str
    function: Callable[[CellInputs], float]
    lower_is_better: bool
    label: str
    needs: str = SCORES
    bounded: bool = True  # values in [0, 1] (plots use that range)


def _der_metric(rate: float) -> Callable[[CellInputs], float]:
    def compute(c: CellInputs) -> float:
        if c.der_thresholds is None:
            raise BadInputError("DER needs the thresholds of the ID training scores: pass der_thresholds "
                                "(isood.science.cells.der_thresholds)")
        return der_at_threshold(c.id_scores, c.ood_scores, id_correct=c.id_correct, ood_correct=c.ood_correct,
                                threshold=c.der_thresholds[rate])
    return compute


METRICS: dict[str, Metric] = {m.name: m for m in (
    Metric("auroc", lambda c: auroc(c.id_scores, c.ood_scores), False, "AUROC"),
    Metric("fpr95", lambda c: fpr_at_tpr(c.id_scores, c.ood_scores, 0.95), True, "FPR@95"),
    Metric("fpr95_openood", lambda c: fpr_at_tpr(c.id_scores, c.ood_scores, 0.95, convention="openood"), True,
           "FPR@95 (OpenOOD)"),
    Metric("fpr95_id", lambda c: fpr_at_tpr(c.id_scores, c.ood_scores, 0.95, convention="id-positive"), True,
           "FPR@95 (ID positive)"),
    Metric("aupr_in", lambda c: aupr_in(c.id_scores, c.ood_scores), False, "AUPR-In"),
    Metric("aupr_out", lambda c: aupr_out(c.id_scores, c.ood_scores), False, "AUPR-Out"),
    Metric("autc", lambda c: autc(c.id_scores, c.ood_scores).autc, True, "AUTC"),
    Metric("aufpr", lambda c: autc(c.id_scores, c.ood_scores).aufpr, True, "AUFPR"),
    Metric("aufnr", lambda c: autc(c.id_scores, c.ood_scores).aufnr, True, "AUFNR"),
    Metric("der95", _der_metric(DER_RATES["der95"]), True, "DER95", TRAINING),
    Metric("der99", _der_metric(DER_RATES["der99"]), True, "DER99", TRAINING),
    Metric("auroc_m", lambda c: auroc_model(c.id_scores, c.ood_scores, id_correct=c.id_correct,
                                            ood_correct=c.ood_correct), False, "AUROC_M", CORRECTNESS),
    Metric("adr", lambda c: adr(c.id_scores, c.ood_scores, id_correct=c.id_correct, ood_correct=c.ood_correct),
           False, "ADR", CORRECTNESS),
)}
"""The per-cell metrics by column name, in table order (scores-only first)."""


def metric(name: str) -> Metric:
    """The registered metric ``name`` (a one-line error listing the names otherwise)."""
    try:
        return METRICS[name]
    except KeyError:
        raise BadInputError(f"unknown metric {name!r}: pass one of {', '.join(METRICS)}") from None


def metric_names(*needs: str) -> tuple[str, ...]:
    """Metric names in table order, optionally only those whose ``needs`` is among ``needs``."""
    return tuple(n for n, m in METRICS.items() if not needs or m.needs in needs)


def metric_label(name: str) -> str:
    """The display label of a metric (its name when it is not registered)."""
    return METRICS[name].label if name in METRICS else name


def lower_is_better(name: str) -> bool:
    """True for metrics where a lower value is better (FPR, AUTC, DER)."""
    return name in METRICS and METRICS[name].lower_is_better
