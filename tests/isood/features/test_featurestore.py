"""isood.features.featurestore: the pure shard steps, sharded resumable extraction on an engine, loading feature sets."""

from __future__ import annotations

import json

import numpy as np
import pandas as pd
import pytest
import torch
from PIL import Image

import manifests
from isood.features import featurestore as FS
from isood.features.clip import load_clip
from isood.core.errors import IsoodError
from isood.core.engine import LocalEngine

TINY_IMAGE_CLASSES = {"n01440764": 5, "n01443537": 4, "n02084071": 4, "n04399382": 3}  # as tests/conftest.py makes them
TINY_CORRUPT = "n01443537/n01443537_broken.JPEG"
N_GOOD = sum(TINY_IMAGE_CLASSES.values())


@pytest.fixture(autouse=True)
def _facts_match_fixture(tiny_image_info):
    assert tiny_image_info == {"classes": TINY_IMAGE_CLASSES, "corrupt": TINY_CORRUPT}


def _direct(encoder, files):
    """Reference: each image encoded with the model, L2-normalised."""
    with torch.inference_mode():
        x = torch.stack([encoder.preprocess(Image.open(f).convert("RGB")) for f in files])
        f = encoder.model.encode_image(x).float()
    return torch.nn.functional.normalize(f, dim=-1).numpy()


# ----------------------------------------------------------------------------------------------- pure steps
def test_shard_geometry_and_key():
    assert FS.shard_count(17, 5) == 4 and FS.shard_count(15, 5) == 3 and FS.shard_count(1, 10_000) == 1
    assert [FS.shard_bounds(k, 5, 17) for k in range(4)] == [(0, 5), (5, 10), (10, 15), (15, 17)]
    key = FS.shard_key("m", ["a.png", "b.png"], [3, 4])
    assert key == FS.shard_key("m", ("a.png", "b.png"), (3, 4))
    assert len({key, FS.shard_key("n", ["a.png", "b.png"], [3, 4]), FS.shard_key("m", ["a.png", "b.png"], [3, 5]),
                FS.shard_key("m", ["a.png"], [3])}) == 4
    assert FS.shard_files([2, 0]) == ["features-00002.npy", "features-00000.npy", "features-00002.rows.parquet",
                                      "features-00000.rows.parquet"]


def test_batches_never_straddle_shards():
    files = [f"/r/{i}.png" for i in range(11)]
    batches = FS.image_batches(files, [f"{i}.png" for i in range(11)], [0, 2], shard_size=4, batch_size=3)
    assert [b["i"].tolist() for b in batches] == [[0, 1, 2], [3], [8, 9, 10]]
    assert batches[2]["path"] == ["/r/8.png", "/r/9.png", "/r/10.png"] and batches[1]["name"] == ["3.png"]


def _result(ids, ok, dim=2):
    ids = np.asarray(ids)
    feats = np.stack([np.full(dim, i, np.float32) if good else np.zeros(dim, np.float32) for i, good in zip(ids, ok)])
    return {"i": ids, "feature": feats, "ok": np.asarray(ok), "error": ["" if g else f"E{i}" for i, g in zip(ids, ok)]}


def test_assembler_orders_out_of_order_results_into_shards():
    table = pd.DataFrame({"path": [f"p{i}" for i in range(7)], "wnid": ["w"] * 7})
    asm = FS.ShardAssembler(table, [0, 1], shard_size=4)
    assert asm.add(_result([6, 4], [True, False])) == [] and asm.pending == [0, 1]
    done = asm.add(_result([2, 3, 5, 0], [True, True, True, False]))  # completes shard 1 (4..6), not shard 0
    assert [d.shard for d in done] == [1] and asm.pending == [0]
    rows = done[0].rows
    assert rows["path"].tolist() == ["p4", "p5", "p6"] and rows["row"].tolist() == [-1, 0, 1]
    assert rows["error"].tolist() == ["E4", "", ""]
    np.testing.assert_array_equal(done[0].features[:, 0], [5, 6])  # file order, readable ones only
    (d0,) = asm.add(_result([1], [True]))
    assert d0.shard == 0 and d0.rows["row"].tolist() == [-1, 0, 1, 2] and asm.pending == []
    np.testing.assert_array_equal(d0.features[:, 0], [1, 2, 3])
    with pytest.raises(IsoodError, match="shard 1"):
        asm.add(_result([4], [True]))  # shard 1 is finished: not expected any more


def test_index_tables_from_shard_rows():
    rows = {0: pd.DataFrame({"path": ["a", "b"], "wnid": ["x", ""], "row": [0, -1], "error": ["", "E"]}),
            1: pd.DataFrame({"path": ["c"], "wnid": ["y"], "row": [0], "error": [""]})}
    index, rejected = FS.index_tables(rows)
    assert index.to_dict("list") == {"path": ["a", "c"], "wnid": ["x", "y"], "shard": [0, 1], "row": [0, 0]}
    assert index["shard"].dtype == np.int32 and index["row"].dtype == np.int64
    assert rejected.to_dict("list") == {"path": ["b"], "wnid": [""], "error": ["E"]}


