"""The shift-grid kinds: ``splits`` (``isood build-splits`` / ``isood import isood-lists``), ``syn-is`` and
``syn-is-prompts`` (``isood generate-syn``, with or without images) and ``syn-is-part`` (one job-array task's
images): their tables (images binned into ``cells`` by the ``edges`` of each axis), ``GridView`` and the views of
each (``SplitsView``, ``SynView``), registered with the grid's card (``isood.kinds.grid_card``)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd

from isood.core.defaults import NA_THRESHOLD, QUANTILE_CLIP
from isood.core.errors import BadInputError, ManifestError
from isood.kinds.cards import imagenet_licence, syn_licence, syn_prompts_licence
from isood.kinds.features import ClipProvenance
from isood.kinds.grid_card import GRID_CARD
from isood.science.grid import AXES, axis_edges as grid_axis_edges
from manifests.schema import BOOL, FLOAT, INT, STRING, CardSpec, KindSpec, TableSpec, register_kind

__all__ = ["SPLITS", "SYN_IS", "SYN_IS_PROMPTS", "SYN_IS_PART", "GRID_KINDS", "LAID_FILE", "IMAGES_COLUMNS",
           "CELLS_COLUMNS", "EDGES_COLUMNS", "GridView", "SplitsView", "SynView"]

SPLITS = "splits"
SYN_IS, SYN_IS_PROMPTS, SYN_IS_PART = "syn-is", "syn-is-prompts", "syn-is-part"
#: Kinds whose images are binned into the shift grid (an ``images`` table with levels, ``cells``, ``edges``).
GRID_KINDS = (SPLITS, SYN_IS)
#: The LAID weights a splits / Syn-IS manifest carries (+ ``laid.json``).
LAID_FILE = "laid.safetensors"

# ------------------------------------------------------------------------------------------------ schemas
IMAGES_COLUMNS = {"path": STRING, "wnid": STRING, "d_sem": FLOAT, "d_cov": FLOAT, "sem_level": INT,
                  "cov_level": INT, "cell": STRING}
CELLS_COLUMNS = {"cell": STRING, "cov_level": INT, "sem_level": INT, "n": INT, "na": BOOL}
EDGES_COLUMNS = {"axis": STRING, "level": INT, "lower": FLOAT, "upper": FLOAT}
_SYN_IMAGES = {**IMAGES_COLUMNS, "prompt": STRING, "negative_prompt": STRING, "style": STRING, "label": STRING,
               "prompt_id": STRING, "image_index": INT, "seed": INT, "sha256": STRING}
_SYN_PROMPTS = {"prompt_id": STRING, "style": STRING, "wnid": STRING, "label": STRING, "prompt": STRING,
                "negative_prompt": STRING, "d_sem": FLOAT, "d_cov": FLOAT, "sem_level": INT, "cov_level": INT,
                "cell": STRING, "selected": BOOL}
_SYN_REJECTED = {"stage": STRING, "path": STRING, "prompt_id": STRING, "style": STRING, "wnid": STRING,
                 "label": STRING, "prompt": STRING, "reason": STRING}


# ------------------------------------------------------------------------------------------------ views
class GridView(ClipProvenance):
    """A manifest whose images are binned into the shift grid: ``images``, ``cells``, ``edges``."""

    @property
    def images(self) -> pd.DataFrame:
        return self.frame("images")

    @property
    def cells(self) -> pd.DataFrame:
        return self.frame("cells")

    @property
    def edges(self) -> pd.DataFrame:
        """The edges table: axis ('sem' | 'cov'), level, lower, upper."""
        return self.frame("edges")

    def axis_edges(self, axis: str) -> np.ndarray:
        """The n_levels + 1 edges of one axis ('sem' or 'cov'), from the edges table (``isood.science.grid.axis_edges``)."""
        if axis not in AXES:
            raise BadInputError(f"unknown axis {axis!r}; pass one of {', '.join(AXES)}")
        try:
            return grid_axis_edges(self.edges, axis)
        except BadInputError as e:
            raise ManifestError(f"{self.root}: {e}; rebuild the manifest") from None

    @property
    def n_levels(self) -> int:
        """Levels per axis (rows of one axis in the edges table)."""
        return int((self.edges["axis"] == "sem").sum())

    @property
    def na_threshold(self) -> int:
        """The N/A threshold the grid was built with (its ``--na-threshold``; ``NA_THRESHOLD`` when it records
        none): the one default of every reader of the grid (``isood evaluate`` / ``isood.evaluate``,
        ``evaluate_scores``, the OpenOOD export, ``splits clean``), which an explicit threshold overrides."""
        return int(self.field("na_threshold", NA_THRESHOLD))

    @property
    def laid_path(self) -> Path | None:
        """The LAID weights the manifest carries, or None."""
        listed = {r["path"] for r in self.meta.get("files", [])}
        return self.path(LAID_FILE) if LAID_FILE in listed else None


class SplitsView(GridView):
    """``isood build-splits`` / ``isood import isood-lists`` output."""

    @property
    def test_root(self) -> str | None:
        """The folder the images' paths are relative to (None when unknown, e.g. an import)."""
        return self.field("test_root")

    @property
    def id_root(self) -> str | None:
        return self.field("id_root")

    @property
    def id_features(self) -> str | None:
        """The ID feature set the shifts were measured against: ``features-id/`` inside the manifest when
        build-splits extracted it, else the precomputed feature set it was given (when it still exists)."""
        inside = self.root / "features-id"
        if (inside / "manifest.json").is_file():
            return str(inside)
        given = self.field("id")
        return str(given) if given and Path(given).exists() else None

    @property
    def clip_quantile(self) -> tuple[float, float]:
        """The quantiles of the range the levels were cut over (build-splits' ``--clip-quantile``; the grid's
        default ``QUANTILE_CLIP`` for a manifest that records none, e.g. an import)."""
        value = self.field("clip_quantile")
        if value is None:
            return (float(QUANTILE_CLIP[0]), float(QUANTILE_CLIP[1]))
        lo, hi = (float(v) for v in value)
        return (lo, hi)

    @property
    def na_rule(self) -> str | None:
        """An import's N/A rule: 'pooled' (a cell pools its lists across the release's subsets, as the release's
        loader does) or 'per-subset'; None for build-splits (one set of images)."""
        return self.field("na_rule")

    @property
    def release_name(self) -> str | None:
        """An import's release folder name (e.g. 'imagenet21k'); None otherwise."""
        return self.field("release_name")

    @property
    def subsets(self) -> list[str]:
        """An import's subset folders (e.g. ['train', 'val']; [''] for lists at the top); [] otherwise."""
        return list(self.field("subsets") or [])

    @property
    def ann(self) -> dict | None:
        """How the shifts were searched when build-splits ran with --ann-recall (approximate, tuned): target
        recall, achieved recall@1 on held-out images, the estimated share of images whose level (per axis) and
        cell equal an exact build's with a confidence interval, chosen parameters
        (``isood.stages.splits.ann_summary``; ``held_out_check`` False and no interval when the set was too small
        to hold images out); None for exact search or an import."""
        return self.field("ann")


