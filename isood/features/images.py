"""Image listing and decoding, with the bad-image policy every extraction follows.

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
* Decoding (``decode_image``): an image that cannot be read (missing, 0 bytes, truncated, not an image, a
  decompression bomb) is never fatal: it yields an error string ``"<ExceptionType>: <message>"`` naming the
  image by its relative path, and the extraction lists it in its ``rejected`` table. A decompression bomb is
  refused from its header, before any pixel is decoded (``check_pixels``: more pixels than PIL's
  ``Image.MAX_IMAGE_PIXELS``, where PIL itself only warns up to twice that). Grayscale, palette, CMYK, RGBA,
  16-bit, 32-bit integer and float images are converted to 8-bit RGB (``to_rgb``: 16-bit values scaled by
  255/65535, where PIL's own conversion clips them at 255; float images by their range, where PIL's makes them
  black; NaN or infinite pixels refused). The decoder reads each file's bytes once and hashes them on the way
  (``Decoded.sha256``): the content keys of feature shards come for free.
* Decoding modes (``image_decoder``): ``reference`` (the default) decodes every pixel with PIL and runs the
  model's own preprocessing (open_clip's transform); ``fast`` (``isood extract --decode fast``, alias
  ``--fast-decode``) runs the same transform steps on a uint8 tensor (torch's SIMD antialiased resize instead of
  PIL's), decodes a JPEG whose sides are both >= 4x the model's input DCT-scaled (PIL ``Image.draft``: 1/2, 1/4
  or 1/8 of each side, never below 2x the input, mapped exactly onto the full image's geometry) and other JPEGs
  with torchvision's ``decode_jpeg``; other formats (PNG, ...) are decoded in full by PIL in both modes
  (``isood.features.image_tensors``). ``gpu`` (``--decode gpu``) reads the files on the CPU and decodes the JPEGs
  torchvision can take (``isood.features.image_tensors.device_decodes``) in ONE ``decode_jpeg`` call per batch on the
  model's device (nvJPEG on CUDA; on a CPU-only machine the same batched code runs on CPU tensors), then resizes,
  crops and normalises them there with the same tensor steps; every other file (PNG, CMYK, 12-bit, cut short,
  one the device decoder refuses) takes the reference path, so the bad-image policy, and the errors, are the
  reference's. The mode is recorded in the features manifest and in every shard key, so modes never mix;
  ``bench/decode.py`` measures the speed and the cosine to the reference features.
* Decoding ahead, in processes (``ImageDecoder.prepare`` / ``finish``, ``prepared_batches``): the CPU part of a
  batch (reading, hashing and, but for the device's JPEGs, decoding up to the uint8 crop) runs in worker
  processes of a torch ``DataLoader`` while the model encodes the batch before; each batch is cut into chunks,
  every chunk prepared by one worker, and the chunks put back together in order, so a batch's tensor, hence its
  features, is the same whatever the number of workers. The device part (``finish``: the device's JPEGs, then
  ToTensor's scaling and Normalize on the whole uint8 batch, ``isood.features.image_tensors.split_preprocess``) runs where
  the model is, with the transform's own arithmetic.
"""

from __future__ import annotations

import hashlib
import io
import math
import os
import warnings
from concurrent.futures import Executor
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, TYPE_CHECKING, Callable, Iterator, NamedTuple, Sequence, cast

import numpy as np
import pandas as pd
from PIL import Image

from isood.core.content import FileStat, stat_files
from isood.core.errors import BadInputError
from isood.core.errors import IsoodError, one_line
from isood.features.image_tensors import (Drafted, TensorPreprocess, decode_jpeg_bytes, decode_jpegs, device_decodes,
                                 draft_size, jpeg_header, split_preprocess, tensor_decodes, tensor_preprocess)
from isood.core.files import sha256_bytes, sha256_file
from isood.core.inputs import check_entry, is_hidden, is_inside, name_problem, resolve_entry
from isood.core.textio import read_lines
from wordnet_tools.wnids import wnid_from_path

if TYPE_CHECKING:
    import torch

