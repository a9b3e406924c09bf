"""The planted-world demo recovers the planted structure far above a random orthogonal W.

Documented thresholds (README, "What the demo checks"): subspace recovery >= 0.9 (random ~0.5);
Spearman of D_sem / D_cov with the planted shift >= 0.9 and >= 0.15 above random W; grid levels order images
by the planted levels with Spearman >= 0.9.
"""

import pytest
import manifests
from isood.dev.demo import run_planted


@pytest.fixture(scope="module")
def planted(tmp_path_factory):
    out = tmp_path_factory.mktemp("demo")
    world, result, report = run_planted(out, seed=0, progress=False)
    return out, world, result, report


def test_laid_recovers_the_planted_semantic_subspace(planted):
    _, _, _, r = planted
    assert r.recovery >= 0.9
    assert r.recovery_random <= 0.6


def test_measured_shift_follows_planted_shift_far_above_random(planted):
    _, _, _, r = planted
    assert r.spearman_sem >= 0.9 and r.spearman_sem - r.spearman_sem_random >= 0.15
    assert r.spearman_cov >= 0.9 and r.spearman_cov - r.spearman_cov_random >= 0.15


def test_grid_orders_images_by_planted_levels(planted):
    _, _, _, r = planted
    assert r.level_agreement_sem >= 0.9 and r.level_agreement_cov >= 0.9


def test_demo_splits_manifest_verifies_and_counts_every_test_image(planted):
    out, world, result, _ = planted
    assert manifests.verify(out / "splits").ok
    cells = manifests.read(out / "splits").frame("cells")
    assert int(cells["n"].sum()) == len(world.test_features)
    assert set(cells.loc[cells["n"] < 10, "cell"]) == set(cells.loc[cells["na"], "cell"])



def test_demo_command_writes_verified_manifests_with_the_same_splits(planted, tmp_path):
    import pandas as pd
    from typer.testing import CliRunner

    from isood.cli import app

    _, _, result, _ = planted
    res = CliRunner().invoke(app, ["demo", "--out", str(tmp_path / "demo"), "--seed", "0"])
    assert res.exit_code == 0, res.output
    for name in ("class-filter", "splits", "evaluation"):
        assert manifests.verify(tmp_path / "demo" / name).ok, name
    assert manifests.read(tmp_path / "demo" / "class-filter", kind="class-filter").kept()[0]
    assert (tmp_path / "demo" / "evaluation" / "report.html").is_file()
    splits = manifests.read(tmp_path / "demo" / "splits", kind="splits")
    for table in ("images", "cells", "edges"):  # same seed, same splits as run_planted
        pd.testing.assert_frame_equal(splits.frame(table), result.manifest.frame(table))
