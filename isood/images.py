"""L3: image listing and decoding, with the bad-image policy every extraction follows.

* Listing (``list_images``): a dataset root (image files found recursively by extension, hidden files and
  folders skipped) or a file list (one path per line, relative to the list's folder or absolute; blank lines
  and ``#`` comments skipped; duplicates dropped). Paths are sorted; each gets the class
  ``wordnet_tools.wnids.wnid_from_path(path)`` (``''`` when the path names no ImageNet class).
* Decoding (``decode_image``): an image that cannot be read (missing, truncated, not an image, a decompression
  bomb) is never fatal: it yields an error string ``"<ExceptionType>: <message>"`` naming the image by its
  relative path, and the extraction lists it in its ``rejected`` table.
* Decoding modes (``image_decoder``): ``reference`` (the default) decodes every pixel with PIL and runs the
  model's own preprocessing (open_clip's transform); ``fast`` (``isood extract --fast-decode``) runs the same
  transform steps on a uint8 tensor (torch's SIMD antialiased resize instead of PIL's), decodes a JPEG whose
  sides are both >= 4x the model's input DCT-scaled (PIL ``Image.draft``: 1/2, 1/4 or 1/8 of each side, never
  below 2x the input, mapped exactly onto the full image's geometry) and other JPEGs with torchvision's
  ``decode_jpeg``; other formats (PNG, ...) are decoded in full by PIL in both modes (``isood.image_tensors``).
  The mode is recorded in the features manifest and in every shard key, so the two never mix;
  ``bench/decode.py`` measures the speed and the cosine to the reference features.
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
from isood.image_tensors import (Drafted, TensorPreprocess, decode_jpeg_bytes, draft_size, jpeg_header,
                                 tensor_decodes, tensor_preprocess)
from isood.runtime import one_line
from wordnet_tools.wnids import wnid_from_path

if TYPE_CHECKING:
    import torch

__all__ = [
    "IMAGE_EXTENSIONS", "ImageSource", "list_images", "image_rows", "listing_sha256", "decode_image",
    "decode_images", "collate", "REFERENCE_DECODE", "FAST_DECODE", "DECODE_MODES", "ImageDecoder",
    "image_decoder", "check_decode_mode",
]

#: File extensions (lower case) the folder lister takes for images.
IMAGE_EXTENSIONS = frozenset({".jpg", ".jpeg", ".png", ".bmp", ".gif", ".webp", ".tif", ".tiff", ".ppm", ".pgm"})

#: The default decoding: PIL full decode -> the model's own preprocess. Shift values of reference features are
#: comparable across runs and machines.
REFERENCE_DECODE = "reference"
#: ``--fast-decode``: JPEG DCT scaling (PIL draft) or torchvision's JPEG decoder + open_clip's resize, crop and
#: normalise steps on a uint8 tensor.
FAST_DECODE = "fast"
DECODE_MODES = (REFERENCE_DECODE, FAST_DECODE)

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
def decode_image(path: str | os.PathLike, preprocess: Callable, name: str | None = None, *,
                 draft: tuple[int, int] | None = None, jpeg_tensor: bool = False) -> Decoded:
    """One image file as ``(preprocess(RGB image), '')``, or ``(None, '<ExceptionType>: <message>')`` when it
    cannot be read; the message names the image by ``name`` (its relative path), not by its absolute path.

    ``draft`` (w, h): a JPEG is decoded DCT-scaled by the largest of 1/2, 1/4, 1/8 that keeps it at least
    ``draft`` in both sides (PIL ``Image.draft``); other formats ignore it. A ``TensorPreprocess`` is called
    with ``drafted=Drafted(...)`` so that it maps the decoded pixels onto the full image exactly, and with
    ``jpeg_tensor`` gets a JPEG that is not drafted (``isood.image_tensors.tensor_decodes``) as torchvision's
    ``decode_jpeg`` tensor, its size read from the JPEG header (no PIL image in between; what torchvision
    cannot decode goes to PIL, which decides and words the error). A decompression bomb counts as unreadable
    only inside ``decode_images``, which turns PIL's ``DecompressionBombWarning`` into an error for the whole
    batch.
    """
    try:
        return _decode(path, preprocess, draft, jpeg_tensor), ""
    except Exception as e:  # unreadable, truncated, not an image: reported, never fatal
        msg = one_line(e, 300).replace(str(path), str(name if name is not None else path))
        return None, f"{type(e).__name__}: {msg}"


def _decode(path: str | os.PathLike, preprocess: Callable, draft: tuple[int, int] | None,
            jpeg_tensor: bool) -> "torch.Tensor":
    tensor_steps = isinstance(preprocess, TensorPreprocess)
    if jpeg_tensor and tensor_steps:
        data = Path(path).read_bytes()
        if tensor_decodes(jpeg_header(data), draft):
            try:
                return preprocess(decode_jpeg_bytes(data))
            except Exception:  # PIL decides (and words) what torchvision cannot decode
                pass
    with Image.open(path) as im:
        source, box = im.size, None
        if draft is not None:
            box = (im.draft("RGB", draft) or (None, None))[1]
        im.load()
        rgb = im.convert("RGB")
    if box is not None and tensor_steps and rgb.size != source:
        return preprocess(rgb, drafted=Drafted(source, (box[2] - box[0], box[3] - box[1])))
    return preprocess(rgb)


def decode_images(paths: Sequence[str], preprocess: Callable, names: Sequence[str] | None = None,
                  pool: Executor | None = None, *, draft: tuple[int, int] | None = None,
                  jpeg_tensor: bool = False) -> list[Decoded]:
    """``decode_image`` of each path, in order, on ``pool``'s threads when given (PIL and torch release the
    GIL). PIL's decompression-bomb warning is an error meanwhile (set here, in the calling thread, because
    ``warnings.catch_warnings`` is not thread-safe; the worker threads see the filter)."""
    names = [str(n) for n in (names if names is not None else paths)]
    jobs = list(zip([str(p) for p in paths], names))

    def one(job: tuple[str, str]) -> Decoded:
        return decode_image(job[0], preprocess, job[1], draft=draft, jpeg_tensor=jpeg_tensor)

    with warnings.catch_warnings():
        warnings.simplefilter("error", Image.DecompressionBombWarning)
        if pool is None or len(jobs) < 2:
            return [one(job) for job in jobs]
        return list(pool.map(one, jobs))


@dataclass(frozen=True)
class ImageDecoder:
    """How a worker turns image files into model inputs: ``preprocess`` (RGB PIL image -> float tensor),
    ``draft`` and ``jpeg_tensor`` (see ``decode_image``; None / False: every pixel decoded by PIL) and the
    decoding ``mode`` it implements."""

    preprocess: Callable
    draft: tuple[int, int] | None = None
    mode: str = REFERENCE_DECODE
    jpeg_tensor: bool = False

    def decode(self, paths: Sequence[str], names: Sequence[str] | None = None,
               pool: Executor | None = None) -> list[Decoded]:
        """``decode_images`` with this decoder's preprocess, draft and JPEG decoder."""
        return decode_images(paths, self.preprocess, names, pool, draft=self.draft, jpeg_tensor=self.jpeg_tensor)


