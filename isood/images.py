"""L3: image listing and decoding, with the bad-image policy every extraction follows.

* Listing (``list_images``): a dataset root (image files found recursively by extension, hidden files and
  folders skipped, symlinked folders followed, each real folder listed once, broken links listed so that they
  are rejected, not skipped) or a file list (one path per line, relative to the list's folder or absolute;
  blank lines and ``#`` comments skipped; duplicates dropped, also when written differently: ``./a.png``,
  ``a/../a.png``, the absolute path). Paths are sorted; each gets the class
  ``wordnet_tools.wnids.wnid_from_path(path)`` (``''`` when the path names no ImageNet class).
* Symlinks: the relative paths a manifest records promise files inside the image root. A listed file whose real
  location (symlinks resolved) lies outside the root is therefore refused (``ImageSource.refused``, listed in the
  extraction's ``rejected`` table with ``OutsideRootError`` and the location) unless the caller opts in with
  ``follow_symlinks=True`` (``isood extract --follow-symlinks``). Links that stay inside the root are read. A
  file list's absolute entries (and relative ones leading out with ``..``) are recorded by their absolute path,
  so they promise nothing about the root and are read as given.
* Decoding (``decode_image``): an image that cannot be read (missing, 0 bytes, truncated, not an image, a
  decompression bomb) is never fatal: it yields an error string ``"<ExceptionType>: <message>"`` naming the
  image by its relative path, and the extraction lists it in its ``rejected`` table. A decompression bomb is
  refused from its header, before any pixel is decoded (``check_pixels``: more pixels than PIL's
  ``Image.MAX_IMAGE_PIXELS``, where PIL itself only warns up to twice that). Grayscale, palette, CMYK, RGBA and
  16-bit images are converted to 8-bit RGB (``to_rgb``: 16-bit values scaled by 255/65535, where PIL's own
  conversion clips them at 255).
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
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Callable, Sequence

import numpy as np
import pandas as pd
from PIL import Image

from isood.errors import BadInputError
from isood.image_tensors import (Drafted, TensorPreprocess, decode_jpeg_bytes, draft_size, jpeg_header,
                                 tensor_decodes, tensor_preprocess)
from isood.runtime import one_line
from isood.textio import read_lines
from manifests.paths import is_inside
from wordnet_tools.wnids import wnid_from_path

if TYPE_CHECKING:
    import torch

__all__ = [
    "IMAGE_EXTENSIONS", "ImageSource", "list_images", "image_rows", "listing_sha256", "decode_image",
    "decode_images", "collate", "REFERENCE_DECODE", "FAST_DECODE", "DECODE_MODES", "ImageDecoder",
    "image_decoder", "check_decode_mode", "OutsideRootError", "outside_root", "check_pixels", "to_rgb", "read_rgb",
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
    of the 'path<TAB>size' lines), ``kind`` ('folder' or 'list'), ``source`` (what the user passed) and
    ``refused`` (per file: '' or why it is not read, e.g. a symlink leading outside the root; module docstring),
    ``follow_symlinks`` (whether such links were opted in)."""

    root: Path
    table: pd.DataFrame
    files: list[Path]
    sizes: list[int]
    listing_sha256: str
    kind: str
    source: Path
    refused: list[str] = field(default_factory=list)
    follow_symlinks: bool = False


class OutsideRootError(OSError):
    """A listed image whose real location (symlinks resolved) lies outside the image root."""


def _image_name(name: str) -> bool:
    return not name.startswith(".") and os.path.splitext(name)[1].lower() in IMAGE_EXTENSIONS


def _folder_paths(root: Path) -> list[str]:
    """Relative posix paths of the image files under ``root``, sorted: hidden files and folders skipped,
    symlinked folders followed (a real folder reached twice, e.g. by a link cycle, is listed once), broken links
    kept (they are rejected when read, not silently dropped)."""
    seen: set[str] = set()
    rels = []
    for folder, dirs, names in os.walk(root, followlinks=True):
        real = os.path.realpath(folder)
        if real in seen:
            dirs[:] = []
            continue
        seen.add(real)
        dirs[:] = sorted(d for d in dirs if not d.startswith("."))  # sorted: the first of two aliases wins
        rel = Path(folder).relative_to(root).as_posix()
        prefix = "" if rel == "." else rel + "/"
        rels += [prefix + n for n in names if _image_name(n)]
    return sorted(rels)


