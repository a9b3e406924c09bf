"""The manifest kinds isood writes, as contracts: their tables (a schema each), the fields other stages may
read, a typed view per kind and the layout of their dataset cards.

Stages exchange data only through manifests read with ``manifests.read(path, kind=...)``, which checks the kind
and every table's schema against the spec registered here and returns the typed view (``SplitsView.edges``,
``.test_root``, ``.clip``...). A stage never reads another stage's ``command.config``: the views do, in one place.
The specs live here, one module below the stages, so that a stage can read another's output without importing
that stage; each spec names the command that writes it.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Mapping

import numpy as np
import pandas as pd

from isood.core.defaults import NA_THRESHOLD, QUANTILE_CLIP
from isood.core.errors import BadInputError, ManifestError
from isood.science.grid import AXES, axis_edges as grid_axis_edges
from manifests.card import markdown_table
from manifests.schema import BOOL, FLOAT, INT, STRING, CardSpec, KindSpec, TableSpec, register_kind
from manifests.store import ManifestView
from wordnet_tools.rules import class_rule_map

__all__ = [
    "FEATURES", "FEATURES_PART", "SPLITS", "SYN_IS", "SYN_IS_PROMPTS", "SYN_IS_PART", "CLASS_FILTER", "AUDIT",
    "IMAGE_LIST", "EVALUATION", "GRID_KINDS", "FeaturesView", "SplitsView", "SynView", "ClassFilterView",
    "AuditView", "ImageListView", "EvaluationView", "IMAGES_COLUMNS", "CELLS_COLUMNS", "EDGES_COLUMNS",
    "LAID_FILE",
]

FEATURES, FEATURES_PART = "features", "features-part"
SPLITS = "splits"
SYN_IS, SYN_IS_PROMPTS, SYN_IS_PART = "syn-is", "syn-is-prompts", "syn-is-part"
CLASS_FILTER, AUDIT = "class-filter", "audit"
IMAGE_LIST = "image-list"
EVALUATION = "evaluation"
#: Kinds whose images are binned into the shift grid (an ``images`` table with levels, ``cells``, ``edges``).
GRID_KINDS = (SPLITS, SYN_IS)
#: The LAID weights a splits / Syn-IS manifest carries (+ ``laid.json``).
LAID_FILE = "laid.safetensors"

# ------------------------------------------------------------------------------------------------ schemas
IMAGES_COLUMNS = {"path": STRING, "wnid": STRING, "d_sem": FLOAT, "d_cov": FLOAT, "sem_level": INT,
                  "cov_level": INT, "cell": STRING}
CELLS_COLUMNS = {"cell": STRING, "cov_level": INT, "sem_level": INT, "n": INT, "na": BOOL}
EDGES_COLUMNS = {"axis": STRING, "level": INT, "lower": FLOAT, "upper": FLOAT}
_CLASSES_COLUMNS = {"wnid": STRING, "name": STRING, "decision": STRING, "rule": STRING, "conflict_wnid": STRING,
                    "conflict_name": STRING, "conflict_hops": INT}
_SUMMARY_COLUMNS = {"decision": STRING, "rule": STRING, "classes": INT}
_AUDIT_COUNTS = {"images": INT, "classes": INT, "leak_images": INT, "leak_share": FLOAT}
_SYN_IMAGES = {**IMAGES_COLUMNS, "prompt": STRING, "negative_prompt": STRING, "style": STRING, "label": STRING,
               "prompt_id": STRING, "image_index": INT, "seed": INT, "sha256": STRING}
_SYN_PROMPTS = {"prompt_id": STRING, "style": STRING, "wnid": STRING, "label": STRING, "prompt": STRING,
                "negative_prompt": STRING, "d_sem": FLOAT, "d_cov": FLOAT, "sem_level": INT, "cov_level": INT,
                "cell": STRING, "selected": BOOL}
_SYN_REJECTED = {"stage": STRING, "path": STRING, "prompt_id": STRING, "style": STRING, "wnid": STRING,
                 "label": STRING, "prompt": STRING, "reason": STRING}


# ------------------------------------------------------------------------------------------------ views
class ClipProvenance(ManifestView):
    """A manifest whose numbers come from one CLIP: the ``--clip`` name and the identity of its weights."""

    @property
    def clip(self) -> str | None:
        """The ``--clip`` name (None when unknown, e.g. an import)."""
        return self.field("clip")

    @property
    def clip_identity(self) -> str | None:
        return self.field("clip_identity")


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
        quantile clip, the per-axis offset and the edges used; None for a manifest written before modes existed."""
        return self.field("prompt_edges")