def check_decode_mode(mode: str) -> str:
    """``mode`` if it is one of ``DECODE_MODES``, else a one-line error."""
    if mode not in DECODE_MODES:
        raise BadInputError(f"unknown decode mode {mode!r}; pass one of {', '.join(DECODE_MODES)}")
    return mode


def image_decoder(preprocess: Callable, mode: str = REFERENCE_DECODE) -> ImageDecoder:
    """The decoder of ``mode`` for a model whose own preprocess is ``preprocess`` (open_clip's eval transform).

    ``reference``: full decode, ``preprocess`` as is. ``fast``: the transform's steps on a uint8 tensor
    (``tensor_preprocess``); JPEGs at least ``draft_size`` x 2 drafted by PIL, other JPEGs decoded by
    torchvision straight into a tensor, other formats by PIL; a transform with a step the tensor version does
    not know is run as the reference runs it (full decode, PIL).
    """
    if check_decode_mode(mode) == REFERENCE_DECODE:
        return ImageDecoder(preprocess)
    steps = tensor_preprocess(preprocess)
    if steps is None:
        return ImageDecoder(preprocess, None, mode)
    draft = draft_size(preprocess) if steps.resizes_first else None  # a drafted image is mapped back there
    return ImageDecoder(steps, draft, mode, jpeg_tensor=True)


def collate(items: Sequence[Decoded]) -> tuple[list[int], "torch.Tensor | None", list[tuple[int, str]]]:
    """Decoded items -> (positions of the readable ones, their tensors stacked (or None), [(position, error)]
    of the others)."""
    import torch

    ok = [j for j, (t, _) in enumerate(items) if t is not None]
    bad = [(j, err) for j, (t, err) in enumerate(items) if t is None]
    batch = torch.stack([items[j][0] for j in ok]) if ok else None
    return ok, batch, bad
