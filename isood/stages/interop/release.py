"""Import of an IS-OOD release folder of per-cell lists as a `splits` manifest, streamed: each list is parsed
into Arrow arrays (``isood.stages.interop.lines``) and appended to the `images` table in fixed row groups
(``manifests.stream.ParquetStream``), so memory stays bounded by one list and one row group whatever the size of
the release (12M rows: see bench/release_lists.py).

The release's rules (its `datasets.py`, `get_id_ood_dataloader_level_split`): a cell is the pool of its lists
across the subsets (`imagenet21k/train/<cell>.txt` + `imagenet21k/val/<cell>.txt`, one data root) and is N/A
when the pooled count is below 10. ``na_rule="pooled"`` (the default) follows it: one `cells` row per cell, the
rows of a cell ordered subset by subset (train, then val), a `subset` column per image. ``"per-subset"``
decides N/A per subset folder (a `cells` row per subset and cell, and a `source` column that makes each
subset its own split). Every subset must hold a list for every cell of the grid (the release's loader opens
them all): a missing list is an error naming the missing cells, unless ``allow_missing`` (then the cell is
flagged `missing` in the `cells` table, distinct from an empty list).
"""

from __future__ import annotations

import os
import posixpath
import re
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Mapping, NamedTuple, Sequence

import numpy as np
import pandas as pd
import pyarrow as pa

from isood.core.defaults import N_LEVELS, NA_THRESHOLD
from isood.core.errors import BadInputError, IsoodWarning
from isood.science.grid import cell_name, cell_table, edges_table, is_na
from isood.core.optspec import check_field
from isood.stages.interop.options import ImportListsOptions
from isood.kinds import SPLITS
from isood.core.files import sha256_bytes, sha256_file
from isood.core.inputs import walk_files
from isood.stages.interop.imports import ListFormatError, parse_list
from isood.stages.interop.lines import (
    OddLines,
    WnidLookup,
    entries_table,
    parse_line_array,
    path_hashes,
    read_lines,
    write_lines,
)
from manifests import Manifest, input_record, read, write_with_card, writing
from manifests.card_stream import MainTableStream, finish_stream
from manifests.stream import ROW_GROUP_ROWS, StagedFile

__all__ = ["LIST_NAME_RE", "NA_RULES", "CellList", "ReleaseLists", "cell_of_list", "find_cell_lists",
           "missing_lists", "check_subsets", "list_order", "images_schema", "read_cell_list", "release_rows",
           "release_cells", "release_edges", "DuplicatePaths", "scan_release", "import_isood_lists"]

LIST_NAME_RE = re.compile(r"^(?:.*_)?cov_(\d+)_sem_(\d+)\.txt$")
NA_RULES = ("pooled", "per-subset")
IMAGES_FILE = "data/images.parquet"
_SLICE = 1 << 18  # rows of a list turned into `images` rows at a time


class CellList(NamedTuple):
    """A per-cell list file of a release: its subset (folder relative to the release folder, '' at the top),
    cell levels and path (relative + full)."""

    subset: str
    cov: int
    sem: int
    rel: str
    path: Path


# ------------------------------------------------------------------------------------------ finding the lists
def cell_of_list(rel: str, *, n_levels: int = N_LEVELS) -> tuple[str, int, int] | None:
    """``(subset, cov, sem)`` of a release file by its relative path, or None when it is not a cell list (pure).
    A cell outside the ``n_levels`` grid is an error naming the ``--levels`` to pass."""
    folder, _, fname = rel.rpartition("/")
    m = LIST_NAME_RE.match(fname)
    if not m:
        return None
    cov, sem = int(m.group(1)), int(m.group(2))
    if cov >= n_levels or sem >= n_levels:
        raise BadInputError(f"{rel}: cell {cell_name(cov, sem)} is outside the {n_levels}x{n_levels} grid; "
                            f"pass --levels {max(cov, sem) + 1} (or more)")
    return folder, cov, sem


