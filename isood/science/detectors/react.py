"""ReAct: rectified activations (Sun et al., NeurIPS 2021): clip the penultimate activations at ``c``,
the ``percentile``-th percentile (default 90) of all ID training activations, re-run the fc layer on the clipped
features and score with the energy (T = 1): ``S(x) = logsumexp(W min(h, c) + b)``. OpenOOD v1.5 takes the
percentile over its ID ``val`` split; isood over the ID data it is fitted on (``--id-train``)."""

from __future__ import annotations

import numpy as np

from .base import Detector, ForwardOutputs, energy
from .registry import register_detector


@register_detector("react")
class ReAct(Detector):
    """Energy of the logits of features clipped at the ID ``percentile``-th activation percentile."""

    requires = frozenset({"features", "fc"})
    needs_fit = True

    def __init__(self, percentile: float = 90.0) -> None:
        self.percentile = self._param("percentile", percentile, float, lambda v: 0.0 <= v <= 100.0, "in [0, 100]")

    def _fit(self, outputs: ForwardOutputs, labels: np.ndarray | None) -> None:
        self.threshold_ = float(np.percentile(np.asarray(outputs.features, np.float64).ravel(), self.percentile))

    def _score(self, outputs: ForwardOutputs) -> np.ndarray:
        clipped = np.minimum(np.asarray(outputs.features, np.float64), self.threshold_)
        return energy(outputs.head(clipped))
