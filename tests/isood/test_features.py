"""isood.features and `isood extract`: loading by name, offline errors, sharded resumable extraction, text cache."""

import dataclasses
import json
import time

import numpy as np
import pandas as pd
import pytest
import torch
from PIL import Image
from typer.testing import CliRunner

import manifests
from isood import features as F
from isood.cli import app
from isood.errors import IsoodError, MissingWeightsError

TINY_IMAGE_CLASSES = {"n01440764": 5, "n01443537": 4, "n02084071": 4, "n04399382": 3}  # as tests/conftest.py makes them
TINY_CORRUPT = "n01443537/n01443537_broken.JPEG"
N_GOOD = sum(TINY_IMAGE_CLASSES.values())


@pytest.fixture(autouse=True)
def _facts_match_fixture(tiny_image_info):
    assert tiny_image_info == {"classes": TINY_IMAGE_CLASSES, "corrupt": TINY_CORRUPT}


def _direct(encoder, files):
    """Reference: each image encoded alone with the model, L2-normalised."""
    with torch.inference_mode():
        x = torch.stack([encoder.preprocess(Image.open(f).convert("RGB")) for f in files])
        f = encoder.model.encode_image(x).float()
    return torch.nn.functional.normalize(f, dim=-1).numpy()


def _error_lines(output):
    return [ln for ln in output.splitlines() if ln.strip()]


# ----------------------------------------------------------------------------------------------- loading


def test_pretrained_tag_offline_is_one_line_missing_weights_error(monkeypatch, tmp_path):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    t0 = time.perf_counter()
    with pytest.raises(MissingWeightsError) as e:
        F.load_clip("ViT-B-32:openai", device="cpu")
    msg = str(e.value)
    assert "\n" not in msg and "local-dir:PATH" in msg and "ViT-B-32:openai" in msg
    assert e.value.__cause__ is None and e.value.__suppress_context__  # no library traceback chained
    with pytest.raises(MissingWeightsError, match=r"^CLIP weights for hf-hub:laion/CLIP-ViT-B-32-laion2B-s34B-b79K could not"):
        F.load_clip("hf-hub:laion/CLIP-ViT-B-32-laion2B-s34B-b79K", device="cpu")
    assert time.perf_counter() - t0 < 30

    res = CliRunner().invoke(app, ["extract", "--images", str(tmp_path), "--clip", "ViT-B-32:openai", "--out", str(tmp_path / "o")])
    # the image folder is empty: that is reported first; with images, the weights error comes through the CLI
    assert res.exit_code == 2
    (tmp_path / "n01440764").mkdir()
    Image.new("RGB", (8, 8)).save(tmp_path / "n01440764" / "a.png")
    res = CliRunner().invoke(app, ["extract", "--images", str(tmp_path), "--clip", "ViT-B-32:openai", "--out", str(tmp_path / "o")])
    assert res.exit_code == 2
    lines = _error_lines(res.output)
    assert len(lines) == 1 and lines[0].startswith("error:") and "local-dir:PATH" in lines[0]
    assert not (tmp_path / "o" / "manifest.json").exists()


def test_bad_clip_names_give_one_line_errors(tmp_path, tiny_clip_dir):
    with pytest.raises(IsoodError, match=r"unknown CLIP model 'ViT-Nope-99'.*list_pretrained") as e:
        F.load_clip("ViT-Nope-99:openai")
    assert "\n" not in str(e.value)
    with pytest.raises(IsoodError, match=r"unknown pretrained tag 'nosuchtag' for ViT-B-32 \(known: openai, "):
        F.load_clip("ViT-B-32:nosuchtag")
    with pytest.raises(IsoodError, match=r"names no weights; pass MODEL:PRETRAINED, e.g. ViT-B-32:openai"):
        F.load_clip("ViT-B-32")
    with pytest.raises(IsoodError, match="does not exist"):
        F.load_clip(f"local-dir:{tmp_path / 'missing'}")
    with pytest.raises(IsoodError, match=r"device 'cuda:99'.*pass --device cpu"):
        F.load_clip(f"local-dir:{tiny_clip_dir}", device="cuda:99")
    with pytest.raises(IsoodError, match="unknown device 'tpu-ish'"):
        F.load_clip(f"local-dir:{tiny_clip_dir}", device="tpu-ish")
    (tmp_path / "noweights").mkdir()
    (tmp_path / "noweights" / "open_clip_config.json").write_text((tiny_clip_dir / "open_clip_config.json").read_text())
    with pytest.raises(MissingWeightsError, match="holds no weights"):
        F.load_clip(f"local-dir:{tmp_path / 'noweights'}")


