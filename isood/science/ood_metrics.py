"""The OOD-detection metric functions over ``(id_scores, ood_scores)``: AUROC, FPR@TPR (three conventions), AUPR
(in and out), AUTC, the human-centric DER and the model-view AUROC_M and ADR, with the checks of their inputs.

Score convention (OpenOOD's): a HIGHER score means MORE in-distribution. Every function here is pure
(arrays in, numbers out). Curves come from scikit-learn (``roc_curve``, ``roc_auc_score``,
``precision_recall_curve``), imported at the first computation (``_sklearn``): it takes seconds to load, and the
metric registry (``metrics.METRICS``) is read by ``isood evaluate``'s option checks, which must answer before
anything heavy loads.

Undefined cases:
- empty inputs, non-finite scores, or mismatched lengths raise ``BadInputError`` (a ``ValueError``; one line,
  what to pass);
- constant scores are well defined (AUROC 0.5, FPR 1.0, AUTC 0.5, ...), no special casing needed;
- metrics that need both classes of a derived label (AUROC_M without any correct or any wrong image,
  ADR with a zero total weight) return ``nan`` as documented on each function.
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np

from isood.core.errors import BadInputError

__all__ = [
    "FPR_CONVENTIONS", "AUTCResult", "auroc", "fpr_at_tpr", "aupr_in", "aupr_out", "autc", "der",
    "der_threshold", "der_at_threshold", "auroc_model", "adr", "check_scores", "check_flags",
]

FPR_CONVENTIONS = ("ood-positive", "openood", "id-positive")
_AUPR_METHODS = ("trapezoid", "average_precision")


def _sklearn():
    """``sklearn.metrics`` (imported at first use; see the module docstring)."""
    import sklearn.metrics

    return sklearn.metrics


# ----------------------------------------------------------------------------------------------- inputs
def check_scores(x, name: str) -> np.ndarray:
    """``x`` as a 1-D float64 array of finite scores; a one-line ``BadInputError`` when empty or non-finite."""
    a = np.asarray(x, dtype=np.float64).ravel()
    if a.size == 0:
        raise BadInputError(f"{name} is empty: pass at least one score")
    if not np.all(np.isfinite(a)):
        bad = int(np.sum(~np.isfinite(a)))
        raise BadInputError(f"{name} has {bad} non-finite value(s) (NaN/inf): drop or fix those images first")
    return a


def check_flags(x, n: int, name: str) -> np.ndarray:
    """``x`` as ``n`` booleans ("correctly classified"); 0/1 accepted."""
    a = np.asarray(x).ravel()
    if a.shape[0] != n:
        raise BadInputError(f"{name} has {a.shape[0]} entries but the scores have {n}: pass one flag per image")
    if a.dtype != bool:
        if not np.all(np.isin(a, (0, 1))):
            raise BadInputError(f"{name} must be boolean (True = correctly classified), got other values")
        a = a.astype(bool)
    return a


def _pair(id_scores, ood_scores) -> tuple[np.ndarray, np.ndarray]:
    return check_scores(id_scores, "id_scores"), check_scores(ood_scores, "ood_scores")


def _labels_and_scores(id_s: np.ndarray, ood_s: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """ID indicator (1 = ID) and the concatenated scores."""
    y = np.concatenate([np.ones(id_s.size, dtype=np.int8), np.zeros(ood_s.size, dtype=np.int8)])
    return y, np.concatenate([id_s, ood_s])


# ------------------------------------------------------------------------------------------ AUROC / FPR
def auroc(id_scores, ood_scores) -> float:
    """Area under the ROC curve (ID vs OOD), computed as OpenOOD v1.5's ``compute_all_metrics`` and the IS-OOD
    release's ``evaluate.py`` compute it: OOD is the positive class, the scores are negated
    (``roc_curve(is_ood, -score)``, ID images first) and the curve is integrated with ``sklearn.metrics.auc``.

    The area does not depend on the positive class, but its last bit does: the ID-positive curve sums other
    trapezoids, and 1 ulp decides how ``'{:.2f}'`` rounds a value at .xx5 (the release's results files). Ties
    count one half (Mann-Whitney U / (n_id n_ood)), so constant scores give 0.5 and perfect separation 1.0.
    """
    id_s, ood_s = _pair(id_scores, ood_scores)
    y, s = _labels_and_scores(id_s, ood_s)
    fprs, tprs, _ = _sklearn().roc_curve(1 - y, -s)
    return float(_sklearn().auc(fprs, tprs))


def fpr_at_tpr(id_scores, ood_scores, tpr: float = 0.95, *, convention: str = "ood-positive") -> float:
    """False-positive rate at the first operating point whose true-positive rate reaches ``tpr`` (FPR@95).

    Three conventions, by name (``FPR_CONVENTIONS``):

    - ``'ood-positive'`` (default; the ``fpr95`` column): OOD is the positive class, detected by a LOW score.
      The fraction of ID images flagged as OOD at the threshold where ``tpr`` of the OOD images are flagged
      (``roc_curve(is_ood, -score, drop_intermediate=False)``: every ROC point kept, exact on tied scores).
    - ``'openood'`` (the ``fpr95_openood`` column): OpenOOD v1.5's ``compute_all_metrics`` number, reproduced
      step by step: the same curve with scikit-learn's default ``drop_intermediate=True``, FPR at the first kept
      point with TPR >= ``tpr``. Dropping collinear points is harmless without ties, but a run of tie groups
      lies on one line and its inner points are dropped, so the first kept point can lie past the exact one:
      on tied scores this overstates the FPR (by up to 0.11 on real detector scores). IS-OOD's code does the same.
    - ``'id-positive'`` (the ``fpr95_id`` column; older papers, e.g. ODIN / Energy): ID is positive. The
      fraction of OOD images accepted as ID at the threshold where ``tpr`` of the ID images are accepted (exact).
    """
    if convention not in FPR_CONVENTIONS:
        raise BadInputError(f"unknown FPR convention {convention!r}: pass one of {', '.join(FPR_CONVENTIONS)}")
    if not 0.0 < float(tpr) <= 1.0:
        raise BadInputError(f"tpr must be in (0, 1], got {tpr}: pass e.g. 0.95")
    id_s, ood_s = _pair(id_scores, ood_scores)
    y_id, s = _labels_and_scores(id_s, ood_s)
    if convention == "id-positive":
        fprs, tprs, _ = _sklearn().roc_curve(y_id, s, drop_intermediate=False)
    else:
        fprs, tprs, _ = _sklearn().roc_curve(1 - y_id, -s, drop_intermediate=convention == "openood")
    if convention == "openood":  # OpenOOD compares without tolerance
        return float(fprs[int(np.argmax(tprs >= float(tpr)))])
    # tprs is non-decreasing and ends at 1.0, so a point reaching ``tpr`` always exists.
    return float(fprs[int(np.argmax(tprs >= float(tpr) - 1e-12))])


# ------------------------------------------------------------------------------------------------- AUPR
def _aupr(y_pos: np.ndarray, s: np.ndarray, method: str) -> float:
    if method not in _AUPR_METHODS:
        raise BadInputError(f"unknown AUPR method {method!r}: pass one of {', '.join(_AUPR_METHODS)}")
    if method == "average_precision":
        return float(_sklearn().average_precision_score(y_pos, s))
    precision, recall, _ = _sklearn().precision_recall_curve(y_pos, s)
    return float(_sklearn().auc(recall, precision))


def aupr_in(id_scores, ood_scores, *, method: str = "trapezoid") -> float:
    """Area under the precision-recall curve with ID as the positive class (score as is).

    ``method='trapezoid'`` (default) integrates ``precision_recall_curve`` with ``sklearn.metrics.auc`` exactly as
    OpenOOD v1.5 does; ``'average_precision'`` uses the step-wise ``average_precision_score``.
    """
    id_s, ood_s = _pair(id_scores, ood_scores)
    y, s = _labels_and_scores(id_s, ood_s)
    return _aupr(y, s, method)


def aupr_out(id_scores, ood_scores, *, method: str = "trapezoid") -> float:
    """Area under the precision-recall curve with OOD as the positive class (score negated); see ``aupr_in``."""
    id_s, ood_s = _pair(id_scores, ood_scores)
    y, s = _labels_and_scores(id_s, ood_s)
    return _aupr(1 - y, -s, method)


# ------------------------------------------------------------------------------------------------- AUTC
class AUTCResult(NamedTuple):
    """AUTC and its two halves; all in [0, 1], lower is better."""

    autc: float
    aufpr: float
    aufnr: float


def autc(id_scores, ood_scores) -> AUTCResult:
    """Area Under the Threshold Curve (Humblot-Renaux et al., "Beyond AUROC & co. for
    evaluating out-of-distribution detection performance", CVPRW 2023).

    OOD scores ``u = -score`` are min-max normalised to [0, 1] over all images (ID and OOD together). With OOD as
    the positive class and an image flagged OOD when ``u >= t``:
    ``FPR(t) = mean_ID [u >= t]``, ``FNR(t) = mean_OOD [u < t]``,
    ``AUFPR = int_0^1 FPR(t) dt``, ``AUFNR = int_0^1 FNR(t) dt``, ``AUTC = (AUFPR + AUFNR) / 2``.

    The integrals are computed exactly: ``int_0^1 [u >= t] dt = u``, hence ``AUFPR = mean_ID(u)`` and
    ``AUFNR = mean_OOD(1 - u)`` (no histogram binning). Perfect separation with the extremes on the right side
    gives 0; constant scores give AUTC 0.5 (then the split is undefined and reported as 0.5 / 0.5).
    """
    id_s, ood_s = _pair(id_scores, ood_scores)
    u_id, u_ood = -id_s, -ood_s
    lo = min(u_id.min(), u_ood.min())
    hi = max(u_id.max(), u_ood.max())
    if hi == lo:
        return AUTCResult(0.5, 0.5, 0.5)
    u_id = (u_id - lo) / (hi - lo)
    u_ood = (u_ood - lo) / (hi - lo)
    aufpr = float(u_id.mean())
    aufnr = float((1.0 - u_ood).mean())
    return AUTCResult((aufpr + aufnr) / 2.0, aufpr, aufnr)


# -------------------------------------------------------------------------------------------------- DER
def der_threshold(train_scores, train_correct, accept_rate: float = 0.95) -> float:
    """Threshold gamma of the human-centric DER (Zhu et al., "Rethinking out-of-distribution detection from a
    human-centric perspective", arXiv:2211.16778): the largest value such that at least ``accept_rate`` of the CORRECTLY
    classified ID *training* images score ``>= gamma`` (i.e. ``ceil(accept_rate * n)`` of them lie above).
    """
    s = check_scores(train_scores, "train_scores")
    c = check_flags(train_correct, s.size, "train_correct")
    if not 0.0 < float(accept_rate) <= 1.0:
        raise BadInputError(f"accept_rate must be in (0, 1], got {accept_rate}: pass 0.95 (DER95) or 0.99 (DER99)")
    kept = np.sort(s[c])
    if kept.size == 0:
        raise BadInputError("no correctly classified training image: DER's threshold needs some (check the labels)")
    k = int(np.ceil(float(accept_rate) * kept.size - 1e-9))
    return float(kept[kept.size - k])


def der(
    id_scores,
    ood_scores,
    *,
    id_correct,
    train_scores,
    train_correct,
    ood_correct=None,
    accept_rate: float = 0.95,
) -> float:
    """Detection error rate DER95 / DER99 (Zhu et al., human-centric OOD evaluation).

    Threshold gamma = ``der_threshold(train_scores, train_correct, accept_rate)`` (95% / 99% of correctly
    classified ID training images lie above). Over all test images (ID test + OOD): positives are images the
    model classifies correctly (``id_correct``; ``ood_correct``, default all False for semantic OOD, may mark
    covariate-shifted images whose label the model still gets right); an image is accepted when
    ``score >= gamma``. ``DER = (FN + FP) / N`` with FN = correct but rejected, FP = wrong but accepted.
    """
    gamma = der_threshold(train_scores, train_correct, accept_rate)
    return der_at_threshold(id_scores, ood_scores, id_correct=id_correct, ood_correct=ood_correct, threshold=gamma)


def der_at_threshold(id_scores, ood_scores, *, id_correct, ood_correct=None, threshold: float) -> float:
    """DER with a given threshold gamma (``der`` computes it from the training scores; per-cell evaluation computes
    it once per detector): ``(FN + FP) / N`` over ID test + OOD, accepted = ``score >= gamma``, positives = the
    correctly classified images."""
    id_s, ood_s = _pair(id_scores, ood_scores)
    id_c = check_flags(id_correct, id_s.size, "id_correct")
    ood_c = np.zeros(ood_s.size, bool) if ood_correct is None else check_flags(ood_correct, ood_s.size, "ood_correct")
    s = np.concatenate([id_s, ood_s])
    c = np.concatenate([id_c, ood_c])
    accepted = s >= float(threshold)
    fn = np.sum(c & ~accepted)
    fp = np.sum(~c & accepted)
    return float((fn + fp) / s.size)


# --------------------------------------------------------------------------------------- model-view
def _model_view(id_scores, ood_scores, id_correct, ood_correct):
    id_s, ood_s = _pair(id_scores, ood_scores)
    id_c = check_flags(id_correct, id_s.size, "id_correct")
    ood_c = np.zeros(ood_s.size, bool) if ood_correct is None else check_flags(ood_correct, ood_s.size, "ood_correct")
    s = np.concatenate([id_s, ood_s])
    c = np.concatenate([id_c, ood_c])
    w = np.concatenate([np.full(id_s.size, 1.0 / id_s.size), np.full(ood_s.size, 1.0 / ood_s.size)])
    return s, c, w


def auroc_model(id_scores, ood_scores, *, id_correct, ood_correct=None) -> float:
    """Model-distribution AUROC_M (Yang et al.; the model view of OOD evaluation, as defined in ARCHITECTURE.md).

    Positives: images the classifier gets right, whatever their source (ID test, or covariate-shifted images via
    ``ood_correct``); negatives: misclassified images and semantic OOD (``ood_correct=None`` means all OOD are
    negatives). Each image is weighted ``1 / |its dataset|`` (``sample_weight`` of ``roc_auc_score``), so the ID
    and the OOD set count equally. Returns ``nan`` when there is no positive or no negative image.
    """
    s, c, w = _model_view(id_scores, ood_scores, id_correct, ood_correct)
    if c.all() or not c.any():
        return float("nan")
    return float(_sklearn().roc_auc_score(c.astype(np.int8), s, sample_weight=w))


def adr(id_scores, ood_scores, *, id_correct, ood_correct=None) -> float:
    """Area under the accuracy-rejection curve (ADR; model view of Yang et al., see ``auroc_model``).

    Images are declared OOD from the lowest score up. For each distinct threshold the curve has a point
    ``(x, y)``: ``x`` = weighted fraction declared OOD, ``y`` = weighted accuracy on the kept images (semantic
    OOD counts as wrong). Weights are ``1 / |its dataset|``. The curve starts at ``x = 0`` (all kept, ``y`` =
    overall weighted accuracy), is extended flat to ``x = 1`` from its last point (only the top-scored tie
    group kept) and integrated with the trapezoid rule. A detector ordering all correct images above all wrong
    ones has the largest area; a random one gives about the overall accuracy. In [0, 1], higher is better.
    """
    s, c, w = _model_view(id_scores, ood_scores, id_correct, ood_correct)
    order = np.argsort(-s, kind="stable")
    s, c, w = s[order], c[order], w[order]
    cw = np.cumsum(w)
    cc = np.cumsum(w * c)
    # keep the top-k for each k that ends a tie group (thresholds are distinct score values)
    ends = np.r_[np.nonzero(np.diff(s))[0], s.size - 1]
    total = cw[-1]
    kept_w = cw[ends]
    acc = cc[ends] / kept_w
    x = 1.0 - kept_w / total
    # x decreases as more is kept: reverse to increasing order, then extend flat to x = 1.
    x, acc = x[::-1], acc[::-1]
    x = np.r_[x, 1.0]
    acc = np.r_[acc, acc[-1]]
    return float(_sklearn().auc(x, acc))
