"""Export of a splits, syn-is or image-list manifest as OpenOOD v1.5 benchmark imglists plus its configs, and
of a grid manifest as release-format lists (read the manifest one row group at a time -> lines per file (pure,
vectorised) -> write staged files, committed together); see ``isood.stages.interop`` for the layout."""

from __future__ import annotations

import json
import os
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping, Sequence

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc
import yaml

from isood.defaults import DEFAULT_VERIFY, NA_THRESHOLD, OOD_LABEL
from isood.errors import BadInputError
from isood.grid import cell_name
from isood.kinds import GRID_KINDS, IMAGE_LIST, SPLITS, SYN_IS, SplitsView
from isood.files import TMP_PREFIX, atomic_write_bytes
from isood.stages.interop.lines import has_bytes, has_odd_bytes, string_bytes, write_lines
from manifests import Manifest, read
from manifests.stream import StagedFile

__all__ = [
    "EXPORT_INFO", "EXPORT_YAML", "EXPORT_KINDS", "BENCHMARK_DIR", "RELEASE_DIR", "ExportResult", "has_class_label",
    "export_lines",
    "na_flags", "cell_datasets", "cell_keys", "near_far", "data_info", "ood_dataset_config", "release_list_names",
    "export_openood",
]

EXPORT_INFO = "openood_data_info.json"
EXPORT_YAML = "openood_ood_dataset.yml"
BENCHMARK_DIR = "benchmark_imglist"  # OpenOOD imglists: <BENCHMARK_DIR>/<name>/[<source>/]test_<cell>.txt
RELEASE_DIR = "imglist"  # release-format lists: <RELEASE_DIR>/<name>/[<subset>/]cov_{c}_sem_{s}.txt
#: The kinds `export_openood` reads (they have an `images` table of relative paths).
EXPORT_KINDS = (SPLITS, SYN_IS, IMAGE_LIST)


@dataclass
class ExportResult:
    out: Path
    imglists: dict[str, str] = field(default_factory=dict)  # dataset name -> imglist path (relative to out)
    registered: list[str] = field(default_factory=list)  # datasets in openood_data_info.json (non-N/A)
    rows: int = 0
    skipped: int = 0  # rows without a cell (level -1)
    release_lists: list[str] = field(default_factory=list)  # release-format lists written (relative to out)


# ------------------------------------------------------------------------------------------------ pure steps
def has_class_label(schema: pa.Schema) -> bool:
    """Whether a table's ``label`` column is a class index (an integer: imports keep OpenOOD's); Syn-IS's
    ``label`` is the name in the prompt (e.g. 'tench'), not a class of any classifier."""
    return "label" in schema.names and pa.types.is_integer(schema.field("label").type)


def export_lines(batch: pa.Table, *, where: str) -> tuple[pa.Array, pa.Array]:
    """Per image, its OpenOOD imglist line (`path label`, label OOD_LABEL where there is no class label:
    ``has_class_label``) and its release-format line (the path alone when the label is OOD_LABEL, as the
    releases list OOD images), without the newline (pure). A path with whitespace (which neither format can
    hold) is an error naming it."""
    path = pc.cast(batch.column("path").combine_chunks(), pa.string())  # large_string from pandas writers too
    raw = string_bytes(path)
    if has_bytes(raw, " ", "\t") or has_odd_bytes(raw):  # whitespace is a space, a control or a non-ASCII character
        bad = pc.match_substring_regex(path, r"[\s\x{0b}\x{1c}-\x{1f}\x{85}\p{Z}]")
        if pc.any(bad).as_py():
            raise BadInputError(f"{where}: image path {pc.filter(path, bad)[0].as_py()!r} contains whitespace, "
                                "which OpenOOD imglists cannot hold; rename the files")
    if has_class_label(batch.schema):
        label = pc.fill_null(pc.cast(batch.column("label").combine_chunks(), pa.int64()), OOD_LABEL)
    else:
        label = pa.array(np.full(len(path), OOD_LABEL, np.int64))
    if not len(path) or pc.all(pc.equal(label, OOD_LABEL)).as_py():  # OOD lists: no label to print
        return pc.binary_join_element_wise(path, str(OOD_LABEL), " "), path
    openood = pc.binary_join_element_wise(path, pc.cast(label, pa.string()), " ")
    return openood, pc.if_else(pc.equal(label, OOD_LABEL), path, openood)


def na_flags(cells: pd.DataFrame) -> dict[tuple[str, str], bool]:
    """``(source, cell) -> na`` from a manifest's `cells` table (source '' when the table has none: pooled)."""
    src = cells["source"].fillna("").astype(str) if "source" in cells.columns else [""] * len(cells)
    return {(s, str(c)): bool(na) for s, c, na in zip(src, cells["cell"], cells["na"])}