def test_local_dir_identity_follows_weight_content(tmp_path, tiny_clip_dir, tiny_clip_factory):
    same = tmp_path / "copy"
    same.mkdir()
    for p in tiny_clip_dir.iterdir():
        (same / p.name).write_bytes(p.read_bytes())
    other = tiny_clip_factory(tmp_path / "other", seed=1)
    ident = lambda d: F.parse_clip_spec(f"local-dir:{d}")[2]  # noqa: E731
    assert ident(same) == ident(tiny_clip_dir)  # a copy elsewhere is the same model
    assert ident(other) != ident(tiny_clip_dir)


# ----------------------------------------------------------------------------------------------- extraction


def test_extract_normalised_equal_to_direct_encoding_and_rejects_corrupt(tiny_encoder, tiny_images, tmp_path):
    r = F.extract_features(tiny_images, tiny_encoder, tmp_path / "f", batch_size=3, shard_size=5, workers=0, progress=False)
    assert (r.n_images, r.n_rejected) == (N_GOOD, 1)
    assert manifests.verify(tmp_path / "f").ok
    x, index = F.load_features(tmp_path / "f")
    assert x.dtype == np.float32 and x.shape == (N_GOOD, 32)
    np.testing.assert_allclose(np.linalg.norm(x, axis=1), 1.0, atol=1e-5)
    np.testing.assert_allclose(x, _direct(tiny_encoder, [tiny_images / p for p in index["path"]]), atol=2e-5)
    assert index["path"].tolist() == sorted(index["path"])
    assert (index["wnid"] == index["path"].str.split("/").str[0]).all()
    assert index["wnid"].value_counts().to_dict() == TINY_IMAGE_CLASSES
    rejected = manifests.read(tmp_path / "f").frame("rejected")
    assert rejected["path"].tolist() == [TINY_CORRUPT]
    assert rejected["error"][0].startswith("OSError") or "cannot identify" in rejected["error"][0]
    assert str(tiny_images) not in rejected["error"][0]  # errors name the relative path only
    # 17 sorted files in shards of 5 -> 4 shards; the corrupt file's shard holds 4 rows
    assert sorted(p.name for p in (tmp_path / "f").glob("features-*.npy")) == [f"features-{k:05d}.npy" for k in range(4)]
    assert sum(np.load(p).shape[0] for p in (tmp_path / "f").glob("features-*.npy")) == N_GOOD


def test_extract_from_file_list_with_prefix_wnids_and_missing_file(tiny_encoder, tmp_path):
    flat = tmp_path / "flat"
    flat.mkdir()
    rng = np.random.default_rng(3)
    for name in ("n01440764_7.JPEG", "n02084071_2.png"):
        Image.fromarray(rng.integers(0, 255, (40, 30, 3), dtype=np.uint8)).save(flat / name)
    elsewhere = tmp_path / "elsewhere" / "n04399382"
    elsewhere.mkdir(parents=True)
    Image.fromarray(rng.integers(0, 255, (33, 33, 3), dtype=np.uint8)).save(elsewhere / "x.png")
    lst = flat / "list.txt"
    lst.write_text(f"# my list\nn01440764_7.JPEG\n\n{elsewhere / 'x.png'}\nn02084071_2.png\nn01443537_gone.JPEG\n")
    r = F.extract_features(lst, tiny_encoder, tmp_path / "f", workers=0, progress=False)
    assert (r.n_images, r.n_rejected) == (3, 1)
    x, index = F.load_features(tmp_path / "f")
    assert dict(zip(index["path"], index["wnid"])) == {
        "n01440764_7.JPEG": "n01440764", "n02084071_2.png": "n02084071", (elsewhere / "x.png").as_posix(): "n04399382",
    }
    rej = manifests.read(tmp_path / "f").frame("rejected")
    assert rej["path"].tolist() == ["n01443537_gone.JPEG"] and rej["wnid"].tolist() == ["n01443537"]
    assert "FileNotFoundError" in rej["error"][0]
    np.testing.assert_allclose(x, _direct(tiny_encoder, [p if p.startswith("/") else flat / p for p in index["path"]]), atol=2e-5)


