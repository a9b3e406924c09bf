"""Energy score (Liu et al., "Energy-based out-of-distribution detection", NeurIPS 2020):
``S(x) = T * logsumexp(z / T)`` (the negative free energy), T = 1."""

from __future__ import annotations

import numpy as np

from .base import Detector, ForwardOutputs, energy
from .registry import register_detector


@register_detector("energy", aliases=("ebo",))
class Energy(Detector):
    """Negative energy with temperature ``T`` (default 1, as in the paper and OpenOOD v1.5)."""

    name = "energy"
    requires = frozenset({"logits"})

    def __init__(self, temperature: float = 1.0) -> None:
        super().__init__()
        self.temperature = float(temperature)

    def params(self) -> dict:
        return {"temperature": self.temperature}

    def score(self, outputs: ForwardOutputs) -> np.ndarray:
        self._check(outputs)
        return energy(outputs.logits, self.temperature)