def _slug(text: str) -> str:
    return re.sub(r"\W+", "_", text).strip("_")


def cell_datasets(counts: Mapping[tuple[str, int, int], int], na_of: Mapping[tuple[str, str], bool], *,
                  base: str, data_dir: str, na_threshold: int = NA_THRESHOLD) -> list[dict]:
    """One dataset record per (source, cov, sem) with rows (pure): its imglist `base/[<source>/]test_<cell>.txt`,
    one `data_dir` for all (the paths are relative to one root), N/A from `na_of` (``na_flags``), else a count
    below `na_threshold`."""
    out = []
    for (s, c, sem), n in sorted(counts.items()):
        cell = cell_name(c, sem)
        na = na_of.get((s, cell), na_of.get(("", cell), n < na_threshold))
        out.append({"dataset": f"{_slug(s)}_{cell}" if s else cell, "source": s, "cell": cell, "cov_level": int(c),
                    "sem_level": int(sem), "n": int(n), "na": bool(na), "data_dir": data_dir,
                    "imglist_path": "/".join(x for x in (base, s, f"test_{cell}.txt") if x)})
    return out


def release_list_names(subsets: Sequence[str], n_levels: int, *, base: str,
                       missing: Mapping[str, Sequence[str]] | None = None) -> list[str]:
    """Every release-format list of a grid: `base/[<subset>/]cov_{c}_sem_{s}.txt` for every subset and cell
    (the release's loader opens them all), but a list the imported release lacked (pure)."""
    missing = missing or {}
    return ["/".join(x for x in (base, s, f"{cell_name(c, sem)}.txt") if x)
            for s in subsets for c in range(n_levels) for sem in range(n_levels)
            if cell_name(c, sem) not in missing.get(s, ())]


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


def data_info(datasets: Sequence[dict], n_levels: int, *, name: str, num_classes: int, manifest: Manifest) -> dict:
    """The `openood_data_info.json` record: OpenOOD's `DATA_INFO[...]["ood"]` shape plus every dataset (pure)."""
    near, far = near_far(datasets, n_levels)
    return {
        "format": "isood openood export 1",
        "name": name,
        "num_classes": num_classes,
        "ood": {"near": _group(near, root="", key="imglist_path"), "far": _group(far, root="", key="imglist_path")},
        "usage": "from openood.evaluation_api.datasets import DATA_INFO; "
                 f"DATA_INFO['imagenet']['ood'] = json.load(open('{EXPORT_INFO}'))['ood']; "
                 f"copy {BENCHMARK_DIR}/ into OpenOOD's data root and put the images under data_dir",
        "datasets": list(datasets),
        "manifest": {"path": str(manifest.root), "kind": manifest.kind, "dataset_version": manifest.dataset_version,
                     "content_sha256": manifest.content_sha256},
    }


def ood_dataset_config(datasets: Sequence[dict], n_levels: int, *, name: str, num_classes: int,
                       data_root: str) -> dict:
    """The OpenOOD `configs/datasets/...` `ood_dataset:` block of an export (pure)."""
    near, far = near_far(datasets, n_levels)
    return {"ood_dataset": {
        "name": f"{name}_ood", "num_classes": num_classes, "dataset_class": "ImglistDataset",
        "interpolation": "bilinear", "batch_size": 256, "shuffle": False, "pre_size": 256, "image_size": 224,
        "num_workers": 8, "split_names": ["nearood", "farood"],
        "nearood": _group(near, root=data_root, key="imglist_pth"),
        "farood": _group(far, root=data_root, key="imglist_pth"),
    }}


# ------------------------------------------------------------------------------------------------ streaming
class _LineFiles:
    """Text files filled line by line, each staged (``manifests.stream.StagedFile``) and committed together."""

    def __init__(self, out: Path) -> None:
        self.out, self.files, self.rows = out, {}, {}

    def write(self, rel: str, lines: pa.Array) -> None:
        if rel not in self.files:
            self.files[rel], self.rows[rel] = StagedFile(self.out / rel), 0
        write_lines(self.files[rel], lines)
        self.rows[rel] += len(lines)

    def commit(self) -> None:
        for f in self.files.values():
            f.commit()

    def abort(self) -> None:
        for f in self.files.values():
            f.abort()


def _write_grouped(files: _LineFiles, keys: np.ndarray, names: Mapping[int, str], lines: pa.Array) -> None:
    """Append each line to the file its key names (line order kept within a file)."""
    order = np.argsort(keys, kind="stable")
    sorted_keys = keys[order]
    bounds = np.flatnonzero(np.diff(sorted_keys)) + 1
    for lo, hi in zip(np.r_[0, bounds], np.r_[bounds, len(order)]):
        if hi > lo:
            files.write(names[int(sorted_keys[lo])], pc.take(lines, pa.array(order[lo:hi])))