def _data_hashes(root):
    meta = manifests.read(root).meta
    return {f["path"]: f["sha256"] for f in meta["files"]}, meta["content_sha256"]


def test_interrupted_extraction_resumes_to_identical_features_and_files(tiny_encoder, tiny_images, tmp_path):
    kw = dict(batch_size=3, shard_size=4, workers=0, progress=False)
    full = F.extract_features(tiny_images, tiny_encoder, tmp_path / "a", **kw)
    assert full.shards_written == [0, 1, 2, 3, 4]

    class Killed(Exception):
        pass

    def kill_after_shard_1(k):
        if k == 1:
            raise Killed

    with pytest.raises(Killed):
        F.extract_features(tiny_images, tiny_encoder, tmp_path / "b", on_shard=kill_after_shard_1, **kw)
    b = tmp_path / "b"
    assert not (b / "manifest.json").exists()  # unfinished
    assert sorted(p.name for p in b.glob("features-*.npy")) == ["features-00000.npy", "features-00001.npy"]

    resumed = F.extract_features(tiny_images, tiny_encoder, b, **{**kw, "workers": 1})
    assert resumed.shards_reused == [0, 1] and resumed.shards_written == [2, 3, 4]
    assert _data_hashes(b) == _data_hashes(tmp_path / "a")
    xa, ia = F.load_features(tmp_path / "a")
    xb, ib = F.load_features(b)
    assert np.array_equal(xa, xb) and ia.equals(ib)
    assert manifests.verify(b).ok and manifests.read(b).dataset_version == "1.0.0"

    # a shard whose .npy never landed (killed mid-write) is redone; a finished rerun changes nothing
    (b / "features-00003.npy").unlink()
    (b / ".features-00003.npy.abc.tmp").write_bytes(b"partial")
    again = F.extract_features(tiny_images, tiny_encoder, b, **kw)
    assert again.shards_written == [3] and _data_hashes(b) == _data_hashes(tmp_path / "a")
    assert manifests.verify(b).ok and manifests.read(b).dataset_version == "1.0.0"


def test_rerun_with_other_model_recomputes_every_shard(tiny_encoder, tiny_images, tmp_path, tiny_clip_factory):
    F.extract_features(tiny_images, tiny_encoder, tmp_path / "f", shard_size=6, workers=0, progress=False)
    other = F.load_clip(f"local-dir:{tiny_clip_factory(tmp_path / 'm2', seed=5)}", device="cpu")
    r = F.extract_features(tiny_images, other, tmp_path / "f", shard_size=6, workers=0, progress=False)
    assert r.shards_written == [0, 1, 2] and r.shards_reused == []
    x, index = F.load_features(tmp_path / "f")
    np.testing.assert_allclose(x, _direct(other, [tiny_images / p for p in index["path"]]), atol=2e-5)
    m = manifests.read(tmp_path / "f")
    assert m.dataset_version == "1.1.0" and m.meta["command"]["config"]["clip_identity"] == other.identity


def test_extract_cli_prints_summary_and_resumes(tiny_clip_spec, tiny_images, tmp_path):
    args = ["extract", "--images", str(tiny_images), "--clip", tiny_clip_spec, "--out", str(tmp_path / "f"),
            "--shard-size", "8", "--batch-size", "4", "--workers", "0", "--device", "cpu"]
    res = CliRunner().invoke(app, args)
    assert res.exit_code == 0, res.output
    assert f"{N_GOOD} images -> 32-d features, 1 rejected; shards written 3, reused 0" in res.output
    res = CliRunner().invoke(app, args)
    assert "shards written 0, reused 3" in res.output
    res = CliRunner().invoke(app, ["extract", "--images", str(tmp_path / "nope"), "--clip", tiny_clip_spec, "--out", str(tmp_path / "g")])
    assert res.exit_code == 2 and len(_error_lines(res.output)) == 1 and "does not exist" in res.output
    manifests.write_manifest(tmp_path / "s", kind="splits", tables={}, config={}, files={"lists/a.txt": "x\n"})
    res = CliRunner().invoke(app, [*args[:5], "--out", str(tmp_path / "s")])
    assert res.exit_code == 2 and "holds a 'splits' manifest, not 'features'" in res.output
    assert manifests.verify(tmp_path / "s").ok  # untouched


