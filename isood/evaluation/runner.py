"""Run a classifier once per batch and score every chosen OOD detector from what that one pass captured.

- ``ModelAdapter`` turns a classifier into "one forward pass -> logits, penultimate features, pre-pool feature
  maps" plus its final linear layer (``fc``) and its own pooling head. Three kinds: timm models
  (``forward_features`` / ``forward_head(pre_logits=True)`` / ``get_classifier()``), torchvision-style models with
  an ``avgpool`` and a linear ``fc`` (ResNets, RegNets; captured with hooks), and a generic user module given as
  ``backbone`` (image -> feature map or features) + ``fc`` (+ optional ``pool``). Build one with ``wrap_model``
  or ``load_classifier(name)``.
- ``extract_outputs`` captures exactly the requested kinds over a dataset (batch size, device, DataLoader
  workers, optional rich progress bar) and caches them on disk (one safetensors file per kind, per dataset) under
  a key hashing model identity + data identity + preprocessing: a second evaluation with other detectors does
  no forward pass.
- ``run_detectors`` fits the detectors on the ID training outputs and scores every dataset: one forward pass per
  batch serves all post-hoc detectors (ReAct, DICE, ASH and RankFeat re-compute the head from the captured
  tensors); only ODIN re-runs forward + backward on the input.

Cache I/O lives here; the detectors stay pure.
"""

from __future__ import annotations

import hashlib
import json
import os
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Iterable, Mapping, Sequence

import numpy as np
import torch
from torch import nn

from isood.errors import IsoodError, MissingWeightsError

from .detectors import CAPTURE_KINDS, Detector, ForwardOutputs, get_detector, global_average_pool

__all__ = [
    "ModelAdapter",
    "TimmAdapter",
    "HookAdapter",
    "ModuleAdapter",
    "wrap_model",
    "load_classifier",
    "model_identity",
    "cache_key",
    "extract_outputs",
    "run_detectors",
    "DetectorScores",
]

_CACHE_VERSION = 1


