"""Capture what detectors need from a classifier over a dataset, in ONE forward pass per batch, with an
on-disk cache.

``extract_outputs`` captures exactly the requested kinds (logits / features / feature_maps / block3) over a
dataset (batch size, device, DataLoader workers: the decoding processes, optional progress bar) and scores the
detectors that need the model on the input (ODIN) on the same batches. With a cache folder the outputs are read
from and written to ``isood.classifiers.output_cache``: a second evaluation with other detectors does no forward
pass. The data is any torch dataset, typically ``isood.classifiers.image_list.ImageList``, whose batches of parts
(``--decode fast|gpu``) the pass finishes on the model's device (the batch decode pipeline of
``isood.features.batch_decode``); an unreadable image ends the pass with one ``UnreadableImagesError`` naming every
unreadable image of the dataset. ``--precision fp16|bf16``: the passes run under ``torch.autocast`` with the model
and its inputs channels-last (``precision_context``; ODIN's gradients in float32); fp32 (the default) runs the
model as it is.
"""

from __future__ import annotations

import contextlib
import os
from typing import Iterable, Mapping, Sequence, cast

import numpy as np
import torch

from isood.core.devices import DEFAULT_PRECISION, PRECISIONS
from isood.core.errors import BadInputError, IsoodError
from isood.core.progress import track
from isood.science.detectors import CAPTURE_KINDS, ODIN, Detector, ForwardOutputs

from .image_list import Unreadable, UnreadableImagesError, as_loader, split_batch, worker_message
from .adapter import ModelAdapter
from .output_cache import open_cache, score_kind
from .perturbation import odin_scores

__all__ = ["check_precision", "precision_context", "extract_outputs"]


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
    the input detectors, concatenated over batches; a batch of parts (``--decode fast|gpu``: ``ImageList.finish``)
    decoded on the model's device first; the model run in ``precision`` (``precision_context``)."""
    parts: dict[str, list[np.ndarray]] = {k: [] for k in kinds}
    labels: list[np.ndarray] = []
    scored: dict[str, list[np.ndarray]] = {n: [] for n in inputs}
    unreadable: list[Unreadable] = []
    total = len(loader) if hasattr(loader, "__len__") else None
    finish = getattr(getattr(loader, "dataset", None), "finish", None)
    try:
        for batch in track(loader, total, desc, progress):
            if finish is not None and isinstance(batch, Mapping) and "pending" in batch:
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
    cache = None if cache_dir is None else open_cache(adapter, data, cache_dir, data_id, preprocess_id, precision)
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
