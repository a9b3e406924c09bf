"""GradNorm (Huang, Geng & Li, "On the importance of gradients for detecting distributional shifts in the wild",
NeurIPS 2021): the L1 norm of the gradient of ``KL(u || softmax(z / T))`` (u uniform over the C classes)
with respect to the fc weight ``W``.

Analytic form (no backward pass): with ``z = W h + b`` and ``p = softmax(z / T)``,
``d KL / d W = (1 / T) (p - 1/C) h^T``, hence ``S(x) = ||h||_1 * ||p - 1/C||_1 / T`` (the L1 norm of a rank-1
matrix factorises). The original code backpropagates ``sum_c -log p_c`` instead, which is ``C`` times the KL up
to a constant: the ranking (hence every metric) is the same. Default ``T = 1`` (paper / OpenOOD v1.5)."""

from __future__ import annotations

import numpy as np

from .base import ForwardOutputs, TemperatureDetector, softmax
from .registry import register_detector


@register_detector("gradnorm")
class GradNorm(TemperatureDetector):
    """Analytic L1 norm of the fc-weight gradient of KL(uniform || softmax)."""

    requires = frozenset({"features", "logits"})

    def _score(self, outputs: ForwardOutputs) -> np.ndarray:
        p = softmax(outputs.logits, self.temperature)
        c = p.shape[1]
        h1 = np.abs(np.asarray(outputs.features, np.float64)).sum(axis=1)
        return h1 * np.abs(p - 1.0 / c).sum(axis=1) / self.temperature
