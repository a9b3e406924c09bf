"""ODIN (Liang et al., "Enhancing the reliability of out-of-distribution image detection in neural networks",
ICLR 2018): temperature scaling plus an input perturbation against the gradient of the loss.

``x~ = x - eps * sign(-grad_x log S_yhat(x; T))`` (per channel divided by the preprocessing std, so ``eps`` is in
[0, 1] pixel units as in the original code), ``S(x) = max_c softmax(f(x~) / T)_c``. Defaults from the paper /
OpenOOD v1.5: ``T = 1000``, ``eps = 0.0014``.

This is the only detector that needs the model on the input: ``run_detectors`` calls ``score_inputs`` on each batch
(one forward + backward + forward), every other detector scores captured tensors.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Callable, Sequence

import numpy as np

from .base import Detector, DetectorInputError, ForwardOutputs
from .registry import register_detector

if TYPE_CHECKING:
    import torch


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
            "isood.evaluation.scoring.run_detectors (or call score_inputs(logits_fn, images))")

    def score_inputs(self, logits_fn: Callable[[torch.Tensor], torch.Tensor], x: torch.Tensor,
                     input_std: Sequence[float] | None = None) -> np.ndarray:
        """Scores of the batch ``x`` (N, C, H, W) for ``logits_fn`` (the classifier, in eval mode)."""
        import torch
        import torch.nn.functional as F

        std = self.input_std if self.input_std is not None else input_std
        x = x.detach().clone().requires_grad_(True)
        with torch.enable_grad():
            logits = logits_fn(x)
            pred = logits.detach().argmax(dim=1)
            loss = F.cross_entropy(logits / self.temperature, pred)
            (grad,) = torch.autograd.grad(loss, x)
        step = torch.where(grad >= 0, 1.0, -1.0).to(x.dtype)
        if std is not None:
            s = torch.as_tensor(std, dtype=x.dtype, device=x.device)
            if s.numel() != x.shape[1]:
                raise DetectorInputError(
                    f"odin: input_std has {s.numel()} values but the input has {x.shape[1]} channels")
            step = step / s.view(1, -1, *([1] * (x.dim() - 2)))
        with torch.no_grad():
            out = logits_fn(x.detach() - self.eps * step) / self.temperature
            return torch.softmax(out.double(), dim=1).max(dim=1).values.cpu().numpy()
