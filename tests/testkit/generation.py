"""Fixtures for generation tests: a tiny SDXL pipeline saved to disk, ID features, labels and a LAID file.

The tiny pipeline is ``isood.dev.tiny_models.build_tiny_sdxl``: a real ``StableDiffusionXLPipeline`` built from
diffusers/transformers classes (UNet with ``addition_embed_type='text_time'``, a 2-block VAE, two 2-layer CLIP text
encoders, Euler scheduler) and a ``CLIPTokenizer`` built in memory from open_clip's bundled BPE vocabulary (no hub
files). It runs 1 step at 64x64 in ~0.05 s on one CPU core and loads through ``--pipeline local-dir:PATH``.
"""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

# The tiny pipeline has one home in the package (`isood dev tiny-models` writes the same one).
from isood.dev.tiny_models import build_tiny_sdxl


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
    from isood.features.clip import encode_texts
    from isood.science.laid import LAID
    from isood.science.simulate import random_orthogonal

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
    from generation.pipeline import load_pipeline

    return load_pipeline(tiny_pipeline_spec, device="cpu")


@pytest.fixture(scope="session")
def make_generator(tiny_pipe, tiny_pipeline_spec):
    """Factory: an SDXLGenerator over the tiny pipeline (64x64, 1 step, batches of 3) whose `.pipe` counts calls."""
    from generation.pipeline import GeneratorSettings
    from generation.sdxl import SDXLGenerator

    def make(**settings):
        s = dict(pipeline=tiny_pipeline_spec, size=64, steps=1, batch_size=3, device="cpu")
        s.update(settings)
        return SDXLGenerator(CountingPipe(tiny_pipe), GeneratorSettings(**s))

    return make


@pytest.fixture
def gen(make_generator):
    return make_generator()


class PlantedTextEncoder:
    """An ``isood.features.clip.ClipEncoder`` whose text features are a planted world's: ``texts`` maps each prompt string
    to its feature row (``tokenizer`` turns strings into row numbers, ``model.encode_text`` looks them up)."""

    def __init__(self, texts: dict, identity: str):
        import numpy as np
        import torch

        self._row = {t: j for j, t in enumerate(texts)}
        self._table = torch.from_numpy(np.stack(list(texts.values())).astype(np.float32))
        self.identity, self.spec, self.device = identity, "planted", torch.device("cpu")
        self.embed_dim, self.preprocess, self.model = int(self._table.shape[1]), None, self

    def tokenizer(self, texts):
        import torch

        return torch.tensor([self._row[t] for t in texts], dtype=torch.long)

    def encode_text(self, rows):
        return self._table[rows]


@pytest.fixture(scope="session")
def clip_world_syn(tmp_path_factory, clip_world):
    """generate-syn's inputs in the CLIP-like world: a labels file (30 ID and 90 OOD classes, named
    ``class0123``), a style file (every world style, ``style07``), the image splits of 2,000 test images built by
    the real build-splits stage (with the ideal LAID W = the world's mixing matrix), and the planted text
    encoder of every style x label prompt (``encoder``; pass it where ``load_clip`` would load a CLIP).
    ``prompt_truth`` maps each prompt to its (class, style)."""
    import json

    from isood.science.laid import LAID
    from isood.stages.splits import SplitsOptions, build_splits

    root = tmp_path_factory.mktemp("clip_world_syn")
    rng = np.random.default_rng(0)
    classes = np.concatenate([rng.choice(clip_world.id_classes, 30, replace=False),
                              rng.choice(clip_world.ood_classes, 90, replace=False)])
    (root / "labels.txt").write_text("".join(f"class{c:04d}\n" for c in classes))
    styles = [{"name": f"style{s:02d}", "prompt": f"{{prompt}} rendered in style{s:02d}", "negative_prompt": ""}
              for s in range(len(clip_world.styles))]
    (root / "styles.json").write_text(json.dumps(styles))
    truth = {f"{c_name} rendered in style{s:02d}": (c, s) for s in range(len(styles))
             for c, c_name in ((c, f"class{c:04d}") for c in classes)}
    cs = np.array(list(truth.values()))
    encoder = PlantedTextEncoder(dict(zip(truth, clip_world.texts(cs[:, 0], cs[:, 1]))), identity="planted-clip-world")
    id_feats, id_cls = clip_world.id_images(2)
    test_feats, test_cls, _ = clip_world.test_images(2000)
    for name, feats, cls in (("id", id_feats, id_cls), ("test", test_feats, test_cls)):
        (root / name).mkdir()
        np.save(root / name / "features.npy", feats)
        pd.DataFrame({"path": [f"{name}/{j:05d}.png" for j in range(len(feats))],
                      "wnid": [f"class{c:04d}" for c in cls]}).to_parquet(root / name / "index.parquet")
    laid = LAID(clip_world.mixing).save(root / "laid.safetensors")
    build_splits(SplitsOptions(id=str(root / "id"), test=str(root / "test"), laid=str(laid), out=str(root / "splits"),
                             progress=False))
    return {"root": root, "labels": root / "labels.txt", "styles": root / "styles.json", "splits": root / "splits",
            "encoder": encoder, "prompt_truth": truth}