# =============================================================================================== adapters
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
    ``provides``. ``identity`` keys the on-disk cache; ``input_std`` is the per-channel std of the model's input
    normalisation (ODIN's perturbation is scaled by it).
    """

    provides: frozenset[str] = frozenset()

    def __init__(self, model: nn.Module, *, name: str | None = None, input_std: Sequence[float] | None = None,
                 transform: Callable | None = None) -> None:
        self.model = model.eval()
        self.name = name or type(model).__name__
        self.input_std = None if input_std is None else tuple(float(s) for s in input_std)
        self.transform = transform
        self._identity: str | None = None
        self.device = torch.device("cpu")
        self.forward_calls = 0  # batches through the backbone (capture passes), for tests and benchmarks

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
            raise IsoodError(f"model '{self.name}' does not expose {', '.join(sorted(missing))}: "
                             f"it provides {', '.join(sorted(self.provides))}")
        self.forward_calls += 1
        out = self._forward(x.to(self.device), kinds)
        return {k: out[k] for k in kinds}

    def empty_outputs(self) -> ForwardOutputs:
        """A ForwardOutputs carrying this model's fc layer and pooling (no per-image arrays)."""
        w, b = self.fc_params()
        return ForwardOutputs(fc_weight=w, fc_bias=b, pool=self._cpu_pool)

    def _cpu_pool(self, feature_maps: torch.Tensor) -> torch.Tensor:
        with torch.no_grad():
            return self.pool(feature_maps.to(self.device)).float().cpu()


class TimmAdapter(ModelAdapter):
    """timm model: ``forward_features`` (pre-pool map for CNNs, tokens for ViTs), ``forward_head`` and the linear
    classifier from ``get_classifier()``.

    What it provides is found once by a probe forward of one blank image (the model's default input size):
    ``feature_maps`` when ``forward_features`` returns N x C x H x W with C = ``num_features`` (CNNs); ``fc`` when
    ``get_classifier()`` is an ``nn.Linear`` that maps ``forward_head(pre_logits=True)`` to the model's logits."""

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
        self._input_size = (chans, *size)
        self._provides: frozenset[str] | None = None

    @property
    def provides(self) -> frozenset[str]:  # type: ignore[override]
        if self._provides is None:
            kinds = {"logits", "features"}
            p = next(self.model.parameters(), None)
            x = torch.zeros(1, *self._input_size, device=p.device if p is not None else "cpu")
            with torch.no_grad():
                fmap = self.model.forward_features(x)
                feats = self.model.forward_head(fmap, pre_logits=True)
                logits = self.model.forward_head(fmap)
                clf = self.model.get_classifier()
                if isinstance(clf, nn.Linear) and feats.dim() == 2 and torch.allclose(
                        clf(feats), logits, rtol=1e-4, atol=1e-4):
                    kinds.add("fc")
            if fmap.dim() == 4 and fmap.shape[1] == getattr(self.model, "num_features", fmap.shape[1]):
                kinds.add("feature_maps")
            self._provides = frozenset(kinds)
        return self._provides

    def _forward(self, x, kinds):
        fmap = self.model.forward_features(x)
        out = {"feature_maps": fmap}
        out["features"] = self.model.forward_head(fmap, pre_logits=True)
        out["logits"] = self.model.forward_head(fmap)
        return out

    def pool(self, feature_maps):
        return self.model.forward_head(feature_maps, pre_logits=True)

    def _linear(self):
        c = self.model.get_classifier()
        return c if isinstance(c, nn.Linear) else None

    def logits(self, x):
        return self.model(x)


class HookAdapter(ModelAdapter):
    """torchvision-style model whose forward ends ``... -> pool module -> flatten -> linear fc`` (ResNet, RegNet,
    Wide-ResNet, ResNeXt; EfficientNet with ``fc='classifier.1'``). One ordinary ``model(x)`` call; forward
    pre-hooks on the pool module and on the fc layer capture the feature maps and the features."""

    def __init__(self, model: nn.Module, *, fc: str = "fc", pool: str = "avgpool", **kwargs) -> None:
        if kwargs.get("input_std") is None:
            kwargs["input_std"] = (0.229, 0.224, 0.225)  # torchvision's ImageNet normalisation
        super().__init__(model, **kwargs)
        try:
            self._fc = model.get_submodule(fc)
            self._pool = model.get_submodule(pool)
        except AttributeError as e:
            raise IsoodError(f"model '{self.name}' has no submodule '{e}': pass fc=/pool= names of its layers, "
                             "or use wrap_model(backbone=..., fc=...)") from None
        if not isinstance(self._fc, nn.Linear):
            raise IsoodError(f"model '{self.name}': '{fc}' is a {type(self._fc).__name__}, not nn.Linear: pass "
                             "fc= the name of its final linear layer")
        self.provides = frozenset({"logits", "features", "feature_maps", "fc"})
        self._captured: dict[str, torch.Tensor] = {}
        self._capturing = False
        self._fc.register_forward_pre_hook(self._grab("features"))
        self._pool.register_forward_pre_hook(self._grab("feature_maps"))

    def _grab(self, key):
        def hook(module, args):
            if self._capturing:  # only during capture passes (not ODIN's forwards)
                self._captured[key] = args[0]
        return hook

    def _forward(self, x, kinds):
        self._captured, self._capturing = {}, True
        try:
            logits = self.model(x)
        finally:
            self._capturing = False
        out = dict(self._captured, logits=logits)
        self._captured = {}
        return out

    def pool(self, feature_maps):
        return torch.flatten(self._pool(feature_maps), 1)

    def _linear(self):
        return self._fc

    def logits(self, x):
        return self.model(x)


class _BackboneHead(nn.Module):
    def __init__(self, backbone: nn.Module, fc: nn.Linear, pool: nn.Module | Callable | None):
        super().__init__()
        self.backbone = backbone
        self.fc = fc
        if isinstance(pool, nn.Module):
            self.pool = pool
        else:
            self.pool = pool if pool is not None else global_average_pool  # plain callable, not a submodule

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
            raise IsoodError(f"fc must be an nn.Linear (the final layer), got {type(fc).__name__}")
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
            raise IsoodError(f"model '{self.name}': the backbone returns features, not feature maps "
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
            raise IsoodError("pass either model or backbone + fc, not both")
        if fc is None or isinstance(fc, str):
            raise IsoodError("wrap_model(backbone=...) needs fc= the final nn.Linear layer")
        return ModuleAdapter(backbone, fc, None if isinstance(pool, str) else pool, **kw)
    if model is None:
        raise IsoodError("wrap_model needs a model, or backbone= and fc=")
    if all(hasattr(model, a) for a in ("forward_features", "forward_head", "get_classifier")) and fc is None:
        return TimmAdapter(model, **kw)
    fc_name = fc if isinstance(fc, str) else "fc"
    pool_name = pool if isinstance(pool, str) else "avgpool"
    names = dict(model.named_modules())
    if fc_name in names and pool_name in names:
        return HookAdapter(model, fc=fc_name, pool=pool_name, **kw)
    raise IsoodError(f"cannot find the layers of {type(model).__name__}: pass a timm model, a model with "
                     "'avgpool' and 'fc' (or fc=/pool= names), or wrap_model(backbone=..., fc=...)")


_TV_PREFIXES = ("torchvision/", "tv/", "torchvision:")


def load_classifier(name: str, *, pretrained: bool = True, checkpoint: str | os.PathLike | None = None,
                    num_classes: int | None = None) -> ModelAdapter:
    """Load an image classifier by name and wrap it (``ModelAdapter``, in eval mode, with its own preprocessing as
    ``.transform``).

    - a timm name (``'resnet50'``, ``'resnet50.a1_in1k'``): ``timm.create_model(name, pretrained=True)``;
    - ``'torchvision/<name>'``: ``torchvision.models.get_model(name, weights='DEFAULT')``;
    - ``checkpoint=PATH``: the architecture with the weights of a local file (timm: ``checkpoint_path``);
    - ``pretrained=False``: random initialisation (seed torch first for a reproducible model).

    Offline without the weights in the local cache -> ``MissingWeightsError`` saying what to pass instead.
    """
    extra = {} if num_classes is None else {"num_classes": int(num_classes)}
    if checkpoint is not None and not Path(checkpoint).is_file():
        raise IsoodError(f"checkpoint '{checkpoint}' does not exist: pass the path of a local weights file")
    if name.startswith(_TV_PREFIXES):
        return _load_torchvision(name.split("/", 1)[-1].split(":", 1)[-1], pretrained, checkpoint, extra)
    import timm
    import timm.data

    try:
        if checkpoint is not None:
            model = timm.create_model(name, pretrained=False, checkpoint_path=str(checkpoint), **extra)
        else:
            model = timm.create_model(name, pretrained=pretrained, **extra)
    except RuntimeError as e:
        if "Unknown model" in str(e):
            raise IsoodError(f"unknown model '{name}': pass a timm model name (timm.list_models()) or "
                             "'torchvision/<name>'") from None
        raise
    except (OSError, ValueError, ImportError) as e:  # hub unreachable / file not cached (LocalEntryNotFoundError)
        if checkpoint is None and pretrained:
            raise MissingWeightsError(
                f"no pretrained weights for '{name}' (offline or not in the local cache): pass checkpoint=PATH of a "
                f"local weights file, or pretrained=False for a randomly initialised model") from None
        raise IsoodError(f"cannot load '{name}' from '{checkpoint}': {type(e).__name__}: {e}".splitlines()[0]) \
            from None
    cfg = timm.data.resolve_data_config(model=model)
    return TimmAdapter(model, name=name, transform=timm.data.create_transform(**cfg))


def _load_torchvision(arch: str, pretrained: bool, checkpoint, extra) -> ModelAdapter:
    import torchvision

    try:
        weights = torchvision.models.get_model_weights(arch).DEFAULT
    except (ValueError, KeyError):
        raise IsoodError(f"unknown torchvision model '{arch}': pass a name from "
                         "torchvision.models.list_models()") from None
    use = weights if (pretrained and checkpoint is None) else None
    try:
        model = torchvision.models.get_model(arch, weights=use, **extra)
    except (OSError, RuntimeError):  # download impossible (URLError is an OSError)
        if use is None:
            raise
        raise MissingWeightsError(
            f"no pretrained weights for 'torchvision/{arch}' (offline or not in the torch hub cache): pass "
            f"checkpoint=PATH of a local weights file, or pretrained=False for a randomly initialised model") \
            from None
    if checkpoint is not None:
        model.load_state_dict(_read_state_dict(checkpoint))
    fc, pool = ("fc", "avgpool") if hasattr(model, "fc") else ("classifier.1", "avgpool")
    return wrap_model(model, fc=fc, pool=pool, name=f"torchvision/{arch}", transform=weights.transforms())


def _read_state_dict(path) -> dict:
    path = str(path)
    if path.endswith(".safetensors"):
        from safetensors.torch import load_file

        return load_file(path)
    sd = torch.load(path, map_location="cpu", weights_only=True)
    return sd.get("state_dict", sd) if isinstance(sd, dict) else sd


# ================================================================================================== data
def _loader(data, batch_size: int, num_workers: int):
    if isinstance(data, torch.utils.data.DataLoader):
        return data
    if isinstance(data, np.ndarray):
        data = torch.from_numpy(data)
    if isinstance(data, torch.Tensor):
        data = torch.utils.data.TensorDataset(data)
    return torch.utils.data.DataLoader(data, batch_size=batch_size, shuffle=False, num_workers=num_workers)


def _split_batch(batch) -> tuple[torch.Tensor, torch.Tensor | None]:
    """(images, labels or None) from a batch that is a tensor, a (image, label, ...) sequence or a dict."""
    if isinstance(batch, torch.Tensor):
        return batch, None
    if isinstance(batch, Mapping):
        for k in ("image", "pixel_values", "img", "input"):
            if k in batch:
                y = batch.get("label", batch.get("labels"))
                return batch[k], (torch.as_tensor(y) if y is not None else None)
        raise IsoodError(f"batch dict has no image key (image / pixel_values): got {sorted(batch)}")
    if isinstance(batch, (list, tuple)) and batch:
        y = batch[1] if len(batch) > 1 and isinstance(batch[1], torch.Tensor) else None
        return batch[0], y
    raise IsoodError(f"cannot read images from a batch of type {type(batch).__name__}: yield tensors or "
                     "(image, label) pairs")


def _progress(iterable, total, desc, enabled):
    if not enabled:
        yield from iterable
        return
    from rich.progress import Progress

    with Progress(transient=True) as bar:
        task = bar.add_task(desc, total=total)
        for item in iterable:
            yield item
            bar.advance(task)


# ================================================================================================= cache
def cache_key(model_id: str, data_id: str, preprocess_id: str = "") -> str:
    """Hex key of (model identity, data identity, preprocessing) for the on-disk output cache."""
    h = hashlib.sha256(json.dumps([_CACHE_VERSION, model_id, data_id, preprocess_id]).encode())
    return h.hexdigest()[:32]


class _Cache:
    """``<cache_dir>/<key>/<kind>.safetensors`` + ``meta.json``; files are written atomically."""

    def __init__(self, root, key: str, meta: dict) -> None:
        self.dir = Path(root) / key
        self.meta = meta

    def _path(self, kind: str) -> Path:
        return self.dir / f"{kind}.safetensors"

    def has(self, kind: str) -> bool:
        return self._path(kind).is_file()

    def load(self, kind: str) -> np.ndarray:
        from safetensors.numpy import load_file

        return load_file(str(self._path(kind)))[kind]

    def save(self, kind: str, array: np.ndarray) -> None:
        from safetensors.numpy import save_file

        self.dir.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=self.dir, suffix=".tmp")
        os.close(fd)
        try:
            save_file({kind: np.ascontiguousarray(array)}, tmp)
            os.replace(tmp, self._path(kind))
        finally:
            if os.path.exists(tmp):
                os.remove(tmp)
        meta_tmp = self.dir / "meta.json.tmp"
        meta_tmp.write_text(json.dumps(self.meta, indent=1))
        os.replace(meta_tmp, self.dir / "meta.json")


def _score_kind(detector: Detector, input_std) -> str:
    """Cache name of an input detector's scores: its name + a hash of its parameters and the input std used."""
    std = getattr(detector, "input_std", None) or input_std
    h = hashlib.blake2b(json.dumps([sorted(detector.params().items()), std], default=str).encode(), digest_size=6)
    return f"score.{detector.name}.{h.hexdigest()}"


# ================================================================================================ extract
def extract_outputs(
    adapter: ModelAdapter,
    data,
    kinds: Iterable[str] = ("logits",),
    *,
    batch_size: int = 64,
    device: str | torch.device = "cpu",
    num_workers: int = 0,
    progress: bool = False,
    cache_dir: str | os.PathLike | None = None,
    data_id: str | None = None,
    preprocess_id: str = "",
    input_detectors: Mapping[str, Detector] | Sequence[Detector] = (),
    desc: str = "forward",
) -> tuple[ForwardOutputs, dict[str, np.ndarray]]:
    """Capture ``kinds`` (among logits / features / feature_maps) for every image of ``data`` in ONE forward
    pass per batch, and score the ``input_detectors`` (ODIN) on the same batches.

    ``data``: a torch Dataset (items: image tensor, ``(image, label, ...)``, or a dict with ``image``/``label``), a
    DataLoader, or an (N, C, H, W) tensor / array. Labels are kept when the data yields them.
    With ``cache_dir`` and ``data_id`` (a string naming the data, e.g. a manifest hash + split; tensors are hashed
    when no id is given) outputs are read from / written to the cache; only missing kinds cost a pass.
    ``input_detectors``: detectors needing the model on the input (ODIN), as a sequence or a dict name -> detector.
    Returns ``(outputs, input_scores)`` with ``input_scores[name]`` their per-image scores.
    """
    if not isinstance(input_detectors, Mapping):
        input_detectors = {d.name: d for d in input_detectors}
    kinds = frozenset(kinds) & set(CAPTURE_KINDS)
    missing = kinds - adapter.provides
    if missing:
        raise IsoodError(f"model '{adapter.name}' does not expose {', '.join(sorted(missing))}")
    adapter.to(device)
    cache = None
    if cache_dir is not None:
        if data_id is None:
            if isinstance(data, (torch.Tensor, np.ndarray)):
                arr = data.detach().cpu().numpy() if isinstance(data, torch.Tensor) else np.asarray(data)
                data_id = "array:" + hashlib.blake2b(np.ascontiguousarray(arr).tobytes(), digest_size=16).hexdigest()
            else:
                raise IsoodError("caching needs data_id= a string naming this dataset (e.g. manifest hash + split)")
        meta = {"model": adapter.identity, "data": data_id, "preprocess": preprocess_id, "version": _CACHE_VERSION}
        cache = _Cache(cache_dir, cache_key(adapter.identity, data_id, preprocess_id), meta)

    wanted = set(kinds) | {"labels"}
    score_kinds = {n: _score_kind(d, adapter.input_std) for n, d in input_detectors.items()}
    got: dict[str, np.ndarray] = {}
    if cache is not None:
        for k in list(wanted) + list(score_kinds.values()):
            if cache.has(k):
                got[k] = cache.load(k)
    todo_kinds = kinds - set(got)
    todo_input = {n: d for n, d in input_detectors.items() if score_kinds[n] not in got}
    # labels are saved whenever a pass sees them, so a cache hit without a labels file means "no labels"
    if todo_kinds or todo_input:
        parts: dict[str, list[np.ndarray]] = {k: [] for k in todo_kinds}
        labels: list[np.ndarray] = []
        input_parts: dict[str, list[np.ndarray]] = {n: [] for n in todo_input}
        loader = _loader(data, batch_size, num_workers)
        total = len(loader) if hasattr(loader, "__len__") else None
        for batch in _progress(loader, total, desc, progress):
            x, y = _split_batch(batch)
            x = x.to(adapter.device)
            if todo_kinds:
                out = adapter.forward(x, todo_kinds)
                for k in todo_kinds:
                    parts[k].append(out[k].detach().float().cpu().numpy())
            if y is not None:
                labels.append(y.cpu().numpy())
            for n, d in todo_input.items():
                input_parts[n].append(d.score_inputs(adapter.logits, x, adapter.input_std))
        for k in todo_kinds:
            got[k] = _cat(parts[k])
            if cache is not None:
                cache.save(k, got[k])
        for n in todo_input:
            got[score_kinds[n]] = _cat(input_parts[n])
            if cache is not None:
                cache.save(score_kinds[n], got[score_kinds[n]])
        if labels and "labels" not in got:
            got["labels"] = np.concatenate(labels)
            if cache is not None:
                cache.save("labels", got["labels"])
    outputs = adapter.empty_outputs()
    for k in kinds:
        setattr(outputs, k, got[k])
    outputs.labels = got.get("labels")
    return outputs, {name: got[sk] for name, sk in score_kinds.items()}


def _cat(parts: list[np.ndarray]) -> np.ndarray:
    if not parts:
        raise IsoodError("the dataset yielded no image: an empty dataset cannot be evaluated")
    return np.concatenate(parts, axis=0)


# ================================================================================================ detectors
@dataclass
class DetectorScores:
    """Scores per detector and dataset, plus what the metrics need from the classifier.

    ``scores[detector][dataset]`` (N,) higher = more ID; ``predictions[dataset]`` argmax of the logits;
    ``labels[dataset]`` the data's labels or None; the ID training set appears under ``train_name`` when
    ``score_train=True`` (DER needs its scores and correctness).
    """

    scores: dict[str, dict[str, np.ndarray]] = field(default_factory=dict)
    predictions: dict[str, np.ndarray] = field(default_factory=dict)
    labels: dict[str, np.ndarray | None] = field(default_factory=dict)
    train_name: str = "id_train"

    def correct(self, dataset: str) -> np.ndarray:
        """Boolean: prediction == label (raises when the dataset has no labels)."""
        y = self.labels.get(dataset)
        if y is None:
            raise IsoodError(f"dataset '{dataset}' has no labels: correctness (DER, AUROC_M) needs them")
        return self.predictions[dataset] == y


def _resolve(detectors) -> dict[str, Detector]:
    if isinstance(detectors, (str, Detector)):
        detectors = [detectors]
    if isinstance(detectors, Mapping):
        return dict(detectors)
    out = {}
    for d in detectors:
        det = get_detector(d) if isinstance(d, str) else d
        out[d if isinstance(d, str) else det.name] = det
    return out


def run_detectors(
    adapter: ModelAdapter,
    detectors,
    datasets: Mapping[str, object],
    *,
    id_train=None,
    train_labels: np.ndarray | None = None,
    score_train: bool = False,
    batch_size: int = 64,
    device: str | torch.device = "cpu",
    num_workers: int = 0,
    progress: bool = False,
    cache_dir: str | os.PathLike | None = None,
    data_ids: Mapping[str, str] | None = None,
    preprocess_id: str = "",
) -> DetectorScores:
    """Fit ``detectors`` on ``id_train`` and score every dataset of ``datasets`` (name -> data).

    ``detectors``: names (``get_detector``), ``Detector`` instances, or a dict name -> instance. One forward pass per
    batch captures the union of what they need (plus logits, for predictions); the ID training set is passed only
    if a detector needs fitting (or ``score_train``). ``train_labels`` override the labels the training data yields
    (MDS needs real labels). ``data_ids`` (dataset name -> identity string; the training set under ``'id_train'``)
    enable the on-disk cache in ``cache_dir``.
    """
    dets = _resolve(detectors)
    if not dets:
        raise IsoodError("no detector given: pass names such as 'msp', 'energy'")
    for name, d in dets.items():
        lack = set(d.requires) - {"input"} - set(adapter.provides)
        if lack:
            raise IsoodError(f"detector '{name}' needs {', '.join(sorted(lack))}, which model '{adapter.name}' "
                             f"does not expose (it provides {', '.join(sorted(adapter.provides))})")
    post = {n: d for n, d in dets.items() if "input" not in d.requires}
    inputs = {n: d for n, d in dets.items() if "input" in d.requires}
    kinds = set().union(*(d.requires for d in post.values())) if post else set()
    kinds = (kinds | {"logits"}) & set(CAPTURE_KINDS)
    data_ids = dict(data_ids or {})
    common = dict(batch_size=batch_size, device=device, num_workers=num_workers, progress=progress,
                  cache_dir=cache_dir if data_ids else None, preprocess_id=preprocess_id)
    result = DetectorScores()

    fit_needed = [d for d in post.values() if d.needs_fit]
    if fit_needed or score_train:
        if id_train is None:
            names = ", ".join(d.name for d in fit_needed) or "score_train"
            raise IsoodError(f"{names} need the ID training data: pass id_train=")
        train_kinds = (set().union(*(d.requires for d in fit_needed)) | {"logits"}) & set(CAPTURE_KINDS)
        if score_train:
            train_kinds |= kinds
        tr, tr_inputs = extract_outputs(adapter, id_train, train_kinds, data_id=data_ids.get(result.train_name),
                                        input_detectors=inputs if score_train else (), desc="ID train", **common)
        if train_labels is not None:
            tr.labels = np.asarray(train_labels)
        n_classes = tr.logits.shape[1]
        if tr.labels is not None and len(tr.labels) != len(tr):
            raise IsoodError(f"{len(tr.labels)} training labels for {len(tr)} training images")
        if tr.labels is not None and (tr.labels.min() < 0 or tr.labels.max() >= n_classes):
            raise IsoodError(f"ID training labels span [{tr.labels.min()}, {tr.labels.max()}] but model "
                             f"'{adapter.name}' has {n_classes} classes: use the model trained on these classes")
        for d in fit_needed:
            d.fit(tr, tr.labels)
        if score_train:
            datasets = {result.train_name: None, **datasets}
    for ds_name, data in datasets.items():
        if ds_name == result.train_name and score_train and data is None:
            outs, in_scores = tr, tr_inputs
        else:
            outs, in_scores = extract_outputs(adapter, data, kinds, data_id=data_ids.get(ds_name),
                                              input_detectors=inputs, desc=ds_name, **common)
        result.predictions[ds_name] = outs.logits.argmax(axis=1)
        result.labels[ds_name] = outs.labels
        for name, d in dets.items():
            s = in_scores[name] if "input" in d.requires else d.score(outs)
            result.scores.setdefault(name, {})[ds_name] = np.asarray(s, dtype=np.float64)
    return result
