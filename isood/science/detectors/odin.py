"""ODIN (Liang et al., "Enhancing the reliability of out-of-distribution image detection in neural networks",
ICLR 2018): temperature scaling plus an input perturbation against the gradient of the loss.

``x~ = x - eps * sign(-grad_x log S_yhat(x; T))`` (per channel divided by the preprocessing std, so ``eps`` is in
[0, 1] pixel units as in the original code), ``S(x) = max_c softmax(f(x~) / T)_c``. Defaults from the paper /
OpenOOD v1.5: ``T = 1000``, ``eps = 0.0014``.

This is the only detector that needs the model on the input: the class holds its hyper-parameters; the perturbation
itself (one forward + backward + forward per batch) runs where the model runs, in isood.classifiers
(``isood.classifiers.perturbation.odin_scores``, called by ``run_detectors`` on each batch); every other detector
scores captured arrays.
"""

from __future__ import annotations

from typing import Sequence

import numpy as np

from .base import Detector, DetectorInputError, ForwardOutputs
from .registry import register_detector


@register_detector("odin")
class ODIN(Detector):
    """ODIN with temperature ``temperature`` and perturbation magnitude ``eps``.

    ``input_std``: per-channel std of the model's input normalisation (``run_detectors`` passes the model's own; None
    means no rescaling, i.e. the input is in [0, 1] pixel units).
    """

    requires = frozenset({"input"})

    def __init__(self, temperature: float = 1000.0, eps: float = 0.0014, *,
                 input_std: Sequence[float] | None = None) -> None:
        self.temperature = self._param("temperature", temperature, float, lambda t: t > 0, "> 0")
        self.eps = self._param("eps", eps, float, lambda e: e >= 0, ">= 0")
        self.input_std = None if input_std is None else tuple(float(s) for s in input_std)

    def _score(self, outputs: ForwardOutputs) -> np.ndarray:
        raise DetectorInputError(
            "detector 'odin' perturbs the input: it cannot score captured outputs; run it through "
            "isood.classifiers.scoring.run_detectors (or isood.classifiers.perturbation.odin_scores)")
