"""The content identity of files: the SHA-256 of their bytes, with a stat cache so that a rerun over unchanged
files reads none of them again. The one home of every resume and cache key that names files (feature shards,
the model-output cache of ``isood evaluate``, the identity of a weights folder).

A key built from a file's path and size misses a file overwritten in place by one of the same size, so isood keys
files by content:

* ``content_hashes(files, stats, cache=...)``: per file the hex SHA-256 of its bytes ('' when it is missing or
  cannot be read), taken from a ``StatCache`` when the file's stat (size, mtime_ns, ctime_ns, inode: ``FileStat``)
  is the one recorded with the hash, else read and hashed (and recorded). A file touched but with the same bytes
  is re-read once and keeps its hash (so whatever is keyed by it is reused); a file changed in place gets a new one.
* Racy files: a hash is recorded only for a file whose mtime and ctime were at least ``RACY_NS`` older than the
  moment its stat was taken (``stat_files``'s ``seen_ns``), so a write landing in the same timestamp tick as the
  read that hashed it cannot go unseen (git's "racy clean" rule); a younger file is simply hashed again next time.
* The stat cache holds machine-dependent numbers (mtime, inode), so it is run-time bookkeeping, never hashed
  content: a Parquet file named ``.~...`` beside the outputs (``isood.core.files.TMP_PREFIX``: ``isood verify``
  ignores it) or under ``isood.core.defaults.cache_dir()``. A missing, unreadable or unwritable cache costs a re-read,
  never a wrong answer.
* ``listing_digest(names, hashes)``: the identity of a list of files (``name<TAB>sha256`` lines);
  ``content_listing`` lists, hashes and digests in one call (``isood evaluate``'s data identities).
* ``folder_fingerprint(folder, include)``: the identity of a weights folder (CLIP ``local-dir:``, an SDXL pipeline
  folder): the digest of its selected files' relative names and content hashes, through a stat cache under
  ``cache_dir('file-stats')``, so a 7 GB pipeline is hashed once, not on every run.
"""

from __future__ import annotations

import hashlib
import io
import os
import time
from pathlib import Path
from typing import Callable, Iterable, NamedTuple, Sequence

import pyarrow as pa
import pyarrow.parquet as pq

from isood.core.defaults import cache_dir
from isood.core.files import TMP_PREFIX, atomic_write_bytes, sha256_file

__all__ = ["RACY_NS", "FileStat", "file_stat", "stat_files", "hash_file", "StatCache", "content_hashes",
           "listing_digest", "content_listing", "stat_cache_path", "file_sha256", "folder_fingerprint"]

#: A hash is recorded for a file only when its mtime and ctime are this much older than its stat (nanoseconds).
RACY_NS = 2_000_000_000


class FileStat(NamedTuple):
    """What tells a file's bytes unchanged without reading them: size, mtime and ctime (ns), inode."""

    size: int
    mtime_ns: int
    ctime_ns: int
    ino: int


def file_stat(path: str | os.PathLike) -> FileStat | None:
    """The ``FileStat`` of a regular file (symlinks followed), None when it is missing or not a regular file."""
    try:
        st = os.stat(path)
    except (OSError, ValueError):
        return None
    if not (st.st_mode & 0o170000) == 0o100000:  # S_ISREG
        return None
    return FileStat(int(st.st_size), int(st.st_mtime_ns), int(st.st_ctime_ns), int(st.st_ino))


def stat_files(files: Iterable[str | os.PathLike]) -> tuple[list[FileStat | None], int]:
    """``(file_stat of each file, seen_ns)``: ``seen_ns`` is the wall-clock time (ns) taken before the first stat,
    the moment the racy rule measures from."""
    seen_ns = time.time_ns()
    return [file_stat(f) for f in files], seen_ns


def hash_file(path: str | os.PathLike) -> str:
    """The hex SHA-256 of a file's bytes, '' when it cannot be read."""
    try:
        return sha256_file(path)
    except (OSError, ValueError):
        return ""


