"""The `datasets` configs of a manifest (pure planning plus the rows behind each config): which configs a kind's
``CardSpec`` (``manifests.schema``, registered with the kind) gives its tables, and the derived Parquet files that
back them. This module knows no particular kind; for a kind without a spec it uses the first table, split `train`:

- `all` = the kind's main table; every other table gets a config named after it (`cells`, `edges`, ...);
- ``split``: the split name of the main table's rows (`test` for benchmark data, `train` for plain tables);
  with ``split_by`` (a column, e.g. `source`) each distinct value is its own split, in `all` and in every other
  config, so sources are never mixed by accident;
- ``config_by`` (a column, e.g. `cell` or `decision`): one config per value (renamed by ``config_names``;
  only the values ``allowed_configs`` returns, e.g. the measured grid cells; an item ``(split_by value, value)``
  allows a value in that split only), backed by a Parquet file `data/configs/<config>/<split>.parquet` holding
  those rows of the main table; the values ``config_values`` adds (e.g. every cell of the grid, N/A ones
  included) get a config without rows;
- a config without rows (such a value, or a table with no rows) is backed by a Parquet file with the table's
  columns and no row group: `datasets` streams it as no rows (``streaming=True``), and refuses it without
  streaming with its own one line (`Instruction "test" corresponds to no data!`); a file whose only row group
  is empty (how a 0-row table is written) would fail with an opaque ``DatasetGenerationError`` instead.

``manifests.card`` writes these files and the README.md that names them; ``manifests.card_stream`` plans the
configs of a main table too large for memory from the same ``plan_configs``.
"""

from __future__ import annotations

import io
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable, Mapping

import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq

from isood.core.errors import ManifestError
from manifests.meta import CONFIGS_DIR
from manifests.schema import CardSpec, kind_spec
from manifests.store import PARQUET_OPTIONS

__all__ = ["ConfigLayout", "Routes", "config_layout", "split_name", "card_spec", "card_frames", "allowed_splits",
           "plan_configs", "add_other_tables", "resolve_empty", "empty_parquet_bytes"]

_SPLIT_RE = re.compile(r"^\w+(\.\w+)*$")  # what `datasets` accepts as a split or config name


def split_name(source: str | None, default: str) -> str:
    """A `datasets` split name for a source folder ('in21k-val' -> 'in21k_val'; '' -> `default`)."""
    if source is None or source == "":
        return default
    name = re.sub(r"\W+", "_", str(source)).strip("_")
    if not name:
        raise ManifestError(f"source {source!r} gives an empty split name; rename it with letters or digits")
    if name[0].isdigit():
        name = f"s_{name}"
    return name


def _frame(table: pd.DataFrame | pa.Table) -> pd.DataFrame:
    return table.to_pandas() if isinstance(table, pa.Table) else table


def card_spec(kind: str, tables: Mapping[str, Any]) -> CardSpec:
    """The kind's ``CardSpec``, or a plain one for a kind without (main table: the first of ``tables``)."""
    spec = kind_spec(kind)
    if spec is not None and spec.card is not None:
        return spec.card
    first = sorted(tables)[0] if tables else None
    return CardSpec(title=f"isood {kind} manifest", description=f"An isood {kind} manifest.", main=first)


def card_frames(kind: str, main: str | None, tables: Mapping[str, pd.DataFrame | pa.Table], *,
                root: Path | None = None, table_files: Mapping[str, str] | None = None) -> dict[str, pd.DataFrame]:
    """The tables a kind's card is drawn from, as DataFrames: ``main`` (when in ``tables``) and the tables its
    callbacks read (``CardSpec.reads``; None: every table), from ``tables`` or read from the ``table_files``
    under ``root`` (never the main one: a streamed main table is not loaded). Other tables are only named."""
    names = {*tables, *(table_files or {})}
    card = card_spec(kind, dict.fromkeys(names))
    wanted: set[str | None] = set(names) if card.reads is None else {main, *card.reads}
    frames = {n: _frame(t) for n, t in tables.items() if n in wanted}
    for n, rel in (table_files or {}).items():
        if n in wanted and n != main and n not in frames:
            frames[n] = pq.read_table(Path(root or ".") / rel).to_pandas()
    return frames


