"""Dataset cards of manifests whose main table is too large for memory (millions of rows).

``MainTableStream`` writes a kind's main table piece by piece (``manifests.stream.ParquetStream``) and, in the
same pass, a staged Parquet file per (``split_by`` value, ``config_by`` value) of its rows, the `datasets`
configs the kind's ``CardSpec`` may ask for. ``write_streamed`` then plans the configs exactly as
``manifests.card_layout.config_layout`` does for an in-memory table (``plan_configs``), renames the staged files the
plan keeps into `data/configs/<config>/<split>.parquet`, deletes the others (e.g. N/A cells), and hands over to
``manifests.card.write_with_card``. A main table already written as Parquet (``table_files``) is partitioned in
a second pass instead (``streamed_layout``). Memory stays bounded by a row group either way. ``add_card`` gives
an existing manifest its card the same way (its table files kept as they are). Like ``manifests.card``, this
module knows no kind.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Callable, Iterable, Mapping, Sequence

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq

from isood.core.errors import ManifestError
from manifests.card import CARD_FIGURE, CARD_FILE, CONFIGS_DIR, dataset_card, write_with_card
from manifests.card_layout import (
    ConfigLayout,
    Routes,
    add_other_tables,
    allowed_splits,
    card_frames,
    card_spec,
    plan_configs,
    resolve_empty,
)
from manifests.output import writing
from manifests.store import Manifest, read
from manifests.verify import verify
from manifests.stream import ROW_GROUP_ROWS, ParquetStream, key_counts, partition_parquet, string_keys

__all__ = ["MainTableStream", "streamed_layout", "finish_stream", "write_streamed", "add_card", "WHOLE_TABLE_ROWS"]

#: Rows per row group of a table written whole (``manifests.store.parquet_bytes``: pyarrow's default). A side
#: table streamed with it (``ParquetStream(path, schema, row_group_rows=WHOLE_TABLE_ROWS)``) is written with the
#: bytes it had when a writer held it whole, so moving a writer to streaming keeps its files and content hash.
WHOLE_TABLE_ROWS = 1 << 20


class MainTableStream:
    """A kind's main table (its ``CardSpec.main``) written piece by piece to `data/<main>.parquet`, with a
    staged copy of its rows per (split_by value, config_by value) for the `datasets` configs."""

    def __init__(self, root: str | Path, kind: str, schema: pa.Schema, *, row_group_rows: int = ROW_GROUP_ROWS,
                 plain_columns: Sequence[str] = ()) -> None:
        card = card_spec(kind, {})
        if card.main is None:
            raise ManifestError(f"{kind}: the kind's card names no main table to stream")
        self.root, self.kind, self.name = Path(root), kind, card.main
        self.rel = f"data/{card.main}.parquet"
        self.columns = [c if c and c in schema.names else None for c in (card.split_by, card.config_by)]
        self.main = ParquetStream(self.root / self.rel, schema, row_group_rows=row_group_rows,
                                  plain_columns=plain_columns)
        self.row_group_rows, self.plain_columns = row_group_rows, plain_columns
        self.parts: dict[tuple[str, ...], ParquetStream] = {}

    def write(self, piece: pa.Table) -> None:
        """Append rows to the main table and to the staged copy of each of their keys."""
        self.main.write(piece)
        if not any(self.columns) or not piece.num_rows:
            return
        codes, keys = string_keys(piece, self.columns)
        if len(keys) == 1:
            self._part(next(iter(keys.values()))).write(piece)
            return
        order = np.argsort(codes, kind="stable")
        sorted_codes = codes[order]
        bounds = np.flatnonzero(np.diff(sorted_codes)) + 1
        for lo, hi in zip(np.r_[0, bounds], np.r_[bounds, len(order)]):
            self._part(keys[int(sorted_codes[lo])]).write(piece.take(pa.array(order[lo:hi])))

    def _part(self, key: tuple[str, ...]) -> ParquetStream:
        if key not in self.parts:
            path = self.root / CONFIGS_DIR / f"part-{len(self.parts)}.parquet"
            self.parts[key] = ParquetStream(path, self.main.schema, row_group_rows=self.row_group_rows, buffered=False,
                                            plain_columns=self.plain_columns)
        return self.parts[key]

    def abort(self) -> None:
        for s in [self.main, *self.parts.values()]:
            if not s.staged.done:
                s.abort()


def _card_tables(root: Path, kind: str, tables: Mapping[str, pd.DataFrame | pa.Table],
                 table_files: Mapping[str, str], main: str) -> dict[str, pd.DataFrame]:
    """The other tables the kind's card reads (``manifests.card_layout.card_frames``), as DataFrames."""
    frames = card_frames(kind, main, tables, root=root, table_files=table_files)
    return {n: f for n, f in frames.items() if n != main}