@dataclass
class _Stream:
    """What one pass over the images wrote: rows per (source, cov, sem), rows without a cell, subsets seen."""

    counts: dict[tuple[str, int, int], int] = field(default_factory=dict)
    skipped: int = 0
    subsets: set[str] = field(default_factory=set)
    rows: int = 0


def cell_keys(batch: pa.Table, column: str | None, n_levels: int) -> tuple[np.ndarray, dict[int, tuple[str, int, int]]]:
    """Each row's (``column`` value or '', cov, sem) as a code, and the key of every code that occurs (pure)."""
    cov = batch.column("cov_level").to_numpy().astype(np.int64)
    sem = batch.column("sem_level").to_numpy().astype(np.int64)
    values, idx = [""], np.zeros(batch.num_rows, np.int64)
    if column is not None:
        enc = pc.dictionary_encode(pc.fill_null(batch.column(column).combine_chunks(), ""))
        values, idx = enc.dictionary.to_pylist(), enc.indices.to_numpy().astype(np.int64)
    codes = (idx * n_levels + cov) * n_levels + sem
    keys = {}
    for code in np.unique(codes).tolist():
        rest, s = divmod(code, n_levels)
        i, c = divmod(rest, n_levels)
        keys[code] = (values[i], c, s)
    return codes, keys


def _stream_grid(m: Manifest, files: _LineFiles, *, base: str, release_base: str) -> _Stream:
    """One pass over a grid manifest's images: every row with a cell goes to its OpenOOD imglist (per source
    and cell) and its release-format list (per subset and cell)."""
    schema, n_levels = m.schema("images"), m.n_levels
    names = schema.names
    src_col = "source" if "source" in names else None
    sub_col = "subset" if "subset" in names else src_col
    label = "label" if has_class_label(schema) else None
    columns = [c for c in ("path", label, "cov_level", "sem_level", src_col, sub_col) if c and c in names]
    st = _Stream()
    for batch in m.batches("images", columns=list(dict.fromkeys(columns))):
        n_in = batch.num_rows
        cov, sem = (pc.fill_null(batch.column(c), -1) for c in ("cov_level", "sem_level"))
        batch = batch.filter(pc.and_(pc.greater_equal(cov, 0), pc.greater_equal(sem, 0)))
        st.rows, st.skipped = st.rows + n_in, st.skipped + n_in - batch.num_rows
        if not batch.num_rows:
            continue
        openood, release = export_lines(batch, where=str(m.root))
        codes, keys = cell_keys(batch, src_col, n_levels)
        for code, n in zip(*np.unique(codes, return_counts=True)):
            st.counts[keys[int(code)]] = st.counts.get(keys[int(code)], 0) + int(n)
        _write_grouped(files, codes, {k: "/".join(x for x in (base, s, f"test_{cell_name(c, sem)}.txt") if x)
                                      for k, (s, c, sem) in keys.items()}, openood)
        if sub_col != src_col:
            codes, keys = cell_keys(batch, sub_col, n_levels)
        st.subsets.update(s for s, _, _ in keys.values())
        _write_grouped(files, codes, {k: "/".join(x for x in (release_base, s, f"{cell_name(c, sem)}.txt") if x)
                                      for k, (s, c, sem) in keys.items()}, release)
    return st


def _missing_cells(cells: pd.DataFrame) -> dict[str, list[str]]:
    """subset -> the cells whose list the imported release lacked (the `cells` table's `missing_in`)."""
    out: dict[str, list[str]] = {}
    if {"missing", "missing_in"} <= set(cells.columns):
        for cell, flag, where in zip(cells["cell"], cells["missing"], cells["missing_in"].fillna("")):
            for s in (str(where).split(",") if bool(flag) else []):
                out.setdefault(s, []).append(str(cell))
    return out


def _export_grid(m: Manifest, files: _LineFiles, *, name: str, data_dir: str) -> tuple[list[dict], int, _Stream]:
    base, release_base = f"{BENCHMARK_DIR}/{name}", f"{RELEASE_DIR}/{name}"
    st = _stream_grid(m, files, base=base, release_base=release_base)
    cells = m.cells
    datasets = cell_datasets(st.counts, na_flags(cells), base=base, data_dir=data_dir, na_threshold=m.na_threshold)
    subsets = (m.subsets if isinstance(m, SplitsView) else []) or sorted(st.subsets) or [""]
    for rel in release_list_names(subsets, m.n_levels, base=release_base, missing=_missing_cells(cells)):
        if rel not in files.files:
            files.write(rel, pa.array([], pa.string()))
    return datasets, m.n_levels, st


