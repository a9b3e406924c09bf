"""Listing the images of a dataset root or a file list, with the refusals every extraction follows.

* Listing (``list_images``): a dataset root (image files found recursively by extension, hidden files and
  folders skipped, broken links listed so that they are rejected, not skipped) or a file list (one path per line,
  relative to the list's folder or absolute; blank lines and ``#`` comments skipped; duplicates dropped, also
  when written differently: ``./a.png``, ``a/../a.png``, the absolute path). Paths are sorted and stored relative
  to an explicit root, never the working directory: the folder itself, or for a list the deepest folder holding
  the list and every entry (``ImageSource.root``, recorded as the feature set's ``image_root``). Each path gets
  the class ``wordnet_tools.wnids.wnid_from_path(path)`` (``''`` when the path names no ImageNet class), and its
  ``isood.core.content.FileStat`` (what content keys are checked against).
* Symlinks: the relative paths a manifest records promise files inside the image root. A listed file whose real
  location (symlinks resolved) lies outside the root is therefore refused (``ImageSource.refused``, listed in the
  extraction's ``rejected`` table with ``OutsideRootError`` and the location) unless the caller opts in with
  ``follow_symlinks=True`` (``isood extract --follow-symlinks``). Links to files that stay inside the root are
  read. Every real folder inside the root is listed under its own name; a symlinked folder whose target is
  another folder inside the root (an *alias*, e.g. ``ln -s n01443537 root/n01440764``, or a link cycle) is not
  read twice: the files reached through it are refused with an ``AliasError`` naming the real folder.
* Names: a file or folder name that is not valid UTF-8 cannot be recorded in a table; its path is recorded with
  the undecodable bytes written ``\\xNN`` (``utf8_text``) and the file refused (``UnicodeError``: rename it).
"""

from __future__ import annotations

import hashlib
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Sequence

import pandas as pd

from isood.core.content import FileStat, stat_files
from isood.core.errors import BadInputError
from isood.core.inputs import check_entry, is_hidden, is_inside, name_problem, resolve_entry
from isood.core.textio import read_lines
from wordnet_tools.wnids import wnid_from_path

__all__ = ["IMAGE_EXTENSIONS", "ImageSource", "list_images", "image_rows", "listing_sha256", "OutsideRootError",
           "AliasError", "outside_root", "utf8_text"]

#: File extensions (lower case) the folder lister takes for images.
IMAGE_EXTENSIONS = frozenset({".jpg", ".jpeg", ".png", ".bmp", ".gif", ".webp", ".tif", ".tiff", ".ppm", ".pgm"})
@dataclass
class ImageSource:
    """Images to extract: ``root`` (paths are relative to it), ``table`` (path, wnid) sorted by path,
    ``files`` (absolute paths, same order), ``sizes`` (bytes, -1 for a missing file), ``listing_sha256`` (hash
    of the 'path<TAB>size' lines), ``kind`` ('folder' or 'list'), ``source`` (what the user passed),
    ``refused`` (per file: '' or why it is not read: a symlink leading outside the root, a file reached through
    an alias folder, a name that is not UTF-8; module docstring), ``follow_symlinks`` (whether links leading
    outside were opted in), ``stats`` (per file its ``isood.core.content.FileStat``, None when missing) and
    ``seen_ns`` (when they were taken): what content keys are checked against (``isood.core.content``)."""

    root: Path
    table: pd.DataFrame
    files: list[Path]
    sizes: list[int]
    listing_sha256: str
    kind: str
    source: Path
    refused: list[str] = field(default_factory=list)
    follow_symlinks: bool = False
    stats: list[FileStat | None] = field(default_factory=list)
    seen_ns: int = 0


class AliasError(OSError):
    """A file reached through an alias folder: a symlinked folder whose target is another folder inside the image
    root (its files are listed, and read, under the real folder's name)."""


class OutsideRootError(OSError):
    """A listed image whose real location (symlinks resolved) lies outside the image root."""


def _image_name(name: str) -> bool:
    return not name.startswith(".") and os.path.splitext(name)[1].lower() in IMAGE_EXTENSIONS


def _alias_reason(link_rel: str, target: str) -> str:
    where = f"folder {utf8_text(target)}" if target != "." else "the image root itself"
    return (f"AliasError: folder {utf8_text(link_rel)} is a symlink to {where} inside the root; its files are "
            "listed there (under their real names)")