class SynView(GridView):
    """``isood generate-syn`` output (images relative to the manifest folder)."""

    @property
    def prompt_edges(self) -> dict | None:
        """How the prompts were binned (``isood.stages.syn.edges``): mode (prompts | splits | calibrated), the
        quantile clip, the per-axis offset and the edges used; None when the manifest records none."""
        return self.field("prompt_edges")


# ------------------------------------------------------------------------------------------------ registry
_GRID_FIELDS = {"clip": "command.config.clip", "clip_identity": "command.config.clip_identity",
                "na_threshold": "command.config.na_threshold"}

register_kind(KindSpec(
    SPLITS, writer="isood build-splits (or isood import isood-lists)", view=SplitsView,
    tables={"images": TableSpec(IMAGES_COLUMNS, paths=("path",)), "cells": TableSpec(CELLS_COLUMNS),
            "edges": TableSpec(EDGES_COLUMNS),
            "dropped": TableSpec({"set": STRING, "path": STRING, "wnid": STRING, "reason": STRING}, optional=True,
                                 paths=("path",))},
    fields={**_GRID_FIELDS, "test_root": "command.config.test_root", "id_root": "command.config.id_root",
            "id": "command.config.id", "na_rule": "command.config.na_rule",
            "clip_quantile": "command.config.clip_quantile",
            "release_name": "command.config.release_name", "subsets": "command.config.subsets",
            "ann": "summary.ann"},
    card=CardSpec(title="isood splits manifest", licence=imagenet_licence, **GRID_CARD,
                  description="OOD test images graded by semantic (D_sem) and covariate (D_cov) shift from the "
                  "in-distribution set and binned into a grid of shift levels (IS-OOD, \"A Sorites Paradox\").")))
_SYN_TABLES = {"images": TableSpec(_SYN_IMAGES, paths=("path",)), "prompts": TableSpec(_SYN_PROMPTS),
               "edges": TableSpec(EDGES_COLUMNS), "rejected": TableSpec(_SYN_REJECTED, paths=("path",))}
_SYN_FIELDS = {**_GRID_FIELDS, "prompt_edges": "command.config.prompt_edges"}
_SYN_DESCRIPTION = ("Syn-IS: images generated from style x label prompts, graded by the prompts' semantic and "
                    "covariate shift and binned into a grid of shift levels.")
register_kind(KindSpec(
    SYN_IS, writer="isood generate-syn", view=SynView,
    tables={**_SYN_TABLES, "cells": TableSpec(CELLS_COLUMNS)}, fields=_SYN_FIELDS,
    card=CardSpec(title="Syn-IS", description=_SYN_DESCRIPTION, licence=syn_licence, **GRID_CARD)))
register_kind(KindSpec(
    SYN_IS_PROMPTS, writer="isood generate-syn --prompts-only", view=SynView,
    tables={**_SYN_TABLES, "cells": TableSpec(CELLS_COLUMNS)}, fields=_SYN_FIELDS,
    card=CardSpec(title="Syn-IS prompts", licence=syn_prompts_licence, **GRID_CARD,
                  description="The plan of a Syn-IS run (`isood generate-syn --prompts-only`): the images it would "
                  "generate (table `images`: prompt, seed, shift and cell of each; no image files) and every "
                  "candidate prompt (`prompts`).")))
register_kind(KindSpec(
    SYN_IS_PART, writer="isood generate-syn --num-shards N --shard-index i",
    tables={**_SYN_TABLES, "plan": TableSpec({"path": STRING})},
    card=CardSpec(title="Syn-IS part", main="images", split="test", licence=syn_licence,
                  description="One task's share of an `isood generate-syn` job array: the images it generated "
                  "(`images`) and the whole plan (`plan`); `isood merge` combines the parts into a Syn-IS "
                  "manifest.")))
