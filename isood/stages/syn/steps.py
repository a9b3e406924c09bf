"""Pure steps of the generate-syn stage (frames in, frames out): the images and rejected tables of a generation,
the cells table, the per-cell lists, a job-array task's share of the plan, and the merge of the parts of one job
array."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping, Sequence

import numpy as np
import pandas as pd

from generation.prompts import bin_prompts, expand_images, sample_per_cell
from isood.core.errors import BadInputError
from isood.science.grid import cell_table
from isood.core.parts import selected_units

__all__ = [
    "PromptPlan", "plan_prompts", "IMAGE_COLUMNS", "REJECTED_COLUMNS", "GENERATION_COUNTS", "rejected_rows", "n_batches", "task_rows",
    "split_generated", "syn_cells", "cell_lists", "in_plan_order", "merge_part_tables", "merge_summaries",
]

IMAGE_COLUMNS = ["path", "prompt", "negative_prompt", "style", "wnid", "label", "prompt_id", "image_index", "seed",
                 "d_sem", "d_cov", "sem_level", "cov_level", "cell", "sha256"]
REJECTED_COLUMNS = ["stage", "path", "prompt_id", "style", "wnid", "label", "prompt", "reason"]
#: Summary counts that add up over the parts of a job array.
GENERATION_COUNTS = ("generated", "skipped", "batches", "rejected", "images")


@dataclass(frozen=True, eq=False)
class PromptPlan:
    """The binned prompts (with ``selected``), the edges used, the sampled prompts and the image plan."""

    prompts: pd.DataFrame
    sem_edges: np.ndarray
    cov_edges: np.ndarray
    sampled: pd.DataFrame
    images: pd.DataFrame
    n_levels: int


def plan_prompts(prompts: pd.DataFrame, d_sem, d_cov, *, n_levels: int, sem_edges=None, cov_edges=None,
                 per_cell: int, images_per_prompt: int, seed: int) -> PromptPlan:
    """Bin the prompts by their shift (on the given edges, else their own), sample ``per_cell`` prompts per
    cell and expand them to ``images_per_prompt`` planned images each (path, seed, ...)."""
    binned, sem_edges, cov_edges = bin_prompts(prompts, d_sem, d_cov, n_levels=n_levels, sem_edges=sem_edges,
                                               cov_edges=cov_edges)
    sampled = sample_per_cell(binned, per_cell, seed=seed)
    binned["selected"] = binned["prompt_id"].isin(set(sampled["prompt_id"]))
    images = expand_images(sampled, images_per_prompt, seed=seed)
    return PromptPlan(prompts=binned.reset_index(drop=True), sem_edges=sem_edges, cov_edges=cov_edges,
                      sampled=sampled, images=images, n_levels=len(sem_edges) - 1)


def rejected_rows(df: pd.DataFrame, stage: str) -> pd.DataFrame:
    """Rows of the ``rejected`` table (REJECTED_COLUMNS, all strings) for rejected prompts or images ``df``
    (columns it lacks, e.g. ``path`` for a prompt, are '')."""
    out = pd.DataFrame({c: (df[c] if c in df.columns else "") for c in REJECTED_COLUMNS if c != "stage"},
                       index=df.index)
    out.insert(0, "stage", stage)
    return out.reset_index(drop=True).astype({c: str for c in REJECTED_COLUMNS})


def n_batches(n_rows: int, batch_size: int) -> int:
    """Pipeline batches (the units of a job array) of a plan of ``n_rows`` images."""
    return -(-int(n_rows) // int(batch_size))


def task_rows(plan: pd.DataFrame, *, batch_size: int, num_shards: int, shard_index: int) -> pd.DataFrame:
    """The plan rows of job-array task ``shard_index`` of ``num_shards``: whole pipeline batches ``b`` (rows
    ``b*batch_size .. (b+1)*batch_size``) with ``b % num_shards == shard_index``, in plan order."""
    b = int(batch_size)
    units = selected_units(n_batches(len(plan), b), num_shards, shard_index)
    return plan.iloc[[j for k in units for j in range(k * b, min(len(plan), (k + 1) * b))]]


def _strings(values: list[str], like: pd.Series) -> list[str] | pd.Series:
    """A new string column's values; none at all (a job-array task that generated nothing) as an empty column of
    ``like``'s string dtype, not the float column an empty list would make."""
    return values if values else pd.Series([], dtype=like.dtype)