def find_cell_lists(directory: str | os.PathLike, *, n_levels: int = N_LEVELS) -> tuple[list[CellList], list[str]]:
    """The cell lists of a release folder (sorted by subset, cov, sem) and the other files found there, walked by
    the input-path policy (``isood.core.inputs.walk_files``: hidden folders are no subsets, a symlinked subset folder
    inside the folder is followed and said in one warning line, a link leading outside it is refused)."""
    root = Path(directory)
    if not root.is_dir():
        raise BadInputError(f"{root}: not a folder; pass the folder holding the cov_{{c}}_sem_{{s}}.txt lists")
    found: dict[tuple[str, int, int], CellList] = {}
    ignored: list[str] = []
    walked = walk_files(root, what=str(root))  # the input-path policy: hidden skipped, links inside the root
    for note in walked.notes:
        warnings.warn(f"{root}: {note}", IsoodWarning, stacklevel=2)
    for rel, p in walked.files.items():
        key = cell_of_list(rel, n_levels=n_levels)
        if key is None:
            ignored.append(rel)
            continue
        if key in found:
            raise BadInputError(f"{rel}: a second list for cell {cell_name(key[1], key[2])} of subset "
                                f"{key[0] or '.'!r} (first: {found[key].rel}); keep one")
        found[key] = CellList(*key, rel, p)
    if not found:
        raise BadInputError(f"{root}: no cov_{{c}}_sem_{{s}}.txt lists found (searched sub-folders too)")
    return [found[k] for k in sorted(found)], ignored


def missing_lists(found: Sequence[CellList], *, n_levels: int) -> dict[str, list[tuple[int, int]]]:
    """Per subset, the cells of the ``n_levels`` grid that have no list (pure; subsets with none missing left
    out)."""
    have: dict[str, set[tuple[int, int]]] = {}
    for cl in found:
        have.setdefault(cl.subset, set()).add((cl.cov, cl.sem))
    grid = [(c, s) for c in range(n_levels) for s in range(n_levels)]
    out = {sub: [cell for cell in grid if cell not in cells] for sub, cells in sorted(have.items())}
    return {sub: cells for sub, cells in out.items() if cells}


def _missing_text(missing: Mapping[str, Sequence[tuple[int, int]]], n_levels: int, shown: int = 8) -> str:
    parts = []
    for sub, cells in sorted(missing.items()):
        names = [cell_name(c, s) for c, s in cells]
        more = f" (+{len(names) - shown} more)" if len(names) > shown else ""
        listed = ", ".join(names[:shown])
        parts.append(f"{sub or '.'}: {len(names)} of {n_levels * n_levels} lists missing ({listed}{more})")
    return "; ".join(parts)


def check_subsets(subsets: Sequence[str], na_rule: str) -> None:
    """Refuse an unknown rule, and pooling subsets that are not side by side (e.g. `SynIS` and
    `imagenet21k/train`: two benchmarks that the release evaluates separately)."""
    if na_rule not in NA_RULES:
        raise BadInputError(f"--na-rule {na_rule!r}; pass one of {', '.join(NA_RULES)}")
    parents = {posixpath.dirname(s) if s else None for s in subsets}
    if na_rule == "pooled" and len(parents) > 1:
        raise BadInputError(f"lists in folders that are not side by side ({', '.join(s or '.' for s in subsets)}): "
                            "pooling them would mix benchmarks; import one benchmark folder at a time (e.g. "
                            "<release>/imagenet21k) or pass --na-rule per-subset")


def list_order(found: Sequence[CellList], *, na_rule: str) -> list[CellList]:
    """The order the lists' rows go into the `images` table (pure): pooled, cell by cell (cov, sem) and within
    a cell subset by subset, as the release concatenates them; per-subset, subset by subset, then cell."""
    if na_rule == "pooled":
        return sorted(found, key=lambda cl: (cl.cov, cl.sem, cl.subset))
    return sorted(found, key=lambda cl: (cl.subset, cl.cov, cl.sem))


