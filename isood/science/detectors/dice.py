"""DICE: directed sparsification of the last layer (Sun & Li, ECCV 2022).

Contribution matrix ``V = W * mean_train(h)`` (class x feature, elementwise with the mean ID training
activation); mask ``M = [V > percentile_p(V)]`` keeps the top ``100 - p`` % (default ``p = 90``) weights; score
``S(x) = logsumexp((M * W) h + b)`` (energy, T = 1)."""

from __future__ import annotations

import numpy as np

from .base import Detector, ForwardOutputs, energy
from .registry import register_detector


@register_detector("dice")
class DICE(Detector):
    """Energy of the logits of a weight matrix sparsified by contribution."""

    requires = frozenset({"features", "fc"})
    needs_fit = True

    def __init__(self, p: float = 90.0) -> None:
        self.p = self._param("p", p, float, lambda v: 0.0 <= v < 100.0, "in [0, 100)")

    def _fit(self, outputs: ForwardOutputs, labels: np.ndarray | None) -> None:
        w, _ = outputs.fc()
        mean_act = np.asarray(outputs.features, np.float64).mean(axis=0)
        contrib = np.asarray(w, np.float64) * mean_act[None, :]
        self.mask_ = contrib > np.percentile(contrib, self.p)

    def _score(self, outputs: ForwardOutputs) -> np.ndarray:
        w, b = outputs.fc()
        logits = np.asarray(outputs.features, np.float64) @ (np.asarray(w, np.float64) * self.mask_).T + b
        return energy(logits)
