"""Syn-IS across the grid: `isood generate-syn --splits` on a CLIP-like world (isood.science.simulate_clip), whose text
and image features sit in two cones as CLIP's do. Prompt distances are text-to-image, the splits' edges
image-to-image; by default the prompts are binned on their own distribution and fill the grid."""

from __future__ import annotations

import numpy as np
import pytest
from scipy.stats import spearmanr
from typer.testing import CliRunner

import manifests
from isood.stages.syn import SynOptions, run_generate_syn
from isood.stages.syn.edges import CROWDED_SHARE, choose_edges, spread_warnings
from isood.cli import app
from isood.core.errors import IsoodError
from isood.science.grid import axis_edges, bin_with_edges
from isood.kinds import SPLITS, SYN_IS_PROMPTS
from isood.science.laid import LAID
from isood.features.shift import shift_distances
from isood.science.simulate_clip import make_clip_world, modality_cosines
from isood.stages.splits import SplitsOptions, build_splits


def run_prompts(world_syn, out, monkeypatch, **kw):
    """generate-syn --prompts-only on the CLIP-like world (its text encoder stands in for the CLIP)."""
    monkeypatch.setattr("isood.stages.syn.load.load_clip", lambda spec, device=None: world_syn["encoder"])
    warnings: list[str] = []
    opts = dict(out=str(out), styles=str(world_syn["styles"]), labels=str(world_syn["labels"]), clip="planted",
                splits=str(world_syn["splits"]), prompts_only=True, per_cell=2, seed=0, device="cpu",
                progress=False)
    opts.update(kw)
    res = run_generate_syn(SynOptions(**opts), warn=warnings.append)
    return manifests.read(out, kind=SYN_IS_PROMPTS), res, warnings


def test_clip_world_has_a_modality_gap_and_its_planted_factors_are_recovered(clip_world):

    cos = modality_cosines(clip_world, n=2000)
    assert 0.2 < cos["caption_image"] < 0.4  # CLIP: a caption and its own image ~0.3
    assert cos["text_text"] > cos["caption_image"] + 0.2 and cos["image_image"] > cos["caption_image"] + 0.2
    idf, _ = clip_world.id_images(2)
    feats, classes, styles = clip_world.test_images(2000)
    d_sem, d_cov = shift_distances(feats, idf, LAID(clip_world.mixing))
    assert spearmanr(d_sem, clip_world.class_angle[classes]).statistic > 0.8
    assert spearmanr(d_cov, clip_world.style_angle[styles]).statistic > 0.9
    t_sem, t_cov = shift_distances(clip_world.texts(classes, styles), idf, LAID(clip_world.mixing))
    assert spearmanr(t_sem, clip_world.class_angle[classes]).statistic > 0.7
    assert spearmanr(t_cov, clip_world.style_angle[styles]).statistic > 0.9
    assert np.median(t_sem) > np.quantile(d_sem, 0.99) and np.median(t_cov) > np.quantile(d_cov, 0.99)  # the gap
    again = make_clip_world(**clip_world.config)  # one spec, one world
    np.testing.assert_array_equal(again.texts(classes, styles), clip_world.texts(classes, styles))
    np.testing.assert_array_equal(again.images(classes, styles), clip_world.images(classes, styles))


def test_default_bins_prompts_on_their_own_distribution_and_fills_the_grid(clip_world, clip_world_syn, isood_cache,
                                                                           tmp_path, monkeypatch):
    m, res, warnings = run_prompts(clip_world_syn, tmp_path / "o", monkeypatch)
    prompts = m.frame("prompts")
    filled = prompts.groupby("cell").size()
    assert len(filled) >= 56 and (m.frame("cells")["prompts_available"] > 0).sum() >= 56
    assert warnings == [] and res.summary["warnings"] == []
    # the publisher's rule: equal-width levels over the prompts' clipped range, the splits' clip and levels
    splits = manifests.read(clip_world_syn["splits"], kind=SPLITS)
    for axis in ("sem", "cov"):
        d = prompts[f"d_{axis}"].to_numpy()
        lo, hi = np.quantile(d, splits.clip_quantile)
        np.testing.assert_allclose(axis_edges(m.edges, axis), np.linspace(lo, hi, splits.n_levels + 1), rtol=1e-12)
        np.testing.assert_array_equal(prompts[f"{axis}_level"], bin_with_edges(d, np.linspace(lo, hi, 9)))
    recorded = m.prompt_edges
    assert recorded["mode"] == "prompts" and recorded["clip"] == list(splits.clip_quantile)
    np.testing.assert_allclose(recorded["sem"], axis_edges(m.edges, "sem"))
    truth = clip_world_syn["prompt_truth"]  # the levels follow the planted factors
    cls, sty = (np.array([truth[p][k] for p in prompts["prompt"]]) for k in (0, 1))
    assert spearmanr(prompts["cov_level"], clip_world.style_angle[sty]).statistic > 0.9
    assert spearmanr(prompts["sem_level"], clip_world.class_angle[cls]).statistic > 0.6


