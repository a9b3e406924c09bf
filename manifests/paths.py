"""Safe relative paths: everything a manifest stores is relative and stays inside its root."""

from __future__ import annotations

import os
from pathlib import Path, PurePosixPath

from isood.core.errors import ManifestError
from isood.core.inputs import is_inside as is_inside  # one rule (isood.core.inputs: the input-path policy)
from isood.core.inputs import name_problem


def check_relative(path: str) -> str:
    """Return `path` as a POSIX relative path, refusing absolute paths, any `..` component and control
    characters (a NUL, a newline: ``isood.core.inputs.name_problem``)."""
    if not isinstance(path, str) or not path:
        raise ManifestError(f"manifest path must be a non-empty string, got {path!r}")
    problem = name_problem(path)
    if problem is not None:
        raise ManifestError(f"manifest path {path!r} {problem}; rename the file")
    p = PurePosixPath(path.replace("\\", "/"))
    if p.is_absolute() or path.startswith(("/", "\\")) or (len(path) > 1 and path[1] == ":"):
        raise ManifestError(f"manifest path {path!r} is absolute; paths must be relative to the manifest root")
    if ".." in p.parts:
        raise ManifestError(f"manifest path {path!r} escapes the manifest root ('..' is not allowed)")
    return p.as_posix()


def resolve_inside(root: Path, path: str) -> Path:
    """Join a checked relative path onto `root` and make sure the result (symlinks resolved) stays inside it."""
    rel = check_relative(path)
    full = (root / rel).resolve()
    if not is_inside(full, root.resolve()):
        raise ManifestError(f"manifest path {path!r} resolves outside the manifest root")
    return full
