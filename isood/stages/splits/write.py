"""The write step of `isood build-splits` (also used by imports and test fixtures): a ``splits`` manifest."""

from __future__ import annotations

import os
from typing import Any, Iterable, Mapping

import pandas as pd

import manifests
from isood.report.card_figure import card_mosaic
from isood.kinds import SPLITS, SplitsView
from manifests.card_stream import write_streamed

__all__ = ["cell_lists", "write_splits"]

#: Where the images table goes (``write_manifest`` writes a table ``name`` to ``data/<name>.parquet``).
IMAGES_FILE = "data/images.parquet"


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
    ``lists/<cell>.txt`` per row of ``cells`` (entries of ``files`` win) and the dataset card, through
    ``manifests.writing`` (inside a stage's work folder: into it). Returns the typed view.

    The images table is written first (the bytes ``write_manifest`` would write) and its per-cell `datasets`
    configs are then cut from that file one row group at a time (``manifests.card_stream.write_streamed``): at
    12M rows that is twice as fast as cutting the in-memory table and adds no copy of it to memory.
    ``card=False`` writes a plain manifest without card (an older isood's output; `isood card` adds one)."""
    tables = {"images": images, "cells": cells, "edges": edges}
    if dropped is not None:
        tables["dropped"] = dropped
    all_files = {**cell_lists(images, cells), **dict(files or {})}
    args: dict[str, Any] = dict(kind=SPLITS, config=config, inputs=inputs, files=all_files,
                                existing_files=existing_files, summary=summary, note=note, argv=argv)
    with manifests.writing(out, SPLITS) as o:
        if card:
            manifests.atomic_write_bytes(o.work / IMAGES_FILE, manifests.parquet_bytes(images))
            write_streamed(o.work, tables={k: v for k, v in tables.items() if k != "images"},
                           table_files={"images": IMAGES_FILE}, figure=card_mosaic, **args)
        else:
            manifests.write_manifest(o.work, tables=tables, **args)
    view = manifests.read(o.final, kind=SPLITS)
    assert isinstance(view, SplitsView)  # read(kind=SPLITS) returns the kind's registered view
    return view
