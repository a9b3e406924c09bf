"""What a classifier offers the detectors: :class:`ModelAdapter`, "one forward pass -> logits, penultimate
features, pre-pool feature maps", plus its final linear layer (``fc``) and its own pooling head; ResNets also expose
the output of ``layer3`` (``block3``, captured in the same pass) and ``tail``: ``layer4`` + pool + fc as a function
of a block-3 map (RankFeat's block 3 + 4 fusion re-runs only the last block, never the whole model).

The base class holds what every adapter shares: the capture hooks, the one-image check of what a model returns
(:meth:`ModelAdapter.check_outputs`), the fc layer and pooling as numpy functions for the detectors, and the
content hash that keys the on-disk cache (:func:`model_identity`). The adapters of timm, torchvision-style and
user modules, and ``wrap_model`` that picks one, are in :mod:`isood.classifiers.models`.
"""

from __future__ import annotations

import hashlib
from typing import Any, Callable, Iterable, Sequence

import numpy as np
import torch
from torch import nn

from isood.core.errors import BadInputError, IsoodError, one_line
from isood.science.detectors import CAPTURE_KINDS, ForwardOutputs

__all__ = ["ModelAdapter", "model_identity"]


def model_identity(model: nn.Module) -> str:
    """A hash of the module's class and every parameter/buffer (names, shapes, dtypes, values)."""
    h = hashlib.blake2b(digest_size=16)
    h.update(f"{type(model).__module__}.{type(model).__qualname__}".encode())
    for name, t in model.state_dict().items():
        t = t.detach().cpu().contiguous()
        h.update(f"{name}:{tuple(t.shape)}:{t.dtype}".encode())
        if t.numel():
            h.update(t.reshape(-1).view(torch.uint8).numpy())
    return h.hexdigest()