def _folder_paths(root: Path) -> tuple[list[str], dict[str, str]]:
    """The image files under ``root``: (relative posix paths, sorted; {path: why it is not read}).

    Hidden files and folders are skipped; broken links are kept (they are rejected when read, not silently
    dropped). Every real folder inside the root is listed under its own name. A symlinked folder whose target is
    a folder inside the root (an *alias*, a link cycle included) is not read a second time: the files reached
    through it are listed with an ``AliasError`` reason naming the real folder (the walk inside an alias follows
    no further links). A symlinked folder leading outside the root is followed once (the listing then refuses
    its files unless ``follow_symlinks``); a second link to the same outside folder is an alias of the first."""
    real_root = os.path.realpath(root)
    outside: dict[str, str] = {}  # real folder outside the root -> the relative name it is listed under
    rels: list[str] = []
    reasons: dict[str, str] = {}

    def walk(folder: str, prefix: str, alias: str | None) -> None:
        try:
            with os.scandir(folder) as it:
                entries = sorted(it, key=lambda e: e.name)
        except OSError:
            return
        for e in entries:
            if is_hidden(e.name):
                continue
            rel = prefix + e.name
            try:
                is_dir = e.is_dir()  # follows links; a broken link is no folder
            except OSError:
                is_dir = False
            if not is_dir:
                if _image_name(e.name):
                    rels.append(rel)
                    if alias is not None:
                        reasons[rel] = alias
                continue
            if not e.is_symlink():
                walk(e.path, rel + "/", alias)
            elif alias is None:  # a symlinked folder outside any alias: follow it once, or list it as an alias
                target = os.path.realpath(e.path)
                if is_inside(target, real_root):
                    inner = Path(os.path.relpath(target, real_root)).as_posix()
                    walk(e.path, rel + "/", _alias_reason(rel, inner))
                elif target in outside:
                    walk(e.path, rel + "/", _alias_reason(rel, outside[target]))
                else:
                    outside[target] = rel
                    walk(e.path, rel + "/", None)

    walk(str(root), "", None)
    return sorted(rels), reasons


def utf8_text(text: str) -> str:
    """``text`` as valid UTF-8: a file name's undecodable bytes (Python's surrogate escapes) written as ``\\xNN``."""
    try:
        text.encode("utf-8")
        return text
    except UnicodeEncodeError:
        return os.fsencode(text).decode("utf-8", "backslashreplace")


def _safe_text(text: str) -> str:
    """``utf8_text`` with control characters (a newline, a NUL) written as ``\\xNN`` too: a name that cannot be
    one line of a list (``isood.core.inputs.name_problem``) is recorded escaped, never as it is."""
    u = utf8_text(text)
    if name_problem(u) is None:
        return u
    return "".join(f"\\x{ord(c):02x}" if ord(c) < 0x20 or ord(c) == 0x7F else c for c in u)


def _utf8_names(rels: list[str], files: list[Path], reasons: dict[str, str]) -> tuple[list[str], list[Path]]:
    """Paths whose name is not valid UTF-8 or holds a control character (they cannot be written to a table or a
    list line) recorded in an escaped form (``_safe_text``) with a reason in ``reasons`` (updated); the listing
    re-sorted by the recorded path."""
    if all(_safe_text(r) == r for r in rels):
        return rels, files
    shown = []
    for r in rels:
        u = _safe_text(r)
        if u != r:
            problem = name_problem(r)
            reasons[u] = (f"ControlCharacterError: the name {u} {problem} (shown as \\xNN); rename it"
                          if problem is not None else
                          f"UnicodeError: the name {u} is not valid UTF-8 (undecodable bytes shown as \\xNN); "
                          "rename it")
        shown.append(u)
    order = sorted(range(len(shown)), key=shown.__getitem__)
    return [shown[i] for i in order], [files[i] for i in order]


def _list_paths(lines: Sequence[str], base: Path, *, strict: bool = False,
                what: str = "image list") -> tuple[Path, list[str], list[Path]]:
    """The entries of a file list: (their root, posix paths relative to it, absolute files), first occurrence
    kept, sorted by path. Entries are normalised (``./``, ``a/..``) and relative ones taken against ``base`` (the
    list's folder); the root is the deepest folder holding ``base`` and every entry, so every stored path is
    relative to an explicit root (recorded as the feature set's ``image_root``), whatever the list names. An
    entry with a control character (a NUL) is a one-line error; ``strict`` (the input-path policy,
    ``isood.core.inputs``): every entry relative, without ``..``, and inside ``base`` once its links are resolved."""
    seen: set[str] = set()
    files: list[Path] = []
    for no, raw in enumerate(lines, start=1):
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        if strict:
            resolve_entry(base, line, what=f"{what} line {no}")
        elif name_problem(line) is not None:
            check_entry(line, what=f"{what} line {no}")
        p = Path(line).expanduser()
        p = Path(os.path.normpath(p if p.is_absolute() else base / p))
        if p.as_posix() not in seen:
            seen.add(p.as_posix())
            files.append(p)
    root = Path(os.path.commonpath([str(base), *(str(f.parent) for f in files)])) if files else base
    rels = [f.relative_to(root).as_posix() for f in files]
    order = sorted(range(len(rels)), key=rels.__getitem__)
    return root, [rels[i] for i in order], [files[i] for i in order]


