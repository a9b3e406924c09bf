"""The tensor side of ``isood.features.decoding``' fast and gpu decoding (``isood extract --decode fast|gpu``).

* ``draft_size``: the size a JPEG is DCT-scaled to at least (PIL ``Image.draft``), DRAFT_MARGIN x the model's
  input, so the antialiased resize that follows still reduces it by >= 2x.
* ``tensor_preprocess``: open_clip's eval transform (Resize / ResizeKeepRatio, CenterCrop / CenterCropOrPad,
  MaybeConvertMode, ToTensor, Normalize) run on a uint8 tensor with the same sizes, interpolation, antialiasing
  and statistics: torch's SIMD uint8 resize instead of PIL's (``bench/decode.py``'s ``tensor`` path). A drafted image (``Drafted``:
  its full size and the extent the full image spans in decoded pixels) is resized by the exact scale the full
  image would be, to the full image's output size, so its pixels land where the reference puts them (mapping
  by the decoded size instead shifts the crop by up to a pixel: ``bench/decode.py``'s naive ``draft`` path).
* ``jpeg_header`` / ``tensor_decodes`` / ``decode_jpeg_bytes``: the JPEGs that are not drafted go straight
  into a tensor with torchvision's ``decode_jpeg``, their size read from the header without PIL.
* ``device_decodes`` / ``decode_jpegs`` / ``TensorPreprocess.batch``: ``isood extract --decode gpu`` (and
  ``isood evaluate --decode gpu``): the JPEGs torchvision can take decoded in ONE ``decode_jpeg`` call per batch
  on the model's device (nvJPEG on CUDA, libjpeg on the CPU), then resized, cropped and normalised there by the
  same tensor steps, images of one size together.
* ``split_preprocess``: a transform cut where its pixels turn into floats: the *head* (decode side: PIL or uint8
  tensor steps, ending in a (3, H, W) uint8 crop) and the *tail* (ToTensor's division by 255 and Normalize, on a
  uint8 batch, where the model is). Decoding processes hand over uint8 crops (a quarter of the float bytes) and
  the tail's element-wise arithmetic is the transform's own, so on the CPU tail(head(image)) equals the
  transform's output to the bit (on CUDA torch divides by a scalar as a product with its reciprocal, which can
  differ in the last bit; AMP's float16 forward is far coarser).
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass
from pathlib import Path
from types import SimpleNamespace
from typing import TYPE_CHECKING, Callable, NamedTuple, Sequence, cast

from PIL import Image

if TYPE_CHECKING:
    import torch

__all__ = ["DRAFT_MARGIN", "Drafted", "draft_size", "pil_to_uint8", "read_jpeg_tensor", "decode_jpeg_bytes",
           "JpegHeader", "jpeg_header", "tensor_decodes", "device_decodes", "decode_jpegs", "resized_size",
           "TensorPreprocess", "tensor_preprocess", "PilHead", "split_preprocess"]

#: ``fast`` drafts a JPEG to at least this times the model's input size (see ``draft_size``).
DRAFT_MARGIN = 2.0


class Drafted(NamedTuple):
    """A JPEG decoded DCT-scaled: its full ``source`` size and the ``extent`` (w, h) the full image spans in
    decoded pixels (``w / s``: the decoded ``ceil(w / s)`` pixels overhang it by less than one)."""

    source: tuple[int, int]
    extent: tuple[float, float]


def read_jpeg_tensor(path: str | os.PathLike) -> "torch.Tensor":
    """A JPEG file as a (3, H, W) uint8 RGB tensor (``decode_jpeg_bytes``)."""
    return decode_jpeg_bytes(Path(path).read_bytes())


def decode_jpeg_bytes(data: bytes) -> "torch.Tensor":
    """JPEG bytes as a (3, H, W) uint8 RGB tensor (torchvision ``decode_jpeg``, grayscale expanded to RGB;
    channels-last in memory, which torch's SIMD resize prefers)."""
    import torch
    import torchvision.io as tio

    x = tio.decode_jpeg(torch.frombuffer(bytearray(data), dtype=torch.uint8), mode=tio.ImageReadMode.RGB)
    return x.permute(1, 2, 0).contiguous().permute(2, 0, 1)


class JpegHeader(NamedTuple):
    """A JPEG's frame header (SOFn): size, colour components, bits per sample, the SOF marker."""

    width: int
    height: int
    components: int
    precision: int
    marker: int


_SOF_MARKERS = frozenset({0xC0, 0xC1, 0xC2, 0xC3, 0xC5, 0xC6, 0xC7, 0xC9, 0xCA, 0xCB, 0xCD, 0xCE, 0xCF})


def jpeg_header(data: bytes) -> JpegHeader | None:
    """The frame header of JPEG ``data`` (markers walked from SOI to the first SOFn), None when ``data`` is no
    JPEG or its header cannot be read before the image data (PIL then decides)."""
    if data[:2] != b"\xff\xd8":
        return None
    i, n = 2, len(data)
    while i + 4 <= n:
        if data[i] != 0xFF:
            return None
        marker = data[i + 1]
        if marker == 0xFF:  # fill byte
            i += 1
            continue
        if marker == 0x01 or 0xD0 <= marker <= 0xD7:  # standalone markers
            i += 2
            continue
        if marker in (0xD9, 0xDA):  # end of image / start of scan before any frame header
            return None
        if marker in _SOF_MARKERS:
            if i + 10 > n:
                return None
            return JpegHeader(int.from_bytes(data[i + 7:i + 9], "big"), int.from_bytes(data[i + 5:i + 7], "big"),
                              data[i + 9], data[i + 4], marker)
        i += 2 + int.from_bytes(data[i + 2:i + 4], "big")
    return None


def tensor_decodes(header: JpegHeader | None, draft: tuple[int, int] | None) -> bool:
    """Whether the fast path decodes a JPEG with torchvision: an 8-bit baseline, extended or progressive
    Huffman JPEG, grayscale or YCbCr/RGB, not a decompression bomb for PIL (``Image.MAX_IMAGE_PIXELS``: PIL
    judges those), and too small to draft (both sides >= 2x ``draft`` go to PIL's DCT-scaled decoding)."""
    if header is None or header.marker not in (0xC0, 0xC1, 0xC2) or header.precision != 8:
        return False
    w, h = header.width, header.height
    if header.components not in (1, 3) or w < 1 or h < 1:
        return False
    if Image.MAX_IMAGE_PIXELS is not None and w * h > Image.MAX_IMAGE_PIXELS:
        return False
    return draft is None or min(w // draft[0], h // draft[1]) < 2


def device_decodes(data: bytes) -> bool:
    """Whether ``--decode gpu`` hands a file's bytes to torchvision's ``decode_jpeg`` on the model's device: a
    JPEG ``tensor_decodes`` takes (8-bit baseline / extended / progressive Huffman, grayscale or YCbCr, not a
    decompression bomb; CMYK, 12-bit, arithmetic-coded and lossless JPEGs are not) whose data ends with the
    end-of-image marker. A file cut short (or with bytes after its image) is left to PIL, which refuses a
    truncated file as the reference does, where nvJPEG may decode what is there."""
    return data[-2:] == b"\xff\xd9" and tensor_decodes(jpeg_header(data), None)


def decode_jpegs(datas: Sequence["torch.Tensor"], device) -> list["torch.Tensor | None"]:
    """JPEG files (1-D uint8 CPU tensors of their bytes) as (3, H, W) uint8 RGB tensors on ``device``, in order:
    ONE torchvision ``decode_jpeg`` call for all of them (nvJPEG's batched decoder on CUDA). That call returns
    nothing when one image fails, so then each image is decoded alone; None where an image cannot be decoded
    on ``device`` (the caller decodes it on the CPU, under the bad-image policy)."""
    import torchvision.io as tio

    if not datas:
        return []
    rgb = tio.ImageReadMode.RGB
    try:
        return list(tio.decode_jpeg(list(datas), mode=rgb, device=device))
    except Exception:  # one bad image fails the batch: find it
        pass
    out: list = []
    for d in datas:
        try:
            out.append(tio.decode_jpeg(d, mode=rgb, device=device))
        except Exception:
            out.append(None)
    return out


def draft_size(preprocess: Callable) -> tuple[int, int] | None:
    """(D, D), D = ceil(DRAFT_MARGIN * S) with S the largest size any step of ``preprocess`` (a torchvision
    ``Compose``) resizes or crops to: a JPEG drafted to at least D x D is still downscaled by >= 2x by the
    antialiased resize afterwards, so the resize, not libjpeg's DCT scaling, sets what survives. None when no
    step names a size (no drafting)."""
    sizes = []
    for t in getattr(preprocess, "transforms", ()):
        size = getattr(t, "size", None)
        sizes += [size] if isinstance(size, int) else [int(v) for v in size or () if isinstance(v, int)]
    if not sizes:
        return None
    d = int(math.ceil(DRAFT_MARGIN * max(sizes)))
    return d, d


def pil_to_uint8(image: Image.Image) -> "torch.Tensor":
    """An RGB PIL image as a (3, H, W) uint8 tensor (channels-last in memory, which torch's SIMD resize of
    uint8 images prefers)."""
    import numpy as np
    import torch

    return torch.from_numpy(np.array(image, dtype=np.uint8, copy=True)).permute(2, 0, 1)


def resized_size(source: tuple[int, int], size: int | Sequence[int], max_size: int | None = None) -> tuple[int, int]:
    """(h, w) torchvision's ``Resize(size, max_size=...)`` makes of an image of ``source`` (w, h): a pair is
    the size itself; one number is the shorter side, the longer one ``int(size * long / short)`` (then capped at
    ``max_size``)."""
    if isinstance(size, Sequence) and len(size) == 2:
        return int(size[0]), int(size[1])
    w, h = source
    short, long = (w, h) if w <= h else (h, w)
    new_short = int(size if isinstance(size, int) else size[0])
    new_long = int(new_short * long / short)
    if max_size is not None and new_long > max_size:
        new_short, new_long = int(max_size * new_short / new_long), int(max_size)
    return (new_long, new_short) if w <= h else (new_short, new_long)


def _interpolate_uint8(x: "torch.Tensor", mode: str, *, size=None, scale=None) -> "torch.Tensor":
    """Antialiased resize of a (C, H, W) or (N, C, H, W) uint8 image to ``size`` (h, w), or by ``scale`` (sy, sx)
    used as given (``recompute_scale_factor=False``), on torch's CPU uint8 kernel where it has one (bicubic;
    bilinear with AVX2/ARM), else (another device, or no such kernel) in float rounded back to uint8, as
    torchvision's resize does."""
    import torch
    from torch.nn.functional import interpolate

    batched = x.dim() == 4
    x4 = x if batched else x.unsqueeze(0)
    if not batched and x4.is_contiguous(memory_format=torch.channels_last):  # keep channels-last (torchvision's trick)
        c, h, w = x.shape
        x4 = x4.as_strided((1, c, h, w), (x.numel(),) + tuple(x4.stride()[1:]))
    native = x.device.type == "cpu" and (
        mode == "bicubic" or torch.backends.cpu.get_cpu_capability() in ("AVX2", "AVX512"))
    y = interpolate(x4 if native else x4.float(), size=size, scale_factor=scale, mode=mode, antialias=True,
                    align_corners=False, recompute_scale_factor=False if scale is not None else None)
    if not native:
        y = y.clamp_(0, 255).round_().to(torch.uint8)
    return y if batched else y[0]


def _resize_to(x: "torch.Tensor", target: tuple[int, int], interpolation, drafted: Drafted | None) -> "torch.Tensor":
    """Resize ``x`` to ``target`` (h, w) as the full image would be: a drafted image is mapped by the exact
    scale target / extent (its overhang beyond the extent cropped off), so its pixels land where the full
    image's do."""
    mode = getattr(interpolation, "value", str(interpolation))
    h, w = int(x.shape[-2]), int(x.shape[-1])
    if drafted is None or (float(drafted.extent[0]), float(drafted.extent[1])) == (float(w), float(h)):
        return x if (h, w) == target else _interpolate_uint8(x, mode, size=list(target))
    scale = (target[0] / drafted.extent[1], target[1] / drafted.extent[0])
    y = _interpolate_uint8(x, mode, scale=scale)
    if y.shape[-2] < target[0] or y.shape[-1] < target[1]:  # rounding left it short: map the pixels as they are
        return _interpolate_uint8(x, mode, size=list(target))
    return y[..., : target[0], : target[1]]


class _ResizeStep:
    """torchvision's ``Resize`` (size, max_size, interpolation; always antialiased, as on PIL images) or
    open_clip's ``ResizeKeepRatio`` (PIL only: it reads ``img.size``), on a uint8 tensor; the output size is that
    of the full image (``drafted.source``) when the image was drafted."""

    def __init__(self, step):
        self.step = step

    def target(self, source: tuple[int, int]) -> tuple[int, int]:
        s = self.step
        if type(s).__name__ == "ResizeKeepRatio":
            shim = SimpleNamespace(size=source)  # get_params reads PIL's (w, h)
            size = s.get_params(shim, s.size, s.longest, s.random_scale_prob, s.random_scale_range,
                                s.random_aspect_prob, s.random_aspect_range)
            return int(size[0]), int(size[1])
        return resized_size(source, s.size, s.max_size)

    def __call__(self, x: "torch.Tensor", drafted: Drafted | None = None) -> "torch.Tensor":
        source = drafted.source if drafted is not None else (int(x.shape[-1]), int(x.shape[-2]))
        return _resize_to(x, self.target(source), self.step.interpolation, drafted)


def _unit_float(x):
    """uint8 tensor -> contiguous float in [0, 1] (what ToTensor does to a PIL image; contiguous first: the
    normalisation of a channels-last float image is 4x slower)."""
    return x.contiguous().float().div_(255.0)


def _tensor_step(t) -> Callable | None:
    """A tensor version of one open_clip eval-transform step (the step itself when torchvision runs it on
    tensors alike), ``_keep`` for a step with nothing to do on an RGB tensor, None for an unknown step."""
    from torchvision import transforms as T

    name = type(t).__name__
    if isinstance(t, T.Resize) or name == "ResizeKeepRatio":
        return _ResizeStep(t)
    if isinstance(t, (T.CenterCrop, T.Normalize)) or name == "CenterCropOrPad":
        return t
    if isinstance(t, T.ToTensor):  # open_clip's MaybeToTensor too
        return _unit_float
    if name == "MaybeConvertMode" and getattr(t, "mode", "RGB") == "RGB":
        return _keep
    return None


def _keep(x):
    return x


@dataclass(frozen=True)
class TensorPreprocess:
    """The steps of an open_clip eval transform run on a uint8 tensor (see ``tensor_preprocess``)."""

    steps: tuple

    def split(self) -> tuple["TensorPreprocess", "TensorPreprocess"] | None:
        """``(head, tail)``: the uint8 steps before the conversion to float, and the conversion and the steps
        after it when they are all element-wise (Normalize); None when a step after it is not (a crop of the
        float image: the head's outputs would not share one size)."""
        from torchvision import transforms as T

        i = self.steps.index(_unit_float)
        tail = self.steps[i:]
        if not all(s is _unit_float or isinstance(s, T.Normalize) for s in tail):
            return None
        return TensorPreprocess(self.steps[:i]), TensorPreprocess(tail)

    @property
    def resizes_first(self) -> bool:
        """Whether the first step resizes (where a drafted image is mapped back onto the full one)."""
        return bool(self.steps) and isinstance(self.steps[0], _ResizeStep)

    def __call__(self, image: "Image.Image | torch.Tensor", drafted: Drafted | None = None) -> "torch.Tensor":
        """An RGB PIL image (or a (3, H, W) uint8 tensor, or (N, 3, H, W) of N images of one size) -> the
        model's float input; ``drafted``: the image was DCT-scaled from ``drafted.source`` (the first resize
        maps it onto the full image's output size)."""
        x = image if not isinstance(image, Image.Image) else pil_to_uint8(image)
        for step in self.steps:
            if isinstance(step, _ResizeStep):
                x, drafted = step(x, drafted), None
            else:
                x = step(x)
        return x.contiguous()

    def batch(self, images: Sequence["torch.Tensor"]) -> "torch.Tensor | None":
        """(3, H, W) uint8 tensors of any sizes, on one device -> their (N, 3, S, S) float inputs there, in
        order (None for none): the images of one size run through the steps together, one resize call each
        (per-image arithmetic: the same values as one image at a time)."""
        import torch

        if not images:
            return None
        groups: dict[tuple[int, ...], list[int]] = {}
        for i, x in enumerate(images):
            groups.setdefault(tuple(x.shape), []).append(i)
        out = None
        for members in groups.values():
            y = self(torch.stack([images[i] for i in members]))
            if out is None:
                out = y.new_empty((len(images), *y.shape[1:]))
            out[torch.as_tensor(members, device=y.device)] = y
        return out


def tensor_preprocess(preprocess: Callable) -> TensorPreprocess | None:
    """``preprocess`` (a torchvision ``Compose`` of open_clip's eval steps: Resize or ResizeKeepRatio, CenterCrop
    or CenterCropOrPad, MaybeConvertMode, ToTensor, Normalize) run on a uint8 tensor of the image, with the same
    sizes, interpolation, antialiasing and statistics (torch's SIMD uint8 resize instead of PIL's); None when it
    holds any other step, or resizes after converting to float."""
    steps: list = []
    for t in getattr(preprocess, "transforms", None) or ():
        step = _tensor_step(t)
        if step is None or (isinstance(step, _ResizeStep) and _unit_float in steps):
            return None
        if step is not _keep:
            steps.append(step)
    if _unit_float not in steps or sum(isinstance(s, _ResizeStep) for s in steps) > 1:
        return None
    return TensorPreprocess(tuple(steps))


@dataclass(frozen=True)
class PilHead:
    """The steps of a transform before its ToTensor, run on an RGB PIL image, ending in the (3, H, W) uint8
    tensor ToTensor makes its floats from (``split_preprocess``)."""

    steps: tuple

    def __call__(self, image: Image.Image) -> "torch.Tensor":
        for step in self.steps:
            image = step(image)
        return pil_to_uint8(image)


def split_preprocess(preprocess: Callable) -> tuple[Callable, TensorPreprocess] | None:
    """``(PIL head, tail)`` of a transform ``tensor_preprocess`` knows whose steps after its ToTensor are only
    Normalize: the head (``PilHead``: the PIL steps, then the uint8 pixels) runs where files are decoded, the
    tail (``TensorPreprocess``: ToTensor's ``float() / 255`` and Normalize, on a (N, 3, H, W) uint8 batch)
    where the model is: the same element-wise arithmetic as the transform, so the same floats on the CPU (module
    docstring for CUDA). None for any other transform (it runs whole where files are decoded)."""
    from torchvision import transforms as T

    steps = tensor_preprocess(preprocess)
    halves = steps.split() if steps is not None else None
    if halves is None:
        return None
    transforms = list(cast("T.Compose", preprocess).transforms)  # tensor_preprocess knew it: a Compose
    k = next(i for i, t in enumerate(transforms) if isinstance(t, T.ToTensor))
    if not all(isinstance(t, T.Normalize) for t in transforms[k + 1:]):
        return None
    return PilHead(tuple(transforms[:k])), halves[1]
