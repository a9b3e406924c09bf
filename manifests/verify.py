"""Verification: every field of ``manifest.json`` against the files it describes.

``verify(root)`` names, one line each:

* ``missing`` / ``extra`` / ``changed`` files (every sha256 recomputed; isood's ``.~`` bookkeeping is ignored);
* ``schema`` problems: a table whose Parquet file does not hold the rows and columns manifest.json records for it
  (so a table pointed at another table's file is caught), a required table of the kind absent, path columns
  holding absolute paths or ``..`` (``TableSpec.paths``);
* ``field`` problems: an unknown kind, a ``content_sha256`` that is not the hash of the listed files.

A ``manifest.json`` that cannot be trusted at all (``manifests.meta``: unsafe paths, a malformed version or
changelog, a future schema, wrong types) is a one-line ``ManifestError`` instead, as for every reader.

Columns are compared with what the manifest itself recorded, not with today's schema of the kind: verify is about
integrity; whether the tables hold the kind's columns is the typed read's check (``manifests.read(kind=...)``).

Modes: ``full`` hashes every file. ``fast`` (what stages use on their inputs by default) hashes every table and
every file up to ``FAST_HASH_BYTES``; a larger file (a feature shard, an image) is hashed unless its size,
mtime_ns, ctime_ns, device and inode match the last time this machine hashed it and found it right (a stat cache
under ``isood.core.defaults.cache_dir('verified')``), so a flipped byte is found (an edit in place changes the ctime,
which no tool can set back), while an unchanged 24 GB feature set is not re-read at every use. A ``full`` check
updates the same cache: a file it finds changed is never trusted by a later ``fast`` check.

A manifest being rewritten meanwhile (``manifests.writing`` swaps a new version in) is not corruption: ``verify``
checks the version marker (``manifests.ownership``) before and after, and checks again when a new version
arrived; if versions keep changing it reports ``rewriting`` ("being rewritten"), not a changed file.
"""

from __future__ import annotations

import hashlib
import json
import os
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterator

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from isood.core.defaults import VERIFY_MODES, cache_dir
from isood.core.errors import BadInputError, ManifestError
from isood.core.errors import one_line
from isood.core.files import TMP_PREFIX, atomic_write_bytes, sha256_bytes, sha256_file
from isood.core.inputs import BAD_PATH_PATTERN as INPUT_BAD_PATH
from manifests.meta import CARD_FILE, CONFIGS_DIR, MANIFEST_FILE, load_meta
from manifests.ownership import folder_identity, is_current, version_identity, version_of
from manifests.paths import resolve_inside
from manifests.schema import kind_spec

__all__ = ["VerifyReport", "verify", "VERIFY_MODES", "FAST_HASH_BYTES", "content_hash", "check_verify_mode",
           "bad_path_values", "BAD_PATH_PATTERN"]

#: In ``fast`` mode files up to this size are always hashed; larger ones when their stat changed.
FAST_HASH_BYTES = 8 << 20
#: A stored path that is absolute (POSIX or a drive letter) or has a ``..`` component.
BAD_PATH_PATTERN = INPUT_BAD_PATH  # absolute, '..' or a control character (isood.core.inputs: one policy)


def check_verify_mode(mode: str) -> str:
    if mode not in VERIFY_MODES:
        raise BadInputError(f"--verify {mode!r} is unknown; pass one of {', '.join(VERIFY_MODES)}")
    return mode


def content_hash(files) -> str:
    """Hash of a manifest's content: its data files and their hashes. The dataset card and the per-config
    Parquet files (``CARD_FILE``, ``CONFIGS_DIR``) are derived from the tables, so left out: writing or
    rewriting a card never changes the content (nor the dataset version)."""
    rows = sorted(f"{r['path']}\t{r['sha256']}" for r in files if not _derived(r["path"]))
    return sha256_bytes("\n".join(rows).encode())


def _derived(rel: str) -> bool:
    return rel == CARD_FILE or rel.startswith(CONFIGS_DIR + "/")


