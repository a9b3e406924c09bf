"""KL-Matching (Hendrycks et al., "Scaling out-of-distribution detection for real-world settings", ICML 2022):
class templates ``d_c`` = mean softmax of the ID (training) images PREDICTED as class ``c``; score
``S(x) = -min_c KL(softmax(z(x)) || d_c)``. As OpenOOD v1.5, the minimum runs over all templates; classes that
no fitting image is predicted as have no template (OpenOOD averages an empty set into a NaN template). OpenOOD
fits the templates on its ID ``val`` split; isood on the ID data it is fitted on (``--id-train``)."""

from __future__ import annotations

import numpy as np

from .base import Detector, DetectorInputError, ForwardOutputs, softmax
from .registry import register_detector

_TINY = np.finfo(np.float64).tiny


@register_detector("klm", aliases=("kl-matching", "klmatching"))
class KLMatching(Detector):
    """Negative smallest KL divergence to a class-conditional mean-softmax template."""

    requires = frozenset({"logits"})
    needs_fit = True

    def _fit(self, outputs: ForwardOutputs, labels: np.ndarray | None) -> None:
        p = softmax(outputs.captured("logits"))
        pred = p.argmax(axis=1)
        self.classes_ = np.unique(pred)
        self.templates_ = np.stack([p[pred == c].mean(axis=0) for c in self.classes_])
        self.log_templates_ = np.log(np.maximum(self.templates_, _TINY))

    def _score(self, outputs: ForwardOutputs) -> np.ndarray:
        p = softmax(outputs.captured("logits"))
        if p.shape[1] != self.templates_.shape[1]:
            raise DetectorInputError(
                f"klm: fitted on {self.templates_.shape[1]} classes, got logits with {p.shape[1]}: same model please")
        plogp = np.where(p > 0, p * np.log(np.maximum(p, _TINY)), 0.0).sum(axis=1)
        kl = plogp[:, None] - p @ self.log_templates_.T
        return -kl.min(axis=1)