class ModelAdapter:
    """A classifier seen as "one forward pass -> the kinds detectors need".

    Subclasses implement ``_forward(x, kinds)``, ``pool(feature_maps)``, ``_linear()``, ``logits(x)`` and set
    ``provides`` (ResNet adapters also ``tail(block3)``). ``identity`` keys the on-disk cache; ``input_std`` is the
    per-channel std of the model's input normalisation (ODIN's perturbation is scaled by it).
    """

    provides: frozenset[str] = frozenset()
    zero_shot: bool = False  # logits are a CLIP zero-shot classifier's prompt similarities (MCM, GL-MCM)
    _probe_size: tuple[int, ...] = (3, 64, 64)

    def __init__(self, model: nn.Module, *, name: str | None = None, input_std: Sequence[float] | None = None,
                 transform: Callable | None = None) -> None:
        self.model = model.eval()
        self.name = name or type(model).__name__
        self.input_std = None if input_std is None else tuple(float(s) for s in input_std)
        self.transform = transform
        self._identity: str | None = None
        self.device = torch.device("cpu")
        self.forward_calls = 0  # batches through the backbone (capture passes), for tests and benchmarks
        self._captured: dict[str, torch.Tensor] = {}
        self._capturing = False
        self._hooks: list = []  # our hook handles (randomized_copy strips them from a copied model)
        self._layer4: nn.Module | None = None

    # -- to implement -------------------------------------------------------------------------------------
    def _forward(self, x: torch.Tensor, kinds: frozenset[str]) -> dict[str, torch.Tensor]:
        raise NotImplementedError

    def pool(self, feature_maps: torch.Tensor) -> torch.Tensor:
        """Feature maps -> penultimate features with the model's own head (no fc)."""
        raise NotImplementedError

    def _linear(self) -> nn.Linear | None:
        raise NotImplementedError

    def logits(self, x: torch.Tensor) -> torch.Tensor:
        """The classifier's logits (differentiable; used by ODIN)."""
        raise NotImplementedError

    def tail(self, block3: torch.Tensor) -> torch.Tensor:
        """Block-3 maps -> logits through the model's last block, pooling and fc (ResNets only)."""
        raise NotImplementedError

    # -- capture hooks ------------------------------------------------------------------------------------
    def _grab(self, key: str, *, output: bool = False):
        """A forward (pre-)hook storing the module's output (input) under ``key`` during capture passes only."""
        def hook(module, args, out=None):
            if self._capturing:  # only during capture passes (not ODIN's forwards)
                self._captured[key] = out if output else args[0]
        return hook

    def _capture(self, run: Callable[[], Any]) -> tuple[Any, dict[str, torch.Tensor]]:
        """``run()`` with the hooks armed: its result and what they captured."""
        self._captured, self._capturing = {}, True
        try:
            result = run()
        finally:
            self._capturing = False
        got, self._captured = self._captured, {}
        return result, got

    def _hook_block3(self) -> None:
        """Capture ``layer3``'s output as ``block3`` when the model has ``layer3`` and ``layer4`` modules."""
        l3, l4 = getattr(self.model, "layer3", None), getattr(self.model, "layer4", None)
        if isinstance(l3, nn.Module) and isinstance(l4, nn.Module):
            self._layer4 = l4
            self._hooks.append(l3.register_forward_hook(self._grab("block3", output=True)))

    def _tail_ok(self) -> bool:
        """True when ``tail`` of the captured ``block3`` reproduces the logits of a seeded random probe batch,
        i.e. the model really runs ``layer3 -> layer4 -> pool -> fc`` (checked once, without a capture count)."""
        if self._layer4 is None:
            return False
        p = next(self.model.parameters(), None)
        x = torch.randn(2, *self._probe_size, generator=torch.Generator().manual_seed(0))
        try:
            with torch.no_grad():
                out = self._forward(x.to(p.device if p is not None else "cpu"), frozenset(CAPTURE_KINDS))
                b3 = out.get("block3")
                return b3 is not None and torch.allclose(self.tail(b3), out["logits"], rtol=1e-4, atol=1e-4)
        except (RuntimeError, ValueError, TypeError, AttributeError):
            return False

    # -- shared -------------------------------------------------------------------------------------------
    @property
    def identity(self) -> str:
        if self._identity is None:
            self._identity = f"{type(self).__name__}:{model_identity(self.model)}"
        return self._identity

    def to(self, device: str | torch.device) -> "ModelAdapter":
        self.device = torch.device(device)
        self.model.to(self.device)
        return self

    def fc_params(self) -> tuple[np.ndarray, np.ndarray] | tuple[None, None]:
        """``(W, b)`` of the final linear layer as float32 arrays (``(None, None)`` when there is none)."""
        lin = self._linear()
        if lin is None:
            return None, None
        w = lin.weight.detach().float().cpu().numpy()
        b = (lin.bias.detach().float().cpu().numpy() if lin.bias is not None
             else np.zeros(w.shape[0], np.float32))
        return w, b

    @torch.no_grad()
    def forward(self, x: torch.Tensor, kinds: Iterable[str]) -> dict[str, torch.Tensor]:
        """One forward pass over the batch ``x``; returns the requested captured kinds (on the model's device)."""
        kinds = frozenset(kinds) & set(CAPTURE_KINDS)
        missing = kinds - self.provides
        if missing:
            raise BadInputError(f"model '{self.name}' does not expose {', '.join(sorted(missing))}: "
                                f"it provides {', '.join(sorted(self.provides))}")
        self.forward_calls += 1
        out = self._forward(x.to(self.device), kinds)
        return {k: out[k] for k in kinds}

    def check_outputs(self, x: torch.Tensor, kinds: Iterable[str]) -> dict[str, tuple[int, ...]]:
        """Run the model once on the batch ``x`` (not a capture pass: ``forward_calls`` unchanged) and check what it
        returns for ``kinds`` (logits always): logits (N, C) with C = the fc layer's rows, features (N, D), maps
        (N, C', H, W). Their shapes, or a one-line error saying what the model returned and what a classifier
        must return (checked before any pass over the data)."""
        kinds = (frozenset(kinds) | {"logits"}) & set(CAPTURE_KINDS) & self.provides
        want = {"logits": 2, "features": 2, "feature_maps": 4, "block3": 4, "local_logits": 3}
        hint = "pass a classifier mapping (N, 3, H, W) images to (N, classes) logits"
        try:
            with torch.no_grad():
                out = self._forward(x.to(self.device), kinds)
        except IsoodError:
            raise
        except Exception as e:  # noqa: BLE001 -- any failure of the user's module on one image: one line
            raise BadInputError(f"model '{self.name}' fails on one input image of shape {tuple(x.shape)}: "
                                f"{type(e).__name__}: {one_line(e, 120)}: {hint}") from None
        shapes: dict[str, tuple[int, ...]] = {}
        for k in sorted(kinds):
            v = out.get(k) if isinstance(out, dict) else None
            if not isinstance(v, torch.Tensor) or v.dim() != want[k] or v.shape[0] != x.shape[0]:
                got = f"a tensor of shape {tuple(v.shape)}" if isinstance(v, torch.Tensor) else type(v).__name__
                raise BadInputError(f"model '{self.name}' returns {got} as its {k} for {x.shape[0]} image(s), not a "
                                    f"{want[k]}-D tensor with one row per image: {hint}")
            shapes[k] = tuple(v.shape)
        w, _ = self.fc_params()
        if w is not None and shapes["logits"][1] != w.shape[0]:
            raise BadInputError(f"model '{self.name}' returns {shapes['logits'][1]} logits but its fc layer has "
                                f"{w.shape[0]} outputs: {hint}")
        return shapes

    def empty_outputs(self) -> ForwardOutputs:
        """A ForwardOutputs carrying this model's fc layer and pooling (no per-image arrays)."""
        w, b = self.fc_params()
        return ForwardOutputs(fc_weight=w, fc_bias=b, pool=self._array_pool,
                              tail=self._array_tail if "tail" in self.provides else None)

    def _array_fn(self, fn, a: np.ndarray) -> np.ndarray:
        """``fn`` (a torch layer of this model) on an array, as detectors call it: numpy in, numpy out."""
        with torch.no_grad():
            x = torch.from_numpy(np.ascontiguousarray(a, dtype=np.float32)).to(self.device)
            return fn(x).float().cpu().numpy()

    def _array_pool(self, feature_maps: np.ndarray) -> np.ndarray:
        return self._array_fn(self.pool, feature_maps)

    def _array_tail(self, block3: np.ndarray) -> np.ndarray:
        return self._array_fn(self.tail, block3)