# ----------------------------------------------------------------------------------------------- extraction
def test_extract_normalised_equal_to_direct_encoding_and_rejects_corrupt(tiny_encoder, tiny_images, tmp_path):
    r = FS.extract_features(tiny_images, tiny_encoder, tmp_path / "f", batch_size=3, shard_size=5, decode_processes=0,
                            progress=False)
    assert (r.n_images, r.n_rejected) == (N_GOOD, 1)
    assert manifests.verify(tmp_path / "f").ok
    x, index = FS.load_features(tmp_path / "f")
    assert x.dtype == np.float32 and x.shape == (N_GOOD, 32)
    np.testing.assert_allclose(np.linalg.norm(x, axis=1), 1.0, atol=1e-5)
    np.testing.assert_allclose(x, _direct(tiny_encoder, [tiny_images / p for p in index["path"]]), atol=2e-5)
    assert index["path"].tolist() == sorted(index["path"])
    assert (index["wnid"] == index["path"].str.split("/").str[0]).all()
    assert index["wnid"].value_counts().to_dict() == TINY_IMAGE_CLASSES
    view = manifests.read(tmp_path / "f", kind="features")
    assert view.rejected["path"].tolist() == [TINY_CORRUPT] and view.embed_dim == 32
    assert view.rejected["error"][0].startswith("OSError") or "cannot identify" in view.rejected["error"][0]
    assert str(tiny_images) not in view.rejected["error"][0]  # errors name the relative path only
    assert view.clip_identity == tiny_encoder.identity and view.image_root == str(tiny_images)
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
    r = FS.extract_features(lst, tiny_encoder, tmp_path / "f", decode_processes=0, progress=False)
    assert (r.n_images, r.n_rejected) == (3, 1)
    x, index = FS.load_features(tmp_path / "f")
    # every path relative to one explicit root: the deepest folder holding the list and its entries
    assert dict(zip(index["path"], index["wnid"])) == {
        "flat/n01440764_7.JPEG": "n01440764", "flat/n02084071_2.png": "n02084071",
        "elsewhere/n04399382/x.png": "n04399382",
    }
    view = manifests.read(tmp_path / "f", kind="features")
    assert view.rejected["path"].tolist() == ["flat/n01443537_gone.JPEG"]
    assert view.rejected["wnid"].tolist() == ["n01443537"]
    assert "FileNotFoundError" in view.rejected["error"][0] and view.image_root == str(tmp_path)
    np.testing.assert_allclose(x, _direct(tiny_encoder, [tmp_path / p for p in index["path"]]), atol=2e-5)


def _data_hashes(root):
    """Every file's hash but the dataset card's (it quotes when the manifest was written), and the content hash."""
    meta = manifests.read(root).meta
    return {f["path"]: f["sha256"] for f in meta["files"] if f["path"] != "README.md"}, meta["content_sha256"]


def test_interrupted_extraction_resumes_to_identical_features_and_files(tiny_encoder, tiny_images, tmp_path):
    kw = dict(batch_size=3, shard_size=4, decode_processes=0, progress=False)
    full = FS.extract_features(tiny_images, tiny_encoder, tmp_path / "a", **kw)
    assert full.shards_written == [0, 1, 2, 3, 4]

    class Killed(Exception):
        pass

    def kill_after_shard_1(k):
        if k == 1:
            raise Killed

    with pytest.raises(Killed):
        FS.extract_features(tiny_images, tiny_encoder, tmp_path / "b", on_shard=kill_after_shard_1, **kw)
    b = tmp_path / "b"
    assert not b.exists()  # unfinished: the work so far waits in the staging folder beside it
    staged = tmp_path / ".~b.isood-new"
    assert sorted(p.name for p in staged.glob("features-*.npy")) == ["features-00000.npy", "features-00001.npy"]

    resumed = FS.extract_features(tiny_images, tiny_encoder, b, **{**kw, "decode_processes": 2})
    assert resumed.shards_reused == [0, 1] and resumed.shards_written == [2, 3, 4]
    assert _data_hashes(b) == _data_hashes(tmp_path / "a")
    xa, ia = FS.load_features(tmp_path / "a")
    xb, ib = FS.load_features(b)
    assert np.array_equal(xa, xb) and ia.equals(ib)
    assert manifests.verify(b).ok and manifests.read(b).dataset_version == "1.0.0" and not staged.exists()

    # a shard whose .npy never landed (killed mid-write) is redone; a finished rerun changes nothing
    (b / "features-00003.npy").unlink()
    (b / ".~features-00003.npy.abc.tmp").write_bytes(b"partial")
    again = FS.extract_features(tiny_images, tiny_encoder, b, **kw)
    assert again.shards_written == [3] and _data_hashes(b) == _data_hashes(tmp_path / "a")
    assert not (b / ".~features-00003.npy.abc.tmp").exists()
    assert manifests.verify(b).ok and manifests.read(b).dataset_version == "1.0.0"


