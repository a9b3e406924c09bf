"""GradNorm (Huang, Geng & Li, "On the importance of gradients for detecting distributional shifts in the wild",
NeurIPS 2021): the L1 norm of the gradient of ``KL(u || softmax(z / T))`` (u uniform over the C classes)
with respect to the fc weight ``W``.

Analytic form (no backward pass): with ``z = W h + b`` and ``p = softmax(z / T)``,
``d KL / d W = (1 / T) (p - 1/C) h^T``, hence ``S(x) = ||h||_1 * ||p - 1/C||_1 / T`` (the L1 norm of a rank-1
matrix factorises). Default ``T = 1`` (paper / OpenOOD v1.5).

Difference from OpenOOD v1.5 (exact, a constant factor): its ``GradNormPostprocessor`` (like the original code)
backpropagates ``sum_c -log p_c`` (targets all ones, 1000 columns hard-coded), whose gradient is ``C`` times the
KL's: OpenOOD's score = ``C`` x this one. Every metric is the same (rankings are unchanged and AUTC's min-max
normalisation absorbs the factor)."""

from __future__ import annotations

import numpy as np

from .base import ForwardOutputs, TemperatureDetector, softmax
from .registry import register_detector


@register_detector("gradnorm")
class GradNorm(TemperatureDetector):
    """Analytic L1 norm of the fc-weight gradient of KL(uniform || softmax)."""

    requires = frozenset({"features", "logits"})

    def _score(self, outputs: ForwardOutputs) -> np.ndarray:
        p = softmax(outputs.captured("logits"), self.temperature)
        c = p.shape[1]
        h1 = np.abs(np.asarray(outputs.features, np.float64)).sum(axis=1)
        return h1 * np.abs(p - 1.0 / c).sum(axis=1) / self.temperature
