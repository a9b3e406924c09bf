"""RankFeat (Song et al., "RankFeat: Rank-1 feature removal for out-of-distribution detection", NeurIPS 2022):
per image, the last feature map ``X`` (C x HW) minus its rank-1 part ``s1 u1 v1^T`` (exact SVD), then
the model's pooling and fc layer; score = ``T logsumexp(z / T)`` with T = 1 (OpenOOD v1.5).

Only the last block's map (the paper's main "Block 4" variant) is used, taken from the captured feature maps;
OpenOOD's optional fusion with Block 3 would need another partial backbone pass and is not done here."""

from __future__ import annotations

import numpy as np
import torch

from .base import Detector, ForwardOutputs, feature_map_energy
from .registry import register_detector


def remove_rank1(feature_maps: torch.Tensor) -> torch.Tensor:
    """``X - s1 u1 v1^T`` for each (C, H*W) matrix of a (N, C, H, W) batch."""
    n, c = feature_maps.shape[:2]
    x = feature_maps.reshape(n, c, -1)
    u, s, vh = torch.linalg.svd(x, full_matrices=False)
    rank1 = s[:, :1, None] * (u[:, :, :1] @ vh[:, :1, :])
    return (x - rank1).reshape(feature_maps.shape)


@register_detector("rankfeat")
class RankFeat(Detector):
    """Energy of the logits after removing the rank-1 component of the feature map."""

    requires = frozenset({"feature_maps", "fc"})

    def __init__(self, temperature: float = 1.0, *, chunk: int = 256) -> None:
        self.temperature = self._param("temperature", temperature, float, lambda t: t > 0, "> 0")
        self.chunk = self._param("chunk", chunk, int, lambda v: v >= 1, ">= 1")

    def _score(self, outputs: ForwardOutputs) -> np.ndarray:
        return feature_map_energy(outputs, remove_rank1, self.temperature, chunk=self.chunk)