@dataclass
class VerifyReport:
    """What ``verify`` found: files ``missing`` / ``extra`` / ``changed``; ``invalid`` tables (a required table
    absent, a table file that does not hold what manifest.json records, bad stored paths); ``fields`` of
    manifest.json that do not match its files (content_sha256, kind)."""

    root: Path
    missing: list[str]
    extra: list[str]
    changed: list[str]
    invalid: list[str] = field(default_factory=list)
    fields: list[str] = field(default_factory=list)
    #: The version identity checked (``manifests.ownership``; None for a manifest.json without the writer's record).
    version: str | None = None
    #: A writer kept swapping new versions in while this was checked: nothing is known to be wrong.
    rewriting: bool = False
    meta: dict | None = field(default=None, repr=False)

    @property
    def ok(self) -> bool:
        return not (self.missing or self.extra or self.changed or self.invalid or self.fields or self.rewriting)

    def lines(self) -> list[str]:
        if self.rewriting:
            return [f"rewriting: {self.root} is being rewritten (a new version arrived while it was checked); "
                    "verify it again when the writer has finished"]
        return (
            [f"missing: {p}" for p in self.missing]
            + [f"extra: {p}" for p in self.extra]
            + [f"changed: {p}" for p in self.changed]
            + [f"schema: {p}" for p in self.invalid]
            + [f"field: {p}" for p in self.fields]
        )


