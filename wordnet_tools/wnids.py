"""ImageNet class ids (wnids) in text: the one place that says what a wnid looks like and which class an
image path names.

A wnid is ``'n'`` followed by the 8-digit offset of a noun synset in WordNet 3.0's ``data.noun``.
"""

from __future__ import annotations

import re

__all__ = ["WNID_RE", "is_wnid", "wnid_from_path"]

WNID_RE = re.compile(r"n\d{8}")
_FILE_RE = re.compile(r"(n\d{8})_.*")


def is_wnid(text: object) -> bool:
    """True if ``text`` has the form of an ImageNet wnid: 'n' followed by 8 digits."""
    return isinstance(text, str) and WNID_RE.fullmatch(text) is not None


def wnid_from_path(path: str) -> str | None:
    """The ImageNet class (wnid) an image path or class-list entry names, or None.

    The path is split at ``/`` (and ``\\``; empty parts ignored). First match wins:

    1. the last part is itself a wnid: a class entry (``n01440764``, ``train/n01440764``);
    2. the nearest folder named like a wnid (``a/n01440764/x.JPEG``; ``n01440764/n02084071_1.JPEG`` gives
       the folder's ``n01440764``): ImageNet's train layout, ImageNet-OOD and IS-OOD lists;
    3. a file name ``nXXXXXXXX_<rest>`` (ImageNet's own file naming, e.g. ``val/n01440764_10026.JPEG``);
    4. otherwise None: a folder that is not a wnid (``places/abbey/x.jpg``) names no ImageNet class.
    """
    parts = [p for p in re.split(r"[/\\]", str(path)) if p]
    if not parts:
        return None
    if is_wnid(parts[-1]):
        return parts[-1]
    for folder in reversed(parts[:-1]):
        if is_wnid(folder):
            return folder
    m = _FILE_RE.fullmatch(parts[-1])
    return m.group(1) if m else None
