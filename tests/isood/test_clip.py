"""isood.clip: loading by name, offline errors, text features and their cache, the extraction worker."""

from __future__ import annotations

import dataclasses
import time

import numpy as np
import pytest
import torch
from PIL import Image

from isood.clip import (ClipEncodeWorker, ClipSpec, encode_image_batch, encode_texts, load_clip, parse_clip_spec,
                        text_cache_key)
from isood.errors import IsoodError, MissingWeightsError


def _direct(encoder, files):
    """Reference: the images encoded with the model in one batch, L2-normalised."""
    with torch.inference_mode():
        x = torch.stack([encoder.preprocess(Image.open(f).convert("RGB")) for f in files])
        f = encoder.model.encode_image(x).float()
    return torch.nn.functional.normalize(f, dim=-1).numpy()


# ----------------------------------------------------------------------------------------------- loading
def test_pretrained_tag_offline_is_one_line_missing_weights_error(monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    t0 = time.perf_counter()
    with pytest.raises(MissingWeightsError) as e:
        load_clip("ViT-B-32:openai", device="cpu")
    msg = str(e.value)
    assert "\n" not in msg and "local-dir:PATH" in msg and "ViT-B-32:openai" in msg
    assert e.value.__cause__ is None and e.value.__suppress_context__  # no library traceback chained
    with pytest.raises(MissingWeightsError, match=r"hf-hub:laion/CLIP-ViT-B-32-laion2B-s34B-b79K"):
        load_clip("hf-hub:laion/CLIP-ViT-B-32-laion2B-s34B-b79K", device="cpu")
    assert time.perf_counter() - t0 < 30


def test_bad_clip_names_give_one_line_errors(tmp_path, tiny_clip_dir):
    with pytest.raises(IsoodError, match=r"'ViT-Nope-99'") as e:
        load_clip("ViT-Nope-99:openai")
    assert "\n" not in str(e.value)
    with pytest.raises(IsoodError, match=r"'nosuchtag'.*ViT-B-32.*openai"):
        load_clip("ViT-B-32:nosuchtag")
    with pytest.raises(IsoodError, match=r"ViT-B-32:openai"):  # names no weights: suggests a tag
        load_clip("ViT-B-32")
    with pytest.raises(IsoodError, match="does not exist"):
        load_clip(f"local-dir:{tmp_path / 'missing'}")
    with pytest.raises(IsoodError, match=r"'cuda:99'.*--device cpu"):
        load_clip(f"local-dir:{tiny_clip_dir}", device="cuda:99")
    with pytest.raises(IsoodError, match="'tpu-ish'"):
        load_clip(f"local-dir:{tiny_clip_dir}", device="tpu-ish")
    (tmp_path / "noweights").mkdir()
    (tmp_path / "noweights" / "open_clip_config.json").write_text((tiny_clip_dir / "open_clip_config.json").read_text())
    with pytest.raises(MissingWeightsError, match="holds no weights"):
        load_clip(f"local-dir:{tmp_path / 'noweights'}")


def test_clip_spec_and_local_dir_identity_follows_weight_content(tmp_path, tiny_clip_dir, tiny_clip_factory):
    assert parse_clip_spec("ViT-B-32:openai") == ClipSpec("ViT-B-32", "openai", "open_clip:ViT-B-32:openai")
    assert parse_clip_spec("hf-hub:org/repo").identity == "open_clip:hf-hub:org/repo"
    same = tmp_path / "copy"
    same.mkdir()
    for p in tiny_clip_dir.iterdir():
        (same / p.name).write_bytes(p.read_bytes())
    other = tiny_clip_factory(tmp_path / "other", seed=1)
    ident = lambda d: parse_clip_spec(f"local-dir:{d}").identity  # noqa: E731
    assert ident(same) == ident(tiny_clip_dir)  # a copy elsewhere is the same model
    assert ident(other) != ident(tiny_clip_dir)


def test_tiny_encoder_loads_with_its_identity(tiny_encoder, tiny_clip_spec):
    assert tiny_encoder.embed_dim == 32 and tiny_encoder.spec == tiny_clip_spec
    assert tiny_encoder.identity == parse_clip_spec(tiny_clip_spec).identity and str(tiny_encoder.device) == "cpu"


# ----------------------------------------------------------------------------------------------- text
class _Boom(torch.nn.Module):
    def encode_text(self, tokens):
        raise AssertionError("the model was called")


def test_text_cache_hit_returns_identical_array_without_the_model(tiny_encoder, tmp_path):
    texts = ["a photo of a tench.", "a sketch of a dog.", "a photo of a tench."]
    plain = encode_texts(tiny_encoder, texts, batch_size=2)
    assert plain.dtype == np.float32 and plain.shape == (3, 32)
    np.testing.assert_allclose(np.linalg.norm(plain, axis=1), 1.0, atol=1e-5)
    np.testing.assert_array_equal(plain[0], plain[2])
    assert np.abs(plain[0] - plain[1]).max() > 1e-3
    first = encode_texts(tiny_encoder, texts, cache_dir=tmp_path)
    np.testing.assert_allclose(first, plain, atol=1e-6)
    assert [p.name for p in tmp_path.glob("text-*.npy")] == [f"text-{text_cache_key(tiny_encoder.identity, texts)}.npy"]
    broken = dataclasses.replace(tiny_encoder, model=_Boom())
    hit = encode_texts(broken, texts, cache_dir=tmp_path)
    np.testing.assert_array_equal(hit, first)
    with pytest.raises(AssertionError, match="model was called"):  # other texts or order: a miss
        encode_texts(broken, texts[:2], cache_dir=tmp_path)
    with pytest.raises(AssertionError, match="model was called"):  # same texts, other model identity: a miss
        encode_texts(dataclasses.replace(broken, identity="other"), texts, cache_dir=tmp_path)


def test_text_cache_key_depends_on_order_and_identity():
    assert text_cache_key("m", ["a", "b"]) != text_cache_key("m", ["b", "a"])
    assert text_cache_key("m", ["a"]) != text_cache_key("n", ["a"])
    assert text_cache_key("m", ["a", "b"]) == text_cache_key("m", ("a", "b"))


# ----------------------------------------------------------------------------------------------- images
@pytest.mark.parametrize("threads", [1, 3])
def test_worker_encodes_a_batch_as_one_forward_pass_and_flags_bad_images(tiny_encoder, tiny_images,
                                                                         tiny_image_info, threads):
    corrupt = tiny_image_info["corrupt"]
    rels = sorted(p.relative_to(tiny_images).as_posix() for p in (tiny_images / corrupt).parent.iterdir())
    worker = ClipEncodeWorker(tiny_encoder, "cpu", threads)
    out = worker({"i": np.arange(10, 10 + len(rels)), "path": [str(tiny_images / r) for r in rels], "name": rels})
    bad = rels.index(corrupt)
    assert out["i"].tolist() == list(range(10, 10 + len(rels)))
    assert out["ok"].tolist() == [j != bad for j in range(len(rels))]
    assert out["error"][bad].startswith(("OSError", "UnidentifiedImageError"))
    assert str(tiny_images) not in out["error"][bad]
    assert all(e == "" for j, e in enumerate(out["error"]) if j != bad)
    good = [tiny_images / r for j, r in enumerate(rels) if j != bad]
    np.testing.assert_allclose(out["feature"][out["ok"]], _direct(tiny_encoder, good), atol=2e-5)
    assert not out["feature"][bad].any()


def test_worker_loads_a_named_model_and_empty_batch(tiny_clip_spec):
    worker = ClipEncodeWorker(tiny_clip_spec, "cpu")
    out = worker({"path": [], "name": []})
    assert out["feature"].shape == (0, 32) and out["ok"].shape == (0,)
    assert encode_image_batch(worker.encoder, None).shape == (0, 32)