@dataclass
class ConfigLayout:
    """The `datasets` configs of a manifest: config -> split -> relative Parquet path, plus the derived files."""

    configs: dict[str, dict[str, str]] = field(default_factory=dict)
    files: dict[str, pd.DataFrame] = field(default_factory=dict)  # derived path -> rows to write
    main: str | None = None
    partitions: list[str] = field(default_factory=list)  # configs made from the `config_by` column
    config_by: str | None = None
    written: list[str] = field(default_factory=list)  # derived files already written (streamed main table)
    empty: dict[str, str] = field(default_factory=dict)  # derived path without rows -> the table whose columns it has

    def has_rows(self, config: str) -> bool:
        """Whether any split of ``config`` is backed by rows (not only by ``empty`` files)."""
        return any(p not in self.empty for p in self.configs.get(config, {}).values())


def _column_values(df: pd.DataFrame, column: str) -> pd.Series:
    return df[column].fillna("").astype(str)


def allowed_splits(allowed: Iterable[Any] | None) -> dict[str, set[str] | None] | None:
    """``allowed_configs``' answer as config value -> the ``split_by`` values it may use (None: every split).
    An item is a value (allowed in every split) or a ``(split_by value, value)`` pair (allowed in that split)."""
    if allowed is None:
        return None
    out: dict[str, set[str] | None] = {}
    for item in allowed:
        if isinstance(item, tuple):
            split_value, value = (str(x) for x in item)
            current = out.setdefault(value, set())
            if current is not None:  # None: already allowed in every split
                current.add(split_value)
        else:
            out[str(item)] = None
    return out


#: ``(split_by value, config_by value)`` key -> the derived files its rows go to (a key is a ``string_keys`` tuple:
#: two strings here).
Routes = dict[tuple[str, ...], list[str]]


def _config_name(card: CardSpec, value: str) -> str:
    return card.config_names.get(value, re.sub(r"\W+", "_", value).strip("_"))


def plan_configs(card: CardSpec, main_name: str, pairs: Iterable[tuple[str, ...]], *, split_col: str | None,
                 config_col: str | None, allowed: Mapping[str, set[str] | None] | None,
                 every: Iterable[Any] | None = None) -> tuple[ConfigLayout, Routes]:
    """The configs of a main table from the ``(split_by value, config_by value)`` pairs its rows have ('' for a
    column it lacks), and the derived files each pair's rows go to (pure; in-memory and streamed tables alike).
    ``every``: ``CardSpec.config_values``' answer; a value among them without a config of rows gets one
    without rows (a file per split of the main table, in ``layout.empty``)."""
    pairs = set(pairs)
    layout = ConfigLayout(main=main_name)
    sources = sorted({s for s, _ in pairs}) if split_col and pairs else [""]
    splits = {s: split_name(s, card.split) for s in sources}
    if len(set(splits.values())) != len(splits):
        raise ManifestError(f"sources {sources} give clashing split names {sorted(splits.values())}; rename them")
    routes: Routes = {}

    def put(config: str, value: str | None, only: set[str] | None = None) -> None:
        for s in sources:
            keys = sorted(k for k in pairs if k[0] == s and (value is None or k[1] == value))
            if keys and (only is None or s in only):
                rel = f"{CONFIGS_DIR}/{config}/{splits[s]}.parquet"
                layout.configs.setdefault(config, {})[splits[s]] = rel
                for k in keys:
                    routes.setdefault(k, []).append(rel)

    if len(sources) == 1:  # one split: the main table itself, no copy
        layout.configs["all"] = {splits[sources[0]]: f"data/{main_name}.parquet"}
    else:
        put("all", None)
    if config_col:
        for value in sorted({v for _, v in pairs if v}):
            name = _config_name(card, value)
            if (allowed is not None and value not in allowed) or not name or name in layout.configs:
                continue
            put(name, value, None if allowed is None else allowed[value])
            if name in layout.configs:
                layout.partitions.append(name)
        for value in sorted({str(v) for v in every or () if str(v)}):
            name = _config_name(card, value)
            if not name or name in layout.configs:
                continue
            for s in sources:
                rel = f"{CONFIGS_DIR}/{name}/{splits[s]}.parquet"
                layout.configs.setdefault(name, {})[splits[s]] = rel
                layout.empty[rel] = main_name
            layout.partitions.append(name)
        layout.config_by = card.config_by
    return layout, routes


