"""Fixtures for generation tests: a tiny SDXL pipeline saved to disk, ID features, labels and a LAID file.

The tiny pipeline is ``isood.tiny_models.build_tiny_sdxl``: a real ``StableDiffusionXLPipeline`` built from
diffusers/transformers classes (UNet with ``addition_embed_type='text_time'``, a 2-block VAE, two 2-layer CLIP text
encoders, Euler scheduler) and a ``CLIPTokenizer`` built in memory from open_clip's bundled BPE vocabulary (no hub
files). It runs 1 step at 64x64 in ~0.05 s on one CPU core and loads through ``--pipeline local-dir:PATH``.
"""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

# The tiny pipeline has one home in the package (`isood dev tiny-models` writes the same one).
from isood.tiny_models import build_tiny_sdxl


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
    """A diffusers pipeline wrapper counting calls and the batch size of each call (prompts or prompt
    embeddings); everything else (``encode_prompt``, ``unet``, ...) is the pipeline's."""

    def __init__(self, pipe):
        self.pipe, self.calls, self.batch_sizes = pipe, 0, []
        self.dtype = pipe.dtype

    def __getattr__(self, name):
        return getattr(self.pipe, name)

    def __call__(self, **kw):
        self.calls += 1
        self.batch_sizes.append(len(kw["prompt"] if kw.get("prompt") is not None else kw["prompt_embeds"]))
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
