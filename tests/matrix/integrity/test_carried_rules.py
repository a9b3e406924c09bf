"""What a manifest records is carried to every stage that reads it, from any working directory.

* One N/A rule: a grid manifest built with `--na-threshold 2` (the real `isood build-splits`, tiny world) is
  evaluated by `isood evaluate`, `isood.evaluate(...)` and `isood.evaluate_scores(splits=...)` with 2 when no
  threshold is given, and with an explicit one when it is; the output records both (``assemble.na_thresholds``).
  The reference: a cell is N/A when the manifest's images in it, counted here with pandas, are below the threshold.
* Explicit roots: the build runs in one folder with relative paths (`--clip local-dir:clip`); the manifest stores
  them absolute (``isood.core.optconfig.recorded``), so `generate-syn --splits` (no `--clip`) and `evaluate` run from
  another folder, and their own manifests store absolute paths and specs too; the Syn-IS grid binned on the
  splits takes their N/A threshold.
* An approximate search with no held-out image (a set too small to tune on) reports no interval, not a perfect one.
* CLIP zero-shot: ImageNet-1K prompts use open_clip's ``IMAGENET_CLASSNAMES``; MCM / GL-MCM refuse a non-CLIP model
  in one line before any forward pass.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

import manifests

ID_CLASSES = {"n01440764": 5, "n02123045": 5}
TEST_CLASSES = {"n01443537": 4, "n02084071": 4, "n04399382": 4, "n02123045": 2}
BUILD = ["--triplets", "150", "--laid-steps", "40", "--levels", "2", "--na-threshold", "2", "--workers", "0",
         "--ann-recall", "0.9"]


def _counts(view) -> pd.Series:
    """Images per cell of a grid manifest, counted here from its images table (the reference)."""
    img = view.images
    img = img[(img["cov_level"] >= 0) & (img["sem_level"] >= 0)]
    return img.groupby("cell").size()


@pytest.fixture(scope="module")
def world(tmp_path_factory, tiny_clip_dir, image_dataset_factory, cli):
    """A project folder (images, a copy of the tiny CLIP, a labels file, a tiny classifier) and a splits
    manifest built IN it with relative paths; ``elsewhere`` is another folder to run the next stages from."""
    from isood.dev.tiny_models import build_tiny_classifier

    base = tmp_path_factory.mktemp("carried")
    proj, elsewhere = base / "proj", base / "elsewhere"
    elsewhere.mkdir()
    image_dataset_factory(proj / "id", classes=ID_CLASSES, seed=7, corrupt=None)
    image_dataset_factory(proj / "val", classes={w: 2 for w in ID_CLASSES}, seed=9, corrupt=None)
    image_dataset_factory(proj / "test", classes=TEST_CLASSES, seed=8, corrupt=None)
    shutil.copytree(tiny_clip_dir, proj / "clip")
    (proj / "labels.txt").write_text("tench\ngoldfish\ndog\nteddy bear\ncat\ncar\nhouse\ntree\n")
    build_tiny_classifier(proj / "classifier.safetensors", num_classes=len(ID_CLASSES))
    with contextlib.chdir(proj):
        r = cli.invoke(["build-splits", "--id", "id", "--test", "test", "--clip", "local-dir:clip", "--labels",
                        "labels.txt", "--cache-dir", "cache", *BUILD, "--out", "splits"])
    assert r.exit_code == 0, r.output
    return {"proj": proj, "elsewhere": elsewhere, "build_output": r.output,
            "splits": manifests.read(proj / "splits", kind="splits")}


def _evaluate_args(world, out, *extra):
    p = world["proj"]
    return ["evaluate", "--splits", p / "splits", "--id-test", p / "val", "--id-train", p / "id", "--model",
            "test_resnet", "--checkpoint", p / "classifier.safetensors", "--detectors", "msp", "--no-der",
            "--bootstrap", "0", "--plot-metrics", "auroc", "--cache-dir", p / "cache-eval", "--out", out, *extra]


def _explicit(counts: pd.Series) -> int:
    """A threshold that decides some cell otherwise than 2 does (the largest count: that cell stays, the others
    below it go N/A)."""
    t = int(counts.max())
    assert (counts < t).any() and ((counts >= 2) & (counts < t)).any(), counts
    return t


def _na_of(per_cell: pd.DataFrame) -> dict[str, bool]:
    rows = per_cell[per_cell["dataset"] == "splits"].drop_duplicates("cell")
    return {str(c): bool(n) for c, n in zip(rows["cell"], rows["na"])}


def _expected(counts: pd.Series, cells, threshold: int) -> dict[str, bool]:
    return {c: int(counts.get(c, 0)) < threshold for c in cells}


def test_the_manifest_records_its_threshold_and_absolute_paths(world):
    view = world["splits"]
    proj = world["proj"].resolve()
    assert view.na_threshold == 2
    config = view.config
    assert view.clip == f"local-dir:{proj / 'clip'}"
    for key in ("id", "test", "out", "labels", "cache_dir"):
        assert Path(config[key]).is_absolute() and Path(config[key]).resolve().is_relative_to(proj), (key, config[key])
    assert Path(view.test_root).resolve() == proj / "test"


@pytest.mark.parametrize("explicit", [False, True], ids=["manifest-threshold", "explicit-threshold"])
def test_cli_and_api_use_one_na_threshold(explicit, world, cli, tmp_path):
    """Guard: assemble.na_thresholds (GridView.na_threshold the default; --na-threshold overrides)."""
    import isood
    from isood.science.cells import evaluate_scores

    view = world["splits"]
    counts = _counts(view)
    threshold = _explicit(counts) if explicit else 2
    extra = ["--na-threshold", str(threshold)] if explicit else []
    r = cli.invoke(_evaluate_args(world, tmp_path / "ev", *extra))
    assert r.exit_code == 0, r.output
    ev = manifests.read(tmp_path / "ev", kind="evaluation")
    cells = sorted(set(ev.cell_metrics["cell"]))
    assert _na_of(ev.cell_metrics) == _expected(counts, cells, threshold)
    record = {"manifest": 2, "used": threshold}
    assert ev.config["na_thresholds"] == {"splits": record} and ev.meta["summary"]["na_thresholds"] == {"splits": record}
    assert ev.config["na_threshold"] == (threshold if explicit else None)
    assert f"splits {threshold} (" in " ".join(r.output.split()) and "manifest 2)" in r.output

    p = world["proj"]
    opts = {"na_threshold": threshold} if explicit else {}
    api = isood.evaluate("test_resnet", id_test=p / "val", id_train=p / "id", splits=p / "splits",
                         checkpoint=p / "classifier.safetensors", detectors="msp", der=False, bootstrap=0, **opts)
    assert _na_of(api.per_cell) == _expected(counts, cells, threshold)
    assert api.config["na_thresholds"] == {"splits": record}

    rng = np.random.default_rng(0)
    scores = evaluate_scores(rng.normal(size=20), rng.normal(size=len(view.images)), splits=view, dataset="splits",
                             **opts)
    assert _na_of(scores.per_cell) == _expected(counts, sorted(scores.per_cell["cell"]), threshold)


def test_a_stage_run_from_another_folder_reads_the_stored_paths(world, cli, syn_inputs_factory):
    """Guards: isood.core.optconfig.recorded / absolute_spec (splits, generate-syn and evaluate configs)."""
    proj, elsewhere = world["proj"].resolve(), world["elsewhere"]
    rel_splits = os.path.relpath(proj / "splits", elsewhere)
    with contextlib.chdir(elsewhere):
        r = cli.invoke(["generate-syn", "--splits", rel_splits, "--labels", os.path.relpath(proj / "labels.txt"),
                        "--styles", "sdxl:anime,clay", "--per-cell", "1", "--prompts-only", "--device", "cpu",
                        "--pipeline", "local-dir:sdxl", "--out", "syn"])
        assert r.exit_code == 0, r.output
        r2 = cli.invoke(["evaluate", "--splits", rel_splits, "--id-test", os.path.relpath(proj / "val"),
                         "--id-train", os.path.relpath(proj / "id"), "--model", "clip:local-dir:" +
                         os.path.relpath(proj / "clip"), "--detectors", "mcm", "--no-der", "--bootstrap", "0",
                         "--plot-metrics", "auroc", "--cache-dir", "", "--out", "ev"])
        assert r2.exit_code == 0, r2.output
    syn = json.loads((elsewhere / "syn" / "manifest.json").read_text())["command"]["config"]
    assert syn["clip"] == f"local-dir:{proj / 'clip'}"
    assert syn["splits"] == str(proj / "splits") and syn["labels"] == str(proj / "labels.txt")
    assert syn["generator"]["settings"]["pipeline"] == f"local-dir:{elsewhere.resolve() / 'sdxl'}"
    assert syn["na_threshold"] == 2 and manifests.read(elsewhere / "syn", kind="syn-is-prompts").na_threshold == 2  # the splits' rule
    ev = json.loads((elsewhere / "ev" / "manifest.json").read_text())["command"]["config"]
    assert ev["model"] == f"clip:local-dir:{proj / 'clip'}"
    assert ev["splits"] == str(proj / "splits") and ev["id_test"] == str(proj / "val")
    assert ev["out"] == str(elsewhere.resolve() / "ev")


def test_no_held_out_image_is_no_interval(world):
    """Guard: isood.stages.splits.ann_summary + isood.cli.splits.ann_line (a set too small to tune on)."""
    text = " ".join(world["build_output"].split())
    assert "CI" not in text and "no held-out check was possible (no interval)" in text
    ann = world["splits"].ann
    assert ann is not None and ann["held_out_images"] == 0 and ann["cell_agreement_ci"] is None
    assert all(a["level_agreement_ci"] is None and a["recall_heldout"] is None for a in ann["axes"].values())
    assert ann["held_out_check"] is False


def test_clip_prompts_use_open_clip_imagenet_names():
    """Guard: isood.classifiers.clip_zero_shot.class_prompts (default names: CLIP's cleaned ImageNet names)."""
    from open_clip import IMAGENET_CLASSNAMES

    from isood.classifiers.classes import imagenet_1k
    from isood.classifiers.clip_zero_shot import class_prompts
    from wordnet_tools.synsets import load_synset_list

    wnids = imagenet_1k()
    assert wnids == sorted(load_synset_list("1k"))
    assert class_prompts(wnids) == [f"a photo of a {n}" for n in IMAGENET_CLASSNAMES]
    assert class_prompts(["n01494475"]) == ["a photo of a hammerhead shark"]
    assert class_prompts(["n01494475"], {"n01494475": "hammerhead"}) == ["a photo of a hammerhead"]


def test_mcm_on_a_non_clip_model_is_refused_in_one_line(world, cli, tmp_path, monkeypatch):
    """Guards: stages.evaluate.options.check_options (--model NAME) and stages.evaluate.model.build_model (a Python model)."""
    import isood
    from isood.core.errors import BadInputError
    from isood.stages.evaluate import job
    from isood.dev.tiny_models import build_tiny_classifier

    line = cli.one_line_error(cli.invoke(_evaluate_args(world, tmp_path / "ev", "--detectors", "mcm")))
    assert "'mcm'" in line and "--model clip:SPEC" in line
    assert not (tmp_path / "ev" / "manifest.json").exists()

    import timm

    def no_pass(*a, **k):
        raise AssertionError("a forward pass ran")

    monkeypatch.setattr(job, "score_with_model", no_pass)
    build_tiny_classifier(tmp_path / "c.safetensors", num_classes=2)
    module = timm.create_model("test_resnet", pretrained=False, num_classes=2,
                               checkpoint_path=str(tmp_path / "c.safetensors")).eval()
    p = world["proj"]
    with pytest.raises(BadInputError, match="mcm.*clip:SPEC"):
        isood.evaluate(module, id_test=p / "val", id_train=p / "id", splits=p / "splits", detectors="mcm",
                       der=False, bootstrap=0)
