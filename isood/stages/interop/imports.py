"""Imports of OOD lists from other tools (parse the list files -> build the tables (pure) -> write the manifest
with its dataset card); see ``isood.stages.interop`` for the formats."""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable, NamedTuple, Sequence

import numpy as np
import pandas as pd

from isood.defaults import N_LEVELS, NA_THRESHOLD, OOD_LABEL
from isood.errors import BadInputError, ManifestError
from isood.grid import cell_name, cell_table, edges_table
from isood.kinds import IMAGE_LIST, SPLITS
from isood.runtime import sha256_bytes, sha256_file
from manifests import Manifest, input_record, write_with_card
from manifests.paths import check_relative
from wordnet_tools.wnids import wnid_from_path

__all__ = [
    "LIST_NAME_RE", "ListFormatError", "ListEntry", "CellList", "Release", "parse_lines", "parse_list",
    "cell_of_list", "find_cell_lists", "release_images", "release_cells", "release_edges", "cell_list_texts",
    "read_isood_lists", "import_isood_lists", "image_list_table", "import_imagenet_ood", "import_openood_imglist",
]

LIST_NAME_RE = re.compile(r"^(?:.*_)?cov_(\d+)_sem_(\d+)\.txt$")
_IMAGE_COLUMNS = ["path", "wnid", "d_sem", "d_cov", "sem_level", "cov_level", "cell", "source", "label"]
_EXPECTED = {"none": "one relative image path", "optional": "'<path>' or '<path> <integer label>'",
             "required": "'<path> <integer label>' (OpenOOD imglist)"}


class ListFormatError(BadInputError):
    """A malformed line in an image list (the message names file and line)."""


class ListEntry(NamedTuple):
    """One entry of a list file: the image path (relative), its label (OOD_LABEL when the line has none) and
    the line number."""

    path: str
    label: int
    line: int


# -------------------------------------------------------------------------------------------------- parsing
def _parse_line(text: str, *, labels: str, where: str) -> tuple[str, int]:
    tokens = text.split()
    label = OOD_LABEL
    ok = len(tokens) == 1 and labels != "required" or len(tokens) == 2 and labels != "none"
    if ok and len(tokens) == 2:
        try:
            label = int(tokens[1])
        except ValueError:
            ok = False
    if not ok:
        raise ListFormatError(f"{where}: expected {_EXPECTED[labels]} per line, got {text[:120]!r}")
    try:
        return check_relative(tokens[0]), label
    except ManifestError:
        raise ListFormatError(f"{where}: image path {tokens[0]!r} is absolute or contains '..'; "
                              "use paths relative to the dataset root") from None


def parse_lines(lines: Iterable[bytes | str], *, labels: str = "optional", name: str = "list") -> list[ListEntry]:
    """Entries of the lines of a list file (pure); blank lines and `#` comments are skipped.

    labels: "none" (one path per line, ImageNet-OOD), "optional" (`path` or `path label`, IS-OOD lists),
    "required" (`path label`, OpenOOD imglists). A missing label is OOD_LABEL. Paths must be relative, without
    `..` and without whitespace (OpenOOD splits a line at its first space). Errors name `name:line`.
    """
    if labels not in _EXPECTED:
        raise BadInputError(f"labels={labels!r}; pass one of {', '.join(_EXPECTED)}")
    out: list[ListEntry] = []
    for no, raw in enumerate(lines, start=1):
        try:
            line = raw.decode("utf-8") if isinstance(raw, bytes) else raw
        except UnicodeDecodeError:
            raise ListFormatError(f"{name}:{no}: not UTF-8 text") from None
        text = line.strip()
        if text and not text.startswith("#"):
            out.append(ListEntry(*_parse_line(text, labels=labels, where=f"{name}:{no}"), no))
    return out


def parse_list(path: str | os.PathLike, *, labels: str = "optional", name: str | None = None) -> list[ListEntry]:
    """`parse_lines` of a list file (errors name `name`, default the path)."""
    name = name or str(path)
    try:
        raw_lines = Path(path).read_bytes().splitlines()
    except OSError as e:
        raise ListFormatError(f"{name}: cannot read list ({e.strerror})") from None
    return parse_lines(raw_lines, labels=labels, name=name)


# -------------------------------------------------------------------------------------------- IS-OOD lists
class CellList(NamedTuple):
    """A per-cell list file of an IS-OOD release: its source folder, cell levels and path (relative + full)."""

    source: str
    cov: int
    sem: int
    rel: str
    path: Path


