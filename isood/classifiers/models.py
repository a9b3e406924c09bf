"""A classifier seen as "one forward pass -> logits, penultimate features, pre-pool feature maps", plus its final
linear layer (``fc``) and its own pooling head. ResNets (torchvision or timm: ``layer3`` -> ``layer4`` -> pool -> fc)
also expose the output of ``layer3`` (``block3``, captured in the same pass) and ``tail``: ``layer4`` + pool + fc as
a function of a block-3 map (RankFeat's block 3 + 4 fusion re-runs only the last block, never the whole model).

Three kinds of ``ModelAdapter``: timm models (``forward_features`` / ``forward_head(pre_logits=True)`` /
``get_classifier()``), torchvision-style models with an ``avgpool`` and a linear ``fc`` (ResNets, RegNets;
captured with hooks), and a user module given as ``backbone`` (image -> feature map or features) + ``fc`` (+
optional ``pool``). Build one with ``wrap_model`` (or by name: ``isood.classifiers.named``);
``randomized_copy`` re-initialises one (the ``--sanity-random-model`` baseline).
"""

from __future__ import annotations

import copy
import hashlib
from typing import Any, Callable, Iterable, Sequence

import numpy as np
import torch
from torch import nn

from isood.core.errors import BadInputError, IsoodError
from isood.core.errors import one_line

from isood.science.detectors import CAPTURE_KINDS, ForwardOutputs

__all__ = [
    "ModelAdapter", "TimmAdapter", "HookAdapter", "ModuleAdapter", "wrap_model", "model_identity", "model_classes",
    "randomized_copy",
]

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


class TimmAdapter(ModelAdapter):
    """timm model: ``forward_features`` (pre-pool map for CNNs, tokens for ViTs), ``forward_head`` and the linear
    classifier from ``get_classifier()``.

    What it provides is found once by a probe forward of one blank image (the model's default input size):
    ``feature_maps`` when ``forward_features`` returns N x C x H x W with C = ``num_features`` (CNNs); ``fc`` when
    ``get_classifier()`` is an ``nn.Linear`` that maps ``forward_head(pre_logits=True)`` to the model's logits;
    ``block3`` + ``tail`` for ResNets (``layer3``/``layer4``) whose ``forward_head(layer4(block3))`` gives them."""

    def __init__(self, model: nn.Module, **kwargs) -> None:
        cfg = getattr(model, "pretrained_cfg", None) or {}
        if kwargs.get("input_std") is None:
            kwargs["input_std"] = cfg.get("std")
        super().__init__(model, **kwargs)
        # probe input: ViT-like models need their own image size; CNNs take a small image (cheap probe)
        size = getattr(getattr(model, "patch_embed", None), "img_size", None)
        chans, *hw = cfg.get("input_size") or (3, 224, 224)
        if not size:
            low = (cfg.get("min_input_size") or (3, 64, 64))[1:]
            size = tuple(min(int(s), max(int(m), 64)) for s, m in zip(hw, low))
        self._input_size = self._probe_size = (chans, *size)
        self._provides: frozenset[str] | None = None
        self._hook_block3()

    @property
    def provides(self) -> frozenset[str]:  # type: ignore[override]  # a lazy property over the base's attribute
        if self._provides is None:
            kinds = {"logits", "features"}
            model: Any = self.model  # a timm model: forward_features / forward_head / get_classifier
            p = next(model.parameters(), None)
            x = torch.zeros(1, *self._input_size, device=p.device if p is not None else "cpu")
            with torch.no_grad():
                fmap = model.forward_features(x)
                feats = model.forward_head(fmap, pre_logits=True)
                logits = model.forward_head(fmap)
                clf = model.get_classifier()
                if isinstance(clf, nn.Linear) and feats.dim() == 2 and torch.allclose(
                        clf(feats), logits, rtol=1e-4, atol=1e-4):
                    kinds.add("fc")
            if fmap.dim() == 4 and fmap.shape[1] == getattr(self.model, "num_features", fmap.shape[1]):
                kinds.add("feature_maps")
            if self._tail_ok():
                kinds |= {"block3", "tail"}
            self._provides = frozenset(kinds)
        return self._provides

    def _forward(self, x, kinds):
        fmap, out = self._capture(lambda: self.model.forward_features(x))
        out["feature_maps"] = fmap
        out["features"] = self.model.forward_head(fmap, pre_logits=True)
        out["logits"] = self.model.forward_head(fmap)
        return out

    def pool(self, feature_maps):
        return self.model.forward_head(feature_maps, pre_logits=True)

    def tail(self, block3):
        return self.model.forward_head(self._layer4(block3))

    def _linear(self):
        c = self.model.get_classifier()
        return c if isinstance(c, nn.Linear) else None

    def logits(self, x):
        return self.model(x)


