"""The pure steps of the generate-syn stage (isood.stages.syn.steps, .options): frames in, frames out."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from generation.prompts import build_prompts
from generation.styles import load_styles
from isood.stages.syn.options import KIND, KIND_PART, KIND_PROMPTS, SynOptions, check_options, output_kinds
from isood.stages.syn.steps import (
    IMAGE_COLUMNS,
    REJECTED_COLUMNS,
    cell_lists,
    in_plan_order,
    merge_part_tables,
    merge_summaries,
    n_batches,
    plan_prompts,
    rejected_rows,
    split_generated,
    syn_cells,
    task_rows,
)
from isood.core.errors import BadInputError


def prompts(n_labels=6, styles="sdxl:anime,clay,photographic"):
    labels = pd.DataFrame({"wnid": [""] * n_labels, "label": [f"thing {i}" for i in range(n_labels)]})
    return build_prompts(labels, load_styles(styles))


def planned(per_cell=2, images_per_prompt=2, n_levels=3, seed=0):
    p = prompts()
    rng = np.random.default_rng(seed)
    return plan_prompts(p, rng.uniform(0, 1, len(p)), rng.uniform(0, 1, len(p)), n_levels=n_levels,
                        per_cell=per_cell, images_per_prompt=images_per_prompt, seed=seed)


def test_plan_prompts_selects_the_sampled_prompts_and_expands_them():
    plan = planned()
    binned = plan.prompts
    assert len(binned) == 18 and plan.n_levels == 3 and len(plan.sem_edges) == len(plan.cov_edges) == 4
    assert set(binned.loc[binned["selected"], "prompt_id"]) == set(plan.sampled["prompt_id"])
    per_cell = binned.groupby("cell").size()
    taken = binned[binned["selected"]].groupby("cell").size()
    assert (taken == np.minimum(per_cell, 2)).all()
    assert len(plan.images) == 2 * len(plan.sampled) and plan.images["path"].is_unique
    edges = np.linspace(0, 1, 5)
    p = prompts()
    with_edges = plan_prompts(p, np.full(len(p), 0.3), np.full(len(p), 0.9), n_levels=4, sem_edges=edges,
                              cov_edges=edges, per_cell=1, images_per_prompt=1, seed=0)
    assert set(with_edges.prompts["cell"]) == {"cov_3_sem_1"} and len(with_edges.images) == 1


def test_rejected_rows_are_strings_with_the_stage():
    p = prompts(2).assign(reason="blocklist: x")
    rej = rejected_rows(p, "prompt")
    assert list(rej.columns) == REJECTED_COLUMNS and (rej["stage"] == "prompt").all() and (rej["path"] == "").all()
    assert list(rej["reason"]) == ["blocklist: x"] * len(p) and list(rej["prompt"]) == list(p["prompt"])
    empty = rejected_rows(p.iloc[0:0], "image")
    assert list(empty.columns) == REJECTED_COLUMNS and len(empty) == 0


def test_task_rows_split_the_plan_into_whole_batches():
    plan = pd.DataFrame({"path": [f"p{i}" for i in range(10)]})
    shares = [task_rows(plan, batch_size=3, num_shards=3, shard_index=i) for i in range(3)]
    assert [list(s["path"]) for s in shares] == [["p0", "p1", "p2", "p9"], ["p3", "p4", "p5"], ["p6", "p7", "p8"]]
    assert n_batches(10, 3) == 4 and n_batches(9, 3) == 3
    assert list(task_rows(plan, batch_size=3, num_shards=1, shard_index=0)["path"]) == list(plan["path"])


def test_split_generated_and_cells():
    plan = planned().images
    bad = set(plan["path"][::3])
    sha = {p: f"h{j}" for j, p in enumerate(plan["path"]) if p not in bad}
    images, rej = split_generated(plan, sha256=sha, rejected={p: "too red" for p in bad})
    assert list(images.columns) == IMAGE_COLUMNS and list(images["sha256"]) == [sha[p] for p in images["path"]]
    assert set(rej["path"]) == bad and (rej["stage"] == "image").all() and (rej["reason"] == "too red").all()
    binned = planned().prompts
    cells = syn_cells(images, binned, n_levels=3, na_threshold=2)
    assert len(cells) == 9 and cells["n"].sum() == len(images)
    counts = images.groupby("cell").size()
    assert (cells.set_index("cell").loc[counts.index, "n"] == counts).all()
    assert (cells["na"] == (cells["n"] < 2)).all()
    assert cells["prompts_available"].sum() == len(binned) and cells["prompts_sampled"].sum() == binned["selected"].sum()
    lists = cell_lists(images)
    assert sorted(lists) == sorted(f"lists/{c}.txt" for c in counts.index)
    assert sum(len(t.split()) for t in lists.values()) == len(images)


def test_in_plan_order_and_merge_of_parts():
    plan = planned().images
    order = list(plan["path"])
    images, rej = split_generated(plan, sha256={p: "h" for p in order[1:]}, rejected={order[0]: "r"})
    prompt_rej = rejected_rows(prompts(1).assign(reason="blocklist: y"), "prompt")
    half = [images.iloc[::2], images.iloc[1::2]]
    parts_rej = [pd.concat([prompt_rej, rej]), prompt_rej]
    merged, merged_rej = merge_part_tables([order, order], half[::-1], parts_rej)
    pd.testing.assert_frame_equal(merged, images.reset_index(drop=True))
    assert list(merged_rej["stage"]) == ["prompt"] * len(prompt_rej) + ["image"]
    shuffled = images.sample(frac=1.0, random_state=0)
    assert list(in_plan_order(shuffled, order)["path"]) == list(images["path"])
    with pytest.raises(BadInputError, match="in no part"):
        merge_part_tables([order, order], [half[0]], parts_rej)
    with pytest.raises(BadInputError, match="planned other images"):
        merge_part_tables([order, order[::-1]], half, parts_rej)


def test_merge_summaries_adds_the_counts():
    a = {"labels": 5, "generated": 3, "skipped": 1, "batches": 2, "rejected": 1, "images": 3, "seconds": 1.0,
         "images_per_second": 3.0, "cells_not_na": 4}
    b = {**a, "generated": 1, "batches": 1, "rejected": 0, "images": 1, "seconds": 3.0}
    s = merge_summaries([a, b])
    assert s == {"labels": 5, "generated": 4, "skipped": 2, "batches": 3, "rejected": 1, "images": 4, "seconds": 4.0,
                 "images_per_second": 1.0}


@pytest.mark.parametrize("kw, fragment", [
    (dict(prompts_only=True, num_shards=2), "--prompts-only runs once"),
    (dict(num_shards=2, shard_index=2), "--shard-index must be in 0..1"),
    (dict(per_cell=0), "--per-cell"),
    (dict(images_per_prompt=0), "--images-per-prompt"),
    (dict(size=60), "--size"),
])
def test_check_options_refuses(kw, fragment):
    with pytest.raises(BadInputError, match=fragment):
        check_options(SynOptions(out=Path("o"), **kw))


def test_check_options_refuses_a_custom_generator_off_the_local_engine():
    with pytest.raises(BadInputError, match="only with the local engine, not 'ray'"):
        check_options(SynOptions(out=Path("o")), engine="ray", custom_generator=True)
    check_options(SynOptions(out=Path("o")), engine="ray")


def test_output_kinds_say_what_out_may_hold():
    """What the writer (``manifests.writing``) lets each run replace: a Syn-IS run its own set or its prompts, a
    prompts-only run only prompts, an array task only its part."""
    assert output_kinds(SynOptions(out=Path("o"))) == (KIND, KIND_PROMPTS)
    assert output_kinds(SynOptions(out=Path("o"), prompts_only=True)) == (KIND_PROMPTS,)
    assert output_kinds(SynOptions(out=Path("o"), num_shards=2, shard_index=1)) == (KIND_PART,)
