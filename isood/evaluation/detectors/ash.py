"""ASH-B: activation shaping, binarised (Djurisic et al., "Extremely simple activation shaping for OOD
detection", ICLR 2023).

Per image, on the pre-pool feature map ``A`` (C x H x W, flattened): keep the top ``k = n - round(n p / 100)``
activations (default ``p = 90``), set each of them to ``sum(A) / k`` and every other to 0; then the model's own
pooling and fc layer; score = energy (T = 1). Uses the captured feature maps: no extra backbone pass."""

from __future__ import annotations

import numpy as np
import torch

from .base import Detector, DetectorInputError, ForwardOutputs, feature_map_energy
from .registry import register_detector


def ash_b(feature_maps: torch.Tensor, percentile: float) -> torch.Tensor:
    """ASH-B of a batch of feature maps (N, ...): top-k positions get ``sum / k``, the rest 0."""
    n_img = feature_maps.shape[0]
    flat = feature_maps.reshape(n_img, -1)
    n = flat.shape[1]
    k = n - int(round(n * percentile / 100.0))
    if k < 1:
        raise DetectorInputError(f"ash: percentile {percentile} keeps no activation of {n}: pass a smaller percentile")
    total = flat.sum(dim=1, keepdim=True)
    idx = flat.topk(k, dim=1).indices
    out = torch.zeros_like(flat).scatter_(1, idx, (total / k).expand(-1, k))
    return out.reshape(feature_maps.shape)


@register_detector("ash", aliases=("ash-b", "ashb"))
class ASHB(Detector):
    """Energy of the logits of binarised-shaped feature maps."""

    requires = frozenset({"feature_maps", "fc"})

    def __init__(self, percentile: float = 90.0, *, chunk: int = 256) -> None:
        self.percentile = self._param("percentile", percentile, float, lambda v: 0.0 <= v < 100.0, "in [0, 100)")
        self.chunk = self._param("chunk", chunk, int, lambda v: v >= 1, ">= 1")

    def _score(self, outputs: ForwardOutputs) -> np.ndarray:
        return feature_map_energy(outputs, lambda fm: ash_b(fm, self.percentile), chunk=self.chunk)
