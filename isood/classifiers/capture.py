"""Capture what detectors need from a classifier over a dataset, in ONE forward pass per batch, with an
on-disk cache.

``extract_outputs`` captures exactly the requested kinds (logits / features / feature_maps / block3) over a
dataset (batch size, device, DataLoader workers, optional progress bar) and scores the detectors that need the
model on the input (ODIN) on the same batches. With a cache folder the outputs are stored as one safetensors file
per kind and dataset under a key hashing model identity + data identity + preprocessing (``OutputCache``): a
second evaluation with other detectors does no forward pass. The data identity of image files holds their content
(``isood.core.content``: the job keys a list of files by path and content hash), so an image overwritten in place is
a cache miss. A corrupt or truncated cache entry (unreadable, or not one row per image) is a miss too: one
warning line (``isood.core.errors.IsoodWarning``), then recomputed and replaced atomically. ``ImageList`` is the torch
dataset of image files the ``isood evaluate`` job feeds it: an unreadable image does not stop the pass at once;
the pass reads on (without the model) and ends with one ``UnreadableImagesError`` naming every unreadable image
of the dataset (``scan_unreadable`` reads another dataset the same way, so a run names them all).

``isood evaluate --decode gpu``: an ``ImageList`` in the ``gpu`` mode hands the JPEGs the device decoder takes
(``isood.features.image_tensors.device_decodes``) over as bytes; the pass decodes them in one batched call on the model's
device and runs the transform's tensor steps there (``ImageList.finish``, ``isood.features.images.device_decode``); every
other file, and a JPEG the device cannot decode, takes the reference path (PIL + the transform) under the same
unreadable-image policy. ``--precision fp16|bf16``: the passes run under ``torch.autocast`` with the model and its
inputs channels-last (``precision_context``; ODIN's gradients in float32); fp32 (the default) runs the model as
it is. The decoding mode and
the precision are part of the cache key (when not the defaults, so older caches keep their keys).
"""

from __future__ import annotations

import contextlib
import hashlib
import io
import json
import os
import warnings
from pathlib import Path
from typing import Any, Callable, Iterable, Mapping, NamedTuple, Sequence, cast

import numpy as np
import torch

from isood.core.devices import DEFAULT_PRECISION, PRECISIONS
from isood.core.errors import BadInputError, IsoodError, IsoodWarning, one_line
from isood.features.image_tensors import device_decodes, tensor_preprocess
from isood.features.images import (EVALUATE_DECODE_MODES, FAST_DECODE, GPU_DECODE, REFERENCE_DECODE, check_decode_mode,
                          device_decode, image_decoder, place_rows, read_rgb)
from isood.core.files import atomic_write_bytes
from isood.core.progress import track

from isood.science.detectors import CAPTURE_KINDS, ODIN, Detector, ForwardOutputs
from .adapter import ModelAdapter
from .perturbation import odin_scores

__all__ = ["CACHE_VERSION", "OutputCache", "cache_key", "labels_digest", "score_kind", "as_loader", "split_batch",
           "ImageList", "Unreadable", "UnreadableImagesError", "scan_unreadable", "probe_input", "default_transform",
           "check_precision", "precision_context", "extract_outputs"]

CACHE_VERSION = 3  # 2: 16-bit images scaled to 8 bits, bombs refused before decoding; 3: float / 32-bit images
#                     scaled by their range (isood.features.images.to_rgb), image lists keyed by content


# ================================================================================================== data
def as_loader(data, batch_size: int, num_workers: int) -> torch.utils.data.DataLoader:
    """A DataLoader over ``data`` (a Dataset, a DataLoader as is, or an (N, C, H, W) tensor / array); a dataset
    with its own ``collate`` (``ImageList``) batches with it."""
    if isinstance(data, torch.utils.data.DataLoader):
        return data
    if isinstance(data, np.ndarray):
        data = torch.from_numpy(data)
    if isinstance(data, torch.Tensor):
        data = torch.utils.data.TensorDataset(data)
    return torch.utils.data.DataLoader(data, batch_size=batch_size, shuffle=False, num_workers=num_workers,
                                       collate_fn=getattr(data, "collate", None))


