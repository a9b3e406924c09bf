"""Decoding one image file into a model input, with the bad-image policy every extraction follows, and the
decoding modes (the batch pipeline that runs them is ``isood.features.batch_decode``).

* Decoding (``decode_image``): an image that cannot be read (missing, 0 bytes, truncated, not an image, a
  decompression bomb) is never fatal: it yields an error string ``"<ExceptionType>: <message>"`` naming the
  image by its relative path, and the extraction lists it in its ``rejected`` table. A decompression bomb is
  refused from its header, before any pixel is decoded (``check_pixels``: more pixels than PIL's
  ``Image.MAX_IMAGE_PIXELS``, where PIL itself only warns up to twice that). Grayscale, palette, CMYK, RGBA,
  16-bit, 32-bit integer and float images are converted to 8-bit RGB (``to_rgb``: 16-bit values scaled by
  255/65535, where PIL's own conversion clips them at 255; float images by their range, where PIL's makes them
  black; NaN or infinite pixels refused). The decoder reads each file's bytes once and hashes them on the way
  (``Decoded.sha256``): the content keys of feature shards come for free.
* Decoding modes (``isood.features.batch_decode.image_decoder``): ``reference`` (the default) decodes every pixel
  with PIL and runs the model's own preprocessing (open_clip's transform); ``fast`` (``isood extract --decode
  fast``) runs the same transform steps on a uint8 tensor (torch's SIMD antialiased resize instead of PIL's),
  decodes a JPEG whose sides are both >= 4x the model's input DCT-scaled (PIL ``Image.draft``: 1/2, 1/4 or 1/8 of
  each side, never below 2x the input, mapped exactly onto the full image's geometry) and other JPEGs with
  torchvision's ``decode_jpeg``; other formats (PNG, ...) are decoded in full by PIL in both modes
  (``isood.features.image_tensors``). ``gpu`` (``--decode gpu``) reads the files on the CPU and decodes the JPEGs
  torchvision can take (``isood.features.image_tensors.device_decodes``) in ONE ``decode_jpeg`` call per batch on
  the model's device (nvJPEG on CUDA; on a CPU-only machine the same batched code runs on CPU tensors), then
  resizes, crops and normalises them there with the same tensor steps; every other file (PNG, CMYK, 12-bit, cut
  short, one the device decoder refuses) takes the reference path, so the bad-image policy, and the errors, are the
  reference's. The mode is recorded in the features manifest and in every shard key, so modes never mix;
  ``bench/decode.py`` measures the speed and the cosine to the reference features.
"""

from __future__ import annotations

import io
import os
import warnings
from concurrent.futures import Executor
from typing import IO, TYPE_CHECKING, Callable, Sequence

import numpy as np
from PIL import Image

from isood.core.errors import BadInputError, one_line
from isood.core.files import sha256_bytes, sha256_file
from isood.features.image_tensors import Drafted, TensorPreprocess, decode_jpeg_bytes, jpeg_header, tensor_decodes
from isood.features.listing import utf8_text

if TYPE_CHECKING:
    import torch

__all__ = ["REFERENCE_DECODE", "FAST_DECODE", "GPU_DECODE", "DECODE_MODES", "EVALUATE_DECODE_MODES", "Decoded",
           "check_pixels", "to_rgb", "read_rgb", "decode_image", "decode_images", "read_hashed", "each_image",
           "check_decode_mode", "collate"]

#: The default decoding: PIL full decode -> the model's own preprocess. Shift values of reference features are
#: comparable across runs and machines.
REFERENCE_DECODE = "reference"
#: ``--decode fast``: JPEG DCT scaling (PIL draft) or torchvision's JPEG decoder +
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


def read_hashed(path: str | os.PathLike, digest: list[str]) -> bytes | None:
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
        data = read_hashed(path, digest)
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


def each_image(jobs: Sequence, one: Callable, pool: Executor | None) -> list:
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

    return each_image(jobs, one, pool)


def check_decode_mode(mode: str, modes: Sequence[str] = DECODE_MODES) -> str:
    """``mode`` if it is one of ``modes`` (default ``DECODE_MODES``), else a one-line error naming ``--decode``."""
    if mode not in modes:
        raise BadInputError(f"--decode {mode}: unknown decode mode {mode!r}; pass one of {', '.join(modes)}")
    return mode


def collate(items: Sequence[Decoded]) -> tuple[list[int], "torch.Tensor | None", list[tuple[int, str]]]:
    """Decoded items -> (positions of the readable ones, their tensors stacked (or None), [(position, error)]
    of the others)."""
    import torch

    ok = [j for j, (t, _) in enumerate(items) if t is not None]
    bad = [(j, err) for j, (t, err) in enumerate(items) if t is None]
    batch = torch.stack([items[j][0] for j in ok]) if ok else None
    return ok, batch, bad

