"""Image classifiers by name, wrapped as ``ModelAdapter``: timm names, ``torchvision/<name>``, local checkpoints
(no download), and the CLI's ``--model`` option (also ``py:MODULE:FUNCTION``, a function returning the model).
"""

from __future__ import annotations

import contextlib
import importlib
import os
import re
from pathlib import Path
from typing import Any

import torch
from torch import nn

from isood.core.errors import BadInputError, MissingWeightsError
from isood.core.errors import one_line
from isood.core.hub_access import hub_access, hub_guard

from isood.classifiers.model_option import model_function
from isood.classifiers.adapter import ModelAdapter
from isood.classifiers.models import TimmAdapter, wrap_model

__all__ = ["load_classifier", "adapter_from_option", "read_state_dict", "checkpoint_head_size", "checkpoint_mismatch"]

_TV_PREFIXES = ("torchvision/", "tv/", "torchvision:")


def load_classifier(name: str, *, pretrained: bool = True, checkpoint: str | os.PathLike | None = None,
                    num_classes: int | None = None) -> ModelAdapter:
    """Load an image classifier by name and wrap it (``ModelAdapter``, in eval mode, with its own preprocessing as
    ``.transform``).

    - a timm name (``'resnet50'``, ``'resnet50.a1_in1k'``): ``timm.create_model(name, pretrained=True)``;
    - ``'torchvision/<name>'``: ``torchvision.models.get_model(name, weights='DEFAULT')``;
    - ``checkpoint=PATH``: the architecture with the weights of a local file (timm: ``checkpoint_path``);
    - ``pretrained=False``: random initialisation (seed torch first for a reproducible model).

    Offline without the weights in the local cache -> ``MissingWeightsError`` saying what to pass instead (a timm
    name fails in about a second when the Hugging Face Hub is out of reach, naming ``HF_HUB_OFFLINE``:
    ``isood.core.hub_access``).
    """
    extra: dict[str, Any] = {} if num_classes is None else {"num_classes": int(num_classes)}
    if checkpoint is not None and not Path(checkpoint).is_file():
        raise BadInputError(f"checkpoint '{checkpoint}' does not exist: pass the path of a local weights file")
    if name.startswith(_TV_PREFIXES):
        return _load_torchvision(name.split("/", 1)[-1].split(":", 1)[-1], pretrained, checkpoint, extra)
    import timm
    import timm.data

    hub = checkpoint is None and pretrained
    on_hub = hub and (name.startswith(("hf-hub:", "hf_hub:")) or timm.is_model(name))
    access = hub_access() if on_hub else None  # fail in a second when the Hub is out of reach
    try:
        with contextlib.nullcontext() if access is None else hub_guard(access):
            if checkpoint is not None:
                model = timm.create_model(name, pretrained=False, checkpoint_path=str(checkpoint), **extra)
            else:
                model = timm.create_model(name, pretrained=pretrained, **extra)
    except RuntimeError as e:
        if "Unknown model" in str(e):
            raise BadInputError(f"unknown model '{name}': pass a timm model name (timm.list_models()) or "
                                "'torchvision/<name>'") from None
        raise
    except (OSError, ValueError, ImportError) as e:  # hub unreachable / file not cached (LocalEntryNotFoundError)
        if hub:
            raise MissingWeightsError((access or hub_access()).missing(
                f"pretrained weights for '{name}'", "pass checkpoint=PATH of a local weights file, or "
                "pretrained=False for a randomly initialised model", e)) from None
        raise BadInputError(f"cannot load '{name}' from '{checkpoint}': {type(e).__name__}: {e}".splitlines()[0]) \
            from None
    cfg = timm.data.resolve_data_config(model=model)
    return TimmAdapter(model, name=name, transform=timm.data.create_transform(**cfg))


