"""``manifest.json``: its name, schema version and the structural check every reader applies.

``load_meta(folder)`` reads and checks a manifest's metadata (no file is hashed here): the schema name and major
version, and every field's type: ``kind``; ``dataset_version`` (``MAJOR.MINOR.PATCH``); ``changelog`` (a list of
``{version, date, note}``); ``files`` (relative paths inside the folder, a 64-hex sha256 and a byte count each,
no path twice); ``tables`` (each a relative path that ``files`` lists, held by no other table, with a row count
and its columns); ``content_sha256`` (64 hex); ``inputs`` (a list of objects). A manifest that fails is refused
with one line naming the field, by every reader, by ``isood verify`` and by a writer about to replace it.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

from isood.core.errors import ManifestError
from manifests.paths import check_relative

__all__ = ["SCHEMA_NAME", "SCHEMA_VERSION", "MANIFEST_FILE", "CARD_FILE", "CONFIGS_DIR", "VERSION_RE", "load_meta", "validate_meta",
           "package_version"]

SCHEMA_NAME = "isood-manifest"
SCHEMA_VERSION = "1.0"
MANIFEST_FILE = "manifest.json"
#: The dataset card, and the per-config Parquet files derived from the tables (``manifests.card``): both are
#: functions of the content, so they are left out of its hash (``manifests.verify.content_hash``).
CARD_FILE = "README.md"
CONFIGS_DIR = "data/configs"
VERSION_RE = re.compile(r"^(0|[1-9]\d*)\.(0|[1-9]\d*)\.(0|[1-9]\d*)$")
_SHA_RE = re.compile(r"^[0-9a-f]{64}$")


def package_version() -> str:
    try:
        from importlib.metadata import version

        return version("isood")
    except Exception:  # running from a source tree that is not installed
        return "0+unknown"


def _fail(where: str, detail: str) -> ManifestError:
    return ManifestError(f"{where}: manifest.json {detail}; rebuild the manifest with the command that wrote it "
                         "(or restore it)")


def _check_schema_header(meta: dict, where: str) -> None:
    schema = meta.get("schema")
    if not isinstance(schema, dict) or schema.get("name") != SCHEMA_NAME:
        raise ManifestError(f"{where}: not an isood manifest (schema name is not {SCHEMA_NAME!r})")
    version = str(schema.get("version", ""))
    if version.split(".")[0] != SCHEMA_VERSION.split(".")[0]:
        raise ManifestError(
            f"{where}: manifest schema version {version!r} is not supported by isood {package_version()} "
            f"(reads {SCHEMA_VERSION.split('.')[0]}.x); upgrade isood to read it")


def _check_version(meta: dict, where: str) -> None:
    version = meta["dataset_version"]
    if not isinstance(version, str) or not VERSION_RE.match(version):
        raise _fail(where, f"has dataset_version {version!r}, not MAJOR.MINOR.PATCH (e.g. '1.0.0')")
    changelog = meta.get("changelog", [])
    if not isinstance(changelog, list) or not all(
            isinstance(e, dict) and isinstance(e.get("version"), str) and VERSION_RE.match(e["version"])
            for e in changelog):
        raise _fail(where, "has a changelog that is not a list of {version, date, note} entries")


def _check_files(meta: dict, where: str) -> set[str]:
    files = meta["files"]
    if not isinstance(files, list):
        raise _fail(where, "has 'files' that is not a list")
    seen: set[str] = set()
    for rec in files:
        if not isinstance(rec, dict):
            raise _fail(where, "has a files entry that is not an object")
        try:
            rel = check_relative(rec.get("path", ""))
        except ManifestError as e:
            raise ManifestError(f"{where}: {e}; rebuild the manifest with the command that wrote it") from None
        if rel in seen:
            raise _fail(where, f"lists {rel!r} twice")
        seen.add(rel)
        if not isinstance(rec.get("sha256"), str) or not _SHA_RE.match(rec["sha256"]):
            raise _fail(where, f"has no valid sha256 for {rel!r}")
        size = rec.get("bytes")
        if size is not None and (isinstance(size, bool) or not isinstance(size, int) or size < 0):
            raise _fail(where, f"has an invalid byte count for {rel!r}")
    return seen


def _check_tables(meta: dict, where: str, files: set[str]) -> None:
    tables = meta["tables"]
    if not isinstance(tables, dict):
        raise _fail(where, "has 'tables' that is not an object")
    owners: dict[str, str] = {}
    for name, rec in tables.items():
        if not isinstance(rec, dict):
            raise _fail(where, f"has table {name!r} that is not an object with a path")
        try:
            rel = check_relative(rec.get("path", ""))
        except ManifestError as e:
            raise ManifestError(f"{where}: table {name!r}: {e}; rebuild the manifest") from None
        if rel not in files:
            raise _fail(where, f"points table {name!r} at {rel!r}, which its files do not list")
        if rel in owners:
            raise _fail(where, f"points tables {owners[rel]!r} and {name!r} at the same file {rel!r}")
        owners[rel] = name
        rows = rec.get("rows")
        if rows is not None and (isinstance(rows, bool) or not isinstance(rows, int) or rows < 0):
            raise _fail(where, f"has an invalid row count for table {name!r}")


def validate_meta(meta: Any, where: str) -> dict:
    """``meta`` when it is a well-formed manifest.json (module docstring), else a one-line ``ManifestError``."""
    if not isinstance(meta, dict):
        raise ManifestError(f"{where}: manifest.json is not a JSON object")
    _check_schema_header(meta, where)
    for key in ("kind", "dataset_version", "files", "tables"):
        if key not in meta:
            raise ManifestError(f"{where}: manifest.json lacks the required field {key!r}")
    if not isinstance(meta["kind"], str) or not meta["kind"]:
        raise _fail(where, "has no kind")
    _check_version(meta, where)
    _check_tables(meta, where, _check_files(meta, where))
    chash = meta.get("content_sha256")
    if chash is not None and (not isinstance(chash, str) or not _SHA_RE.match(chash)):
        raise _fail(where, "has an invalid content_sha256")
    for key, typ in (("inputs", list), ("summary", dict), ("command", dict)):
        if key in meta and not isinstance(meta[key], typ):
            raise _fail(where, f"has {key!r} that is not a {typ.__name__}")
    return meta


def load_meta(folder: str | Path) -> dict:
    """The checked ``manifest.json`` of ``folder`` (one-line ``ManifestError`` when absent, unreadable or
    malformed)."""
    root = Path(folder)
    mpath = root / MANIFEST_FILE
    if not mpath.is_file():
        raise ManifestError(f"{root}: no {MANIFEST_FILE} (not a manifest directory, or an unfinished write)")
    try:
        meta = json.loads(mpath.read_text(encoding="utf-8"))
    except json.JSONDecodeError as e:
        raise ManifestError(f"{mpath}: invalid JSON ({e.msg} at line {e.lineno})") from None
    except RecursionError:
        raise ManifestError(f"{root}: not an isood manifest ({MANIFEST_FILE} is nested too deeply to be one); pass "
                            "a manifest folder written by isood") from None
    except (OSError, UnicodeDecodeError) as e:
        raise ManifestError(f"{mpath}: unreadable ({type(e).__name__}); restore or rebuild the manifest") from None
    return validate_meta(meta, str(root))