class HookAdapter(ModelAdapter):
    """torchvision-style model whose forward ends ``... -> pool module -> flatten -> linear fc`` (ResNet, RegNet,
    Wide-ResNet, ResNeXt; EfficientNet with ``fc='classifier.1'``). One ordinary ``model(x)`` call; forward
    pre-hooks on the pool module and on the fc layer capture the feature maps and the features, and for ResNets
    (``layer3``/``layer4`` whose ``fc(flatten(pool(layer4(.))))`` gives the logits) a forward hook on ``layer3``
    the ``block3`` maps."""

    def __init__(self, model: nn.Module, *, fc: str = "fc", pool: str = "avgpool", **kwargs) -> None:
        if kwargs.get("input_std") is None:
            kwargs["input_std"] = (0.229, 0.224, 0.225)  # torchvision's ImageNet normalisation
        super().__init__(model, **kwargs)
        try:
            self._fc = model.get_submodule(fc)
            self._pool = model.get_submodule(pool)
        except AttributeError as e:
            raise BadInputError(f"model '{self.name}' has no submodule '{e}': pass fc=/pool= names of its layers, "
                                "or use wrap_model(backbone=..., fc=...)") from None
        if not isinstance(self._fc, nn.Linear):
            raise BadInputError(f"model '{self.name}': '{fc}' is a {type(self._fc).__name__}, not nn.Linear: pass "
                                "fc= the name of its final linear layer")
        self.fc_name, self.pool_name = fc, pool
        self._hooks += [self._fc.register_forward_pre_hook(self._grab("features")),
                        self._pool.register_forward_pre_hook(self._grab("feature_maps"))]
        self._hook_block3()
        self.provides = frozenset({"logits", "features", "feature_maps", "fc"})
        if self._tail_ok():
            self.provides |= {"block3", "tail"}

    def _forward(self, x, kinds):
        logits, out = self._capture(lambda: self.model(x))
        out["logits"] = logits
        return out

    def pool(self, feature_maps):
        return torch.flatten(self._pool(feature_maps), 1)

    def tail(self, block3):
        return self._fc(self.pool(self._layer4(block3)))

    def _linear(self):
        return self._fc

    def logits(self, x):
        return self.model(x)


def torch_global_average_pool(feature_maps: torch.Tensor) -> torch.Tensor:
    """(N, C, H, W) -> (N, C) on tensors: the default pooling of a wrapped backbone (ResNet's ``avgpool``)."""
    return feature_maps.mean(dim=(2, 3))


class _BackboneHead(nn.Module):
    def __init__(self, backbone: nn.Module, fc: nn.Linear, pool: nn.Module | Callable | None):
        super().__init__()
        self.backbone = backbone
        self.fc = fc
        self.pool: nn.Module | Callable
        if isinstance(pool, nn.Module):
            self.pool = pool
        else:
            self.pool = pool if pool is not None else torch_global_average_pool  # a plain callable, not a submodule

    def forward(self, x):
        h = self.backbone(x)
        if h.dim() > 2:
            h = self.pool(h)
        return self.fc(h)


class ModuleAdapter(ModelAdapter):
    """A user's torch module given as ``backbone`` (image -> feature map N x C x H x W, or features N x D) and a
    linear ``fc``; ``pool`` (module or callable, default global average pooling) maps the map to features."""

    def __init__(self, backbone: nn.Module, fc: nn.Linear, pool: nn.Module | Callable | None = None,
                 **kwargs) -> None:
        if not isinstance(fc, nn.Linear):
            raise BadInputError(f"fc must be an nn.Linear (the final layer), got {type(fc).__name__}")
        super().__init__(_BackboneHead(backbone, fc, pool), **kwargs)
        self._pool_fn = self.model.pool
        self.provides = frozenset({"logits", "features", "feature_maps", "fc"})

    def _forward(self, x, kinds):
        m = self.model
        h = m.backbone(x)
        out = {}
        if h.dim() > 2:
            out["feature_maps"] = h
            h = self._pool_fn(h)
        elif "feature_maps" in kinds:
            raise BadInputError(f"model '{self.name}': the backbone returns features, not feature maps "
                                "(ASH/RankFeat need N x C x H x W maps before pooling)")
        out["features"] = h
        out["logits"] = m.fc(h)
        return out

    def pool(self, feature_maps):
        return self._pool_fn(feature_maps)

    def _linear(self):
        return self.model.fc

    def logits(self, x):
        return self.model(x)


