"""Tiny models with random weights, built from the real library classes, and a tiny image world to run them on.

They load through the same loaders as real weights, so every isood command can run offline in seconds:

* ``build_tiny_clip(folder)``: an ``open_clip.model.CLIP`` (embed_dim 32, ViT 64 wide / 2 layers / patch 8 / 32 px,
  text tower 64 / 2 heads / 2 layers, open_clip's BPE vocabulary) saved as ``open_clip_config.json`` +
  ``open_clip_model.safetensors``: ``--clip local-dir:FOLDER``;
* ``build_tiny_sdxl()``: a ``diffusers.StableDiffusionXLPipeline`` (UNet with ``addition_embed_type='text_time'``, a
  2-block VAE, two 2-layer CLIP text encoders, Euler scheduler) with a ``CLIPTokenizer`` built in memory from
  open_clip's bundled BPE file (``clip_bpe_tokenizer``, no Hub files); ``.save_pretrained(FOLDER)`` makes a
  ``--pipeline local-dir:FOLDER`` that draws 64 x 64 images (``TINY_SDXL_SIZE``) in ~0.05 s a step on one core;
* ``build_tiny_classifier(path, num_classes)``: timm's ``test_resnet`` state dict as safetensors:
  ``--model test_resnet --checkpoint PATH``;
* ``write_tiny_images(root, {wnid: n})``: small PIL images in wnid folders (a colour per class, noise, varied sizes).

``write_tiny_models(DIR)`` (``isood dev tiny-models DIR``) writes all of them plus ``DIR/README.txt`` with the exact
flags. It writes into a hidden sibling folder and renames it into place when complete; it refuses a ``DIR`` that
holds anything it did not write. The tests build their fixtures with the same functions.
"""

from __future__ import annotations

import gzip
import json
import os
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Mapping

import numpy as np

from isood.core.errors import BadInputError
from isood.core.files import TMP_PREFIX, atomic_write_bytes, output_lock
from isood.core.optspec import REQUIRED, option
from isood.core.shared_options import check_seed, seed_option

__all__ = [
    "TINY_CLIP_CONFIG", "TINY_SDXL_SIZE", "TINY_CLASSIFIER", "TINY_ID_CLASSES", "TINY_OOD_CLASSES",
    "build_tiny_clip", "clip_bpe_tokenizer", "build_tiny_sdxl", "build_tiny_classifier", "write_tiny_images",
    "TinyModelsOptions", "TinyModels", "write_tiny_models",
]

TINY_CLIP_CONFIG = {
    "model_cfg": {
        "embed_dim": 32,
        "vision_cfg": {"image_size": 32, "layers": 2, "width": 64, "head_width": 32, "patch_size": 8},
        "text_cfg": {"context_length": 77, "vocab_size": 49408, "width": 64, "heads": 2, "layers": 2},
    },
    "preprocess_cfg": {
        "mean": [0.48145466, 0.4578275, 0.40821073],
        "std": [0.26862954, 0.26130258, 0.27577711],
        "interpolation": "bicubic",
        "resize_mode": "shortest",
    },
}
#: The side of the tiny SDXL pipeline's images (its UNet's sample size x 8): pass ``--size 64``.
TINY_SDXL_SIZE = 64
#: The timm architecture of the tiny classifier (a ResNet with one block per stage, built into timm).
TINY_CLASSIFIER = "test_resnet"
#: The tiny world's ID classes (ImageNet-1K: tench, goldfish, great white shark, tiger shark) and the other classes
#: of its test images (ImageNet-21K: dog, a hypernym of ImageNet-1K's dog breeds, so a leak the audit finds;
#: cantaloup, ricotta, hillside, which the ImageNet-OOD filter keeps): real wnids, so the WordNet tools work on it.
TINY_ID_CLASSES = ("n01440764", "n01443537", "n01484850", "n01491361")
TINY_OOD_CLASSES = ("n02084071", "n07755929", "n07854614", "n09303528")
#: Images per class: ID train / ID val / test images of an ID class / test images of another class.
_TINY_COUNTS = {"train": 16, "val": 4, "test_id": 3, "test_ood": 6}
_MARKER = f"{TMP_PREFIX}isood-tiny-models.json"
_WRITER = "isood dev tiny-models"
_STAGING_SUFFIX = ".isood-new"  # manifests.output's name for a folder being built beside its final place


