"""The demo's evaluation stage on the planted world: MSP's AUROC rises with the semantic level.

The splits manifest comes from the real `build-splits` path on the planted features, with the ideal LAID map
(W = the planted mixing matrix; fitting LAID is tested in tests/isood/test_demo.py and takes much longer).

Documented thresholds (measured on seeds 0, 1, 2 with all 7 demo detectors: Spearman of MSP's per-level AUROC with
the measured semantic level 0.976-0.994, level-7 minus level-0 AUROC 0.39-0.42; per planted level Spearman
0.976-0.994, rise 0.48-0.50): Spearman >= 0.9 and a rise >= 0.3, on both the measured and the planted levels.
"""

import numpy as np
import pytest
from scipy.stats import spearmanr

import manifests
from isood.demo import write_planted_features
from isood.evaluation.planted import evaluate_planted, planted_table
from isood.laid import LAID
from isood.stages.splits import BuildConfig, build_splits
from isood.simulate import make_planted_world


@pytest.fixture(scope="module")
def planted(tmp_path_factory):
    out = tmp_path_factory.mktemp("planted-eval")
    world = make_planted_world(seed=0)
    id_dir, test_dir = write_planted_features(world, out / "world")
    laid = LAID(world.mixing).save(out / "world" / "laid.safetensors")
    splits = build_splits(BuildConfig(id=str(id_dir), test=str(test_dir), laid=str(laid), out=str(out / "splits"),
                                      progress=False)).manifest
    ev = evaluate_planted(world, splits, out / "evaluation", seed=0, detectors=("msp", "energy", "knn", "mds"),
                          plot_metrics=("auroc",))
    return out, world, splits, ev


def test_msp_auroc_rises_with_the_semantic_level(planted):
    _, _, _, ev = planted
    curve = ev.msp_by_level()
    assert len(curve) == 8
    for col in ("measured", "planted"):
        x = curve[col].to_numpy()
        assert spearmanr(np.arange(8), x).statistic >= 0.9, (col, x)
        assert x[7] >= x[0] + 0.3, (col, x)
    # the measured curve is the mean over each level's measured cells of the per-cell table
    per_cell = ev.evaluation.per_cell.query("detector == 'msp' and not na")
    assert curve["measured"].iloc[3] == pytest.approx(per_cell.loc[per_cell["sem_level"] == 3, "auroc"].mean())


def test_classifier_is_accurate_and_cells_follow_the_manifest(planted):
    _, world, splits, ev = planted
    assert ev.accuracy["id_test"] >= 0.9
    cells = splits.cells
    per_cell = ev.evaluation.per_cell.query("detector == 'energy'")
    assert sorted(per_cell["cell"]) == sorted(cells["cell"])
    merged = per_cell.merge(cells, on="cell", suffixes=("", "_m"))
    assert (merged["n"] == merged["n_m"]).all() and (merged["na"] == merged["na_m"]).all()
    # Table 1 semantic AUROC correlation of MSP is strongly positive
    t1 = ev.evaluation.summary.query("detector == 'msp' and metric == 'auroc' and axis == 'sem'")
    assert t1["correlation"].iloc[0] >= 0.8


def test_planted_evaluation_manifest(planted):
    out, _, _, ev = planted
    assert manifests.verify(out / "evaluation").ok
    m = manifests.read(out / "evaluation", kind="evaluation")
    files = {r["path"] for r in m.meta["files"]}
    assert {"report.html", "summary.md", "plots/heatmap_splits_msp_auroc.png", "plots/levels_splits_sem_auroc.png"} <= files
    assert m.meta["summary"]["msp_auroc_by_planted_sem_level"] == pytest.approx(
        ev.planted_auroc.loc["msp"].round(4).tolist())
    table = planted_table(ev)
    assert table.row_count == 8
