"""Files: atomic writes, hashing, linking, and the one lock of an output folder.

Every isood write replaces a file by rename (``atomic_write_bytes``), never in place, so a reader never sees half a
file and a hard link of the previous version (``manifests.writing``) is never changed. An ``OSError`` that names
no file (a full disk) is re-raised naming it (``naming``). Bookkeeping files start with ``TMP_PREFIX``
(``isood verify`` ignores them). ``file_lock`` / ``output_lock`` hold the one exclusive lock of an output folder,
``lock_path``: beside it, so a folder swapped in by rename stays locked.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import shutil
import tempfile
from pathlib import Path
from typing import Iterator

from isood.core.errors import BadInputError, IsoodError

__all__ = [
    "TMP_PREFIX", "naming", "read_file", "atomic_write_bytes", "remove_temporaries", "sha256_bytes", "sha256_file",
    "link_or_copy", "LOCK_SUFFIX", "OutputLocked", "lock_path", "file_lock", "output_lock",
]


#: Prefix of every temporary or bookkeeping file isood leaves beside its outputs (``isood verify`` ignores them).
TMP_PREFIX = ".~"


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


_UMASK = _umask()


@contextlib.contextmanager
def naming(path: str | os.PathLike) -> Iterator[None]:
    """Re-raise an ``OSError`` that names no file (a write or flush on a full disk, from Python or from a
    library such as pyarrow) as the same error naming ``path``, so the one-line message says where."""
    try:
        yield
    except OSError as e:
        if e.filename is None and e.errno is not None:
            raise type(e)(e.errno, e.strerror, str(path)) from None
        if e.filename is None:  # pyarrow's IOError: no errno, the reason in its text
            raise OSError(_errno_of(str(e)), str(e), str(path)) from None
        raise


def _errno_of(text: str) -> int | None:
    import errno

    for code, words in ((errno.ENOSPC, "No space left"), (errno.EROFS, "Read-only file system"),
                        (errno.EDQUOT, "Disk quota exceeded"), (errno.EACCES, "Permission denied")):
        if words in text:
            return code
    return None


def read_file(path: str | os.PathLike, *, what: str = "file", hint: str = "check the path") -> bytes:
    """The bytes of ``path``; a missing or unreadable file is a one-line ``BadInputError`` naming ``what``."""
    try:
        return Path(path).read_bytes()
    except FileNotFoundError:
        raise BadInputError(f"{what} not found: {path}; {hint}") from None
    except (IsADirectoryError, PermissionError) as e:
        raise BadInputError(f"{what} {path} cannot be read ({e.strerror}); {hint}") from None


def atomic_write_bytes(path: str | os.PathLike, data: bytes) -> None:
    """Write ``data`` to ``path`` atomically: a temporary ``.~<name>.<random>.tmp`` beside it, fsync, rename.
    A kill leaves either the old file or the new one (and at most a temporary that ``remove_temporaries``
    deletes). The file gets the mode a plain ``open()`` would give it."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f"{TMP_PREFIX}{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.chmod(tmp, 0o666 & ~_UMASK)  # mkstemp creates 0600
        os.replace(tmp, path)
    except OSError as e:
        Path(tmp).unlink(missing_ok=True)
        if e.filename is None and e.errno is not None:  # a write / fsync error (a full disk) names no file: name it
            raise type(e)(e.errno, e.strerror, str(path)) from None
        raise
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def remove_temporaries(folder: str | os.PathLike, recursive: bool = False) -> int:
    """Delete the ``.~*.tmp`` files a killed ``atomic_write_bytes`` left in ``folder``; returns how many."""
    folder = Path(folder)
    if not folder.is_dir():
        return 0
    found = folder.rglob(f"{TMP_PREFIX}*.tmp") if recursive else folder.glob(f"{TMP_PREFIX}*.tmp")
    n = 0
    for p in found:
        p.unlink(missing_ok=True)
        n += 1
    return n


def sha256_bytes(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def sha256_file(path: str | os.PathLike, chunk: int = 1 << 20) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(chunk):
            h.update(block)
    return h.hexdigest()


def link_or_copy(src: str | os.PathLike, dst: str | os.PathLike) -> None:
    """Put ``src`` at ``dst`` atomically: a hard link where possible (same file system, no copy), else a copy."""
    src, dst = Path(src), Path(dst)
    dst.parent.mkdir(parents=True, exist_ok=True)
    tmp = dst.with_name(f"{TMP_PREFIX}{dst.name}.{os.getpid()}.tmp")
    tmp.unlink(missing_ok=True)
    try:
        try:
            os.link(src, tmp)
        except OSError:
            shutil.copyfile(src, tmp)
        os.replace(tmp, dst)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


LOCK_SUFFIX = ".isood.lock"


class OutputLocked(IsoodError):
    """Another process is writing the same output folder."""


def lock_path(out: str | os.PathLike) -> Path:
    """The one lock file of an output folder, beside it: ``<parent>/.~<name>.isood.lock`` (every writer of
    ``out``, manifest or not, locks this file; it lies outside ``out``, so a folder swapped in by rename keeps
    being locked)."""
    out = Path(os.path.abspath(out))
    return out.with_name(f"{TMP_PREFIX}{out.name}{LOCK_SUFFIX}")


@contextlib.contextmanager
def file_lock(path: str | os.PathLike, *, what: str, option: str = "--out",
              target: str | os.PathLike | None = None) -> Iterator[Path]:
    """Hold an exclusive lock (``fcntl.flock``) on the lock file ``path`` while a command writes ``what``; a
    second process asking for it gets a one-line ``OutputLocked`` at once (naming the holder's pid). The kernel
    drops the lock when the holder dies (even by ``kill -9``), so a stale lock file never blocks a rerun. On
    release the lock file is removed (while still held: a process that opened it meanwhile sees it replaced and
    takes the new one). An ``OSError`` taking it (a read-only disk) names ``target`` (the output) when given."""
    path = Path(path)
    try:
        fd = _take_lock(path, what, option)
    except OSError as e:
        if target is None:
            raise
        raise type(e)(e.errno, e.strerror, str(target)) from None
    try:
        yield path
    finally:
        path.unlink(missing_ok=True)
        os.close(fd)


@contextlib.contextmanager
def output_lock(folder: str | os.PathLike, option: str = "--out") -> Iterator[Path]:
    """Hold the lock of ``folder`` (``lock_path``) while a command writes files there that are not a manifest (an
    export, a publish receipt); manifests are written through ``manifests.writing``, which takes the same lock.
    The folders this call created are removed again when nothing was written into them: a command refused
    before writing leaves nothing behind."""
    folder = Path(folder)
    if folder.exists() and not folder.is_dir():
        raise BadInputError(f"{option} {folder} is a file; pass a directory")
    created = [d for d in (folder, *folder.parents) if not d.exists()]  # deepest first
    try:
        folder.parent.mkdir(parents=True, exist_ok=True)
        with file_lock(lock_path(folder), what=f"{option} {folder}", option=option, target=folder):
            folder.mkdir(exist_ok=True)
            yield folder
    finally:
        for d in created:
            try:
                d.rmdir()
            except OSError:  # something was written there (or another process uses it): keep it
                break


def _take_lock(path: Path, what: str, option: str) -> int:
    """An open descriptor of ``path`` holding its exclusive lock (the file at ``path`` when the lock was taken)."""
    import fcntl

    while True:
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.pread(fd, 64, 0).decode(errors="replace").strip() or "?"
            os.close(fd)
            raise OutputLocked(f"{what} is being written by another isood process (pid {holder}, lock "
                               f"{path.name}); wait for it to finish or pass another {option}") from None
        except BaseException:
            os.close(fd)
            raise
        try:
            current = os.stat(path)
        except FileNotFoundError:
            current = None
        mine = os.fstat(fd)
        if current is not None and (current.st_ino, current.st_dev) == (mine.st_ino, mine.st_dev):
            try:
                os.ftruncate(fd, 0)
                os.pwrite(fd, str(os.getpid()).encode(), 0)
            except OSError:  # e.g. a full disk: the pid is only for the message; the command's own writes will say
                pass
            return fd
        os.close(fd)  # the previous holder removed this file as we opened it: lock the new one