# ------------------------------------------------------------------------------------------------ builders
def build_tiny_clip(folder: str | os.PathLike, seed: int = 0) -> Path:
    """Write a seeded tiny CLIP (``open_clip.model.CLIP``, ``TINY_CLIP_CONFIG``) into ``folder`` as
    ``open_clip_config.json`` + ``open_clip_model.safetensors`` (load it as ``local-dir:FOLDER``); returns the
    folder. Every weight gets seeded noise, so each tower's output depends on its input (CLIP's init leaves some
    weights at zero)."""
    import torch
    from open_clip.model import CLIP
    from safetensors.torch import save_file

    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    torch.manual_seed(seed)
    model = CLIP(**TINY_CLIP_CONFIG["model_cfg"])
    with torch.no_grad():
        for p in model.parameters():
            p.add_(0.02 * torch.randn_like(p))
    state = {k: v.contiguous() for k, v in model.state_dict().items()}
    save_file(state, str(folder / "open_clip_model.safetensors"))
    (folder / "open_clip_config.json").write_text(json.dumps(TINY_CLIP_CONFIG, indent=2))
    return folder


def clip_bpe_tokenizer():
    """A transformers ``CLIPTokenizer`` built from open_clip's bundled BPE file (its ids match open_clip's
    tokenizer; nothing is downloaded)."""
    from open_clip.tokenizer import bytes_to_unicode, default_bpe
    from transformers import CLIPTokenizer

    merges = gzip.open(default_bpe()).read().decode("utf-8").split("\n")[1: 49152 - 256 - 2 + 1]
    merges = [tuple(m.split()) for m in merges]
    vocab = list(bytes_to_unicode().values())
    vocab = vocab + [v + "</w>" for v in vocab] + ["".join(m) for m in merges] + ["<|startoftext|>", "<|endoftext|>"]
    return CLIPTokenizer(vocab={v: i for i, v in enumerate(vocab)}, merges=merges, model_max_length=77)


def build_tiny_sdxl(seed: int = 0):
    """A seeded tiny ``StableDiffusionXLPipeline`` in memory (module docstring); ``.save_pretrained(FOLDER)``
    makes a ``--pipeline local-dir:FOLDER`` for ``--size 64``."""
    import torch
    from diffusers import AutoencoderKL, EulerDiscreteScheduler, StableDiffusionXLPipeline, UNet2DConditionModel
    from transformers import CLIPTextConfig, CLIPTextModel, CLIPTextModelWithProjection

    torch.manual_seed(seed)
    tok = clip_bpe_tokenizer()
    text_cfg = CLIPTextConfig(hidden_size=32, intermediate_size=37, num_attention_heads=4, num_hidden_layers=2,
                              vocab_size=len(tok), max_position_embeddings=77, hidden_act="gelu", projection_dim=32)
    unet = UNet2DConditionModel(
        block_out_channels=(32, 64), layers_per_block=1, sample_size=TINY_SDXL_SIZE // 8, in_channels=4,
        out_channels=4, down_block_types=("DownBlock2D", "CrossAttnDownBlock2D"),
        up_block_types=("CrossAttnUpBlock2D", "UpBlock2D"), attention_head_dim=(2, 4), use_linear_projection=True,
        addition_embed_type="text_time", addition_time_embed_dim=8, transformer_layers_per_block=(1, 1),
        projection_class_embeddings_input_dim=80, cross_attention_dim=64, norm_num_groups=1,
    )
    vae = AutoencoderKL(block_out_channels=[32, 64], in_channels=3, out_channels=3,
                        down_block_types=["DownEncoderBlock2D"] * 2, up_block_types=["UpDecoderBlock2D"] * 2,
                        latent_channels=4, sample_size=TINY_SDXL_SIZE, norm_num_groups=32)
    scheduler = EulerDiscreteScheduler(beta_start=0.00085, beta_end=0.012, steps_offset=1,
                                       beta_schedule="scaled_linear", timestep_spacing="leading")
    return StableDiffusionXLPipeline(vae=vae, text_encoder=CLIPTextModel(text_cfg), tokenizer=tok,
                                     text_encoder_2=CLIPTextModelWithProjection(text_cfg), tokenizer_2=tok,
                                     unet=unet, scheduler=scheduler)


