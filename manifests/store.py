"""Manifest directories: write (atomic, deterministic Parquet), read (validated), verify (every hash).

A manifest is a directory::

    manifest.json        schema, kind, dataset version, package version, command + config, inputs with
                         sha256, tables with row counts, every file with sha256 and size, changelog
    data/<table>.parquet one Parquet file per table
    ...                  any other registered files (lists/, README.md dataset card, feature shards)

`manifest.json` is written last, so a directory without it is an unfinished write.
"""

from __future__ import annotations

import contextlib
import datetime as _dt
import io
import json
import os
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar, Iterable, Iterator, Mapping, Sequence

import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq

from isood.core.errors import BadInputError, ManifestError
from isood.core.errors import one_line
from isood.core.files import atomic_write_bytes, sha256_bytes, sha256_file
from manifests.meta import MANIFEST_FILE, SCHEMA_NAME, SCHEMA_VERSION, load_meta, package_version
from manifests.output import guard_direct_write
from manifests.ownership import (RECORD_KEY, folder_identity as _folder_identity, is_current, new_version_id,
                                 version_identity,
                                 unlink_inside, version_marker, version_of, walk_files)
from manifests.verify import bad_path_values, content_hash, verify as verify_manifest
from manifests.paths import check_relative, resolve_inside
from manifests.schema import KindSpec, check_schema, expect_kind, field_value, kind_spec

#: How every manifest table is written (also by the streaming writers of ``manifests.stream``).
PARQUET_OPTIONS = dict(compression="zstd", compression_level=3, use_dictionary=True, write_statistics=True)


def parquet_bytes(table: pd.DataFrame | pa.Table) -> bytes:
    """Serialise a table to Parquet bytes; identical input gives identical bytes."""
    if isinstance(table, pd.DataFrame):
        table = pa.Table.from_pandas(table, preserve_index=False)
    buf = io.BytesIO()
    pq.write_table(table, buf, **PARQUET_OPTIONS)
    return buf.getvalue()


def input_record(name: str, source: str | os.PathLike | None = None, sha256: str | None = None) -> dict:
    """Provenance of one input: a file is hashed; a directory by its listing (names + sizes); else given."""
    rec: dict[str, Any] = {"name": name}
    if source is not None:
        rec["source"] = str(source)
        p = Path(source)
        if sha256 is None and p.is_file():
            sha256 = sha256_file(p)
        elif sha256 is None and p.is_dir():
            listing = sorted(
                f"{q.relative_to(p).as_posix()}\t{q.stat().st_size}" for q in p.rglob("*") if q.is_file()
            )
            rec["hash_of"] = "listing"
            sha256 = sha256_bytes("\n".join(listing).encode())
    if sha256 is not None:
        rec["sha256"] = sha256
    return rec


@dataclass
class Manifest:
    """A validated manifest directory. It remembers which version it read (the version identity manifest.json
    records, whose marker a new version's swap removes): a table read after a writer swapped a new version in
    (``manifests.writing``) is refused with one line instead of mixing the old manifest.json with the new
    tables; the marker is checked before and after every read."""

    root: Path
    meta: dict = field(repr=False)
    identity: tuple | None = field(default=None, repr=False, compare=False)

    def __post_init__(self) -> None:
        if self.identity is None:
            self.identity = version_identity(self.root, self.meta)

    @property
    def version_id(self) -> str | None:
        """The identity of this one write of the folder (None for a manifest.json without the writer's record)."""
        return version_of(self.meta)

    @property
    def kind(self) -> str:
        return self.meta["kind"]

    @property
    def dataset_version(self) -> str:
        return self.meta["dataset_version"]

    @property
    def tables(self) -> list[str]:
        return sorted(self.meta.get("tables", {}))

    def path(self, rel: str) -> Path:
        return resolve_inside(self.root, rel)

    def table(self, name: str) -> pa.Table:
        with self._reading(name):
            return pq.read_table(self._table_path(name))

    def frame(self, name: str) -> pd.DataFrame:
        return self.table(name).to_pandas()

    def batches(self, name: str, columns: Sequence[str] | None = None) -> Iterator[pa.Table]:
        """A table one Parquet row group at a time (only ``columns`` when given): memory bounded by a row group
        however many rows the table has."""
        path = self._table_path(name)
        with self._reading(name):
            pf = pq.ParquetFile(path)
        for i in range(pf.num_row_groups):
            with self._reading(name):
                group = pf.read_row_group(i, columns=list(columns) if columns is not None else None)
            yield group

    def schema(self, name: str) -> pa.Schema:
        """The Arrow schema of a table, read from its Parquet footer (no rows are read)."""
        with self._reading(name):
            return pq.read_schema(self._table_path(name))

    def _table_path(self, name: str) -> Path:
        if name not in self.meta.get("tables", {}):
            raise ManifestError(f"{self.root}: manifest has no table {name!r} (has: {', '.join(self.tables)})")
        return self.path(self.meta["tables"][name]["path"])

    @contextlib.contextmanager
    def _reading(self, name: str) -> Iterator[None]:
        """A table file that is missing, truncated or corrupt: one ``ManifestError`` naming the manifest and the
        table (pyarrow's own error, an ``ArrowInvalid`` or ``OSError``, would reach the user as a traceback)."""
        try:
            yield
        except (OSError, pa.ArrowException) as e:
            self.check_unchanged()
            detail = "missing" if isinstance(e, FileNotFoundError) else one_line(e, 120)
            raise ManifestError(f"{self.root}: table {name!r} is unreadable ({detail}); rebuild the manifest or "
                                "restore its files (`isood verify` names them)") from None
        self.check_unchanged()

    def check_unchanged(self) -> None:
        """One-line ``ManifestError`` when ``root`` is no longer the folder this manifest was read from (a new
        version was swapped in meanwhile)."""
        if self.identity is not None and not is_current(self.root, self.identity):
            raise ManifestError(f"{self.root} was replaced by a new version while it was being read; read it again")

    @property
    def config(self) -> dict:
        """The command's config as recorded (for display and provenance; stages read typed views instead)."""
        return dict((self.meta.get("command") or {}).get("config") or {})

    @property
    def content_sha256(self) -> str | None:
        return self.meta.get("content_sha256")


