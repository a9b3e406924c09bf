"""Shared fixtures (and, as plugins, the fixture families of ``tests/testkit``): a tiny open_clip model built from open_clip's own classes (``isood.dev.tiny_models``), a tiny
image dataset, and the demo's evaluation stage on the planted world.

Everything here works offline. ``tiny_clip_spec`` is a ``local-dir:PATH`` name usable wherever a ``--clip`` name
is (the folder holds ``open_clip_config.json`` + ``open_clip_model.safetensors``, seeded weights);
``tiny_images`` is a dataset root with wnid subfolders and one corrupt file.
"""

from __future__ import annotations

import os

# Hub lookups must fail at once, never retry for ~25 s (huggingface_hub reads this when it is imported).
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import sys  # noqa: E402
from pathlib import Path  # noqa: E402

import pytest  # noqa: E402

# The fixture families (tests/testkit/*.py) serve tests across the folders that mirror the packages, so they are
# plugins of this root conftest rather than conftests of one folder.
sys.path.insert(0, str(Path(__file__).resolve().parent))
pytest_plugins = ["testkit.evaluation", "testkit.generation", "testkit.manifests", "testkit.wordnet"]

# The tiny models and images have one home in the package (`isood dev tiny-models` writes the same ones).
from isood.dev.tiny_models import TINY_CLIP_CONFIG, build_tiny_clip, write_tiny_images  # noqa: E402,F401

#: wnid -> number of readable images in ``tiny_images``
TINY_IMAGE_CLASSES = {"n01440764": 5, "n01443537": 4, "n02084071": 4, "n04399382": 3}
TINY_CORRUPT = "n01443537/n01443537_broken.JPEG"


@pytest.fixture(scope="session")
def tiny_clip_factory():
    """``build_tiny_clip(folder, seed=0)``: write another seeded tiny model into ``folder`` (returns the folder)."""
    return build_tiny_clip


@pytest.fixture(scope="session")
def tiny_clip_dir(tmp_path_factory):
    """Folder with a seeded tiny open_clip model (embed_dim 32, ViT 64/2 layers/patch 8/image 32, text 64/2/2)."""
    return build_tiny_clip(tmp_path_factory.mktemp("tiny_clip"))


@pytest.fixture(scope="session")
def tiny_clip_spec(tiny_clip_dir):
    """The tiny model's ``--clip`` name: ``local-dir:PATH``."""
    return f"local-dir:{tiny_clip_dir}"


@pytest.fixture(scope="session")
def tiny_encoder(tiny_clip_spec):
    """The tiny model loaded on CPU through isood.features.clip.load_clip."""
    import torch

    from isood.features.clip import load_clip

    torch.set_num_threads(1)
    return load_clip(tiny_clip_spec, device="cpu")


def make_image_dataset(root, classes=TINY_IMAGE_CLASSES, seed: int = 0, corrupt: str | None = TINY_CORRUPT):
    """``isood.dev.tiny_models.write_tiny_images`` (varied sizes and colours per class), plus one corrupt ``.JPEG`` and
    a text file that is no image."""
    write_tiny_images(root, classes, seed=seed)
    if corrupt:
        (root / corrupt).parent.mkdir(parents=True, exist_ok=True)
        (root / corrupt).write_bytes(b"\xff\xd8\xff\xe0 this is not a jpeg")
    (root / "README.txt").write_text("not an image: ignored by the lister")
    return root


@pytest.fixture(scope="session")
def tiny_images(tmp_path_factory):
    """Dataset root: 16 readable images in 4 wnid folders (TINY_IMAGE_CLASSES) + one corrupt file (TINY_CORRUPT).
    Shared by every test: do not modify it; make another with ``image_dataset_factory``."""
    return make_image_dataset(tmp_path_factory.mktemp("tiny_images"))


@pytest.fixture(scope="session")
def tiny_image_info():
    """Facts about ``tiny_images``: {'classes': wnid -> readable images, 'corrupt': relative path of the bad file}."""
    return {"classes": dict(TINY_IMAGE_CLASSES), "corrupt": TINY_CORRUPT}


@pytest.fixture(scope="session")
def image_dataset_factory():
    """``make_image_dataset(root, classes={wnid: n}, seed=0, corrupt=relpath|None)``: another image dataset."""
    return make_image_dataset