__all__ = [
    "IMAGE_EXTENSIONS", "ImageSource", "list_images", "image_rows", "listing_sha256", "decode_image",
    "decode_images", "Decoded", "collate", "REFERENCE_DECODE", "FAST_DECODE", "GPU_DECODE", "DECODE_MODES",
    "EVALUATE_DECODE_MODES", "ImageDecoder", "image_decoder", "check_decode_mode", "PreparedImages",
    "DecodedBatch", "JpegBytes", "device_decode", "place_rows", "prepared_batches", "OutsideRootError",
    "AliasError", "outside_root", "utf8_text", "check_pixels", "to_rgb", "read_rgb",
]

#: File extensions (lower case) the folder lister takes for images.
IMAGE_EXTENSIONS = frozenset({".jpg", ".jpeg", ".png", ".bmp", ".gif", ".webp", ".tif", ".tiff", ".ppm", ".pgm"})

#: The default decoding: PIL full decode -> the model's own preprocess. Shift values of reference features are
#: comparable across runs and machines.
REFERENCE_DECODE = "reference"
#: ``--decode fast`` (alias ``--fast-decode``): JPEG DCT scaling (PIL draft) or torchvision's JPEG decoder +
#: open_clip's resize, crop and normalise steps on a uint8 tensor.
FAST_DECODE = "fast"
#: ``--decode gpu``: the JPEGs decoded in one batched ``decode_jpeg`` call on the model's device (nvJPEG on CUDA),
#: resized, cropped and normalised there; the other files by the reference path.
GPU_DECODE = "gpu"
DECODE_MODES = (REFERENCE_DECODE, FAST_DECODE, GPU_DECODE)
#: The modes ``isood evaluate --decode`` takes (its reference: the classifier's own transform on a PIL image).
EVALUATE_DECODE_MODES = DECODE_MODES

class Decoded(tuple):
    """One decoded image: ``(preprocessed tensor, '')`` or ``(None, error string)``, and ``sha256``: the hex
    SHA-256 of the bytes read ('' when none could be read), which content keys use (``isood.core.content``)."""

    sha256: str

    def __new__(cls, tensor: "torch.Tensor | None", error: str, sha256: str = "") -> "Decoded":
        item = super().__new__(cls, (tensor, error))
        item.sha256 = sha256
        return item

    def __reduce__(self):
        return Decoded, (self[0], self[1], self.sha256)


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


#: Integer grayscale modes holding 16-bit values (PNG, TIFF).
_WIDE_GRAY = frozenset({"I;16", "I;16L", "I;16B", "I;16N"})


def _gray8(values: np.ndarray) -> Image.Image:
    return Image.fromarray(np.clip(np.rint(values), 0, 255).astype(np.uint8), mode="L").convert("RGB")


def _stretched(values: np.ndarray) -> np.ndarray:
    """``values`` mapped linearly from [min, max] onto [0, 255] (a constant image: clipped to [0, 255])."""
    lo, hi = float(values.min()), float(values.max())
    if hi <= lo:
        return np.clip(values, 0.0, 255.0)
    return (values - lo) * (255.0 / (hi - lo))


def to_rgb(im: Image.Image) -> Image.Image:
    """An 8-bit RGB copy of a decoded image.

    * 16-bit grayscale (modes ``I;16*``): scaled by 255/65535 and rounded (PIL's ``convert('RGB')`` clips them
      at 255: a 16-bit image turns white).
    * 32-bit integer (mode ``I``: 16-bit PGM, 32-bit TIFF): values within [0, 65535] are 16-bit samples, scaled
      as above; others are mapped linearly from [min, max] onto [0, 255].
    * float (mode ``F``, e.g. a float TIFF; PIL would clip it to black): values within [0, 1] are scaled by 255,
      values within [0, 255] taken as they are, others mapped linearly from [min, max] onto [0, 255]; an image
      with a NaN or infinite pixel is refused (``ValueError``: a rejected row, not a guess).
    * every other mode (L, LA, P, CMYK, RGBA, 1, ...) by PIL's ``convert('RGB')`` (alpha dropped).
    """
    if im.mode in _WIDE_GRAY:
        return _gray8(np.asarray(im, dtype=np.float64) * (255.0 / 65535.0))
    if im.mode == "I":
        values = np.asarray(im, dtype=np.float64)
        if values.size and (values.min() < 0 or values.max() > 65535):
            return _gray8(_stretched(values))
        return _gray8(values * (255.0 / 65535.0))
    if im.mode == "F":
        values = np.asarray(im, dtype=np.float64)
        if not np.isfinite(values).all():
            raise ValueError(f"a float image (mode F) with {int((~np.isfinite(values)).sum())} NaN or infinite "
                             "pixel value(s); replace them with finite values")
        if not values.size or (values.min() >= 0.0 and values.max() <= 1.0):
            return _gray8(values * 255.0)
        if values.min() >= 0.0 and values.max() <= 255.0:
            return _gray8(values)
        return _gray8(_stretched(values))
    return im if im.mode == "RGB" else im.convert("RGB")


