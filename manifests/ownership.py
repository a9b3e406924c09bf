"""What a manifest folder's writer owns, and deletion confined to it.

Every manifest.json that isood writes holds a ``writer`` record outside its hashed content::

    "writer": {"version": "<32 random hex>", "own": ["<relative path>", ...]}

``version`` identifies this one write of the folder (``Manifest`` checks it before and after every read, through
the marker ``.~isood-<version>.version`` that lives in the folder and goes with it when a new version is swapped
in). ``own`` lists the files beside the manifest's ``files`` that the writer left there: resume records and stat
caches of the stage, the manifest.json and marker of a manifest nested in it, the marker itself. Nothing else
below an output belongs to isood: a file it finds there that is neither listed nor recorded (a user's
``.~backup/``, an editor's lock file, a ``webapp/manifest.json``) is the user's. A manifest.json without the
record (an edited one) owns its listed files and itself only.

Deletion (``unlink_inside``) never passes a symbolic link: a path whose folders are not real folders inside the
manifest's own folder is left alone; a link is removed as a link, never its target.
"""

from __future__ import annotations

import os
import re
import secrets
from pathlib import Path
from typing import Iterable, Iterator

from isood.core.errors import IsoodError, one_line
from isood.core.files import TMP_PREFIX
from manifests.meta import MANIFEST_FILE, load_meta
from manifests.paths import check_relative, is_inside

__all__ = ["RECORD_KEY", "read_meta", "new_version_id", "version_marker", "version_of", "recorded_own",
           "walk_files", "owned_paths", "foreign_paths", "escaping_links", "unlink_inside", "folder_identity",
           "is_current", "version_identity"]

RECORD_KEY = "writer"
_VERSION_RE = re.compile(r"^[0-9a-f]{32}$")


def read_meta(folder: Path) -> tuple[dict | None, str | None]:
    """(manifest.json of ``folder`` validated, None) or (None, why it cannot be read), or (None, None) without one."""
    if not (folder / MANIFEST_FILE).is_file():
        return None, None
    try:
        return load_meta(folder), None
    except (IsoodError, OSError, ValueError, RecursionError) as e:
        return None, one_line(e, 160)


def new_version_id() -> str:
    """A fresh, unguessable identity for one write of a manifest folder."""
    return secrets.token_hex(16)


def version_marker(version: str) -> str:
    """The marker file (relative to the folder) that says the folder holds the version ``version``."""
    return f"{TMP_PREFIX}isood-{version}.version"


def version_of(meta: dict | None) -> str | None:
    """The version identity a manifest.json records (None for one without the writer's record)."""
    rec = (meta or {}).get(RECORD_KEY)
    v = rec.get("version") if isinstance(rec, dict) else None
    return v if isinstance(v, str) and _VERSION_RE.match(v) else None


def recorded_own(meta: dict | None) -> set[str] | None:
    """The bookkeeping paths a manifest's writer recorded (checked relative paths), None without a record."""
    rec = (meta or {}).get(RECORD_KEY)
    if not isinstance(rec, dict) or not isinstance(rec.get("own"), list):
        return None
    out = set()
    for rel in rec["own"]:
        if isinstance(rel, str):
            try:
                out.add(check_relative(rel))
            except Exception:  # an edited record: an unsafe path is simply not ours
                continue
    return out


def walk_files(root: Path) -> Iterator[str]:
    """Every file and symbolic link below ``root`` (relative POSIX paths), hidden folders included; links to
    folders are reported, never entered."""
    for folder, dirs, names in os.walk(root):
        rel_folder = Path(folder).relative_to(root).as_posix()
        links = [d for d in dirs if os.path.islink(os.path.join(folder, d))]
        dirs[:] = [d for d in dirs if d not in links]
        for n in [*names, *links]:
            yield n if rel_folder == "." else f"{rel_folder}/{n}"


def owned_paths(meta: dict | None) -> set[str]:
    """The paths below a manifest's folder that its manifest (``meta``; None: no manifest) says isood wrote: its
    listed files, its manifest.json and the writer's record."""
    if meta is None:
        return set()
    listed = {str(r.get("path")) for r in meta.get("files", []) if isinstance(r, dict)}
    return listed | (recorded_own(meta) or set()) | {MANIFEST_FILE}


def foreign_paths(root: Path, meta: dict | None, allow: Iterable[str] = ()) -> list[str]:
    """Files below ``root`` that isood did not write (``owned_paths``), but ``allow``."""
    owned = owned_paths(meta) | set(allow)
    return sorted(p for p in walk_files(root) if p not in owned and not _temporary(p))


def _temporary(rel: str) -> bool:
    """An atomic write's temporary (``isood.core.files.atomic_write_bytes``: ``.~<name>.<random>.tmp``): not counted
    as foreign, but never deleted by a swap either (kept with the old version when one is found there)."""
    name = rel.rsplit("/", 1)[-1]
    return name.startswith(TMP_PREFIX) and name.endswith(".tmp") and len(name) > len(TMP_PREFIX) + 4


def escaping_links(root: Path) -> list[tuple[str, str]]:
    """(relative path, target) of every symbolic link below ``root`` that leads outside it (or nowhere)."""
    real_root = os.path.realpath(root)
    out = []
    for rel in walk_files(root):
        p = root / rel
        if p.is_symlink():
            target = os.path.realpath(p)
            if not is_inside(target, real_root):
                out.append((rel, os.readlink(p)))
    return out


def unlink_inside(root: Path, rel: str) -> bool:
    """Remove ``root/rel`` when it is a file or link whose every folder is a real folder inside ``root`` (no
    link on the way); a link is removed itself, never what it points at. True when something was removed."""
    try:
        rel = check_relative(rel)
    except Exception:
        return False
    real_root = os.path.realpath(root)
    parts = rel.split("/")
    folder = Path(root)
    for part in parts[:-1]:
        folder = folder / part
        if folder.is_symlink() or not folder.is_dir():
            return False
    if os.path.realpath(folder) != os.path.join(real_root, *parts[:-1]).rstrip("/") and parts[:-1]:
        return False
    p = folder / parts[-1]
    if p.is_symlink() or p.is_file():
        p.unlink()
        return True
    return False


def folder_identity(root: str | os.PathLike) -> tuple[int, int] | None:
    try:
        st = os.stat(root)
    except OSError:
        return None
    return (st.st_dev, st.st_ino)


def version_identity(root: str | os.PathLike, meta: dict | None,
                     before: tuple[int, int] | None = None) -> tuple:
    """What tells this version of ``root`` from the next: ``("version", id)`` when its marker is there (a swap
    or a rewrite removes it); else ``("folder", (device, inode))`` (``before``: taken before ``meta`` was read),
    for a manifest.json without the writer's record or a copy without its marker (an upload, a ``cp`` of the listed
    files), a weaker test since file systems reuse inode numbers."""
    version = version_of(meta)
    if version is not None and os.path.isfile(os.path.join(root, version_marker(version))):
        return ("version", version)
    return ("folder", before if before is not None else folder_identity(root))


def is_current(root: str | os.PathLike, identity: tuple) -> bool:
    """Whether ``root`` still holds the version ``identity`` (``version_identity``) names."""
    if identity[0] == "version":
        return os.path.isfile(os.path.join(root, version_marker(identity[1])))
    return identity[1] is None or folder_identity(root) == identity[1]
