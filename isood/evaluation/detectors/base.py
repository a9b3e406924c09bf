"""Common interface of post-hoc OOD detectors and the container of what one forward pass captured.

A detector declares in ``requires`` what it needs from the classifier's forward pass:

- ``'logits'``       (N, C) class logits;
- ``'features'``     (N, D) penultimate features (the input of the final linear layer);
- ``'feature_maps'`` (N, C', H, W) the last feature maps before global pooling;
- ``'fc'``           the final linear layer ``logits = features @ W.T + b`` (``fc_weight`` (C, D), ``fc_bias`` (C,));
- ``'input'``        the model itself on the input batch (gradient-based input perturbation; only ODIN).

``fit(id_train, labels)`` sees the captured outputs of the ID training set (``labels`` are the real class labels,
used by MDS), ``score(outputs)`` returns one score per image, HIGHER = MORE in-distribution (OpenOOD's
convention). Detectors are pure: arrays in, arrays out; they never touch files or the backbone. Detectors that
re-compute the head (ReAct, DICE, ASH, RankFeat) use the captured tensors, ``fc_weight``/``fc_bias`` and the
model's own pooling (``ForwardOutputs.pool``).
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields, replace
from typing import Callable, ClassVar, Iterable

import numpy as np
import torch
from scipy.special import logsumexp

from isood.errors import IsoodError

__all__ = [
    "KINDS",
    "CAPTURE_KINDS",
    "DetectorInputError",
    "ForwardOutputs",
    "Detector",
    "global_average_pool",
    "energy",
    "softmax",
]

CAPTURE_KINDS = ("logits", "features", "feature_maps")
KINDS = CAPTURE_KINDS + ("fc", "input")


class DetectorInputError(IsoodError):
    """A detector was given outputs that lack what it needs (or were never fitted)."""


def global_average_pool(feature_maps: torch.Tensor) -> torch.Tensor:
    """(N, C, H, W) -> (N, C): the mean over the spatial positions (ResNet's ``avgpool`` + ``flatten``)."""
    return feature_maps.mean(dim=(2, 3))


@dataclass
class ForwardOutputs:
    """What one forward pass over a dataset captured (NumPy arrays; absent kinds are ``None``).

    ``pool`` maps captured feature maps (a torch tensor) to penultimate features with the model's own head
    (defaults to global average pooling); ``labels`` are the dataset's labels when it yields them.
    """

    logits: np.ndarray | None = None
    features: np.ndarray | None = None
    feature_maps: np.ndarray | None = None
    fc_weight: np.ndarray | None = None
    fc_bias: np.ndarray | None = None
    labels: np.ndarray | None = None
    pool: Callable[[torch.Tensor], torch.Tensor] = field(default=global_average_pool, repr=False, compare=False)

    def __len__(self) -> int:
        for k in ("logits", "features", "feature_maps", "labels"):
            v = getattr(self, k)
            if v is not None:
                return int(v.shape[0])
        return 0

    @property
    def available(self) -> frozenset[str]:
        """The kinds present (``'fc'`` when the final layer's weight is known)."""
        got = {k for k in CAPTURE_KINDS if getattr(self, k) is not None}
        if self.fc_weight is not None:
            got.add("fc")
        return frozenset(got)

    def subset(self, index) -> "ForwardOutputs":
        """Rows ``index`` (slice, integer or boolean array) of every per-image array; fc and pool are shared."""
        per_image = {k: (getattr(self, k)[index] if getattr(self, k) is not None else None)
                     for k in ("logits", "features", "feature_maps", "labels")}
        return replace(self, **per_image)

    @staticmethod
    def concatenate(parts: Iterable["ForwardOutputs"]) -> "ForwardOutputs":
        """Stack the per-image arrays of several parts (fc and pool are taken from the first)."""
        parts = list(parts)
        if not parts:
            raise ValueError("nothing to concatenate: pass at least one ForwardOutputs")
        out = {}
        for f in fields(ForwardOutputs):
            k = f.name
            if k in ("logits", "features", "feature_maps", "labels"):
                vals = [getattr(p, k) for p in parts]
                out[k] = None if any(v is None for v in vals) else np.concatenate(vals, axis=0)
            else:
                out[k] = getattr(parts[0], k)
        return ForwardOutputs(**out)

    def fc(self) -> tuple[np.ndarray, np.ndarray]:
        """``(W, b)`` of the final linear layer (a missing bias is zeros)."""
        if self.fc_weight is None:
            raise DetectorInputError("the final linear layer (fc) was not captured: the model must expose it")
        b = self.fc_bias if self.fc_bias is not None else np.zeros(self.fc_weight.shape[0], self.fc_weight.dtype)
        return self.fc_weight, b

    def head(self, features: np.ndarray) -> np.ndarray:
        """Logits of (possibly modified) penultimate features through the captured fc layer."""
        w, b = self.fc()
        return features @ w.T + b


def softmax(logits: np.ndarray, temperature: float = 1.0) -> np.ndarray:
    """Row-wise softmax of ``logits / temperature`` in float64."""
    z = np.asarray(logits, dtype=np.float64) / temperature
    z = z - z.max(axis=1, keepdims=True)
    e = np.exp(z)
    return e / e.sum(axis=1, keepdims=True)


def energy(logits: np.ndarray, temperature: float = 1.0) -> np.ndarray:
    """Negative free energy ``T * logsumexp(logits / T)`` (Liu et al., NeurIPS 2020): higher = more ID."""
    z = np.asarray(logits, dtype=np.float64)
    return temperature * logsumexp(z / temperature, axis=1)


def feature_map_energy(outputs: "ForwardOutputs", transform: Callable[[torch.Tensor], torch.Tensor],
                       temperature: float = 1.0, chunk: int = 256) -> np.ndarray:
    """Energy of the head applied to ``pool(transform(feature_maps))``, in chunks of ``chunk`` images: the
    common tail of feature-map detectors (ASH, RankFeat), run on captured maps without a new backbone pass."""
    scores = []
    with torch.no_grad():
        for i in range(0, len(outputs), chunk):
            fm = torch.from_numpy(np.ascontiguousarray(outputs.feature_maps[i:i + chunk])).float()
            feats = outputs.pool(transform(fm)).double().numpy()
            scores.append(energy(outputs.head(feats), temperature))
    return np.concatenate(scores)


class Detector:
    """Base class: subclasses set ``name``, ``requires``, ``needs_fit`` and implement ``score`` (and ``fit``).

    Keyword arguments of ``__init__`` are the detector's hyper-parameters (``params()`` lists them).
    """

    name: ClassVar[str] = ""
    requires: ClassVar[frozenset[str]] = frozenset()
    needs_fit: ClassVar[bool] = False
    needs_labels: ClassVar[bool] = False

    def __init__(self) -> None:
        self._fitted = not self.needs_fit

    # -- API --------------------------------------------------------------------------------------------
    def fit(self, id_train: ForwardOutputs, labels: np.ndarray | None = None) -> "Detector":
        """Estimate statistics on the ID training outputs (no-op for detectors that need none)."""
        self._fitted = True
        return self

    def score(self, outputs: ForwardOutputs) -> np.ndarray:  # pragma: no cover - abstract
        """One score per image, higher = more in-distribution."""
        raise NotImplementedError

    def params(self) -> dict:
        """The hyper-parameters (for reports and cache keys)."""
        return {}

    def __repr__(self) -> str:
        args = ", ".join(f"{k}={v!r}" for k, v in self.params().items())
        return f"{type(self).__name__}({args})"

    # -- helpers for subclasses ----------------------------------------------------------------------------
    def _check(self, outputs: ForwardOutputs, *, fitting: bool = False) -> None:
        missing = set(self.requires) - {"input"} - set(outputs.available)
        if missing:
            raise DetectorInputError(
                f"detector '{self.name}' needs {', '.join(sorted(missing))} from the forward pass, which these "
                f"outputs lack: capture {sorted(self.requires - {'input'})} (a model exposing them)")
        if not fitting and not self._fitted:
            raise DetectorInputError(f"detector '{self.name}' is not fitted: call fit(id_train_outputs) first")
        if len(outputs) == 0:
            raise DetectorInputError(f"detector '{self.name}' got outputs with no image")

    @staticmethod
    def _as_float(x: np.ndarray) -> np.ndarray:
        return np.asarray(x, dtype=np.float64)


class TemperatureDetector(Detector):
    """A detector whose one hyper-parameter is the softmax/energy temperature ``T`` (default 1, as in the
    MSP, Energy and GradNorm papers and OpenOOD v1.5)."""

    def __init__(self, temperature: float = 1.0) -> None:
        super().__init__()
        self.temperature = float(temperature)

    def params(self) -> dict:
        return {"temperature": self.temperature}