class FeaturesView(ClipProvenance):
    """``isood extract`` output: shards ``features-NNNNN.npy`` + ``index`` (path, wnid, shard, row)."""

    @property
    def index(self) -> pd.DataFrame:
        return self.frame("index")

    @property
    def rejected(self) -> pd.DataFrame:
        return self.frame("rejected") if "rejected" in self.tables else pd.DataFrame(columns=["path", "wnid", "error"])

    @property
    def embed_dim(self) -> int | None:
        v = self.field("embed_dim")
        return None if v is None else int(v)

    @property
    def decode(self) -> str:
        """The decoding mode of the features (``isood.features.decoding.DECODE_MODES``; manifests written before modes
        existed are ``reference``)."""
        return str(self.field("decode") or "reference")

    @property
    def image_root(self) -> str | None:
        """The folder the index paths are relative to (recorded as ``image_root``; manifests written before it
        was: the image folder, or the folder of the file list)."""
        recorded = self.field("image_root")
        if recorded:
            return str(recorded)
        images = self.field("images")
        if not images:
            return None
        return str(Path(images).parent) if self.field("source_kind") == "list" else str(images)


class ClassFilterView(ManifestView):
    """``isood wordnet filter`` output."""

    @property
    def classes(self) -> pd.DataFrame:
        return self.frame("classes")

    def kept(self) -> tuple[list[str], dict[str, str]]:
        """Kept wnids (sorted) and their names."""
        df = self.classes
        kept = df[df["decision"] == "keep"]
        names = {str(w): str(n) for w, n in zip(kept["wnid"], kept["name"]) if isinstance(n, str) and n}
        return sorted(kept["wnid"].astype(str)), names


class AuditView(ClassFilterView):
    """``isood wordnet audit`` output: the class verdicts; for an audited manifest also ``images`` (its rows with
    their ``rule``) and, for a graded one, ``cells`` / ``levels`` (images and classes per rule)."""

    def class_rules(self) -> dict[str, str]:
        """wnid -> rule ('' when kept) of every audited class."""
        return class_rule_map(self.classes)

    def optional(self, name: str) -> pd.DataFrame | None:
        """The ``images`` / ``cells`` / ``levels`` table, or None (a list-file audit has none)."""
        return self.frame(name) if name in self.tables else None


class ImageListView(ManifestView):
    """``isood import imagenet-ood`` / ``openood-imglist`` output."""

    @property
    def images(self) -> pd.DataFrame:
        return self.frame("images")


class EvaluationView(ManifestView):
    """``isood evaluate`` output."""

    @property
    def cell_metrics(self) -> pd.DataFrame:
        return self.frame("cell_metrics")

    @property
    def model(self) -> str:
        """The model evaluated ('' for a run that does not record it)."""
        return str((self.meta.get("summary") or {}).get("model") or self.config.get("model_name")
                   or self.config.get("model") or "")

    @property
    def detector_params(self) -> dict[str, dict[str, Any]]:
        """Each detector's hyper-parameters as the run used them (``Detector.params()``; {} for older runs)."""
        params = self.config.get("detector_params") or {}
        return {str(n): dict(p) for n, p in params.items() if isinstance(p, Mapping)}

    @property
    def input_hashes(self) -> dict[str, str]:
        """Each recorded input's content hash by input name (``<dataset>_manifest``, ``id_test``, ...)."""
        return {str(i.get("name")): str(i.get("sha256", "")) for i in self.meta.get("inputs", [])
                if isinstance(i, Mapping)}

    def optional(self, name: str) -> pd.DataFrame | None:
        """A table the run may lack (``table1_intervals``, ``scores``, ...), or None."""
        return self.frame(name) if name in self.tables else None

    @property
    def set_metrics(self) -> pd.DataFrame | None:
        """One row per detector and OOD set, with OpenOOD's ``nearood`` / ``farood`` means (None for evaluations
        written before per-set rows existed)."""
        return self.frame("set_metrics") if "set_metrics" in self.tables else None