def split_generated(plan: pd.DataFrame, *, sha256: Mapping[str, str],
                    rejected: Mapping[str, str]) -> tuple[pd.DataFrame, pd.DataFrame]:
    """The generated ``plan`` rows as ``(images, rejected)``: accepted rows get their ``sha256`` (IMAGE_COLUMNS),
    rejected ones their ``reason`` (rows of the rejected table, stage ``image``)."""
    ok = ~plan["path"].isin(set(rejected))
    images = plan[ok].assign(sha256=_strings([sha256[p] for p in plan.loc[ok, "path"]], plan["path"]))
    bad = plan[~ok].assign(reason=_strings([rejected[p] for p in plan.loc[~ok, "path"]], plan["path"]))
    return images[IMAGE_COLUMNS].reset_index(drop=True), rejected_rows(bad, "image")


def syn_cells(images: pd.DataFrame, prompts: pd.DataFrame, *, n_levels: int, na_threshold: int) -> pd.DataFrame:
    """The cells table: ``isood.science.grid.cell_table`` of the images, plus ``prompts_available`` (binned prompts)
    and ``prompts_sampled`` (``selected`` prompts) per cell."""
    cells = cell_table(images["cov_level"].to_numpy(), images["sem_level"].to_numpy(), n_levels, na_threshold)
    avail = prompts.groupby("cell").size()
    taken = prompts[prompts["selected"].astype(bool)].groupby("cell").size()
    cells["prompts_available"] = cells["cell"].map(avail).fillna(0).astype(np.int64)
    cells["prompts_sampled"] = cells["cell"].map(taken).fillna(0).astype(np.int64)
    return cells


def cell_lists(images: pd.DataFrame) -> dict[str, str]:
    """``lists/<cell>.txt`` -> the image paths of that cell, one a line (non-empty cells only)."""
    return {f"lists/{cell}.txt": "".join(f"{p}\n" for p in group["path"])
            for cell, group in images.groupby("cell", sort=True)}


def in_plan_order(df: pd.DataFrame, plan_paths: Sequence[str]) -> pd.DataFrame:
    """``df`` (with a ``path`` column, every path in ``plan_paths``) sorted by the paths' plan position."""
    position = {p: j for j, p in enumerate(plan_paths)}
    return df.iloc[np.argsort(df["path"].map(position).to_numpy(), kind="stable")].reset_index(drop=True)


def merge_part_tables(plans: Sequence[Sequence[str]], images: Sequence[pd.DataFrame],
                      rejected: Sequence[pd.DataFrame]) -> tuple[pd.DataFrame, pd.DataFrame]:
    """The images and rejected tables of one run from those of its job-array parts (in part order).

    Checks that every part planned the same images and that every planned image is in exactly one part
    (accepted or rejected). Rows come out in plan order; the prompt rejections are the first part's.
    """
    plan = list(plans[0])
    for j, other in enumerate(plans[1:], start=1):
        if list(other) != plan:
            raise BadInputError(f"part {j} planned other images than part 0; merge the parts of one run")
    all_images = pd.concat(list(images), ignore_index=True)
    by_image = pd.concat([r[r["stage"] == "image"] for r in rejected], ignore_index=True)
    covered = list(all_images["path"]) + list(by_image["path"])
    if sorted(covered) != sorted(plan):
        missing = sorted(set(plan) - set(covered))
        raise BadInputError(f"{len(missing)} planned image(s) are in no part (e.g. {missing[:1]}) or in two; "
                            "merge every part of one run once")
    first = rejected[0]
    merged_rejected = pd.concat([first[first["stage"] == "prompt"], in_plan_order(by_image, plan)],
                                ignore_index=True)
    return in_plan_order(all_images, plan)[IMAGE_COLUMNS], merged_rejected[REJECTED_COLUMNS]


def merge_summaries(summaries: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """The summary of one run from its parts': the first part's, with the generation counts and seconds
    summed (``cells_not_na`` is recomputed by the writer)."""
    summary = {k: v for k, v in summaries[0].items() if k != "cells_not_na"}
    for key in GENERATION_COUNTS:
        if key in summary:
            summary[key] = int(sum(s.get(key, 0) for s in summaries))
    if "seconds" in summary:
        seconds = round(float(sum(s.get("seconds", 0.0) for s in summaries)), 3)
        summary["seconds"] = seconds
        summary["images_per_second"] = round(summary.get("generated", 0) / seconds, 3) if seconds > 0 else 0.0
    return summary