@dataclass(frozen=True)
class ReleaseLists:
    """The lists of a release folder, checked: found (in table order), other files, subsets, missing cells."""

    directory: Path
    lists: list[CellList]
    ignored: list[str]
    subsets: list[str]
    missing: dict[str, list[tuple[int, int]]] = field(default_factory=dict)

    def input_sha256(self) -> str:
        """Hash of the list files read (relative path + sha256 of each, in path order)."""
        rows = (f"{cl.rel}\t{sha256_file(cl.path)}\n" for cl in sorted(self.lists, key=lambda cl: cl.rel))
        return sha256_bytes("".join(rows).encode())


def scan_release(directory: str | os.PathLike, *, n_levels: int = N_LEVELS, na_rule: str = "pooled",
                 allow_missing: bool = False) -> ReleaseLists:
    """Find and check a release's lists: the rule, the subsets, and every list of the grid present (a missing
    one is an error naming the missing cells per subset, unless ``allow_missing``)."""
    found, ignored = find_cell_lists(directory, n_levels=n_levels)
    subsets = sorted({cl.subset for cl in found})
    check_subsets(subsets, na_rule)
    missing = missing_lists(found, n_levels=n_levels)
    if missing and not allow_missing:
        raise BadInputError(f"{directory}: {_missing_text(missing, n_levels)}; pass the complete release folder, "
                            "or --allow-missing to import it with those cells flagged missing")
    return ReleaseLists(Path(directory), list_order(found, na_rule=na_rule), ignored, subsets, missing)


# ------------------------------------------------------------------------------------------ reading the lists
def read_cell_list(cl: CellList) -> pa.Table:
    """The paths (verbatim, `./` kept) and labels of one list; vectorised, or (odd lines) by the exact parser,
    whose errors name the file and line."""
    try:
        return parse_line_array(read_lines(cl.path))
    except OddLines:
        return entries_table(parse_list(cl.path, labels="optional", name=cl.rel, verbatim=True))


def images_schema(*, per_subset: bool) -> pa.Schema:
    """The `images` table of an import: the splits columns, `subset`, (`source` = subset for per-subset N/A),
    `label`."""
    fields = [("path", pa.string()), ("wnid", pa.string()), ("d_sem", pa.float64()), ("d_cov", pa.float64()),
              ("sem_level", pa.int64()), ("cov_level", pa.int64()), ("cell", pa.string()), ("subset", pa.string())]
    return pa.schema(fields + ([("source", pa.string())] if per_subset else []) + [("label", pa.int64())])


def release_rows(parsed: pa.Table, cl: CellList, *, wnids: WnidLookup, per_subset: bool) -> pa.Table:
    """The `images` rows of one parsed list (pure but for the lookup's memory): shifts unknown (NaN), levels
    and cell from the file name, wnid from the path."""
    n = parsed.num_rows
    path = parsed.column("path").combine_chunks()
    cols = {"path": path, "wnid": wnids(path), "d_sem": pa.array(np.full(n, np.nan)),
            "d_cov": pa.array(np.full(n, np.nan)), "sem_level": pa.array(np.full(n, cl.sem, np.int64)),
            "cov_level": pa.array(np.full(n, cl.cov, np.int64)), "cell": pa.repeat(cell_name(cl.cov, cl.sem), n),
            "subset": pa.repeat(cl.subset, n)}
    if per_subset:
        cols["source"] = pa.repeat(cl.subset, n)
    cols["label"] = parsed.column("label").combine_chunks()
    return pa.table(cols, schema=images_schema(per_subset=per_subset))