def image_rows(paths: Sequence[str]) -> pd.DataFrame:
    """The (path, wnid) table of image paths: wnid from ``wnid_from_path`` (``''`` when none)."""
    paths = [str(p) for p in paths]
    return pd.DataFrame({"path": paths, "wnid": [wnid_from_path(p) or "" for p in paths]})


def listing_sha256(paths: Sequence[str], sizes: Sequence[int]) -> str:
    """Hash of a listing: the lines ``path<TAB>size``."""
    return hashlib.sha256("\n".join(f"{r}\t{s}" for r, s in zip(paths, sizes)).encode()).hexdigest()


def outside_root(root: str | os.PathLike, rels: Sequence[str], files: Sequence[str | os.PathLike]) -> list[str]:
    """For each listed file: '' when its real location (symlinks resolved) is inside ``root``, else that real
    location. Each folder is resolved once."""
    real_root = os.path.realpath(root)
    folders: dict[str, str] = {}
    out = []
    for _rel, f in zip(rels, files):
        f = os.fspath(f)
        parent, name = os.path.split(f)
        real_parent = folders.get(parent)
        if real_parent is None:
            real_parent = folders[parent] = os.path.realpath(parent)
        real = os.path.realpath(f) if os.path.islink(f) else os.path.join(real_parent, name)
        out.append("" if is_inside(real, real_root) else real)
    return out


def _refusals(root: Path, rels: Sequence[str], files: Sequence[Path], follow_symlinks: bool,
              reasons: dict[str, str]) -> list[str]:
    """Why each file is not read ('' when it is): its name (not UTF-8) or an alias folder (``reasons``), else
    outside the root, unless ``follow_symlinks``."""
    far = outside_root(root, rels, files) if not follow_symlinks else [""] * len(rels)
    return [reasons.get(rel) or (f"OutsideRootError: {rel} resolves to {utf8_text(real)}, outside the image root "
                                 f"{utf8_text(str(root))}; pass --follow-symlinks to read it" if real else "")
            for rel, real in zip(rels, far)]


def _read_list(src: Path) -> list[str]:
    return read_lines(src, what="image list")


def list_images(src: str | os.PathLike, *, follow_symlinks: bool = False,
                base: str | os.PathLike | None = None, strict: bool = False) -> ImageSource:
    """The images of a dataset root or a file list (module docstring); one-line errors when it does not exist
    or holds no images. ``follow_symlinks``: read files whose links lead outside the root too (module
    docstring); by default they are listed as ``refused``. ``base``: the folder a file list's relative entries
    are relative to (default: the list's folder; e.g. the IS-OOD release's ``test_imagenet.txt`` lists
    ``./val/...`` relative to the ImageNet-1K root). ``strict``: a file list's entries follow the input-path
    policy (``isood.core.inputs``: relative, inside ``base``; as the importers' lists), else absolute entries and
    ``..`` are taken as written (extract's lists)."""
    src = Path(os.path.abspath(Path(src).expanduser()))
    reasons: dict[str, str] = {}
    if src.is_dir():
        root, kind = src, "folder"
        rels, reasons = _folder_paths(root)
        files = [root / r for r in rels]
    elif src.is_file():
        kind = "list"
        root, rels, files = _list_paths(_read_list(src), Path(os.path.abspath(base)) if base else src.parent,
                                        strict=strict, what=str(src))
    else:
        raise BadInputError(f"image source {src} does not exist; pass a dataset root with wnid subfolders or a "
                            "file list")
    if not rels:
        raise BadInputError(f"image source {src} holds no images ({', '.join(sorted(IMAGE_EXTENSIONS))}); pass a "
                            "folder or file list with at least one image")
    rels, files = _utf8_names(rels, files, reasons)
    stats, seen_ns = stat_files(files)
    sizes = [st.size if st is not None else -1 for st in stats]
    return ImageSource(root, image_rows(rels), files, sizes, listing_sha256(rels, sizes), kind, src,
                       _refusals(root, rels, files, follow_symlinks, reasons), bool(follow_symlinks), stats, seen_ns)