# ------------------------------------------------------------------------------------------------ cards
def _grid_configs(tables: Mapping[str, Any], meta: Mapping[str, Any]) -> set | None:
    """The cells that get a `datasets` config: the measured (non-N/A) cells of the ``cells`` table, else the
    cells of the main table with at least the N/A threshold of images. With a ``source`` column a cell is
    measured per source: ``(source, cell)`` pairs (``manifests.card`` gives that cell's config that split only)."""
    cells = tables.get("cells")
    if cells is not None and {"cell", "na"} <= set(cells.columns):
        usable = cells[~cells["na"].astype(bool)]
        keys = zip(usable["source"].fillna("").astype(str) if "source" in usable.columns else [""] * len(usable),
                   usable["cell"].astype(str))
        return {(s, c) if s else c for s, c in keys}
    images = tables.get("images")
    if images is None or "cell" not in images.columns:
        return set()
    threshold = int(((meta.get("command") or {}).get("config") or {}).get("na_threshold", NA_THRESHOLD))
    ok = images[(images["sem_level"] >= 0) & (images["cov_level"] >= 0)] if "sem_level" in images.columns else images
    src = ok["source"].fillna("").astype(str) if "source" in ok.columns else pd.Series("", index=ok.index)
    counts = pd.Series(1, index=ok.index).groupby([src, ok["cell"].astype(str)]).sum()
    return {(s, c) if s else c for (s, c), n in counts.items() if n >= threshold}


def _grid_cells(tables: Mapping[str, Any], meta: Mapping[str, Any]) -> list[str] | None:
    """Every cell of the ``cells`` table (N/A and empty ones too): each gets a `datasets` config, without rows
    where ``_grid_configs`` gives it none, so the configs are the cells a user may ask for."""
    cells = tables.get("cells")
    return None if cells is None or "cell" not in cells.columns else sorted(set(cells["cell"].astype(str)))


def _grid_sections(meta: Mapping[str, Any], tables: Mapping[str, Any]) -> list[tuple[str, str]]:
    out = []
    cells = tables.get("cells")
    if cells is not None and {"cov_level", "sem_level", "n", "na"} <= set(cells.columns):
        out.append(("Counts per cell", _na_rule_text(meta) + _grid_markdown(cells)))
    edges = tables.get("edges")
    if edges is not None:
        out.append(("Grid edges", "The level boundaries of each shift axis (table `edges`).\n\n"
                    + markdown_table(edges)))
    return out


def _na_rule_text(meta: Mapping[str, Any]) -> str:
    """How an import decided N/A (``--na-rule``), and its missing lists ('' for other manifests)."""
    config = (meta.get("command") or {}).get("config") or {}
    rule, subsets = config.get("na_rule"), [s or "." for s in config.get("subsets") or []]
    if rule is None:
        return ""
    text = ("N/A rule `pooled`: a cell is the pool of its lists across the subsets (" + ", ".join(subsets) + ") and "
            f"is N/A when the pooled count is below {config.get('na_threshold', NA_THRESHOLD)}, as the release's "
            "evaluation code decides. " if rule == "pooled" else
            "N/A rule `per-subset`: each subset folder's cells are counted and decided on their own (one split per "
            "subset). ")
    missing = ((meta.get("summary") or {}).get("missing_lists") or {})
    if any(missing.values()):
        text += ("Lists missing from the release (imported with `--allow-missing`, flagged `missing` in the "
                 "`cells` table): " + "; ".join(f"{s or '.'}: {', '.join(c)}" for s, c in sorted(missing.items()))
                 + ". ")
    return text + "\n\n"