def build_tiny_classifier(path: str | os.PathLike, num_classes: int, seed: int = 0,
                          arch: str = TINY_CLASSIFIER) -> Path:
    """Save a seeded, randomly initialised timm ``arch`` (default ``test_resnet``) with ``num_classes`` outputs as
    a safetensors state dict at ``path``: ``isood evaluate --model ARCH --checkpoint PATH`` loads it (its head
    must match the ID classes, or pass ``--num-classes``). Returns ``path``."""
    import timm
    import torch
    from safetensors.torch import save_file

    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    torch.manual_seed(seed)
    model = timm.create_model(arch, pretrained=False, num_classes=num_classes)
    save_file({k: v.contiguous() for k, v in model.state_dict().items()}, str(path))
    return path


def write_tiny_images(root: str | os.PathLike, classes: Mapping[str, int], seed: int = 0) -> Path:
    """``n`` small images per wnid folder of ``root`` (``classes``: wnid -> n): a random colour per class (in
    sorted wnid order) plus noise, 24-59 px per side, alternately ``.JPEG`` and ``.png``; returns ``root``."""
    from PIL import Image

    root = Path(root)
    rng = np.random.default_rng(seed)
    for wnid, n in sorted(classes.items()):
        (root / wnid).mkdir(parents=True, exist_ok=True)
        base = rng.integers(0, 256, size=3)
        for i in range(n):
            h, w = int(rng.integers(24, 60)), int(rng.integers(24, 60))
            img = np.clip(base + rng.normal(0, 40, size=(h, w, 3)), 0, 255).astype(np.uint8)
            ext = ".png" if i % 2 else ".JPEG"
            Image.fromarray(img).save(root / wnid / f"{wnid}_{i}{ext}")
    return root


# ------------------------------------------------------------------------------------------------ the command
@dataclass(frozen=True, kw_only=True)
class TinyModelsOptions:
    """`isood dev tiny-models` (one description per option: ``isood.core.optspec``)."""

    out: str = option(REQUIRED, kind="path", argument=True, metavar="DIR",
                      help="A new (or empty) folder for the tiny models, the tiny images and README.txt.")
    seed: int = seed_option("Seed of the random weights and images.")


@dataclass(frozen=True)
class TinyModels:
    """What ``write_tiny_models`` wrote (absolute paths) and the flags that use it (``flags``: option -> value)."""

    root: Path
    clip: Path
    sdxl: Path
    classifier: Path
    images: Path
    written: bool  # False: ``root`` already held tiny models of the same seed (nothing written)

    @property
    def flags(self) -> dict[str, str]:
        return {"--clip": f"local-dir:{self.clip}", "--pipeline": f"local-dir:{self.sdxl}",
                "--size": str(TINY_SDXL_SIZE), "--model": TINY_CLASSIFIER, "--checkpoint": str(self.classifier)}

    def commands(self, out: str = "out") -> list[str]:
        """A quick run over the tiny world, one manifest per command under ``out`` (the docs' quickstart runs
        these, with ``tiny`` for the folder; ``tests/test_docs.py`` checks they agree)."""
        f, im = self.flags, self.images
        return [
            f"isood build-splits --id {im}/train --test {im}/test --clip {f['--clip']} --levels 2 "
            f"--na-threshold 2 --triplets 500 --out {out}/splits",
            f"isood generate-syn --styles sdxl:anime,papercut --labels 1k --splits {out}/splits --pipeline "
            f"{f['--pipeline']} --size {f['--size']} --per-cell 5 --images-per-prompt 2 --out {out}/syn",
            f"isood evaluate --splits {out}/splits --syn {out}/syn --id-train {im}/train --id-test {im}/val "
            f"--model {f['--model']} --checkpoint {f['--checkpoint']} --out {out}/eval",
            f"isood verify {out}/eval",
            f"isood show {out}/splits --out {out}/mosaic",
            f"isood wordnet audit {out}/splits --out {out}/audit",
        ]


def _readme(models: TinyModels, seed: int) -> str:
    f = models.flags
    n_id, n_ood = len(TINY_ID_CLASSES), len(TINY_OOD_CLASSES)
    rows = [
        ("clip/", "a tiny open_clip model", f"--clip {f['--clip']}"),
        ("sdxl/", f"a tiny SDXL pipeline ({TINY_SDXL_SIZE} px)", f"--pipeline {f['--pipeline']} --size {f['--size']}"),
        ("classifier.safetensors", f"timm's {TINY_CLASSIFIER}, {n_id} classes",
         f"--model {f['--model']} --checkpoint {f['--checkpoint']}"),
        ("images/train, images/val", f"{n_id} ImageNet-1K classes (ID)", "--id / --id-train, --id-test"),
        ("images/test", f"{n_ood} other classes + the ID ones", "--test"),
    ]
    width = max(len(r[0]) for r in rows) + 2
    lines = [f"Tiny models written by `{_WRITER}` (seed {seed}): random weights built from the real open_clip,",
             "diffusers and timm classes, to try isood offline. They run; they recognise nothing.", ""]
    lines += [f"{name:<{width}}{what}\n{'':<{width}}{flags}" for name, what, flags in rows]
    lines += ["", "Try (each command writes one manifest under out/; verify reads one; audit needs WordNet 3.0):"]
    lines += [f"  {c}" for c in models.commands()]
    return "\n".join(lines) + "\n"


