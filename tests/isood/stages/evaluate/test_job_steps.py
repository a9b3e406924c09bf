"""The pure steps of `isood evaluate` on frames and arrays (no files): grid rows, precomputed rows, class lists
and labels, the per-cell evaluation of every detector and dataset, the scores and sanity tables, the recorded
config and run details."""

import dataclasses

import numpy as np
import pandas as pd
import pytest

from isood.core.defaults import OOD_LABEL
from isood.evaluation import metrics as M
from isood.stages.evaluate.assemble import (ID_TEST, ID_TRAIN, EvalSet, evaluate_sets, grid_rows, precomputed_rows,
                                       sanity_table, scores_table)
from isood.science.cells import evaluate_cells
from isood.classifiers.classes import class_list, imagenet_1k, labels_for, outputs_labels, wnids_of
from isood.science.detectors import parse_detectors
from isood.stages.evaluate.options import EvaluateOptions
from isood.stages.evaluate.record import run_config, run_meta
from isood.classifiers.scoring import DetectorScores
from isood.science.grid import cell_name

pytestmark = pytest.mark.usefixtures("one_thread")


def _images(spec):
    """An images table: (cov, sem) -> n rows, paths ``c{c}s{s}/{i}.png``."""
    rows = [{"path": f"c{c}s{s}/{i}.png", "wnid": "", "cov_level": c, "sem_level": s, "cell": cell_name(c, s)}
            for (c, s), n in spec.items() for i in range(n)]
    return pd.DataFrame(rows)


def test_grid_rows_keeps_images_in_a_cell():
    images = _images({(0, 0): 3, (1, 0): 2})
    images.loc[1, "sem_level"] = -1  # no cell (e.g. a NaN shift)
    images.loc[3, "cov_level"] = np.nan
    cells = pd.DataFrame({"cell": ["cov_0_sem_0"]})
    kept, same = grid_rows(images, cells, where="m")
    assert kept["path"].tolist() == ["c0s0/0.png", "c0s0/2.png", "c1s0/1.png"] and same is cells
    with pytest.raises(ValueError, match="several sources"):
        grid_rows(images.assign(source=["a", "b", "a", "a", "a"]), cells, where="m")
    with pytest.raises(ValueError, match="no image"):
        grid_rows(images.assign(cov_level=-1), cells, where="m")
    with pytest.raises(ValueError, match="sem_level"):
        grid_rows(images.drop(columns="sem_level"), cells, where="m")


def test_precomputed_rows_map_paths_to_index_rows():
    index = pd.DataFrame({"path": ["a.png", "b.png", "a.png", "c.png"]})
    assert precomputed_rows(index, ["c.png", "a.png", "b.png"], where="t").tolist() == [3, 0, 1]
    with pytest.raises(ValueError, match="zz.png"):
        precomputed_rows(index, ["a.png", "zz.png"], where="t")


def test_class_list_rules():
    ids = ["n02", "n01", "n01", ""]
    assert class_list(ids, 2) == ["n01", "n02"]  # sorted ID wnids when the model has that many classes
    assert class_list(ids, None) == ["n01", "n02"]
    assert class_list(ids, 3, listed=["n09", "n02", "n01"]) == ["n09", "n02", "n01"]  # --classes wins
    with pytest.raises(ValueError, match="--classes"):
        class_list(ids, 4, listed=["n09", "n02", "n01"])
    with pytest.raises(ValueError, match="n02"):
        class_list(ids, 2, listed=["n01", "n07"])
    with pytest.raises(ValueError, match="5"):
        class_list(ids, 5)
    in1k = imagenet_1k()
    assert len(in1k) == 1000 and in1k == sorted(in1k)
    assert class_list(in1k[10:13], 1000) == in1k  # a 1000-class model: ImageNet-1K order


def test_labels_and_wnids():
    classes = ["n01", "n02"]
    assert labels_for(["n02", "n01", "n03"], classes, strict=False, what="t").tolist() == [1, 0, OOD_LABEL]
    with pytest.raises(ValueError, match="n03"):
        labels_for(["n03"], classes, strict=True, what="--id-test")
    by_path = pd.DataFrame({"path": ["x/n01440764/a.JPEG", "places/abbey/x.jpg", "val/n01443537_1.JPEG"]})
    assert wnids_of(by_path) == ["n01440764", "", "n01443537"]
    index = pd.DataFrame({"path": ["a", "b"], "label": [1, 0]})
    assert outputs_labels(index, None, strict=True, what="t").tolist() == [1, 0]
    with pytest.raises(ValueError, match="label"):
        outputs_labels(pd.DataFrame({"path": ["a"]}), None, strict=True, what="t")