def _key(path: str | os.PathLike) -> str:
    return os.path.abspath(os.fspath(path))


class StatCache:
    """path -> (``FileStat``, sha256), loaded from and saved to the Parquet file ``path`` (None: in memory only).

    ``lookup`` answers only for an unchanged stat; ``record`` keeps only hashes of files that were not racy when
    their stat was taken; ``save`` writes atomically when something changed (an unwritable place is ignored: the
    cache only saves reads)."""

    def __init__(self, path: str | os.PathLike | None = None) -> None:
        self.path = Path(path) if path is not None else None
        self.entries: dict[str, tuple[FileStat, str]] = {}
        self.changed = False
        if self.path is not None and self.path.is_file():
            try:
                t = pq.read_table(self.path).to_pydict()
                for p, *st, sha in zip(t["path"], t["size"], t["mtime_ns"], t["ctime_ns"], t["ino"], t["sha256"]):
                    self.entries[os.fsdecode(p)] = (FileStat(*map(int, st)), str(sha))
            except Exception:  # unreadable bookkeeping: start afresh (costs a re-read)
                self.entries = {}

    def __len__(self) -> int:
        return len(self.entries)

    def lookup(self, path: str | os.PathLike, stat: FileStat | None) -> str | None:
        """The recorded hash of ``path`` when its stat is ``stat``, else None."""
        if stat is None:
            return None
        entry = self.entries.get(_key(path))
        return entry[1] if entry is not None and entry[0] == stat else None

    def record(self, path: str | os.PathLike, stat: FileStat | None, sha256: str, seen_ns: int) -> None:
        """Remember ``sha256`` for ``path`` at ``stat`` (taken at ``seen_ns``), unless it is unknown or racy."""
        if stat is None or not sha256:
            return
        key = _key(path)
        if max(stat.mtime_ns, stat.ctime_ns) >= seen_ns - RACY_NS:
            if key in self.entries:  # a racy file's old entry must not outlive it
                del self.entries[key]
                self.changed = True
            return
        if self.entries.get(key) != (stat, sha256):
            self.entries[key] = (stat, sha256)
            self.changed = True

    def keep_only(self, paths: Iterable[str | os.PathLike]) -> None:
        """Forget the entries of files not in ``paths`` (files that left the list this cache serves)."""
        keep = {_key(p) for p in paths}
        gone = [k for k in self.entries if k not in keep]
        for k in gone:
            del self.entries[k]
        self.changed |= bool(gone)

    def save(self) -> None:
        """Write the cache (atomically) if it changed; an unwritable place only costs a re-read next time."""
        if self.path is None or not self.changed:
            return
        items = sorted(self.entries.items())
        table = pa.table({
            "path": pa.array([os.fsencode(p) for p, _ in items], pa.binary()),
            **{f: pa.array([getattr(st, f) for _, (st, _) in items], pa.int64()) for f in FileStat._fields},
            "sha256": pa.array([sha for _, (_, sha) in items], pa.string()),
        })
        buf = io.BytesIO()
        pq.write_table(table, buf)
        try:
            atomic_write_bytes(self.path, buf.getvalue())
        except OSError:
            return
        self.changed = False


def content_hashes(files: Sequence[str | os.PathLike], stats: Sequence[FileStat | None] | None = None, *,
                   cache: StatCache | None = None, seen_ns: int | None = None,
                   skip: Sequence[bool] | None = None) -> list[str]:
    """The hex SHA-256 of each file's bytes ('' when missing, unreadable, or ``skip``-ped: files a caller never
    reads), from ``cache`` where the stat is unchanged, else read (and recorded in ``cache``, not saved).
    ``stats`` / ``seen_ns``: as ``stat_files`` returns them (taken here when not given)."""
    if stats is None:
        stats, seen_ns = stat_files(files)
    seen_ns = time.time_ns() if seen_ns is None else int(seen_ns)
    out = []
    for j, (f, st) in enumerate(zip(files, stats)):
        if st is None or (skip is not None and skip[j]):
            out.append("")
            continue
        sha = cache.lookup(f, st) if cache is not None else None
        if sha is None:
            sha = hash_file(f)
            if cache is not None:
                cache.record(f, st, sha, seen_ns)
        out.append(sha)
    return out


