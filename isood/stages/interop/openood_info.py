"""The data info of an OpenOOD export folder (pure): which group (near / far / val) each exported dataset joins,
the per-benchmark records, their merge into one ``openood_data_info.json`` and one YAML config, and what the
folder still lacks for OpenOOD's and for the IS-OOD release's loaders. No file I/O here.

One export folder is one OpenOOD data root holding any number of benchmarks (a splits grid, a Syn-IS grid, an
image list, ...), each under its own name, plus at most one set of ID lists and one OOD ``val`` split. The JSON
keeps a record per benchmark (``benchmarks``); a re-export of one benchmark replaces its record and nothing else.
``data_info`` is rebuilt from every record: the shape of OpenOOD v1.5's ``evaluation_api.datasets.DATA_INFO[...]``
entry (``num_classes``, ``id`` train / val / test, ``csid``, ``ood`` val / near / far).

Near / far (OpenOOD v1.5): near-OOD sets have a semantic shift only (classes close to the ID classes: SSB-hard,
NINCO), far-OOD sets add an obvious covariate (domain) shift (iNaturalist, Textures, OpenImage-O); OpenOOD
reports each set and each group's mean. A grid registers every usable cell as a dataset of its own, grouped by
its level on one axis (``GroupRule``): near = level < K (default: the semantic axis, K = the lower half of the
levels), far = the rest. A set without levels (an image list) joins the group it is given (default near).
A dataset is in one group only. A group the folder leaves empty stays empty (``empty_groups``) and is named in
``ready``: OpenOOD's ``Evaluator.eval_ood`` averages each group and fails on an empty one.

``num_classes`` comes from the ID classes (``--num-classes``, else the ID lists: ``id_lists.id_labels``) and is
recorded with where it came from; a folder of OOD exports only has None until ID lists (or ``--num-classes``)
give it.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from typing import Any, Iterable, Mapping, Sequence

from isood.core.errors import BadInputError

__all__ = [
    "INFO_FORMAT", "ID_NAME", "ID_SPLITS", "GROUPS", "LIST_GROUPS", "NEAR_AXES", "RELEASE_LEVELS",
    "RELEASE_GRIDS", "GroupRule", "assign_groups", "benchmark_record", "folder_info", "merge_info",
    "empty_groups", "folder_classes", "data_info_entry", "dataset_config", "release_loader_files", "missing_for_release", "missing_for_openood",
    "dataset_name",
]

INFO_FORMAT = "isood openood export 2"
#: The ID set's folder name: ``imglist/imagenet1k/`` (the release) and ``benchmark_imglist/imagenet1k/`` (OpenOOD);
#: its images lie under ``<data root>/imagenet1k/`` for both.
ID_NAME = "imagenet1k"
ID_SPLITS = ("train", "val", "test")
GROUPS = ("near", "far")
LIST_GROUPS = ("near", "far", "val")
NEAR_AXES = {"sem": "sem_level", "cov": "cov_level"}
#: The release's ``datasets.py`` (``get_id_ood_dataloader_level_split``) opens 8 x 8 cell lists of these grids,
#: each in these sub-folders ('' = at the top), plus ``imglist/imagenet1k/{train,val,test}_imagenet.txt``.
RELEASE_LEVELS = 8
RELEASE_GRIDS = {"imagenet21k": ("train", "val"), "SynIS": ("",)}


@dataclass(frozen=True)
class GroupRule:
    """How an export's datasets join OpenOOD's groups: a grid cell is near when its level on ``axis`` ('sem' or
    'cov') is below ``below`` (None: ``ceil(n_levels / 2)``, the lower half), else far; a set without levels
    joins ``group`` ('near', 'far' or 'val')."""

    axis: str = "sem"
    below: int | None = None
    group: str = "near"

    def check(self, n_levels: int | None) -> "GroupRule":
        """The rule, or a one-line error naming the option that is out of range for a grid of ``n_levels``."""
        if self.axis not in NEAR_AXES:
            raise BadInputError(f"--near-axis {self.axis!r}: pass sem (semantic level) or cov (covariate level)")
        if self.group not in LIST_GROUPS:
            raise BadInputError(f"--group {self.group!r}: pass near, far or val")
        if self.below is not None and n_levels is not None and not 1 <= self.below <= n_levels - 1:
            raise BadInputError(f"--near-below {self.below}: pass 1..{n_levels - 1} (cells with {self.axis} level "
                                f"< K are near-OOD, the others far-OOD, on this {n_levels}-level grid)")
        return self

    def threshold(self, n_levels: int) -> int:
        return self.below if self.below is not None else math.ceil(n_levels / 2)


def dataset_name(benchmark: str, source: str = "", cell: str | None = None) -> str:
    """The OpenOOD dataset name of a cell (``<benchmark>_[<source>_]<cell>``) or of a set without cells (the
    benchmark's name): unique across the benchmarks of one folder."""
    parts = [benchmark, re.sub(r"\W+", "_", source).strip("_") if source else "", cell or ""]
    return "_".join(p for p in parts if p)


def assign_groups(datasets: Sequence[dict], n_levels: int | None, rule: GroupRule,
                  val_cells: Iterable[str] = ()) -> list[dict]:
    """Each dataset record with its ``group``: 'na' (N/A: written, not registered), 'val' (a held-out cell), else
    near / far by ``rule`` (pure)."""
    held = set(val_cells)
    out = []
    for d in datasets:
        if d.get("cell") in held:
            group = "val"
        elif d["na"]:
            group = "na"
        elif d.get("sem_level") is None or n_levels is None:
            group = rule.group
        else:
            group = "near" if d[NEAR_AXES[rule.axis]] < rule.threshold(n_levels) else "far"
        out.append({**d, "group": group})
    return out


def benchmark_record(datasets: Sequence[dict], *, kind: str, manifest: Mapping[str, Any], n_levels: int | None,
                     rule: GroupRule, val: Mapping[str, Any] | None, release_lists: int) -> dict:
    """What the folder's JSON keeps of one export (pure): its manifest, rule, datasets (with their groups) and
    its OOD val split (None when it has none)."""
    return {"kind": kind, "manifest": dict(manifest), "n_levels": n_levels,
            "rule": {"near_axis": rule.axis, "near_below": rule.threshold(n_levels) if n_levels else None,
                     "group": rule.group},
            "datasets": list(datasets), "val": dict(val) if val else None, "release_lists": release_lists}


def folder_info(old: Mapping[str, Any] | None) -> dict:
    """A folder's JSON (``openood_data_info.json``): empty for none, as is when it is this format's
    (``INFO_FORMAT``), else a one-line refusal."""
    if not old:
        return {"benchmarks": {}}
    if old.get("format") != INFO_FORMAT:
        raise BadInputError("the folder's openood_data_info.json is not an isood export's; pass a new --out")
    return dict(old)


def _check_unique(benchmarks: Mapping[str, dict], new: str) -> None:
    """Every dataset name belongs to one benchmark (the one exported now, ``new``, is named in the error)."""
    seen: dict[str, str] = {}
    for name, rec in sorted(benchmarks.items(), key=lambda kv: kv[0] == new):
        names = [d["dataset"] for d in rec["datasets"]] + ([rec["val"]["dataset"]] if rec.get("val") else [])
        for ds in names:
            if ds in seen and seen[ds] != name:
                raise BadInputError(f"dataset name {ds!r} of benchmark {name!r} is also one of {seen[ds]!r}: pass "
                                    "another --name")
            seen[ds] = name


def folder_classes(info: Mapping[str, Any] | None) -> int | None:
    """The number of ID classes a folder's exports fixed (``folder_info``'s JSON; None for none)."""
    have = (info or {}).get("num_classes")
    return None if have is None else int(have)


def _classes(info: Mapping[str, Any], num_classes: int | None, source: str | None) -> tuple[int | None, str | None]:
    """The folder's number of ID classes after one export and where it came from: ``num_classes`` (from
    ``source``: '--num-classes' or 'ID lists') when given, else the folder's."""
    have, have_from = folder_classes(info), info.get("num_classes_from")
    if num_classes is None:
        return have, have_from if have is not None else None
    if have is None or have == num_classes:
        return num_classes, (have_from if have is not None else None) or source
    what = f"--num-classes {num_classes}" if source == "--num-classes" else \
        f"the {num_classes} ID classes of these ID lists"
    raise BadInputError(f"{what} differs from the {have} of the exports already in this folder: pass "
                        f"--num-classes {have} (and ID lists of {have} classes), or another --out")


def merge_info(old: Mapping[str, Any] | None, name: str, record: Mapping[str, Any] | None, *,
               num_classes: int | None, num_classes_from: str | None = "--num-classes",
               id_lists: Mapping[str, dict] | None = None, data_root: str = "./data/") -> dict:
    """The folder's JSON after one export (pure): ``old`` (``folder_info``) with benchmark ``name``'s record
    replaced by ``record`` (None: leave the benchmarks as they are), the ID lists of ``id_lists`` replacing those
    splits; ``data_info`` rebuilt from every record. One-line errors: another number of ID classes than the
    folder's (``_classes``), a second OOD val split, two benchmarks with one dataset name."""
    info = folder_info(old)
    n, n_from = _classes(info, num_classes, num_classes_from)
    benchmarks = {k: v for k, v in info.get("benchmarks", {}).items() if k != name}
    if record is not None:
        benchmarks[name] = dict(record)
    benchmarks = dict(sorted(benchmarks.items()))
    vals = [k for k, v in benchmarks.items() if v.get("val")]
    if len(vals) > 1:
        raise BadInputError(f"an OOD val split comes from {vals[0]!r} already (OpenOOD takes one): re-export "
                            f"{vals[0]!r} without it, or leave --val-cells / --group val out for {name!r}")
    _check_unique(benchmarks, name)
    ids = {**info.get("id", {}), **(id_lists or {})}
    ids = {s: ids[s] for s in ID_SPLITS if s in ids}
    merged: dict[str, Any] = {"format": INFO_FORMAT, "num_classes": n, "num_classes_from": n_from, "id": ids,
              "benchmarks": benchmarks, "data_root": data_root}
    merged["data_info"] = data_info_entry(merged)
    merged["empty_groups"] = empty_groups(merged)
    return merged


def _entry(d: Mapping[str, Any], key: str = "imglist_path", root: str = "") -> dict:
    return {"data_dir": root + d["data_dir"], key: root + d["imglist_path"]}


def _groups(info: Mapping[str, Any]) -> dict[str, list[dict]]:
    """The registered datasets of every benchmark by group (benchmarks by name); each dataset in its own group
    only, an empty group empty."""
    groups: dict[str, list[dict]] = {g: [] for g in GROUPS}
    for rec in info["benchmarks"].values():
        for d in rec["datasets"]:
            if d.get("group") in groups:
                groups[d["group"]].append(d)
    return groups


def empty_groups(info: Mapping[str, Any]) -> list[str]:
    """The OpenOOD groups (near, far) with no dataset while the other has some (pure): OpenOOD's ``eval_ood``
    fails on them; [] when both have datasets, or neither (nothing registered: ``missing_for_openood`` says)."""
    groups = _groups(info)
    if not any(groups.values()):
        return []
    return [g for g in GROUPS if not groups[g]]


def _val(info: Mapping[str, Any]) -> dict | None:
    return next((rec["val"] for rec in info["benchmarks"].values() if rec.get("val")), None)


def data_info_entry(info: Mapping[str, Any]) -> dict:
    """OpenOOD's ``DATA_INFO[<id name>]`` entry of the folder (pure): ``num_classes``; ``id`` with the ID lists
    written for OpenOOD (``imagenet1k/`` image root; a split without class labels has the release's list only);
    ``csid`` empty; ``ood``: ``val`` when a benchmark gave one, ``near`` and ``far`` with their registered
    datasets (an empty group empty). Paths are relative to the folder (OpenOOD's data root)."""
    ood: dict[str, Any] = {}
    val = _val(info)
    if val:
        ood["val"] = _entry(val)
    for g, datasets in _groups(info).items():
        ood[g] = {"datasets": [d["dataset"] for d in datasets], **{d["dataset"]: _entry(d) for d in datasets}}
    return {"num_classes": info["num_classes"], "id": {s: _entry(v) for s, v in _openood_ids(info).items()},
            "csid": {"datasets": []}, "ood": ood}


def _openood_ids(info: Mapping[str, Any]) -> dict[str, dict]:
    """The ID splits with an OpenOOD list (a split without class labels has the release's list only)."""
    return {s: v for s, v in info["id"].items() if v.get("imglist_path")}


def _group_config(datasets: Sequence[dict], root: str) -> dict:
    return {"datasets": [d["dataset"] for d in datasets],
            **{d["dataset"]: _entry(d, "imglist_pth", root) for d in datasets}}


def dataset_config(info: Mapping[str, Any], *, data_root: str | None = None) -> dict:
    """The folder as OpenOOD's older config pipeline reads it (``configs/datasets/...`` yml; pure): a ``dataset:``
    block with the ID lists written and an ``ood_dataset:`` block (``val`` when there is one, ``nearood``,
    ``farood``), every path prefixed with ``data_root`` (default: the folder's)."""
    root = info.get("data_root", "./data/") if data_root is None else data_root
    n = info["num_classes"]
    out: dict[str, Any] = {}
    ids = _openood_ids(info)
    if ids:
        out["dataset"] = {
            "name": ID_NAME, "num_classes": n, "pre_size": 256, "image_size": 224, "interpolation": "bilinear",
            "normalization_type": "imagenet", "split_names": list(ids),
            **{s: {"dataset_class": "ImglistDataset", **_entry(v, "imglist_pth", root), "batch_size": 128,
                   "shuffle": s == "train"} for s, v in ids.items()}}
    groups, val = _groups(info), _val(info)
    ood: dict[str, Any] = {
        "name": f"{ID_NAME}_ood", "num_classes": n, "dataset_class": "ImglistDataset", "interpolation": "bilinear",
        "batch_size": 256, "shuffle": False, "pre_size": 256, "image_size": 224, "num_workers": 8,
        "split_names": (["val"] if val else []) + ["nearood", "farood"]}
    if val:
        ood["val"] = _entry(val, "imglist_pth", root)
    ood["nearood"] = _group_config(groups["near"], root)
    ood["farood"] = _group_config(groups["far"], root)
    out["ood_dataset"] = ood
    return out


def release_loader_files(levels: int = RELEASE_LEVELS) -> list[str]:
    """Every list the release's ``datasets.py`` opens (relative to its ``data_root``), in its order."""
    files = [f"imglist/{ID_NAME}/{s}_imagenet.txt" for s in ID_SPLITS]
    for name, subsets in RELEASE_GRIDS.items():
        files += ["/".join(x for x in ("imglist", name, sub, f"cov_{c}_sem_{s}.txt") if x)
                  for c in range(levels) for s in range(levels) for sub in subsets]
    return files


def missing_for_release(present: Iterable[str]) -> list[str]:
    """What the release's ``datasets.py`` would fail to open in a folder holding ``present`` (relative paths),
    one line per list folder with what to export (pure)."""
    have = set(present)
    missing = [f for f in release_loader_files() if f not in have]
    out = []
    ids = [f for f in missing if f.startswith(f"imglist/{ID_NAME}/")]
    if ids:
        out.append(f"{', '.join(ids)} (pass --id-train / --id-val / --id-test)")
    hints = {"imagenet21k": "export the ImageNet-21K splits with --name imagenet21k",
             "SynIS": "export the Syn-IS manifest with --name SynIS"}
    for name, subsets in RELEASE_GRIDS.items():
        for sub in subsets:
            folder = "/".join(x for x in ("imglist", name, sub) if x) + "/"
            n = sum(1 for f in missing if f.rsplit("/", 1)[0] + "/" == folder)
            if n:
                why = hints[name] if n == RELEASE_LEVELS ** 2 else f"the release reads {RELEASE_LEVELS} x " \
                      f"{RELEASE_LEVELS} cells"
                out.append(f"{folder} ({n} of {RELEASE_LEVELS ** 2} cell lists missing: {why})")
    return out


def missing_for_openood(info: Mapping[str, Any]) -> list[str]:
    """What OpenOOD's ``Evaluator`` still lacks in the folder's lists (pure; the images are checked by the
    export): ID lists with class labels (it loads train, val and test), the number of ID classes, an OOD val
    split (every APS-mode postprocessor searches its hyperparameters on ID val + OOD val: ebo, react, knn, vim,
    ash, odin), a registered OOD dataset, and a dataset in each of near and far (``eval_ood`` averages each)."""
    out = []
    absent = [s for s in ID_SPLITS if s not in info["id"]]
    if absent:
        out.append(f"ID {'/'.join(absent)} lists (pass {', '.join('--id-' + s for s in absent)})")
    blank = [s for s in ID_SPLITS if s in info["id"] and not info["id"][s].get("imglist_path")]
    if blank:
        out.append(f"class labels for the ID {'/'.join(blank)} images (written for the release only: OpenOOD needs "
                   "'path label' lines; pass an OpenOOD imglist, class folders, or wnid paths with --classes)")
    if info.get("num_classes") is None:
        out.append("the number of ID classes (pass --num-classes, or ID lists with class labels)")
    if _val(info) is None:
        out.append("an OOD val split for APS-mode postprocessors (pass --val-cells for a grid, or export an image "
                   "list with --group val)")
    if not any(_groups(info).values()):
        out.append("a usable OOD dataset (export a splits, syn-is or image-list manifest with cells above the N/A "
                   "threshold)" if not info["benchmarks"] else "a usable OOD dataset (every exported cell is N/A)")
    for g in empty_groups(info):
        out.append(f"a {g}-OOD dataset: the {g} group is empty and OpenOOD's eval_ood averages each group (pass "
                   f"--near-below / --near-axis to split the grid's cells, or export an image list with --group {g})")
    return out
