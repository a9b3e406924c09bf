"""Fixtures for generation tests: a tiny SDXL pipeline saved to disk, ID features, labels and a LAID file.

The tiny pipeline is a real ``StableDiffusionXLPipeline`` built from diffusers/transformers classes (UNet with
``addition_embed_type='text_time'``, a 2-block VAE, two 2-layer CLIP text encoders, Euler scheduler) and a
``CLIPTokenizer`` built in memory from open_clip's bundled BPE vocabulary (no hub files). It runs 1 step at
64x64 in ~0.05 s on one CPU core and loads through ``--pipeline local-dir:PATH``.
"""

from __future__ import annotations

import gzip

import numpy as np
import pandas as pd
import pytest

TINY_SIZE = 64


def clip_bpe_tokenizer():
    """transformers CLIPTokenizer from open_clip's bundled BPE file (ids match open_clip's tokenizer)."""
    from open_clip.tokenizer import bytes_to_unicode, default_bpe
    from transformers import CLIPTokenizer

    merges = gzip.open(default_bpe()).read().decode("utf-8").split("\n")[1 : 49152 - 256 - 2 + 1]
    merges = [tuple(m.split()) for m in merges]
    vocab = list(bytes_to_unicode().values())
    vocab = vocab + [v + "</w>" for v in vocab] + ["".join(m) for m in merges] + ["<|startoftext|>", "<|endoftext|>"]
    return CLIPTokenizer(vocab={v: i for i, v in enumerate(vocab)}, merges=merges, model_max_length=77)


def build_tiny_sdxl(seed: int = 0):
    import torch
    from diffusers import AutoencoderKL, EulerDiscreteScheduler, StableDiffusionXLPipeline, UNet2DConditionModel
    from transformers import CLIPTextConfig, CLIPTextModel, CLIPTextModelWithProjection

    torch.manual_seed(seed)
    tok = clip_bpe_tokenizer()
    text_cfg = CLIPTextConfig(hidden_size=32, intermediate_size=37, num_attention_heads=4, num_hidden_layers=2,
                              vocab_size=len(tok), max_position_embeddings=77, hidden_act="gelu", projection_dim=32)
    unet = UNet2DConditionModel(
        block_out_channels=(32, 64), layers_per_block=1, sample_size=TINY_SIZE // 8, in_channels=4, out_channels=4,
        down_block_types=("DownBlock2D", "CrossAttnDownBlock2D"), up_block_types=("CrossAttnUpBlock2D", "UpBlock2D"),
        attention_head_dim=(2, 4), use_linear_projection=True, addition_embed_type="text_time",
        addition_time_embed_dim=8, transformer_layers_per_block=(1, 1), projection_class_embeddings_input_dim=80,
        cross_attention_dim=64, norm_num_groups=1,
    )
    vae = AutoencoderKL(block_out_channels=[32, 64], in_channels=3, out_channels=3,
                        down_block_types=["DownEncoderBlock2D"] * 2, up_block_types=["UpDecoderBlock2D"] * 2,
                        latent_channels=4, sample_size=TINY_SIZE, norm_num_groups=32)
    scheduler = EulerDiscreteScheduler(beta_start=0.00085, beta_end=0.012, steps_offset=1,
                                       beta_schedule="scaled_linear", timestep_spacing="leading")
    return StableDiffusionXLPipeline(vae=vae, text_encoder=CLIPTextModel(text_cfg), tokenizer=tok,
                                     text_encoder_2=CLIPTextModelWithProjection(text_cfg), tokenizer_2=tok,
                                     unet=unet, scheduler=scheduler)


@pytest.fixture(scope="session")
def tiny_sdxl_dir(tmp_path_factory):
    """A tiny SDXL pipeline saved with save_pretrained (load it as ``local-dir:<path>``)."""
    import torch

    torch.set_num_threads(1)
    folder = tmp_path_factory.mktemp("tiny_sdxl")
    build_tiny_sdxl().save_pretrained(folder)
    return folder


@pytest.fixture(scope="session")
def tiny_pipeline_spec(tiny_sdxl_dir):
    return f"local-dir:{tiny_sdxl_dir}"


@pytest.fixture(scope="session")
def syn_inputs(tmp_path_factory, tiny_encoder):
    """ID features (tiny-CLIP text features of photos of 6 ID classes, 3 phrasings each), a labels file
    (wnids and plain labels), and a LAID file (seeded random rotation) for the tiny CLIP."""
    from isood.clip import encode_texts
    from isood.laid import LAID
    from isood.simulate import random_orthogonal

    root = tmp_path_factory.mktemp("syn_inputs")
    id_labels = ["tench", "goldfish", "great white shark", "cock", "hen", "ostrich"]
    phrasings = ["a photo of a {}.", "a close-up photo of the {}.", "a bright photo of a {}."]
    texts = [p.format(x) for x in id_labels for p in phrasings]
    feats = encode_texts(tiny_encoder, texts)
    id_dir = root / "id_features"
    id_dir.mkdir()
    np.save(id_dir / "features.npy", feats)
    pd.DataFrame({"path": [f"id/{i}.png" for i in range(len(texts))], "wnid": [""] * len(texts)}).to_parquet(
        id_dir / "index.parquet")
    labels = root / "labels.txt"
    labels.write_text(
        "# wnids are named from timm's lemma file; other lines are plain labels\n"
        "n01440764\nn01443537\nn02084071\nn04399382\nn03417042\n"
        "red fox\nsailboat\nvolcano\nteapot\nviolin\nlighthouse\nmushroom\n"
    )
    laid_path = root / "laid.safetensors"
    LAID(random_orthogonal(tiny_encoder.embed_dim, seed=3)).save(laid_path)
    return {"id_features": id_dir, "labels": labels, "laid": laid_path, "root": root}


class CountingPipe:
    """A diffusers pipeline wrapper counting calls and the batch size of each call."""

    def __init__(self, pipe):
        self.pipe, self.calls, self.batch_sizes = pipe, 0, []
        self.dtype = pipe.dtype

    def __call__(self, **kw):
        self.calls += 1
        self.batch_sizes.append(len(kw["prompt"]))
        return self.pipe(**kw)


@pytest.fixture(scope="session")
def tiny_pipe(tiny_pipeline_spec):
    from generation.sdxl import load_pipeline

    return load_pipeline(tiny_pipeline_spec, device="cpu")


@pytest.fixture(scope="session")
def make_generator(tiny_pipe, tiny_pipeline_spec):
    """Factory: an SDXLGenerator over the tiny pipeline (64x64, 1 step, batches of 3) whose `.pipe` counts calls."""
    from generation.sdxl import GeneratorSettings, SDXLGenerator

    def make(**settings):
        s = dict(pipeline=tiny_pipeline_spec, size=64, steps=1, batch_size=3, device="cpu")
        s.update(settings)
        return SDXLGenerator(CountingPipe(tiny_pipe), GeneratorSettings(**s))

    return make


@pytest.fixture
def gen(make_generator):
    return make_generator()