def _plan(kind: str, main: str, main_rel: str, columns: Sequence[str | None],
          pairs: Iterable[tuple[str, ...]], others: Mapping[str, pd.DataFrame], meta: Mapping[str, Any],
          paths: Mapping[str, str]) -> tuple[ConfigLayout, Routes]:
    card = card_spec(kind, {main: None, **others})
    split_col, config_col = columns
    allowed = (allowed_splits(card.allowed_configs(others, meta) if card.allowed_configs else None)
               if config_col else None)
    every = card.config_values(others, meta) if config_col and card.config_values else None
    layout, routes = plan_configs(card, main, pairs, split_col=split_col, config_col=config_col, allowed=allowed,
                                  every=every)
    layout.configs = {c: {s: (main_rel if p == f"data/{main}.parquet" else p) for s, p in sp.items()}
                      for c, sp in layout.configs.items()}
    add_other_tables(layout, paths)
    return layout, routes


def streamed_layout(root: Path, kind: str, main: str, main_rel: str, others: Mapping[str, pd.DataFrame],
                    meta: Mapping[str, Any], paths: Mapping[str, str]) -> ConfigLayout:
    """The configs of a main table already written as Parquet: its per-config files are written now
    (``partition_parquet``, one row group at a time) and listed in ``written``."""
    card = card_spec(kind, {main: None, **others})
    names = pq.read_schema(root / main_rel).names
    columns = [c if c and c in names else None for c in (card.split_by, card.config_by)]
    counts = key_counts(root / main_rel, columns)
    layout, routes = _plan(kind, main, main_rel, columns, counts, others, meta, paths)
    written = partition_parquet(root / main_rel, columns, {k: [root / r for r in rels] for k, rels in routes.items()})
    layout.written = sorted(p.relative_to(root).as_posix() for p in written)
    return layout


def _place_parts(stream: MainTableStream, routes: Mapping[tuple[str, ...], list[str]]) -> list[str]:
    """Rename each staged copy onto the one config file that holds exactly its rows; files gathering several
    keys (the per-split copies of `all`) are partitioned from the main table; unused copies are deleted."""
    by_file: dict[str, list[tuple[str, ...]]] = {}
    for key, rels in routes.items():
        for rel in rels:
            by_file.setdefault(rel, []).append(key)
    placed: list[str] = []
    gathered: dict[tuple[str, ...], list[Path]] = {}
    for rel, keys in sorted(by_file.items()):
        if len(keys) == 1 and keys[0] in stream.parts and not stream.parts[keys[0]].staged.done:
            stream.parts[keys[0]].commit(stream.root / rel)
            placed.append(rel)
        else:
            for key in keys:
                gathered.setdefault(key, []).append(stream.root / rel)
    for part in stream.parts.values():
        if not part.staged.done:
            part.abort()
    if gathered:
        written = partition_parquet(stream.root / stream.rel, stream.columns, gathered)
        placed += [p.relative_to(stream.root).as_posix() for p in written]
    return sorted(placed)


