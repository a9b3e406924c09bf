"""Metrics against sklearn/scipy and hand-computed cases (score convention: higher = more ID)."""

import numpy as np
import pytest
from scipy import stats
from sklearn.metrics import average_precision_score, roc_auc_score

from isood.evaluation import metrics as M

pytestmark = pytest.mark.usefixtures("one_thread")


def _mann_whitney_auroc(id_s, ood_s):
    d = np.asarray(id_s)[:, None] - np.asarray(ood_s)[None, :]
    return float(np.mean((d > 0) + 0.5 * (d == 0)))


# ------------------------------------------------------------------------------------------ AUROC
def test_auroc_hand_cases():
    assert M.auroc([3, 4], [1, 2]) == 1.0
    assert M.auroc([1, 2], [3, 4]) == 0.0
    assert M.auroc([5, 5, 5], [5, 5]) == 0.5
    # ties count one half: pairs (1,1)=.5 (1,0)=1 (2,1)=1 (2,0)=1 -> 3.5/4
    assert M.auroc([1, 2], [1, 0]) == pytest.approx(0.875)
    assert M.auroc([1.0], [0.0]) == 1.0  # tiny cell: one image each


def test_auroc_matches_pairwise_count_with_many_ties():
    rng = np.random.default_rng(0)
    id_s = rng.integers(0, 5, 60).astype(float)
    ood_s = rng.integers(-2, 3, 40).astype(float)
    assert M.auroc(id_s, ood_s) == pytest.approx(_mann_whitney_auroc(id_s, ood_s), abs=1e-12)


# -------------------------------------------------------------------------------------------- FPR
def test_fpr_conventions_differ_on_hand_case():
    id_s = np.arange(1, 21, dtype=float)  # 1..20
    ood_s = np.array([0.0, 0.0, 0.0, 15.0])
    # OpenOOD: flag all 4 OOD (>= 95% of 4) -> must flag every score <= 15 -> 15 of 20 ID flagged
    assert M.fpr_at_tpr(id_s, ood_s) == pytest.approx(0.75)
    assert M.fpr_at_tpr(id_s, ood_s, convention="openood") == pytest.approx(0.75)
    # ID positive: accept 19 of 20 ID (score >= 2) -> the OOD image at 15 is accepted: 1/4
    assert M.fpr_at_tpr(id_s, ood_s, convention="id-positive") == pytest.approx(0.25)


def test_fpr_perfect_and_constant():
    assert M.fpr_at_tpr([5, 6, 7], [1, 2]) == 0.0
    assert M.fpr_at_tpr([5, 6, 7], [1, 2], convention="id-positive") == 0.0
    assert M.fpr_at_tpr([1, 1, 1], [1, 1]) == 1.0
    assert M.fpr_at_tpr([1, 1, 1], [1, 1], convention="id-positive") == 1.0


def test_fpr_matches_brute_force_threshold_search():
    rng = np.random.default_rng(1)
    id_s = np.round(rng.normal(1, 1, 200), 1)  # rounding creates ties
    ood_s = np.round(rng.normal(0, 1, 150), 1)
    thr = np.unique(np.r_[id_s, ood_s])
    # openood: OOD flagged when score <= t; smallest ID-flag rate over t with OOD recall >= .95
    best = min(np.mean(id_s <= t) for t in thr if np.mean(ood_s <= t) >= 0.95)
    assert M.fpr_at_tpr(id_s, ood_s) == pytest.approx(best)
    best_id = min(np.mean(ood_s >= t) for t in thr if np.mean(id_s >= t) >= 0.95)
    assert M.fpr_at_tpr(id_s, ood_s, convention="id-positive") == pytest.approx(best_id)


def _openood_fpr_by_hand(id_s, ood_s, tpr_th=0.95):
    """OpenOOD v1.5 ``auc_and_fpr_recall``'s FPR, written out: the ROC of ``(is_ood, -conf)`` over the distinct
    thresholds (descending), with scikit-learn's default ``drop_intermediate=True`` rule (keep the first and last
    point and every point where the second difference of the FP or the TP counts is non-zero), a (0, 0) point
    prepended, then the FPR at the first point with TPR >= ``tpr_th``."""
    conf = np.r_[id_s, ood_s].astype(float)
    is_ood = np.r_[np.zeros(len(id_s)), np.ones(len(ood_s))]
    u = -conf
    order = np.argsort(-u, kind="mergesort")
    u, y = u[order], is_ood[order]
    ends = np.r_[np.nonzero(np.diff(u))[0], len(u) - 1]  # last index of each tie group
    tps = np.cumsum(y)[ends]
    fps = ends + 1 - tps
    keep = np.r_[True, (np.diff(fps, 2) != 0) | (np.diff(tps, 2) != 0), True]
    fps, tps = np.r_[0, fps[keep]], np.r_[0, tps[keep]]
    return (fps / fps[-1])[np.argmax(tps / tps[-1] >= tpr_th)]