# ----------------------------------------------------------------------------------------------- text


class _Boom(torch.nn.Module):
    def encode_text(self, tokens):
        raise AssertionError("the model was called")


def test_text_cache_hit_returns_identical_array_without_the_model(tiny_encoder, tmp_path):
    texts = ["a photo of a tench.", "a sketch of a dog.", "a photo of a tench."]
    plain = F.encode_texts(tiny_encoder, texts, batch_size=2)
    assert plain.dtype == np.float32 and plain.shape == (3, 32)
    np.testing.assert_allclose(np.linalg.norm(plain, axis=1), 1.0, atol=1e-5)
    np.testing.assert_array_equal(plain[0], plain[2])
    assert np.abs(plain[0] - plain[1]).max() > 1e-3
    first = F.encode_texts(tiny_encoder, texts, cache_dir=tmp_path)
    np.testing.assert_allclose(first, plain, atol=1e-6)
    assert len(list(tmp_path.glob("text-*.npy"))) == 1
    broken = dataclasses.replace(tiny_encoder, model=_Boom())
    hit = F.encode_texts(broken, texts, cache_dir=tmp_path)
    np.testing.assert_array_equal(hit, first)
    with pytest.raises(AssertionError, match="model was called"):  # other texts or order: a miss
        F.encode_texts(broken, texts[:2], cache_dir=tmp_path)
    with pytest.raises(AssertionError, match="model was called"):  # same texts, other model identity: a miss
        F.encode_texts(dataclasses.replace(broken, identity="other"), texts, cache_dir=tmp_path)


# ----------------------------------------------------------------------------------------------- loading features


def test_load_features_single_file_layout_and_validation(tmp_path):
    x = np.random.default_rng(0).normal(size=(4, 6)).astype(np.float32)
    d = tmp_path / "pre"
    d.mkdir()
    np.save(d / "features.npy", x)
    pd.DataFrame({"path": ["n01440764/a.JPEG", "b/n02084071_1.png", "c.png", "d/e.png"]}).to_parquet(d / "index.parquet")
    got, index = F.load_features(d)
    assert np.array_equal(got, x)
    assert index["wnid"].tolist() == ["n01440764", "n02084071", "", "d"]  # derived from paths when absent
    got2, _ = F.load_features(d / "features.npy")
    assert np.array_equal(got2, x)
    assert F.is_feature_dir(d) and not F.is_feature_dir(tmp_path)

    np.save(d / "features.npy", x[:3])
    with pytest.raises(IsoodError, match="3 feature rows but index.parquet has 4 rows"):
        F.load_features(d)
    np.save(d / "features.npy", x[0])
    with pytest.raises(IsoodError, match="2-D numeric array"):
        F.load_features(d)
    (d / "index.parquet").unlink()
    with pytest.raises(IsoodError, match="no index.parquet"):
        F.load_features(d)
    with pytest.raises(IsoodError, match="not a feature set"):
        F.load_features(tmp_path)


def test_load_features_detects_tampered_shards(tiny_encoder, tiny_images, tmp_path):
    F.extract_features(tiny_images, tiny_encoder, tmp_path / "f", shard_size=10, workers=0, progress=False)
    shard = tmp_path / "f" / "features-00001.npy"
    x = np.load(shard)
    np.save(shard, x[:-1])
    with pytest.raises(IsoodError, match="index lists 7 rows for shard 1 but it holds 6"):
        F.load_features(tmp_path / "f")
    np.save(shard, np.zeros((7, 16), np.float32))
    with pytest.raises(IsoodError, match=r"different feature dimensions \[16, 32\]"):
        F.load_features(tmp_path / "f")
    meta = json.loads((tmp_path / "f" / "manifest.json").read_text())
    assert meta["kind"] == "features" and meta["summary"]["shards"] == 2
