"""The swap's two system-level steps: exchanging two folders atomically, and discarding the replaced version.

``discard_version`` removes what the old version's manifest lists and its writer recorded
(``manifests.ownership``), never through a link; a listed file edited since isood wrote it, and anything else
found there, are kept in a visible ``<name>.isood-old-<time>`` folder beside the output.
"""

from __future__ import annotations

import contextlib
import ctypes
import ctypes.util
import datetime as _dt
import errno
import os
from dataclasses import dataclass, field
from pathlib import Path

from isood.core.files import sha256_file
from manifests.ownership import owned_paths, read_meta, unlink_inside, walk_files

__all__ = ["OLD_SUFFIX", "Kept", "exchange", "fsync_dir", "discard_version"]

OLD_SUFFIX = ".isood-old"
_RENAME_EXCHANGE = 2
_libc = None


def exchange(a: Path, b: Path) -> bool:
    """Swap two paths atomically (Linux ``renameat2(RENAME_EXCHANGE)``); False where the system cannot."""
    global _libc
    try:
        if _libc is None:
            _libc = ctypes.CDLL(ctypes.util.find_library("c") or None, use_errno=True)
        fn = _libc.renameat2
    except (OSError, AttributeError):
        return False
    fn.argtypes = [ctypes.c_int, ctypes.c_char_p, ctypes.c_int, ctypes.c_char_p, ctypes.c_uint]
    at_fdcwd = -100
    if fn(at_fdcwd, os.fsencode(a), at_fdcwd, os.fsencode(b), _RENAME_EXCHANGE) == 0:
        return True
    err = ctypes.get_errno()
    if err in (errno.EINVAL, errno.ENOSYS, errno.ENOTSUP, errno.EOPNOTSUPP, errno.EXDEV):
        return False
    raise OSError(err, os.strerror(err), str(b))


def fsync_dir(folder: Path) -> None:
    with contextlib.suppress(OSError):
        fd = os.open(folder, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


@dataclass
class Kept:
    folder: Path | None = None
    edited: list[str] = field(default_factory=list)
    other: list[str] = field(default_factory=list)


def _edited(path: Path, rec: dict, new: Path | None) -> bool:
    """Whether the old version's file ``path`` no longer holds what its manifest recorded (a hand edit). A file
    the new version took over unchanged (the same inode) is not looked at again."""
    try:
        st = path.lstat()
        if new is not None and os.stat(new).st_ino == st.st_ino:
            return False
    except OSError:
        pass
    if path.is_symlink() or not path.is_file():
        return False
    if rec.get("bytes") is not None and st.st_size != rec["bytes"]:
        return True
    return sha256_file(path) != rec.get("sha256")


def discard_version(folder: Path, final: Path, new: Path | None = None) -> Kept:
    """Remove an old version's files: those its manifest listed (unless edited since) and those its writer
    recorded, never through a link; keep anything else in a visible ``<name>.isood-old-<time>`` folder.
    ``new``: the version that replaced it (files it took over are not hashed)."""
    meta, _ = read_meta(folder)
    kept = Kept()
    records = {str(r.get("path")): r for r in (meta or {}).get("files", []) if isinstance(r, dict)}
    for rel in sorted(owned_paths(meta)):
        p = folder / rel
        if rel in records and _edited(p, records[rel], new / rel if new is not None else None):
            kept.edited.append(rel)
            continue
        unlink_inside(folder, rel)
    for root, dirs, _names in os.walk(folder, topdown=False):
        for d in dirs:
            with contextlib.suppress(OSError):
                (Path(root) / d).rmdir()
    try:
        folder.rmdir()
        return kept
    except OSError:
        kept.other = [p for p in walk_files(folder) if p not in kept.edited]
    stamp = _dt.datetime.now().strftime("%Y%m%d-%H%M%S")
    target = final.with_name(f"{final.name}{OLD_SUFFIX}-{stamp}")
    n = 1
    while target.exists():
        n += 1
        target = final.with_name(f"{final.name}{OLD_SUFFIX}-{stamp}-{n}")
    os.rename(folder, target)
    kept.folder = target
    return kept


