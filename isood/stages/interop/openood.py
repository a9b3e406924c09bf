"""Export of a splits, syn-is or image-list manifest as OpenOOD v1.5 benchmark imglists, of a grid manifest as
release-format lists too, and of ID lists, into one OpenOOD data root shared by any number of exports (read the
manifest one row group at a time -> lines per file (pure, vectorised) -> write staged files, committed together
-> merge the folder's data info, ``openood_info``); see ``isood.stages.interop`` for the layout."""

from __future__ import annotations

import json
import os
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Mapping, Sequence

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc
import yaml

from isood.defaults import DEFAULT_VERIFY, NA_THRESHOLD, OOD_LABEL
from isood.errors import BadInputError
from isood.files import TMP_PREFIX, atomic_write_bytes, output_lock
from isood.grid import cell_name, parse_cell_name
from isood.kinds import GRID_KINDS, IMAGE_LIST, SPLITS, SYN_IS, SplitsView
from isood.stages.interop.id_lists import IdSource, id_list_paths, load_id_lists
from isood.stages.interop.lines import has_bytes, has_odd_bytes, string_bytes, write_lines
from isood.stages.interop.openood_info import (ID_NAME, RELEASE_GRIDS, GroupRule, assign_groups, benchmark_record,
                                               dataset_config, dataset_name, merge_info, missing_for_openood,
                                               missing_for_release, upgrade_info)
from manifests import Manifest, read
from manifests.paths import is_inside
from manifests.stream import StagedFile

