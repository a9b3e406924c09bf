"""The write step of `isood build-splits` (also used by imports and test fixtures): a ``splits`` manifest."""

from __future__ import annotations

import os
from typing import Any, Iterable, Mapping

import pandas as pd

import manifests
from isood.kinds import SPLITS, SplitsView

__all__ = ["cell_lists", "write_splits"]


def cell_lists(images: pd.DataFrame, cells: pd.DataFrame) -> dict[str, str]:
    """``lists/<cell>.txt`` -> the cell's image paths, one per line in table order, for every cell of ``cells``
    (an empty cell gets an empty file)."""
    by_cell = images.groupby("cell", sort=False)["path"].apply(list).to_dict()
    return {f"lists/{cell}.txt": "".join(f"{p}\n" for p in by_cell.get(cell, [])) for cell in cells["cell"]}


def write_splits(out: str | os.PathLike, *, images: pd.DataFrame, cells: pd.DataFrame, edges: pd.DataFrame,
                 dropped: pd.DataFrame | None = None, config: Mapping[str, Any], inputs: Iterable[dict] = (),
                 files: Mapping[str, bytes | str] | None = None, existing_files: Iterable[str] = (),
                 summary: Mapping[str, Any] | None = None, note: str = "", argv: list[str] | None = None,
                 card: bool = True) -> SplitsView:
    """Write a ``splits`` manifest (tables checked against the kind's schema) with a cell list
    ``lists/<cell>.txt`` per row of ``cells`` (entries of ``files`` win) and, with ``card``, the dataset card,
    through ``manifests.writing`` (inside a stage's work folder: into it). Returns the typed view."""
    tables = {"images": images, "cells": cells, "edges": edges}
    if dropped is not None:
        tables["dropped"] = dropped
    all_files = {**cell_lists(images, cells), **dict(files or {})}
    write = manifests.write_with_card if card else manifests.write_manifest
    with manifests.writing(out, SPLITS) as o:
        write(o.work, kind=SPLITS, tables=tables, config=config, inputs=inputs, files=all_files,
              existing_files=existing_files, summary=summary, note=note, argv=argv)
    return manifests.read(o.final, kind=SPLITS)