def read_rgb(path: str | os.PathLike | IO[bytes]) -> Image.Image:
    """The 8-bit RGB image of a file (or an open binary file object), every pixel decoded: the size checked on the
    header first (``check_pixels``), then converted by ``to_rgb``. Raises what PIL raises for an unreadable file."""
    with Image.open(path) as im:
        check_pixels(im.size)
        im.load()
        return to_rgb(im)


def decode_image(path: str | os.PathLike, preprocess: Callable, name: str | None = None, *,
                 draft: tuple[int, int] | None = None, jpeg_tensor: bool = False,
                 data: bytes | None = None) -> Decoded:
    """One image file as ``Decoded(preprocess(RGB image), '')``, or ``Decoded(None, '<ExceptionType>: <message>')``
    when it cannot be read; the message names the image by ``name`` (its relative path), not by its absolute
    path. ``.sha256``: the hash of the file's bytes, computed from the bytes the decoder reads anyway (a file is
    read once; one larger than ``_READ_WHOLE`` is hashed as it streams and decoded from disk). ``data``: the
    file's bytes when they were read already (decoded and hashed, the file not read again).

    ``draft`` (w, h): a JPEG is decoded DCT-scaled by the largest of 1/2, 1/4, 1/8 that keeps it at least
    ``draft`` in both sides (PIL ``Image.draft``); other formats ignore it. A ``TensorPreprocess`` is called
    with ``drafted=Drafted(...)`` so that it maps the decoded pixels onto the full image exactly, and with
    ``jpeg_tensor`` gets a JPEG that is not drafted (``isood.features.image_tensors.tensor_decodes``) as torchvision's
    ``decode_jpeg`` tensor, its size read from the JPEG header (no PIL image in between; what torchvision
    cannot decode goes to PIL, which decides and words the error). A decompression bomb is refused from its
    header (``check_pixels``); the image is converted to RGB by ``to_rgb``.
    """
    digest = [""]
    try:
        return Decoded(_decode(path, preprocess, draft, jpeg_tensor, digest, data), "", digest[0])
    except Exception as e:  # unreadable, truncated, not an image: reported, never fatal
        msg = one_line(e, 300).replace(str(path), str(name if name is not None else path))
        return Decoded(None, utf8_text(f"{type(e).__name__}: {msg}"), digest[0])


#: Files up to this size are read into memory once (hashed, then decoded from the bytes); larger ones are hashed
#: as they stream and decoded from disk.
_READ_WHOLE = 64 << 20


class _NamedBytes(io.BytesIO):
    """A file's bytes in memory whose repr is the file's path, so that PIL's messages ('cannot identify image
    file ...') read as they do for a path (and name no memory address)."""

    def __init__(self, data: bytes, path: str) -> None:
        super().__init__(data)
        self.path = path

    def __repr__(self) -> str:
        return repr(self.path)


def _read_hashed(path: str | os.PathLike, digest: list[str]) -> bytes | None:
    """The bytes of ``path`` with their SHA-256 in ``digest[0]``; None (hash only) for a file above
    ``_READ_WHOLE``."""
    with open(path, "rb") as f:
        if os.fstat(f.fileno()).st_size > _READ_WHOLE:
            digest[0] = sha256_file(path)
            return None
        data = f.read()
    digest[0] = sha256_bytes(data)
    return data