def _grid_markdown(cells: pd.DataFrame) -> str:
    """Rows: covariate level; columns: semantic level; N/A cells with their count in brackets."""
    usable = int((~cells["na"].astype(bool)).sum())
    text = ["Rows: covariate level; columns: semantic level (0-based; cell `cov_{c}_sem_{s}`). Every cell has a "
            "config; an N/A cell (fewer images than the N/A threshold; its count is shown in brackets) and an "
            "empty one hold no rows there (see Configs). "
            f"{usable} cells usable, {len(cells) - usable} N/A.\n"]
    sources = sorted(cells["source"].fillna("").astype(str).unique()) if "source" in cells.columns else [""]
    for source in sources:
        part = cells if source == "" and "source" not in cells.columns else cells[cells["source"].fillna("") == source]
        n = 1 + int(max(part["cov_level"].max(), part["sem_level"].max()))
        grid = {(int(r.cov_level), int(r.sem_level)): r for r in part.itertuples(index=False)}
        if source:
            text.append(f"**{source}**\n")
        text.append("| cov \\ sem | " + " | ".join(str(s) for s in range(n)) + " |")
        text.append("|---|" + "---|" * n)
        for c in range(n):
            row = []
            for s in range(n):
                rec = grid.get((c, s))
                text_n = "–" if rec is None else (f"N/A ({int(rec.n)})" if rec.na else str(int(rec.n)))
                row.append(f"missing, {text_n}" if rec is not None and bool(getattr(rec, "missing", False)) else text_n)
            text.append(f"| {c} | " + " | ".join(row) + " |")
        text.append("")
    return "\n".join(text)


def _imagenet_licence(meta: Mapping[str, Any]) -> str:
    return ("ImageNet images are never redistributed: this dataset holds relative image paths, WordNet ids and shift "
            "values only. Obtain ImageNet-1K / ImageNet-21K from https://image-net.org under its terms of access and "
            "resolve `path` against the root of your own copy. WordNet is under the Princeton WordNet licence. "
            "The metadata in this repository is released by its publisher under the licence stated in the front "
            "matter.\n")


def _syn_licence(meta: Mapping[str, Any]) -> str:
    pipeline = ((meta.get("command") or {}).get("config") or {}).get("pipeline") or "stabilityai/sdxl-turbo"
    settings = (((meta.get("command") or {}).get("config") or {}).get("generator") or {}).get("settings") or {}
    pipeline = settings.get("pipeline", pipeline)
    return (f"The Syn-IS images under `images/` were generated with `{pipeline}` and may be redistributed within "
            "the terms of that model's licence (for SDXL-Turbo: the Stability AI licence); check it before any "
            "commercial use. Prompts use ImageNet-21K labels (WordNet, Princeton licence). No ImageNet image is "
            "included; `d_sem` / `d_cov` were measured against in-distribution ImageNet features.\n")


def _syn_prompts_licence(meta: Mapping[str, Any]) -> str:
    return ("No image is included (a plan only). Prompts use ImageNet-21K labels (WordNet, Princeton licence); "
            "`d_sem` / `d_cov` were measured against in-distribution ImageNet features.\n")


# ``reads``: the tables the card callbacks read besides the main one; the others (a splits' ``dropped``, an
# audit's per-image ``images``: a row per image) are never loaded to draw a card.
_GRID_CARD: dict[str, Any] = dict(main="images", split="test", split_by="source", config_by="cell",
                                  allowed_configs=_grid_configs, config_values=_grid_cells, sections=_grid_sections,
                                  reads=("cells", "edges"))
