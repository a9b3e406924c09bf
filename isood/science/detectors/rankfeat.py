"""RankFeat (Song et al., "RankFeat: Rank-1 feature removal for out-of-distribution detection", NeurIPS 2022), as
OpenOOD v1.5's ``RankFeatPostprocessor`` computes it (its default, exact SVD, T = 1):

- block 4: the last feature map ``X4`` (C x HW per image) minus its rank-1 part ``s1 u1 v1^T``, then the model's
  pooling and fc: logits ``z4``;
- block 3: the output of the block before the last (a ResNet's ``layer3``) minus its rank-1 part, run through the
  model's last block (``layer4``), pooling and fc: logits ``z3``;
- fusion in the logit space, unconditional in OpenOOD: ``S(x) = T logsumexp(((z3 + z4) / 2) / T)``.

``blocks='3+4'`` (default) is that fusion; ``blocks='4'`` (``--detectors rankfeat:blocks=4``) keeps block 4 only
(the paper's main variant), which needs only the feature maps. Both run on tensors captured in the ONE forward pass
(``feature_maps`` and ``block3``): the fusion re-runs the last block on the modified block-3 map, never the model
from the input. The fusion needs a model exposing ``block3`` and ``tail`` (torchvision and timm ResNets do); the
block-3 maps are kept in memory like the feature maps (twice their size for a ResNet-50: 1024 x 14 x 14 floats
per image vs 2048 x 7 x 7), so ``blocks=4`` is the lighter choice at scale.
"""

from __future__ import annotations

import numpy as np

from .base import Detector, ForwardOutputs, energy
from .registry import register_detector

BLOCKS = ("3+4", "4")


def remove_rank1(feature_maps: np.ndarray) -> np.ndarray:
    """``X - s1 u1 v1^T`` for each (C, H*W) matrix of a (N, C, H, W) batch (exact SVD, float32 as OpenOOD's)."""
    maps = np.asarray(feature_maps, dtype=np.float32)
    n, c = maps.shape[:2]
    x = maps.reshape(n, c, -1)
    u, s, vh = np.linalg.svd(x, full_matrices=False)
    rank1 = s[:, :1, None] * (u[:, :, :1] @ vh[:, :1, :])
    return (x - rank1).reshape(maps.shape)


@register_detector("rankfeat")
class RankFeat(Detector):
    """Energy of the logits after removing the rank-1 component of block 4 (and block 3, fused: the default)."""

    requires = frozenset({"feature_maps", "block3", "fc", "tail"})

    def __init__(self, temperature: float = 1.0, blocks: str = "3+4", *, chunk: int = 256) -> None:
        self.temperature = self._param("temperature", temperature, float, lambda t: t > 0, "> 0")
        self.blocks = self._param("blocks", blocks, str, lambda v: v in BLOCKS, "3+4 (fusion) or 4")
        self.chunk = self._param("chunk", chunk, int, lambda v: v >= 1, ">= 1")
        if self.blocks == "4":
            self.requires = frozenset({"feature_maps", "fc"})

    def requirement_hint(self, lack: frozenset[str]) -> str:
        if lack <= {"block3", "tail"}:
            return "pass rankfeat:blocks=4 (block 4 only; the fusion needs a ResNet's layer3 -> layer4 -> pool -> fc)"
        return ""

    def _score(self, outputs: ForwardOutputs) -> np.ndarray:
        scores = []
        for i in range(0, len(outputs), self.chunk):
            fm = remove_rank1(outputs.captured("feature_maps")[i:i + self.chunk])
            logits = outputs.head(np.asarray(outputs.pool(fm), dtype=np.float64))
            if self.blocks == "3+4":
                assert outputs.tail is not None, "score() checked the 'tail' the fusion requires"
                b3 = remove_rank1(outputs.captured("block3")[i:i + self.chunk])
                logits = (logits + np.asarray(outputs.tail(b3), dtype=np.float64)) / 2.0
            scores.append(energy(logits, self.temperature))
        return np.concatenate(scores)
