"""A CLIP model as a zero-shot classifier (``--model clip:SPEC``), for the MCM and GL-MCM detectors.

The IS-OOD benchmark is built on CLIP; its zero-shot classifier is CLIP itself: each ID class ``c`` becomes the
prompt ``"a photo of a <name of c>"`` (the template of the MCM and GL-MCM code), its text feature ``t_c`` (open_clip,
L2-normalised, ``isood.features.clip.encode_texts``), and an image ``x`` gets

* ``features`` = ``f(x) / |f(x)|``, the L2-normalised image embedding (``encode_image``);
* ``logits`` = ``features @ T.T``: the cosine similarities with the class prompts, WITHOUT CLIP's logit scale
  (MCM applies its own temperature, T = 1); so ``fc`` is the linear layer of weight ``T`` (C, D) and no bias, and
  the feature-based detectors (KNN, MDS, ViM, ...) work on CLIP features too;
* ``local_logits`` (N, P, C): the cosine similarities of P local features with the prompts (GL-MCM).

Local features as GL-MCM computes them (its ``clip/model.py``): for a ViT, the patch tokens of the last block run
with its attention replaced by the value path (``v = x + out_proj(v_proj(ln_1(x)))``, then ``v + mlp(ln_2(v))``),
``ln_post`` and the projection; for a ModifiedResNet, ``c_proj(v_proj(.))`` of the last feature map (the attention
pool's input) at every position. This module does the same on open_clip's ``VisionTransformer`` (standard
``ResidualAttentionBlock``\\s with ``nn.MultiheadAttention``, no attentional pooler; LayerScale is applied where the
block has it, GL-MCM's OpenAI blocks have none) and ``ModifiedResNet``. Where it differs from GL-MCM's code:
open_clip's own towers are used (GL-MCM ships a patched copy of OpenAI's CLIP; the numbers agree for the same
weights), the features are float32 on CPU and under CUDA autocast (fp16) on GPU, and another image tower (timm
trunks, attentional poolers) provides no ``local_logits``: ``glmcm`` is then refused before any pass.
"""

from __future__ import annotations

from typing import Any, Mapping, Sequence

import torch
import torch.nn.functional as F
from torch import nn

from isood.core.errors import BadInputError

from .classes import imagenet_1k
from .adapter import ModelAdapter

__all__ = ["PROMPT", "class_prompts", "clip_imagenet_names", "ClipZeroShot", "ClipZeroShotAdapter", "clip_zero_shot", "local_features"]

#: The prompt template of MCM's and GL-MCM's code.
PROMPT = "a photo of a {}"


def clip_imagenet_names() -> dict[str, str]:
    """wnid -> the cleaned class name CLIP's and MCM's papers prompt with (open_clip's ``IMAGENET_CLASSNAMES``,
    listed in the order of the 1,000 sorted ImageNet-1K wnids: "hammerhead shark", not the first WordNet lemma
    "hammerhead")."""
    from open_clip import IMAGENET_CLASSNAMES

    wnids = imagenet_1k()
    assert len(wnids) == len(IMAGENET_CLASSNAMES), "open_clip lists one name per ImageNet-1K class"
    return dict(zip(wnids, IMAGENET_CLASSNAMES))


def class_prompts(classes: Sequence[str], names: Mapping[str, str] | None = None) -> list[str]:
    """One prompt per class: ``PROMPT`` of its name: ``names[c]`` when given (``--classes``' second column), else
    for an ImageNet-1K wnid CLIP's cleaned class name (``clip_imagenet_names``), else the first lemma of a wnid
    (timm's ImageNet lemma file, ``wordnet_tools.synsets.imagenet_names``), else the class text itself."""
    from wordnet_tools.synsets import imagenet_names
    from wordnet_tools.wnids import is_wnid

    names = dict(names or {})
    unnamed = [c for c in classes if is_wnid(c) and c not in names]
    clip_names = clip_imagenet_names() if unnamed else {}
    lemmas = imagenet_names() if any(c not in clip_names for c in unnamed) else {}
    out = []
    for c in classes:
        name = names.get(c) or clip_names.get(c) or (lemmas.get(c) if is_wnid(c) else None) or c
        if is_wnid(name):
            raise BadInputError(f"class {c} has no name (not in timm's ImageNet lemma list): give it one in --classes "
                                "('<wnid> <name>' per line)")
        out.append(PROMPT.format(name.replace("_", " ")))
    return out


def _vit_supported(visual: nn.Module) -> bool:
    from open_clip.transformer import ResidualAttentionBlock, VisionTransformer

    if not isinstance(visual, VisionTransformer) or getattr(visual, "attn_pool", None) is not None:
        return False
    blocks = list(visual.transformer.resblocks)
    return bool(blocks) and all(type(b) is ResidualAttentionBlock and isinstance(b.attn, nn.MultiheadAttention)
                                and b.attn.in_proj_weight is not None for b in blocks)


def _rn_supported(visual: nn.Module) -> bool:
    from open_clip.modified_resnet import ModifiedResNet

    return isinstance(visual, ModifiedResNet)