def split_batch(batch) -> tuple[torch.Tensor, torch.Tensor | None]:
    """(images, labels or None) from a batch that is a tensor, a (image, label, ...) sequence or a dict."""
    if isinstance(batch, torch.Tensor):
        return batch, None
    if isinstance(batch, Mapping):
        for k in ("image", "pixel_values", "img", "input"):
            if k in batch:
                y = batch.get("label", batch.get("labels"))
                return batch[k], (torch.as_tensor(y) if y is not None else None)
        raise BadInputError(f"batch dict has no image key (image / pixel_values): got {sorted(batch)}")
    if isinstance(batch, (list, tuple)) and batch:
        y = batch[1] if len(batch) > 1 and isinstance(batch[1], torch.Tensor) else None
        return batch[0], y
    raise BadInputError(f"cannot read images from a batch of type {type(batch).__name__}: yield tensors or "
                        "(image, label) pairs")


class Unreadable(NamedTuple):
    """An image that could not be read: its path and ``'<ExceptionType>'``."""

    path: str
    error: str


class UnreadableImagesError(BadInputError):
    """Images of an evaluation could not be read (every image must be scored). One line: the image and its error
    for one; for several their count, the first ``SHOWN`` and the file listing them all (``list_file``)."""

    SHOWN = 3

    def __init__(self, images: Sequence[Unreadable], list_file: str | os.PathLike | None = None) -> None:
        self.images = list(dict.fromkeys(images))
        n = len(self.images)
        if n == 1:
            text = f"cannot read image {self.images[0].path}: {self.images[0].error}: remove or replace it"
        else:
            shown = ", ".join(f"{u.path} ({u.error})" for u in self.images[:self.SHOWN])
            where = f"; all {n} listed in {list_file}" if list_file and n > self.SHOWN else ""
            more = ", ..." if n > self.SHOWN else ""
            text = f"cannot read images: {n} are unreadable ({shown}{more}{where}): remove or replace them"
        super().__init__(text)


class JpegFile(NamedTuple):
    """A JPEG an ``ImageList`` in the ``gpu`` mode leaves to the device decoder: its bytes and its path."""

    data: bytes
    path: str