__all__ = [
    "EXPORT_INFO", "EXPORT_YAML", "EXPORT_KINDS", "EXPORT_LEDGER", "BENCHMARK_DIR", "RELEASE_DIR", "ExportResult",
    "has_class_label", "export_lines", "na_flags", "cell_datasets", "cell_keys", "release_list_names",
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
    name: str | None = None  # the benchmark exported (None: ID lists only)
    imglists: dict[str, str] = field(default_factory=dict)  # dataset name -> OpenOOD imglist (relative to out)
    registered: list[str] = field(default_factory=list)  # datasets of this export in OpenOOD's near / far groups
    groups: dict[str, str] = field(default_factory=dict)  # dataset -> near / far / val / na
    rows: int = 0
    skipped: int = 0  # rows without a cell (level -1)
    release_lists: list[str] = field(default_factory=list)  # release-format lists written (relative to out)
    val: dict | None = None  # this export's OOD val split
    id_lists: dict[str, int] = field(default_factory=dict)  # ID split -> images written
    ready: dict[str, list[str]] = field(default_factory=dict)  # "openood" / "release" -> what the folder lacks


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


def cell_datasets(counts: Mapping[tuple[str, int, int], int], na_of: Mapping[tuple[str, str], bool], *,
                  base: str, data_dir: str, na_threshold: int = NA_THRESHOLD, benchmark: str = "",
                  val_cells: Sequence[str] = ()) -> list[dict]:
    """One dataset record per (source, cov, sem) with rows (pure): its name (``openood_info.dataset_name``:
    ``<benchmark>_[<source>_]<cell>``), its imglist `base/[<source>/]test_<cell>.txt` (none for a held-out
    ``val_cells`` cell: its images are in the val list), one `data_dir` for all (the paths are relative to one
    root), N/A from `na_of` (``na_flags``), else a count below `na_threshold`."""
    out = []
    for (s, c, sem), n in sorted(counts.items()):
        cell = cell_name(c, sem)
        na = na_of.get((s, cell), na_of.get(("", cell), n < na_threshold))
        out.append({"dataset": dataset_name(benchmark, s, cell), "source": s, "cell": cell, "cov_level": int(c),
                    "sem_level": int(sem), "n": int(n), "na": bool(na), "data_dir": data_dir,
                    "imglist_path": None if cell in val_cells else
                    "/".join(x for x in (base, s, f"test_{cell}.txt") if x)})
    return out


def release_list_names(subsets: Sequence[str], n_levels: int, *, base: str,
                       missing: Mapping[str, Sequence[str]] | None = None) -> list[str]:
    """Every release-format list of a grid: `base/[<subset>/]cov_{c}_sem_{s}.txt` for every subset and cell
    (the release's loader opens them all), but a list the imported release lacked (pure)."""
    missing = missing or {}
    return ["/".join(x for x in (base, s, f"{cell_name(c, sem)}.txt") if x)
            for s in subsets for c in range(n_levels) for sem in range(n_levels)
            if cell_name(c, sem) not in missing.get(s, ())]


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
        """Delete every staged file and the folders staging created (those left empty)."""
        for f in self.files.values():
            f.abort()
        for rel in self.files:
            _remove_empty_parents(self.out, self.out / rel)


def _remove_empty_parents(out: Path, p: Path) -> None:
    """Remove the folders between ``out`` and ``p`` that are empty, deepest first."""
    for parent in p.parents:
        if parent == out or not parent.is_relative_to(out):
            break
        try:
            parent.rmdir()
        except OSError:
            break


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


def _stream_grid(m: Manifest, files: _LineFiles, *, base: str, release_base: str, val_list: str | None = None,
                 val_cells: Sequence[str] = (), flat_subset: str = "") -> _Stream:
    """One pass over a grid manifest's images: every row with a cell goes to its OpenOOD imglist (per source
    and cell; ``val_list`` for the held-out ``val_cells``) and its release-format list (per subset and cell;
    rows without a subset in ``flat_subset``)."""
    held = set(val_cells)
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
        _write_grouped(files, codes, {k: val_list if cell_name(c, sem) in held else
                                      "/".join(x for x in (base, s, f"test_{cell_name(c, sem)}.txt") if x)
                                      for k, (s, c, sem) in keys.items()}, openood)
        if sub_col != src_col:
            codes, keys = cell_keys(batch, sub_col, n_levels)
        st.subsets.update(s for s, _, _ in keys.values())
        _write_grouped(files, codes, {k: "/".join(x for x in (release_base, s or flat_subset,
                                                               f"{cell_name(c, sem)}.txt") if x)
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


def _held_out(val_cells: Sequence[str] | str | None, n_levels: int) -> list[str]:
    """The ``--val-cells`` names, each a cell of the grid (one-line errors otherwise)."""
    if val_cells is None:
        return []
    names = [c.strip() for c in val_cells.split(",")] if isinstance(val_cells, str) else [str(c) for c in val_cells]
    names = [c for c in names if c]
    if not names:
        raise BadInputError("--val-cells is empty: pass cell names such as cov_0_sem_7,cov_1_sem_7")
    for c in names:
        cov, sem = parse_cell_name(c) or (-1, -1)
        if not (0 <= cov < n_levels and 0 <= sem < n_levels):
            raise BadInputError(f"--val-cells {c!r} is not a cell of this {n_levels}x{n_levels} grid: pass names "
                                f"cov_{{c}}_sem_{{s}} with c, s in 0..{n_levels - 1}")
    return list(dict.fromkeys(names))


@dataclass
class _Exported:
    """One benchmark's export before its files are committed: its datasets (with groups), the levels of its
    grid (None for a list), its val split (None) and the rows streamed."""

    datasets: list[dict]
    n_levels: int | None
    val: dict | None
    stream: _Stream


def _export_grid(m: Manifest, files: _LineFiles, *, name: str, data_dir: str, rule: GroupRule,
                 val_cells: Sequence[str]) -> _Exported:
    base, release_base = f"{BENCHMARK_DIR}/{name}", f"{RELEASE_DIR}/{name}"
    cells = m.cells
    known = [s for s in (m.subsets if isinstance(m, SplitsView) else []) if s]
    has_subsets = bool(known) or "source" in m.schema("images").names
    release_subsets = RELEASE_GRIDS.get(name) if not has_subsets else None  # the release's folders for this name
    val_list = f"{base}/val_{name}.txt" if val_cells else None
    st = _stream_grid(m, files, base=base, release_base=release_base, val_list=val_list, val_cells=val_cells,
                      flat_subset=release_subsets[0] if release_subsets else "")
    datasets = cell_datasets(st.counts, na_flags(cells), base=base, data_dir=data_dir, na_threshold=m.na_threshold,
                             benchmark=name, val_cells=val_cells)
    subsets = list(release_subsets or (m.subsets if isinstance(m, SplitsView) else []) or sorted(st.subsets) or [""])
    for rel in release_list_names(subsets, m.n_levels, base=release_base, missing=_missing_cells(cells)):
        if rel not in files.files:
            files.write(rel, pa.array([], pa.string()))
    val = None
    if val_cells:
        n = sum(d["n"] for d in datasets if d["cell"] in val_cells)
        if not n:
            raise BadInputError(f"--val-cells {','.join(val_cells)}: no image lies in these cells; pass cells "
                                "that hold images")
        val = {"dataset": f"{name}_val", "cells": list(val_cells), "n": n, "data_dir": data_dir,
               "imglist_path": val_list}
    return _Exported(assign_groups(datasets, m.n_levels, rule, val_cells), m.n_levels, val, st)


def _export_list(m: Manifest, files: _LineFiles, *, name: str, data_dir: str, rule: GroupRule,
                 val_cells: Sequence[str] = ()) -> _Exported:
    prefix = "val" if rule.group == "val" else "test"
    rel, st = f"{BENCHMARK_DIR}/{name}/{prefix}_{name}.txt", _Stream()
    for batch in m.batches("images", columns=["path", "label"] if has_class_label(m.schema("images")) else ["path"]):
        files.write(rel, export_lines(batch, where=str(m.root))[0])
        st.rows += batch.num_rows
    files.write(rel, pa.array([], pa.string()))
    record = {"dataset": name, "source": "", "cell": None, "cov_level": None, "sem_level": None, "n": st.rows,
              "na": False, "data_dir": data_dir, "imglist_path": rel}
    if rule.group == "val":
        return _Exported([], None, {**record, "cells": []}, st)
    return _Exported(assign_groups([record], None, rule), None, None, st)


#: The files each export wrote, by benchmark name (``@id:<split>`` for the ID lists): a re-export removes its
#: own earlier files, nothing else.
EXPORT_LEDGER = f"{TMP_PREFIX}isood-export.json"


def _ledger(out: Path) -> dict[str, list[str]]:
    try:
        data = json.loads((out / EXPORT_LEDGER).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    return {str(k): [str(x) for x in v] for k, v in data.items()} if isinstance(data, dict) else {}


def _read_info(out: Path) -> dict | None:
    """The folder's ``openood_data_info.json`` (None when there is none); a one-line error when it is not ours."""
    p = out / EXPORT_INFO
    if not p.is_file():
        return None
    try:
        data = json.loads(p.read_text(encoding="utf-8"))
    except (OSError, ValueError) as e:
        raise BadInputError(f"{p} cannot be read ({type(e).__name__}); remove it or pass a new --out") from None
    if not isinstance(data, dict):
        raise BadInputError(f"{p} is not an isood export's data info; pass a new --out")
    return data


def _prepare_out(out: Path) -> None:
    if out.exists() and not out.is_dir():
        raise BadInputError(f"--out {out} is a file; pass a folder")
    if out.is_dir() and any(not p.name.startswith(TMP_PREFIX) for p in out.iterdir()):  # not the --out lock
        if not (out / EXPORT_INFO).is_file():
            raise BadInputError(f"--out {out} is not empty and holds no earlier isood export; pass a new folder")
    out.mkdir(parents=True, exist_ok=True)


def _check_written(out: Path, keys: Sequence[str], written: Sequence[str]) -> None:
    """Refuse to overwrite a file another entry of the ledger wrote, or one no isood export wrote."""
    ledger = _ledger(out)
    owner = {f: k for k, fs in ledger.items() if k not in keys for f in fs}
    ours = {f for k in keys for f in ledger.get(k, [])}
    for rel in written:
        if rel in owner:
            raise BadInputError(f"{out / rel} belongs to the export {owner[rel]!r} in this folder; pass another --name")
        if rel not in ours and (out / rel).exists():
            raise BadInputError(f"{out / rel} exists and was not written by an isood export; move it or pass "
                                "another --out")


def _forget_old_files(out: Path, written: Mapping[str, Sequence[str]]) -> dict[str, list[str]]:
    """For each ledger key of ``written``: remove the files its earlier export wrote and this one did not (the
    ledger says which: a file isood did not write is never removed), then record this export's files. Returns
    the ledger."""
    ledger = _ledger(out)
    for key, files in written.items():
        for rel in sorted(set(ledger.get(key, [])) - set(files)):
            p = out / rel
            if p.is_file():
                p.unlink()
            _remove_empty_parents(out, p)
        ledger[key] = sorted(files)
    atomic_write_bytes(out / EXPORT_LEDGER, json.dumps(ledger, indent=1, sort_keys=True).encode())
    return ledger


def _default_name(m: Manifest) -> str:
    """An imported release keeps its folder name (`imagenet21k`), so its loader finds `imglist/imagenet21k/`;
    another manifest is named after its folder (`out/imagenet-ood` -> `imagenet-ood`), so exports of different
    manifests into one folder do not replace each other; `isood` when the folder name is not a usable name."""
    release = m.release_name if isinstance(m, SplitsView) else None
    for candidate in (release, Path(m.root).name):
        if candidate and re.fullmatch(r"[A-Za-z0-9][\w.-]*", candidate):
            return candidate
    return "isood"


def _manifest_record(m: Manifest) -> dict:
    return {"path": str(m.root), "kind": m.kind, "dataset_version": m.dataset_version,
            "content_sha256": m.content_sha256}


def _read_manifest(manifest_dir, out: Path, verify: str) -> Manifest:
    m = read(manifest_dir, kind=EXPORT_KINDS, verify=verify)
    if is_inside(os.path.abspath(out), os.path.abspath(m.root)):
        raise BadInputError(f"--out {out} is inside the manifest {m.root}; pass a folder outside it")
    return m


def export_openood(manifest_dir: str | os.PathLike | None, out: str | os.PathLike, *, name: str | None = None,
                   data_root: str = "./data/", data_dir: str | None = None, num_classes: int = 1000,
                   verify: str = DEFAULT_VERIFY, near_axis: str | None = None, near_below: int | None = None,
                   group: str | None = None, val_cells: Sequence[str] | str | None = None,
                   id_train: str | os.PathLike | None = None, id_val: str | os.PathLike | None = None,
                   id_test: str | os.PathLike | None = None, id_root: str | os.PathLike | None = None,
                   classes: str | os.PathLike | None = None) -> ExportResult:
    """Export a splits, syn-is or image-list manifest (or none) and/or ID lists into the OpenOOD data root
    ``out``, merged with the exports already there (see the module docstring of ``isood.stages.interop``); holds
    ``out``'s lock (``isood.files.output_lock``). The images are read one row group at a time."""
    if isinstance(num_classes, bool) or not isinstance(num_classes, int) or num_classes < 1:
        raise BadInputError(f"--num-classes must be an integer >= 1 (the ID classifier's classes), got {num_classes!r}")
    ids = {"train": id_train, "val": id_val, "test": id_test}
    if manifest_dir is None and not any(ids.values()):
        raise BadInputError("nothing to export: pass a manifest, or ID lists (--id-train / --id-val / --id-test)")
    out = Path(out)
    m = _read_manifest(manifest_dir, out, verify) if manifest_dir is not None else None
    grid = m is not None and m.kind in GRID_KINDS
    if grid and group is not None:
        raise BadInputError(f"--group {group} is for an image list; a grid's cells are grouped by --near-axis and "
                            "--near-below (held out with --val-cells)")
    if m is not None and not grid and (near_axis is not None or near_below is not None):
        raise BadInputError("--near-axis / --near-below group a grid's cells; an image list joins --group near, "
                            "far or val")
    rule = GroupRule(axis=near_axis or "sem", below=near_below, group=group or "near").check(
        m.n_levels if grid else None)
    name = name or (_default_name(m) if m is not None else None)
    if name is not None and not re.fullmatch(r"[A-Za-z0-9][\w.-]*", name):
        raise BadInputError(f"--name {name!r}: use letters, digits, '_', '-' or '.'")
    held = _held_out(val_cells, m.n_levels) if m is not None and m.kind in GRID_KINDS else []
    if m is not None and m.kind not in GRID_KINDS and val_cells:
        raise BadInputError("--val-cells needs a grid (splits or syn-is manifest); to use an image list as the OOD "
                            "val split, export it with --group val")
    with output_lock(out):
        _prepare_out(out)
        old = _read_info(out)
        merge_info(old, name or "", None, num_classes=num_classes)  # --num-classes / format refusals before work
        gives_val = bool(held) or (m is not None and m.kind not in GRID_KINDS and rule.group == "val")
        if gives_val:
            others = [k for k, v in upgrade_info(old)["benchmarks"].items() if v.get("val") and k != name]
            if others:
                raise BadInputError(f"an OOD val split comes from {others[0]!r} already (OpenOOD takes one): "
                                    f"re-export {others[0]!r} without it, or leave --val-cells / --group val out")
        sources, tables = load_id_lists({s: v for s, v in ids.items() if v is not None}, num_classes=num_classes,
                                        id_root=id_root, classes=classes)
        return _export(m, out, name=name, data_root=data_root, data_dir=data_dir, num_classes=num_classes,
                       rule=rule, held=held, old=old, sources=sources, tables=tables)


def _export(m: Manifest | None, out: Path, *, name: str | None, data_root: str, data_dir: str | None,
            num_classes: int, rule: GroupRule, held: Sequence[str], old: dict | None, sources: Mapping[str, IdSource],
            tables: Mapping[str, pa.Table]) -> ExportResult:
    """The export steps under the lock: stream the benchmark and the ID lists into staged files, merge the data
    info (its refusals abort every staged file), commit, forget the old files, write the JSON and the YAML."""
    groups: dict[str, _LineFiles] = {}
    exported = None
    id_info = {}
    try:
        if m is not None:
            groups[name] = files = _LineFiles(out)
            export = _export_grid if m.kind in GRID_KINDS else _export_list
            exported = export(m, files, name=name, data_dir=data_dir if data_dir is not None else f"{name}/",
                              rule=rule, val_cells=held)
        for split, table in tables.items():
            groups[f"@id:{split}"] = files = _LineFiles(out)
            release_rel, openood_rel = id_list_paths(split)
            openood_lines, _ = export_lines(table, where=f"--id-{split} {sources[split].source}")
            files.write(release_rel, table.column("path").combine_chunks())
            files.write(openood_rel, openood_lines)
            id_info[split] = {"n": table.num_rows, "source": sources[split].source, "root": sources[split].root,
                              "data_dir": f"{ID_NAME}/", "imglist_path": openood_rel, "release_path": release_rel}
        record = None
        if exported is not None:
            release_n = sum(1 for rel in groups[name].files if rel.startswith(RELEASE_DIR + "/"))
            record = benchmark_record(exported.datasets, kind=m.kind, manifest=_manifest_record(m),
                                      n_levels=exported.n_levels, rule=rule, val=exported.val,
                                      release_lists=release_n)
        info = merge_info(old, name or "", record, num_classes=num_classes, id_lists=id_info, data_root=data_root)
        _check_written(out, list(groups), [rel for g in groups.values() for rel in g.files])
        for g in groups.values():
            g.commit()
    except BaseException:
        for g in groups.values():
            g.abort()
        raise
    ledger = _forget_old_files(out, {k: list(g.files) for k, g in groups.items()})
    present = {f for fs in ledger.values() for f in fs}
    info["ready"] = {"openood": missing_for_openood(info), "release": missing_for_release(present)}
    info["usage"] = USAGE
    atomic_write_bytes(out / EXPORT_INFO, (json.dumps(info, indent=2) + "\n").encode())
    atomic_write_bytes(out / EXPORT_YAML, yaml.safe_dump(dataset_config(info), sort_keys=False).encode())
    return _result(out, name, exported, groups, info)


def _result(out: Path, name: str | None, exported: _Exported | None, groups: Mapping[str, _LineFiles],
            info: dict) -> ExportResult:
    r = ExportResult(out=out, name=name, ready=info["ready"])
    r.id_lists = {k.split(":", 1)[1]: info["id"][k.split(":", 1)[1]]["n"] for k in groups if k.startswith("@id:")}
    if exported is not None:
        ds = exported.datasets
        r.imglists = {d["dataset"]: d["imglist_path"] for d in ds if d["imglist_path"]}
        r.registered = [d["dataset"] for d in ds if d["group"] in ("near", "far")]
        r.groups = {d["dataset"]: d["group"] for d in ds}
        r.rows, r.skipped = exported.stream.rows, exported.stream.skipped
        r.release_lists = sorted(rel for rel in groups[name].files if rel.startswith(RELEASE_DIR + "/"))
        r.val = exported.val
    return r


USAGE = ("OpenOOD v1.5: from openood.evaluation_api import datasets; "
         "datasets.DATA_INFO['imagenet'] = json.load(open('openood_data_info.json'))['data_info']; "
         "datasets.benchmarks_dict['imagenet'] = []; Evaluator(net, id_name='imagenet', data_root=<this folder>, ...). "
         "Images: <this folder>/<data_dir of each dataset>/ (imagenet1k/ for the ID lists). "
         "The IS-OOD release: its datasets.py with data_root=<this folder>.")
