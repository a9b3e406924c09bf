"""Per-cell evaluation (isood.science.cells) and what is derived from it (levels): metrics equal the metrics of
the cell's own rows, N/A cells are kept and marked but never averaged, level curves and Table 1 follow their
definitions on hand-made cases."""

from types import SimpleNamespace

import numpy as np
import pandas as pd
import pytest

from isood.science import cells as C
from isood.evaluation import evaluate_scores
from isood.science import levels as L
from isood.evaluation import metrics as M
from isood.science.grid import cell_name

pytestmark = pytest.mark.usefixtures("one_thread")


def _grid_data(seed=0, n=600, levels=3):
    rng = np.random.default_rng(seed)
    cov = rng.integers(0, levels, n)
    sem = rng.integers(0, levels, n)
    ood = rng.normal(-0.7 * sem - 0.2 * cov, 1.0)
    idd = rng.normal(0.0, 1.0, 150)
    images = pd.DataFrame({"path": [f"x/{i}.png" for i in range(n)], "cov_level": cov, "sem_level": sem,
                           "cell": [cell_name(c, s) for c, s in zip(cov, sem)]})
    return rng, idd, ood, images


def test_each_cell_equals_the_metrics_of_its_own_rows():
    rng, idd, ood, images = _grid_data()
    id_c = rng.random(idd.size) < 0.7
    ood_c = rng.random(ood.size) < 0.2
    tr = rng.normal(0.2, 1.0, 300)
    tr_c = rng.random(300) < 0.8
    df = C.evaluate_cells(idd, ood, images, detector="d", dataset="ds", id_correct=id_c, ood_correct=ood_c,
                          train_scores=tr, train_correct=tr_c)
    assert len(df) == 9 and not df["na"].any()
    for rec in df.to_dict("records"):
        sel = ((images["cov_level"] == rec["cov_level"]) & (images["sem_level"] == rec["sem_level"])).to_numpy()
        o = ood[sel]
        assert rec["n"] == sel.sum() and rec["n_id"] == idd.size
        assert rec["auroc"] == pytest.approx(M.auroc(idd, o))
        assert rec["fpr95"] == pytest.approx(M.fpr_at_tpr(idd, o, convention="ood-positive"))
        assert rec["fpr95_openood"] == pytest.approx(M.fpr_at_tpr(idd, o, convention="openood"))
        assert rec["fpr95_id"] == pytest.approx(M.fpr_at_tpr(idd, o, convention="id-positive"))
        assert rec["aupr_in"] == pytest.approx(M.aupr_in(idd, o))
        assert rec["aupr_out"] == pytest.approx(M.aupr_out(idd, o))
        t = M.autc(idd, o)
        assert (rec["autc"], rec["aufpr"], rec["aufnr"]) == pytest.approx((t.autc, t.aufpr, t.aufnr))
        assert rec["auroc_m"] == pytest.approx(M.auroc_model(idd, o, id_correct=id_c, ood_correct=ood_c[sel]))
        assert rec["adr"] == pytest.approx(M.adr(idd, o, id_correct=id_c, ood_correct=ood_c[sel]))
        for name, rate in (("der95", 0.95), ("der99", 0.99)):
            assert rec[name] == pytest.approx(M.der(idd, o, id_correct=id_c, ood_correct=ood_c[sel], train_scores=tr,
                                                    train_correct=tr_c, accept_rate=rate))
    assert set(df["detector"]) == {"d"} and set(df["dataset"]) == {"ds"}


def test_cell_names_work_like_the_images_table():
    _, idd, ood, images = _grid_data(1)
    by_table = C.evaluate_cells(idd, ood, images)
    by_names = C.evaluate_cells(idd, ood, images["cell"].tolist())
    pd.testing.assert_frame_equal(by_table, by_names)


def test_correctness_metrics_only_with_correctness():
    _, idd, ood, images = _grid_data(2)
    df = C.evaluate_cells(idd, ood, images)
    assert not set(M.metric_names(M.CORRECTNESS, M.TRAINING)) & set(df.columns)
    assert list(df.columns[len(C.KEY_COLUMNS):]) == list(M.metric_names(M.SCORES))
    with pytest.raises(ValueError, match="train_scores, train_correct and id_correct"):
        C.evaluate_cells(idd, ood, images, train_scores=idd, train_correct=np.ones(idd.size, bool))