_DECISION_CARD: dict[str, Any] = dict(main="classes", config_by="decision", config_names={"keep": "kept", "drop": "dropped"},
                                      licence=_imagenet_licence, reads=())

# ------------------------------------------------------------------------------------------------ registry
_GRID_FIELDS = {"clip": "command.config.clip", "clip_identity": "command.config.clip_identity",
                "na_threshold": "command.config.na_threshold"}

register_kind(KindSpec(
    FEATURES, writer="isood extract", view=FeaturesView,
    tables={"index": TableSpec({"path": STRING, "wnid": STRING, "shard": INT, "row": INT}, paths=("path",)),
            "rejected": TableSpec({"path": STRING, "error": STRING}, optional=True, paths=("path",))},
    fields={"clip": "command.config.clip", "clip_identity": "command.config.clip_identity",
            "embed_dim": "summary.embed_dim", "images": "command.config.images",
            "image_root": "command.config.image_root",
            "source_kind": "command.config.source_kind", "decode": "command.config.decode"},
    card=CardSpec(title="isood features manifest", description="Image features and their index.", main="index",
                  licence=_imagenet_licence)))
register_kind(KindSpec(
    FEATURES_PART, writer="isood extract --num-shards N --shard-index i",
    tables={"shards": TableSpec({"shard": INT, "key": STRING, "images": INT, "rejected": INT})},
    fields={"embed_dim": "summary.embed_dim"},
    card=CardSpec(title="isood features part", main="shards", licence=_imagenet_licence,
                  description="One task's share of an `isood extract` job array: its feature shards (images "
                  "encoded and rejected per shard); `isood merge` combines the parts into a features manifest.")))
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
    card=CardSpec(title="isood splits manifest", licence=_imagenet_licence, **_GRID_CARD,
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
    card=CardSpec(title="Syn-IS", description=_SYN_DESCRIPTION, licence=_syn_licence, **_GRID_CARD)))
register_kind(KindSpec(
    SYN_IS_PROMPTS, writer="isood generate-syn --prompts-only", view=SynView,
    tables={**_SYN_TABLES, "cells": TableSpec(CELLS_COLUMNS)}, fields=_SYN_FIELDS,
    card=CardSpec(title="Syn-IS prompts", licence=_syn_prompts_licence, **_GRID_CARD,
                  description="The plan of a Syn-IS run (`isood generate-syn --prompts-only`): the images it would "
                  "generate (table `images`: prompt, seed, shift and cell of each; no image files) and every "
                  "candidate prompt (`prompts`).")))
register_kind(KindSpec(
    SYN_IS_PART, writer="isood generate-syn --num-shards N --shard-index i",
    tables={**_SYN_TABLES, "plan": TableSpec({"path": STRING})},
    card=CardSpec(title="Syn-IS part", main="images", split="test", licence=_syn_licence,
                  description="One task's share of an `isood generate-syn` job array: the images it generated "
                  "(`images`) and the whole plan (`plan`); `isood merge` combines the parts into a Syn-IS "
                  "manifest.")))
register_kind(KindSpec(
    CLASS_FILTER, writer="isood wordnet filter", view=ClassFilterView,
    tables={"classes": TableSpec(_CLASSES_COLUMNS), "summary": TableSpec(_SUMMARY_COLUMNS)},
    card=CardSpec(title="isood class-filter manifest", **_DECISION_CARD,
                  description="The ImageNet-OOD class filter: every candidate class with its decision, the rule "
                  "that dropped it and the in-distribution class it conflicts with.")))
register_kind(KindSpec(
    AUDIT, writer="isood wordnet audit", view=AuditView,
    tables={"classes": TableSpec({**_CLASSES_COLUMNS, "entries": INT}),
            "summary": TableSpec({**_SUMMARY_COLUMNS, "entries": INT}),
            "images": TableSpec({"wnid": STRING, "rule": STRING}, optional=True, paths=("path",),
                                doc="the audited manifest's rows (path, cell, levels when present) with their rule"),
            "cells": TableSpec(_AUDIT_COUNTS | {"cell": STRING, "cov_level": INT, "sem_level": INT}, optional=True),
            "levels": TableSpec(_AUDIT_COUNTS | {"axis": STRING, "level": INT}, optional=True)},
    card=CardSpec(title="isood audit manifest", **_DECISION_CARD,
                  description="An audit of an OOD class or image list for WordNet hierarchy leaks into the "
                  "in-distribution classes.")))
