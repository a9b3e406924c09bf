"""The demo's evaluation stage on the planted world: MSP's AUROC rises with the semantic level.

The evaluation (tests/conftest.py's `planted_evaluation`, shared with tests/isood/report) runs on a splits manifest from
the real `build-splits` path on the planted features, with the ideal LAID map (W = the planted mixing matrix;
fitting LAID is tested in tests/isood/dev/test_demo.py and takes much longer).

Documented thresholds (measured on seeds 0, 1, 2 with all 7 demo detectors: Spearman of MSP's per-level AUROC with
the measured semantic level 0.976-0.994, level-7 minus level-0 AUROC 0.39-0.42; per planted level Spearman
0.976-0.994, rise 0.48-0.50): Spearman >= 0.9 and a rise >= 0.3, on both the measured and the planted levels.
"""

import numpy as np
import pytest
from scipy.stats import spearmanr

import manifests
from isood.dev.planted import planted_table

pytestmark = pytest.mark.usefixtures("one_thread")


def test_msp_auroc_rises_with_the_semantic_level(planted_evaluation):
    _, _, _, ev = planted_evaluation
    curve = ev.msp_by_level()
    assert len(curve) == 8
    for col in ("measured", "planted"):
        x = curve[col].to_numpy()
        assert spearmanr(np.arange(8), x).statistic >= 0.9, (col, x)
        assert x[7] >= x[0] + 0.3, (col, x)
    # the measured curve is the mean over each level's measured cells of the per-cell table
    per_cell = ev.evaluation.per_cell.query("detector == 'msp' and not na")
    assert curve["measured"].iloc[3] == pytest.approx(per_cell.loc[per_cell["sem_level"] == 3, "auroc"].mean())


def test_classifier_is_accurate_and_cells_follow_the_manifest(planted_evaluation):
    _, world, splits, ev = planted_evaluation
    assert ev.accuracy["id_test"] >= 0.9
    cells = splits.cells
    per_cell = ev.evaluation.per_cell.query("detector == 'energy'")
    assert sorted(per_cell["cell"]) == sorted(cells["cell"])
    merged = per_cell.merge(cells, on="cell", suffixes=("", "_m"))
    assert (merged["n"] == merged["n_m"]).all() and (merged["na"] == merged["na_m"]).all()
    # Table 1 semantic AUROC correlation of MSP is strongly positive
    t1 = ev.evaluation.summary.query("detector == 'msp' and metric == 'auroc' and axis == 'sem'")
    assert t1["correlation"].iloc[0] >= 0.8


def test_planted_evaluation_manifest(planted_evaluation):
    out, _, _, ev = planted_evaluation
    assert manifests.verify(out / "evaluation").ok
    m = manifests.read(out / "evaluation", kind="evaluation")
    files = {r["path"] for r in m.meta["files"]}
    assert {"report.html", "summary.md", "plots/heatmap_splits_msp_auroc.png", "plots/levels_splits_sem_auroc.png"} <= files
    assert m.meta["summary"]["msp_auroc_by_planted_sem_level"] == pytest.approx(
        ev.planted_auroc.loc["msp"].round(4).tolist())
    table = planted_table(ev)
    assert table.row_count == 8