def test_splits_edges_collapse_the_prompts_and_say_so(clip_world_syn, isood_cache, tmp_path, monkeypatch):
    """--prompt-edges splits keeps the image splits' edges: text-to-image distances lie beyond them, the prompts
    crowd into a corner cell, and the run says so on stderr (one line each) and in the manifest."""
    monkeypatch.setattr("isood.stages.syn.load.load_clip", lambda spec, device=None: clip_world_syn["encoder"])
    out = tmp_path / "o"
    r = CliRunner().invoke(app, ["generate-syn", "--styles", str(clip_world_syn["styles"]), "--labels",
                                 str(clip_world_syn["labels"]), "--clip", "planted", "--splits",
                                 str(clip_world_syn["splits"]), "--prompt-edges", "splits", "--prompts-only",
                                 "--out", str(out), "--device", "cpu"])
    assert r.exit_code == 0, r.output
    m = manifests.read(out, kind=SYN_IS_PROMPTS)
    splits = manifests.read(clip_world_syn["splits"], kind=SPLITS)
    for axis in ("sem", "cov"):
        np.testing.assert_array_equal(axis_edges(m.edges, axis), splits.axis_edges(axis))
    prompts = m.frame("prompts")
    top = prompts["cell"].value_counts()
    assert top.iloc[0] / len(prompts) > 0.9 and len(top) < 16  # the collapse, measured independently
    outside = ((prompts["d_sem"] > splits.axis_edges("sem")[-1]) | (prompts["d_cov"] > splits.axis_edges("cov")[-1]))
    assert outside.mean() > CROWDED_SHARE
    warnings = m.meta["summary"]["warnings"]
    assert any("outside the splits edges" in w for w in warnings) and any("in one cell" in w for w in warnings)
    lines = [ln for ln in r.stderr.splitlines() if "warning:" in ln]
    assert len(lines) == 2 and all("--prompt-edges prompts" in ln for ln in lines)
    assert m.prompt_edges["mode"] == "splits" and m.meta["command"]["config"]["edges_from"] == "splits"


def test_calibrated_edges_move_the_splits_edges_by_the_median_gap(clip_world_syn, isood_cache, tmp_path,
                                                                   monkeypatch):
    m, _, _ = run_prompts(clip_world_syn, tmp_path / "o", monkeypatch, prompt_edges="calibrated")
    splits = manifests.read(clip_world_syn["splits"], kind=SPLITS)
    prompts = m.frame("prompts")
    for axis in ("sem", "cov"):
        offset = np.median(prompts[f"d_{axis}"]) - np.median(splits.images[f"d_{axis}"])
        assert m.prompt_edges["offset"][axis] == pytest.approx(offset, rel=1e-12)
        np.testing.assert_allclose(axis_edges(m.edges, axis), splits.axis_edges(axis) + offset, rtol=1e-12)
        shifted = bin_with_edges(prompts[f"d_{axis}"].to_numpy() - offset, splits.axis_edges(axis))
        assert np.mean(shifted == prompts[f"{axis}_level"]) > 0.999
    assert prompts["cell"].nunique() > 16  # no longer one cell


