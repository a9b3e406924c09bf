"""Detectors that need the model on the input, run where the model runs (torch): ODIN's input perturbation.

The ``ODIN`` class (``isood.science.detectors.odin``, numpy only) holds the hyper-parameters; ``odin_scores``
computes its scores on one batch: ``x~ = x - eps * sign(-grad_x log S_yhat(x; T))`` (per channel divided by the
preprocessing std, so ``eps`` is in [0, 1] pixel units as in the original code), ``S(x) = max_c softmax(f(x~) /
T)_c`` (Liang et al., ICLR 2018; OpenOOD v1.5's ``ODINPostprocessor``). ``run_detectors`` calls it per batch.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Callable, Sequence

import numpy as np

from isood.science.detectors import ODIN, DetectorInputError

if TYPE_CHECKING:
    import torch

__all__ = ["odin_scores"]


def odin_scores(detector: ODIN, logits_fn: Callable[["torch.Tensor"], "torch.Tensor"], x: "torch.Tensor",
                input_std: Sequence[float] | None = None) -> np.ndarray:
    """ODIN scores of the batch ``x`` (N, C, H, W) for ``logits_fn`` (the classifier, in eval mode); the
    detector's own ``input_std`` wins over the model's ``input_std`` (None: no rescaling)."""
    import torch
    import torch.nn.functional as F

    std = detector.input_std if detector.input_std is not None else input_std
    x = x.detach().clone().requires_grad_(True)
    with torch.enable_grad():
        logits = logits_fn(x)
        pred = logits.detach().argmax(dim=1)
        loss = F.cross_entropy(logits / detector.temperature, pred)
        (grad,) = torch.autograd.grad(loss, x)
    step = torch.where(grad >= 0, 1.0, -1.0).to(x.dtype)
    if std is not None:
        s = torch.as_tensor(std, dtype=x.dtype, device=x.device)
        if s.numel() != x.shape[1]:
            raise DetectorInputError(
                f"odin: input_std has {s.numel()} values but the input has {x.shape[1]} channels")
        step = step / s.view(1, -1, *([1] * (x.dim() - 2)))
    with torch.no_grad():
        out = logits_fn(x.detach() - detector.eps * step) / detector.temperature
        return torch.softmax(out.double(), dim=1).max(dim=1).values.cpu().numpy()
