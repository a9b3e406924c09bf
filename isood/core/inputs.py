"""The one input-path policy of every reader of lists and folders.

* An entry of a list (an image path, a list file's line) is **relative and stays inside its root**: no absolute
  path, no drive letter, no ``..`` component (``relative_problem``), and once joined to its root and its links
  resolved, still inside it (``resolve_entry``).
* A path holds **no control character**: no NUL, newline, carriage return or tab (``name_problem``): such a name
  cannot be written as one line of a list, nor passed to the C libraries that read images.
* A folder walk (``walk_files``) skips **hidden** entries (a name starting with ``.``: never a subset, never a
  list); follows a **symlinked folder only inside the root**, and says so (``Walk.notes``); a link to a folder
  the walk reads anyway is an alias, read once; a link (folder or file) leading **outside the root** is refused,
  naming it.
* ``BAD_PATH_PATTERN``: the same rule as one regular expression (RE2 and Python), for whole Arrow columns
  (``manifests.verify`` and the writer check stored paths with it).

Standard library only.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath

from isood.core.errors import BadInputError

__all__ = ["CONTROL_PATTERN", "BAD_PATH_PATTERN", "name_problem", "relative_problem", "entry_problem",
           "check_entry", "is_hidden", "is_inside", "resolve_entry", "Walk", "walk_files"]

#: A control character (NUL, newline, carriage return, tab, ...) anywhere in a path.
CONTROL_PATTERN = r"[\x00-\x1f\x7f]"
#: An unsafe stored path: absolute (``/``, ``\``, ``C:\``), a ``..`` component, or a control character.
BAD_PATH_PATTERN = r"^/|^\\|^[A-Za-z]:[\\/]|(^|/)\.\.(/|$)|" + CONTROL_PATTERN
_CONTROL = re.compile(CONTROL_PATTERN)


def name_problem(text: str) -> str | None:
    """Why ``text`` cannot be a path isood reads or stores (a control character), or None."""
    m = _CONTROL.search(text)
    if m is None:
        return None
    what = {"\x00": "a NUL byte", "\n": "a newline", "\r": "a carriage return", "\t": "a tab"}
    return f"holds {what.get(m.group(), f'the control character {m.group()!r}')}"


def relative_problem(text: str) -> str | None:
    """Why ``text`` is not a path relative to its root (absolute, a drive, a ``..`` component), or None."""
    if text.startswith(("/", "\\")) or (len(text) > 1 and text[1] == ":") or PurePosixPath(text).is_absolute():
        return "is absolute"
    if ".." in PurePosixPath(text.replace("\\", "/")).parts:
        return "leaves its root ('..')"
    return None


def entry_problem(text: str) -> str | None:
    """Why a list entry breaks the policy (``name_problem``, then ``relative_problem``), or None."""
    if not text:
        return "is empty"
    return name_problem(text) or relative_problem(text)


def check_entry(text: str, *, what: str) -> str:
    """``text`` as a POSIX relative path, or a one-line ``BadInputError`` naming ``what`` (e.g. ``list.txt
    line 3``) and what to pass instead."""
    problem = entry_problem(text)
    if problem is not None:
        raise BadInputError(f"{what}: the path {text!r} {problem}; list paths relative to the root, inside it, "
                            "without control characters")
    return PurePosixPath(text.replace("\\", "/")).as_posix()


def is_hidden(name: str) -> bool:
    """A hidden file or folder (its name starts with ``.``): never read as a subset, a list or an image."""
    return name.startswith(".")


def is_inside(real: str | os.PathLike, real_root: str | os.PathLike) -> bool:
    """Whether ``real`` is ``real_root`` or below it (both absolute, links already resolved)."""
    real, real_root = os.fspath(real), os.fspath(real_root)
    return os.path.commonpath([real, real_root]) == real_root


def resolve_entry(root: str | os.PathLike, text: str, *, what: str) -> Path:
    """``root / text`` for a checked entry (``check_entry``) whose links resolve inside ``root``; a one-line
    ``BadInputError`` otherwise. Returns the path as joined (not resolved)."""
    rel = check_entry(text, what=what)
    full = Path(root) / rel
    real = os.path.realpath(full)
    if not is_inside(real, os.path.realpath(root)):
        raise BadInputError(f"{what}: {rel} resolves to {real}, outside {root}; list files inside the root")
    return full


@dataclass
class Walk:
    """The files of a folder walk: ``files`` (relative POSIX path -> path as walked, in path order) and
    ``notes`` (one line per symlinked folder followed, or skipped as an alias)."""

    files: dict[str, Path] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)


def walk_files(root: str | os.PathLike, *, what: str) -> Walk:
    """Every non-hidden file under ``root`` by the policy (module docstring). ``what`` names the root in the
    one-line refusals (a link leading outside it; a name with a control character)."""
    root = Path(root)
    real_root = os.path.realpath(root)
    out = Walk()
    direct: set[str] = set()  # real folders a walk without links reaches (not hidden)
    for folder, dirs, _files in os.walk(root):
        dirs[:] = [d for d in dirs if not is_hidden(d) and not os.path.islink(os.path.join(folder, d))]
        direct.add(os.path.realpath(folder))
    seen: set[str] = set()

    def walk(folder: Path, prefix: str) -> None:
        real = os.path.realpath(folder)
        if real in seen:  # a link cycle
            return
        seen.add(real)
        with os.scandir(folder) as it:
            entries = sorted(it, key=lambda e: e.name)
        for e in entries:
            if is_hidden(e.name):
                continue
            rel = prefix + e.name
            problem = name_problem(rel)
            if problem is not None:
                raise BadInputError(f"{what}: the name {rel!r} {problem}; rename it")
            target = os.path.realpath(e.path)
            if e.is_symlink() and not is_inside(target, real_root):
                raise BadInputError(f"{what}: {rel} is a link to {target}, outside {root}; copy it in or pass "
                                    "the folder it points to")
            if e.is_dir():
                if e.is_symlink():
                    if target in direct:
                        out.notes.append(f"{rel} -> {target}: a link to a folder read anyway, read once")
                        continue
                    out.notes.append(f"{rel} -> {target}: a symlinked folder inside the root, followed")
                walk(Path(e.path), rel + "/")
            elif e.is_file():
                out.files[rel] = Path(e.path)

    walk(root, "")
    out.files = dict(sorted(out.files.items()))
    return out