def _decode(path: str | os.PathLike, preprocess: Callable, draft: tuple[int, int] | None,
            jpeg_tensor: bool, digest: list[str], given: bytes | None = None) -> "torch.Tensor":
    tensor_steps = isinstance(preprocess, TensorPreprocess)
    data: bytes | None
    if given is not None:
        data = given
        digest[0] = sha256_bytes(given)
    else:
        data = _read_hashed(path, digest)
    if data is not None and jpeg_tensor and tensor_steps:
        if tensor_decodes(jpeg_header(data), draft):
            try:
                return preprocess(decode_jpeg_bytes(data))
            except Exception:  # PIL decides (and words) what torchvision cannot decode
                pass
    with Image.open(_NamedBytes(data, str(path)) if data is not None else path) as im:
        check_pixels(im.size)  # a decompression bomb: refused from its header, nothing decoded
        source, box = im.size, None
        if draft is not None:
            box = (im.draft("RGB", draft) or (None, None))[1]
        im.load()
        rgb = to_rgb(im)
    if box is not None and tensor_steps and rgb.size != source:
        return preprocess(rgb, drafted=Drafted(source, (box[2] - box[0], box[3] - box[1])))
    return preprocess(rgb)


def _each(jobs: Sequence, one: Callable, pool: Executor | None) -> list:
    """``one(job)`` of each job, in order, on ``pool``'s threads when given, PIL's decompression-bomb warning
    silenced meanwhile (``check_pixels`` refuses those images itself; set here, in the calling thread, because
    ``warnings.catch_warnings`` is not thread-safe; the worker threads see the filter)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", Image.DecompressionBombWarning)
        if pool is None or len(jobs) < 2:
            return [one(job) for job in jobs]
        return list(pool.map(one, jobs))


def decode_images(paths: Sequence[str], preprocess: Callable, names: Sequence[str] | None = None,
                  pool: Executor | None = None, *, draft: tuple[int, int] | None = None,
                  jpeg_tensor: bool = False) -> list[Decoded]:
    """``decode_image`` of each path, in order, on ``pool``'s threads when given (PIL and torch release the
    GIL), PIL's decompression-bomb warning silenced (``check_pixels`` refuses those images)."""
    names = [str(n) for n in (names if names is not None else paths)]
    jobs = list(zip([str(p) for p in paths], names))

    def one(job: tuple[str, str]) -> Decoded:
        return decode_image(job[0], preprocess, job[1], draft=draft, jpeg_tensor=jpeg_tensor)

    return _each(jobs, one, pool)


class JpegBytes(NamedTuple):
    """A JPEG file's bytes left to the device decoder (``--decode gpu``) and their SHA-256."""

    data: bytes
    sha256: str = ""


@dataclass
class PreparedImages:
    """The CPU part of decoding a run of images (``ImageDecoder.prepare``; what a decoding process hands back):
    per position its ``errors`` ('' when readable so far) and content ``hashes``; ``cpu`` (k, C, H, W) float:
    the images decoded on the CPU, at positions ``cpu_pos``; ``jpeg``: the bytes of the JPEGs left to the device
    decoder (``--decode gpu``), concatenated (one tensor: one transfer), at positions ``jpeg_pos``, of lengths
    ``jpeg_len``."""

    errors: list[str]
    hashes: list[str]
    cpu_pos: list[int] = field(default_factory=list)
    cpu: "torch.Tensor | None" = None
    jpeg_pos: list[int] = field(default_factory=list)
    jpeg_len: list[int] = field(default_factory=list)
    jpeg: "torch.Tensor | None" = None

    def __len__(self) -> int:
        return len(self.errors)

    @classmethod
    def of(cls, items: Sequence["Decoded | JpegBytes"]) -> "PreparedImages":
        """Per-image results (``Decoded``, or ``JpegBytes`` for the device) as one ``PreparedImages``."""
        import torch

        out = cls([""] * len(items), [getattr(it, "sha256", "") for it in items])
        tensors, datas = [], []
        for j, it in enumerate(items):
            if isinstance(it, JpegBytes):
                out.jpeg_pos.append(j)
                out.jpeg_len.append(len(it.data))
                datas.append(it.data)
            elif it[0] is None:
                out.errors[j] = it[1]
            else:
                out.cpu_pos.append(j)
                tensors.append(it[0])
        out.cpu = torch.stack(tensors) if tensors else None
        out.jpeg = torch.frombuffer(bytearray(b"".join(datas)), dtype=torch.uint8) if datas else None
        return out

    def jpegs(self) -> list["torch.Tensor"]:
        """The JPEG files left to the device, one 1-D uint8 tensor each (views of ``jpeg``)."""
        import torch

        return list(torch.split(self.jpeg, self.jpeg_len)) if self.jpeg is not None else []