def test_levels_clip_and_na_threshold_come_from_the_splits_manifest(clip_world_syn, isood_cache, tmp_path,
                                                                    monkeypatch):
    root = clip_world_syn["root"]
    build_splits(SplitsOptions(id=str(root / "id"), test=str(root / "test"), laid=str(root / "laid.safetensors"),
                             out=str(tmp_path / "splits"), levels=6, clip_quantile=(0.05, 0.95), na_threshold=3,
                             progress=False))
    world = dict(clip_world_syn, splits=tmp_path / "splits")
    m, _, _ = run_prompts(world, tmp_path / "o", monkeypatch, per_cell=1)
    prompts = m.frame("prompts")
    for axis in ("sem", "cov"):
        lo, hi = np.quantile(prompts[f"d_{axis}"], [0.05, 0.95])
        np.testing.assert_allclose(axis_edges(m.edges, axis), np.linspace(lo, hi, 7), rtol=1e-12)
    cfg = m.meta["command"]["config"]
    assert (cfg["na_threshold"], cfg["na_threshold_from"], m.na_threshold) == (3, "splits", 3)
    cells = m.frame("cells")
    np.testing.assert_array_equal(cells["na"], cells["n"] < 3)
    m2, _, _ = run_prompts(world, tmp_path / "o2", monkeypatch, per_cell=1, na_threshold=5)
    assert (m2.na_threshold, m2.meta["command"]["config"]["na_threshold_from"]) == (5, "--na-threshold")


@pytest.mark.parametrize("mode", ["splits", "calibrated"])
def test_splits_modes_need_splits(mode, tmp_path):
    with pytest.raises(IsoodError, match="pass --splits DIR"):
        run_generate_syn(SynOptions(out=str(tmp_path / "o"), clip="planted", id_features=str(tmp_path),
                                    prompt_edges=mode, prompts_only=True, progress=False))
    assert not (tmp_path / "o").exists()


def test_spread_warnings_count_outside_and_crowded_cells_against_the_grid_size():
    rng = np.random.default_rng(0)
    d_sem, d_cov = rng.uniform(0, 1, 1000), rng.uniform(0, 1, 1000)
    even = choose_edges(d_sem, d_cov, mode="prompts", n_levels=8)
    assert spread_warnings(d_sem, d_cov, even) == []
    crowded = np.where(np.arange(1000) < 300, 0.999, d_sem)  # 30% in the top sem level, spread over cov
    d_cov2 = np.where(np.arange(1000) < 300, 0.999, d_cov)  # ... and the top cov level: one cell
    assert any("in one cell (cov_7_sem_7)" in w for w in spread_warnings(crowded, d_cov2, even))
    beyond = choose_edges(d_sem, d_cov, mode="splits", n_levels=8,
                          splits_edges=(np.linspace(0, 0.5, 9), np.linspace(0, 1, 9)))
    lines = spread_warnings(d_sem, d_cov, beyond)  # half the prompts lie beyond the sem edges
    assert len(lines) == 1 and lines[0].startswith(f"{int((d_sem > 0.5).sum())} of 1000 prompts")
    two = choose_edges(d_sem, d_cov, mode="prompts", n_levels=2)  # 4 cells: a quarter is a cell's even share
    lopsided = np.where(np.arange(1000) < 200, 0.0, d_sem), np.where(np.arange(1000) < 200, 0.0, d_cov)
    share = np.mean(bin_with_edges(lopsided[0], two.sem) + 2 * bin_with_edges(lopsided[1], two.cov) == 0)
    assert 0.25 < share < 0.5 and spread_warnings(*lopsided, two) == []
    few = rng.uniform(0, 1, 12), rng.uniform(0, 1, 12)  # 12 prompts: the clipped tails hold 4 of them
    own = choose_edges(*few, mode="prompts", n_levels=8)
    tails = (few[0] < own.sem[0]) | (few[0] > own.sem[-1]) | (few[1] < own.cov[0]) | (few[1] > own.cov[-1])
    assert tails.mean() > CROWDED_SHARE and spread_warnings(*few, own) == []  # folded into the end levels by rule


def test_demo_step_shows_the_collapse_and_the_default_filling_the_grid():
    from isood.dev.demo import run_modality_gap

    gap = run_modality_gap(0)
    assert 0.2 < gap.cosines["caption_image"] < 0.4 and gap.n_cells == 64
    assert gap.cells_on_prompt_edges >= 56 and gap.cells_on_splits_edges <= 8 and len(gap.warnings) == 2