class ImageList(torch.utils.data.Dataset):
    """A torch dataset of image files: ``(transform(RGB image), label)``, decoded as ``isood.features.images.read_rgb``
    decodes them (a decompression bomb refused from its header, 16-bit images scaled to 8 bits); an unreadable
    file yields ``(Unreadable(path, error), label)`` and ``collate`` sets it apart (batches are dicts: ``image``,
    ``label``, ``unreadable``), so that a pass names every unreadable image (``extract_outputs``).

    ``decode='fast'``: the transform's steps on uint8 tensors, large JPEGs drafted (as ``isood extract --decode
    fast``). ``decode='gpu'`` (``isood.features.images.EVALUATE_DECODE_MODES``): a JPEG the device decoder takes comes as
    ``(JpegFile, label)``; ``collate`` concatenates their bytes (``jpeg``, ``jpeg_len``, at ``jpeg_pos`` among
    the batch's readable images; ``image`` then holds the others, at ``image_pos``) and ``finish`` decodes them
    on the model's device (a transform the tensor steps do not know: every file the reference way)."""

    def __init__(self, files: Sequence[Path], labels: Sequence[int] | np.ndarray, transform: Callable,
                 decode: str = REFERENCE_DECODE) -> None:
        self.files = [Path(f) for f in files]
        self.labels = np.asarray(labels, dtype=np.int64)
        self.transform = transform
        self.decode = check_decode_mode(decode, EVALUATE_DECODE_MODES)
        self.steps = tensor_preprocess(transform) if self.decode == GPU_DECODE else None
        # fast: extract's decoder of that mode (the transform's steps on uint8 tensors, large JPEGs drafted)
        self.fast = image_decoder(transform, FAST_DECODE) if self.decode == FAST_DECODE else None

    def __len__(self) -> int:
        return len(self.files)

    def __getitem__(self, i: int):
        from PIL import Image

        try:
            with warnings.catch_warnings():  # read_rgb refuses what PIL only warns about
                warnings.simplefilter("ignore", Image.DecompressionBombWarning)
                if self.fast is not None:
                    tensor, error = self.fast.decode([str(self.files[i])])[0]
                    if tensor is None:
                        return Unreadable(str(self.files[i]), error.split(":", 1)[0]), int(self.labels[i])
                    return tensor, int(self.labels[i])
                if self.steps is None:
                    img = read_rgb(self.files[i])
                else:
                    data = self.files[i].read_bytes()
                    if device_decodes(data):
                        return JpegFile(data, str(self.files[i])), int(self.labels[i])
                    img = read_rgb(io.BytesIO(data))
        except Exception as e:  # missing, truncated, not an image, a bomb, a decoder's ValueError
            return Unreadable(str(self.files[i]), type(e).__name__), int(self.labels[i])
        return self.transform(img), int(self.labels[i])

    @staticmethod
    def collate(items: Sequence[tuple]) -> dict:
        """A batch of ``__getitem__`` items: the readable images stacked (None when there is none) with their
        labels, and the ``Unreadable`` ones (``gpu``: the JPEGs' bytes apart, see the class docstring)."""
        good = [(x, y) for x, y in items if not isinstance(x, Unreadable)]
        cpu = [(r, x) for r, (x, _) in enumerate(good) if not isinstance(x, JpegFile)]
        batch: dict[str, Any] = {"image": torch.stack([x for _, x in cpu]) if cpu else None,
                 "label": torch.as_tensor([y for _, y in good], dtype=torch.int64),
                 "unreadable": [x for x, _ in items if isinstance(x, Unreadable)]}
        jpegs = [(r, x) for r, (x, _) in enumerate(good) if isinstance(x, JpegFile)]
        if jpegs:
            batch.update(image_pos=[r for r, _ in cpu], jpeg_pos=[r for r, _ in jpegs],
                         jpeg_len=[len(x.data) for _, x in jpegs],
                         jpeg=torch.frombuffer(bytearray(b"".join(x.data for _, x in jpegs)), dtype=torch.uint8),
                         jpeg_path=[x.path for _, x in jpegs])
        return batch

    def finish(self, batch: dict, device) -> dict:
        """A batch with its JPEGs (``gpu``) decoded on ``device`` in one call and run through the transform's
        tensor steps there; a JPEG the device cannot decode is read the reference way (PIL + the transform),
        and named ``Unreadable`` when that fails too. Other batches as they are."""
        if "jpeg" not in batch:
            return batch
        assert self.steps is not None, "collate leaves JPEGs to the device only with decode='gpu' (steps set)"
        datas = list(torch.split(batch["jpeg"], batch["jpeg_len"]))
        done, tensor = device_decode(datas, self.steps, device)
        pieces = [(batch["image_pos"], batch["image"]), ([batch["jpeg_pos"][k] for k in done], tensor)]
        unreadable, failed, again = list(batch["unreadable"]), set(), []
        for k in sorted(set(range(len(datas))) - set(done)):
            r = batch["jpeg_pos"][k]
            try:
                again.append((r, self.transform(read_rgb(io.BytesIO(datas[k].numpy().tobytes())))))
            except Exception as e:  # the reference path cannot read it either
                failed.add(r)
                unreadable.append(Unreadable(batch["jpeg_path"][k], type(e).__name__))
        if again:
            pieces.append(([r for r, _ in again], torch.stack([x for _, x in again])))
        keep = [r for r in range(len(batch["label"])) if r not in failed]
        rank = {r: j for j, r in enumerate(keep)}
        x = place_rows(len(keep), [([rank[r] for r in pos], t) for pos, t in pieces if t is not None and len(pos)],
                       device)
        return {"image": x, "label": batch["label"][keep], "unreadable": unreadable}


