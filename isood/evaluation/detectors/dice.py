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

    name = "dice"
    requires = frozenset({"features", "fc"})
    needs_fit = True

    def __init__(self, p: float = 90.0) -> None:
        super().__init__()
        if not 0.0 <= float(p) < 100.0:
            raise ValueError(f"dice: p must be in [0, 100), got {p}")
        self.p = float(p)

    def params(self) -> dict:
        return {"p": self.p}

    def fit(self, id_train: ForwardOutputs, labels: np.ndarray | None = None) -> "DICE":
        self._check(id_train, fitting=True)
        w, _ = id_train.fc()
        mean_act = np.asarray(id_train.features, np.float64).mean(axis=0)
        contrib = np.asarray(w, np.float64) * mean_act[None, :]
        self.mask_ = contrib > np.percentile(contrib, self.p)
        self._fitted = True
        return self

    def score(self, outputs: ForwardOutputs) -> np.ndarray:
        self._check(outputs)
        w, b = outputs.fc()
        logits = np.asarray(outputs.features, np.float64) @ (np.asarray(w, np.float64) * self.mask_).T + b
        return energy(logits)
