"""Precomputed-outputs folders, the model-free input of ``isood evaluate``.

A folder with ``index.parquet`` (``path``; ``wnid`` or ``label``), ``logits.npy`` (N x C) and optionally
``features.npy`` (N x D), ``fc_weight.npy`` (C x D) and ``fc_bias.npy`` (C,); one array row per index row.
"""

from __future__ import annotations

import io
import os
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from isood.core.errors import BadInputError
from isood.core.files import atomic_write_bytes
from manifests import parquet_bytes

from isood.science.detectors import ForwardOutputs

__all__ = ["OUTPUT_ARRAYS", "is_outputs_dir", "save_outputs", "load_outputs"]

OUTPUT_ARRAYS = ("logits", "features", "local_logits", "fc_weight", "fc_bias")
_PER_ROW = ("logits", "features", "local_logits")


def is_outputs_dir(path: str | os.PathLike | None) -> bool:
    """A precomputed-outputs folder: ``index.parquet`` + ``logits.npy``."""
    if path is None:
        return False
    p = Path(path)
    return p.is_dir() and (p / "index.parquet").is_file() and (p / "logits.npy").is_file()


def _npy_bytes(a: np.ndarray) -> bytes:
    buf = io.BytesIO()
    np.save(buf, a)
    return buf.getvalue()


def save_outputs(path: str | os.PathLike, index: pd.DataFrame, *, logits, features=None, fc_weight=None,
                 fc_bias=None, local_logits=None) -> Path:
    """Write a precomputed-outputs folder (``index.parquet`` with ``path`` and ``wnid`` or ``label``; ``.npy``
    arrays with one row per index row) usable as ``--id-train`` / ``--id-test`` / ``--test-root``."""
    p = Path(path)
    if "path" not in index.columns or not ({"wnid", "label"} & set(index.columns)):
        raise BadInputError("save_outputs: index needs a 'path' column and a 'wnid' or 'label' column")
    arrays = {"logits": logits, "features": features, "local_logits": local_logits, "fc_weight": fc_weight,
              "fc_bias": fc_bias}
    for name, a in arrays.items():
        if a is None:
            continue
        a = np.ascontiguousarray(np.asarray(a, dtype=np.float32))
        if name in _PER_ROW and a.shape[0] != len(index):
            raise BadInputError(f"save_outputs: {name} has {a.shape[0]} rows for {len(index)} index rows")
        atomic_write_bytes(p / f"{name}.npy", _npy_bytes(a))
    atomic_write_bytes(p / "index.parquet", parquet_bytes(index.reset_index(drop=True)))
    return p


def load_outputs(path: str | os.PathLike) -> tuple[ForwardOutputs, pd.DataFrame]:
    """``(ForwardOutputs, index)`` of a precomputed-outputs folder."""
    p = Path(path)
    if not is_outputs_dir(p):
        raise BadInputError(f"{p} is not a precomputed-outputs folder (index.parquet + logits.npy)")
    index = pd.read_parquet(p / "index.parquet")
    if "path" not in index.columns:
        raise BadInputError(f"{p}/index.parquet has no 'path' column; write it with save_outputs")
    loaded: dict[str, Any] = {k: (np.load(p / f"{k}.npy") if (p / f"{k}.npy").is_file() else None)
                              for k in OUTPUT_ARRAYS}  # arrays or None, keyword arguments of ForwardOutputs
    for k in _PER_ROW:
        array = loaded[k]
        if array is not None and array.shape[0] != len(index):
            raise BadInputError(f"{p}/{k}.npy has {array.shape[0]} rows but index.parquet {len(index)}")
    return ForwardOutputs(**loaded), index