class ReversedEngine(LocalEngine):
    """An engine that returns the batch results in reverse order (as a cluster may): the shards must not care."""

    def map(self, worker, args, batches, *, total, description, progress):
        return reversed(list(super().map(worker, args, batches, total=total, description=description,
                                         progress=progress)))


def test_results_in_any_order_give_the_same_files(tiny_encoder, tiny_images, tmp_path):
    kw = dict(batch_size=2, shard_size=5, decode_processes=0, progress=False)
    FS.extract_features(tiny_images, tiny_encoder, tmp_path / "a", **kw)
    r = FS.extract_features(tiny_images, tiny_encoder, tmp_path / "b", engine=ReversedEngine(), **kw)
    assert r.shards_written == [0, 1, 2, 3] and _data_hashes(tmp_path / "a") == _data_hashes(tmp_path / "b")


def test_rerun_with_other_model_recomputes_every_shard(tiny_encoder, tiny_images, tmp_path, tiny_clip_factory):
    FS.extract_features(tiny_images, tiny_encoder, tmp_path / "f", shard_size=6, decode_processes=0, progress=False)
    other = load_clip(f"local-dir:{tiny_clip_factory(tmp_path / 'm2', seed=5)}", device="cpu")
    r = FS.extract_features(tiny_images, other, tmp_path / "f", shard_size=6, decode_processes=0, progress=False)
    assert r.shards_written == [0, 1, 2] and r.shards_reused == []
    x, index = FS.load_features(tmp_path / "f")
    np.testing.assert_allclose(x, _direct(other, [tiny_images / p for p in index["path"]]), atol=2e-5)
    view = manifests.read(tmp_path / "f", kind="features")
    assert view.dataset_version == "1.1.0" and view.clip_identity == other.identity


def test_shard_key_names_the_decode_mode_and_the_content():
    import hashlib

    from isood.core.errors import BadInputError
    from isood.features.decoding import FAST_DECODE, REFERENCE_DECODE

    paths, hashes = ["a.png", "b.png"], ["1" * 64, "2" * 64]
    size_key = hashlib.sha256(b"m\0" + b"a.png\t3\nb.png\t4\n").hexdigest()  # the path + size key of version 1
    key = FS.shard_key("m", paths, hashes)
    assert key == FS.shard_key("m", paths, hashes, decode=REFERENCE_DECODE) != size_key
    assert key.startswith(FS.key_head("m") + ".") and not size_key.startswith(FS.key_head("m") + ".")
    fast = FS.shard_key("m", paths, hashes, decode=FAST_DECODE)
    assert fast != key and fast.startswith(FS.key_head("m", FAST_DECODE) + ".")
    assert FS.key_head("m", FAST_DECODE) != FS.key_head("m") != FS.key_head("n")
    assert FS.shard_key("m", paths, ["1" * 64, "3" * 64]) != key  # same paths (and sizes), other content
    assert FS.shard_key("m", paths, hashes, refused=["", "OutsideRootError: ..."]) != key
    with pytest.raises(BadInputError, match="turbo"):
        FS.shard_key("m", paths, hashes, decode="turbo")


def test_fast_and_reference_shards_never_mix(tiny_encoder, tiny_images, tmp_path):
    from isood.features.decoding import FAST_DECODE

    kw = dict(shard_size=6, decode_processes=0, progress=False)
    out = tmp_path / "f"
    r = FS.extract_features(tiny_images, tiny_encoder, out, decode=FAST_DECODE, **kw)
    assert r.shards_written == [0, 1, 2] and r.n_rejected == 1
    assert manifests.read(out, kind="features").decode == FAST_DECODE
    fast_x, _ = FS.load_features(out)
    assert FS.extract_features(tiny_images, tiny_encoder, out, decode=FAST_DECODE, **kw).shards_reused == [0, 1, 2]
    r = FS.extract_features(tiny_images, tiny_encoder, out, **kw)  # the default: reference
    assert r.shards_written == [0, 1, 2] and r.shards_reused == []
    assert manifests.read(out, kind="features").decode == "reference"
    x, index = FS.load_features(out)
    np.testing.assert_allclose(x, _direct(tiny_encoder, [tiny_images / p for p in index["path"]]), atol=2e-5)
    assert (x * fast_x).sum(1).min() >= 0.999
    r = FS.extract_features(tiny_images, tiny_encoder, out, decode=FAST_DECODE, **kw)
    assert r.shards_written == [0, 1, 2] and r.shards_reused == []


