"""Manifest kinds: what each kind of manifest holds (its tables and their columns, the fields other stages may
read, how its dataset card is laid out), registered once by the code that writes that kind.

A ``KindSpec`` is pure description; ``manifests.read(path, kind=...)`` and ``manifests.write_manifest`` use it
to refuse a manifest whose tables do not match (a one-line ``SchemaError`` naming the table and the column)
and to return the kind's typed view. This module knows nothing about any particular kind: the specs live with
the code that writes them (``isood.kinds``).

Column types are checked by family, so a writer may choose the width: ``int`` (any integer), ``float`` (any
floating point), ``string`` (string / large string), ``bool``; a column whose values are all missing (Arrow's
``null`` type, e.g. an all-``None`` pandas column) matches any family. Extra columns are always allowed.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Iterable, Mapping, Sequence

import pyarrow as pa

from isood.core.errors import ManifestError, SchemaError

__all__ = [
    "TableSpec", "CardSpec", "KindSpec", "register_kind", "kind_spec", "registered_kinds", "check_schema",
    "INT", "FLOAT", "STRING", "BOOL",
]

INT, FLOAT, STRING, BOOL = "int", "float", "string", "bool"
_FAMILY_CHECKS: dict[str, Callable[[pa.DataType], bool]] = {
    INT: pa.types.is_integer,
    FLOAT: pa.types.is_floating,
    STRING: lambda t: pa.types.is_string(t) or pa.types.is_large_string(t),
    BOOL: pa.types.is_boolean,
}


@dataclass(frozen=True)
class TableSpec:
    """One table of a kind: required ``columns`` (name -> family among int/float/string/bool); ``optional``
    tables may be absent; ``paths``: string columns holding file paths, which must be relative and free of ``..``
    (checked when written and by ``isood verify``)."""

    columns: Mapping[str, str]
    optional: bool = False
    doc: str = ""
    paths: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        bad = {c: f for c, f in self.columns.items() if f not in _FAMILY_CHECKS}
        if bad:
            raise ValueError(f"unknown column type(s) {bad}; use {sorted(_FAMILY_CHECKS)}")


@dataclass(frozen=True)
class CardSpec:
    """How a kind's dataset card (README.md with `datasets` configs) is laid out; see ``manifests.card_layout``.

    ``main``: the table behind the ``all`` config. ``split``: split name of its rows (``test`` for benchmark
    data, ``train`` for plain tables). ``split_by``: a column whose values are separate splits (e.g. the source
    folder of an import). ``config_by``: a column whose values each get a config (e.g. ``cell``, ``decision``),
    renamed by ``config_names``; ``allowed_configs(tables, meta)`` returns the values that may get one (``None``:
    all non-empty values), e.g. the measured (non-N/A) cells, or ``(split value, value)`` pairs to allow a
    config in one split only (a cell measured in one source and N/A in another). ``config_values(tables, meta)``
    returns the values that get a config even without allowed rows (``None``: no others), e.g. every cell of
    the grid: such a config holds no rows (an empty Parquet file per split with the main table's columns), so
    the configs match the values a user may ask for. ``sections(meta, tables)`` returns extra
    ``(heading, markdown)`` sections; ``licence(meta)`` the licence text.

    ``reads``: the tables besides ``main`` that ``allowed_configs``, ``config_values`` and ``sections`` read
    (``None``: every table). Only these (and the main table) are loaded to draw the card; the others are named
    in its configs, never read, so a side table with a row per image (an audit's ``images``) costs no memory.
    """

    title: str
    description: str
    main: str | None = None
    split: str = "train"
    split_by: str | None = None
    config_by: str | None = None
    config_names: Mapping[str, str] = field(default_factory=dict)
    allowed_configs: Callable[[Mapping[str, Any], Mapping[str, Any]], Iterable[str | tuple[str, str]] | None] | None = None
    config_values: Callable[[Mapping[str, Any], Mapping[str, Any]], Iterable[str] | None] | None = None
    sections: Callable[[Mapping[str, Any], Mapping[str, Any]], Sequence[tuple[str, str]]] | None = None
    licence: Callable[[Mapping[str, Any]], str] | None = None
    reads: tuple[str, ...] | None = None


@dataclass(frozen=True)
class KindSpec:
    """A manifest kind: its ``tables``, the ``fields`` other stages may read (view attribute -> dotted path in
    manifest.json, e.g. ``"command.config.test_root"``), the typed ``view`` class ``read`` returns, its
    ``card`` layout, and ``writer`` (the command that writes it, for error messages)."""

    kind: str
    tables: Mapping[str, TableSpec]
    writer: str
    fields: Mapping[str, str] = field(default_factory=dict)
    view: type | None = None
    card: CardSpec | None = None


_REGISTRY: dict[str, KindSpec] = {}
#: Entry-point group of the modules that register kinds (isood's own: ``isood.kinds``, declared in pyproject.toml).
#: They are loaded on the first miss, so ``manifests.read(path, kind=...)`` returns typed views without the caller
#: importing the writer's module; this package imports none of them by name. A kind still unknown then is an error of
#: ``read(kind=...)``, never a plain view.
ENTRY_POINT_GROUP = "isood.manifest_kinds"
_providers_loaded = False


def _load_providers() -> None:
    global _providers_loaded
    if _providers_loaded:
        return
    _providers_loaded = True
    from importlib.metadata import entry_points

    for ep in entry_points(group=ENTRY_POINT_GROUP):
        ep.load()


def register_kind(spec: KindSpec) -> KindSpec:
    """Register (or re-register, e.g. on a module reload) the spec of ``spec.kind``; returns it."""
    _REGISTRY[spec.kind] = spec
    return spec


def kind_spec(kind: str) -> KindSpec | None:
    """The registered spec of ``kind`` (loading the registered kind providers on a miss), or None."""
    if kind not in _REGISTRY:
        _load_providers()
    return _REGISTRY.get(kind)


def registered_kinds() -> list[str]:
    _load_providers()
    return sorted(_REGISTRY)


def _family(t: pa.DataType) -> str | None:
    for name, check in _FAMILY_CHECKS.items():
        if check(t):
            return name
    return None


def check_schema(kind: str, schemas: Mapping[str, pa.Schema], where: str = "") -> None:
    """Raise ``SchemaError`` (one line naming the table and column) unless ``schemas`` (table name -> Arrow
    schema) hold every required table and column of ``kind`` with the declared type family. A kind without a
    registered spec passes."""
    spec = kind_spec(kind)
    if spec is None:
        return
    prefix = f"{where}: " if where else ""
    for name, table in spec.tables.items():
        schema = schemas.get(name)
        if schema is None:
            if table.optional:
                continue
            raise SchemaError(f"{prefix}{kind} manifest has no table {name!r} (has: {', '.join(sorted(schemas)) or 'none'}); "
                              f"rebuild it with {spec.writer}")
        for column, family in table.columns.items():
            if column not in schema.names:
                raise SchemaError(f"{prefix}{kind} manifest table {name!r} lacks column {column!r} ({family}); "
                                  f"rebuild it with {spec.writer}")
            t = schema.field(column).type
            if not pa.types.is_null(t) and not _FAMILY_CHECKS[family](t):
                raise SchemaError(f"{prefix}{kind} manifest table {name!r} column {column!r} is {t} ({_family(t) or t}), "
                                  f"not {family}; rebuild it with {spec.writer}")


def field_value(meta: Mapping[str, Any], path: str, default: Any = None) -> Any:
    """The value at a dotted ``path`` of manifest.json (``command.config.test_root``), or ``default``."""
    node: Any = meta
    for key in path.split("."):
        if not isinstance(node, Mapping) or key not in node:
            return default
        node = node[key]
    return node


def expect_kind(actual: str, expected: str | Sequence[str], where: str) -> None:
    """One-line ``ManifestError`` when a manifest is not of the expected kind(s)."""
    allowed = (expected,) if isinstance(expected, str) else tuple(expected)
    if actual not in allowed:
        writers = [(spec.writer if (spec := kind_spec(k)) is not None else "") for k in allowed]
        hint = f" (written by {' / '.join(w for w in writers if w)})" if any(writers) else ""
        raise ManifestError(f"{where} is a {actual!r} manifest; pass a {' or '.join(repr(k) for k in allowed)} "
                            f"manifest{hint}")