def _list_paths(lines: Sequence[str], root: Path) -> tuple[list[str], list[Path]]:
    """The entries of a file list: (relative-or-absolute posix paths, absolute files), first occurrence kept,
    sorted by path. Paths are normalised (``./``, ``a/..``); one leading out of ``root`` is kept absolute."""
    seen: set[str] = set()
    rels, files = [], []
    for raw in lines:
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        p = Path(line).expanduser()
        p = Path(os.path.normpath(p if p.is_absolute() else root / p))
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


def outside_root(root: str | os.PathLike, rels: Sequence[str], files: Sequence[str | os.PathLike]) -> list[str]:
    """For each listed file: '' when its real location (symlinks resolved) is inside ``root`` (or its path is
    absolute: a file list's entry taken as given), else that real location. Each folder is resolved once."""
    real_root = os.path.realpath(root)
    folders: dict[str, str] = {}
    out = []
    for rel, f in zip(rels, files):
        if os.path.isabs(rel):
            out.append("")
            continue
        f = os.fspath(f)
        parent, name = os.path.split(f)
        real_parent = folders.get(parent)
        if real_parent is None:
            real_parent = folders[parent] = os.path.realpath(parent)
        real = os.path.realpath(f) if os.path.islink(f) else os.path.join(real_parent, name)
        out.append("" if is_inside(real, real_root) else real)
    return out


def _refusals(root: Path, rels: Sequence[str], files: Sequence[Path], follow_symlinks: bool) -> list[str]:
    """Why each file is not read ('' when it is): outside the root, unless ``follow_symlinks``."""
    if follow_symlinks:
        return [""] * len(rels)
    return [f"OutsideRootError: {rel} resolves to {real}, outside the image root {root}; pass --follow-symlinks "
            "to read it" if real else "" for rel, real in zip(rels, outside_root(root, rels, files))]


def _read_list(src: Path) -> list[str]:
    return read_lines(src, what="image list")


def list_images(src: str | os.PathLike, *, follow_symlinks: bool = False) -> ImageSource:
    """The images of a dataset root or a file list (module docstring); one-line errors when it does not exist
    or holds no images. ``follow_symlinks``: read files whose links lead outside the root too (module
    docstring); by default they are listed as ``refused``."""
    src = Path(src).expanduser()
    if src.is_dir():
        root, kind = src, "folder"
        rels = _folder_paths(root)
        files = [root / r for r in rels]
    elif src.is_file():
        root, kind = src.parent, "list"
        rels, files = _list_paths(_read_list(src), root)
    else:
        raise BadInputError(f"image source {src} does not exist; pass a dataset root with wnid subfolders or a "
                            "file list")
    if not rels:
        raise BadInputError(f"image source {src} holds no images ({', '.join(sorted(IMAGE_EXTENSIONS))}); pass a "
                            "folder or file list with at least one image")
    sizes = [f.stat().st_size if f.is_file() else -1 for f in files]
    return ImageSource(root, image_rows(rels), files, sizes, listing_sha256(rels, sizes), kind, src,
                       _refusals(root, rels, files, follow_symlinks), bool(follow_symlinks))


# ------------------------------------------------------------------------------------------------ decoding
def check_pixels(size: tuple[int, int]) -> None:
    """A ``PIL.Image.DecompressionBombError`` when an image of ``size`` (w, h) has more pixels than
    ``PIL.Image.MAX_IMAGE_PIXELS`` (None: no limit). Called on the header, before any pixel is decoded: PIL
    raises only above twice the limit and merely warns between, after which it would decode the image."""
    limit = Image.MAX_IMAGE_PIXELS
    w, h = size
    if limit is not None and w * h > limit:
        raise Image.DecompressionBombError(f"{w}x{h} = {w * h} pixels exceed the limit of {limit} "
                                           "(PIL.Image.MAX_IMAGE_PIXELS); not decoded")


