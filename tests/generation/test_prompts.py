"""Prompt ids, blocklist, binning, per-cell sampling and the image plan (pure: generation.prompts)."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from generation.prompts import (
    apply_blocklist,
    bin_prompts,
    build_prompts,
    expand_images,
    image_seed,
    prompt_id,
    sample_per_cell,
)
from generation.safety import DEFAULT_BLOCKLIST, PromptBlocklist
from generation.styles import load_styles
from isood.core.errors import BadInputError
from isood.science.grid import assign_levels, bin_with_edges


def test_prompt_ids_are_stable_and_distinct():
    styles = load_styles("sdxl:anime,clay")
    labels = pd.DataFrame({"wnid": ["n01440764", "", ""], "label": ["tench", "red fox", "violin"]})
    a = build_prompts(labels, styles)
    b = build_prompts(labels.iloc[::-1].reset_index(drop=True), styles[::-1])
    assert len(a) == 6 and a["prompt_id"].is_unique
    assert dict(zip(a["prompt_id"], a["prompt"])) == dict(zip(b["prompt_id"], b["prompt"]))  # order-free
    assert prompt_id("anime", "n01440764", "tench") == prompt_id("anime", "n01440764", "a renamed tench")
    assert prompt_id("anime", "", "red fox") != prompt_id("clay", "", "red fox")
    assert prompt_id("anime", "", "red fox") != prompt_id("anime", "", "red foxes")
    row = a[(a["style"] == "clay") & (a["label"] == "violin")].iloc[0]
    assert row["prompt"] == styles[1].apply("violin")[0] and row["negative_prompt"] == styles[1].negative_prompt
    with pytest.raises(BadInputError, match="empty"):
        build_prompts(labels.iloc[0:0], styles)


def test_blocklist_whole_words_case_insensitive(tmp_path):
    bl = PromptBlocklist(DEFAULT_BLOCKLIST)
    assert bl.match("an anime illustration of a Nude, painterly") == "nude"
    assert bl.match("a photo of a sextant") is None  # 'sex' inside a word does not match
    assert bl.match("a photo of Sex symbol") == "sex"
    extra = tmp_path / "block.txt"
    extra.write_text("# mine\nred fox\n\n")
    mine = PromptBlocklist.build(extra, use_default=False)
    assert mine.terms == ("red fox",) and mine.match("A RED FOX at night") == "red fox" and mine.match("nude") is None
    prompts = build_prompts(pd.DataFrame({"wnid": ["", "", ""], "label": ["nude", "violin", "red fox"]}),
                            load_styles("sdxl:anime"))
    kept, rejected = apply_blocklist(prompts, PromptBlocklist.build(extra))
    assert list(kept["label"]) == ["violin"]
    assert dict(zip(rejected["label"], rejected["reason"])) == {"nude": "blocklist: nude", "red fox": "blocklist: red fox"}


def _frame(n, seed=0):
    rng = np.random.default_rng(seed)
    return pd.DataFrame({"prompt_id": [f"{i:016x}" for i in rng.permutation(10 * n)[:n]],
                         "d_sem": rng.uniform(0.1, 0.9, n), "d_cov": rng.uniform(0.0, 0.5, n)})


def test_bin_prompts_with_given_edges_folds_extremes():
    df = pd.DataFrame({"prompt_id": list("abcde")})
    edges = np.array([0.2, 0.4, 0.6, 0.8])
    binned, sem_edges, cov_edges = bin_prompts(df, [0.1, 0.2, 0.45, 0.79, 0.95], [0.5, 0.5, 0.5, 0.5, 0.5],
                                               n_levels=3, sem_edges=edges, cov_edges=edges)
    assert list(binned["sem_level"]) == [0, 0, 1, 2, 2]
    assert set(binned["cov_level"]) == {1}
    assert list(binned["cell"]) == ["cov_1_sem_0", "cov_1_sem_0", "cov_1_sem_1", "cov_1_sem_2", "cov_1_sem_2"]
    np.testing.assert_array_equal(sem_edges, edges)
    with pytest.raises(BadInputError, match="n_levels=4 does not match 4 sem edges"):
        bin_prompts(df, [0.1] * 5, [0.5] * 5, n_levels=4, sem_edges=edges, cov_edges=edges)


def test_bin_prompts_own_edges_are_consistent():
    df = _frame(400)
    binned, sem_edges, cov_edges = bin_prompts(df[["prompt_id"]], df["d_sem"], df["d_cov"], n_levels=8)
    assert len(sem_edges) == len(cov_edges) == 9 and set(binned["sem_level"]) == set(range(8))
    for axis, edges in (("sem", sem_edges), ("cov", cov_edges)):
        d, lev = binned[f"d_{axis}"].to_numpy(), binned[f"{axis}_level"].to_numpy()
        inner = (d >= edges[0]) & (d < edges[-1])
        assert np.all(edges[lev[inner]] <= d[inner]) and np.all(d[inner] < edges[lev[inner] + 1])
        assert np.all(lev[d < edges[0]] == 0) and np.all(lev[d >= edges[-1]] == 7)


def test_sample_per_cell_is_capped_seeded_and_order_free():
    df = _frame(300)
    binned, _, _ = bin_prompts(df[["prompt_id"]], df["d_sem"], df["d_cov"], n_levels=3)
    counts = binned.groupby("cell").size()
    picked = sample_per_cell(binned, 5, seed=1)
    got = picked.groupby("cell").size()
    assert (got == np.minimum(counts, 5)).all() and set(got.index) == set(counts.index)
    again = sample_per_cell(binned.sample(frac=1.0, random_state=7), 5, seed=1)
    assert list(again["prompt_id"]) == list(picked["prompt_id"])
    other = sample_per_cell(binned, 5, seed=2)
    assert set(other["prompt_id"]) != set(picked["prompt_id"])
    # a cell's pick does not depend on other cells' contents
    one_cell = picked["cell"].iloc[0]
    alone = sample_per_cell(binned[binned["cell"] == one_cell], 5, seed=1)
    assert list(alone["prompt_id"]) == list(picked.loc[picked["cell"] == one_cell, "prompt_id"])


def test_image_seeds_and_paths():
    seeds = {image_seed(g, p, i) for g in (0, 1) for p in ("a" * 16, "b" * 16) for i in range(3)}
    assert len(seeds) == 12 and all(0 <= s < 2**63 for s in seeds)
    assert image_seed(0, "a" * 16, 1) == image_seed(0, "a" * 16, 1)
    prompts = build_prompts(pd.DataFrame({"wnid": ["", ""], "label": ["violin", "teapot"]}), load_styles("sdxl:3d-model"))
    plan = expand_images(prompts, 3, seed=0)
    assert len(plan) == 6 and plan["path"].is_unique
    assert list(plan["image_index"]) == [0, 1, 2, 0, 1, 2]
    assert plan["path"].str.match(r"^images/3d-model/[0-9a-f]{16}_[0-2]\.png$").all()
    assert list(plan["seed"]) == [image_seed(0, p, i) for p, i in zip(plan["prompt_id"], plan["image_index"])]


def test_bin_prompts_levels_are_the_grid_levels():
    """Without edges: isood.science.grid.assign_levels on each axis; with edges: isood.science.grid.bin_with_edges."""
    df = _frame(200, seed=3)
    binned, sem_edges, cov_edges = bin_prompts(df[["prompt_id"]], df["d_sem"], df["d_cov"], n_levels=5)
    sem_ref, sem_ref_edges = assign_levels(df["d_sem"].to_numpy(), 5)
    cov_ref, _ = assign_levels(df["d_cov"].to_numpy(), 5)
    np.testing.assert_array_equal(binned["sem_level"], sem_ref)
    np.testing.assert_array_equal(binned["cov_level"], cov_ref)
    np.testing.assert_allclose(sem_edges, sem_ref_edges)
    edges = np.linspace(0.0, 1.0, 6)
    again, _, _ = bin_prompts(df[["prompt_id"]], df["d_sem"], df["d_cov"], n_levels=5, sem_edges=edges,
                              cov_edges=edges)
    np.testing.assert_array_equal(again["sem_level"], bin_with_edges(df["d_sem"].to_numpy(), edges))
    assert list(again["cell"]) == [f"cov_{c}_sem_{s}" for c, s in zip(again["cov_level"], again["sem_level"])]


def test_plan_inputs_are_checked():
    prompts = build_prompts(pd.DataFrame({"wnid": [""], "label": ["violin"]}), load_styles("sdxl:anime"))
    with pytest.raises(BadInputError, match="--images-per-prompt"):
        expand_images(prompts, 0, seed=0)
    with pytest.raises(BadInputError, match="--per-cell"):
        sample_per_cell(prompts.assign(cov_level=0, sem_level=0), 0)
    with pytest.raises(BadInputError, match="1 prompts but 2/1 distances"):
        bin_prompts(prompts, [0.1, 0.2], [0.1])