class ManifestView(Manifest):
    """A manifest read through its kind's spec (``read(path, kind=...)``): its tables matched their schema.
    Subclasses (one per kind, in the module that writes the kind) add typed properties; ``field(name)`` reads
    one of the spec's declared fields."""

    spec: ClassVar[KindSpec | None] = None

    def field(self, name: str, default: Any = None) -> Any:
        spec = kind_spec(self.kind)
        if spec is None or name not in spec.fields:
            raise KeyError(f"{self.kind} manifests declare no field {name!r}")
        return field_value(self.meta, spec.fields[name], default)


def read(root: str | os.PathLike, kind: str | Sequence[str] | None = None, *, verify: str | None = None) -> Manifest:
    """Read and validate a manifest directory (every field of manifest.json, ``manifests.meta``; no file hashing).

    With ``kind`` (a kind or several allowed kinds), also refuse a manifest of another kind or of a kind with no
    registered spec, and one whose tables do not match the kind's registered schema (one line naming the table
    and column), and return the kind's typed view (e.g. ``isood.kinds.SplitsView``). Without ``kind`` a plain
    ``Manifest`` is returned. ``verify`` ('fast' or 'full', ``manifests.verify``): also check the files against
    their hashes and refuse, with one line, a manifest that fails (what every stage does with its inputs).
    """
    root = Path(root)
    for attempt in range(_READ_TRIES):
        try:
            return _read_once(root, kind, verify)
        except _Rewritten:
            if attempt + 1 == _READ_TRIES:
                raise ManifestError(f"{root} is being rewritten (a new version was swapped in while it was read, "
                                    f"{_READ_TRIES} times); read it again when the writer has finished") from None
            time.sleep(0.05 * (attempt + 1))
    raise AssertionError("unreachable")


_READ_TRIES = 5


class _Rewritten(Exception):
    """A new version of the folder was swapped in while ``read`` checked it: read it again."""


def _read_once(root: Path, kind: str | Sequence[str] | None, verify: str | None) -> Manifest:
    before = _folder_identity(root)
    meta = load_meta(root)
    identity = version_identity(root, meta, before)
    if verify is not None:
        report = verify_manifest(root, mode=verify)
        if report.version != version_of(meta) or not is_current(root, identity):
            raise _Rewritten()
        if not report.ok:
            lines = report.lines()
            more = f" (+{len(lines) - 2} more)" if len(lines) > 2 else ""
            raise ManifestError(f"{root} fails verification: {'; '.join(lines[:2])}{more}; restore its files or "
                                f"rebuild it (`isood verify {root}` lists every problem)")
    m = Manifest(root=root, meta=meta, identity=identity)
    if not is_current(root, identity):
        raise _Rewritten()
    if kind is None:
        return m
    expect_kind(m.kind, kind, str(root))
    spec = kind_spec(m.kind)
    if spec is None:
        raise ManifestError(f"{root}: no spec is registered for manifest kind {m.kind!r} (isood.kinds is not "
                            "imported, or the manifest was written by another tool); import isood.kinds or pass "
                            "an isood manifest")
    try:
        check_schema(m.kind, {name: m.schema(name) for name in m.tables}, str(root))
    except ManifestError:
        if not is_current(root, identity):
            raise _Rewritten() from None
        raise
    view = spec.view if spec.view is not None else ManifestView
    return view(root=root, meta=m.meta, identity=identity)