def _load_torchvision(arch: str, pretrained: bool, checkpoint, extra) -> ModelAdapter:
    import torchvision

    try:
        weights = torchvision.models.get_model_weights(arch).DEFAULT
    except (ValueError, KeyError):
        raise BadInputError(f"unknown torchvision model '{arch}': pass a name from "
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
        model.load_state_dict(read_state_dict(checkpoint))
    fc, pool = ("fc", "avgpool") if hasattr(model, "fc") else ("classifier.1", "avgpool")
    return wrap_model(model, fc=fc, pool=pool, name=f"torchvision/{arch}", transform=weights.transforms())


def read_state_dict(path) -> dict:
    path = str(path)
    if path.endswith(".safetensors"):
        from safetensors.torch import load_file

        return load_file(path)
    sd = torch.load(path, map_location="cpu", weights_only=True)
    return sd.get("state_dict", sd) if isinstance(sd, dict) else sd


def _from_function(option: str) -> ModelAdapter:
    """``py:package.module:function`` -> the wrapped model the function returns (timm preprocessing if timm).
    ``function`` is called without arguments (a module class is instantiated); a module instance is taken as it
    is. Anything else (not callable, a call that fails, a result that is no torch module, a module isood cannot
    find the layers of) is a one-line error naming the option."""
    mod, attr = model_function(option)
    spec = f"{mod}:{attr}"
    try:
        obj = getattr(importlib.import_module(mod), attr)
    except Exception as e:  # noqa: BLE001 -- ImportError, AttributeError or whatever the module's code raises
        raise BadInputError(f"--model {option}: cannot import ({type(e).__name__}: {one_line(e, 120)})") from None
    if isinstance(obj, (nn.Module, ModelAdapter)):
        model = obj
    elif callable(obj):
        try:
            model = obj()
        except Exception as e:  # noqa: BLE001 -- the user's function failed: one line, not its traceback
            raise BadInputError(f"--model {option}: {mod}.{attr}() failed ({type(e).__name__}: {one_line(e, 120)}): "
                                "pass a function that takes no arguments and returns the classifier") from None
    else:
        raise BadInputError(f"--model {option}: {mod}.{attr} is a {type(obj).__name__}, not a function: pass "
                            "py:MODULE:FUNCTION where FUNCTION() returns the classifier (a torch nn.Module)")
    if not isinstance(model, (nn.Module, ModelAdapter)):
        raise BadInputError(f"--model {option}: {mod}.{attr}() returned a {type(model).__name__}, not a torch "
                            "nn.Module: pass a function returning the classifier")
    try:
        adapter = wrap_model(model, name=spec)
    except BadInputError as e:
        raise BadInputError(f"--model {option}: {e}") from None
    if adapter.transform is None and getattr(adapter.model, "pretrained_cfg", None):
        import timm.data  # a timm model built by the user's function: its own preprocessing

        adapter.transform = timm.data.create_transform(**timm.data.resolve_data_config(model=adapter.model))
    return adapter


def adapter_from_option(model: str | None, *, checkpoint: str | None = None, num_classes: int | None = None,
                        n_id_classes: int | None = None) -> ModelAdapter:
    """The classifier of the CLI's ``--model`` (a timm name, ``torchvision/<name>`` or ``py:MODULE:FUNCTION``)
    with ``--checkpoint`` / ``--num-classes`` (default with a checkpoint: ``n_id_classes``)."""
    if model is None:
        raise BadInputError("--model is required with image folders: pass a timm name (e.g. resnet50), "
                            "'torchvision/<name>' or py:MODULE:FUNCTION")
    if model.startswith("py:"):
        return _from_function(model)
    n = num_classes or (n_id_classes if checkpoint else None)
    try:
        return load_classifier(model, checkpoint=checkpoint, num_classes=n)
    except MissingWeightsError:
        instead = ("pass --checkpoint PATH of a local weights file of this architecture (`isood dev tiny-models DIR` "
                   "writes one of test_resnet)")
        if model.startswith(_TV_PREFIXES):  # torchvision downloads from download.pytorch.org, not the Hub
            raise MissingWeightsError(f"--model {model}: no pretrained weights (offline or not in the torch hub "
                                      f"cache): {instead}") from None
        raise MissingWeightsError(hub_access().missing(f"--model {model}", instead)) from None
    except RuntimeError as e:
        if "weights_only" in str(e) or "Weights only" in str(e):  # torch.load refused a pickled object
            raise BadInputError(f"--checkpoint {checkpoint}: torch.load(weights_only=True) refused it: it holds "
                                "pickled Python objects besides tensors, which are not loaded (they could run "
                                "code); save the weights only (torch.save(model.state_dict(), PATH) or "
                                ".safetensors)") from None
        raise BadInputError(checkpoint_mismatch(model, checkpoint, e, n)) from None


def checkpoint_head_size(path) -> int | None:
    """The number of classes of a checkpoint's classifier head: the rows of its last 2-D ``weight`` tensor (timm's
    ``fc`` / ``head`` / ``classifier``); None when the file cannot be read or holds no such tensor."""
    try:
        sd = read_state_dict(path)
    except Exception:  # noqa: BLE001 -- only a hint for the message; the load error itself is reported
        return None
    heads = [v for k, v in sd.items() if k.endswith("weight") and getattr(v, "ndim", 0) == 2] if isinstance(sd, dict) \
        else []
    return int(heads[-1].shape[0]) if heads else None


def checkpoint_mismatch(model: str, checkpoint, error: Exception, num_classes: int | None) -> str:
    """One sentence for a checkpoint that does not fit the architecture: the checkpoint's head size against the
    model's, and the ``--num-classes`` to pass; else the first line of torch's message."""
    head = checkpoint_head_size(checkpoint) if checkpoint else None
    found = re.search(r"shape in current model is torch\.Size\(\[(\d+)", str(error))
    built = int(found.group(1)) if found else num_classes
    if head is not None and head != built:
        return (f"--checkpoint {checkpoint} does not fit {model}: its classifier head has {head} classes, the model "
                f"{built if built is not None else 'another number'}; pass --num-classes {head}")
    text = str(error).strip()
    detail = re.sub(r"^Error\(s\) in loading state_dict for \w+:\s*", "", text).split("\n")[0].strip()[:160] \
        if text else type(error).__name__
    return (f"--checkpoint {checkpoint} does not fit {model} ({detail or 'its tensors differ'}); pass a checkpoint "
            f"of this architecture, or --num-classes N matching its classifier head")