# ------------------------------------------------------------------------------------------------ hashing
class _StatCache:
    """rel -> [size, mtime_ns, ctime_ns, device, inode, sha256] of the files of one manifest folder found right
    before."""

    def __init__(self, root: Path) -> None:
        key = hashlib.sha256(os.fsencode(os.path.realpath(root))).hexdigest()[:32]
        self.path = cache_dir("verified", f"{key}.json")
        try:
            self.data = json.loads(self.path.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            self.data = {}
        self.dirty = False

    @staticmethod
    def stamp(st: os.stat_result) -> list[int]:
        return [int(st.st_size), int(st.st_mtime_ns), int(st.st_ctime_ns), int(st.st_dev), int(st.st_ino)]

    def known(self, rel: str, st: os.stat_result, sha: str) -> bool:
        return self.data.get(rel) == [*self.stamp(st), sha]

    def remember(self, rel: str, st: os.stat_result, sha: str) -> None:
        self.data[rel] = [*self.stamp(st), sha]
        self.dirty = True

    def forget(self, rel: str) -> None:
        if self.data.pop(rel, None) is not None:
            self.dirty = True

    def save(self) -> None:
        if self.dirty:
            try:
                atomic_write_bytes(self.path, json.dumps(self.data).encode())
            except OSError:  # a read-only cache folder only costs speed
                pass


def _changed(root: Path, meta: dict, mode: str) -> tuple[list[str], list[str]]:
    tables = {rec["path"] for rec in meta["tables"].values()}
    cache = _StatCache(root)
    missing, changed = [], []
    for rec in sorted(meta["files"], key=lambda r: r["path"]):
        rel = rec["path"]
        try:
            p = resolve_inside(root, rel)
            st = p.stat()
        except (ManifestError, OSError):
            missing.append(rel)
            continue
        if not p.is_file():
            missing.append(rel)
            continue
        if st.st_size != rec.get("bytes", st.st_size):
            changed.append(rel)
            cache.forget(rel)
            continue
        always = mode == "full" or rel in tables or st.st_size <= FAST_HASH_BYTES
        if not always and cache.known(rel, st, rec["sha256"]):
            continue
        if sha256_file(p) != rec["sha256"]:
            changed.append(rel)
            cache.forget(rel)  # a full check's finding is never forgotten by a later fast one
        elif not always or st.st_size > FAST_HASH_BYTES:
            cache.remember(rel, st, rec["sha256"])
    cache.save()
    return missing, changed


def _extra(root: Path, listed: set[str]) -> list[str]:
    """Files present but not listed: isood's ``.~`` bookkeeping and manifest.json files are not content (a
    nested manifest, e.g. a splits manifest's ``features-test/``, lists and hashes its own files)."""
    present = []
    for folder, dirs, names in os.walk(root):
        rel_folder = Path(folder).relative_to(root).as_posix()
        dirs[:] = [d for d in dirs if not d.startswith(TMP_PREFIX)]
        for n in names:
            if not n.startswith(TMP_PREFIX) and n != MANIFEST_FILE:
                present.append(n if rel_folder == "." else f"{rel_folder}/{n}")
    return sorted(set(present) - listed)


# ------------------------------------------------------------------------------------------------ fields
def bad_path_values(column: pa.ChunkedArray | pa.Array, limit: int = 3) -> list[str]:
    """The first ``limit`` values of a string column that are absolute, have a ``..`` component or a control
    character (shown escaped)."""
    if len(column) == 0:
        return []
    mask = pc.fill_null(pc.match_substring_regex(column, BAD_PATH_PATTERN), False)
    if not pc.any(mask).as_py():
        return []
    return [repr(str(v))[1:-1] for v in pc.filter(column, mask).slice(0, limit).to_pylist()]


def _row_groups(path: Path, columns: list[str]) -> Iterator[pa.Table]:
    pf = pq.ParquetFile(path)
    for i in range(pf.num_row_groups):
        yield pf.read_row_group(i, columns=columns)


def _table_problems(root: Path, meta: dict, listed_bad: set[str]) -> list[str]:
    spec = kind_spec(meta["kind"])
    problems = []
    for name, rec in sorted(meta["tables"].items()):
        if rec["path"] in listed_bad:
            continue  # already named as missing / changed
        path = resolve_inside(root, rec["path"])
        try:
            footer = pq.read_metadata(path)
            schema = pq.read_schema(path)
        except (OSError, pa.ArrowException) as e:
            problems.append(f"table {name!r} ({rec['path']}) is not a readable Parquet file ({one_line(e, 80)})")
            continue
        if "rows" in rec and int(rec["rows"]) != footer.num_rows:
            problems.append(f"table {name!r} records {rec['rows']} rows, its file {rec['path']} has {footer.num_rows}")
        if "columns" in rec and list(rec["columns"]) != list(schema.names):
            problems.append(f"table {name!r} records columns {rec['columns']}, its file {rec['path']} has "
                            f"{list(schema.names)}")
        table_spec = spec.tables.get(name) if spec is not None else None
        for column in (table_spec.paths if table_spec is not None else ()):
            if column in schema.names:
                bad = [v for group in _row_groups(path, [column]) for v in bad_path_values(group[column])][:3]
                if bad:
                    problems.append(f"table {name!r} column {column!r} holds absolute, '..' or control-character "
                                    f"paths ({', '.join(bad)}); stored paths must be relative to the manifest's root")
    if spec is not None:
        problems += [f"{meta['kind']} manifest lists no table {n!r}; rebuild it with {spec.writer}"
                     for n, t in spec.tables.items() if not t.optional and n not in meta["tables"]]
    return problems


def verify(root: str | os.PathLike, *, mode: str = "full") -> VerifyReport:
    """Check every field of ``root``'s manifest.json against its files (module docstring). A folder without a
    manifest.json, or one whose manifest.json cannot be trusted (``manifests.meta``: unsafe paths, a malformed
    version or changelog, a future schema), is an error (``ManifestError``); everything else is a line of the
    report."""
    root = Path(root)
    check_verify_mode(mode)
    report = None
    for attempt in range(_TRIES):
        meta = load_meta(root)
        before = folder_identity(root)
        report = _verify_once(root, meta, mode)
        if _still(root, meta, before):
            return report
        time.sleep(0.05 * (attempt + 1))  # a writer swapped a new version in meanwhile: check that one
    assert report is not None
    return VerifyReport(root=root, missing=[], extra=[], changed=[], version=report.version, rewriting=True)


_TRIES = 5


def _still(root: Path, meta: dict, before: tuple[int, int] | None) -> bool:
    """Whether ``root`` still holds the version ``meta`` describes (``is_current``; without a version marker,
    also manifest.json unchanged)."""
    identity = version_identity(root, meta, before)
    if identity[0] == "version":
        return True  # its marker is there now, after the checks: they saw that version
    try:
        return is_current(root, identity) and load_meta(root) == meta
    except ManifestError:
        return False


def _verify_once(root: Path, meta: dict, mode: str) -> VerifyReport:
    missing, changed = _changed(root, meta, mode)
    extra = _extra(root, {rec["path"] for rec in meta["files"]})
    fields = []
    if kind_spec(meta["kind"]) is None:
        fields.append(f"kind {meta['kind']!r} is unknown to isood; rebuild the manifest with an isood command")
    stored = meta.get("content_sha256")
    if stored != content_hash(meta["files"]):
        fields.append("content_sha256 is not the hash of the listed files; rebuild the manifest (or restore its "
                      "manifest.json)")
    invalid = _table_problems(root, meta, set(missing) | set(changed))
    return VerifyReport(root=root, missing=missing, extra=extra, changed=changed, invalid=invalid, fields=fields,
                        version=version_of(meta), meta=meta)