def cell_of_list(rel: str, *, n_levels: int = N_LEVELS) -> tuple[str, int, int] | None:
    """``(source, cov, sem)`` of a release file by its relative path, or None when it is not a cell list (pure).
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
    """The cell lists of a release folder (sorted by source, cov, sem) and the other files found there."""
    root = Path(directory)
    if not root.is_dir():
        raise BadInputError(f"{root}: not a folder; pass the folder holding the cov_{{c}}_sem_{{s}}.txt lists")
    found: dict[tuple[str, int, int], CellList] = {}
    ignored: list[str] = []
    for p in sorted(q for q in root.rglob("*") if q.is_file()):
        rel = p.relative_to(root).as_posix()
        key = cell_of_list(rel, n_levels=n_levels)
        if key is None:
            ignored.append(rel)
            continue
        if key in found:
            raise BadInputError(f"{rel}: a second list for cell {cell_name(key[1], key[2])} of source "
                                f"{key[0] or '.'!r} (first: {found[key].rel}); keep one")
        found[key] = CellList(*key, rel, p)
    if not found:
        raise BadInputError(f"{root}: no cov_{{c}}_sem_{{s}}.txt lists found (searched sub-folders too)")
    return [found[k] for k in sorted(found)], ignored


def _images_frame(rows: list[dict], columns: Sequence[str]) -> pd.DataFrame:
    df = pd.DataFrame(rows, columns=list(columns))
    for c in df.columns:
        df[c] = df[c].astype({"label": np.int64, "sem_level": np.int64, "cov_level": np.int64, "d_sem": np.float64,
                              "d_cov": np.float64}.get(c, object))
    return df


def release_images(lists: Sequence[tuple[CellList, Sequence[ListEntry]]]) -> pd.DataFrame:
    """The `images` table of a release from its parsed cell lists (pure). An image listed twice in one source is
    an error naming both places (an image belongs to one cell)."""
    rows: list[dict] = []
    seen: dict[tuple[str, str], str] = {}
    for cl, entries in lists:
        for path, label, no in entries:
            key = (cl.source, path)
            if key in seen:
                raise ListFormatError(f"{cl.rel}:{no}: {path!r} is already listed at {seen[key]} (same source); "
                                      "an image belongs to one cell")
            seen[key] = f"{cl.rel}:{no}"
            rows.append({"path": path, "wnid": wnid_from_path(path), "d_sem": np.nan, "d_cov": np.nan,
                         "sem_level": cl.sem, "cov_level": cl.cov, "cell": cell_name(cl.cov, cl.sem),
                         "source": cl.source, "label": label})
    return _images_frame(rows, _IMAGE_COLUMNS)


def release_cells(images: pd.DataFrame, sources: Sequence[str], *, n_levels: int = N_LEVELS,
                  na_threshold: int = NA_THRESHOLD) -> pd.DataFrame:
    """The `cells` table: `isood.grid.cell_table` of each source's images, with a `source` column (pure)."""
    parts = []
    for s in sources:
        part = images[images["source"] == s]
        t = cell_table(part["cov_level"].to_numpy(), part["sem_level"].to_numpy(), n_levels, na_threshold)
        t["source"] = s
        parts.append(t)
    return pd.concat(parts, ignore_index=True)


def release_edges(n_levels: int = N_LEVELS) -> pd.DataFrame:
    """The `edges` table of a release: every level's bounds unknown (NaN), as the lists hold no shift values."""
    unknown = np.full(n_levels + 1, np.nan)
    return edges_table(unknown, unknown)


def cell_list_texts(images: pd.DataFrame) -> dict[str, str]:
    """Per-cell path lists `lists/[<source>/]cov_{c}_sem_{s}.txt` -> text, one path per line (pure)."""
    out = {}
    for (s, c, l), part in images.groupby(["source", "cov_level", "sem_level"], sort=True):
        out["/".join(x for x in ("lists", s, f"{cell_name(c, l)}.txt") if x)] = "".join(f"{p}\n" for p in part["path"])
    return out