def _export_list(m: Manifest, files: _LineFiles, *, name: str, data_dir: str) -> tuple[list[dict], int, _Stream]:
    rel, st = f"{BENCHMARK_DIR}/{name}/test_{name}.txt", _Stream()
    for batch in m.batches("images", columns=["path", "label"] if has_class_label(m.schema("images")) else ["path"]):
        files.write(rel, export_lines(batch, where=str(m.root))[0])
        st.rows += batch.num_rows
    files.write(rel, pa.array([], pa.string()))
    return [{"dataset": name, "source": "", "cell": None, "cov_level": None, "sem_level": None, "n": st.rows,
             "na": False, "data_dir": data_dir, "imglist_path": rel}], 1, st


#: The files each export wrote, by benchmark name: a re-export removes its own earlier files, nothing else.
EXPORT_LEDGER = f"{TMP_PREFIX}isood-export.json"


def _ledger(out: Path) -> dict[str, list[str]]:
    try:
        data = json.loads((out / EXPORT_LEDGER).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    return {str(k): [str(x) for x in v] for k, v in data.items()} if isinstance(data, dict) else {}


def _prepare_out(out: Path, name: str) -> None:
    if out.exists() and not out.is_dir():
        raise BadInputError(f"--out {out} is a file; pass a folder")
    if out.is_dir() and any(not p.name.startswith(TMP_PREFIX) for p in out.iterdir()):  # not the --out lock
        if not (out / EXPORT_INFO).is_file():
            raise BadInputError(f"--out {out} is not empty and holds no earlier isood export; pass a new folder")
    out.mkdir(parents=True, exist_ok=True)


def _forget_old_files(out: Path, name: str, written: Sequence[str]) -> None:
    """Remove the files an earlier export of ``name`` wrote and this one did not (the ledger says which: a file
    isood did not write is never removed), then record this export's files."""
    ledger = _ledger(out)
    for rel in sorted(set(ledger.get(name, [])) - set(written)):
        p = out / rel
        if p.is_file():
            p.unlink()
        for parent in p.parents:
            if parent == out:
                break
            try:
                parent.rmdir()
            except OSError:
                break
    ledger[name] = sorted(written)
    atomic_write_bytes(out / EXPORT_LEDGER, json.dumps(ledger, indent=1, sort_keys=True).encode())


def _default_name(m: Manifest) -> str:
    """An imported release keeps its folder name (`imagenet21k`), so its loader finds `imglist/imagenet21k/`."""
    release = m.release_name if isinstance(m, SplitsView) else None
    return release if release and re.fullmatch(r"[A-Za-z0-9][\w.-]*", release) else "isood"


def export_openood(manifest_dir: str | os.PathLike, out: str | os.PathLike, *, name: str | None = None,
                   data_root: str = "./data/", data_dir: str = "images_largescale/",
                   num_classes: int = 1000, verify: str = DEFAULT_VERIFY) -> ExportResult:
    """Write OpenOOD v1.5 imglists per cell plus configs, and a grid's release-format lists (see the module
    docstring of ``isood.stages.interop``); the images are read one row group at a time."""
    if isinstance(num_classes, bool) or not isinstance(num_classes, int) or num_classes < 1:
        raise BadInputError(f"--num-classes must be an integer >= 1 (the ID classifier's classes), got {num_classes!r}")
    m = read(manifest_dir, kind=EXPORT_KINDS, verify=verify)
    name = name or _default_name(m)
    if not re.fullmatch(r"[A-Za-z0-9][\w.-]*", name):
        raise BadInputError(f"--name {name!r}: use letters, digits, '_', '-' or '.'")
    out = Path(out)
    _prepare_out(out, name)
    files = _LineFiles(out)
    try:
        export = _export_grid if m.kind in GRID_KINDS else _export_list
        datasets, n_levels, st = export(m, files, name=name, data_dir=data_dir)
        files.commit()
    except BaseException:
        files.abort()
        raise
    _forget_old_files(out, name, list(files.files))
    info = data_info(datasets, n_levels, name=name, num_classes=num_classes, manifest=m)
    atomic_write_bytes(out / EXPORT_INFO, (json.dumps(info, indent=2) + "\n").encode())
    config = ood_dataset_config(datasets, n_levels, name=name, num_classes=num_classes, data_root=data_root)
    atomic_write_bytes(out / EXPORT_YAML, yaml.safe_dump(config, sort_keys=False).encode())
    release = sorted(rel for rel in files.files if rel.startswith(RELEASE_DIR + "/"))
    return ExportResult(out=out, imglists={d["dataset"]: d["imglist_path"] for d in datasets},
                        registered=[d["dataset"] for d in datasets if not d["na"]], rows=st.rows,
                        skipped=st.skipped, release_lists=release)
