"""The image preprocessing of ``isood evaluate``, per dataset: named presets (``--preprocess``).

Every dataset of an evaluation (the ID training and test sets and each OOD set) is turned into model inputs by one
transform; ``--preprocess PRESET`` names it for all of them and ``--preprocess NAME=PRESET`` for one dataset
(``id_train``, ``id_test``, ``splits``, ``syn-is`` or an ``--ood`` name). The presets:

* ``model`` (default): the model's own preprocessing (timm's data config for a timm model, the weights' transform
  for torchvision, open_clip's for a CLIP model; ``capture.default_transform`` when it has none);
* ``imagenet``: Resize(256) + CenterCrop(224) + ImageNet mean/std (bilinear), ``capture.default_transform``;
* ``openood``: OpenOOD v1.5's ImageNet test preprocessing (``evaluation_api.preprocessor``: convert to RGB,
  Resize(256, bilinear), CenterCrop(224), ImageNet mean/std): numerically the ``imagenet`` transform;
* ``timm``: ``timm.data.create_transform(**timm.data.resolve_data_config(model=...))`` (timm's defaults for a
  model without a timm data config: 224 px, crop_pct 0.875, bicubic, ImageNet mean/std);
* ``release-1k``: the IS-OOD release's ImageNet-1K / Syn-IS transform (its ``datasets.py``: Resize(256) +
  CenterCrop(224) + ImageNet mean/std);
* ``release-21k``: the release's transform for its (resized) ImageNet-21K cells: Resize(224) + CenterCrop(224) +
  ImageNet mean/std;
* ``release``: per dataset as the release does: ``release-21k`` for a ``splits`` manifest (the release's grid is
  ImageNet-21K), ``release-1k`` for every other dataset (the ID sets, Syn-IS, image lists); an import of the
  release's Syn-IS lists (``import isood-lists .../imglist/SynIS``: a splits manifest whose release folder is
  ``SynIS``) counts as Syn-IS.

The transform of each dataset (its preset and ``repr``) is recorded in the evaluation manifest's config
(``preprocess``) and keys the output cache. Nothing heavy is imported at module level (``options`` reads
``PRESETS`` before torch loads).
"""

from __future__ import annotations

from typing import Callable, Mapping

from isood.core.errors import BadInputError

__all__ = ["PRESETS", "DEFAULT_PRESET", "RELEASE_PRESETS", "check_preset", "dataset_preset", "preset_transform",
           "imagenet_transform", "describe"]

DEFAULT_PRESET = "model"
#: ``release`` resolves per dataset to one of these.
RELEASE_PRESETS = ("release-1k", "release-21k")
PRESETS = (DEFAULT_PRESET, "imagenet", "openood", "timm", "release", *RELEASE_PRESETS)
_IMAGENET_MEAN, _IMAGENET_STD = (0.485, 0.456, 0.406), (0.229, 0.224, 0.225)


def check_preset(preset: str, where: str = "--preprocess") -> str:
    """``preset`` if it is one of ``PRESETS``, else a one-line error naming them."""
    if preset not in PRESETS:
        raise BadInputError(f"{where}: unknown preset {preset!r}; pass one of {', '.join(PRESETS)}")
    return preset


def dataset_preset(preset: str, kind: str) -> str:
    """The preset a dataset of ``kind`` ('splits', 'syn-is', 'image-list', 'id') gets from ``preset``: ``release``
    resolves to ``release-21k`` for splits manifests and ``release-1k`` otherwise; other presets are kept."""
    check_preset(preset)
    if preset != "release":
        return preset
    return "release-21k" if kind == "splits" else "release-1k"


def imagenet_transform(resize: int, crop: int = 224) -> Callable:
    """Resize(``resize``, bilinear), CenterCrop(``crop``), ToTensor, ImageNet mean/std (images are decoded to RGB
    before any transform: ``capture.ImageList``)."""
    from torchvision import transforms as T

    return T.Compose([T.Resize(resize, interpolation=T.InterpolationMode.BILINEAR), T.CenterCrop(crop),
                      T.ToTensor(), T.Normalize(_IMAGENET_MEAN, _IMAGENET_STD)])


def _timm_transform(model) -> Callable:
    import timm.data

    cfg = timm.data.resolve_data_config(model=model) if getattr(model, "pretrained_cfg", None) else \
        timm.data.resolve_data_config({})
    return timm.data.create_transform(**cfg)


def preset_transform(preset: str, adapter=None) -> Callable:
    """The transform of a resolved preset (not ``release``: ``dataset_preset`` first); ``adapter``: the
    ``ModelAdapter`` whose own transform ``model`` means (and whose torch module ``timm`` reads)."""
    from .image_list import default_transform

    check_preset(preset)
    if preset == "release":
        raise BadInputError("preset 'release' depends on the dataset: resolve it with dataset_preset first")
    if preset == DEFAULT_PRESET:
        own = getattr(adapter, "transform", None)
        return own if own is not None else default_transform()
    if preset == "timm":
        return _timm_transform(getattr(adapter, "model", None))
    return imagenet_transform(224 if preset == "release-21k" else 256)


def describe(transforms: Mapping[str, tuple[str, Callable | None]]) -> dict[str, dict[str, str]]:
    """``{dataset: {'preset': ..., 'transform': repr}}``: what the manifest records."""
    return {name: {"preset": preset, "transform": repr(tf)} for name, (preset, tf) in transforms.items()}