class DuplicatePaths:
    """An image listed twice in one subset is an error (an image belongs to one cell): 64-bit hashes of every
    path are kept per list, and candidates confirmed on the strings of the lists holding them."""

    def __init__(self) -> None:
        self.hashes: dict[str, list[tuple[CellList, np.ndarray]]] = {}

    def add(self, cl: CellList, paths: pa.Array) -> None:
        self.hashes.setdefault(cl.subset, []).append((cl, path_hashes(paths)))

    def check(self) -> None:
        """Raise ``ListFormatError`` naming the repeat and its first place (file:line)."""
        for subset, lists in self.hashes.items():
            every = np.sort(np.concatenate([h for _, h in lists]) if lists else np.zeros(0, np.int64))
            candidates = np.unique(every[1:][every[1:] == every[:-1]])
            if candidates.size:
                holding = [cl for cl, h in sorted(lists, key=lambda x: (x[0].cov, x[0].sem))
                           if np.isin(h, candidates).any()]
                self._confirm(list(dict.fromkeys(holding)), set(candidates.tolist()))

    @staticmethod
    def _confirm(lists: Sequence[CellList], candidates: set[int]) -> None:
        seen: dict[str, str] = {}
        for cl in lists:
            for path, _, no in parse_list(cl.path, labels="optional", name=cl.rel, verbatim=True):
                key = re.sub(r"^(\./)+", "", path)
                if hash(key) not in candidates:
                    continue
                if key in seen:
                    raise ListFormatError(f"{cl.rel}:{no}: {path!r} is already listed at {seen[key]} (same subset); "
                                          "an image belongs to one cell")
                seen[key] = f"{cl.rel}:{no}"


# ------------------------------------------------------------------------------------------ tables
def release_cells(counts: Mapping[tuple[str, int, int], int], subsets: Sequence[str], *, n_levels: int = N_LEVELS,
                  na_threshold: int = NA_THRESHOLD, na_rule: str = "pooled",
                  missing: Mapping[str, Sequence[tuple[int, int]]] | None = None) -> pd.DataFrame:
    """The `cells` table from the rows per (subset, cov, sem) (pure): every cell of the grid (``isood.science.grid.
    cell_table`` order), its count `n`, `na` (n < na_threshold), `missing` (a subset has no list for it) and
    `missing_in` (those subsets, comma-separated). Pooled: one row per cell, n summed over the subsets;
    per-subset: one row per subset and cell, with `source` and `subset`."""
    absent = {s: set(map(tuple, cells)) for s, cells in (missing or {}).items()}
    grid = cell_table(np.zeros(0, np.int64), np.zeros(0, np.int64), n_levels, na_threshold)
    cells = list(zip(grid["cov_level"].tolist(), grid["sem_level"].tolist()))
    groups = [list(subsets)] if na_rule == "pooled" else [[s] for s in subsets]
    parts = []
    for group in groups:
        n = np.array([sum(counts.get((s, c, sem), 0) for s in group) for c, sem in cells], dtype=np.int64)
        miss = [",".join(s for s in group if (c, sem) in absent.get(s, ())) for c, sem in cells]
        part = grid.assign(n=n, na=is_na(n, na_threshold), missing=[bool(m) for m in miss], missing_in=miss)
        if na_rule != "pooled":
            part = part.assign(source=group[0], subset=group[0])
        parts.append(part)
    return pd.concat(parts, ignore_index=True)


def release_edges(n_levels: int = N_LEVELS) -> pd.DataFrame:
    """The `edges` table of a release: every level's bounds unknown (NaN), as the lists hold no shift values."""
    unknown = np.full(n_levels + 1, np.nan)
    return edges_table(unknown, unknown)


def _list_rel(cl: CellList) -> str:
    return "/".join(x for x in ("lists", cl.subset, f"{cell_name(cl.cov, cl.sem)}.txt") if x)


