"""OOD-detection metrics over ``(id_scores, ood_scores)``, and the registry of the per-cell metrics.

Score convention (OpenOOD's): a HIGHER score means MORE in-distribution. Every function here is pure
(arrays in, numbers out). Curves come from scikit-learn (``roc_curve``, ``roc_auc_score``,
``precision_recall_curve``), imported at the first computation (``_sklearn``): it takes seconds to load, and the
registry below is read by ``isood evaluate``'s option checks, which must answer before anything heavy loads.

``METRICS`` is the registry of what a per-cell table holds: its keys ARE the table's column names (``auroc``,
``fpr95`` (exact, OOD positive), ``fpr95_openood`` (OpenOOD's procedure), ``fpr95_id``, ``aupr_in``, ``aupr_out``,
``autc``, ``aufpr``, ``aufnr``, ``der95``, ``der99``, ``auroc_m``, ``adr``), each with the function computing it
from one cell's ``CellInputs``, whether lower is better, its label and what it needs (scores only, correctness
flags, or the ID training scores too).

Undefined cases:
- empty inputs, non-finite scores, or mismatched lengths raise ``BadInputError`` (a ``ValueError``; one line,
  what to pass);
- constant scores are well defined (AUROC 0.5, FPR 1.0, AUTC 0.5, ...), no special casing needed;
- metrics that need both classes of a derived label (AUROC_M without any correct or any wrong image,
  ADR with a zero total weight) return ``nan`` as documented on each function;
- per-level statistics return ``nan`` when fewer than two levels are available (or when the values are
  constant, for the Pearson correlation).
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass
from typing import Callable, Mapping, NamedTuple, Sequence

import numpy as np

from isood.core.errors import BadInputError

__all__ = [
    "FPR_CONVENTIONS", "AUTCResult", "auroc", "fpr_at_tpr", "aupr_in", "aupr_out", "autc", "der",
    "der_threshold", "der_at_threshold", "auroc_model", "adr", "level_correlation", "level_sensitivity",
    "check_scores", "check_flags", "CellInputs", "Metric", "METRICS", "SCORES", "CORRECTNESS", "TRAINING",
    "metric", "metric_names", "metric_label", "lower_is_better", "DER_RATES", "BOOTSTRAP_METRICS",
    "bootstrap_replicates", "percentile_interval", "CONSTANT_RTOL", "is_constant", "RESAMPLED_METRICS",
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


# --------------------------------------------------------------------------------------- bootstrap
BOOTSTRAP_METRICS = ("auroc", "fpr95")
"""What ``bootstrap_replicates`` resamples by default (Table 1's: AUROC and FPR@95, OOD positive)."""
RESAMPLED_METRICS = BOOTSTRAP_METRICS + ("fpr95_openood",)
"""Every metric ``bootstrap_replicates`` can resample (also OpenOOD's FPR@95, the release convention's)."""
_CHUNK_ELEMENTS = 1 << 22  # replicates are computed in chunks of at most this many (replicate, image) pairs


def _draws(rng: np.random.Generator, n: int, rows: int) -> np.ndarray:
    """``rows`` bootstrap resamples of ``n`` items as counts (rows x n): row r counts how often each item is
    drawn by ``rng.integers(0, n, n)`` (one call per replicate, so a chunk never changes the stream)."""
    return np.stack([np.bincount(rng.integers(0, n, n), minlength=n) for _ in range(rows)]).astype(np.float64)


def bootstrap_replicates(id_scores, ood_groups: Sequence, *, n_boot: int = 1000, seed: int = 0,
                         metrics: Sequence[str] = BOOTSTRAP_METRICS) -> dict[str, np.ndarray]:
    """Bootstrap replicates of AUROC and FPR@95 (``fpr_at_tpr``'s exact OOD-positive convention; with
    ``metrics`` any of ``RESAMPLED_METRICS``, also ``fpr95_openood``, OpenOOD's procedure) of one ID set
    against each OOD group (e.g. the cells of a grid), resampling the ID set and every group with replacement.

    ``id_scores``: ``(n_id,)`` or ``(D, n_id)`` (D detectors scored on the same images: they share every
    resample); ``ood_groups``: per group ``(n_g,)`` or ``(D, n_g)``. Returns ``{metric: (G, n_boot)}`` (or
    ``(D, G, n_boot)`` for 2-D input).

    The draws, a contract a reference can repeat: replicate ``r`` resamples the ID set by
    ``rng_0.integers(0, n_id, n_id)`` and group ``g`` by ``rng_{g+1}.integers(0, n_g, n_g)``, where
    ``rng_k = numpy.random.default_rng([seed, k])`` and the generators advance one call per replicate, in
    replicate order. One ID resample per replicate serves every group (a replicate of a whole grid, which level
    means and Table 1 need). Each replicate's value equals the metric computed on the resampled arrays (ties
    count one half for AUROC), computed from counts in O(n) per replicate after one sort. Deterministic for a
    seed, whatever the chunking."""
    unknown = [m for m in metrics if m not in RESAMPLED_METRICS]
    if unknown:
        raise BadInputError(f"cannot bootstrap {', '.join(unknown)}: pass some of {', '.join(RESAMPLED_METRICS)}")
    if isinstance(n_boot, bool) or not isinstance(n_boot, (int, np.integer)) or n_boot < 1:
        raise BadInputError(f"n_boot must be an integer >= 1, got {n_boot!r}")
    one = np.ndim(id_scores) == 1
    id_s = np.atleast_2d(np.asarray(id_scores, dtype=np.float64))
    for row in id_s:
        check_scores(row, "id_scores")
    groups = [np.atleast_2d(np.asarray(g, dtype=np.float64)) for g in ood_groups]
    for i, g in enumerate(groups):
        if g.shape[0] != id_s.shape[0]:
            raise BadInputError(f"ood group {i} has {g.shape[0]} detector rows but id_scores {id_s.shape[0]}")
        for row in g:
            check_scores(row, f"ood group {i}")
    d, n_id = id_s.shape
    id_order = np.argsort(id_s, axis=1, kind="stable")
    id_sorted = np.take_along_axis(id_s, id_order, axis=1)
    prep = []  # per group and detector: AUROC positions (lo, hi), FPR order and positions, distinct OOD values
    for g in groups:
        per = []
        for k in range(d):
            order = np.argsort(g[k], kind="stable")
            values, starts = np.unique(g[k][order], return_index=True)
            per.append((np.searchsorted(id_sorted[k], g[k], "left"), np.searchsorted(id_sorted[k], g[k], "right"),
                        order, np.searchsorted(id_sorted[k], g[k][order], "right"),
                        (starts, np.searchsorted(id_sorted[k], values, "left"),
                         np.searchsorted(id_sorted[k], values, "right"))))
        prep.append(per)
    out = {m: np.empty((d, len(groups), int(n_boot))) for m in metrics}
    rng_id = np.random.default_rng([seed, 0])
    rngs = [np.random.default_rng([seed, i + 1]) for i in range(len(groups))]
    largest = max([n_id, *(g.shape[1] for g in groups)])
    chunk = max(1, min(int(n_boot), _CHUNK_ELEMENTS // largest))
    rows = np.arange(chunk)
    for start in range(0, int(n_boot), chunk):
        b = min(chunk, int(n_boot) - start)
        id_counts = _draws(rng_id, n_id, b)
        cum_id = []
        for k in range(d):
            c = np.zeros((b, n_id + 1))
            np.cumsum(id_counts[:, id_order[k]], axis=1, out=c[:, 1:])
            cum_id.append(c)
        for gi, g in enumerate(groups):
            n_g = g.shape[1]
            counts = _draws(rngs[gi], n_g, b)
            for k, (lo, hi, order, pos, distinct) in enumerate(prep[gi]):
                c = cum_id[k]
                if "auroc" in out:
                    above = n_id - 0.5 * (c[:, hi] + c[:, lo])  # ID above each OOD score, ties one half
                    out["auroc"][k, gi, start:start + b] = (counts * above).sum(axis=1) / (n_id * n_g)
                if "fpr95" in out:
                    tpr = np.cumsum(counts[:, order], axis=1) / n_g
                    first = np.argmax(tpr >= 0.95 - 1e-12, axis=1)  # the first OOD score reaching 95% TPR
                    out["fpr95"][k, gi, start:start + b] = c[rows[:b], pos[first]] / n_id
                if "fpr95_openood" in out:
                    out["fpr95_openood"][k, gi, start:start + b] = _openood_fpr(counts[:, order], c, distinct,
                                                                                n_id, n_g)
    return {m: (v[0] if one else v) for m, v in out.items()}


def _openood_fpr(ood_counts: np.ndarray, cum_id: np.ndarray, distinct: tuple, n_id: int, n_g: int) -> np.ndarray:
    """``fpr_at_tpr(convention='openood')`` of each replicate (row) from counts: ``ood_counts`` (rows x OOD images
    in ascending score order), ``cum_id`` (rows x n_id + 1: cumulative ID counts in ascending score order) and
    ``distinct`` (the start of each distinct OOD score in that order, and its ID positions left / right).

    ``roc_curve(is_ood, -score)`` has one point per distinct score drawn at least once, ascending; its default
    ``drop_intermediate`` drops a point whose increment (ID drawn, OOD drawn at that score) equals the next
    point's (neither the first nor the last). The first point reaching 95% TPR is an OOD score; OpenOOD reads the
    FPR at the first kept point from there: the end of the run of equal increments that starts at it, with no ID
    score drawn in between."""
    starts, lo, hi = distinct
    rows = np.arange(ood_counts.shape[0])
    o = np.add.reduceat(ood_counts, starts, axis=1)  # OOD drawn per distinct score
    a = cum_id[:, hi] - cum_id[:, lo]  # ID drawn at each of those scores (ties)
    cum_o = np.cumsum(o, axis=1)
    k = np.argmax(cum_o / n_g >= 0.95, axis=1)
    n_values = o.shape[1]
    present = np.where((o + a) > 0, np.arange(n_values), n_values)
    following = np.minimum.accumulate(present[:, ::-1], axis=1)[:, ::-1]  # next drawn score at or after each
    following = np.concatenate([following[:, 1:], np.full((len(rows), 1), n_values)], axis=1)
    first = (cum_id[rows, lo[k]] == 0) & (cum_o[rows, k] == o[rows, k])  # no point before it: always kept
    active = ~first
    while active.any():
        nxt = following[rows, k]
        ok = active & (nxt < n_values)
        nxt = np.where(ok, nxt, k)
        between = cum_id[rows, lo[nxt]] - cum_id[rows, hi[k]]  # ID drawn strictly between the two scores
        same = ok & (between == 0) & (o[rows, nxt] == o[rows, k]) & (a[rows, nxt] == a[rows, k])
        k = np.where(same, nxt, k)
        active = same
    return cum_id[rows, hi[k]] / n_id


def percentile_interval(replicates, level: float = 0.95, axis: int = -1) -> tuple[np.ndarray, np.ndarray]:
    """The percentile bootstrap interval of ``replicates`` along ``axis``: the ``(1 - level) / 2`` and
    ``(1 + level) / 2`` quantiles (``numpy.quantile``, linear interpolation); NaN replicates are ignored, an
    all-NaN slice gives NaN."""
    if not 0.0 < float(level) < 1.0:
        raise BadInputError(f"interval level must be in (0, 1), got {level}: pass e.g. 0.95")
    r = np.asarray(replicates, dtype=np.float64)
    q = [(1.0 - float(level)) / 2.0, (1.0 + float(level)) / 2.0]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # an all-NaN slice: NaN, as documented
        low, high = np.nanquantile(r, q, axis=axis)
    return low, high


# --------------------------------------------------------------------------------------- per level
def _levels(values_per_level: Sequence[float] | np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    x = np.asarray(values_per_level, dtype=np.float64).ravel()
    if x.size == 0:
        raise BadInputError("values_per_level is empty: pass one value per level (NaN for an N/A level)")
    i = np.arange(1, x.size + 1, dtype=np.float64)
    keep = np.isfinite(x)
    return i[keep], x[keep]


def level_correlation(values_per_level: Sequence[float] | np.ndarray) -> float:
    """Pearson correlation between a per-level metric ``x_i`` and the level index ``i = 1..n``
    (IS-OOD; ARCHITECTURE.md).

    ``values_per_level[j]`` is the metric of level ``j + 1`` (mean over its non-N/A cells); NaN marks an N/A
    level and is skipped (the other levels keep their index). Returns ``nan`` with fewer than two levels or
    values constant up to ``CONSTANT_RTOL`` (``is_constant``: the correlation is undefined; a mean over 7 and one
    over 8 identical cells may differ in the last bit, and Pearson's r of such a curve is noise, up to +-0.65).
    """
    i, x = _levels(values_per_level)
    if x.size < 2 or is_constant(x):
        return float("nan")
    return float(np.corrcoef(i, x)[0, 1])


CONSTANT_RTOL = 1e-12
"""A level curve whose values spread by no more than this, relative to their magnitude, is constant."""


def is_constant(values, axis: int = 0):
    """Whether ``values`` are constant along ``axis`` up to rounding: ``max - min <= CONSTANT_RTOL * max|x|``
    (exactly equal values included; an all-zero curve is constant). A bool, or an array of them for 2-D input."""
    x = np.asarray(values, dtype=np.float64)
    spread = x.max(axis=axis) - x.min(axis=axis)
    return spread <= CONSTANT_RTOL * np.abs(x).max(axis=axis)


def level_sensitivity(values_per_level: Sequence[float] | np.ndarray) -> float:
    """``|slope|`` of the least-squares line of the per-level metric ``x_i`` on the level ``i = 1..n``
    (IS-OOD; ARCHITECTURE.md): ``|sum (i - mean i)(x_i - mean x) / sum (i - mean i)^2|``. NaN levels are skipped;
    ``nan`` with fewer than two levels."""
    i, x = _levels(values_per_level)
    if x.size < 2:
        return float("nan")
    di = i - i.mean()
    return float(abs(np.dot(di, x - x.mean()) / np.dot(di, di)))


# ------------------------------------------------------------------------------------------ registry
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
