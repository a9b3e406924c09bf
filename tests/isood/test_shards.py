"""Job arrays without Ray (isood.shards): `isood extract --num-shards N --shard-index i` parts and `isood merge`."""

from __future__ import annotations

import numpy as np
import pytest
from typer.testing import CliRunner

import manifests
from isood import features as F
from isood.cli import app
from isood.errors import IsoodError
from isood.shards import merge_parts, selected_units

KW = dict(batch_size=2, shard_size=3, workers=0, progress=False)  # tiny_images: 17 files -> 6 shards


@pytest.fixture(scope="module")
def single(tiny_images, tiny_encoder, tmp_path_factory):
    out = tmp_path_factory.mktemp("single")
    F.extract_features(tiny_images, tiny_encoder, out, **KW)
    return out


@pytest.fixture(scope="module")
def parts3(tiny_images, tiny_encoder, tmp_path_factory):
    root = tmp_path_factory.mktemp("parts3")
    results = [F.extract_features(tiny_images, tiny_encoder, root / f"p{i}", num_shards=3, shard_index=i, **KW)
               for i in range(3)]
    return [root / f"p{i}" for i in range(3)], results


def test_round_robin_units():
    assert selected_units(6, 3, 1) == [1, 4] and selected_units(2, 4, 3) == [] and selected_units(5, 1, 0) == list(range(5))


def test_each_task_writes_only_its_shards_as_a_part(parts3, tiny_encoder, tiny_images):
    dirs, results = parts3
    for i, (d, r) in enumerate(zip(dirs, results)):
        m = manifests.read(d)
        assert m.kind == "features-part" and manifests.verify(d).ok
        assert r.shards_written == [i, i + 3] and m.frame("shards")["shard"].tolist() == [i, i + 3]
        on_disk = sorted(p.name for p in d.glob("features-*.npy"))
        assert on_disk == [F.SHARD_NAME.format(i), F.SHARD_NAME.format(i + 3)]
        assert m.meta["command"]["config"]["part"] == {"index": i, "count": 3, "units": 6, "unit": "feature shard"}
    assert sum(r.n_images for r in results) == 16 and sum(r.n_rejected for r in results) == 1
    with pytest.raises(IsoodError, match="features-part"):
        F.load_features(dirs[0])  # a part is not a feature set until merged
    again = F.extract_features(tiny_images, tiny_encoder, dirs[1], num_shards=3, shard_index=1, **KW)
    assert again.shards_written == [] and again.shards_reused == [1, 4]


def test_cli_merge_gives_the_single_run_files(parts3, single, tmp_path):
    dirs, _ = parts3
    res = CliRunner().invoke(app, ["merge", str(dirs[2]), str(dirs[0]), str(dirs[1]), "--out", str(tmp_path / "m")])
    assert res.exit_code == 0, res.output
    assert "merged 3 parts" in res.output
    merged, one = manifests.read(tmp_path / "m").meta, manifests.read(single).meta
    assert manifests.verify(tmp_path / "m").ok and merged["kind"] == "features"
    assert merged["content_sha256"] == one["content_sha256"]
    assert {r["path"]: r["sha256"] for r in merged["files"]} == {r["path"]: r["sha256"] for r in one["files"]}
    assert merged["command"]["config"] == one["command"]["config"] and merged["summary"] == one["summary"]
    fm, im = F.load_features(tmp_path / "m")
    fs, is_ = F.load_features(single)
    assert np.array_equal(fm, fs) and im.equals(is_)


def test_more_tasks_than_shards(tiny_images, tiny_encoder, single, tmp_path):
    dirs = []
    for i in range(8):  # 6 shards over 8 tasks: tasks 6 and 7 get none and still write a (empty) part
        d = tmp_path / f"p{i}"
        F.extract_features(tiny_images, tiny_encoder, d, num_shards=8, shard_index=i, **KW)
        dirs.append(d)
    assert manifests.read(dirs[7]).meta["summary"]["shards"] == 0
    m = merge_parts(dirs, tmp_path / "m")
    assert m.meta["content_sha256"] == manifests.read(single).meta["content_sha256"]


def test_merge_refuses_what_is_not_one_complete_run(parts3, single, tiny_images, tiny_encoder, tmp_path):
    import shutil

    dirs, _ = parts3
    with pytest.raises(IsoodError, match=r"parts \[1\] of 3 are missing"):
        merge_parts([dirs[0], dirs[2]], tmp_path / "a")
    with pytest.raises(IsoodError, match="given twice"):
        merge_parts([dirs[0], dirs[1], dirs[1], dirs[2]], tmp_path / "a")
    with pytest.raises(IsoodError, match="not a part"):
        merge_parts([single, dirs[0]], tmp_path / "a")
    with pytest.raises(IsoodError, match="one of the parts"):
        merge_parts(dirs, dirs[0])
    other = tmp_path / "other1"  # task 1 of an array run with another batch size
    F.extract_features(tiny_images, tiny_encoder, other, num_shards=3, shard_index=1, **{**KW, "batch_size": 5})
    with pytest.raises(IsoodError, match="another run.*batch_size"):
        merge_parts([dirs[0], other, dirs[2]], tmp_path / "a")
    bad = tmp_path / "bad2"
    shutil.copytree(dirs[2], bad)
    (bad / F.SHARD_NAME.format(2)).write_bytes(b"not the shard")
    with pytest.raises(IsoodError, match="fails verification"):
        merge_parts([dirs[0], dirs[1], bad], tmp_path / "a")
    assert not (tmp_path / "a" / "manifest.json").exists()
    res = CliRunner().invoke(app, ["merge", str(dirs[0]), "--out", str(tmp_path / "a")])
    assert res.exit_code == 2 and "missing" in res.output and len([x for x in res.output.splitlines() if x.strip()]) == 1


def test_bad_shard_arguments(tiny_images, tiny_clip_spec, tmp_path):
    res = CliRunner().invoke(app, ["extract", "--images", str(tiny_images), "--clip", tiny_clip_spec, "--out",
                                   str(tmp_path / "o"), "--num-shards", "3", "--shard-index", "3"])
    assert res.exit_code == 2 and "--shard-index must be in 0..2" in res.output
    with pytest.raises(IsoodError, match="--num-shards must be >= 1"):
        F.extract_features(tiny_images, tiny_clip_spec, tmp_path / "o", num_shards=0, **KW)
