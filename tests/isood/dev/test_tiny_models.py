"""`isood dev tiny-models DIR`: what it writes loads through the real loaders (``isood.features.clip.load_clip``,
``generation.pipeline.load_pipeline``, the ``isood evaluate --model/--checkpoint`` loader), its README.txt gives the
flags that use it, a rerun changes nothing, and DIR is written whole or not at all."""

from __future__ import annotations

import json
import re
import shlex
from pathlib import Path

import numpy as np
import pytest
import torch
from typer.testing import CliRunner

from isood.cli import app
from isood.dev.tiny_models import (TINY_CLASSIFIER, TINY_ID_CLASSES, TINY_OOD_CLASSES, TINY_SDXL_SIZE,
                               build_tiny_classifier, write_tiny_models)


def _invoke(args):
    torch.set_num_threads(1)
    return CliRunner().invoke(app, [str(a) for a in args])


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    """``isood dev tiny-models DIR`` run once: (DIR, the command's output)."""
    out = tmp_path_factory.mktemp("newcomer") / "tiny"
    r = _invoke(["dev", "tiny-models", out])
    assert r.exit_code == 0, r.output
    return out, r.output


def _flag(text: str, flag: str) -> str:
    """The value given to ``flag`` in README.txt's lines."""
    m = re.search(re.escape(flag) + r" (\S+)", text)
    assert m, (flag, text)
    return m.group(1)


def test_the_written_files_load_through_the_real_loaders(tiny):
    from generation.pipeline import load_pipeline
    from isood.features.clip import encode_texts, load_clip
    from isood.classifiers.named import adapter_from_option
    from PIL import Image

    out, _ = tiny
    readme = (out / "README.txt").read_text()
    clip = _flag(readme, "--clip")
    assert clip == f"local-dir:{out / 'clip'}"
    encoder = load_clip(clip, device="cpu")
    texts = encode_texts(encoder, ["a photo of a tench.", "a photo of a volcano."])
    assert texts.shape == (2, 32) and np.allclose(np.linalg.norm(texts, axis=1), 1, atol=1e-5)
    assert not np.allclose(texts[0], texts[1])  # the towers depend on their input

    pipe = load_pipeline(_flag(readme, "--pipeline"), device="cpu")
    size = int(_flag(readme, "--size"))
    assert size == TINY_SDXL_SIZE
    image = pipe(prompt=["a red fox, papercut"], num_inference_steps=1, guidance_scale=0.0, height=size, width=size,
                 generator=torch.Generator().manual_seed(0)).images[0]
    assert image.size == (size, size)

    model, checkpoint = _flag(readme, "--model"), _flag(readme, "--checkpoint")
    assert model == TINY_CLASSIFIER and Path(checkpoint) == out / "classifier.safetensors"
    adapter = adapter_from_option(model, checkpoint=checkpoint, n_id_classes=len(TINY_ID_CLASSES))
    one = next((out / "images" / "val" / TINY_ID_CLASSES[0]).iterdir())
    with torch.no_grad():
        logits = adapter.model(adapter.transform(Image.open(one).convert("RGB"))[None])
    assert logits.shape == (1, len(TINY_ID_CLASSES)) and torch.isfinite(logits).all()


def test_the_classifier_is_the_seeded_builders_bytes(tiny, tmp_path):
    """The same seed gives the same weights (an independent second build compared byte for byte)."""
    out, _ = tiny
    again = build_tiny_classifier(tmp_path / "again.safetensors", num_classes=len(TINY_ID_CLASSES), seed=0)
    assert again.read_bytes() == (out / "classifier.safetensors").read_bytes()
    other = build_tiny_classifier(tmp_path / "other.safetensors", num_classes=len(TINY_ID_CLASSES), seed=1)
    assert other.read_bytes() != again.read_bytes()


def test_images_and_readme_match_what_the_flags_need(tiny):
    from PIL import Image

    out, printed = tiny
    images = out / "images"
    assert sorted(p.name for p in (images / "train").iterdir()) == sorted(TINY_ID_CLASSES)
    assert sorted(p.name for p in (images / "val").iterdir()) == sorted(TINY_ID_CLASSES)
    assert sorted(p.name for p in (images / "test").iterdir()) == sorted(TINY_ID_CLASSES + TINY_OOD_CLASSES)
    files = sorted(images.rglob("*.*"))
    assert len(files) == 4 * (16 + 4 + 3) + 4 * 6
    for f in files:
        with Image.open(f) as im:
            im.load()
    readme = (out / "README.txt").read_text()
    assert readme in printed.replace("\r", "") or readme.splitlines()[0] in printed
    # every path named in the commands exists (outputs under out/ aside), and each command is a real one
    commands = [ln.strip() for ln in readme.splitlines() if ln.strip().startswith("isood ")]
    assert [c.split()[1] for c in commands] == ["build-splits", "generate-syn", "evaluate", "verify", "show", "wordnet"]
    for c in commands:
        for word in shlex.split(c):
            path = word.removeprefix("local-dir:")
            if path.startswith(str(out)):
                assert Path(path).exists(), path


def test_a_rerun_changes_nothing_and_another_seed_is_refused(tiny, cli_runner_error_line):
    out, _ = tiny
    before = {p: p.stat().st_mtime_ns for p in out.rglob("*")}
    r = _invoke(["dev", "tiny-models", out])
    assert r.exit_code == 0 and "already holds tiny models of seed 0: nothing written" in r.output, r.output
    assert {p: p.stat().st_mtime_ns for p in out.rglob("*")} == before
    line = cli_runner_error_line(_invoke(["dev", "tiny-models", out, "--seed", "1"]))
    assert "holds tiny models of seed 0" in line and "pass another folder" in line
    assert {p: p.stat().st_mtime_ns for p in out.rglob("*")} == before


def test_an_interrupted_run_is_replaced_and_a_foreign_staging_folder_refused(tmp_path, monkeypatch):
    """A leftover ``.~DIR.isood-new`` of ours (it holds the marker) is removed and DIR built; one without the
    marker is somebody else's: refused, left as it is. A failed build leaves neither DIR nor the staging folder."""
    import isood.dev.tiny_models as tm

    out = tmp_path / "tiny"
    staging = tmp_path / ".~tiny.isood-new"
    staging.mkdir()
    (staging / "other.txt").write_text("not ours")
    with pytest.raises(tm.BadInputError, match="is in the way"):
        write_tiny_models(out)
    assert (staging / "other.txt").read_text() == "not ours" and not out.exists()

    (staging / "other.txt").unlink()
    (staging / ".~isood-tiny-models.json").write_text(json.dumps({"written_by": "isood dev tiny-models", "seed": 0,
                                                                  "complete": False}))

    def fail(work, seed):
        (work / "clip").mkdir()
        raise RuntimeError("disk on fire")

    monkeypatch.setattr(tm, "_build", fail)
    with pytest.raises(RuntimeError):
        write_tiny_models(out)
    assert not out.exists() and not staging.exists()


@pytest.fixture
def cli_runner_error_line():
    def line(result):
        assert result.exit_code == 2, result.output
        lines = [ln for ln in result.stderr.splitlines() if ln.strip()]
        assert len(lines) == 1 and "Traceback" not in result.output, result.output
        return " ".join(lines[0].split())

    return line