def wrap_model(model: nn.Module | ModelAdapter | None = None, *, backbone: nn.Module | None = None,
               fc: nn.Linear | str | None = None, pool: nn.Module | Callable | str | None = None,
               name: str | None = None, input_std: Sequence[float] | None = None,
               transform: Callable | None = None) -> ModelAdapter:
    """A ``ModelAdapter`` for ``model`` (timm or torchvision-style, detected) or for ``backbone`` + ``fc``.

    - ``wrap_model(timm_model)``; ``wrap_model(torchvision_resnet)`` (or any module with ``avgpool`` + ``fc``;
      other layer names via ``fc='classifier.1', pool='avgpool'``);
    - ``wrap_model(backbone=net, fc=linear, pool=None)`` for your own module.
    """
    kw = {"name": name, "input_std": input_std, "transform": transform}
    if isinstance(model, ModelAdapter):
        return model
    if backbone is not None:
        if model is not None:
            raise BadInputError("pass either model or backbone + fc, not both")
        if fc is None or isinstance(fc, str):
            raise BadInputError("wrap_model(backbone=...) needs fc= the final nn.Linear layer")
        return ModuleAdapter(backbone, fc, None if isinstance(pool, str) else pool, **kw)
    if model is None:
        raise BadInputError("wrap_model needs a model, or backbone= and fc=")
    if all(hasattr(model, a) for a in ("forward_features", "forward_head", "get_classifier")) and fc is None:
        return TimmAdapter(model, **kw)
    fc_name = fc if isinstance(fc, str) else "fc"
    pool_name = pool if isinstance(pool, str) else "avgpool"
    names = dict(model.named_modules())
    if fc_name in names and pool_name in names:
        return HookAdapter(model, fc=fc_name, pool=pool_name, **kw)
    raise BadInputError(f"cannot find the layers of {type(model).__name__}: pass a timm model, a model with "
                        "'avgpool' and 'fc' (or fc=/pool= names), or wrap_model(backbone=..., fc=...)")


def model_classes(adapter: ModelAdapter) -> int | None:
    """The number of classes (rows of the fc layer, else the model's ``num_classes``), or None."""
    w, _ = adapter.fc_params()
    if w is not None:
        return int(w.shape[0])
    n = getattr(adapter.model, "num_classes", None)
    return int(n) if isinstance(n, int) else None


def _unhooked_copy(adapter: ModelAdapter) -> nn.Module:
    """A deep copy of the adapter's model without the adapter's capture hooks (the copy gets its own)."""
    model = copy.deepcopy(adapter.model)
    ids = {h.id for h in adapter._hooks}
    for m in model.modules():
        for hooks in (m._forward_hooks, m._forward_pre_hooks):
            for i in ids & set(hooks):
                del hooks[i]
    return model


def randomized_copy(adapter: ModelAdapter, seed: int = 0) -> ModelAdapter:
    """A copy of the adapter's model with every parameter re-initialised (``reset_parameters`` of each module,
    under ``torch.manual_seed(seed)``), wrapped the same way: the --sanity-random-model baseline."""

    def reset(model: nn.Module) -> nn.Module:
        torch.manual_seed(seed)
        for m in model.modules():
            if hasattr(m, "reset_parameters") and callable(m.reset_parameters):
                m.reset_parameters()
        return model.eval()

    kw = dict(name=f"{adapter.name} (random init)", input_std=adapter.input_std, transform=adapter.transform)
    if isinstance(adapter, TimmAdapter):
        return TimmAdapter(reset(_unhooked_copy(adapter)), **kw)
    if isinstance(adapter, HookAdapter):
        return HookAdapter(reset(_unhooked_copy(adapter)), fc=adapter.fc_name, pool=adapter.pool_name, **kw)
    if isinstance(adapter, ModuleAdapter):
        head = reset(copy.deepcopy(adapter.model))
        assert isinstance(head, _BackboneHead)  # a ModuleAdapter's model
        return ModuleAdapter(head.backbone, head.fc, head.pool, **kw)
    raise BadInputError(f"--sanity-random-model: cannot re-initialise a {type(adapter).__name__}: pass a timm, "
                        "torchvision-style or backbone+fc model")

