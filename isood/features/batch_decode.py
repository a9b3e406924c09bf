"""The batch decode pipeline of every image-reading pass (``isood extract`` and ``isood evaluate``): the CPU part
of a batch prepared ahead of the model, the device part where the model is (decoding one file, and the modes:
``isood.features.decoding``).

* Decoding ahead, in processes (``ImageDecoder.prepare`` / ``finish``, ``prepared_batches``): the CPU part of a
  batch (reading, hashing and, but for the device's JPEGs, decoding up to the uint8 crop) runs in worker
  processes of a torch ``DataLoader`` while the model encodes the batch before; each batch is cut into chunks,
  every chunk prepared by one worker, and the chunks put back together in order, so a batch's tensor, hence its
  features, is the same whatever the number of workers. The device part (``finish``: the device's JPEGs, then
  ToTensor's scaling and Normalize on the whole uint8 batch, ``isood.features.image_tensors.split_preprocess``)
  runs where the model is, with the transform's own arithmetic.
* ``--decode gpu``: ``ImageDecoder.prepare`` keeps the bytes of the JPEGs the device decoder takes
  (``isood.features.image_tensors.device_decodes``); ``finish`` decodes them in ONE ``decode_jpeg`` call on the
  model's device (``device_decode``), runs the tensor steps there, and takes a JPEG the device refuses by the
  reference path on the CPU (``isood.features.decoding.decode_image``), so its error is the reference's.
"""

from __future__ import annotations

import math
from concurrent.futures import Executor
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Callable, Iterator, NamedTuple, Sequence, cast

from isood.core.errors import IsoodError, one_line
from isood.features.decoding import (GPU_DECODE, REFERENCE_DECODE, Decoded, check_decode_mode, decode_image,
                                     each_image, read_hashed)
from isood.features.image_tensors import (TensorPreprocess, decode_jpegs, device_decodes, draft_size,
                                          split_preprocess, tensor_preprocess)

if TYPE_CHECKING:
    import torch

__all__ = ["ImageDecoder", "image_decoder", "PreparedImages", "DecodedBatch", "JpegBytes", "device_decode",
           "place_rows", "prepared_batches", "MIN_CHUNK"]

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
            return PreparedImages.of(each_image(jobs, lambda job: decode_image(
                job[0], self.preprocess, job[1], draft=self.draft, jpeg_tensor=self.jpeg_tensor), pool))
        return PreparedImages.of(each_image(jobs, self._read_one, pool))

    def _read_one(self, job: tuple[str, str]) -> "Decoded | JpegBytes":
        path, name = job
        digest = [""]
        try:
            data = read_hashed(path, digest)
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
                     processes: int) -> Iterator[list[PreparedImages]]:
    """``decoder.prepare`` of each batch ``(paths, names)``, in order, as a list of chunks (together: the batch's
    positions in order), prepared by ``processes`` processes of a torch ``DataLoader`` (0: in this process, when
    each batch is asked for; ``isood.core.workers.WorkerSpec.decode_processes``). Each batch is cut into about
    ``processes`` chunks of at least ``MIN_CHUNK`` images,
    every chunk prepared by one process; the processes run ahead of the caller (two chunks each), so the CPU part
    of the next batches overlaps the model's work on this one. The numbers do not depend on ``processes``."""
    from torch.utils.data import DataLoader, Dataset

    processes = max(0, int(processes))
    chunks, counts = [], []
    for paths, names in batches:
        paths, names = [str(p) for p in paths], [str(n) for n in names]
        size = max(MIN_CHUNK, math.ceil(len(paths) / processes)) if processes else max(1, len(paths))
        starts = range(0, len(paths), size) if paths else [0]
        chunks += [(paths[s:s + size], names[s:s + size]) for s in starts]
        counts.append(len(starts))
    # a map-style dataset (__len__ / __getitem__) is what DataLoader takes; _Chunks is one without torch at import
    loader = DataLoader(cast("Dataset[PreparedImages]", _Chunks(decoder, chunks)), batch_size=None, shuffle=False,
                        num_workers=processes, collate_fn=_as_is)
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
