"""Energy score (Liu et al., "Energy-based out-of-distribution detection", NeurIPS 2020):
``S(x) = T * logsumexp(z / T)`` (the negative free energy), T = 1."""

from __future__ import annotations

import numpy as np

from .base import ForwardOutputs, TemperatureDetector, energy
from .registry import register_detector


@register_detector("energy", aliases=("ebo",))
class Energy(TemperatureDetector):
    """Negative energy with temperature ``T`` (default 1, as in the paper and OpenOOD v1.5)."""

    requires = frozenset({"logits"})

    def _score(self, outputs: ForwardOutputs) -> np.ndarray:
        return energy(outputs.captured("logits"), self.temperature)