def _bump(version: str) -> str:
    major, minor, _patch = (int(x) for x in version.split("."))
    return f"{major}.{minor + 1}.0"


def write_manifest(
    root: str | os.PathLike,
    *,
    kind: str,
    tables: Mapping[str, pd.DataFrame | pa.Table],
    config: Mapping[str, Any],
    inputs: Iterable[dict] = (),
    files: Mapping[str, bytes | str] | None = None,
    existing_files: Iterable[str] = (),
    table_files: Mapping[str, str] | None = None,
    summary: Mapping[str, Any] | None = None,
    note: str = "",
    argv: list[str] | None = None,
) -> Manifest:
    """Write a manifest directory; ``manifest.json`` last (a directory without it is an unfinished write).

    tables: name -> table, written as data/<name>.parquet. files: extra relative path -> content (lists, card).
    existing_files: relative paths already written into `root` by the caller (e.g. feature shards) to register.
    table_files: name -> relative path of a Parquet table the caller already wrote (e.g. streamed in row
    groups, for tables too large for memory); its schema is checked and its rows and columns recorded from the
    Parquet footer. Tables are checked against the kind's schema before anything is written. The dataset
    version starts at 1.0.0 and its minor part is bumped, with a changelog entry, when a rewrite of the same kind
    changes the content; an identical rewrite keeps version and changelog.
    """
    root = Path(root)
    existing_files = list(existing_files)
    streamed = {name: pq.read_schema(resolve_inside(root, check_relative(rel)))
                for name, rel in (table_files or {}).items()}
    check_schema(kind, {**{name: _arrow_schema(t) for name, t in tables.items()}, **streamed}, f"writing {root}")
    _check_path_columns(root, kind, tables, table_files or {})
    guard_direct_write(root, kind, allow=[*existing_files, *(table_files or {}).values()])
    root.mkdir(parents=True, exist_ok=True)
    old = _set_aside_old(root)
    records: dict[str, dict] = {}
    table_meta = _write_tables(root, tables, records)
    for rel, content in sorted((files or {}).items()):
        _put(root, rel, content.encode() if isinstance(content, str) else content, records)
    for rel in existing_files:
        _register(root, rel, records)
    for name, rel in sorted((table_files or {}).items()):
        _register(root, rel, records)
        footer = pq.read_metadata(resolve_inside(root, rel))
        table_meta[name] = {"path": check_relative(rel), "rows": int(footer.num_rows),
                            "columns": list(streamed[name].names)}
    files_list = [records[k] for k in sorted(records)]
    chash = content_hash(files_list)
    version, changelog = _version(old, kind, chash, note)
    _remove_stale(root, old, records)
    meta = {
        "schema": {"name": SCHEMA_NAME, "version": SCHEMA_VERSION},
        "kind": kind,
        "dataset_version": version,
        "package": {"name": "isood", "version": package_version()},
        "created": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
        "command": {"argv": list(argv if argv is not None else sys.argv), "config": _jsonable(config)},
        "inputs": [_jsonable(i) for i in inputs],
        "tables": dict(sorted(table_meta.items())),
        "files": files_list,
        "content_sha256": chash,
        "summary": _jsonable(summary or {}),
        "changelog": changelog,
    }
    version = new_version_id()
    atomic_write_bytes(root / version_marker(version), (version + "\n").encode())
    own = sorted(rel for rel in walk_files(root) if rel not in records and rel != MANIFEST_FILE)
    meta[RECORD_KEY] = {"version": version, "own": own}  # manifests.ownership; outside the hashed content
    atomic_write_bytes(root / MANIFEST_FILE, (json.dumps(meta, indent=2, sort_keys=False) + "\n").encode())
    return Manifest(root=root, meta=meta)


