"""The model adapters: timm models, torchvision-style models and a user's backbone + fc, each a
:class:`isood.classifiers.adapter.ModelAdapter` (one forward pass -> logits, penultimate features, pre-pool feature
maps; ResNets (torchvision or timm: ``layer3`` -> ``layer4`` -> pool -> fc) also ``block3`` and ``tail``).

Three kinds: timm models (``forward_features`` / ``forward_head(pre_logits=True)`` / ``get_classifier()``),
torchvision-style models with an ``avgpool`` and a linear ``fc`` (ResNets, RegNets; captured with hooks), and a
user module given as ``backbone`` (image -> feature map or features) + ``fc`` (+ optional ``pool``). Build one with
``wrap_model`` (or by name: ``isood.classifiers.named``); ``randomized_copy`` re-initialises one (the
``--sanity-random-model`` baseline).
"""

from __future__ import annotations

import copy
from typing import Any, Callable, Sequence

import torch
from torch import nn

from isood.classifiers.adapter import ModelAdapter
from isood.core.errors import BadInputError

__all__ = ["TimmAdapter", "HookAdapter", "ModuleAdapter", "wrap_model", "model_classes", "randomized_copy"]


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