def worker_message(error: BaseException) -> str:
    """The one-line message of an error a DataLoader worker raised: torch re-raises it with the worker's whole
    traceback in the message ('Caught X in DataLoader worker process 0. Original Traceback ...'); its last line
    carries the original message."""
    text = str(error)
    if "Original Traceback" not in text:
        return text
    last = [ln for ln in text.strip().splitlines() if ln.strip()][-1]
    head, sep, tail = last.partition(": ")
    return tail if sep and " " not in head else last


def scan_unreadable(data, *, batch_size: int = 64, num_workers: int = 0, desc: str = "reading",
                    progress: bool = False) -> list[Unreadable]:
    """Read every image of ``data`` (no model) and return the unreadable ones (only datasets whose batches
    carry ``unreadable``, i.e. ``ImageList``, can have any)."""
    found: list[Unreadable] = []
    if not hasattr(data, "collate"):
        return found
    loader = as_loader(data, batch_size, num_workers)
    try:
        for batch in track(loader, len(loader), desc, progress):
            if "jpeg" in batch:  # --decode gpu: what the device would take, decoded on the CPU here
                batch = data.finish(batch, "cpu")
            found += batch["unreadable"]
    except IsoodError as e:  # raised in a DataLoader worker: one line, not the worker's traceback
        raise type(e)(worker_message(e)) from None
    return found


def probe_input(data, tries: int = 16) -> torch.Tensor | None:
    """One image of ``data`` as a (1, C, H, W) batch, to check a model before a pass: its first readable item
    among the first ``tries`` (None when there is none)."""
    if isinstance(data, np.ndarray):
        data = torch.from_numpy(data)
    if isinstance(data, torch.Tensor):
        return data[:1] if len(data) else None
    if isinstance(data, torch.utils.data.DataLoader):
        for batch in data:
            x, _ = split_batch(batch)
            return x[:1] if x is not None and len(x) else None
        return None
    for i in range(min(len(data), tries)):
        x, _ = split_batch(data[i])
        if isinstance(x, torch.Tensor):
            return x.unsqueeze(0)
    return None


def default_transform() -> Callable:
    """ImageNet preprocessing (resize 256, centre crop 224, normalise) for models without their own."""
    from torchvision import transforms as T

    return T.Compose([T.Resize(256), T.CenterCrop(224), T.ToTensor(),
                      T.Normalize((0.485, 0.456, 0.406), (0.229, 0.224, 0.225))])


# ============================================================================================== precision
def check_precision(precision: str, device: str | torch.device) -> str:
    """``precision`` if it is one of ``isood.core.devices.PRECISIONS`` and runs on ``device``, else a one-line error
    (float16 autocast is for CUDA; the CPU runs bfloat16)."""
    if precision not in PRECISIONS:
        raise BadInputError(f"--precision {precision}: unknown precision; pass one of {', '.join(PRECISIONS)}")
    if precision == "fp16" and torch.device(device).type != "cuda":
        raise BadInputError(f"--precision fp16 runs on CUDA, not on {torch.device(device).type}: pass --precision "
                            "bf16 (or fp32) on the CPU, or --device cuda")
    return precision


def precision_context(device: str | torch.device, precision: str = DEFAULT_PRECISION):
    """The context the forward passes of ``precision`` run in: nothing for fp32, else ``torch.autocast`` to
    float16 / bfloat16 on ``device``'s type."""
    if precision == DEFAULT_PRECISION:
        return contextlib.nullcontext()
    dtype = {"fp16": torch.float16, "bf16": torch.bfloat16}[precision]
    return torch.autocast(torch.device(device).type, dtype=dtype)