def _check_path_columns(root: Path, kind: str, tables: Mapping[str, pd.DataFrame | pa.Table],
                        table_files: Mapping[str, str]) -> None:
    """Refuse absolute or ``..`` values in the kind's path columns (``TableSpec.paths``), whichever API wrote them:
    a stored path is relative to the manifest's recorded root and stays inside it."""
    spec = kind_spec(kind)
    if spec is None:
        return
    for name, table_spec in spec.tables.items():
        for column in table_spec.paths:
            if name in tables:
                t = tables[name]
                if column not in (t.column_names if isinstance(t, pa.Table) else t.columns):
                    continue
                values = t[column] if isinstance(t, pa.Table) else pa.array(t[column].astype(object), pa.string(),
                                                                            from_pandas=True)
                groups: Iterable[Any] = [values]
            elif name in table_files:
                pf = pq.ParquetFile(resolve_inside(root, table_files[name]))
                if column not in pf.schema_arrow.names:
                    continue
                groups = (pf.read_row_group(i, columns=[column])[column] for i in range(pf.num_row_groups))
            else:
                continue
            for values in groups:
                bad = bad_path_values(values)
                if bad:
                    raise BadInputError(f"writing {root}: {kind} table {name!r} column {column!r} holds absolute, "
                                        f"'..' or control-character paths ({', '.join(bad)}); store paths relative "
                                        "to the root the manifest records, without newlines or NUL bytes")


def _set_aside_old(root: Path) -> dict | None:
    """The previous manifest's metadata (None if absent or unreadable); its manifest.json is removed so the
    directory reads as unfinished until the new one lands."""
    if not (root / MANIFEST_FILE).is_file():
        return None
    try:
        old = load_meta(root)
    except ManifestError:
        old = None
    version = version_of(old)
    if version is not None:  # first: a reader of the old version sees it go before any file changes
        (root / version_marker(version)).unlink(missing_ok=True)
    (root / MANIFEST_FILE).unlink()
    return old


def _put(root: Path, rel: str, data: bytes, records: dict[str, dict]) -> None:
    rel = check_relative(rel)
    atomic_write_bytes(resolve_inside(root, rel), data)
    records[rel] = {"path": rel, "sha256": sha256_bytes(data), "bytes": len(data)}


def _register(root: Path, rel: str, records: dict[str, dict]) -> None:
    rel = check_relative(rel)
    p = resolve_inside(root, rel)
    if not p.is_file():
        raise ManifestError(f"{root}: registered file {rel!r} does not exist")
    records[rel] = {"path": rel, "sha256": sha256_file(p), "bytes": p.stat().st_size}


def _write_tables(root: Path, tables: Mapping[str, pd.DataFrame | pa.Table], records: dict[str, dict]) -> dict:
    """Write each table as data/<name>.parquet; returns the ``tables`` entries of manifest.json."""
    table_meta: dict[str, dict] = {}
    for name, table in sorted(tables.items()):
        rel = f"data/{name}.parquet"
        _put(root, rel, parquet_bytes(table), records)
        n = table.num_rows if isinstance(table, pa.Table) else len(table)
        cols = table.column_names if isinstance(table, pa.Table) else [str(c) for c in table.columns]
        table_meta[name] = {"path": rel, "rows": int(n), "columns": cols}
    return table_meta


def _version(old: Mapping[str, Any] | None, kind: str, chash: str, note: str) -> tuple[str, list]:
    """(dataset version, changelog): unchanged for identical content, minor bump for changed content of the
    same kind, 1.0.0 otherwise."""
    today = _dt.date.today().isoformat()
    if old and old.get("kind") == kind and old.get("content_sha256") == chash:
        return old["dataset_version"], old.get("changelog", [])
    if old and old.get("kind") == kind:
        version = _bump(old["dataset_version"])
        return version, old.get("changelog", []) + [{"version": version, "date": today,
                                                     "note": note or "content changed"}]
    return "1.0.0", [{"version": "1.0.0", "date": today, "note": note or f"first {kind} manifest"}]


def _remove_stale(root: Path, old: Mapping[str, Any] | None, records: Mapping[str, dict]) -> None:
    """Delete files the previous manifest owned and this one does not."""
    for rec in (old or {}).get("files", []):
        if rec["path"] not in records:
            unlink_inside(root, rec["path"])  # never through a link


def _arrow_schema(table: pd.DataFrame | pa.Table) -> pa.Schema:
    if isinstance(table, pa.Table):
        return table.schema
    return pa.Schema.from_pandas(table, preserve_index=False)


def _jsonable(obj: Any) -> Any:
    """Config values as plain JSON (paths -> str, tuples -> lists, numpy scalars -> python)."""
    if isinstance(obj, Mapping):
        return {str(k): _jsonable(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple, set, frozenset)):
        seq = sorted(obj) if isinstance(obj, (set, frozenset)) else obj
        return [_jsonable(v) for v in seq]
    if isinstance(obj, os.PathLike):
        return os.fspath(obj)
    if hasattr(obj, "item") and callable(obj.item):
        return obj.item()
    if obj is None or isinstance(obj, (str, int, float, bool)):
        return obj
    return str(obj)