@pytest.fixture()
def scored():
    """Scores of two detectors on ID train / ID test / a 2-cell grid dataset, with labels and predictions."""
    rng = np.random.default_rng(0)
    images = _images({(0, 0): 12, (0, 1): 12, (1, 1): 3})
    n = {ID_TRAIN: 40, ID_TEST: 30, "splits": len(images)}
    res = DetectorScores()
    for ds, k in n.items():
        res.labels[ds] = rng.integers(0, 3, k) if ds != "splits" else np.full(k, OOD_LABEL)
        res.predictions[ds] = np.where(rng.random(k) < 0.7, res.labels[ds], 0) if ds != "splits" else \
            rng.integers(0, 3, k)  # a model predicts a class, so semantic OOD is never correct
        for det in ("a", "b"):
            res.scores.setdefault(det, {})[ds] = rng.normal(size=k) - (ds == "splits")
    cells = pd.DataFrame({"cell": ["cov_0_sem_0", "cov_0_sem_1", "cov_1_sem_1"], "cov_level": [0, 0, 1],
                          "sem_level": [0, 1, 1], "n": [12, 12, 3], "na": [False, False, True]})
    sets = {ID_TRAIN: EvalSet(ID_TRAIN, res.labels[ID_TRAIN]),
            ID_TEST: EvalSet(ID_TEST, res.labels[ID_TEST], paths=[f"id/{i}.png" for i in range(30)]),
            "splits": EvalSet("splits", res.labels["splits"], images=images, cells=cells)}
    return res, sets


def test_evaluate_sets_equals_per_cell_evaluation_of_each_detector(scored):
    res, sets = scored
    ev = evaluate_sets(res, sets, ["a", "b"], na_threshold=10, der=True)
    assert ev.detectors == ["a", "b"] and ev.datasets == ["splits"]
    id_c = res.predictions[ID_TEST] == res.labels[ID_TEST]
    direct = evaluate_cells(res.scores["b"][ID_TEST], res.scores["b"]["splits"], sets["splits"].images, detector="b",
                            dataset="splits", id_correct=id_c, ood_correct=np.zeros(27, bool),
                            train_scores=res.scores["b"][ID_TRAIN],
                            train_correct=res.predictions[ID_TRAIN] == res.labels[ID_TRAIN],
                            cells=sets["splits"].cells, na_threshold=10)
    got = ev.per_cell[ev.per_cell["detector"] == "b"].reset_index(drop=True)
    pd.testing.assert_frame_equal(got, direct)
    assert set(M.metric_names()) <= set(got.columns) and got["na"].tolist() == [False, False, True]
    without = evaluate_sets(res, sets, ["a"], na_threshold=10, der=False)
    assert not set(M.metric_names(M.TRAINING)) & set(without.per_cell.columns)


def test_scores_table_one_row_per_scored_image(scored):
    res, sets = scored
    table = scores_table(res, sets)
    assert table["dataset"].value_counts().to_dict() == {ID_TEST: 30, "splits": 27}  # no ID train rows
    grid = table[table["dataset"] == "splits"]
    assert grid["cell"].tolist() == sets["splits"].images["cell"].tolist()
    np.testing.assert_array_equal(grid["a"], res.scores["a"]["splits"])
    idt = table[table["dataset"] == ID_TEST]
    assert (idt["cell"] == "").all() and idt["path"].tolist() == sets[ID_TEST].paths
    np.testing.assert_array_equal(idt["correct"], res.predictions[ID_TEST] == res.labels[ID_TEST])


def test_sanity_table_means_over_measured_cells():
    trained = pd.DataFrame({"detector": "a", "dataset": "s", "na": [False, False, True], "auroc": [0.8, 0.6, np.nan],
                            "auroc_m": [0.7, 0.9, np.nan]})
    random = trained.assign(auroc=[0.5, 0.7, np.nan], auroc_m=[0.5, 0.5, np.nan])
    row = sanity_table(trained, random).iloc[0]
    assert (row["auroc"], row["auroc_random"], row["auroc_m"], row["auroc_m_random"]) == pytest.approx(
        (0.7, 0.6, 0.8, 0.5))


def test_options_are_keyword_only_and_recorded(scored):
    with pytest.raises(TypeError):
        EvaluateOptions("splits")  # noqa
    opts = EvaluateOptions(splits="s", out="o", id_test="t", id_train="r", detectors="msp,knn:k=3")
    with pytest.raises(dataclasses.FrozenInstanceError):
        opts.seed = 1
    dets = parse_detectors(opts.detectors)
    config = run_config(opts, test_root="/data/test", model_name="m", n_classes=3, detectors=dets)
    assert "progress" not in config and config["test_root"] == "/data/test" and config["n_classes"] == 3
    assert config["detector_params"] == {"msp": {"temperature": 1.0}, "knn": {"k": 3}}
    res, _ = scored
    meta = run_meta(opts, model_name="m", detectors=dets, n_id_classes=3, datasets=[ID_TEST, "splits"], scores=res)
    acc = float(np.mean(res.predictions[ID_TEST] == res.labels[ID_TEST]))
    assert meta["accuracy on id_test"] == round(acc, 4) and meta["detectors"] == "msp (temperature=1.0), knn (k=3)"
