"""The write steps of the generate-syn stage: the Syn-IS manifest (with its cells, lists and dataset card), the
part a job-array task writes, and the merge of the parts of one run into the manifest a single run writes."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Iterable, Mapping, Sequence

import pandas as pd

import manifests
from generation.outputs import prune_images, read_state, reject_marker, write_state
from isood.stages.syn.options import KIND, KIND_PART, KIND_PROMPTS
from isood.stages.syn.steps import (IMAGE_COLUMNS, REJECTED_COLUMNS, cell_lists, merge_part_tables, merge_summaries,
                                  syn_cells)
from isood.report.card_figure import card_mosaic
from isood.kinds import LAID_FILE
from isood.core.files import link_or_copy
from manifests.store import Manifest

__all__ = ["write_syn_manifest", "write_part", "merge_parts", "LAID_SIDECAR"]

#: The JSON sidecar of the LAID weights (``LAID.files``).
LAID_SIDECAR = Path(LAID_FILE).with_suffix(".json").name


def write_syn_manifest(out: str | Path, *, images: pd.DataFrame, prompts: pd.DataFrame, edges: pd.DataFrame,
                       rejected: pd.DataFrame, config: Mapping[str, Any], inputs: Iterable[dict] = (),
                       laid_files: Mapping[str, bytes] | None = None, summary: dict[str, Any] | None = None,
                       prompts_only: bool = False, argv: list[str] | None = None) -> tuple[Manifest, pd.DataFrame]:
    """Write the Syn-IS manifest (``syn-is``; ``prompts_only``: ``syn-is-prompts``, no lists) from the
    images, prompts, edges and rejected tables; the cells table, per-cell lists and the card are derived here.
    Shared by `isood generate-syn` and the merge of a job array (which thereby writes a single run's bytes).
    ``config`` needs ``n_levels`` and ``na_threshold``. Returns ``(manifest, cells)``."""
    summary = dict(summary or {})
    images = images[IMAGE_COLUMNS].reset_index(drop=True)
    cells = syn_cells(images, prompts, n_levels=int(config["n_levels"]), na_threshold=int(config["na_threshold"]))
    summary["cells_not_na"] = int((~cells["na"]).sum())
    tables = {"images": images, "prompts": prompts.reset_index(drop=True), "cells": cells, "edges": edges,
              "rejected": rejected[REJECTED_COLUMNS].reset_index(drop=True)}
    laid_files = dict(laid_files or {})
    if prompts_only:
        manifest = manifests.write_with_card(out, kind=KIND_PROMPTS, tables=tables, config=config, inputs=inputs,
                                             files=laid_files, summary=summary, note="Syn-IS prompts", argv=argv)
    else:
        manifest = manifests.write_with_card(out, kind=KIND, tables=tables, config=config, inputs=inputs,
                                             files={**cell_lists(images), **laid_files},
                                             existing_files=list(images["path"]), summary=summary,
                                             note="Syn-IS images", title="Syn-IS", argv=argv, figure=card_mosaic)
    return manifest, cells


def write_part(out: str | Path, *, images: pd.DataFrame, prompts: pd.DataFrame, edges: pd.DataFrame,
               rejected: pd.DataFrame, plan: pd.DataFrame, config: Mapping[str, Any], inputs: Iterable[dict] = (),
               laid_files: Mapping[str, bytes] | None = None, summary: Mapping[str, Any] | None = None,
               argv: list[str] | None = None) -> Manifest:
    """A job-array task's ``syn-is-part`` manifest (with its dataset card): its images, the whole plan (for the
    merge's order) and the run's other tables as they are. ``config["part"]`` is the task's
    ``isood.core.parts.part_info``."""
    part = config["part"]
    tables = {"images": images[IMAGE_COLUMNS].reset_index(drop=True), "prompts": prompts.reset_index(drop=True),
              "edges": edges, "rejected": rejected[REJECTED_COLUMNS].reset_index(drop=True),
              "plan": plan[["path"]].reset_index(drop=True)}
    return manifests.write_with_card(out, kind=KIND_PART, tables=tables, config=config, inputs=inputs,
                                     files=dict(laid_files or {}), existing_files=list(images["path"]),
                                     summary=summary, note=f"part {part['index']} of {part['count']}", argv=argv)


def _copy_part_files(parts: Sequence[Manifest], out: Path) -> None:
    """Hard-link (copy across file systems) the parts' images and rejection markers into ``out``, and merge
    their resume states (union of the content keys), so ``out`` resumes like a single run's folder."""
    keys: dict[str, str] = {}
    fingerprint = None
    for m in parts:
        for p in m.frame("images")["path"]:
            link_or_copy(m.path(p), out / p)
        rej = m.frame("rejected")
        for p in rej.loc[rej["stage"] == "image", "path"]:  # markers: a rerun does not regenerate them
            marker = reject_marker(m.root / p)
            if marker.is_file():
                link_or_copy(marker, reject_marker(out / p))
        state = read_state(m.root)
        keys.update(state["keys"])
        fingerprint = state["fingerprint"] or fingerprint
    if keys:
        write_state(out, fingerprint=fingerprint, keys=keys)


def merge_parts(parts: Sequence[Manifest], out: str | Path, config: Mapping[str, Any], *,
                argv: list[str] | None = None) -> Manifest:
    """Combine the ``syn-is-part`` manifests of one job array (read and checked by ``manifests.parts.read_parts``,
    sorted by index; ``config`` their shared config) into the ``syn-is`` manifest a single run writes in
    ``out``: images hard-linked into ``out``, rows in plan order, counts summed."""
    plans = [list(m.frame("plan")["path"]) for m in parts]
    images, rejected = merge_part_tables(plans, [m.frame("images") for m in parts],
                                         [m.frame("rejected") for m in parts])
    first = parts[0]
    laid = {r["path"]: first.path(r["path"]).read_bytes() for r in first.meta["files"]
            if r["path"] in (LAID_FILE, LAID_SIDECAR)}
    with manifests.writing(out, KIND, inputs=[m.root for m in parts]) as o:
        _copy_part_files(parts, o.work)
        prune_images(o.work, set(plans[0]))  # every planned path: accepted images and the markers of rejected ones
        write_syn_manifest(
            o.work, images=images, prompts=first.frame("prompts"), edges=first.frame("edges"), rejected=rejected,
            config={k: v for k, v in config.items() if k != "part"}, inputs=first.meta.get("inputs", []),
            laid_files=laid, summary=merge_summaries([m.meta.get("summary", {}) for m in parts]), argv=argv)
    return manifests.read(o.final, kind=KIND)