def listing_digest(names: Sequence[str], hashes: Sequence[str]) -> str:
    """The identity of a list of files: hex SHA-256 of the lines ``name<TAB>sha256`` in order."""
    h = hashlib.sha256()
    for name, sha in zip(names, hashes):
        h.update(f"{name}\t{sha}\n".encode("utf-8", "surrogateescape"))
    return h.hexdigest()


def stat_cache_path(folder: str | os.PathLike, files: Sequence[str | os.PathLike]) -> Path:
    """Where the stat cache of a list of files lives in ``folder``: ``.~file-stats-<hash of their paths>.parquet``."""
    h = hashlib.sha256("\n".join(_key(f) for f in files).encode("utf-8", "surrogateescape"))
    return Path(folder) / f"{TMP_PREFIX}file-stats-{h.hexdigest()[:24]}.parquet"


def _hashes_through(files: Sequence[str | os.PathLike], cache_path: Path | None) -> list[str]:
    """``content_hashes`` of ``files`` through the stat cache saved at ``cache_path`` (None: none, every file
    read); the cache keeps only these files."""
    cache = StatCache(cache_path)
    stats, seen_ns = stat_files(files)
    hashes = content_hashes(files, stats, cache=cache, seen_ns=seen_ns)
    cache.keep_only(files)
    cache.save()
    return hashes


def content_listing(files: Sequence[str | os.PathLike], names: Sequence[str] | None = None, *,
                    cache_folder: str | os.PathLike | None = None) -> str:
    """``listing_digest`` of ``files`` (named by ``names``, default their paths) and their content hashes, through
    the stat cache of this list in ``cache_folder`` (``stat_cache_path``; None: no cache, every file read)."""
    hashes = _hashes_through(files, stat_cache_path(cache_folder, files) if cache_folder is not None else None)
    return listing_digest([str(n) for n in (names if names is not None else files)], hashes)


def file_sha256(path: str | os.PathLike, *, cache_folder: str | os.PathLike | None = None) -> str:
    """The content hash of one (weights) file, through a stat cache (default under ``cache_dir('file-stats')``)."""
    where = cache_folder if cache_folder is not None else cache_dir("file-stats")
    return _hashes_through([path], stat_cache_path(where, [path]))[0]


def folder_fingerprint(folder: str | os.PathLike, include: Callable[[Path], bool], *, recursive: bool = False,
                       cache_folder: str | os.PathLike | None = None) -> str:
    """The content identity of a weights folder: hex SHA-256 over ``<relative name>\\0<sha256>\\n`` of its files
    that ``include`` selects, in name order (hidden files and folders skipped; ``recursive``: subfolders too,
    names relative to ``folder``). Hashes come through a stat cache (default under ``cache_dir('file-stats')``),
    so an unchanged folder is not read again; a copy elsewhere has the same fingerprint."""
    folder = Path(folder)
    found = folder.rglob("*") if recursive else folder.iterdir()
    files = sorted((p for p in found if p.is_file() and include(p)
                    and not any(part.startswith(".") for part in p.relative_to(folder).parts)),
                   key=lambda p: p.relative_to(folder).as_posix())
    where = cache_folder if cache_folder is not None else cache_dir("file-stats")
    hashes = _hashes_through(files, stat_cache_path(where, [folder]))
    h = hashlib.sha256()
    for p, sha in zip(files, hashes):
        h.update(p.relative_to(folder).as_posix().encode("utf-8", "surrogateescape") + b"\0" + sha.encode() + b"\n")
    return h.hexdigest()