def _channels_last(x: torch.Tensor, precision: str) -> torch.Tensor:
    """An image batch in the memory layout the passes of ``precision`` use (channels-last but for fp32)."""
    if precision == DEFAULT_PRECISION or x.dim() != 4:
        return x
    return x.contiguous(memory_format=torch.channels_last)


# ================================================================================================= cache
def cache_key(model_id: str, data_id: str, preprocess_id: str = "") -> str:
    """Hex key of (model identity, data identity, preprocessing) for the on-disk output cache."""
    h = hashlib.sha256(json.dumps([CACHE_VERSION, model_id, data_id, preprocess_id]).encode())
    return h.hexdigest()[:32]


def labels_digest(labels) -> str:
    """A short hash of a dataset's labels (class indices in the model's order), part of its cache identity: the
    cache stores the labels beside the outputs, so other labels (``--classes``, ``--id-test-labels``, a permuted
    class list) are another entry, never the old labels."""
    if labels is None:
        return "none"
    arr = np.ascontiguousarray(np.asarray(labels, dtype=np.int64))
    return hashlib.blake2b(arr.tobytes(), digest_size=12).hexdigest()


class OutputCache:
    """``<root>/<key>/<kind>.safetensors`` + ``meta.json``; every file is written atomically."""

    def __init__(self, root: str | os.PathLike, key: str, meta: dict) -> None:
        self.dir = Path(root) / key
        self.meta = meta

    def path(self, kind: str) -> Path:
        return self.dir / f"{kind}.safetensors"

    def has(self, kind: str) -> bool:
        return self.path(kind).is_file()

    def load(self, kind: str) -> np.ndarray:
        from safetensors.numpy import load_file

        return load_file(str(self.path(kind)))[kind]

    def get(self, kind: str, rows: int | None = None) -> np.ndarray | None:
        """The cached array of ``kind``, None when there is none. A corrupt entry (unreadable or truncated, or not
        ``rows`` rows when given) is a miss: one ``IsoodWarning`` line, and the caller recomputes it (``save``
        replaces it atomically)."""
        if not self.has(kind):
            return None
        try:
            array = self.load(kind)
            if rows is not None and (array.ndim == 0 or len(array) != rows):
                raise ValueError(f"{array.shape[0] if array.ndim else 0} rows for {rows} images")
        except Exception as e:  # safetensors' own error type, OSError, ValueError: all a miss
            warnings.warn(f"the cached model outputs {self.path(kind)} are unreadable ({type(e).__name__}: "
                          f"{one_line(e, 120)}); recomputing them", IsoodWarning, stacklevel=2)
            return None
        return array

    def save(self, kind: str, array: np.ndarray) -> None:
        from safetensors.numpy import save

        atomic_write_bytes(self.path(kind), save({kind: np.ascontiguousarray(array)}))
        atomic_write_bytes(self.dir / "meta.json", json.dumps(self.meta, indent=1).encode())


def score_kind(detector: Detector, input_std) -> str:
    """Cache name of an input detector's scores: its name + a hash of its parameters and the input std used."""
    std = getattr(detector, "input_std", None) or input_std
    h = hashlib.blake2b(json.dumps([sorted(detector.params().items()), std], default=str).encode(), digest_size=6)
    return f"score.{detector.name}.{h.hexdigest()}"


def _cached_preprocess(preprocess_id: str, data, precision: str) -> str:
    """The preprocessing part of a cache key: ``preprocess_id``, with the dataset's decoding mode
    (``ImageList.decode``) and the precision appended when they are not the defaults (so a default run keeps the
    keys of caches written before the two existed)."""
    decode = getattr(data, "decode", REFERENCE_DECODE)
    return (preprocess_id + (f"|decode={decode}" if decode != REFERENCE_DECODE else "")
            + (f"|precision={precision}" if precision != DEFAULT_PRECISION else ""))