@dataclass(frozen=True)
class Release:
    """An IS-OOD release folder read into a splits manifest's tables, its per-cell list files and provenance."""

    images: pd.DataFrame
    cells: pd.DataFrame
    edges: pd.DataFrame
    lists: dict[str, str]
    files: list[CellList]
    ignored: list[str]
    sources: list[str]

    @property
    def tables(self) -> dict[str, pd.DataFrame]:
        return {"images": self.images, "cells": self.cells, "edges": self.edges}

    def input_sha256(self) -> str:
        """Hash of the list files read (relative path + sha256 of each, in path order)."""
        rows = (f"{cl.rel}\t{sha256_file(cl.path)}\n" for cl in sorted(self.files, key=lambda cl: cl.rel))
        return sha256_bytes("".join(rows).encode())


def read_isood_lists(directory: str | os.PathLike, *, n_levels: int = N_LEVELS,
                     na_threshold: int = NA_THRESHOLD) -> Release:
    """Read an IS-OOD release folder (module docstring): tables, per-cell list texts and the files found."""
    found, ignored = find_cell_lists(directory, n_levels=n_levels)
    parsed = [(cl, parse_list(cl.path, labels="optional", name=cl.rel)) for cl in found]
    images = release_images(parsed)
    sources = sorted({cl.source for cl in found})
    cells = release_cells(images, sources, n_levels=n_levels, na_threshold=na_threshold)
    return Release(images=images, cells=cells, edges=release_edges(n_levels), lists=cell_list_texts(images),
                   files=sorted(found, key=lambda cl: cl.rel), ignored=ignored, sources=sources)


def import_isood_lists(directory: str | os.PathLike, out: str | os.PathLike, *, n_levels: int = N_LEVELS,
                       na_threshold: int = NA_THRESHOLD, argv: list[str] | None = None) -> Manifest:
    """Import an IS-OOD release folder of per-cell lists as a `splits` manifest (see the module docstring)."""
    rel = read_isood_lists(directory, n_levels=n_levels, na_threshold=na_threshold)
    cells = rel.cells
    return write_with_card(
        out, kind=SPLITS, tables=rel.tables, files=rel.lists,
        config={"import": "isood-lists", "source_dir": str(directory), "n_levels": n_levels,
                "na_threshold": na_threshold},
        inputs=[input_record("isood-lists", directory, sha256=rel.input_sha256())],
        summary={"images": len(rel.images), "sources": rel.sources, "list_files": len(rel.files),
                 "cells_usable": int((~cells["na"] & (cells["n"] > 0)).sum()), "ignored_files": rel.ignored},
        note="imported from IS-OOD lists", argv=argv, title="IS-OOD splits (imported lists)",
    )


# --------------------------------------------------------------------------------------------- image lists
def image_list_table(entries: Sequence[ListEntry], *, name: str) -> pd.DataFrame:
    """The `images` table (path, wnid, label) of an image list (pure); an empty list or a path listed twice is
    an error naming `name` (and the line)."""
    if not entries:
        raise BadInputError(f"{name}: the list has no entries")
    seen: dict[str, int] = {}
    for path, _, no in entries:
        if path in seen:
            raise ListFormatError(f"{name}:{no}: {path!r} is already listed at line {seen[path]}")
        seen[path] = no
    rows = [{"path": p, "wnid": wnid_from_path(p), "label": lab} for p, lab, _ in entries]
    return _images_frame(rows, ["path", "wnid", "label"])


def _import_one_list(file: str | os.PathLike, out: str | os.PathLike, *, fmt: str, labels: str,
                     argv: list[str] | None) -> Manifest:
    images = image_list_table(parse_list(file, labels=labels), name=str(file))
    return write_with_card(
        out, kind=IMAGE_LIST, tables={"images": images},
        config={"import": fmt, "source_file": str(file)}, inputs=[input_record(fmt, file)],
        summary={"images": len(images), "labels": sorted(int(x) for x in images["label"].unique())[:20]},
        note=f"imported from {fmt} list", argv=argv, title=f"OOD image list (imported {fmt})",
    )


def import_imagenet_ood(file: str | os.PathLike, out: str | os.PathLike, *, argv: list[str] | None = None) -> Manifest:
    """ImageNet-OOD list (one relative image path per line) -> `image-list` manifest with label -1."""
    return _import_one_list(file, out, fmt="imagenet-ood", labels="none", argv=argv)


def import_openood_imglist(file: str | os.PathLike, out: str | os.PathLike, *,
                           argv: list[str] | None = None) -> Manifest:
    """OpenOOD imglist (`path label` per line) -> `image-list` manifest keeping the labels."""
    return _import_one_list(file, out, fmt="openood-imglist", labels="required", argv=argv)
