"""`isood compare` from the command line: runs made with another N/A threshold are ranked with one warning line and
a settings column; the same run given twice gives one row per detector, not a repeated best row."""

from __future__ import annotations

import numpy as np
import pandas as pd

import manifests
from isood.evaluation import evaluate_scores
from isood.stages.evaluate.write import write_evaluation


def _run(out, seed, na_threshold):
    """An evaluation of two detectors on a 3 x 3 grid written by the real writer, recording ``na_threshold``."""
    rng = np.random.default_rng(seed)
    cov, sem = np.meshgrid(np.arange(3), np.arange(3), indexing="ij")
    images = pd.DataFrame({"cov_level": np.repeat(cov.ravel(), 12), "sem_level": np.repeat(sem.ravel(), 12)})
    ood, idd = rng.normal(-0.5 * images["sem_level"].to_numpy(), 1.0), rng.normal(0.0, 1.0, 50)
    result = evaluate_scores({"msp": idd, "energy": idd}, {"msp": ood, "energy": ood + 0.3}, images,
                             dataset="splits", na_threshold=na_threshold)
    inputs = [manifests.input_record("splits_manifest", "/s", sha256="b" * 64)]
    return write_evaluation(result, out, inputs=inputs, metrics=["auroc"], bootstrap=0,
                            config={"na_threshold": na_threshold, "table_convention": "exact"}).root


def test_compare_flags_another_na_threshold_and_compares_a_repeated_run_once(cli, tmp_path):
    a, b = _run(tmp_path / "a", 0, 10), _run(tmp_path / "b", 1, 2)
    r = cli.invoke(["compare", a, b, "--out", tmp_path / "lb"])
    assert r.exit_code == 0, r.output
    lines = [ln for ln in r.stderr.splitlines() if "different settings" in ln]
    assert len(lines) == 1 and "na_threshold: a=10, b=2" in lines[0]
    board = pd.read_csv(tmp_path / "lb" / "leaderboard.csv")
    assert set(board["settings"]) == {"na_threshold=10, table_convention=exact",
                                      "na_threshold=2, table_convention=exact"}
    r = cli.invoke(["compare", a, a, b, "--out", tmp_path / "lb2", "--names", "x,y,z"])
    assert r.exit_code == 0, r.output
    assert len([ln for ln in r.stderr.splitlines() if "'y' is the same evaluation as 'x'" in ln]) == 1
    board = pd.read_csv(tmp_path / "lb2" / "leaderboard.csv")
    assert len(board) == 4 and set(board["run"]) == {"x", "z"} and (board["rank"] == 1).sum() == 1