def test_na_cells_are_kept_marked_and_skipped():
    rng = np.random.default_rng(3)
    # cell cov_0_sem_0: 30 images; cov_0_sem_1: 4 images (N/A by count); cov_1_sem_0: 20 images marked N/A
    cov = np.r_[np.zeros(30), np.zeros(4), np.ones(20)].astype(int)
    sem = np.r_[np.zeros(30), np.ones(4), np.zeros(20)].astype(int)
    ood = rng.normal(-1, 1, cov.size)
    idd = rng.normal(0, 1, 50)
    images = pd.DataFrame({"cov_level": cov, "sem_level": sem})
    df = C.evaluate_cells(idd, ood, images, na_cells=["cov_1_sem_0"]).set_index("cell")
    assert df.loc["cov_0_sem_0", "na"] == False  # noqa: E712
    assert df.loc["cov_0_sem_1", "na"] and df.loc["cov_1_sem_0", "na"]
    assert df.loc["cov_0_sem_1", "n"] == 4 and df.loc["cov_1_sem_0", "n"] == 20
    assert np.isnan(df.loc["cov_0_sem_1", "auroc"]) and np.isnan(df.loc["cov_1_sem_0", "fpr95"])
    # the level-0 sem mean is the one measured cell, not averaged with the N/A cell cov_1_sem_0
    curve = L.level_curves(df.reset_index(), "auroc", "sem").set_index("level")
    assert curve.loc[0, "value"] == pytest.approx(df.loc["cov_0_sem_0", "auroc"])
    assert curve.loc[0, "n_cells"] == 1
    assert np.isnan(curve.loc[1, "value"]) and curve.loc[1, "n_cells"] == 0
    # a lower threshold makes the 4-image cell measured
    df3 = C.evaluate_cells(idd, ood, images, na_threshold=3).set_index("cell")
    assert not df3.loc["cov_0_sem_1", "na"] and not np.isnan(df3.loc["cov_0_sem_1", "auroc"])


def test_cells_table_defines_the_grid_and_empty_measured_cells_are_refused():
    rng = np.random.default_rng(4)
    cov = np.zeros(25, int)
    sem = np.r_[np.zeros(12), np.ones(13)].astype(int)
    images = pd.DataFrame({"cov_level": cov, "sem_level": sem})
    idd, ood = rng.normal(size=40), rng.normal(size=25)
    table = pd.DataFrame({"cell": ["cov_0_sem_0", "cov_0_sem_1", "cov_1_sem_1"], "cov_level": [0, 0, 1],
                          "sem_level": [0, 1, 1], "n": [12, 13, 0], "na": [False, False, True]})
    df = C.evaluate_cells(idd, ood, images, cells=table)
    assert list(df["cell"]) == ["cov_0_sem_0", "cov_0_sem_1", "cov_1_sem_1"]
    assert list(df["na"]) == [False, False, True]
    # the manifest says cov_1_sem_1 has 11 measured images but none were scored
    bad = table.assign(n=[12, 13, 11], na=[False, False, False])
    with pytest.raises(C.EmptyCellError, match="detector 'msp', test cell cov_1_sem_1: no image"):
        C.evaluate_cells(idd, ood, images, cells=bad, detector="msp")
    # fewer scores than the manifest lists
    short = table.assign(n=[14, 13, 0])
    with pytest.raises(C.EmptyCellError, match="cov_0_sem_0: 12 scores for the 14 images"):
        C.evaluate_cells(idd, ood, images, cells=short)


def test_bad_inputs_name_the_problem():
    _, idd, ood, images = _grid_data(5)
    with pytest.raises(ValueError, match="one cell per OOD image"):
        C.evaluate_cells(idd, ood[:-1], images)
    with pytest.raises(ValueError, match="cov_.*sem_"):
        C.evaluate_cells(idd, ood[:2], ["cov_0_sem_0", "cell7"])
    bad = ood.copy()
    bad[3] = np.nan
    with pytest.raises(ValueError, match="detector 'k'.*non-finite"):
        C.evaluate_cells(idd, bad, images, detector="k")