register_kind(KindSpec(
    IMAGE_LIST, writer="isood import imagenet-ood / openood-imglist", view=ImageListView,
    tables={"images": TableSpec({"path": STRING, "wnid": STRING, "label": INT}, paths=("path",))},
    card=CardSpec(title="OOD image list", description="An OOD image list (relative image paths).", main="images",
                  split="test", licence=_imagenet_licence)))
register_kind(KindSpec(
    EVALUATION, writer="isood evaluate", view=EvaluationView,
    tables={"cell_metrics": TableSpec({"detector": STRING, "dataset": STRING, "cell": STRING, "cov_level": INT,
                                       "sem_level": INT, "n": INT, "na": BOOL}),
            "level_curves": TableSpec({"detector": STRING, "dataset": STRING, "axis": STRING, "level": INT,
                                       "metric": STRING, "value": FLOAT}),
            "table1": TableSpec({"detector": STRING, "dataset": STRING, "axis": STRING, "metric": STRING,
                                 "correlation": FLOAT, "sensitivity": FLOAT}),
            "detector_means": TableSpec({"detector": STRING, "dataset": STRING}),
            "set_metrics": TableSpec({"detector": STRING, "dataset": STRING, "group": STRING, "kind": STRING,
                                      "n": INT, "n_id": INT}, optional=True,
                                     doc="one row per detector and OOD set (ID test vs the whole set), with the "
                                     "nearood / farood group means (OpenOOD's rows)"),
            "leak_effect": TableSpec({"detector": STRING, "dataset": STRING, "cell": STRING, "metric": STRING,
                                      "all": FLOAT, "leak_free": FLOAT, "diff": FLOAT}, optional=True,
                                     doc="isood evaluate --leak-audit: per cell, all images vs leak-free"),
            "leak_ranking": TableSpec({"dataset": STRING, "scope": STRING, "key": STRING, "metric": STRING,
                                       "kendall_tau": FLOAT, "changed": BOOL}, optional=True,
                                      doc="isood evaluate --leak-audit: detector order with and without leaks"),
            "cell_intervals": TableSpec({"detector": STRING, "dataset": STRING, "cell": STRING, "metric": STRING,
                                         "value": FLOAT, "low": FLOAT, "high": FLOAT, "n_boot": INT}, optional=True,
                                        doc="bootstrap 95% interval of each measured cell's AUROC and FPR@95"),
            "table1_intervals": TableSpec({"detector": STRING, "dataset": STRING, "axis": STRING, "metric": STRING,
                                           "correlation": FLOAT, "correlation_low": FLOAT,
                                           "correlation_high": FLOAT, "sensitivity": FLOAT,
                                           "sensitivity_low": FLOAT, "sensitivity_high": FLOAT, "n_boot": INT},
                                          optional=True, doc="bootstrap 95% intervals of Table 1")},
    card=CardSpec(title="isood evaluation", main="cell_metrics", licence=_imagenet_licence,
                  description="OOD detectors scored per cell of a shift grid and per OOD set: every metric per "
                  "cell, level curves, Table 1 (correlation and sensitivity per axis), per-set rows.")))


def read(root: str | Path, kind: str | tuple[str, ...] | None = None, *, verify: str | None = None):
    """``isood.read``: ``manifests.read`` with isood's kinds registered (importing this module registers them), so a
    typed view comes back whether or not the distribution's install metadata (its entry point) is there."""
    from manifests.store import read as read_manifest

    return read_manifest(root, kind, verify=verify)
