"""isood.features.clip: loading by name, offline errors, text features and their cache, the extraction worker."""

from __future__ import annotations

import dataclasses
import time

import numpy as np
import pytest
import torch
from PIL import Image

from isood.features.clip import (ClipEncodeWorker, ClipSpec, encode_image_batch, encode_texts, load_clip, parse_clip_spec,
                        text_cache_key)
from isood.core.errors import IsoodError, MissingWeightsError
from isood.core.workers import WorkerSpec


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
    np.testing.assert_allclose(plain[0], plain[2], atol=1e-6)  # one text in batches of 2 and 1: not bit-equal
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
    worker = ClipEncodeWorker(tiny_encoder, "cpu", WorkerSpec(threads))
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


# ----------------------------------------------------------------------------------------------- fast decoding
def _photo(w: int, h: int, seed: int) -> Image.Image:
    rng = np.random.default_rng(seed)
    small = Image.fromarray(rng.integers(0, 256, size=(5, 7, 3), dtype=np.uint8)).resize((w, h), Image.BICUBIC)
    a = np.asarray(small, dtype=np.float32) + rng.normal(0, 12, size=(h, w, 3))
    return Image.fromarray(np.clip(a, 0, 255).astype(np.uint8))


@pytest.fixture(scope="module")
def tiny_224_encoder(tmp_path_factory):
    """The tiny model with a 224 px input (ViT patch 32), so images are resized by ImageNet's ratios."""
    import json

    from open_clip.model import CLIP
    from safetensors.torch import save_file

    from isood.dev.tiny_models import TINY_CLIP_CONFIG

    cfg = json.loads(json.dumps(TINY_CLIP_CONFIG))
    cfg["model_cfg"]["vision_cfg"].update(image_size=224, patch_size=32)
    folder = tmp_path_factory.mktemp("tiny224")
    torch.manual_seed(1)
    model = CLIP(**cfg["model_cfg"])
    with torch.no_grad():
        for p in model.parameters():
            p.add_(0.02 * torch.randn_like(p))
    save_file({k: v.contiguous() for k, v in model.state_dict().items()}, str(folder / "open_clip_model.safetensors"))
    (folder / "open_clip_config.json").write_text(json.dumps(cfg))
    return load_clip(f"local-dir:{folder}", device="cpu")


@pytest.mark.parametrize("mode", ["fast", "gpu"])
@pytest.mark.parametrize("model", ["tiny_encoder", "tiny_224_encoder"])
def test_fast_and_gpu_decode_workers_keep_cosine_to_the_reference_and_flag_bad_images(model, mode, request,
                                                                                       tmp_path):
    """``--decode fast`` / ``--decode gpu`` (here on the CPU: the same batched decode_jpeg + tensor steps)."""
    from isood.features.decoding import REFERENCE_DECODE

    encoder = request.getfixturevalue(model)
    files = []
    for i, (w, h) in enumerate([(500, 375), (375, 500), (1000, 750), (700, 690), (120, 90), (64, 48)]):
        files.append(tmp_path / f"{i}.JPEG")
        _photo(w, h, i).save(files[-1], quality=int(75 + 4 * i))
    files.append(tmp_path / "gray.JPEG")
    _photo(800, 600, 9).convert("L").save(files[-1], quality=90)
    files.append(tmp_path / "p.png")
    _photo(900, 700, 10).save(files[-1])
    files.append(tmp_path / "cmyk.jpg")
    _photo(400, 300, 11).convert("CMYK").save(files[-1], quality=90)
    files.append(tmp_path / "progressive.jpg")
    _photo(400, 300, 12).save(files[-1], quality=90, progressive=True)
    files.append(tmp_path / "broken.JPEG")
    files[-1].write_bytes(files[2].read_bytes()[:5000])  # truncated
    batch = {"i": np.arange(len(files)), "path": [str(f) for f in files], "name": [f.name for f in files]}
    ref = ClipEncodeWorker(encoder, "cpu", WorkerSpec(1), REFERENCE_DECODE)(batch)
    fast = ClipEncodeWorker(encoder, "cpu", WorkerSpec(2), mode)(batch)
    assert ref["ok"].tolist() == fast["ok"].tolist() == [True] * (len(files) - 1) + [False]
    assert fast["error"][-1] == ref["error"][-1] != "" and not fast["feature"][-1].any()
    assert fast["sha256"].tolist() == ref["sha256"].tolist()
    ok = ref["ok"]
    np.testing.assert_allclose(ref["feature"][ok], _direct(encoder, files[:-1]), atol=2e-5)  # the reference path
    cos = (ref["feature"][ok] * fast["feature"][ok]).sum(1)
    assert cos.min() >= 0.999  # the fast / gpu promise (bench/decode.py measures it on ImageNet-like sizes)
    assert not np.array_equal(ref["feature"][ok], fast["feature"][ok])  # another path really ran


@pytest.mark.parametrize("mode", ["reference", "fast", "gpu"])
def test_stream_in_processes_gives_the_calls_features_whatever_the_workers(mode, tiny_encoder, tiny_images,
                                                                           monkeypatch, tmp_path):
    """The local engine's ``stream``: the CPU part of decoding in 1 or 2 processes (not this one), or here (0);
    every batch's features and errors byte-identical to a call on the batch, whatever the number."""
    import os

    from isood.features.batch_decode import ImageDecoder

    rels = sorted(p.relative_to(tiny_images).as_posix() for p in tiny_images.rglob("*")
                  if p.is_file() and p.suffix != ".txt")
    files = [tiny_images / r for r in rels]
    batches = [{"i": np.arange(s, min(s + 7, len(rels))), "path": [str(f) for f in files[s:s + 7]],
                "name": rels[s:s + 7]} for s in range(0, len(rels), 7)]
    want = [ClipEncodeWorker(tiny_encoder, "cpu", WorkerSpec(0), mode)(b) for b in batches]
    assert sum(int((~w["ok"]).sum()) for w in want) == 1  # the corrupt file
    prepare = ImageDecoder.prepare

    def spy(self, paths, *args, **kwargs):  # runs in the decoding process: leave its pid behind
        (tmp_path / f"pid-{os.getpid()}").touch()
        return prepare(self, paths, *args, **kwargs)

    monkeypatch.setattr(ImageDecoder, "prepare", spy)
    for workers in (0, 1, 2):
        for p in tmp_path.glob("pid-*"):
            p.unlink()
        got = list(ClipEncodeWorker(tiny_encoder, "cpu", WorkerSpec(workers), mode).stream(batches))
        pids = {int(p.name[4:]) for p in tmp_path.glob("pid-*")}
        assert (pids == {os.getpid()}) if workers == 0 else (len(pids) == workers and os.getpid() not in pids)
        assert len(got) == len(want)
        for g, w in zip(got, want):
            assert g["i"].tolist() == w["i"].tolist() and g["ok"].tolist() == w["ok"].tolist()
            assert g["error"].tolist() == w["error"].tolist() and g["sha256"].tolist() == w["sha256"].tolist()
            assert g["feature"].tobytes() == w["feature"].tobytes()


def test_worker_refuses_an_unknown_decode_mode(tiny_encoder):
    from isood.core.errors import BadInputError

    with pytest.raises(BadInputError, match="warp"):
        ClipEncodeWorker(tiny_encoder, "cpu", WorkerSpec(1), "warp")
