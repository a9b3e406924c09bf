"""ReAct: rectified activations (Sun et al., NeurIPS 2021): clip the penultimate activations at ``c``,
the ``percentile``-th percentile (default 90) of all ID training activations, re-run the fc layer on the clipped
features and score with the energy (T = 1): ``S(x) = logsumexp(W min(h, c) + b)``."""

from __future__ import annotations

import numpy as np

from .base import Detector, ForwardOutputs, energy
from .registry import register_detector


@register_detector("react")
class ReAct(Detector):
    """Energy of the logits of features clipped at the ID ``percentile``-th activation percentile."""

    name = "react"
    requires = frozenset({"features", "fc"})
    needs_fit = True

    def __init__(self, percentile: float = 90.0) -> None:
        super().__init__()
        if not 0.0 <= float(percentile) <= 100.0:
            raise ValueError(f"react: percentile must be in [0, 100], got {percentile}")
        self.percentile = float(percentile)

    def params(self) -> dict:
        return {"percentile": self.percentile}

    def fit(self, id_train: ForwardOutputs, labels: np.ndarray | None = None) -> "ReAct":
        self._check(id_train, fitting=True)
        self.threshold_ = float(np.percentile(np.asarray(id_train.features, np.float64).ravel(), self.percentile))
        self._fitted = True
        return self

    def score(self, outputs: ForwardOutputs) -> np.ndarray:
        self._check(outputs)
        clipped = np.minimum(np.asarray(outputs.features, np.float64), self.threshold_)
        return energy(outputs.head(clipped))
