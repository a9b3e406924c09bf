"""The lists of an OpenOOD export: a splits, syn-is or image-list manifest as OpenOOD v1.5 benchmark imglists,
a grid manifest as release-format lists too (read the manifest one row group at a time -> lines per file (pure,
vectorised) -> staged files, committed together by ``openood_export``); see ``isood.stages.interop`` for the
layout."""

from __future__ import annotations

import contextlib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterator, Mapping, Sequence

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc

from isood.core.defaults import NA_THRESHOLD, OOD_LABEL
from isood.core.errors import BadInputError
from isood.core.files import TMP_PREFIX
from isood.science.grid import cell_name, parse_cell_name
from isood.kinds import IMAGE_LIST, SPLITS, SYN_IS, GridView, SplitsView
from isood.stages.interop.export_folder import BENCHMARK_DIR, RELEASE_DIR, remove_empty_parents
from isood.stages.interop.lines import has_bytes, has_odd_bytes, string_bytes, write_lines
from isood.stages.interop.openood_info import RELEASE_GRIDS, GroupRule, assign_groups, dataset_name
from manifests import Manifest
from manifests.stream import StagedFile

__all__ = [
    "EXPORT_KINDS", "has_class_label", "export_lines", "na_flags", "cell_datasets", "cell_keys",
    "release_list_names", "held_out", "export_grid", "export_list", "Exported", "LineFiles",
]

#: The kinds `export_openood` reads (they have an `images` table of relative paths).
EXPORT_KINDS = (SPLITS, SYN_IS, IMAGE_LIST)


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
class LineFiles:
    """Text files filled line by line, each staged (``manifests.stream.StagedFile``) and committed together."""

    def __init__(self, out: Path) -> None:
        self.out = out
        self.files: dict[str, StagedFile] = {}
        self.rows: dict[str, int] = {}

    def write(self, rel: str, lines: pa.Array) -> None:
        if rel not in self.files:
            with _named(self.out / rel):
                self.files[rel], self.rows[rel] = StagedFile(self.out / rel), 0
        write_lines(self.files[rel], lines)  # a failed write names the list (StagedFile.write)
        self.rows[rel] += len(lines)

    def commit(self) -> None:
        for f in self.files.values():
            with _named(f.path):
                f.commit()

    def abort(self) -> None:
        """Delete every staged file and the folders staging created (those left empty)."""
        for f in self.files.values():
            f.abort()
        for rel in self.files:
            remove_empty_parents(self.out, self.out / rel)


@contextlib.contextmanager
def _named(path: Path) -> Iterator[None]:
    """Re-raise an OSError about a list's staged temporary (creating or renaming it: a full disk, a read-only
    folder) as the same error naming the list itself."""
    try:
        yield
    except OSError as e:
        if e.filename is None or Path(str(e.filename)).name.startswith(TMP_PREFIX):
            raise type(e)(e.errno, e.strerror, str(path)) from None
        raise


def _write_grouped(files: LineFiles, keys: np.ndarray, names: Mapping[int, str], lines: pa.Array) -> None:
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


def _stream_grid(m: GridView, files: LineFiles, *, base: str, release_base: str, val_list: str | None = None,
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
        _write_grouped(files, codes, {k: val_list if val_list is not None and cell_name(c, sem) in held else
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


def held_out(val_cells: Sequence[str] | str | None, n_levels: int) -> list[str]:
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
class Exported:
    """One benchmark's export before its files are committed: its datasets (with groups), the levels of its
    grid (None for a list), its val split (None) and the rows streamed."""

    datasets: list[dict]
    n_levels: int | None
    val: dict | None
    stream: _Stream


def export_grid(m: GridView, files: LineFiles, *, name: str, data_dir: str, rule: GroupRule,
                 val_cells: Sequence[str]) -> Exported:
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
    return Exported(assign_groups(datasets, m.n_levels, rule, val_cells), m.n_levels, val, st)


def export_list(m: Manifest, files: LineFiles, *, name: str, data_dir: str, rule: GroupRule,
                 val_cells: Sequence[str] = ()) -> Exported:
    prefix = "val" if rule.group == "val" else "test"
    rel, st = f"{BENCHMARK_DIR}/{name}/{prefix}_{name}.txt", _Stream()
    for batch in m.batches("images", columns=["path", "label"] if has_class_label(m.schema("images")) else ["path"]):
        files.write(rel, export_lines(batch, where=str(m.root))[0])
        st.rows += batch.num_rows
    files.write(rel, pa.array([], pa.string()))
    record = {"dataset": name, "source": "", "cell": None, "cov_level": None, "sem_level": None, "n": st.rows,
              "na": False, "data_dir": data_dir, "imglist_path": rel}
    if rule.group == "val":
        return Exported([], None, {**record, "cells": []}, st)
    return Exported(assign_groups([record], None, rule), None, None, st)