def write_syn_inputs(root, encoder) -> dict:
    """generate-syn's inputs for ``encoder`` under ``root``: ID features (the encoder's text features of photos of
    4 classes, written as a features.npy + index.parquet feature set), a random orthogonal LAID file and a labels
    file (a wnid and plain labels). Returns their paths ({"root", "labels", "laid", "id_features"})."""
    import numpy as np
    import pandas as pd

    from isood.features.clip import encode_texts
    from isood.science.laid import LAID
    from isood.science.simulate import random_orthogonal

    texts = [f"a photo of a {x}." for x in ("tench", "goldfish", "hen", "ostrich")]
    (root / "id").mkdir(parents=True)
    np.save(root / "id" / "features.npy", encode_texts(encoder, texts))
    pd.DataFrame({"path": [f"id/{i}.png" for i in range(len(texts))], "wnid": [""] * len(texts)}).to_parquet(
        root / "id" / "index.parquet")
    LAID(random_orthogonal(encoder.embed_dim, seed=3)).save(root / "laid.safetensors")
    (root / "labels.txt").write_text("n01440764\nred fox\nsailboat\nvolcano\nteapot\nviolin\n")
    return {"root": root, "labels": root / "labels.txt", "laid": root / "laid.safetensors", "id_features": root / "id"}


@pytest.fixture(scope="session")
def syn_inputs_factory(tiny_encoder):
    """``write_syn_inputs(root)`` for the tiny CLIP: generate-syn's ID features, LAID file and labels."""
    return lambda root: write_syn_inputs(root, tiny_encoder)


@pytest.fixture
def isood_cache(tmp_path, monkeypatch):
    """A fresh ISOOD_CACHE_DIR (text-feature cache, WordNet staging) for one test; returns its path."""
    monkeypatch.setenv("ISOOD_CACHE_DIR", str(tmp_path / "isood-cache"))
    return tmp_path / "isood-cache"


#: The demo's evaluation stage as the tests run it: fewer detectors and plots than `isood demo`, same page layout.
PLANTED_DETECTORS = ("msp", "energy", "knn", "mds")
PLANTED_PLOT_METRICS = ("auroc",)


@pytest.fixture(scope="session")
def planted_evaluation(tmp_path_factory):
    """``(out, world, splits, ev)``: the planted world (seed 0), its splits manifest from the real `build-splits`
    path with the ideal LAID map (W = the planted mixing matrix), and ``evaluate_planted`` of it in
    ``out / "evaluation"`` (read it, never write into it: tests/evaluation and tests/isood/report share it)."""
    from isood.dev.demo import write_planted_features
    from isood.dev.planted import evaluate_planted
    from isood.science.laid import LAID
    from isood.science.simulate import make_planted_world
    from isood.stages.splits import SplitsOptions, build_splits

    out = tmp_path_factory.mktemp("planted-eval")
    world = make_planted_world(seed=0)
    id_dir, test_dir = write_planted_features(world, out / "world")
    laid = LAID(world.mixing).save(out / "world" / "laid.safetensors")
    splits = build_splits(SplitsOptions(id=str(id_dir), test=str(test_dir), laid=str(laid), out=str(out / "splits"),
                                      progress=False)).manifest
    ev = evaluate_planted(world, splits, out / "evaluation", seed=0, detectors=PLANTED_DETECTORS,
                          plot_metrics=PLANTED_PLOT_METRICS)
    return out, world, splits, ev


#: The CLIP-like world the tests use (``isood.science.simulate_clip``): ImageNet's proportions at a test's size.
CLIP_WORLD_SPEC = dict(dim=64, n_id_classes=200, n_ood_classes=800, n_superclasses=20, n_styles=40, seed=0)


@pytest.fixture(scope="session")
def clip_world():
    """A CLIP-like planted world (``isood.science.simulate_clip.make_clip_world(**CLIP_WORLD_SPEC)``): text and image
    features in two cones (a caption and its own image: cosine ~0.3), 200 ID and 800 OOD classes, 40 styles."""
    from isood.science.simulate_clip import make_clip_world

    return make_clip_world(**CLIP_WORLD_SPEC)

