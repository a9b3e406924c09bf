"""Manifest directories: write (atomic, deterministic Parquet), read (validated), verify (every hash).

A manifest is a directory::

    manifest.json        schema, kind, dataset version, package version, command + config, inputs with
                         sha256, tables with row counts, every file with sha256 and size, changelog
    data/<table>.parquet one Parquet file per table
    ...                  any other registered files (lists/, README.md dataset card, feature shards)

`manifest.json` is written last, so a directory without it is an unfinished write.
"""

from __future__ import annotations

import datetime as _dt
import hashlib
import io
import json
import os
import sys
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable, Mapping

import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq

from isood.errors import ManifestError
from manifests.paths import check_relative, resolve_inside

SCHEMA_NAME = "isood-manifest"
SCHEMA_VERSION = "1.0"
MANIFEST_FILE = "manifest.json"
PARKED_FILE = ".~manifest.json.prev"  # the previous manifest, set aside while a long job rewrites the directory
_UMASK = os.umask(0)
os.umask(_UMASK)
_PARQUET_OPTIONS = dict(compression="zstd", compression_level=3, use_dictionary=True, write_statistics=True)


def package_version() -> str:
    try:
        from importlib.metadata import version

        return version("isood")
    except Exception:  # running from a source tree that is not installed
        return "0+unknown"


