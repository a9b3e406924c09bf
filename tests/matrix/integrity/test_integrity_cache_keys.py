"""The evaluate output cache holds every input that changes what it stores. The cache keeps, per dataset, the
model's outputs AND the labels the pass saw (``capture.OutputCache``), keyed by (model identity, data identity,
preprocessing). Labels were left out of the key: ``--id-test-labels`` and ``--classes`` (even a permuted class
list) were ignored once an entry existed. Every option of ``EvaluateOptions`` is walked here: it either changes
the keys of a run (shown by running the evaluation with and without the change, each into its own cache, and
reading the keys the cache holds), or it is on a reasoned list of options that cannot change what is cached.

Inputs are made here: PNG folders, a splits manifest (the stage's writer), tiny timm ResNet checkpoints.
"""

from __future__ import annotations

import dataclasses
import shutil
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

import isood
from isood.stages.evaluate.options import EvaluateOptions

ID = ["n01440764", "n01443537", "n01484850"]
OOD = ["n02084071", "n04399382"]


@pytest.fixture(scope="module")
def world(tmp_path_factory, tiny_eval):
    """train/ (4 per class), val/ (2 per class), val2/ (val/ with one image replaced), a flat copy of val/ with a
    ground-truth file and a shuffled one, a 2 x 2 splits manifest over test/ (and test2/, one image replaced),
    a class list and its permutation, two tiny ResNet checkpoints."""
    from isood.dev.tiny_models import build_tiny_classifier

    _image = tiny_eval.image
    root = tmp_path_factory.mktemp("cache-keys")
    rng = np.random.default_rng(0)
    colour = {w: rng.integers(30, 225, 3) for w in ID + OOD}
    for w in ID:
        for i in range(4):
            _image(root / "train" / w / f"{w}_{i}.png", colour[w], rng)
        for i in range(2):
            _image(root / "val" / w / f"{w}_{i}.png", colour[w], rng)
    shutil.copytree(root / "val", root / "val2")
    _image(root / "val2" / ID[0] / f"{ID[0]}_0.png", colour[ID[1]], rng)
    (root / "flat").mkdir()
    truth, shuffled = [], []
    for i, f in enumerate(sorted((root / "val").rglob("*.png"))):
        shutil.copy(f, root / "flat" / f.name)
        truth.append(f"{f.name} {f.parent.name}")
        shuffled.append(f"{f.name} {ID[(ID.index(f.parent.name) + 1) % 3]}")
    (root / "truth.txt").write_text("\n".join(truth) + "\n")
    (root / "shuffled.txt").write_text("\n".join(shuffled) + "\n")
    (root / "flat.txt").write_text("\n".join(sorted(p.name for p in (root / "flat").iterdir())) + "\n")
    (root / "classes.txt").write_text("\n".join(ID) + "\n")
    (root / "permuted.txt").write_text("\n".join(ID[1:] + ID[:1]) + "\n")
    rows = tiny_eval.grid_splits(root / "splits", root / "test", rng, colour, id_wnids=ID, ood_wnids=OOD,
                                 per_cell=3)
    shutil.copytree(root / "test", root / "test2")
    _image(root / "test2" / rows[0]["path"], colour[OOD[0]], rng)
    build_tiny_classifier(root / "a.safetensors", num_classes=3, seed=0)
    build_tiny_classifier(root / "b.safetensors", num_classes=3, seed=1)
    return root


def _base(world: Path) -> dict:
    return dict(id_test=world / "val", id_train=world / "train", splits=world / "splits",
                checkpoint=world / "a.safetensors", detectors="msp", na_threshold=2, device="cpu")


def _run(world: Path, cache: Path, **change) -> tuple[set[str], isood.Evaluation]:
    """The cache keys one evaluation leaves in a fresh ``cache`` (one folder per entry), and the evaluation."""
    import torch

    torch.set_num_threads(1)
    kw = {k: v for k, v in {**_base(world), **change}.items() if v is not None}
    ev = isood.evaluate(kw.pop("model", "test_resnet"), cache_dir=cache, **kw)
    return {p.parent.name for p in cache.glob("*/meta.json")}, ev


@pytest.fixture(scope="module")
def baseline(world, tmp_path_factory):
    return _run(world, tmp_path_factory.mktemp("base-cache"))


#: option -> a change of it (a function of the world folder for paths); each must change the run's keys.
KEYED = {
    "id_test": lambda w: w / "val2",                       # content: one image replaced
    "id_train": lambda w: w / "val2",                      # another training set
    "splits": None,                                        # shown with test_root (the images a manifest names)
    "test_root": lambda w: w / "test2",                    # content of the grid's images
    "ood": None,                                           # an OOD set's images: the same data identity as splits
    "ood_root": None,                                      # the root of an --ood set: as test_root
    "syn": None,                                           # a Syn-IS set's images: the same data identity
    "model": "module",                                     # the model identity hashes every weight (a module here)
    "checkpoint": lambda w: w / "b.safetensors",
    "num_classes": None,                                   # the head size: the weights' shapes, in the identity
    "classes": lambda w: w / "permuted.txt",               # the labels the cache stores
    "id_test_labels": lambda w: w / "shuffled.txt",        # with id_test = the flat folder (see _change)
    "id_test_root": lambda w: w / "val2",                  # with id_test = a list (see _change)
    "decode": "fast",
    "precision": "bf16",
    "preprocess": ("imagenet",),
    "sanity_random_model": True,                           # a randomised copy: its own identity, its own entries
}

