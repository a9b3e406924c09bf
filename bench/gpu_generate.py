"""On one GPU: does generate-syn keep the GPU busy? One run, no downloads.

Pipeline: a ``StableDiffusionXLPipeline`` with SDXL's full-size architecture (UNet 2.6B parameters: blocks
320/640/1280, transformer depth 1/2/10, cross-attention 2048; the two CLIP text encoders ViT-L and bigG; the
4-level VAE) built from configs written here with random weights, on the device in fp16, with SDXL-Turbo's
settings (1 step, guidance 0, 512 px, Euler ancestral, trailing timesteps). Random weights cost the same
FLOPs as trained ones; the images are noise, so their PNGs are larger (slower to encode) than real images'
(the mean PNG size is printed). ``--smoke`` uses the tiny test pipeline (``isood.dev.tiny_models``) at 64 px on the
CPU instead.

Measured, each on a fresh output folder, the same plan (prompts x ``images_per_prompt`` images, batches of
``--batch-size``):

(a) the pipeline alone: ``SDXLGenerator`` called on every batch, images dropped (the rate the GPU allows);
(b) ``generation.sdxl.generate_images`` writing in line (``write_threads=0``: encode, hash, write after each batch);
(c) the same with the write pool (the default: PNGs written while the next batch generates);
(d) (c) with the prompt strings passed to the pipeline instead of each unique prompt's embeddings.

Target (this script's: the share of the device time kept): (c) >= 90% of (a)'s images/s. Prints one
``SUMMARY gpu_generate: ...`` line and appends a row to bench/results.local.md (``--no-record``; smoke never records).

    python bench/gpu_generate.py                         # H100: 256 images at 512 px (a few minutes, estimate)
    python bench/gpu_generate.py --smoke --device cpu    # tiny pipeline, 12 images at 64 px (seconds)

``bench/gpu_suite.py`` calls ``run(device=..., smoke=...)`` (returns the SUMMARY lines).
"""
from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from _results import record, summary  # noqa: E402

TARGET_BUSY = 0.9
#: --smoke: images planned, batch size
SMOKE = (12, 3)
LABELS = ["violin", "teapot", "red fox", "volcano", "sailboat", "lighthouse", "mushroom", "ostrich", "tench",
          "goldfish", "hen", "cock", "great white shark", "umbrella", "bicycle", "castle"]


def build_sdxl_random(device: str, seed: int = 0):
    """SDXL's full-size architecture with random weights, built on ``device`` in fp16 (no download)."""
    import torch
    from diffusers import (AutoencoderKL, EulerAncestralDiscreteScheduler, StableDiffusionXLPipeline,
                           UNet2DConditionModel)
    from transformers import CLIPTextConfig, CLIPTextModel, CLIPTextModelWithProjection

    from isood.dev.tiny_models import clip_bpe_tokenizer

    torch.manual_seed(seed)
    tok = clip_bpe_tokenizer()
    vit_l = CLIPTextConfig(hidden_size=768, intermediate_size=3072, num_attention_heads=12, num_hidden_layers=12,
                           projection_dim=768, hidden_act="quick_gelu", vocab_size=len(tok), max_position_embeddings=77)
    big_g = CLIPTextConfig(hidden_size=1280, intermediate_size=5120, num_attention_heads=20, num_hidden_layers=32,
                           projection_dim=1280, hidden_act="gelu", vocab_size=len(tok), max_position_embeddings=77)
    with torch.device(device):
        unet = UNet2DConditionModel(
            sample_size=128, in_channels=4, out_channels=4, layers_per_block=2, block_out_channels=(320, 640, 1280),
            down_block_types=("DownBlock2D", "CrossAttnDownBlock2D", "CrossAttnDownBlock2D"),
            up_block_types=("CrossAttnUpBlock2D", "CrossAttnUpBlock2D", "UpBlock2D"),
            transformer_layers_per_block=(1, 2, 10), attention_head_dim=(5, 10, 20), cross_attention_dim=2048,
            use_linear_projection=True, addition_embed_type="text_time", addition_time_embed_dim=256,
            projection_class_embeddings_input_dim=2816)
        vae = AutoencoderKL(block_out_channels=(128, 256, 512, 512), in_channels=3, out_channels=3,
                            down_block_types=("DownEncoderBlock2D",) * 4, up_block_types=("UpDecoderBlock2D",) * 4,
                            latent_channels=4, layers_per_block=2, sample_size=1024, scaling_factor=0.13025)
        te1, te2 = CLIPTextModel(vit_l), CLIPTextModelWithProjection(big_g)
    scheduler = EulerAncestralDiscreteScheduler(beta_start=0.00085, beta_end=0.012, beta_schedule="scaled_linear",
                                                timestep_spacing="trailing", steps_offset=1)
    pipe = StableDiffusionXLPipeline(vae=vae, text_encoder=te1, tokenizer=tok, text_encoder_2=te2, tokenizer_2=tok,
                                     unet=unet, scheduler=scheduler)
    pipe = pipe.to(device, torch.float16 if str(device).startswith("cuda") else torch.float32)
    pipe.set_progress_bar_config(disable=True)
    return pipe


