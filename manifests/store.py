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
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar, Iterable, Iterator, Mapping, Sequence

import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq

from isood.errors import BadInputError, ManifestError
from isood.runtime import TMP_PREFIX, atomic_write_bytes, one_line, sha256_bytes, sha256_file
from manifests.paths import check_relative, resolve_inside
from manifests.schema import KindSpec, check_schema, expect_kind, field_value, kind_spec

SCHEMA_NAME = "isood-manifest"
SCHEMA_VERSION = "1.0"
MANIFEST_FILE = "manifest.json"
PARKED_FILE = f"{TMP_PREFIX}manifest.json.prev"  # the previous manifest, set aside while a long job rewrites the directory
#: How every manifest table is written (also by the streaming writers of ``manifests.stream``).
PARQUET_OPTIONS = dict(compression="zstd", compression_level=3, use_dictionary=True, write_statistics=True)


def package_version() -> str:
    try:
        from importlib.metadata import version

        return version("isood")
    except Exception:  # running from a source tree that is not installed
        return "0+unknown"


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
    """A validated manifest directory."""

    root: Path
    meta: dict = field(repr=False)

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
            detail = "missing" if isinstance(e, FileNotFoundError) else one_line(e, 120)
            raise ManifestError(f"{self.root}: table {name!r} is unreadable ({detail}); rebuild the manifest or "
                                "restore its files (`isood verify` names them)") from None

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


def _validate(meta: Any, where: str) -> dict:
    if not isinstance(meta, dict):
        raise ManifestError(f"{where}: manifest.json is not a JSON object")
    schema = meta.get("schema")
    if not isinstance(schema, dict) or schema.get("name") != SCHEMA_NAME:
        raise ManifestError(f"{where}: not an isood manifest (schema name is not {SCHEMA_NAME!r})")
    version = str(schema.get("version", ""))
    major = version.split(".")[0]
    if major != SCHEMA_VERSION.split(".")[0]:
        raise ManifestError(
            f"{where}: manifest schema version {version!r} is not supported by isood {package_version()} "
            f"(reads {SCHEMA_VERSION.split('.')[0]}.x); upgrade isood to read it"
        )
    for key in ("kind", "dataset_version", "files", "tables"):
        if key not in meta:
            raise ManifestError(f"{where}: manifest.json lacks the required field {key!r}")
    try:
        for rec in meta["files"]:
            check_relative(rec.get("path", ""))
            if not isinstance(rec.get("sha256"), str):
                raise ManifestError(f"file entry {rec.get('path')!r} has no sha256")
        for name, rec in meta["tables"].items():
            check_relative(rec.get("path", ""))
    except (ManifestError, AttributeError, TypeError) as e:  # a path that may not be trusted, or a malformed entry
        detail = str(e) if isinstance(e, ManifestError) else "a files / tables entry is not an object with a path"
        raise ManifestError(f"{where}: {detail}; rebuild the manifest with the command that wrote it") from None
    return meta


def park(root: str | os.PathLike) -> None:
    """Set `manifest.json` aside (as PARKED_FILE) before a long job changes files: the directory reads as
    unfinished until the new manifest lands, and the old one still serves versioning (`unpark`, then write)."""
    m = Path(root) / MANIFEST_FILE
    if m.is_file():
        os.replace(m, Path(root) / PARKED_FILE)


def unpark(root: str | os.PathLike) -> None:
    """Put a parked manifest back (just before `write_manifest`, which reads it for the version bump)."""
    parked = Path(root) / PARKED_FILE
    if parked.is_file() and not (Path(root) / MANIFEST_FILE).exists():
        os.replace(parked, Path(root) / MANIFEST_FILE)
    parked.unlink(missing_ok=True)


def existing_kind(root: str | os.PathLike) -> str | None:
    """Kind of the manifest in `root` (finished or parked), or None when there is none or it is unreadable."""
    for name in (MANIFEST_FILE, PARKED_FILE):
        f = Path(root) / name
        if f.is_file():
            try:
                return json.loads(f.read_text()).get("kind")
            except (OSError, ValueError, AttributeError):
                return None
    return None


def check_output_kind(out: str | os.PathLike, kind: str, option: str = "--out") -> None:
    """Refuse to write a ``kind`` manifest over a directory holding a manifest of another kind (its files would
    be replaced); an unreadable or unfinished one is left to the writer."""
    other = existing_kind(out)
    if other and other != kind:
        raise BadInputError(f"{option} {out} holds a {other!r} manifest, not {kind!r}; pass another directory")


def read(root: str | os.PathLike, kind: str | Sequence[str] | None = None) -> Manifest:
    """Read and validate a manifest directory (schema version, required fields, safe paths; no file hashing).

    With ``kind`` (a kind or several allowed kinds), also refuse a manifest of another kind and one whose tables
    do not match the kind's registered schema (one line naming the table and column), and return the kind's
    typed view (e.g. ``isood.kinds.SplitsView``). Without ``kind`` a plain ``Manifest`` is returned.
    """
    root = Path(root)
    mpath = root / MANIFEST_FILE
    if not mpath.is_file():
        raise ManifestError(f"{root}: no {MANIFEST_FILE} (not a manifest directory, or an unfinished write)")
    try:
        meta = json.loads(mpath.read_text())
    except json.JSONDecodeError as e:
        raise ManifestError(f"{mpath}: invalid JSON ({e.msg} at line {e.lineno})") from None
    except (OSError, UnicodeDecodeError) as e:
        raise ManifestError(f"{mpath}: unreadable ({type(e).__name__}); restore or rebuild the manifest") from None
    m = Manifest(root=root, meta=_validate(meta, str(root)))
    if kind is None:
        return m
    expect_kind(m.kind, kind, str(root))
    check_schema(m.kind, {name: m.schema(name) for name in m.tables}, str(root))
    spec = kind_spec(m.kind)
    view = spec.view if spec is not None and spec.view is not None else ManifestView
    return view(root=root, meta=m.meta)


def _bump(version: str) -> str:
    major, minor, _patch = (int(x) for x in version.split("."))
    return f"{major}.{minor + 1}.0"


def content_hash(files: Iterable[dict]) -> str:
    """Hash of a manifest's content: its data files and their hashes (the dataset card is derived, so excluded)."""
    rows = sorted(f"{r['path']}\t{r['sha256']}" for r in files if r["path"] != "README.md")
    return sha256_bytes("\n".join(rows).encode())


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
    streamed = {name: pq.read_schema(resolve_inside(root, check_relative(rel)))
                for name, rel in (table_files or {}).items()}
    check_schema(kind, {**{name: _arrow_schema(t) for name, t in tables.items()}, **streamed}, f"writing {root}")
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
    atomic_write_bytes(root / MANIFEST_FILE, (json.dumps(meta, indent=2, sort_keys=False) + "\n").encode())
    return Manifest(root=root, meta=meta)


def _set_aside_old(root: Path) -> dict | None:
    """The previous manifest's metadata (None if absent or unreadable); its manifest.json is removed so the
    directory reads as unfinished until the new one lands."""
    if not (root / MANIFEST_FILE).is_file():
        return None
    try:
        old = read(root).meta
    except ManifestError:
        old = None
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
            try:
                resolve_inside(root, rec["path"]).unlink(missing_ok=True)
            except ManifestError:
                pass


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