def test_fpr_openood_convention_reproduces_openood_on_tied_scores():
    # tie groups at 1..10 hold one ID and one OOD image each: the ROC (OOD positive) runs on one diagonal from
    # (0, .5) to (.5, 1). Exact: 19 of 20 OOD flagged at the 9th group -> 9 of 20 ID flagged. OpenOOD's curve
    # drops the inner points of the diagonal -> the first kept point with TPR >= .95 is (.5, 1).
    ood_s = np.r_[np.zeros(10), np.arange(1, 11)]
    id_s = np.r_[np.arange(1, 11), np.full(10, 20.0)]
    assert M.fpr_at_tpr(id_s, ood_s) == pytest.approx(0.45)
    assert M.fpr_at_tpr(id_s, ood_s, convention="ood-positive") == pytest.approx(0.45)
    assert M.fpr_at_tpr(id_s, ood_s, convention="openood") == pytest.approx(0.5) == _openood_fpr_by_hand(id_s, ood_s)
    # random tied scores: 'openood' equals the written-out procedure, and exceeds the exact value somewhere
    rng = np.random.default_rng(5)
    overstated = 0
    for _ in range(200):  # small tie groups over overlapping ranges: some consecutive groups are collinear
        n = int(rng.integers(20, 80))
        id_s = rng.integers(0, 40, n).astype(float)
        ood_s = rng.integers(-15, 25, n).astype(float)
        got = M.fpr_at_tpr(id_s, ood_s, convention="openood")
        assert got == _openood_fpr_by_hand(id_s, ood_s)
        exact = M.fpr_at_tpr(id_s, ood_s)
        assert got >= exact
        overstated += got > exact
    assert overstated > 0
    # without ties the two agree
    id_s, ood_s = rng.normal(1, 1, 300), rng.normal(0, 1, 200)
    assert M.fpr_at_tpr(id_s, ood_s, convention="openood") == M.fpr_at_tpr(id_s, ood_s)


def test_fpr_bad_convention_and_tpr():
    with pytest.raises(ValueError, match="convention"):
        M.fpr_at_tpr([1], [0], convention="ood")
    with pytest.raises(ValueError, match="tpr"):
        M.fpr_at_tpr([1], [0], tpr=95)


# ------------------------------------------------------------------------------------------- AUPR
def test_aupr_against_sklearn_and_perfect():
    rng = np.random.default_rng(2)
    id_s, ood_s = rng.normal(1, 1, 80), rng.normal(0, 1, 50)
    y = np.r_[np.ones(80), np.zeros(50)]
    s = np.r_[id_s, ood_s]
    assert M.aupr_in(id_s, ood_s, method="average_precision") == pytest.approx(average_precision_score(y, s))
    assert M.aupr_out(id_s, ood_s, method="average_precision") == pytest.approx(
        average_precision_score(1 - y, -s))
    # trapezoid (OpenOOD) differs from AP but stays close on continuous scores
    assert abs(M.aupr_in(id_s, ood_s) - average_precision_score(y, s)) < 0.02
    assert M.aupr_in([3, 4], [1, 2]) == 1.0 and M.aupr_out([3, 4], [1, 2]) == 1.0
    # all-negative ranking: AUPR-in of a reversed detector is low
    assert M.aupr_in([1, 2], [3, 4], method="average_precision") == pytest.approx(
        average_precision_score([1, 1, 0, 0], [1, 2, 3, 4]))


# ------------------------------------------------------------------------------------------- AUTC
def test_autc_hand_case():
    # u = -score -> id u = [-1, -.5], ood u = [0, -.5]; normalised: id [0, .5], ood [1, .5]
    r = M.autc([1.0, 0.5], [0.0, 0.5])
    assert r.aufpr == pytest.approx(0.25)
    assert r.aufnr == pytest.approx(0.25)
    assert r.autc == pytest.approx(0.25)
    assert M.autc([2.0, 2.0], [-1.0, -1.0]).autc == 0.0  # perfect separation at the extremes
    assert M.autc([1.0, 1.0], [1.0]).autc == 0.5  # constant scores


def test_autc_equals_numeric_integral_of_threshold_curves():
    rng = np.random.default_rng(3)
    id_s, ood_s = rng.normal(2, 1, 70), rng.normal(0, 1.5, 40)
    u = -np.r_[id_s, ood_s]
    u = (u - u.min()) / (u.max() - u.min())
    u_id, u_ood = u[:70], u[70:]
    t = np.linspace(0, 1, 200001)
    fpr = np.array([np.mean(u_id >= x) for x in t[::100]])
    fnr = np.array([np.mean(u_ood < x) for x in t[::100]])
    aufpr, aufnr = np.trapezoid(fpr, t[::100]), np.trapezoid(fnr, t[::100])
    r = M.autc(id_s, ood_s)
    assert r.aufpr == pytest.approx(aufpr, abs=2e-3)
    assert r.aufnr == pytest.approx(aufnr, abs=2e-3)
    assert r.autc == pytest.approx((aufpr + aufnr) / 2, abs=2e-3)


