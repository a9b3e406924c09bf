"""Export of a splits, syn-is or image-list manifest as OpenOOD v1.5 benchmark imglists plus its configs (read
the manifest -> plan the imglists and configs (pure) -> write); see ``isood.stages.interop`` for the layout."""

from __future__ import annotations

import json
import os
import re
import shutil
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping, Sequence

import numpy as np
import pandas as pd
import yaml

from isood.defaults import NA_THRESHOLD, OOD_LABEL
from isood.errors import BadInputError
from isood.grid import cell_name
from isood.kinds import GRID_KINDS, IMAGE_LIST, SPLITS, SYN_IS
from isood.runtime import atomic_write_bytes
from manifests import Manifest, read

__all__ = [
    "EXPORT_INFO", "EXPORT_YAML", "EXPORT_KINDS", "ExportResult", "ExportPlan", "imglist_lines", "na_flags",
    "cell_datasets", "single_dataset", "near_far", "data_info", "ood_dataset_config", "plan_export",
    "export_openood",
]

EXPORT_INFO = "openood_data_info.json"
EXPORT_YAML = "openood_ood_dataset.yml"
#: The kinds `export_openood` reads (they have an `images` table of relative paths).
EXPORT_KINDS = (SPLITS, SYN_IS, IMAGE_LIST)


@dataclass
class ExportResult:
    out: Path
    imglists: dict[str, str] = field(default_factory=dict)  # dataset name -> imglist path (relative to out)
    registered: list[str] = field(default_factory=list)  # datasets in openood_data_info.json (non-N/A)
    rows: int = 0
    skipped: int = 0  # rows without a cell (level -1)


def imglist_lines(images: pd.DataFrame, *, where: str) -> pd.Series:
    """One OpenOOD imglist line (`path label\\n`) per image (pure); label OOD_LABEL where there is none. A path
    with whitespace (which OpenOOD cannot parse) is an error naming it."""
    bad = images["path"].astype(str).str.contains(r"\s", regex=True)
    if bad.any():
        raise BadInputError(f"{where}: image path {images['path'][bad].iloc[0]!r} contains whitespace, which "
                            "OpenOOD imglists cannot hold; rename the files")
    labels = (images["label"].fillna(OOD_LABEL).astype(np.int64) if "label" in images.columns
              else pd.Series(OOD_LABEL, index=images.index, dtype=np.int64))
    return images["path"].astype(str) + " " + labels.astype(str) + "\n"


def _sources(frame: pd.DataFrame) -> pd.Series:
    if "source" not in frame.columns:
        return pd.Series("", index=frame.index, dtype=object)
    return frame["source"].fillna("").astype(str)


def na_flags(cells: pd.DataFrame) -> dict[tuple[str, str], bool]:
    """``(source, cell) -> na`` from a manifest's `cells` table (source '' when the table has no source)."""
    return {(s, str(c)): bool(na) for s, c, na in zip(_sources(cells), cells["cell"], cells["na"])}


@dataclass(frozen=True)
class ExportPlan:
    """What an OpenOOD export writes: imglist texts by path (relative to the export folder), one dataset record
    per imglist, the rows without a cell and the number of levels seen."""

    files: dict[str, str]
    datasets: list[dict]
    skipped: int = 0
    n_levels: int = 1


def _slug(text: str) -> str:
    return re.sub(r"\W+", "_", text).strip("_")


def _data_dir_for(data_dir: str, source: str) -> str:
    return data_dir + (source.rstrip("/") + "/" if source else "")


def cell_datasets(images: pd.DataFrame, lines: pd.Series, na_of: Mapping[tuple[str, str], bool], *, base: str,
                  data_dir: str, na_threshold: int = NA_THRESHOLD) -> ExportPlan:
    """One imglist per (source, cell) of a grid manifest's images (pure). Rows with level -1 on an axis are
    skipped; `na_of` (`na_flags` of the cells table) decides N/A, else a count below `na_threshold`. The number
    of levels is the highest level seen + 1."""
    src = _sources(images)
    cov, sem = images["cov_level"], images["sem_level"]
    has = cov.notna() & sem.notna() & (cov >= 0) & (sem >= 0)
    keyed = pd.DataFrame({"source": src, "cov": cov.where(has, -1).astype(int),
                          "sem": sem.where(has, -1).astype(int)})[has]
    n_levels = int(max(keyed["cov"].max(), keyed["sem"].max(), 0)) + 1 if len(keyed) else 1
    files: dict[str, str] = {}
    datasets: list[dict] = []
    for (s, c, l), idx in sorted(keyed.groupby(["source", "cov", "sem"], sort=True).groups.items()):
        cell = cell_name(c, l)
        rel = "/".join(x for x in (base, s, f"test_{cell}.txt") if x)
        files[rel] = "".join(lines.loc[idx])
        na = na_of.get((s, cell), na_of.get(("", cell), len(idx) < na_threshold))
        datasets.append({"dataset": f"{_slug(s)}_{cell}" if s else cell, "source": s, "cell": cell,
                         "cov_level": int(c), "sem_level": int(l), "n": int(len(idx)), "na": bool(na),
                         "data_dir": _data_dir_for(data_dir, s), "imglist_path": rel})
    return ExportPlan(files=files, datasets=datasets, skipped=int((~has).sum()), n_levels=n_levels)