# ------------------------------------------------------------------------------------------ the import
def _stream_lists(rel: ReleaseLists, out: Path, *, per_subset: bool, row_group_rows: int
                  ) -> tuple[dict[tuple[str, int, int], int], MainTableStream, list[StagedFile]]:
    """Parse every list into the staged `images` table (with its per-cell config copies) and staged `lists/`
    copies (nothing is in place until the caller commits them); returns the rows per (subset, cov, sem)."""
    stream = MainTableStream(out, SPLITS, images_schema(per_subset=per_subset), row_group_rows=row_group_rows,
                             plain_columns=["path"])
    copies: list[StagedFile] = []
    counts: dict[tuple[str, int, int], int] = {}
    wnids, repeats = WnidLookup(), DuplicatePaths()
    try:
        for cl in rel.lists:
            parsed = read_cell_list(cl)
            copies.append(StagedFile(out / _list_rel(cl)))
            for lo in range(0, parsed.num_rows, _SLICE):  # a slice of a long list at a time: memory stays flat
                part = parsed.slice(lo, _SLICE)
                paths = part.column("path").combine_chunks()
                stream.write(release_rows(part, cl, wnids=wnids, per_subset=per_subset))
                write_lines(copies[-1], paths)
                repeats.add(cl, paths)
            copies[-1].close()
            counts[(cl.subset, cl.cov, cl.sem)] = parsed.num_rows
        repeats.check()
    except BaseException:
        stream.abort()
        for c in copies:
            c.abort()
        raise
    return counts, stream, copies


def _summary(rel: ReleaseLists, counts: Mapping[tuple[str, int, int], int], cells: pd.DataFrame, *,
             na_rule: str) -> dict:
    per_subset = {s: sum(n for (sub, _, _), n in counts.items() if sub == s) for s in rel.subsets}
    return {"images": sum(counts.values()), "subsets": rel.subsets, "images_per_subset": per_subset,
            "list_files": len(rel.lists), "na_rule": na_rule,
            "cells_usable": int((~cells["na"] & (cells["n"] > 0)).sum()), "cells_na": int(cells["na"].sum()),
            "cells_missing": int(cells["missing"].sum()),
            "missing_lists": {s: [cell_name(c, sem) for c, sem in cs] for s, cs in rel.missing.items()},
            "ignored_files": rel.ignored}


def import_isood_lists(directory: str | os.PathLike, out: str | os.PathLike, *, n_levels: int = N_LEVELS,
                       na_threshold: int = NA_THRESHOLD, na_rule: str = "pooled", allow_missing: bool = False,
                       argv: list[str] | None = None, row_group_rows: int = ROW_GROUP_ROWS) -> Manifest:
    """Import an IS-OOD release folder of per-cell lists as a `splits` manifest (see the module docstring):
    `images` (path as listed, wnid, NaN shifts, levels, cell, subset, label) streamed in row groups of
    ``row_group_rows``, `cells` by ``na_rule``, `edges` (unknown bounds), a copy of every list under `lists/`."""
    check_field(ImportListsOptions, "levels", n_levels)
    check_field(ImportListsOptions, "na_threshold", na_threshold)
    rel = scan_release(directory, n_levels=n_levels, na_rule=na_rule, allow_missing=allow_missing)
    with writing(out, SPLITS, inputs=[directory]) as o:
        counts, stream, copies = _stream_lists(rel, o.work, per_subset=na_rule != "pooled",
                                               row_group_rows=row_group_rows)
        cells = release_cells(counts, rel.subsets, n_levels=n_levels, na_threshold=na_threshold, na_rule=na_rule,
                              missing=rel.missing)
        tables = {"cells": cells, "edges": release_edges(n_levels)}
        config = {"import": "isood-lists", "source_dir": os.path.abspath(directory),
                  "release_name": rel.directory.resolve().name, "n_levels": n_levels, "na_threshold": na_threshold,
                  "na_rule": na_rule, "subsets": rel.subsets, "allow_missing": allow_missing}
        for c in copies:
            c.commit()
        layout, table_files = finish_stream(stream, tables=tables, config=config)
        write_with_card(
            o.work, kind=SPLITS, tables=tables, table_files=table_files, layout=layout,
            existing_files=[_list_rel(cl) for cl in rel.lists], config=config,
            inputs=[input_record("isood-lists", directory, sha256=rel.input_sha256())],
            summary=_summary(rel, counts, cells, na_rule=na_rule), note="imported from IS-OOD lists", argv=argv,
            title="IS-OOD splits (imported lists)",
        )
    return read(o.final, kind=SPLITS)