def finish_stream(stream: MainTableStream, *, tables: Mapping[str, pd.DataFrame | pa.Table],
                  config: Mapping[str, Any], table_files: Mapping[str, str] | None = None
                  ) -> tuple[ConfigLayout, dict[str, str]]:
    """Commit a streamed main table and place its config files (as ``config_layout`` plans them for these
    other ``tables`` and ``config``); returns the layout and the table files (the main one added), for
    ``write_with_card(layout=..., table_files=...)``. On an error every staged file is deleted."""
    root, table_files = stream.root, dict(table_files or {})
    meta = {"kind": stream.kind, "command": {"config": dict(config)}}
    try:
        stream.main.commit()
        table_files[stream.name] = stream.rel
        paths = {**{n: f"data/{n}.parquet" for n in tables}, **table_files}
        others = _card_tables(root, stream.kind, tables, table_files, stream.name)
        layout, routes = _plan(stream.kind, stream.name, stream.rel, stream.columns, stream.parts, others, meta,
                               paths)
        layout.written = _place_parts(stream, routes)
    except BaseException:
        stream.abort()
        raise
    return layout, table_files


def write_streamed(root: str | Path, *, kind: str, stream: MainTableStream | None = None,
                   tables: Mapping[str, pd.DataFrame | pa.Table], config: Mapping[str, Any],
                   table_files: Mapping[str, str] | None = None, inputs: Iterable[dict] = (),
                   files: Mapping[str, bytes | str] | None = None, existing_files: Iterable[str] = (),
                   summary: Mapping[str, Any] | None = None, note: str = "", argv: list[str] | None = None,
                   title: str | None = None, figure: Callable[[Path], bytes | None] | None = None) -> Manifest:
    """``manifests.card.write_with_card`` (same arguments) for a main table written by ``stream``
    (``finish_stream``) or given in ``table_files`` (partitioned here, ``streamed_layout``)."""
    root, table_files = Path(root), dict(table_files or {})
    if stream is not None:
        layout, table_files = finish_stream(stream, tables=tables, config=config, table_files=table_files)
    else:
        main = card_spec(kind, {**tables, **table_files}).main
        if main is None or main not in table_files:
            raise ManifestError(f"{kind}: write_streamed needs a stream or the main table {main!r} in table_files")
        meta = {"kind": kind, "command": {"config": dict(config)}}
        paths = {**{n: f"data/{n}.parquet" for n in tables}, **table_files}
        others = _card_tables(root, kind, tables, table_files, main)
        layout = streamed_layout(root, kind, main, table_files[main], others, meta, paths)
    return write_with_card(root, kind=kind, tables=tables, config=config, inputs=inputs, files=files,
                           existing_files=existing_files, table_files=table_files, layout=layout, summary=summary,
                           note=note, argv=argv, title=title, figure=figure)


# ------------------------------------------------------------------------------------------------ isood card
def _columns(kind: str, main: str, root: Path, main_rel: str, others: Mapping[str, pd.DataFrame]) -> list[str | None]:
    card = card_spec(kind, {main: None, **others})
    names = pq.read_schema(root / main_rel).names
    return [c if c and c in names else None for c in (card.split_by, card.config_by)]


def _card_is_current(m: Manifest, table_files: Mapping[str, str], title: str | None) -> bool:
    """Whether ``m`` holds the card and config files ``add_card`` would write now: the planned configs (one pass
    over the main table's split and config columns) are the derived files it lists, and the card drawn from its
    own manifest.json is its README.md."""
    listed = {r["path"] for r in m.meta["files"]}
    main = card_spec(m.kind, dict(table_files)).main
    if CARD_FILE not in listed or main is None or main not in table_files:
        return False
    meta = {"kind": m.kind, "command": {"config": dict((m.meta.get("command") or {}).get("config") or {})}}
    others = _card_tables(m.root, m.kind, {}, table_files, main)
    columns = _columns(m.kind, main, m.root, table_files[main], others)
    layout, _ = _plan(m.kind, main, table_files[main], columns, key_counts(m.root / table_files[main], columns),
                      others, meta, dict(table_files))
    resolve_empty(layout, m.meta)
    planned = {p for splits in layout.configs.values() for p in splits.values() if p.startswith(CONFIGS_DIR + "/")}
    if planned != {p for p in listed if p.startswith(CONFIGS_DIR + "/") and p != CARD_FIGURE}:
        return False
    card = dataset_card(m.meta, others, title=title, layout=layout, n_rows=int(m.meta["tables"][main]["rows"]),
                        root=m.root)
    if not (m.root / CARD_FILE).is_file() or any(not (m.root / p).is_file() for p in planned):
        return False
    return (m.root / CARD_FILE).read_text(encoding="utf-8") == card