def _sync(device: str) -> None:
    import torch

    if str(device).startswith("cuda"):
        torch.cuda.synchronize()


def run(device: str = "cuda", smoke: bool = False, *, images_per_prompt: int = 4, batch: int | None = None,
        n_images: int | None = None, record_row: bool = True) -> list[str]:
    """Every measurement (module docstring); returns the SUMMARY lines."""
    import pandas as pd
    import torch

    from generation.prompts import build_prompts, expand_images
    from generation.pipeline import GeneratorSettings
    from generation.sdxl import SDXLGenerator, default_write_threads, generate_images
    from generation.styles import load_styles
    from isood.dev.tiny_models import build_tiny_sdxl

    size = 64 if smoke else 512
    batch = batch or (SMOKE[1] if smoke else 16)
    n_images = n_images or (SMOKE[0] if smoke else 256)
    t0 = time.perf_counter()
    if smoke:
        torch.manual_seed(0)
        pipe = build_tiny_sdxl().to(device)
        pipe.set_progress_bar_config(disable=True)
    else:
        pipe = build_sdxl_random(device)
    _sync(device)
    built = time.perf_counter() - t0
    settings = GeneratorSettings(pipeline="random:sdxl-architecture", size=size, steps=1, guidance_scale=0.0,
                                 batch_size=batch, device=device)
    n_prompts = -(-n_images // images_per_prompt)
    styles = load_styles("sdxl:photographic,anime")
    labels = pd.DataFrame({"wnid": [""] * len(LABELS), "label": LABELS})
    prompts = build_prompts(labels, styles).head(n_prompts)
    plan = expand_images(prompts, images_per_prompt, seed=0).head(n_images).reset_index(drop=True)
    gen = SDXLGenerator(pipe, settings)
    gen(list(plan["prompt"][:batch]), list(plan["negative_prompt"][:batch]), list(plan["seed"][:batch]))  # warm-up
    _sync(device)

    rows = plan.to_dict("records")
    t = time.perf_counter()
    for s in range(0, len(rows), batch):
        chunk = rows[s:s + batch]
        gen([r["prompt"] for r in chunk], [r["negative_prompt"] for r in chunk], [r["seed"] for r in chunk])
    _sync(device)
    alone = len(rows) / (time.perf_counter() - t)

    rates, sizes = {}, []
    with tempfile.TemporaryDirectory(prefix="isood-gpu-generate-") as tmp:
        for name, threads, embeds in (("inline", 0, True), ("pool", None, True), ("strings", None, False)):
            g = SDXLGenerator(pipe, settings, prompt_embeds=embeds)
            out = Path(tmp) / name
            res = generate_images(plan, out, settings=settings, generator=g, progress=False, write_threads=threads)
            _sync(device)
            rates[name] = res.images_per_second
            if name == "pool":
                sizes = [p.stat().st_size for p in (out / "images").rglob("*.png")]
    busy = rates["pool"] / alone
    judged = "not judged (smoke)" if smoke else ("met" if busy >= TARGET_BUSY else "NOT met")
    name = torch.cuda.get_device_name(0) if str(device).startswith("cuda") else str(device)
    text = (f"{'smoke' if smoke else 'sdxl-architecture, random weights'} on {name}: {len(plan)} images at {size} "
            f"px, batches of {batch}, {images_per_prompt} per prompt (built in {built:.0f} s) | pipeline alone "
            f"{alone:.2f} img/s | write pool ({default_write_threads()} threads) {rates['pool']:.2f} img/s = "
            f"{busy:.1%} of the pipeline's rate vs target >= {TARGET_BUSY:.0%}: {judged} | in-line writes "
            f"{rates['inline']:.2f} img/s (pool {rates['pool'] / rates['inline']:.2f}x) | prompt strings instead of "
            f"embeddings {rates['strings']:.2f} img/s | mean PNG {sum(sizes) / max(1, len(sizes)) / 1024:.0f} KB")
    line = summary("gpu_generate", text)
    if record_row and not smoke:
        record("gpu_generate.py", f"{len(plan)} images, {size} px, batch {batch}", text, device=device)
    del pipe, gen
    if str(device).startswith("cuda"):
        torch.cuda.empty_cache()
    return [line]


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--device", default="cuda")
    p.add_argument("--smoke", action="store_true",
                   help="the tiny pipeline at 64 px (checks the script; never recorded)")
    p.add_argument("--images", type=int, default=None, help="default 256 (--smoke: 12)")
    p.add_argument("--batch-size", type=int, default=None, help="default 16 (--smoke: 3)")
    p.add_argument("--images-per-prompt", type=int, default=4)
    p.add_argument("--no-record", action="store_true", help="do not append to bench/results.local.md")
    a = p.parse_args(argv)
    run(a.device, a.smoke, images_per_prompt=a.images_per_prompt, batch=a.batch_size, n_images=a.images,
        record_row=not a.no_record)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
