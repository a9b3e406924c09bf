"""ASH: activation shaping (Djurisic et al., "Extremely simple activation shaping for out-of-distribution
detection", ICLR 2023), applied where OpenOOD v1.5 and the authors' code apply it for a ResNet on ImageNet: to the
POOLED penultimate feature vector ``h`` (the input of the fc layer), not to the C x H x W map before pooling:
``pool -> ASH -> fc -> energy``. OpenOOD's ``ASHNet.forward_threshold`` shapes ``feature_list[-1]``, which its
ResNets return after ``avgpool`` (N x D x 1 x 1); the authors' ``resnet_imagenet.py`` calls ``apply_ash`` right
after ``self.avgpool``. Hence ASH needs only the captured ``features`` and ``fc`` (no feature map, no extra pass,
and it also runs on precomputed outputs and ViTs).

Per image, with ``n = D`` entries and ``k = n - round(n p / 100)`` kept (default ``p = 90``, OpenOOD v1.5's):

- ``variant='b'`` (ASH-B, the default, as OpenOOD's ``ash_b``): the top-``k`` entries become ``sum(h) / k``, the
  others 0;
- ``variant='p'`` (ASH-P): the top-``k`` entries keep their value, the others 0;
- ``variant='s'`` (ASH-S, the authors' ImageNet setting ``ash_s@90``): ASH-P, then all entries times
  ``exp(sum(h) / sum(kept))``.

Score ``S(x) = logsumexp(W h' + b)`` (energy, T = 1). Ties at the k-th value keep the lower feature index
(OpenOOD's ``torch.topk`` leaves the choice unspecified); computed in float64.
"""

from __future__ import annotations

import numpy as np

from .base import Detector, DetectorInputError, ForwardOutputs, energy
from .registry import register_detector

VARIANTS = ("b", "p", "s")


def ash_shape(x: np.ndarray, percentile: float, variant: str = "b") -> np.ndarray:
    """ASH-``variant`` of each row of ``x`` (N, ...) taken flat: keep the top ``k = n - round(n p / 100)``
    entries ('b': set them to the row sum / k; 'p': as they are; 's': as they are, times exp(sum / kept sum)),
    zero the rest. Returns float64 of ``x``'s shape."""
    if variant not in VARIANTS:
        raise DetectorInputError(f"ash: unknown variant {variant!r}: pass one of {', '.join(VARIANTS)}")
    x = np.asarray(x, dtype=np.float64)
    flat = x.reshape(x.shape[0], -1)
    n = flat.shape[1]
    k = n - int(np.round(n * percentile / 100.0))
    if k < 1:
        raise DetectorInputError(f"ash: percentile {percentile} keeps no activation of {n}: pass a smaller percentile")
    top = np.argsort(-flat, axis=1, kind="stable")[:, :k]
    kept = np.take_along_axis(flat, top, axis=1)
    total = flat.sum(axis=1, keepdims=True)
    out = np.zeros_like(flat)
    np.put_along_axis(out, top, np.broadcast_to(total / k, kept.shape) if variant == "b" else kept, axis=1)
    if variant == "s":
        out *= np.exp(total / kept.sum(axis=1, keepdims=True))
    return out.reshape(x.shape)


@register_detector("ash", aliases=("ash-b", "ashb"))
class ASH(Detector):
    """Energy of the logits of the shaped pooled feature (see the module docstring: pool -> ASH -> fc)."""

    requires = frozenset({"features", "fc"})

    def __init__(self, percentile: float = 90.0, variant: str = "b", *, chunk: int = 4096) -> None:
        self.percentile = self._param("percentile", percentile, float, lambda v: 0.0 <= v < 100.0, "in [0, 100)")
        self.variant = self._param("variant", variant, str, lambda v: v.lower() in VARIANTS,
                                   "one of " + ", ".join(VARIANTS)).lower()
        self.chunk = self._param("chunk", chunk, int, lambda v: v >= 1, ">= 1")

    def _score(self, outputs: ForwardOutputs) -> np.ndarray:
        feats = outputs.captured("features")
        return np.concatenate([
            energy(outputs.head(ash_shape(feats[i:i + self.chunk], self.percentile, self.variant)))
            for i in range(0, len(outputs), self.chunk)])