class NamedEngine(LocalEngine):
    """An engine other than 'local' (as Ray is): the driver hands the worker class and its arguments over."""

    def __init__(self):
        super().__init__(name="other")
        self.calls = []

    def map(self, worker, args, batches, *, total, description, progress):
        self.calls.append((worker, tuple(args)))
        return super().map(worker, args, batches, total=total, description=description, progress=progress)

    def as_config(self):
        return {"engine": "other", "workers": 1}


def test_other_engines_build_the_same_worker_with_the_decode_mode(tiny_clip_spec, tiny_images, tmp_path):
    from isood.features.clip import ClipEncodeWorker
    from isood.features.decoding import FAST_DECODE

    kw = dict(shard_size=6, decode_processes=0, progress=False, decode=FAST_DECODE)
    engine = NamedEngine()
    FS.extract_features(tiny_images, tiny_clip_spec, tmp_path / "o", engine=engine, device="cpu", **kw)
    FS.extract_features(tiny_images, tiny_clip_spec, tmp_path / "l", device="cpu", **kw)
    (worker, args), = engine.calls
    assert worker is ClipEncodeWorker and args[0] == tiny_clip_spec and args[3] == FAST_DECODE
    shards = {p: h for p, h in _data_hashes(tmp_path / "l")[0].items() if p.startswith("features-")}
    assert shards and shards == {p: h for p, h in _data_hashes(tmp_path / "o")[0].items() if p.startswith("features-")}
    assert manifests.read(tmp_path / "o", kind="features").decode == FAST_DECODE


def test_output_of_another_kind_and_bad_sizes_are_refused(tiny_encoder, tiny_images, tmp_path):
    manifests.write_manifest(tmp_path / "s", kind="class-filter-x", tables={}, config={})
    before = {p: p.read_bytes() for p in (tmp_path / "s").rglob("*") if p.is_file()}
    with pytest.raises(IsoodError, match=r"holds a 'class-filter-x' manifest, not 'features'"):
        FS.extract_features(tiny_images, tiny_encoder, tmp_path / "s", progress=False)
    assert {p: p.read_bytes() for p in (tmp_path / "s").rglob("*") if p.is_file()} == before  # untouched
    with pytest.raises(IsoodError, match="--batch-size must be an integer >= 1, got 0"):
        FS.extract_features(tiny_images, tiny_encoder, tmp_path / "o", batch_size=0, progress=False)


# ----------------------------------------------------------------------------------------------- loading
def test_load_features_single_file_layout_and_validation(tmp_path):
    x = np.random.default_rng(0).normal(size=(4, 6)).astype(np.float32)
    d = tmp_path / "pre"
    d.mkdir()
    np.save(d / "features.npy", x)
    pd.DataFrame({"path": ["n01440764/a.JPEG", "b/n02084071_1.png", "c.png", "d/e.png"]}).to_parquet(d / "index.parquet")
    got, index = FS.load_features(d)
    assert np.array_equal(got, x)
    assert index["wnid"].tolist() == ["n01440764", "n02084071", "", ""]  # derived from paths when absent
    got2, _ = FS.load_features(d / "features.npy")
    assert np.array_equal(got2, x)
    assert FS.is_feature_dir(d) and not FS.is_feature_dir(tmp_path)

    np.save(d / "features.npy", x[:3])
    with pytest.raises(IsoodError, match="3 feature rows but index.parquet has 4 rows"):
        FS.load_features(d)
    np.save(d / "features.npy", x[0])
    with pytest.raises(IsoodError, match="2-D numeric array"):
        FS.load_features(d)
    (d / "index.parquet").unlink()
    with pytest.raises(IsoodError, match="no index.parquet"):
        FS.load_features(d)
    with pytest.raises(IsoodError, match="not a feature set"):
        FS.load_features(tmp_path)


def test_load_features_detects_tampered_shards(tiny_encoder, tiny_images, tmp_path):
    FS.extract_features(tiny_images, tiny_encoder, tmp_path / "f", shard_size=10, decode_processes=0, progress=False)
    assert FS.is_feature_dir(tmp_path / "f")
    shard = tmp_path / "f" / "features-00001.npy"
    x = np.load(shard)
    np.save(shard, x[:-1])
    with pytest.raises(IsoodError, match="index lists 7 rows for shard 1 but it holds 6"):
        FS.load_features(tmp_path / "f")
    np.save(shard, np.zeros((7, 16), np.float32))
    with pytest.raises(IsoodError, match=r"different feature dimensions \[16, 32\]"):
        FS.load_features(tmp_path / "f")
    meta = json.loads((tmp_path / "f" / "manifest.json").read_text())
    assert meta["kind"] == "features" and meta["summary"]["shards"] == 2
