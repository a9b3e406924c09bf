"""L3: image listing and decoding, with the bad-image policy every extraction follows.

* Listing (``list_images``): a dataset root (image files found recursively by extension, hidden files and
  folders skipped) or a file list (one path per line, relative to the list's folder or absolute; blank lines
  and ``#`` comments skipped; duplicates dropped). Paths are sorted; each gets the class
  ``wordnet_tools.wnids.wnid_from_path(path)`` (``''`` when the path names no ImageNet class).
* Decoding (``decode_image``): an image that cannot be read (missing, truncated, not an image, a decompression
  bomb) is never fatal: it yields an error string ``"<ExceptionType>: <message>"`` naming the image by its
  relative path, and the extraction lists it in its ``rejected`` table.
"""

from __future__ import annotations

import hashlib
import os
import warnings
from concurrent.futures import Executor
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Callable, Sequence

import pandas as pd
from PIL import Image

from isood.errors import BadInputError
from isood.runtime import one_line
from wordnet_tools.wnids import wnid_from_path

if TYPE_CHECKING:
    import torch

__all__ = [
    "IMAGE_EXTENSIONS", "ImageSource", "list_images", "image_rows", "listing_sha256", "decode_image",
    "decode_images", "collate",
]

#: File extensions (lower case) the folder lister takes for images.
IMAGE_EXTENSIONS = frozenset({".jpg", ".jpeg", ".png", ".bmp", ".gif", ".webp", ".tif", ".tiff", ".ppm", ".pgm"})

#: One decoded image: (preprocessed tensor, '') or (None, error string).
Decoded = tuple["torch.Tensor | None", str]


@dataclass
class ImageSource:
    """Images to extract: ``root`` (paths are relative to it), ``table`` (path, wnid) sorted by path,
    ``files`` (absolute paths, same order), ``sizes`` (bytes, -1 for a missing file), ``listing_sha256`` (hash
    of the 'path<TAB>size' lines), ``kind`` ('folder' or 'list') and ``source`` (what the user passed)."""

    root: Path
    table: pd.DataFrame
    files: list[Path]
    sizes: list[int]
    listing_sha256: str
    kind: str
    source: Path


def _folder_paths(root: Path) -> list[str]:
    """Relative posix paths of the image files under ``root`` (no hidden parts), sorted."""
    return sorted(
        p.relative_to(root).as_posix()
        for p in root.rglob("*")
        if p.suffix.lower() in IMAGE_EXTENSIONS and not any(s.startswith(".") for s in p.relative_to(root).parts)
        and p.is_file()
    )


def _list_paths(lines: Sequence[str], root: Path) -> tuple[list[str], list[Path]]:
    """The entries of a file list: (relative-or-absolute posix paths, absolute files), first occurrence kept,
    sorted by path."""
    seen: set[str] = set()
    rels, files = [], []
    for raw in lines:
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        p = Path(line).expanduser()
        p = p if p.is_absolute() else root / p
        try:
            rel = p.relative_to(root).as_posix()
        except ValueError:
            rel = p.as_posix()
        if rel not in seen:
            seen.add(rel)
            rels.append(rel)
            files.append(p)
    order = sorted(range(len(rels)), key=rels.__getitem__)
    return [rels[i] for i in order], [files[i] for i in order]


def image_rows(paths: Sequence[str]) -> pd.DataFrame:
    """The (path, wnid) table of image paths: wnid from ``wnid_from_path`` (``''`` when none)."""
    paths = [str(p) for p in paths]
    return pd.DataFrame({"path": paths, "wnid": [wnid_from_path(p) or "" for p in paths]})


def listing_sha256(paths: Sequence[str], sizes: Sequence[int]) -> str:
    """Hash of a listing: the lines ``path<TAB>size``."""
    return hashlib.sha256("\n".join(f"{r}\t{s}" for r, s in zip(paths, sizes)).encode()).hexdigest()


def list_images(src: str | os.PathLike) -> ImageSource:
    """The images of a dataset root or a file list (module docstring); one-line errors when it does not exist
    or holds no images."""
    src = Path(src).expanduser()
    if src.is_dir():
        root, kind = src, "folder"
        rels = _folder_paths(root)
        files = [root / r for r in rels]
    elif src.is_file():
        root, kind = src.parent, "list"
        rels, files = _list_paths(src.read_text(encoding="utf-8").splitlines(), root)
    else:
        raise BadInputError(f"image source {src} does not exist; pass a dataset root with wnid subfolders or a "
                            "file list")
    if not rels:
        raise BadInputError(f"image source {src} holds no images ({', '.join(sorted(IMAGE_EXTENSIONS))})")
    sizes = [f.stat().st_size if f.is_file() else -1 for f in files]
    return ImageSource(root, image_rows(rels), files, sizes, listing_sha256(rels, sizes), kind, src)


# ------------------------------------------------------------------------------------------------ decoding
def decode_image(path: str | os.PathLike, preprocess: Callable, name: str | None = None) -> Decoded:
    """One image file as ``(preprocess(RGB image), '')``, or ``(None, '<ExceptionType>: <message>')`` when it
    cannot be read; the message names the image by ``name`` (its relative path), not by its absolute path.

    A decompression bomb counts as unreadable only inside ``decode_images``, which turns PIL's
    ``DecompressionBombWarning`` into an error for the whole batch.
    """
    try:
        with Image.open(path) as im:
            im.load()
            rgb = im.convert("RGB")
        return preprocess(rgb), ""
    except Exception as e:  # unreadable, truncated, not an image: reported, never fatal
        msg = one_line(e, 300).replace(str(path), str(name if name is not None else path))
        return None, f"{type(e).__name__}: {msg}"


def decode_images(paths: Sequence[str], preprocess: Callable, names: Sequence[str] | None = None,
                  pool: Executor | None = None) -> list[Decoded]:
    """``decode_image`` of each path, in order, on ``pool``'s threads when given (PIL and torch release the
    GIL). PIL's decompression-bomb warning is an error meanwhile (set here, in the calling thread, because
    ``warnings.catch_warnings`` is not thread-safe; the worker threads see the filter)."""
    names = [str(n) for n in (names if names is not None else paths)]
    jobs = list(zip([str(p) for p in paths], names))
    with warnings.catch_warnings():
        warnings.simplefilter("error", Image.DecompressionBombWarning)
        if pool is None or len(jobs) < 2:
            return [decode_image(p, preprocess, n) for p, n in jobs]
        return list(pool.map(lambda job: decode_image(job[0], preprocess, job[1]), jobs))


def collate(items: Sequence[Decoded]) -> tuple[list[int], "torch.Tensor | None", list[tuple[int, str]]]:
    """Decoded items -> (positions of the readable ones, their tensors stacked (or None), [(position, error)]
    of the others)."""
    import torch

    ok = [j for j, (t, _) in enumerate(items) if t is not None]
    bad = [(j, err) for j, (t, err) in enumerate(items) if t is None]
    batch = torch.stack([items[j][0] for j in ok]) if ok else None
    return ok, batch, bad
