"""ImageNet class lists (wnids) from timm's bundled files, a user's list file, or a dataset root.

Named lists (read offline from timm's bundled ``timm/data/_info`` folder, found without importing timm):

========== ================================ ======= ==============================================
spec       timm file                        classes what
========== ================================ ======= ==============================================
1k         imagenet_synsets.txt              1,000  ImageNet-1K (ILSVRC-2012)
21k        imagenet22k_synsets.txt          21,841  ImageNet-21K fall11 full (fall11_whole.tar)
21k-p      imagenet21k_miil_synsets.txt     11,221  ImageNet-21K-P, fall11 release (MIIL)
21k-p-w21  imagenet21k_miil_w21_synsets.txt 10,450  ImageNet-21K-P, winter21 release (as in IS-OOD)
12k        imagenet12k_synsets.txt          11,821  timm's 12k subset of fall11
21k-goog   imagenet21k_goog_synsets.txt     21,843  Google's ImageNet-21K (fall11 + 2 classes)
========== ================================ ======= ==============================================

Pitfall: n04399382 (teddy bear) is an ImageNet-1K class missing from ``21k`` (fall11 full).

Any other spec is a path: a file with one wnid per line (blank lines and ``#`` comments ignored; text after the
wnid on the same line, e.g. ``n01440764 tench, Tinca tinca``, is ignored), or a directory whose subfolders are
wnids (a dataset root such as ``ILSVRC/train``). Named specs win over paths: to read a file called ``1k``,
pass ``./1k``.
"""

from __future__ import annotations

import csv
import importlib.util
from functools import lru_cache
from os import PathLike
from pathlib import Path

from isood.core.textio import read_lines
from wordnet_tools.errors import ClassListError
from wordnet_tools.wnids import is_wnid

#: spec -> timm file name under timm/data/_info
NAMED_LISTS: dict[str, str] = {
    "1k": "imagenet_synsets.txt",
    "21k": "imagenet22k_synsets.txt",
    "21k-p": "imagenet21k_miil_synsets.txt",
    "21k-p-w21": "imagenet21k_miil_w21_synsets.txt",
    "12k": "imagenet12k_synsets.txt",
    "21k-goog": "imagenet21k_goog_synsets.txt",
}

_LEMMA_FILE = "imagenet_synset_to_lemma.txt"
_DEFINITION_FILE = "imagenet_synset_to_definition.txt"


@lru_cache(maxsize=1)
def _timm_info_dir() -> Path:
    """timm's ``data/_info`` folder, located without importing timm (importing it loads torch, ~5 s)."""
    spec = importlib.util.find_spec("timm")
    for location in (spec.submodule_search_locations or []) if spec else []:
        folder = Path(location) / "data" / "_info"
        if folder.is_dir():
            return folder
    raise ClassListError("timm's bundled ImageNet synset lists not found; install timm (pip install timm)")


def _timm_info_text(name: str) -> str:
    return (_timm_info_dir() / name).read_text(encoding="utf-8")


@lru_cache(maxsize=None)
def _named_list(spec: str) -> tuple[str, ...]:
    return tuple(_parse_wnid_lines(_timm_info_text(NAMED_LISTS[spec]).splitlines(), f"timm:{NAMED_LISTS[spec]}"))


def _parse_wnid_lines(lines, source: str) -> list[str]:
    """wnids of a list file: one per line, first field; blank lines and #comments skipped; duplicates refused."""
    seen: dict[str, int] = {}
    out: list[str] = []
    for line_no, raw in enumerate(lines, start=1):
        text = raw.split("#", 1)[0].strip()
        if not text:
            continue
        first = text.split()[0]
        if not is_wnid(first):
            raise ClassListError(f"{source}:{line_no}: not a wnid: {raw.strip()!r} (expected e.g. n01440764)")
        if first in seen:
            raise ClassListError(f"{source}:{line_no}: duplicate wnid {first} (first at line {seen[first]})")
        seen[first] = line_no
        out.append(first)
    return out


def _list_from_directory(root: Path) -> list[str]:
    names = sorted(p.name for p in root.iterdir() if p.is_dir() and not p.name.startswith("."))
    wnids = [n for n in names if is_wnid(n)]
    others = [n for n in names if not is_wnid(n)]
    if others:
        shown = ", ".join(repr(n) for n in others[:3]) + (", ..." if len(others) > 3 else "")
        raise ClassListError(
            f"{root}: subfolders are not all wnids ({shown}); pass the folder whose subfolders are the classes"
        )
    if not wnids:
        raise ClassListError(f"{root}: no wnid subfolders; pass the folder whose subfolders are the classes")
    return wnids


def load_synset_list(spec: str | PathLike) -> list[str]:
    """The wnids of a named list (``1k``, ``21k``, ``21k-p``, ``21k-p-w21``, ``12k``, ``21k-goog``), a list file,
    or a dataset root (its wnid subfolders, sorted). A file keeps its order."""
    if isinstance(spec, str) and spec in NAMED_LISTS:
        return list(_named_list(spec))
    path = Path(spec).expanduser()
    if path.is_dir():
        return _list_from_directory(path)
    if path.is_file():
        wnids = _parse_wnid_lines(read_lines(path, error=ClassListError), str(spec))
        if not wnids:
            raise ClassListError(f"{spec}: no wnids in the file")
        return wnids
    raise ClassListError(
        f"unknown class list {str(spec)!r}: pass one of {', '.join(NAMED_LISTS)}, "
        "a file with one wnid per line, or a folder whose subfolders are wnids"
    )


def _read_tsv(name: str) -> dict[str, str]:
    return {row[0]: row[1] for row in csv.reader(_timm_info_text(name).splitlines(), delimiter="\t") if len(row) >= 2}


@lru_cache(maxsize=1)
def imagenet_lemmas() -> dict[str, str]:
    """wnid -> comma-separated lemmas from timm's imagenet_synset_to_lemma.txt (all 21K classes).

    A fallback name source for wnids WordNet does not know; pass it as ``fallback_names`` to the filter/audit.
    """
    return _read_tsv(_LEMMA_FILE)


@lru_cache(maxsize=1)
def imagenet_definitions() -> dict[str, str]:
    """wnid -> gloss from timm's imagenet_synset_to_definition.txt."""
    return _read_tsv(_DEFINITION_FILE)


def imagenet_names() -> dict[str, str]:
    """wnid -> first lemma from timm's lemma file (the same form as ``Hierarchy.name``)."""
    return {w: lemmas.split(",")[0].strip() for w, lemmas in imagenet_lemmas().items()}