# -------------------------------------------------------------------------------------------- DER
def test_der_threshold_and_hand_case():
    train = np.arange(1, 21, dtype=float)  # 20 correct training images
    assert M.der_threshold(train, np.ones(20, bool), 0.95) == 2.0  # 19 of 20 lie at or above 2
    assert M.der_threshold(train, np.ones(20, bool), 0.99) == 1.0  # needs all 20
    # a wrong training image is ignored for the threshold
    correct = np.ones(20, bool)
    correct[1] = False  # drop the score 2 -> 19 correct, ceil(.95*19)=19 -> all of them -> gamma = 1
    assert M.der_threshold(train, correct, 0.95) == 1.0
    # test: ID scores [5, 1.5, 3, 0] correct [T, T, F, F]; OOD [2.5, 0.5] (wrong); gamma = 2
    # accepted: 5, 3, 2.5 -> FN: 1.5 (correct, rejected); FP: 3 (wrong, accepted), 2.5 (OOD accepted)
    d = M.der([5, 1.5, 3, 0], [2.5, 0.5], id_correct=[True, True, False, False],
              train_scores=train, train_correct=np.ones(20, bool), accept_rate=0.95)
    assert d == pytest.approx(3 / 6)
    # a covariate-shifted OOD image the model still gets right is a positive: 2.5 accepted -> no longer FP
    d2 = M.der([5, 1.5, 3, 0], [2.5, 0.5], id_correct=[True, True, False, False], ood_correct=[True, False],
               train_scores=train, train_correct=np.ones(20, bool))
    assert d2 == pytest.approx(2 / 6)


def test_der_errors():
    with pytest.raises(ValueError, match="correctly classified"):
        M.der_threshold([1, 2], [False, False])
    with pytest.raises(ValueError, match="id_correct"):
        M.der([1, 2], [0], id_correct=[True], train_scores=[1], train_correct=[True])


# ------------------------------------------------------------------------------- AUROC_M and ADR
def test_auroc_model_weighting_equals_replication():
    rng = np.random.default_rng(4)
    id_s, ood_s = rng.normal(1, 1, 30), rng.normal(0, 1, 60)
    id_c = rng.random(30) < 0.7
    ood_c = rng.random(60) < 0.2  # covariate-shifted images partly classified correctly
    # weights 1/30 vs 1/60 == each ID image counted twice, unweighted
    s = np.r_[id_s, id_s, ood_s]
    y = np.r_[id_c, id_c, ood_c].astype(int)
    assert M.auroc_model(id_s, ood_s, id_correct=id_c, ood_correct=ood_c) == pytest.approx(roc_auc_score(y, s))
    # and it differs from the unweighted one here
    y1 = np.r_[id_c, ood_c].astype(int)
    assert abs(roc_auc_score(y1, np.r_[id_s, ood_s]) - roc_auc_score(y, s)) > 1e-4


def test_auroc_model_hand_case_and_nan():
    # ID: scores [3, 1] correct [T, F] (weight 1/2 each); OOD semantic [2] (weight 1)
    # pairs pos(3, w .5) vs negs 1 (w .5) and 2 (w 1): all ranked right -> 1.0
    assert M.auroc_model([3, 1], [2], id_correct=[True, False]) == 1.0
    # pos 2 (w .5) vs negs 3 (w .5, above) and 0 (w 1, below): (1*.5*1) / (.5*1.5) = 2/3
    assert M.auroc_model([2, 3], [0], id_correct=[True, False]) == pytest.approx(2 / 3)
    assert np.isnan(M.auroc_model([1, 2], [0], id_correct=[False, False]))


def test_adr_hand_case():
    # weights: ID 1/3 each, OOD 1; order 3(T) 2(T) 1(F) 0(F, OOD)
    # points (x, acc): (0, 1/3) (1/2, 2/3) (2/3, 1) (5/6, 1) -> extended (1, 1); area 13/18
    v = M.adr([3, 2, 1], [0], id_correct=[True, True, False])
    assert v == pytest.approx(13 / 18)


def test_adr_perfect_beats_reversed_and_random_near_accuracy():
    rng = np.random.default_rng(5)
    n = 4000
    id_c = rng.random(n) < 0.6
    good = np.where(id_c, 1.0, 0.0) + rng.random(n) * 0.1
    bad = -good
    ood = rng.normal(-5, 0.1, n)
    assert M.adr(good, ood, id_correct=id_c) > M.adr(bad, -ood, id_correct=id_c)
    rand = M.adr(rng.random(n), rng.random(n), id_correct=id_c)
    assert rand == pytest.approx(0.3, abs=0.03)  # weighted accuracy: (0.6*1/n*n + 0) / 2