def _open_cache(adapter: ModelAdapter, data, cache_dir, data_id: str | None, preprocess_id: str,
                precision: str = DEFAULT_PRECISION) -> OutputCache:
    """The cache entry of (model, data, preprocessing, decoding mode, precision); tensors / arrays are hashed
    when no ``data_id`` is given."""
    preprocess_id = _cached_preprocess(preprocess_id, data, precision)
    if data_id is None:
        if not isinstance(data, (torch.Tensor, np.ndarray)):
            raise BadInputError("caching needs data_id= a string naming this dataset (e.g. manifest hash + split)")
        arr = data.detach().cpu().numpy() if isinstance(data, torch.Tensor) else np.asarray(data)
        data_id = "array:" + hashlib.blake2b(np.ascontiguousarray(arr).tobytes(), digest_size=16).hexdigest()
    meta = {"model": adapter.identity, "data": data_id, "preprocess": preprocess_id, "version": CACHE_VERSION}
    return OutputCache(cache_dir, cache_key(adapter.identity, data_id, preprocess_id), meta)


# ================================================================================================ extract
def _n_items(data) -> int | None:
    """The number of images ``data`` yields, when it says (a tensor, an array, a sized dataset; None for a
    DataLoader, whose sampler decides)."""
    if isinstance(data, (torch.Tensor, np.ndarray)):
        return int(data.shape[0])
    if isinstance(data, torch.utils.data.DataLoader):
        return None
    try:
        return len(data)
    except TypeError:
        return None


def _cat(parts: list[np.ndarray]) -> np.ndarray:
    if not parts:
        raise BadInputError("the dataset yielded no image: an empty dataset cannot be evaluated")
    return np.concatenate(parts, axis=0)


def _forward_passes(adapter: ModelAdapter, loader, kinds: frozenset[str], inputs: Mapping[str, Detector], *,
                    desc: str, progress: bool,
                    precision: str = DEFAULT_PRECISION) -> tuple[dict[str, np.ndarray], dict[str, np.ndarray]]:
    """One pass over ``loader``: the captured ``kinds`` (+ ``labels`` when the data has them) and the scores of
    the input detectors, concatenated over batches; a batch of JPEGs left to the device (``ImageList.finish``)
    decoded there first; the model run in ``precision`` (``precision_context``)."""
    parts: dict[str, list[np.ndarray]] = {k: [] for k in kinds}
    labels: list[np.ndarray] = []
    scored: dict[str, list[np.ndarray]] = {n: [] for n in inputs}
    unreadable: list[Unreadable] = []
    total = len(loader) if hasattr(loader, "__len__") else None
    finish = getattr(getattr(loader, "dataset", None), "finish", None)
    try:
        for batch in track(loader, total, desc, progress):
            if finish is not None and isinstance(batch, Mapping) and "jpeg" in batch:
                batch = finish(batch, adapter.device)
            if isinstance(batch, Mapping) and "unreadable" in batch:
                unreadable += batch["unreadable"]
            if unreadable:  # this pass fails: read on without the model, to name every unreadable image
                continue
            x, y = split_batch(batch)
            x = _channels_last(x.to(adapter.device), precision)
            if kinds:
                with precision_context(adapter.device, precision):
                    out = adapter.forward(x, kinds)
                for k in kinds:
                    parts[k].append(out[k].detach().float().cpu().numpy())
            for n, d in inputs.items():  # float32 whatever the precision: see extract_outputs
                # an input detector (requires 'input') is an ODIN: odin_scores reads its eps / temperature
                scored[n].append(odin_scores(cast(ODIN, d), adapter.logits, x, adapter.input_std))
            if y is not None:
                labels.append(y.cpu().numpy())
    except IsoodError as e:  # raised in a DataLoader worker: one line, not the worker's traceback
        raise type(e)(worker_message(e)) from None
    if unreadable:
        raise UnreadableImagesError(unreadable)
    got = {k: _cat(v) for k, v in parts.items()}
    if labels:
        got["labels"] = np.concatenate(labels)
    return got, {n: _cat(v) for n, v in scored.items()}