def _card_title(root: Path) -> str | None:
    """The title (`pretty_name`) of the card a manifest has, kept when its card is redrawn."""
    from huggingface_hub.repocard import metadata_load  # ~0.3 s to import: only when a card is drawn

    try:
        title = (metadata_load(root / CARD_FILE) or {}).get("pretty_name") if (root / CARD_FILE).is_file() else None
    except (ValueError, OSError):
        return None
    return str(title) if title else None


def _derived(path: str) -> bool:
    """A file ``add_card`` draws from the rest (the card, the per-config Parquet files)."""
    return path == CARD_FILE or path.startswith(CONFIGS_DIR + "/")


def _read_for_card(root: str | Path) -> Manifest:
    """The manifest, verified (fast) but for the files ``add_card`` rebuilds: a missing README.md or config file
    is what ``isood card`` is for (an edited one is refused like any other change: it may hold someone's work);
    anything else failing is refused, naming it."""
    report = verify(root, mode="fast")
    report.missing = [p for p in report.missing if not _derived(p)]
    if not report.ok:
        lines = report.lines()
        raise ManifestError(f"{root} fails verification: {'; '.join(lines[:2])}; restore its files or rebuild it "
                            f"(`isood verify {root}` lists every problem)")
    return read(root)


def add_card(root: str | Path, note: str = "dataset card and per-config Parquet files",
             figure: Callable[[Path], bytes | None] | None = None) -> Manifest:
    """Give an existing manifest (written without a card, or by an older isood) its card and config files.

    A manifest that already has the card and config files this isood writes is left as it is (nothing is
    written). Otherwise it is rewritten through ``manifests.writing`` with its own table files (registered as
    they are, never rewritten), config and other files (verified first), its card's title kept; the main table
    is partitioned one row group at a time (``write_streamed``). The card and config files are derived, so the
    content hash and the dataset version stay.
    """
    kind = read(root).kind
    with writing(root, kind, option="MANIFEST_DIR") as o:  # the output lock, also when nothing is to be written
        m = _read_for_card(root)
        table_files = {name: str(rec["path"]) for name, rec in m.meta["tables"].items()}
        title = _card_title(m.root)
        if _card_is_current(m, table_files, title):
            o.unchanged()
        else:
            _rewrite_with_card(m, o.work, table_files, title, note, figure)
    return read(root, kind=kind)


def _rewrite_with_card(m: Manifest, work: Path, table_files: dict[str, str], title: str | None, note: str,
                       figure: Callable[[Path], bytes | None] | None = None) -> None:
    others = [
        r["path"] for r in m.meta["files"]
        if r["path"] not in set(table_files.values()) and r["path"] != CARD_FILE
        and not r["path"].startswith(CONFIGS_DIR + "/")
    ]
    command = m.meta.get("command") or {}
    args: dict[str, Any] = dict(kind=m.kind, tables={}, table_files=table_files, config=command.get("config") or {},
                                inputs=m.meta.get("inputs", []), existing_files=others,
                                summary=m.meta.get("summary") or {}, note=note, argv=command.get("argv") or [],
                                title=title, figure=figure)
    if table_files:
        write_streamed(work, **args)
    else:
        write_with_card(work, **args)