def _vit_global_local(visual: Any, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(global embedding (N, D), local features (N, P, D)) of an open_clip ViT, GL-MCM's way (module docstring).
    ``visual``: an open_clip ``VisionTransformer`` (``_vit_supported``; its submodules are untyped)."""
    tr = visual.transformer
    h = visual._embeds(x)
    if not tr.batch_first:
        h = h.transpose(0, 1)
    blocks = list(tr.resblocks)
    for block in blocks[:-1]:
        h = block(h)
    last = blocks[-1]
    out = last(h)
    width = h.shape[-1]
    w, b = last.attn.in_proj_weight, last.attn.in_proj_bias
    v = F.linear(last.ln_1(h), w[2 * width:], None if b is None else b[2 * width:])
    v = h + last.ls_1(last.attn.out_proj(v))
    v = v + last.ls_2(last.mlp(last.ln_2(v)))
    if not tr.batch_first:
        out, v = out.transpose(0, 1), v.transpose(0, 1)
    pooled, _ = visual._pool(out)
    local = visual.ln_post(v[:, 1:])
    if visual.proj is not None:
        pooled, local = pooled @ visual.proj, local @ visual.proj
    return pooled, local


def _rn_global_local(visual: Any, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(global embedding, local features (N, H*W, D)) of an open_clip ModifiedResNet (``_rn_supported``): the
    attention pool's output and ``c_proj(v_proj(.))`` of its input map at every position (GL-MCM's
    ``AttentionPool2d``)."""
    grabbed: dict[str, torch.Tensor] = {}
    pool = visual.attnpool
    handle = pool.register_forward_pre_hook(lambda module, args: grabbed.__setitem__("map", args[0]))
    try:
        pooled = visual(x)
    finally:
        handle.remove()
    fmap = grabbed["map"].permute(0, 2, 3, 1)
    local = pool.c_proj(pool.v_proj(fmap))
    return pooled, local.flatten(1, 2)


def local_features(visual: nn.Module, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(global image embedding (N, D), local features (N, P, D)) of an open_clip image tower (a ViT or a
    ModifiedResNet), unnormalised; a one-line error for another tower."""
    if _vit_supported(visual):
        return _vit_global_local(visual, x)
    if _rn_supported(visual):
        return _rn_global_local(visual, x)
    raise BadInputError(f"no local features for a {type(visual).__name__} image tower: GL-MCM needs an open_clip "
                        "ViT (standard blocks, no attentional pooler) or ModifiedResNet")


class ClipZeroShot(nn.Module):
    """CLIP's image tower + the class prompts' text features (a buffer): ``forward`` gives the cosine
    similarities (N, C)."""

    text_features: torch.Tensor  # a registered buffer

    def __init__(self, visual: nn.Module, text_features: torch.Tensor) -> None:
        super().__init__()
        self.visual = visual
        self.register_buffer("text_features", F.normalize(text_features.float(), dim=-1))

    def image_features(self, x: torch.Tensor) -> torch.Tensor:
        return F.normalize(self.visual(x).float(), dim=-1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.image_features(x) @ self.text_features.T


class ClipZeroShotAdapter(ModelAdapter):
    """A ``ClipZeroShot`` as a ``ModelAdapter`` (module docstring): logits, features, fc and, for a ViT or
    ModifiedResNet tower, ``local_logits``."""

    zero_shot = True

    def __init__(self, model: ClipZeroShot, **kwargs) -> None:
        super().__init__(model, **kwargs)
        self._local = _vit_supported(model.visual) or _rn_supported(model.visual)
        self.provides = frozenset({"logits", "features", "fc"} | ({"local_logits"} if self._local else set()))
        t = model.text_features
        self._fc = nn.Linear(t.shape[1], t.shape[0], bias=False)
        with torch.no_grad():
            self._fc.weight.copy_(t)

    def _forward(self, x, kinds):
        m = self.model
        if "local_logits" in kinds:
            glob, local = local_features(m.visual, x)
            feats = F.normalize(glob.float(), dim=-1)
            out = {"local_logits": F.normalize(local.float(), dim=-1) @ m.text_features.T}
        else:
            feats, out = m.image_features(x), {}
        out["features"] = feats
        out["logits"] = feats @ m.text_features.T
        return out

    def pool(self, feature_maps):
        raise BadInputError(f"model '{self.name}' has no feature maps: use detectors on logits or features")

    def _linear(self):
        return self._fc

    def logits(self, x):
        return self.model(x)

    def to(self, device):
        super().to(device)
        self._fc.to(self.device)
        return self


def _normalize_std(preprocess) -> tuple[float, ...] | None:
    for t in getattr(preprocess, "transforms", []):
        if hasattr(t, "std"):
            return tuple(float(s) for s in t.std)
    return None


def clip_zero_shot(spec: str, classes: Sequence[str], *, names: Mapping[str, str] | None = None,
                   device: str | torch.device | None = None) -> ClipZeroShotAdapter:
    """The CLIP zero-shot classifier of an open_clip ``spec`` (``isood.features.clip.load_clip``: ``MODEL:PRETRAINED``,
    ``local-dir:PATH``, ``hf-hub:...``) over ``classes`` (wnids or class names, in logit order; ``names``: wnid ->
    name for the prompts, ``class_prompts``), with open_clip's preprocessing as its transform."""
    from isood.features.clip import encode_texts, load_clip

    classes = list(classes)
    if not classes:
        raise BadInputError(f"clip:{spec}: no classes: pass --classes FILE or --id-train")
    encoder = load_clip(spec, device=str(device) if device is not None else None)
    text = torch.from_numpy(encode_texts(encoder, class_prompts(classes, names)))
    visual = encoder.model.visual
    assert isinstance(visual, nn.Module)  # an open_clip model's image tower
    model = ClipZeroShot(visual, text).eval()
    adapter = ClipZeroShotAdapter(model, name=f"clip:{spec}", input_std=_normalize_std(encoder.preprocess),
                                  transform=encoder.preprocess)
    return adapter.to(encoder.device)