# ---------------------------------------------------------------------------------------- levels
def test_level_statistics_vs_scipy_with_na_levels():
    x = [0.55, 0.61, np.nan, 0.70, 0.69, 0.80, np.nan, 0.91]
    i = np.array([1, 2, 4, 5, 6, 8], float)
    xv = np.array([0.55, 0.61, 0.70, 0.69, 0.80, 0.91])
    assert M.level_correlation(x) == pytest.approx(stats.pearsonr(i, xv)[0])
    assert M.level_sensitivity(x) == pytest.approx(abs(stats.linregress(i, xv).slope))
    # decreasing metric: negative correlation, sensitivity still positive
    assert M.level_correlation([5, 4, 3, 2]) == pytest.approx(-1.0)
    assert M.level_sensitivity([5, 4, 3, 2]) == pytest.approx(1.0)


def test_level_statistics_undefined_cases():
    assert np.isnan(M.level_correlation([0.5, np.nan, np.nan]))
    assert np.isnan(M.level_sensitivity([np.nan, 0.7]))
    assert np.isnan(M.level_correlation([0.5, 0.5, 0.5]))
    assert M.level_sensitivity([0.5, 0.5, 0.5]) == 0.0
    with pytest.raises(ValueError, match="empty"):
        M.level_correlation([])


# ---------------------------------------------------------------------------------------- inputs
@pytest.mark.parametrize("fn", [M.auroc, M.aupr_in, M.aupr_out, M.fpr_at_tpr, M.autc])
def test_bad_inputs_raise_one_line_errors(fn):
    with pytest.raises(ValueError, match="ood_scores is empty"):
        fn([1.0, 2.0], [])
    with pytest.raises(ValueError, match="non-finite"):
        fn([1.0, np.nan], [0.0])


# -------------------------------------------------------------------------------------- registry
def test_registry_names_are_the_table_columns_and_match_the_functions():
    assert list(M.METRICS) == ["auroc", "fpr95", "fpr95_openood", "fpr95_id", "aupr_in", "aupr_out", "autc",
                               "aufpr", "aufnr",
                               "der95", "der99", "auroc_m", "adr"]
    rng = np.random.default_rng(7)
    idd, ood = rng.normal(1, 1, 50), rng.normal(0, 1, 30)
    id_c, ood_c = rng.random(50) < 0.7, rng.random(30) < 0.2
    tr, tr_c = rng.normal(1, 1, 80), rng.random(80) < 0.8
    gammas = {r: M.der_threshold(tr, tr_c, r) for r in (0.95, 0.99)}
    cell = M.CellInputs(idd, ood, id_c, ood_c, gammas)
    t = M.autc(idd, ood)
    expected = {
        "auroc": M.auroc(idd, ood), "fpr95": M.fpr_at_tpr(idd, ood, convention="ood-positive"),
        "fpr95_openood": M.fpr_at_tpr(idd, ood, convention="openood"),
        "fpr95_id": M.fpr_at_tpr(idd, ood, convention="id-positive"), "aupr_in": M.aupr_in(idd, ood),
        "aupr_out": M.aupr_out(idd, ood), "autc": t.autc, "aufpr": t.aufpr, "aufnr": t.aufnr,
        "der95": M.der(idd, ood, id_correct=id_c, ood_correct=ood_c, train_scores=tr, train_correct=tr_c,
                       accept_rate=0.95),
        "der99": M.der(idd, ood, id_correct=id_c, ood_correct=ood_c, train_scores=tr, train_correct=tr_c,
                       accept_rate=0.99),
        "auroc_m": M.auroc_model(idd, ood, id_correct=id_c, ood_correct=ood_c),
        "adr": M.adr(idd, ood, id_correct=id_c, ood_correct=ood_c),
    }
    for name, m in M.METRICS.items():
        assert m.name == name
        assert m.function(cell) == pytest.approx(expected[name])
    # lower is better exactly for the error rates and areas under error curves
    assert {n for n in M.METRICS if M.lower_is_better(n)} == {"fpr95", "fpr95_openood", "fpr95_id", "autc", "aufpr",
                                                              "aufnr", "der95", "der99"}
    assert M.metric_names(M.SCORES) == ("auroc", "fpr95", "fpr95_openood", "fpr95_id", "aupr_in", "aupr_out",
                                        "autc", "aufpr", "aufnr")
    assert M.metric_names(M.CORRECTNESS) == ("auroc_m", "adr") and M.metric_names(M.TRAINING) == ("der95", "der99")
    with pytest.raises(ValueError, match="nope"):
        M.metric("nope")
