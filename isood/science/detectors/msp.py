"""MSP: maximum softmax probability (Hendrycks & Gimpel, ICLR 2017): ``S(x) = max_c softmax(z)_c``."""

from __future__ import annotations

import numpy as np

from .base import ForwardOutputs, TemperatureDetector, softmax
from .registry import register_detector


@register_detector("msp")
class MSP(TemperatureDetector):
    """Maximum softmax probability (temperature 1, as in the paper and OpenOOD v1.5)."""

    requires = frozenset({"logits"})

    def _score(self, outputs: ForwardOutputs) -> np.ndarray:
        return softmax(outputs.captured("logits"), self.temperature).max(axis=1)