def extract_outputs(adapter: ModelAdapter, data, kinds: Iterable[str] = ("logits",), *, batch_size: int = 64,
                    device: str | torch.device = "cpu", num_workers: int = 0, progress: bool = False,
                    cache_dir: str | os.PathLike | None = None, data_id: str | None = None,
                    preprocess_id: str = "", input_detectors: Mapping[str, Detector] | Sequence[Detector] = (),
                    desc: str = "forward",
                    precision: str = DEFAULT_PRECISION) -> tuple[ForwardOutputs, dict[str, np.ndarray]]:
    """Capture ``kinds`` (among logits / features / feature_maps / block3) for every image of ``data`` in ONE
    forward pass per batch, and score the ``input_detectors`` (ODIN) on the same batches.

    ``data``: a torch Dataset (items: image tensor, ``(image, label, ...)``, or a dict with ``image``/``label``), a
    DataLoader, or an (N, C, H, W) tensor / array. Labels are kept when the data yields them. With ``cache_dir``
    (and ``data_id``, a string naming the data; tensors are hashed when none is given) outputs are read from /
    written to the cache; only missing kinds cost a pass. ``precision`` (``isood.core.devices.PRECISIONS``): fp32 (the
    default) runs the model as it is; fp16 (CUDA) / bf16 under autocast, the model and the batches channels-last
    (the model is left channels-last); the input detectors (ODIN's forward + backward) stay in float32, since
    autocast without loss scaling can underflow their input gradients to zero. The cache key holds the precision
    and ``data``'s decoding mode (``ImageList.decode``). Returns ``(outputs, input_scores)``.
    """
    if not isinstance(input_detectors, Mapping):
        input_detectors = {d.name: d for d in input_detectors}
    kinds = frozenset(kinds) & set(CAPTURE_KINDS)
    missing = kinds - adapter.provides
    if missing:
        raise BadInputError(f"model '{adapter.name}' does not expose {', '.join(sorted(missing))}")
    check_precision(precision, device)
    adapter.to(device)
    if precision != DEFAULT_PRECISION:
        adapter.model.to(memory_format=torch.channels_last)
    cache = None if cache_dir is None else _open_cache(adapter, data, cache_dir, data_id, preprocess_id, precision)
    score_kinds = {n: score_kind(d, adapter.input_std) for n, d in input_detectors.items()}
    got: dict[str, np.ndarray] = {}
    if cache is not None:
        n = _n_items(data)
        got = {k: a for k in [*kinds, "labels", *score_kinds.values()] if (a := cache.get(k, n)) is not None}
    todo_kinds = kinds - set(got)
    todo_input = {n: d for n, d in input_detectors.items() if score_kinds[n] not in got}
    # labels are saved whenever a pass sees them, so a cache hit without a labels file means "no labels"
    if todo_kinds or todo_input:
        loader = as_loader(data, batch_size, num_workers)
        captured, scored = _forward_passes(adapter, loader, todo_kinds, todo_input, desc=desc, progress=progress,
                                           precision=precision)
        new = {k: v for k, v in captured.items() if k not in got}
        new.update({score_kinds[n]: s for n, s in scored.items()})
        got.update(new)
        if cache is not None:  # labels first: a killed run cannot leave outputs cached without their labels
            for k in sorted(new, key=lambda k: k != "labels"):
                cache.save(k, new[k])
    outputs = adapter.empty_outputs()
    for k in kinds:
        setattr(outputs, k, got[k])
    outputs.labels = got.get("labels")
    return outputs, {name: got[sk] for name, sk in score_kinds.items()}
