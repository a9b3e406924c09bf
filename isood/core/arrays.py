"""Array helpers shared by the science modules (numpy in, numpy out; torch tensors accepted)."""

from __future__ import annotations

from typing import Any

import numpy as np

from isood.core.errors import BadInputError

__all__ = ["as_array", "l2_normalise"]


def as_array(x: Any, name: str, *, ndim: int | None = None) -> np.ndarray:
    """``x`` (numpy array, torch tensor, nested lists) as a numeric numpy array; ``ndim`` checks the rank.

    A torch tensor is detached and moved to the CPU (torch is not imported for other inputs).
    """
    if hasattr(x, "detach") and hasattr(x, "cpu"):  # a torch tensor, without importing torch
        x = x.detach().cpu().numpy()
    try:
        a = np.asarray(x)
    except Exception as exc:
        raise BadInputError(f"{name}: cannot read as an array ({exc}); pass a numeric array") from None
    if a.dtype == object or not (np.issubdtype(a.dtype, np.number) or a.dtype == bool):
        raise BadInputError(f"{name}: expected a numeric array, got dtype {a.dtype}")
    if ndim is not None and a.ndim != ndim:
        shape = "(N, D)" if ndim == 2 else "(N,)" if ndim == 1 else f"{ndim}-D"
        raise BadInputError(f"{name}: expected a {ndim}-D array {shape}, got shape {a.shape}")
    return a


def l2_normalise(x: Any, *, dtype=np.float32) -> np.ndarray:
    """Rows of ``x`` (N, D) divided by their L2 norm (rows of norm 0 stay 0), C-contiguous ``dtype``."""
    a = np.asarray(x, dtype=np.float64 if dtype == np.float64 else None)
    n = np.linalg.norm(a, axis=-1, keepdims=True)
    n[n == 0] = 1.0
    return np.ascontiguousarray(a / n, dtype=dtype)
