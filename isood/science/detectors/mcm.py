"""MCM and GL-MCM: zero-shot OOD scores of a CLIP model whose logits are the cosine similarities between the image
and the class prompts (``isood.classifiers.clip_zero_shot``: ``logits = <f(x), t_c>`` with both L2-normalised, no
logit scale).

* MCM, Maximum Concept Matching (Ming et al., "Delving into Out-of-Distribution Detection with Vision-Language
  Representations", NeurIPS 2022): ``S(x) = max_c softmax(s(x) / T)_c``, ``s_c`` the cosine similarity with the
  prompt of class c, ``T = 1`` (the paper's and its code's default). On such a model MCM equals MSP.
* GL-MCM, Global-Local MCM (Miyai et al., "Zero-Shot In-Distribution Detection in Multi-Object Settings Using
  Vision-Language Foundation Models", 2023; its code ``utils/detection_util.py``): the global MCM plus
  ``lambda_local`` times the local one, the largest softmax over every local feature (patch) and class:
  ``S(x) = max_c softmax(s(x) / T)_c + lambda * max_{p, c} softmax(s_p(x) / T)_c`` with ``s_p`` the cosine
  similarities of local feature p; ``T = 1``, ``lambda = 1`` (the code's defaults). The local similarities come
  from the model (capture kind ``local_logits``, (N, P, C)).

Scores: higher = more in-distribution (the papers' codes negate them to rank OOD first). Pure numpy.
"""

from __future__ import annotations

import numpy as np

from .base import ForwardOutputs, TemperatureDetector, softmax
from .registry import register_detector

__all__ = ["MCM", "GLMCM", "local_max_softmax"]


def local_max_softmax(local_logits: np.ndarray, temperature: float = 1.0) -> np.ndarray:
    """(N, P, C) local logits -> (N,): per image the largest softmax (over classes, at ``temperature``) of any
    local feature."""
    z = np.asarray(local_logits, dtype=np.float64)
    n, p, c = z.shape
    return softmax(z.reshape(n * p, c), temperature).max(axis=1).reshape(n, p).max(axis=1)


@register_detector("mcm")
class MCM(TemperatureDetector):
    """Maximum Concept Matching: the largest softmax of the cosine similarities (temperature 1, as the paper)."""

    requires = frozenset({"logits"})
    zero_shot = True

    def _score(self, outputs: ForwardOutputs) -> np.ndarray:
        return softmax(outputs.captured("logits"), self.temperature).max(axis=1)


@register_detector("glmcm", aliases=("gl-mcm",))
class GLMCM(TemperatureDetector):
    """Global-Local MCM: global MCM + ``lambda_local`` x the largest local softmax (``T = 1``, ``lambda = 1``)."""

    requires = frozenset({"logits", "local_logits"})
    zero_shot = True

    def __init__(self, temperature: float = 1.0, lambda_local: float = 1.0) -> None:
        super().__init__(temperature)
        self.lambda_local = self._param("lambda_local", lambda_local, float, lambda v: v >= 0, ">= 0")

    def requirement_hint(self, lack: frozenset[str]) -> str:
        if "local_logits" in lack:
            return ("GL-MCM needs local (patch) similarities: use a CLIP zero-shot model with a ViT or ModifiedResNet "
                    "image tower (--model clip:SPEC)")
        return ""

    def _score(self, outputs: ForwardOutputs) -> np.ndarray:
        glob = softmax(outputs.captured("logits"), self.temperature).max(axis=1)
        return glob + self.lambda_local * local_max_softmax(outputs.captured("local_logits"), self.temperature)
