"""isood.features.featurestore.loading.FeatureReader: a feature set opened without reading its rows, read a range at a time
from memory-mapped .npy files (unmapped after each read); the same rows and checks as load_features."""
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from isood.core.errors import IsoodError
from isood.features.featurestore import SHARD_NAME, write_features_manifest, write_shard
from isood.features.featurestore.loading import FeatureReader, load_features, open_features


def _mapped_files():
    return {line.split()[-1] for line in Path("/proc/self/maps").read_text().splitlines() if line.count(" ") >= 5}


@pytest.fixture
def sharded(tmp_path):
    """Three shards of 4, 3 and 5 rows; feature (shard k, row r) is [k, r, 10 k + r]."""
    out = tmp_path / "f"
    out.mkdir()
    sizes, shard_rows = [4, 3, 5], {}
    for k, n in enumerate(sizes):
        rows = pd.DataFrame({"path": [f"s{k}/{i}.png" for i in range(n)], "wnid": "", "row": np.arange(n),
                             "error": ""})
        write_shard(out, k, f"k{k}", rows, np.zeros((n, 3), np.float32))
        shard_rows[k] = rows
    write_features_manifest(out, shard_rows, {"images": str(tmp_path), "source_kind": "folder", "clip": "c",
                                              "clip_identity": "c", "embed_dim": 3, "shard_size": 5}, [])
    index = pd.read_parquet(next((out / "data").glob("index*.parquet")))
    for k, n in enumerate(sizes):  # features that name their (shard, row)
        np.save(out / SHARD_NAME.format(k), np.array([[k, r, 10 * k + r] for r in range(n)], np.float32))
    return out, index


def test_reads_any_range_in_index_order_across_shards(sharded):
    out, index = sharded
    reader = open_features(out)
    whole, idx = load_features(out)
    want = index[["shard", "row"]].to_numpy()
    np.testing.assert_array_equal(whole[:, :2], want)  # row i of the set is index row (shard, row)
    assert len(reader) == 12 and reader.dim == 3 and idx["path"].tolist() == index["path"].tolist()
    for start, stop in [(0, 12), (2, 9), (3, 4), (11, 40), (5, 5)]:
        np.testing.assert_array_equal(reader.read(start, stop), whole[start:min(stop, 12)])
    blocks = list(reader.blocks(5))
    assert [s for s, _ in blocks] == [0, 5, 10] and [len(b) for _, b in blocks] == [5, 5, 2]
    np.testing.assert_array_equal(np.concatenate([b for _, b in blocks]), whole)


def test_an_index_in_any_order_reads_each_entrys_shard_row(sharded):
    out, index = sharded
    perm = np.random.default_rng(0).permutation(len(index))
    shard, row = index["shard"].to_numpy()[perm], index["row"].to_numpy()[perm]
    files = {k: out / SHARD_NAME.format(k) for k in range(3)}
    reader = FeatureReader(index.iloc[perm].reset_index(drop=True), 3, files, shard, row)
    arrays = {k: np.load(f) for k, f in files.items()}
    want = np.stack([arrays[s][r] for s, r in zip(shard, row)])  # one entry at a time
    np.testing.assert_array_equal(reader.read(), want)
    np.testing.assert_array_equal(reader.read(3, 8), want[3:8])


def test_files_are_mapped_only_while_read(sharded):
    out, _ = sharded
    reader = open_features(out)
    files = {str(out / SHARD_NAME.format(k)) for k in range(3)}
    assert not files & _mapped_files()  # opening reads headers only
    x = reader.read(0, 12)
    assert x.dtype == np.float32 and not files & _mapped_files()  # the pages read are not kept mapped


def test_a_flat_folder_and_its_dtype(tmp_path):
    d = tmp_path / "flat"
    d.mkdir()
    x = np.random.default_rng(0).standard_normal((7, 4))  # float64 on disk: read as float32, like load_features
    np.save(d / "features.npy", x)
    pd.DataFrame({"path": [f"n0000000{i}/a.JPEG" for i in range(7)]}).to_parquet(d / "index.parquet")
    reader = open_features(d / "features.npy")
    assert reader.read(2, 5).dtype == np.float32
    np.testing.assert_array_equal(reader.read(2, 5), x[2:5].astype(np.float32))
    assert reader.index["wnid"].tolist()[:2] == ["n00000000", "n00000001"]


def test_shard_checks_happen_at_open(sharded):
    out, _ = sharded
    np.save(out / SHARD_NAME.format(1), np.zeros((2, 3), np.float32))
    with pytest.raises(IsoodError, match="index lists 3 rows for shard 1 but it holds 2"):
        open_features(out)
    np.save(out / SHARD_NAME.format(1), np.zeros((3, 5), np.float32))
    with pytest.raises(IsoodError, match=r"different feature dimensions \[3, 5\]"):
        open_features(out)
    (out / SHARD_NAME.format(1)).unlink()
    with pytest.raises(IsoodError, match="features-00001.npy is missing"):
        open_features(out)


def test_from_array_reads_the_array():
    x = np.arange(12, dtype=np.float64).reshape(4, 3)
    reader = FeatureReader.from_array(x, pd.DataFrame({"path": list("abcd"), "wnid": ""}))
    np.testing.assert_array_equal(reader.read(1, 3), x[1:3])
    assert reader.read().dtype == np.float32 and len(reader) == 4
