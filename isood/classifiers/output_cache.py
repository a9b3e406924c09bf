"""The on-disk cache of a model's outputs over a dataset: one safetensors file per kind and dataset under a key
hashing model identity + data identity + preprocessing (``OutputCache``), so a second evaluation with other
detectors does no forward pass.

The data identity of image files holds their content (``isood.core.content``: the evaluation keys a list of files
by path and content hash), so an image overwritten in place is a miss; so are other labels (``labels_digest``).
A corrupt or truncated entry (unreadable, or not one row per image) is a miss too: one warning line
(``isood.core.errors.IsoodWarning``), then recomputed and replaced atomically. The decoding mode and the precision
are part of the key (when not the defaults, so older caches keep their keys).
"""

from __future__ import annotations

import hashlib
import json
import os
import warnings
from pathlib import Path

import numpy as np
import torch

from isood.core.devices import DEFAULT_PRECISION
from isood.core.errors import BadInputError, IsoodWarning, one_line
from isood.core.files import atomic_write_bytes
from isood.features.decoding import REFERENCE_DECODE
from isood.science.detectors import Detector

from .models import ModelAdapter

__all__ = ["CACHE_VERSION", "OutputCache", "cache_key", "labels_digest", "score_kind", "cached_preprocess",
           "open_cache"]

CACHE_VERSION = 3  # 2: 16-bit images scaled to 8 bits, bombs refused before decoding; 3: float / 32-bit images
#                     scaled by their range (isood.features.decoding.to_rgb), image lists keyed by content


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


def cached_preprocess(preprocess_id: str, data, precision: str) -> str:
    """The preprocessing part of a cache key: ``preprocess_id``, with the dataset's decoding mode
    (``ImageList.decode``) and the precision appended when they are not the defaults (so a default run keeps the
    keys of caches written before the two existed)."""
    decode = getattr(data, "decode", REFERENCE_DECODE)
    return (preprocess_id + (f"|decode={decode}" if decode != REFERENCE_DECODE else "")
            + (f"|precision={precision}" if precision != DEFAULT_PRECISION else ""))


def open_cache(adapter: ModelAdapter, data, cache_dir, data_id: str | None, preprocess_id: str,
                precision: str = DEFAULT_PRECISION) -> OutputCache:
    """The cache entry of (model, data, preprocessing, decoding mode, precision); tensors / arrays are hashed
    when no ``data_id`` is given."""
    preprocess_id = cached_preprocess(preprocess_id, data, precision)
    if data_id is None:
        if not isinstance(data, (torch.Tensor, np.ndarray)):
            raise BadInputError("caching needs data_id= a string naming this dataset (e.g. manifest hash + split)")
        arr = data.detach().cpu().numpy() if isinstance(data, torch.Tensor) else np.asarray(data)
        data_id = "array:" + hashlib.blake2b(np.ascontiguousarray(arr).tobytes(), digest_size=16).hexdigest()
    meta = {"model": adapter.identity, "data": data_id, "preprocess": preprocess_id, "version": CACHE_VERSION}
    return OutputCache(cache_dir, cache_key(adapter.identity, data_id, preprocess_id), meta)