class DecodedBatch(NamedTuple):
    """A batch decoded to the model's input (``ImageDecoder.finish``): ``ok`` (positions of the readable
    images, ascending), ``tensor`` (their inputs stacked, on the model's device; None when there is none),
    ``errors`` and ``hashes`` (per position; '' when readable / when nothing was read)."""

    ok: list[int]
    tensor: "torch.Tensor | None"
    errors: list[str]
    hashes: list[str]


def device_decode(datas: Sequence["torch.Tensor"], steps: TensorPreprocess,
                  device) -> tuple[list[int], "torch.Tensor | None"]:
    """JPEG files (1-D uint8 CPU tensors of their bytes) decoded on ``device`` in one batched call
    (``isood.features.image_tensors.decode_jpegs``: nvJPEG on CUDA) and run through ``steps`` there:
    ``(indices decoded, their (k, C, S, S) inputs)``; the caller takes the others the CPU way."""
    decoded = decode_jpegs(datas, device)
    done = [k for k, x in enumerate(decoded) if x is not None]
    return done, steps.batch([x for x in decoded if x is not None])


def place_rows(n: int, pieces: Sequence[tuple[Sequence[int], "torch.Tensor | None"]],
               device) -> "torch.Tensor | None":
    """An (n, ...) tensor on ``device`` whose rows ``positions`` are each piece's rows (``pieces``:
    ``(positions, tensor)`` covering 0..n-1 together); a single piece covering them in order is moved as it is."""
    import torch

    kept: list[tuple[list[int], "torch.Tensor"]] = []
    for pos, t in pieces:
        if len(pos):
            assert t is not None, "a piece with positions has their tensor"
            kept.append((list(pos), t))
    if not n or not kept:
        return None
    if len(kept) == 1 and kept[0][0] == list(range(n)):
        return kept[0][1].to(device)
    first = kept[0][1]
    out = torch.empty((n, *first.shape[1:]), dtype=first.dtype, device=device)
    for pos, t in kept:
        out[torch.as_tensor(pos, device=device)] = t.to(device)
    return out