def sha256_bytes(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def sha256_file(path: str | os.PathLike, chunk: int = 1 << 20) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(chunk):
            h.update(block)
    return h.hexdigest()


def atomic_write_bytes(path: str | os.PathLike, data: bytes) -> None:
    """Write `data` to a temporary file beside `path`, fsync, then rename over `path`."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.chmod(tmp, 0o666 & ~_UMASK)  # mkstemp creates 0600; give the file the mode a plain open() would
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def parquet_bytes(table: pd.DataFrame | pa.Table) -> bytes:
    """Serialise a table to Parquet bytes; identical input gives identical bytes."""
    if isinstance(table, pd.DataFrame):
        table = pa.Table.from_pandas(table, preserve_index=False)
    buf = io.BytesIO()
    pq.write_table(table, buf, **_PARQUET_OPTIONS)
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
        if name not in self.meta.get("tables", {}):
            raise ManifestError(f"{self.root}: manifest has no table {name!r} (has: {', '.join(self.tables)})")
        return pq.read_table(self.path(self.meta["tables"][name]["path"]))

    def frame(self, name: str) -> pd.DataFrame:
        return self.table(name).to_pandas()


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
    for rec in meta["files"]:
        check_relative(rec.get("path", ""))
        if not isinstance(rec.get("sha256"), str):
            raise ManifestError(f"{where}: file entry {rec.get('path')!r} has no sha256")
    for name, rec in meta["tables"].items():
        check_relative(rec.get("path", ""))
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


def read(root: str | os.PathLike) -> Manifest:
    """Read and validate a manifest directory (schema, required fields, safe paths). Does not hash files."""
    root = Path(root)
    mpath = root / MANIFEST_FILE
    if not mpath.is_file():
        raise ManifestError(f"{root}: no {MANIFEST_FILE} (not a manifest directory, or an unfinished write)")
    try:
        meta = json.loads(mpath.read_text())
    except json.JSONDecodeError as e:
        raise ManifestError(f"{mpath}: invalid JSON ({e.msg} at line {e.lineno})") from None
    return Manifest(root=root, meta=_validate(meta, str(root)))


@dataclass
class VerifyReport:
    root: Path
    missing: list[str]
    extra: list[str]
    changed: list[str]

    @property
    def ok(self) -> bool:
        return not (self.missing or self.extra or self.changed)

    def lines(self) -> list[str]:
        return (
            [f"missing: {p}" for p in self.missing]
            + [f"extra: {p}" for p in self.extra]
            + [f"changed: {p}" for p in self.changed]
        )


def verify(root: str | os.PathLike) -> VerifyReport:
    """Recompute every file hash; name each missing, extra (present but unlisted) and changed file."""
    m = read(root)
    listed = {rec["path"]: rec for rec in m.meta["files"]}
    missing, changed = [], []
    for rel, rec in sorted(listed.items()):
        p = m.path(rel)
        if not p.is_file():
            missing.append(rel)
        elif p.stat().st_size != rec.get("bytes", p.stat().st_size) or sha256_file(p) != rec["sha256"]:
            changed.append(rel)
    present = {
        q.relative_to(m.root).as_posix()
        for q in m.root.rglob("*")
        if q.is_file() and q.name != MANIFEST_FILE
    }
    extra = sorted(p for p in present - set(listed) if not Path(p).name.startswith(".~"))
    return VerifyReport(root=m.root, missing=missing, extra=extra, changed=changed)


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
    summary: Mapping[str, Any] | None = None,
    note: str = "",
    argv: list[str] | None = None,
) -> Manifest:
    """Write a manifest directory.

    tables: name -> table, written as data/<name>.parquet. files: extra relative path -> content (lists, card).
    existing_files: relative paths already written into `root` by the caller (e.g. feature shards) to register.
    The dataset version starts at 1.0.0 and its minor part is bumped, with a changelog entry, when a rewrite of
    the same kind changes the content; an identical rewrite keeps version and changelog.
    """
    root = Path(root)
    root.mkdir(parents=True, exist_ok=True)
    old = None
    if (root / MANIFEST_FILE).is_file():
        try:
            old = read(root).meta
        except ManifestError:
            old = None
        (root / MANIFEST_FILE).unlink()  # the directory is "unfinished" until the new manifest.json lands

    records: dict[str, dict] = {}
    table_meta: dict[str, dict] = {}

    def put(rel: str, data: bytes) -> None:
        rel = check_relative(rel)
        atomic_write_bytes(resolve_inside(root, rel), data)
        records[rel] = {"path": rel, "sha256": sha256_bytes(data), "bytes": len(data)}

    for name, table in sorted(tables.items()):
        data = parquet_bytes(table)
        rel = f"data/{name}.parquet"
        put(rel, data)
        n = table.num_rows if isinstance(table, pa.Table) else len(table)
        cols = table.column_names if isinstance(table, pa.Table) else [str(c) for c in table.columns]
        table_meta[name] = {"path": rel, "rows": int(n), "columns": cols}
    for rel, content in sorted((files or {}).items()):
        put(rel, content.encode() if isinstance(content, str) else content)
    for rel in existing_files:
        rel = check_relative(rel)
        p = resolve_inside(root, rel)
        if not p.is_file():
            raise ManifestError(f"{root}: registered file {rel!r} does not exist")
        records[rel] = {"path": rel, "sha256": sha256_file(p), "bytes": p.stat().st_size}

    files_list = [records[k] for k in sorted(records)]
    chash = content_hash(files_list)
    today = _dt.date.today().isoformat()
    if old and old.get("kind") == kind and old.get("content_sha256") == chash:
        version, changelog = old["dataset_version"], old.get("changelog", [])
    elif old and old.get("kind") == kind:
        version = _bump(old["dataset_version"])
        changelog = old.get("changelog", []) + [{"version": version, "date": today, "note": note or "content changed"}]
    else:
        version = "1.0.0"
        changelog = [{"version": version, "date": today, "note": note or f"first {kind} manifest"}]
    if old:  # files the previous manifest owned and this one does not are stale: remove them
        for rec in old.get("files", []):
            if rec["path"] not in records:
                try:
                    resolve_inside(root, rec["path"]).unlink(missing_ok=True)
                except ManifestError:
                    pass

    meta = {
        "schema": {"name": SCHEMA_NAME, "version": SCHEMA_VERSION},
        "kind": kind,
        "dataset_version": version,
        "package": {"name": "isood", "version": package_version()},
        "created": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
        "command": {"argv": list(argv if argv is not None else sys.argv), "config": _jsonable(config)},
        "inputs": [_jsonable(i) for i in inputs],
        "tables": table_meta,
        "files": files_list,
        "content_sha256": chash,
        "summary": _jsonable(summary or {}),
        "changelog": changelog,
    }
    atomic_write_bytes(root / MANIFEST_FILE, (json.dumps(meta, indent=2, sort_keys=False) + "\n").encode())
    return Manifest(root=root, meta=meta)


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
