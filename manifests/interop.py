"""Interop with other OOD tools: IS-OOD release lists, ImageNet-OOD lists, OpenOOD imglists (in and out).

Imports (each writes a manifest with its dataset card through `manifests.card.write_with_card`):

- `import_isood_lists(DIR)`: the IS-OOD release layout, per-cell path lists named `cov_{c}_sem_{s}.txt`
  (0-based; a prefix such as `test_cov_2_sem_5.txt` is allowed), possibly in sub-folders per source
  (`in21k-train/`, `in21k-val/`, `syn-is/`): the source of a list is its folder relative to DIR ('' at the top).
  Lines are `path` or OpenOOD's `path label`. Result: kind `splits`, table `images` (path, wnid, d_sem, d_cov,
  sem_level, cov_level, cell, source, label) with d_sem / d_cov NaN (the release has levels, not values), levels
  from the file names, label -1 (OpenOOD's OOD label) where a line has none; `cells` per source (isood.grid's
  cell table + source); `edges` in build-splits' schema (axis, level, lower, upper) with NaN bounds (unknown);
  per-cell lists `lists/<source>/cov_{c}_sem_{s}.txt`.
- `import_imagenet_ood(FILE)`: one relative image path per line -> kind `image-list` (path, wnid, label=-1).
- `import_openood_imglist(FILE)`: OpenOOD's `path label` per line -> kind `image-list` (path, wnid, label).

Export: `export_openood(MANIFEST, OUT)` writes OpenOOD v1.5 benchmark imglists (`path label` lines, label -1 for
OOD unless the manifest has a `label` column), one per cell (per source and cell), under
`OUT/benchmark_imglist/<name>/[<source>/]test_cov_{c}_sem_{s}.txt`, plus

- `OUT/openood_data_info.json`: an entry shaped like OpenOOD's `evaluation_api.datasets.DATA_INFO[...]["ood"]`
  (`near` / `far` groups of datasets with `data_dir` and `imglist_path` relative to OpenOOD's data root), one
  dataset per non-N/A cell, so `Evaluator.eval_ood()` reports every cell as its own row. OpenOOD averages each
  group, so cells are grouped by semantic level: near = lower half of the levels, far = upper half (a group with
  no cell gets every cell). N/A cells' lists are written too (round trips keep every row) but not registered.
- `OUT/openood_ood_dataset.yml`: the same as an OpenOOD `configs/datasets/...` `ood_dataset:` block.

Round trips are exact: `import_isood_lists(OUT/benchmark_imglist/<name>)` of an export of an imported release
gives the same tables and the same content hash; likewise for image lists through `import_openood_imglist`.
Malformed lines raise `ListFormatError` naming the file and line number.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import yaml

from isood.errors import IsoodError, ManifestError
from manifests.card import CELL_KINDS, NA_THRESHOLD, config_layout, write_with_card
from manifests.paths import check_relative
from manifests.store import Manifest, atomic_write_bytes, input_record, read

OOD_LABEL = -1  # OpenOOD's evaluator sets every OOD label to -1
LIST_NAME_RE = re.compile(r"^(?:.*_)?cov_(\d+)_sem_(\d+)\.txt$")
_WNID_RE = re.compile(r"^n\d{8}$")
_FILE_WNID_RE = re.compile(r"^(n\d{8})_[^/]*$")
EXPORT_INFO = "openood_data_info.json"
EXPORT_YAML = "openood_ood_dataset.yml"


class ListFormatError(IsoodError):
    """A malformed line in an image list (the message names file and line)."""


# -------------------------------------------------------------------------------------------------- parsing
def wnid_of(path: str) -> str | None:
    """The ImageNet class of an image path: the nearest wnid-named folder, else an `nXXXXXXXX_*` file name."""
    parts = [p for p in path.split("/") if p]
    for folder in reversed(parts[:-1]):
        if _WNID_RE.match(folder):
            return folder
    m = _FILE_WNID_RE.match(parts[-1]) if parts else None
    return m.group(1) if m else None


def parse_list(path: str | os.PathLike, labels: str = "optional", name: str | None = None) -> list[tuple[str, int, int]]:
    """Entries `(image path, label, line number)` of a list file; blank lines and `#` comments are skipped.

    labels: "none" (one path per line, ImageNet-OOD), "optional" (`path` or `path label`, IS-OOD lists),
    "required" (`path label`, OpenOOD imglists). A missing label is OOD_LABEL. Paths must be relative, without
    `..` and without whitespace (OpenOOD splits a line at its first space).
    """
    name = name or str(path)
    expected = {"none": "one relative image path", "optional": "'<path>' or '<path> <integer label>'",
                "required": "'<path> <integer label>' (OpenOOD imglist)"}[labels]
    out: list[tuple[str, int, int]] = []
    try:
        raw_lines = Path(path).read_bytes().splitlines()
    except OSError as e:
        raise ListFormatError(f"{name}: cannot read list ({e.strerror})") from None
    for no, raw in enumerate(raw_lines, start=1):
        try:
            line = raw.decode("utf-8")
        except UnicodeDecodeError:
            raise ListFormatError(f"{name}:{no}: not UTF-8 text") from None
        text = line.strip()
        if not text or text.startswith("#"):
            continue
        tokens = text.split()
        label = OOD_LABEL
        ok = len(tokens) == 1 and labels != "required" or len(tokens) == 2 and labels != "none"
        if ok and len(tokens) == 2:
            try:
                label = int(tokens[1])
            except ValueError:
                ok = False
        if not ok:
            raise ListFormatError(f"{name}:{no}: expected {expected} per line, got {text[:120]!r}")
        try:
            rel = check_relative(tokens[0])
        except ManifestError:
            raise ListFormatError(
                f"{name}:{no}: image path {tokens[0]!r} is absolute or contains '..'; "
                "use paths relative to the dataset root"
            ) from None
        out.append((rel, label, no))
    return out


def _files_sha256(files: list[tuple[str, Path]]) -> str:
    h = hashlib.sha256()
    for rel, p in files:
        h.update(f"{rel}\t{hashlib.sha256(p.read_bytes()).hexdigest()}\n".encode())
    return h.hexdigest()


# -------------------------------------------------------------------------------------------------- imports
def read_isood_lists(directory: str | os.PathLike, n_levels: int = 8, na_threshold: int = NA_THRESHOLD) -> dict:
    """Tables (images, cells, edges), per-cell list texts and the list files found, for an IS-OOD list folder."""
    from isood.grid import cell_table

    root = Path(directory)
    if not root.is_dir():
        raise IsoodError(f"{root}: not a folder; pass the folder holding the cov_{{c}}_sem_{{s}}.txt lists")
    found: dict[tuple[str, int, int], Path] = {}
    ignored: list[str] = []
    for p in sorted(root.rglob("*")):
        if not p.is_file():
            continue
        rel = p.relative_to(root).as_posix()
        m = LIST_NAME_RE.match(p.name)
        if not m:
            ignored.append(rel)
            continue
        source = p.parent.relative_to(root).as_posix()
        source = "" if source == "." else source
        cov, sem = int(m.group(1)), int(m.group(2))
        if cov >= n_levels or sem >= n_levels:
            raise IsoodError(f"{rel}: cell cov_{cov}_sem_{sem} is outside the {n_levels}x{n_levels} grid; "
                             f"pass --levels {max(cov, sem) + 1} (or more)")
        key = (source, cov, sem)
        if key in found:
            raise IsoodError(f"{rel}: a second list for cell cov_{cov}_sem_{sem} of source {source or '.'!r} "
                             f"(first: {found[key].relative_to(root).as_posix()}); keep one")
        found[key] = p
    if not found:
        raise IsoodError(f"{root}: no cov_{{c}}_sem_{{s}}.txt lists found (searched sub-folders too)")

    rows: list[dict] = []
    seen: dict[tuple[str, str], str] = {}
    for (source, cov, sem), p in sorted(found.items()):
        rel = p.relative_to(root).as_posix()
        for path, label, no in parse_list(p, "optional", name=rel):
            key = (source, path)
            if key in seen:
                raise ListFormatError(f"{rel}:{no}: {path!r} is already listed at {seen[key]} (same source); "
                                      "an image belongs to one cell")
            seen[key] = f"{rel}:{no}"
            rows.append({"path": path, "wnid": wnid_of(path), "d_sem": np.nan, "d_cov": np.nan,
                         "sem_level": sem, "cov_level": cov, "cell": f"cov_{cov}_sem_{sem}", "source": source,
                         "label": label})
    images = _images_frame(rows, with_levels=True)
    sources = sorted({s for s, _, _ in found})
    cells = []
    for s in sources:
        part = images[images["source"] == s]
        t = cell_table(part["cov_level"].to_numpy(), part["sem_level"].to_numpy(), n_levels, na_threshold)
        t["source"] = s
        cells.append(t)
    cells_df = pd.concat(cells, ignore_index=True)
    edges = pd.DataFrame({  # the build-splits schema (isood.pipeline); the release has no shift values: NaN
        "axis": ["sem"] * n_levels + ["cov"] * n_levels,
        "level": np.concatenate([np.arange(n_levels)] * 2).astype(np.int64),
        "lower": np.full(2 * n_levels, np.nan),
        "upper": np.full(2 * n_levels, np.nan),
    })
    lists = {}
    for (s, c, l), part in images.groupby(["source", "cov_level", "sem_level"], sort=True):
        lists["/".join(x for x in ("lists", s, f"cov_{c}_sem_{l}.txt") if x)] = "".join(f"{p}\n" for p in part["path"])
    files = sorted((p.relative_to(root).as_posix(), p) for p in found.values())
    return {"tables": {"images": images, "cells": cells_df, "edges": edges}, "lists": lists,
            "files": files, "ignored": ignored, "sources": sources}


def _images_frame(rows: list[dict], with_levels: bool) -> pd.DataFrame:
    cols = (["path", "wnid", "d_sem", "d_cov", "sem_level", "cov_level", "cell", "source", "label"] if with_levels
            else ["path", "wnid", "label"])
    df = pd.DataFrame(rows, columns=cols)
    df["path"] = df["path"].astype(object)
    df["wnid"] = df["wnid"].astype(object)
    df["label"] = df["label"].astype(np.int64)
    if with_levels:
        for c in ("d_sem", "d_cov"):
            df[c] = df[c].astype(np.float64)
        for c in ("sem_level", "cov_level"):
            df[c] = df[c].astype(np.int64)
        df["cell"] = df["cell"].astype(object)
        df["source"] = df["source"].astype(object)
    return df


def import_isood_lists(directory: str | os.PathLike, out: str | os.PathLike, *, n_levels: int = 8,
                       na_threshold: int = NA_THRESHOLD, argv: list[str] | None = None) -> Manifest:
    """Import an IS-OOD release folder of per-cell lists as a `splits` manifest (see the module docstring)."""
    got = read_isood_lists(directory, n_levels, na_threshold)
    images, cells = got["tables"]["images"], got["tables"]["cells"]
    return write_with_card(
        out, kind="splits", tables=got["tables"], files=got["lists"],
        config={"import": "isood-lists", "source_dir": str(directory), "n_levels": n_levels,
                "na_threshold": na_threshold},
        inputs=[input_record("isood-lists", directory, sha256=_files_sha256(got["files"]))],
        summary={"images": len(images), "sources": got["sources"], "list_files": len(got["files"]),
                 "cells_usable": int((~cells["na"] & (cells["n"] > 0)).sum()), "ignored_files": got["ignored"]},
        note="imported from IS-OOD lists", argv=argv, na_threshold=na_threshold,
        title="IS-OOD splits (imported lists)",
    )


def _import_one_list(file: str | os.PathLike, out: str | os.PathLike, fmt: str, labels: str,
                     argv: list[str] | None) -> Manifest:
    entries = parse_list(file, labels)
    if not entries:
        raise IsoodError(f"{file}: the list has no entries")
    seen: dict[str, int] = {}
    for path, _, no in entries:
        if path in seen:
            raise ListFormatError(f"{file}:{no}: {path!r} is already listed at line {seen[path]}")
        seen[path] = no
    images = _images_frame([{"path": p, "wnid": wnid_of(p), "label": lab} for p, lab, _ in entries], with_levels=False)
    return write_with_card(
        out, kind="image-list", tables={"images": images},
        config={"import": fmt, "source_file": str(file)}, inputs=[input_record(fmt, file)],
        summary={"images": len(images), "labels": sorted(int(x) for x in images["label"].unique())[:20]},
        note=f"imported from {fmt} list", argv=argv, title=f"OOD image list (imported {fmt})",
    )


def import_imagenet_ood(file: str | os.PathLike, out: str | os.PathLike, argv: list[str] | None = None) -> Manifest:
    """ImageNet-OOD list (one relative image path per line) -> `image-list` manifest with label -1."""
    return _import_one_list(file, out, "imagenet-ood", "none", argv)


def import_openood_imglist(file: str | os.PathLike, out: str | os.PathLike, argv: list[str] | None = None) -> Manifest:
    """OpenOOD imglist (`path label` per line) -> `image-list` manifest keeping the labels."""
    return _import_one_list(file, out, "openood-imglist", "required", argv)


# --------------------------------------------------------------------------------------------------- export
@dataclass
class ExportResult:
    out: Path
    imglists: dict[str, str] = field(default_factory=dict)  # dataset name -> imglist path (relative to out)
    registered: list[str] = field(default_factory=list)  # datasets in openood_data_info.json (non-N/A)
    rows: int = 0
    skipped: int = 0  # rows without a cell (level -1)


def _slug(text: str) -> str:
    return re.sub(r"\W+", "_", text).strip("_")


def _prepare_out(out: Path, name: str) -> None:
    if out.exists() and not out.is_dir():
        raise IsoodError(f"--out {out} is a file; pass a folder")
    if out.is_dir() and any(out.iterdir()):
        if not (out / EXPORT_INFO).is_file():
            raise IsoodError(f"--out {out} is not empty and holds no earlier isood export; pass a new folder")
        shutil.rmtree(out / "benchmark_imglist" / name, ignore_errors=True)
    out.mkdir(parents=True, exist_ok=True)


def export_openood(manifest_dir: str | os.PathLike, out: str | os.PathLike, *, name: str = "isood",
                   data_root: str = "./data/", data_dir: str = "images_largescale/",
                   num_classes: int = 1000) -> ExportResult:
    """Write OpenOOD v1.5 imglists per cell plus configs (see the module docstring)."""
    m = read(manifest_dir)
    if "images" not in m.tables:
        raise IsoodError(f"{manifest_dir}: a {m.kind} manifest has no `images` table to export; pass a splits, "
                         "syn-is or image-list manifest")
    if not re.fullmatch(r"[A-Za-z0-9][\w.-]*", name):
        raise IsoodError(f"--name {name!r}: use letters, digits, '_', '-' or '.'")
    images = m.frame("images")
    out = Path(out)
    bad = images["path"].astype(str).str.contains(r"\s", regex=True)
    if bad.any():
        raise IsoodError(f"{manifest_dir}: image path {images['path'][bad].iloc[0]!r} contains whitespace, which "
                         "OpenOOD imglists cannot hold; rename the files")
    labels = (images["label"].fillna(OOD_LABEL).astype(np.int64) if "label" in images.columns
              else pd.Series(OOD_LABEL, index=images.index, dtype=np.int64))
    lines = images["path"].astype(str) + " " + labels.astype(str) + "\n"
    _prepare_out(out, name)
    base = f"benchmark_imglist/{name}"
    result = ExportResult(out=out, rows=len(images))
    datasets: list[dict] = []

    def data_dir_for(source: str) -> str:
        return data_dir + (source.rstrip("/") + "/" if source else "")

    if m.kind in CELL_KINDS and {"cov_level", "sem_level"} <= set(images.columns):
        tables = {t: m.frame(t) for t in m.tables if t in ("images", "cells")}
        na_threshold = int((m.meta.get("command") or {}).get("config", {}).get("na_threshold", NA_THRESHOLD))
        layout = config_layout(m.kind, tables, na_threshold)
        na_of = {(c["source"], c["cell"]): c["na"] for c in layout.cells}
        src = images["source"].fillna("").astype(str) if "source" in images.columns else pd.Series("", index=images.index)
        cov, sem = images["cov_level"], images["sem_level"]
        has = cov.notna() & sem.notna() & (cov >= 0) & (sem >= 0)
        result.skipped = int((~has).sum())
        keyed = pd.DataFrame({"source": src, "cov": cov.where(has, -1).astype(int),
                              "sem": sem.where(has, -1).astype(int)})[has]
        n_levels = int(max(keyed["cov"].max(), keyed["sem"].max(), 0)) + 1 if len(keyed) else 1
        for (s, c, l), idx in sorted(keyed.groupby(["source", "cov", "sem"], sort=True).groups.items()):
            cell = f"cov_{c}_sem_{l}"
            rel = "/".join(x for x in (base, s, f"test_{cell}.txt") if x)
            atomic_write_bytes(out / rel, "".join(lines.loc[idx]).encode())
            dataset = f"{_slug(s)}_{cell}" if s else cell
            result.imglists[dataset] = rel
            na = na_of.get((s, cell), na_of.get(("", cell), len(idx) < na_threshold))
            datasets.append({"dataset": dataset, "source": s, "cell": cell, "cov_level": int(c), "sem_level": int(l),
                             "n": int(len(idx)), "na": bool(na), "data_dir": data_dir_for(s), "imglist_path": rel})
    else:
        rel = f"{base}/test_{name}.txt"
        atomic_write_bytes(out / rel, "".join(lines).encode())
        result.imglists[name] = rel
        n_levels = 1
        datasets.append({"dataset": name, "source": "", "cell": None, "cov_level": None, "sem_level": None,
                         "n": len(images), "na": False, "data_dir": data_dir, "imglist_path": rel})

    usable = [d for d in datasets if not d["na"]]
    result.registered = [d["dataset"] for d in usable]
    half = n_levels / 2
    near = [d for d in usable if d["sem_level"] is None or d["sem_level"] < half]
    far = [d for d in usable if d["sem_level"] is None or d["sem_level"] >= half]
    if not near or not far:
        near = far = usable

    def group(ds: list[dict], root: str) -> dict:
        g: dict[str, Any] = {"datasets": [d["dataset"] for d in ds]}
        for d in ds:
            g[d["dataset"]] = {"data_dir": root + d["data_dir"], "imglist_path": d["imglist_path"]}
        return g

    info = {
        "format": "isood openood export 1",
        "name": name,
        "num_classes": num_classes,
        "ood": {"near": group(near, ""), "far": group(far, "")},
        "usage": "from openood.evaluation_api.datasets import DATA_INFO; "
                 f"DATA_INFO['imagenet']['ood'] = json.load(open('{EXPORT_INFO}'))['ood']; "
                 "copy benchmark_imglist/ into OpenOOD's data root and put the images under data_dir",
        "datasets": datasets,
        "manifest": {"path": str(m.root), "kind": m.kind, "dataset_version": m.dataset_version,
                     "content_sha256": m.meta.get("content_sha256")},
    }
    atomic_write_bytes(out / EXPORT_INFO, (json.dumps(info, indent=2) + "\n").encode())

    def yml_group(ds: list[dict]) -> dict:
        g: dict[str, Any] = {"datasets": [d["dataset"] for d in ds]}
        for d in ds:
            g[d["dataset"]] = {"data_dir": data_root + d["data_dir"], "imglist_pth": data_root + d["imglist_path"]}
        return g

    ood_dataset = {"ood_dataset": {
        "name": f"{name}_ood", "num_classes": num_classes, "dataset_class": "ImglistDataset",
        "interpolation": "bilinear", "batch_size": 256, "shuffle": False, "pre_size": 256, "image_size": 224,
        "num_workers": 8, "split_names": ["nearood", "farood"], "nearood": yml_group(near), "farood": yml_group(far),
    }}
    atomic_write_bytes(out / EXPORT_YAML, yaml.safe_dump(ood_dataset, sort_keys=False).encode())
    return result