@dataclass(frozen=True)
class ImageDecoder:
    """How a worker turns image files into model inputs: ``preprocess`` (RGB PIL image -> its model input, or
    with a ``tail``, the uint8 crop the tail takes), ``draft`` and ``jpeg_tensor`` (see ``decode_image``; None /
    False: every pixel decoded by PIL), the decoding ``mode`` it implements, for ``gpu`` ``device_steps`` (the
    tensor steps run on the model's device after the batched ``decode_jpeg``; None: every file takes
    ``preprocess`` on the CPU) and ``tail`` (run on the whole batch where the model is; None: nothing left).

    ``prepare`` (the CPU part: read, hash, decode what the CPU decodes) and ``finish`` (the device part, where
    the model is) split ``decode`` so that the first can run in other processes, ahead of the model."""

    preprocess: Callable
    draft: tuple[int, int] | None = None
    mode: str = REFERENCE_DECODE
    jpeg_tensor: bool = False
    device_steps: TensorPreprocess | None = None
    tail: TensorPreprocess | None = None

    def decode(self, paths: Sequence[str], names: Sequence[str] | None = None,
               pool: Executor | None = None) -> list[Decoded]:
        """Each file as a ``Decoded`` (its model input on the CPU, or its error), in order: ``prepare`` +
        ``finish`` on the CPU."""
        names = [str(n) for n in (names if names is not None else paths)]
        got = self.finish([self.prepare(paths, names, pool)], names, "cpu")
        rows = dict(zip(got.ok, got.tensor)) if got.tensor is not None else {}
        return [Decoded(rows.get(j), got.errors[j], got.hashes[j]) for j in range(len(names))]

    def prepare(self, paths: Sequence[str], names: Sequence[str] | None = None,
                pool: Executor | None = None) -> PreparedImages:
        """The CPU part of decoding ``paths`` (on ``pool``'s threads when given): every file read and hashed;
        the JPEGs the device decodes (``gpu``: ``device_decodes``) kept as bytes, every other file decoded to
        its model input (``decode_image``) or rejected with its error."""
        names = [str(n) for n in (names if names is not None else paths)]
        jobs = list(zip([str(p) for p in paths], names))
        if self.device_steps is None:
            return PreparedImages.of(_each(jobs, lambda job: decode_image(
                job[0], self.preprocess, job[1], draft=self.draft, jpeg_tensor=self.jpeg_tensor), pool))
        return PreparedImages.of(_each(jobs, self._read_one, pool))

    def _read_one(self, job: tuple[str, str]) -> "Decoded | JpegBytes":
        path, name = job
        digest = [""]
        try:
            data = _read_hashed(path, digest)
        except Exception:  # missing, unreadable: the reference words the error
            return decode_image(path, self.preprocess, name)
        if data is not None and device_decodes(data):
            return JpegBytes(data, digest[0])
        if data is None:  # too large to hold: decoded from disk, as the reference does
            return decode_image(path, self.preprocess, name)
        return decode_image(path, self.preprocess, name, data=data)

    def finish(self, parts: Sequence[PreparedImages], names: Sequence[str], device) -> DecodedBatch:
        """The batch of ``parts`` (prepared in order; ``names``: the relative paths of all their positions)
        on ``device``: the JPEGs left to the device decoded there in one call and run through ``device_steps``
        (``device_decode``), a JPEG it cannot decode taken by the reference path on the CPU (its error, if any,
        the reference's), every row placed at its position, then the ``tail`` run on the batch."""
        errors: list[str] = []
        hashes: list[str] = []
        pieces: list[tuple[list[int], "torch.Tensor | None"]] = []
        jpegs: list["torch.Tensor"] = []
        jpeg_at: list[int] = []
        for part in parts:
            base = len(errors)
            errors += part.errors
            hashes += part.hashes
            if part.cpu is not None:
                pieces.append(([base + j for j in part.cpu_pos], part.cpu))
            jpegs += part.jpegs()
            jpeg_at += [base + j for j in part.jpeg_pos]
        if jpegs:
            assert self.device_steps is not None, "prepare leaves JPEGs to the device only in gpu mode"
            done, tensor = device_decode(jpegs, self.device_steps, device)
            pieces.append(([jpeg_at[k] for k in done], tensor))
            taken = set(done)
            again = []
            for k in (k for k in range(len(jpegs)) if k not in taken):
                p = jpeg_at[k]
                item = decode_image(names[p], self.preprocess, names[p], data=jpegs[k].numpy().tobytes())
                if item[0] is None:
                    errors[p] = item[1]
                else:
                    again.append((p, item[0]))
            if again:
                import torch

                pieces.append(([p for p, _ in again], torch.stack([t for _, t in again])))
        ok = [p for p in range(len(errors)) if not errors[p]]
        rank = {p: r for r, p in enumerate(ok)}
        tensor = place_rows(len(ok), [([rank[p] for p in pos], t) for pos, t in pieces], device)
        if tensor is not None and self.tail is not None:
            tensor = self.tail(tensor)
        return DecodedBatch(ok, tensor, errors, hashes)


def check_decode_mode(mode: str, modes: Sequence[str] = DECODE_MODES) -> str:
    """``mode`` if it is one of ``modes`` (default ``DECODE_MODES``), else a one-line error naming ``--decode``."""
    if mode not in modes:
        raise BadInputError(f"--decode {mode}: unknown decode mode {mode!r}; pass one of {', '.join(modes)}")
    return mode


