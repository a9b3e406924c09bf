"""MaxLogit (Hendrycks et al., "Scaling out-of-distribution detection for real-world settings", ICML 2022):
``S(x) = max_c z_c``."""

from __future__ import annotations

import numpy as np

from .base import Detector, ForwardOutputs
from .registry import register_detector


@register_detector("maxlogit", aliases=("mls", "max-logit"))
class MaxLogit(Detector):
    """Maximum logit."""

    requires = frozenset({"logits"})

    def _score(self, outputs: ForwardOutputs) -> np.ndarray:
        return np.asarray(outputs.logits, dtype=np.float64).max(axis=1)