def test_level_curves_are_means_over_measured_cells_hand_case():
    per_cell = pd.DataFrame({
        "detector": "d", "dataset": "t",
        "cell": ["cov_0_sem_0", "cov_1_sem_0", "cov_0_sem_1", "cov_1_sem_1", "cov_0_sem_2", "cov_1_sem_2"],
        "cov_level": [0, 1, 0, 1, 0, 1], "sem_level": [0, 0, 1, 1, 2, 2],
        "n": [20, 20, 20, 5, 20, 20], "na": [False, False, False, True, False, False],
        "auroc": [0.5, 0.7, 0.8, np.nan, 0.9, 1.0],
    })
    sem = L.level_curves(per_cell, "auroc", "semantic")
    assert sem["value"].tolist() == pytest.approx([0.6, 0.8, 0.95])
    assert sem["n_cells"].tolist() == [2, 1, 2]
    cov = L.level_curves(per_cell, "auroc", "cov")
    assert cov["value"].tolist() == pytest.approx([(0.5 + 0.8 + 0.9) / 3, (0.7 + 1.0) / 2])
    table = L.summary_table(per_cell).set_index(["axis", "metric"])
    x = np.array([0.6, 0.8, 0.95])
    assert table.loc[("sem", "auroc"), "correlation"] == pytest.approx(np.corrcoef([1, 2, 3], x)[0, 1])
    assert table.loc[("sem", "auroc"), "sensitivity"] == pytest.approx(0.175)  # slope of (0.6, 0.8, 0.95)
    assert table.loc[("cov", "auroc"), "correlation"] == pytest.approx(1.0)
    assert table.loc[("sem", "auroc"), "first"] == 0.6 and table.loc[("sem", "auroc"), "last"] == 0.95
    means = L.detector_means(per_cell).iloc[0]
    assert means["auroc"] == pytest.approx((0.5 + 0.7 + 0.8 + 0.9 + 1.0) / 5)
    assert means["cells"] == 5 and means["cells_na"] == 1
    with pytest.raises(ValueError, match="axis"):
        L.level_curves(per_cell, "auroc", "diagonal")


def test_evaluate_scores_several_detectors_and_curve():
    rng, idd, ood, images = _grid_data(6)
    res = evaluate_scores({"good": idd, "flipped": -idd}, {"good": ood, "flipped": -ood}, images)
    assert res.detectors == ["good", "flipped"]
    good = res.curve("good", "auroc", "sem")
    flipped = res.curve("flipped", "auroc", "sem")
    assert good == pytest.approx(1.0 - flipped)  # AUROC of negated scores
    assert good[-1] > good[0] + 0.2  # OOD scores fall with the semantic level
    t1 = res.summary.set_index(["detector", "axis", "metric"])
    assert t1.loc[("good", "sem", "auroc"), "correlation"] > 0.9
    assert t1.loc[("flipped", "sem", "auroc"), "correlation"] < -0.9
    assert set(res.levels["metric"]) == set(M.metric_names(M.SCORES))
    with pytest.raises(ValueError, match="same keys"):
        evaluate_scores({"a": idd}, {"b": ood}, images)


def test_evaluate_scores_reads_the_grid_of_a_manifest_view():
    """``splits=`` takes the cells table and its threshold (and the images when none are given); the same as
    passing them explicitly. N/A comes from the counts (the table's stored flags are not read)."""
    rng = np.random.default_rng(8)
    cov = np.r_[np.zeros(12), np.zeros(6), np.ones(15)].astype(int)
    sem = np.r_[np.zeros(12), np.ones(6), np.ones(15)].astype(int)
    images = pd.DataFrame({"path": [f"x/{i}.png" for i in range(cov.size)], "cov_level": cov, "sem_level": sem,
                           "cell": [cell_name(c, s) for c, s in zip(cov, sem)]})
    cells = pd.DataFrame({"cell": ["cov_0_sem_0", "cov_0_sem_1", "cov_1_sem_1"], "cov_level": [0, 0, 1],
                          "sem_level": [0, 1, 1], "n": [12, 6, 15], "na": [False, True, False]})
    view = SimpleNamespace(images=images, cells=cells, na_threshold=13)
    idd, ood = rng.normal(size=30), rng.normal(-1, 1, cov.size)
    res = evaluate_scores(idd, ood, splits=view).per_cell.set_index("cell")
    # cov_0_sem_1 has 6 and cov_0_sem_0 12 < 13 images (the view's threshold); cov_1_sem_1 (15) is measured
    assert res["na"].to_dict() == {"cov_0_sem_0": True, "cov_0_sem_1": True, "cov_1_sem_1": False}
    explicit = evaluate_scores(idd, ood, images, cells=cells, na_threshold=13).per_cell.set_index("cell")
    pd.testing.assert_frame_equal(res, explicit)
    # an explicit threshold wins over the view's; na_cells adds marks
    lower = evaluate_scores(idd, ood, images, splits=view, na_threshold=10, na_cells=["cov_1_sem_1"]).per_cell
    assert lower.set_index("cell")["na"].to_dict() == {"cov_0_sem_0": False, "cov_0_sem_1": True, "cov_1_sem_1": True}
    with pytest.raises(ValueError, match="not both"):
        evaluate_scores(idd, ood, images, splits=view, cells=cells)