def _layout(root: Path, written: bool = False) -> TinyModels:
    return TinyModels(root=root, clip=root / "clip", sdxl=root / "sdxl", classifier=root / "classifier.safetensors",
                      images=root / "images", written=written)


def _marker(folder: Path) -> dict | None:
    try:
        data = json.loads((folder / _MARKER).read_text())
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) and data.get("written_by") == _WRITER else None


def _build(work: Path, seed: int) -> None:
    """Everything into ``work`` (a fresh folder); the marker first, so a leftover is recognised as ours."""
    from generation.pipeline import quiet_libraries

    atomic_write_bytes(work / _MARKER, json.dumps({"written_by": _WRITER, "seed": seed, "complete": False}).encode())
    build_tiny_clip(work / "clip", seed=seed)
    with quiet_libraries():  # diffusers' and transformers' own log lines and bars
        build_tiny_sdxl(seed=seed).save_pretrained(work / "sdxl")
    build_tiny_classifier(work / "classifier.safetensors", num_classes=len(TINY_ID_CLASSES), seed=seed)
    c = _TINY_COUNTS
    write_tiny_images(work / "images" / "train", dict.fromkeys(TINY_ID_CLASSES, c["train"]), seed=seed)
    write_tiny_images(work / "images" / "val", dict.fromkeys(TINY_ID_CLASSES, c["val"]), seed=seed + 1)
    write_tiny_images(work / "images" / "test", {**dict.fromkeys(TINY_ID_CLASSES, c["test_id"]),
                                                 **dict.fromkeys(TINY_OOD_CLASSES, c["test_ood"])}, seed=seed + 2)


def write_tiny_models(out: str | os.PathLike, *, seed: int = 0) -> TinyModels:
    """Write the tiny CLIP (``out/clip``), SDXL pipeline (``out/sdxl``), classifier (``out/classifier.safetensors``),
    images (``out/images/{train,val,test}``) and ``out/README.txt`` (the flags to use), and return where.

    ``out`` must be new or empty: everything is built in the hidden sibling ``.~<name>.isood-new`` and renamed into
    place when complete (a crash leaves no half-written ``out``). A ``out`` that already holds tiny models of the
    same seed is left as it is (``written`` False); one holding anything else is refused in one line, before any
    work, and nothing there is changed."""
    check_seed(seed)
    out = Path(os.path.abspath(out))
    with output_lock(out, option="DIR"):
        if any(out.iterdir()):
            mark = _marker(out)
            if mark is None or not mark.get("complete"):
                raise BadInputError(f"DIR {out} is not empty and was not written by `{_WRITER}`: pass a new or "
                                    "empty folder (isood never overwrites files it did not write)")
            if mark.get("seed") != seed:
                raise BadInputError(f"DIR {out} holds tiny models of seed {mark.get('seed')}: pass another folder "
                                    f"for seed {seed}, or remove this one first")
            return _layout(out, written=False)
        work = out.with_name(f"{TMP_PREFIX}{out.name}{_STAGING_SUFFIX}")
        if work.exists():  # an interrupted run of ours: start again; anything else: refuse
            if work.is_dir() and _marker(work) is not None:
                shutil.rmtree(work)
            else:
                raise BadInputError(f"{work} is in the way (not written by `{_WRITER}`): move it, or pass another DIR")
        work.mkdir()
        try:
            _build(work, seed)
            models = _layout(out, written=True)
            atomic_write_bytes(work / "README.txt", _readme(models, seed).encode())
            atomic_write_bytes(work / _MARKER, json.dumps({"written_by": _WRITER, "seed": seed,
                                                           "complete": True}).encode())
            os.rename(work, out)  # onto the empty folder: the complete set appears at once
        except BaseException:
            shutil.rmtree(work, ignore_errors=True)  # ours, half-built (a kill -9 leaves it to the next run)
            raise
    return models