#: Integer grayscale modes holding 16-bit values (PNG, TIFF, PGM with maxval 65535).
_WIDE_GRAY = frozenset({"I", "I;16", "I;16L", "I;16B", "I;16N"})


def to_rgb(im: Image.Image) -> Image.Image:
    """An 8-bit RGB copy of a decoded image: 16-bit grayscale (modes ``I;16*`` and ``I``) scaled by 255/65535
    and rounded (PIL's ``convert('RGB')`` clips them at 255: a 16-bit image turns white), every other mode
    (L, LA, P, CMYK, RGBA, 1, ...) by PIL's ``convert('RGB')`` (alpha dropped)."""
    if im.mode in _WIDE_GRAY:
        values = np.asarray(im, dtype=np.float64)
        gray = np.clip(np.rint(values * (255.0 / 65535.0)), 0, 255).astype(np.uint8)
        return Image.fromarray(gray, mode="L").convert("RGB")
    return im if im.mode == "RGB" else im.convert("RGB")


def read_rgb(path: str | os.PathLike) -> Image.Image:
    """The 8-bit RGB image of a file, every pixel decoded: the size checked on the header first
    (``check_pixels``), then converted by ``to_rgb``. Raises what PIL raises for an unreadable file."""
    with Image.open(path) as im:
        check_pixels(im.size)
        im.load()
        return to_rgb(im)


def decode_image(path: str | os.PathLike, preprocess: Callable, name: str | None = None, *,
                 draft: tuple[int, int] | None = None, jpeg_tensor: bool = False) -> Decoded:
    """One image file as ``(preprocess(RGB image), '')``, or ``(None, '<ExceptionType>: <message>')`` when it
    cannot be read; the message names the image by ``name`` (its relative path), not by its absolute path.

    ``draft`` (w, h): a JPEG is decoded DCT-scaled by the largest of 1/2, 1/4, 1/8 that keeps it at least
    ``draft`` in both sides (PIL ``Image.draft``); other formats ignore it. A ``TensorPreprocess`` is called
    with ``drafted=Drafted(...)`` so that it maps the decoded pixels onto the full image exactly, and with
    ``jpeg_tensor`` gets a JPEG that is not drafted (``isood.image_tensors.tensor_decodes``) as torchvision's
    ``decode_jpeg`` tensor, its size read from the JPEG header (no PIL image in between; what torchvision
    cannot decode goes to PIL, which decides and words the error). A decompression bomb is refused from its
    header (``check_pixels``); the image is converted to RGB by ``to_rgb``.
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
        check_pixels(im.size)  # a decompression bomb: refused from its header, nothing decoded
        source, box = im.size, None
        if draft is not None:
            box = (im.draft("RGB", draft) or (None, None))[1]
        im.load()
        rgb = to_rgb(im)
    if box is not None and tensor_steps and rgb.size != source:
        return preprocess(rgb, drafted=Drafted(source, (box[2] - box[0], box[3] - box[1])))
    return preprocess(rgb)


def decode_images(paths: Sequence[str], preprocess: Callable, names: Sequence[str] | None = None,
                  pool: Executor | None = None, *, draft: tuple[int, int] | None = None,
                  jpeg_tensor: bool = False) -> list[Decoded]:
    """``decode_image`` of each path, in order, on ``pool``'s threads when given (PIL and torch release the
    GIL). PIL's decompression-bomb warning is silenced meanwhile: ``check_pixels`` refuses those images itself
    (set here, in the calling thread, because ``warnings.catch_warnings`` is not thread-safe; the worker threads
    see the filter)."""
    names = [str(n) for n in (names if names is not None else paths)]
    jobs = list(zip([str(p) for p in paths], names))

    def one(job: tuple[str, str]) -> Decoded:
        return decode_image(job[0], preprocess, job[1], draft=draft, jpeg_tensor=jpeg_tensor)

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", Image.DecompressionBombWarning)
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