#: option -> why it cannot change what the cache stores (model outputs and labels of the images a key names).
UNKEYED = {
    "out": "where the manifest is written; read by nothing that is cached",
    "benchmark": "resolved before the stage into --ood / --ood-root / --id-test entries, which are keyed as given",
    "data_root": "resolved with --benchmark into the sets' manifests and image roots, which are keyed as given",
    "detectors": "entries are per captured kind (logits, features, ...) and per input detector's parameters "
                 "(score_kind): a detector reads the cached outputs, it does not change them",
    "batch_size": "images per forward pass: the same outputs up to float rounding (compared with tolerances)",
    "device": "where the same model runs on the same inputs: the same outputs up to float rounding",
    "decode_processes": "decoding processes: the same decoded images in the same order",
    "cache_dir": "the cache's own location",
    "na_threshold": "decides N/A cells after scoring, from counts",
    "der": "whether the ID training set is scored; its entry is keyed by its own data like every other set",
    "plot_metrics": "what is drawn after scoring",
    "bootstrap": "resamples of the metrics after scoring",
    "seed": "the bootstrap's and the random re-initialisation's seed: the randomised model's weights are in its "
            "identity, so another seed is another key",
    "leak_audit": "which scored images count as leak-free, after scoring",
    "leak_rules": "which audit verdicts count as leaks, after scoring",
    "verify": "how the input manifests are checked before anything is read",
    "progress": "progress bars on the terminal, nothing computed",
    "table_convention": "Table 1's rule over the per-cell metrics, after scoring",
}


def test_every_evaluate_option_is_keyed_or_reasoned():
    names = {f.name for f in dataclasses.fields(EvaluateOptions)}
    assert set(KEYED) | set(UNKEYED) == names, sorted(names ^ (set(KEYED) | set(UNKEYED)))
    assert not set(KEYED) & set(UNKEYED)
    assert all(len(reason) > 20 for reason in UNKEYED.values())


def _change(world: Path, name: str) -> dict:
    value = KEYED[name]
    value = value(world) if callable(value) else value
    if name == "id_test_labels":
        return {"id_test": world / "flat", "id_test_labels": value}
    if name == "id_test_root":
        return {"id_test": world / "flat.txt", "id_test_root": value}
    if name == "id_train":  # a fitted detector: the training set is read
        return {"id_train": value, "detectors": "knn:k=1"}
    if name == "model":
        import timm
        import torch

        torch.manual_seed(5)
        return {"model": timm.create_model("test_resnet", pretrained=False, num_classes=3), "checkpoint": None}
    return {name: value}


def _reference(world: Path, name: str) -> dict:
    """The run a change is compared with (the baseline, or its own counterpart for options that need
    another form of ``--id-test``)."""
    if name == "id_test_labels":
        return {"id_test": world / "flat", "id_test_labels": world / "truth.txt"}
    if name == "id_test_root":
        return {"id_test": world / "flat.txt", "id_test_root": world / "val"}
    if name == "id_train":
        return {"detectors": "knn:k=1"}
    return {}


@pytest.mark.parametrize("name", [n for n, v in KEYED.items() if v is not None])
def test_an_option_that_changes_the_cached_outputs_changes_the_key(name, world, baseline, tmp_path):
    if name == "id_test_root":  # the flat list names files directly under the root: a wnid-less copy
        for src in ("val", "val2"):
            for f in (world / src).rglob("*.png"):
                (world / f"{src}-flat").mkdir(exist_ok=True)
                shutil.copy(f, world / f"{src}-flat" / f.name)
        keys_a, _ = _run(world, tmp_path / "a", id_test=world / "flat.txt", id_test_root=world / "val-flat")
        keys_b, _ = _run(world, tmp_path / "b", id_test=world / "flat.txt", id_test_root=world / "val2-flat")
    else:
        ref = _reference(world, name)
        keys_a = _run(world, tmp_path / "a", **ref)[0] if ref else baseline[0]
        keys_b, _ = _run(world, tmp_path / "b", **_change(world, name))
    assert keys_b - keys_a, f"--{name.replace('_', '-')} left every cache key unchanged"


@pytest.mark.parametrize("labels", ["shuffled.txt", "permuted-classes"])
def test_labels_are_not_reused_from_an_earlier_entry(labels, world, tmp_path):
    """A run with other labels after a cached run returns its own labels (those a run
    without any cache returns), not the cached ones."""
    cache = tmp_path / "cache"
    if labels == "shuffled.txt":
        first = {"id_test": world / "flat", "id_test_labels": world / "truth.txt"}
        second = {"id_test": world / "flat", "id_test_labels": world / "shuffled.txt"}
    else:
        first = {"classes": world / "classes.txt"}
        second = {"classes": world / "permuted.txt"}
    _run(world, cache, **first)
    _keys, cached = _run(world, cache, **second)
    fresh = isood.evaluate("test_resnet", cache_dir="", **{**_base(world), **second})
    for ds in ("id_test",):
        np.testing.assert_array_equal(cached.scores.labels[ds], fresh.scores.labels[ds])
    pd.testing.assert_frame_equal(cached.per_set, fresh.per_set, check_exact=False, rtol=1e-6)