def add_other_tables(layout: ConfigLayout, paths: Mapping[str, str]) -> None:
    for name in sorted(paths):
        if name != layout.main and name not in layout.configs and _SPLIT_RE.match(name):
            layout.configs[name] = {"train": paths[name]}


def resolve_empty(layout: ConfigLayout, meta: Mapping[str, Any]) -> ConfigLayout:
    """Point every config backed by a table without rows (``meta["tables"]``: a 0-row table is written with
    one empty row group, which `datasets` cannot read) at a derived file without row groups instead
    (``layout.empty``). Pure and idempotent; returns ``layout``."""
    no_rows = {rec["path"]: name for name, rec in (meta.get("tables") or {}).items() if int(rec.get("rows", 1)) == 0}
    for config, splits in layout.configs.items():
        for split, rel in list(splits.items()):
            if rel in no_rows:
                new = f"{CONFIGS_DIR}/{config}/{split}.parquet"
                splits[split] = new
                layout.empty[new] = no_rows[rel]
    return layout


def empty_parquet_bytes(schema: pa.Schema) -> bytes:
    """A Parquet file with ``schema`` and no row group (identical schema, identical bytes)."""
    buf = io.BytesIO()
    pq.ParquetWriter(buf, schema, **PARQUET_OPTIONS).close()
    return buf.getvalue()


def config_layout(kind: str, tables: Mapping[str, pd.DataFrame | pa.Table], meta: Mapping[str, Any] | None = None,
                  *, paths: Mapping[str, str] | None = None) -> ConfigLayout:
    """Which configs a manifest of `kind` with these tables gets, and the derived Parquet files behind them.
    ``paths``: tables written elsewhere (``write_manifest(table_files=...)``), name -> relative path, that get a
    config too; only the tables the card reads (``card_frames``) are converted to DataFrames."""
    card = card_spec(kind, tables)
    main_name = card.main if card.main in tables else (sorted(tables)[0] if tables else None)
    if main_name is None:
        return ConfigLayout()
    names, tables = list(tables), card_frames(kind, main_name, tables)
    main = tables[main_name]
    split_col = card.split_by if card.split_by and card.split_by in main.columns else None
    config_col = card.config_by if card.config_by and card.config_by in main.columns else None
    src = _column_values(main, split_col) if split_col else pd.Series("", index=main.index, dtype=object)
    values = _column_values(main, config_col) if config_col else pd.Series("", index=main.index, dtype=object)
    allowed = (allowed_splits(card.allowed_configs(tables, meta or {}) if card.allowed_configs else None)
               if config_col else None)
    every = card.config_values(tables, meta or {}) if config_col and card.config_values else None
    layout, routes = plan_configs(card, main_name, zip(src, values), split_col=split_col, config_col=config_col,
                                  allowed=allowed, every=every)
    keys = src.astype(str) + "\x00" + values.astype(str)
    by_file: dict[str, set[str]] = {}
    for (s, v), rels in routes.items():
        for rel in rels:
            by_file.setdefault(rel, set()).add(f"{s}\x00{v}")
    for rel, wanted in sorted(by_file.items()):
        layout.files[rel] = main[keys.isin(wanted).to_numpy()].reset_index(drop=True)
    add_other_tables(layout, {**{name: f"data/{name}.parquet" for name in names}, **(paths or {})})
    return layout