def image_decoder(preprocess: Callable, mode: str = REFERENCE_DECODE) -> ImageDecoder:
    """The decoder of ``mode`` for a model whose own preprocess is ``preprocess`` (open_clip's eval transform).

    ``reference``: full decode, ``preprocess`` as is. ``fast``: the transform's steps on a uint8 tensor
    (``tensor_preprocess``); JPEGs at least ``draft_size`` x 2 drafted by PIL, other JPEGs decoded by
    torchvision straight into a tensor, other formats by PIL; a transform with a step the tensor version does
    not know is run as the reference runs it (full decode, PIL). ``gpu``: the JPEGs the device decoder takes
    decoded on the model's device and run through the tensor steps there, every other file by the reference
    path (a transform the tensor steps do not know: every file by the reference path).

    Where the transform ends in ToTensor + Normalize (``isood.features.image_tensors.split_preprocess``; open_clip's and
    timm's do), the decoding side stops at the uint8 crop and the ``tail`` (the division by 255 and Normalize,
    the transform's own arithmetic) runs on the batch where the model is.
    """
    check_decode_mode(mode)
    split = split_preprocess(preprocess)
    head, tail = split if split is not None else (preprocess, None)
    if mode == REFERENCE_DECODE:
        return ImageDecoder(head, tail=tail)
    steps = tensor_preprocess(preprocess)
    if steps is None:
        return ImageDecoder(preprocess, None, mode)
    if split is not None:
        halves = steps.split()
        assert halves is not None, "split_preprocess found the transform's ToTensor + Normalize tail"
        steps = halves[0]  # the uint8 steps; the tail finishes them
    if mode == GPU_DECODE:
        return ImageDecoder(head, None, mode, device_steps=steps, tail=tail)
    draft = draft_size(preprocess) if steps.resizes_first else None  # a drafted image is mapped back there
    return ImageDecoder(steps, draft, mode, jpeg_tensor=True, tail=tail)


def collate(items: Sequence[Decoded]) -> tuple[list[int], "torch.Tensor | None", list[tuple[int, str]]]:
    """Decoded items -> (positions of the readable ones, their tensors stacked (or None), [(position, error)]
    of the others)."""
    import torch

    ok = [j for j, (t, _) in enumerate(items) if t is not None]
    bad = [(j, err) for j, (t, err) in enumerate(items) if t is None]
    batch = torch.stack([items[j][0] for j in ok]) if ok else None
    return ok, batch, bad


# ------------------------------------------------------------------------------------------------ processes
class _Chunks:
    """The chunks of ``prepared_batches`` as a map-style dataset: item k = ``decoder.prepare`` of chunk k."""

    def __init__(self, decoder: ImageDecoder, chunks: Sequence[tuple[list[str], list[str]]]) -> None:
        self.decoder, self.chunks = decoder, list(chunks)

    def __len__(self) -> int:
        return len(self.chunks)

    def __getitem__(self, k: int) -> PreparedImages:
        paths, names = self.chunks[k]
        return self.decoder.prepare(paths, names)


def _as_is(item):
    return item


#: Least images per chunk a decoding process prepares at a time (fewer: the hand-over costs more than it saves).
MIN_CHUNK = 8


def prepared_batches(decoder: ImageDecoder, batches: Sequence[tuple[Sequence[str], Sequence[str]]],
                     workers: int) -> Iterator[list[PreparedImages]]:
    """``decoder.prepare`` of each batch ``(paths, names)``, in order, as a list of chunks (together: the batch's
    positions in order), prepared by ``workers`` processes of a torch ``DataLoader`` (0: in this process, when
    each batch is asked for). Each batch is cut into about ``workers`` chunks of at least ``MIN_CHUNK`` images,
    every chunk prepared by one process; the processes run ahead of the caller (two chunks each), so the CPU part
    of the next batches overlaps the model's work on this one. The numbers do not depend on ``workers``."""
    from torch.utils.data import DataLoader, Dataset

    workers = max(0, int(workers))
    chunks, counts = [], []
    for paths, names in batches:
        paths, names = [str(p) for p in paths], [str(n) for n in names]
        size = max(MIN_CHUNK, math.ceil(len(paths) / workers)) if workers else max(1, len(paths))
        starts = range(0, len(paths), size) if paths else [0]
        chunks += [(paths[s:s + size], names[s:s + size]) for s in starts]
        counts.append(len(starts))
    # a map-style dataset (__len__ / __getitem__) is what DataLoader takes; _Chunks is one without torch at import
    loader = DataLoader(cast("Dataset[PreparedImages]", _Chunks(decoder, chunks)), batch_size=None, shuffle=False,
                        num_workers=workers, collate_fn=_as_is)
    it = iter(loader)
    try:
        for count in counts:
            try:
                yield [next(it) for _ in range(count)]
            except RuntimeError as e:  # a decoding process died (killed, out of memory)
                if "DataLoader worker" not in str(e):
                    raise
                raise IsoodError(f"an image-decoding process stopped ({one_line(e, 160)}); rerun to resume, with "
                                 "fewer --workers if memory ran out") from None
    finally:
        del it