def single_dataset(lines: pd.Series, *, base: str, name: str, data_dir: str) -> ExportPlan:
    """One imglist of every image (a manifest without a grid), registered as one dataset (pure)."""
    rel = f"{base}/test_{name}.txt"
    return ExportPlan(files={rel: "".join(lines)}, datasets=[{
        "dataset": name, "source": "", "cell": None, "cov_level": None, "sem_level": None, "n": len(lines),
        "na": False, "data_dir": data_dir, "imglist_path": rel}])


def near_far(datasets: Sequence[dict], n_levels: int) -> tuple[list[dict], list[dict]]:
    """OpenOOD's near / far groups of the non-N/A datasets: semantic level in the lower / upper half of the
    levels (a dataset without a level is in both); when a group would be empty both get every dataset."""
    usable = [d for d in datasets if not d["na"]]
    half = n_levels / 2
    near = [d for d in usable if d["sem_level"] is None or d["sem_level"] < half]
    far = [d for d in usable if d["sem_level"] is None or d["sem_level"] >= half]
    if not near or not far:
        near = far = usable
    return near, far


def _group(datasets: Sequence[dict], *, root: str, key: str) -> dict:
    g: dict[str, Any] = {"datasets": [d["dataset"] for d in datasets]}
    for d in datasets:
        g[d["dataset"]] = {"data_dir": root + d["data_dir"], key: root + d["imglist_path"]}
    return g


def data_info(plan: ExportPlan, *, name: str, num_classes: int, manifest: Manifest) -> dict:
    """The `openood_data_info.json` record: OpenOOD's `DATA_INFO[...]["ood"]` shape plus every dataset (pure)."""
    near, far = near_far(plan.datasets, plan.n_levels)
    return {
        "format": "isood openood export 1",
        "name": name,
        "num_classes": num_classes,
        "ood": {"near": _group(near, root="", key="imglist_path"), "far": _group(far, root="", key="imglist_path")},
        "usage": "from openood.evaluation_api.datasets import DATA_INFO; "
                 f"DATA_INFO['imagenet']['ood'] = json.load(open('{EXPORT_INFO}'))['ood']; "
                 "copy benchmark_imglist/ into OpenOOD's data root and put the images under data_dir",
        "datasets": plan.datasets,
        "manifest": {"path": str(manifest.root), "kind": manifest.kind, "dataset_version": manifest.dataset_version,
                     "content_sha256": manifest.content_sha256},
    }


def ood_dataset_config(plan: ExportPlan, *, name: str, num_classes: int, data_root: str) -> dict:
    """The OpenOOD `configs/datasets/...` `ood_dataset:` block of an export (pure)."""
    near, far = near_far(plan.datasets, plan.n_levels)
    return {"ood_dataset": {
        "name": f"{name}_ood", "num_classes": num_classes, "dataset_class": "ImglistDataset",
        "interpolation": "bilinear", "batch_size": 256, "shuffle": False, "pre_size": 256, "image_size": 224,
        "num_workers": 8, "split_names": ["nearood", "farood"],
        "nearood": _group(near, root=data_root, key="imglist_pth"),
        "farood": _group(far, root=data_root, key="imglist_pth"),
    }}


def plan_export(manifest: Manifest, *, name: str, data_dir: str) -> ExportPlan:
    """The imglists of a splits / syn-is manifest (one per source and cell, N/A from its `cells` table) or of an
    image list (one)."""
    images = manifest.frame("images")
    lines = imglist_lines(images, where=str(manifest.root))
    base = f"benchmark_imglist/{name}"
    if manifest.kind in GRID_KINDS:
        return cell_datasets(images, lines, na_flags(manifest.cells), base=base, data_dir=data_dir,
                             na_threshold=manifest.na_threshold)
    return single_dataset(lines, base=base, name=name, data_dir=data_dir)


def _prepare_out(out: Path, name: str) -> None:
    if out.exists() and not out.is_dir():
        raise BadInputError(f"--out {out} is a file; pass a folder")
    if out.is_dir() and any(out.iterdir()):
        if not (out / EXPORT_INFO).is_file():
            raise BadInputError(f"--out {out} is not empty and holds no earlier isood export; pass a new folder")
        shutil.rmtree(out / "benchmark_imglist" / name, ignore_errors=True)
    out.mkdir(parents=True, exist_ok=True)


def export_openood(manifest_dir: str | os.PathLike, out: str | os.PathLike, *, name: str = "isood",
                   data_root: str = "./data/", data_dir: str = "images_largescale/",
                   num_classes: int = 1000) -> ExportResult:
    """Write OpenOOD v1.5 imglists per cell plus configs (see the module docstring)."""
    m = read(manifest_dir, kind=EXPORT_KINDS)
    if not re.fullmatch(r"[A-Za-z0-9][\w.-]*", name):
        raise BadInputError(f"--name {name!r}: use letters, digits, '_', '-' or '.'")
    plan = plan_export(m, name=name, data_dir=data_dir)
    out = Path(out)
    _prepare_out(out, name)
    for rel, text in plan.files.items():
        atomic_write_bytes(out / rel, text.encode())
    info = data_info(plan, name=name, num_classes=num_classes, manifest=m)
    atomic_write_bytes(out / EXPORT_INFO, (json.dumps(info, indent=2) + "\n").encode())
    config = ood_dataset_config(plan, name=name, num_classes=num_classes, data_root=data_root)
    atomic_write_bytes(out / EXPORT_YAML, yaml.safe_dump(config, sort_keys=False).encode())
    return ExportResult(out=out, imglists={d["dataset"]: d["imglist_path"] for d in plan.datasets},
                        registered=[d["dataset"] for d in plan.datasets if not d["na"]],
                        rows=sum(d["n"] for d in plan.datasets) + plan.skipped, skipped=plan.skipped)
