"""The `isood extract` stage and CLI, job-array parts (`--num-shards N --shard-index i`) and `isood merge`."""

from __future__ import annotations

import shutil

import numpy as np
import pandas as pd
import pytest
from PIL import Image
from typer.testing import CliRunner

import manifests
from isood.cli import app
from isood.cli.extract import merge_dirs
from isood.core.errors import IsoodError
from isood.features.featurestore import SHARD_NAME, load_features
from isood.stages.extract import ExtractOptions, run_extract
from isood.stages.extract.stage import merged_config, part_table, task_shards

N_GOOD = 16  # tiny_images: 16 readable images + 1 corrupt file
KW = dict(batch_size=2, shard_size=3, decode_processes=0, progress=False)  # tiny_images: 17 files -> 6 shards


def _lines(output):
    return [ln for ln in output.splitlines() if ln.strip()]


def _run(images, clip, out, **kw):
    return run_extract(ExtractOptions(images=images, clip=clip, out=out, **{**KW, **kw}))


# ----------------------------------------------------------------------------------------------- pure steps
def test_task_shards_round_robin():
    opts = lambda n, i: ExtractOptions(images="x", clip="c", out="o", shard_size=3, num_shards=n, shard_index=i)  # noqa: E731
    assert task_shards(17, opts(3, 1)) == [1, 4] and task_shards(5, opts(4, 3)) == []
    assert task_shards(17, opts(1, 0)) == list(range(6))


def test_part_table_counts_images_and_rejections():
    rows = {0: pd.DataFrame({"row": [0, -1, 1]}), 3: pd.DataFrame({"row": [-1]})}
    t = part_table(rows, {0: "k0", 3: "k3"}, [0, 3])
    assert t.to_dict("list") == {"shard": [0, 3], "key": ["k0", "k3"], "images": [2, 0], "rejected": [1, 1]}


def test_merged_config_drops_part_and_agrees_on_dimension():
    config = {"clip": "c", "embed_dim": None, "part": {"units": 6}}
    assert merged_config(config, [None, 32, 32]) == {"clip": "c", "embed_dim": 32}
    with pytest.raises(IsoodError, match=r"different dimensions \[16, 32\]"):
        merged_config(config, [16, 32])


# ----------------------------------------------------------------------------------------------- CLI
def test_extract_cli_prints_summary_and_resumes(tiny_clip_spec, tiny_images, tmp_path):
    args = ["extract", "--images", str(tiny_images), "--clip", tiny_clip_spec, "--out", str(tmp_path / "f"),
            "--shard-size", "8", "--batch-size", "4", "--workers", "0", "--device", "cpu"]
    res = CliRunner().invoke(app, args)
    assert res.exit_code == 0, res.output
    assert f"{N_GOOD} images -> 32-d features, 1 rejected; shards written 3, reused 0" in res.output
    res = CliRunner().invoke(app, args)
    assert "shards written 0, reused 3" in res.output
    res = CliRunner().invoke(app, ["extract", "--images", str(tmp_path / "nope"), "--clip", tiny_clip_spec,
                                   "--out", str(tmp_path / "g")])
    assert res.exit_code == 2 and len(_lines(res.output)) == 1 and "nope" in res.output
    manifests.write_manifest(tmp_path / "s", kind="splits-like", tables={}, config={}, files={"lists/a.txt": "x\n"})
    before = {p: p.read_bytes() for p in (tmp_path / "s").rglob("*") if p.is_file()}
    res = CliRunner().invoke(app, [*args[:5], "--out", str(tmp_path / "s")])
    assert res.exit_code == 2 and "'splits-like'" in res.output and len(_lines(res.output)) == 1
    assert {p: p.read_bytes() for p in (tmp_path / "s").rglob("*") if p.is_file()} == before  # untouched


def test_decode_fast_is_recorded_and_never_reuses_reference_shards(tiny_clip_spec, tiny_images, tmp_path):
    args = ["extract", "--images", str(tiny_images), "--clip", tiny_clip_spec, "--out", str(tmp_path / "f"),
            "--shard-size", "8", "--batch-size", "4", "--workers", "0", "--device", "cpu"]
    res = CliRunner().invoke(app, [*args, "--decode", "fast"])
    assert res.exit_code == 0, res.output
    assert f"{N_GOOD} images -> 32-d features, 1 rejected; shards written 3, reused 0" in res.output
    view = manifests.read(tmp_path / "f", kind="features")
    assert view.decode == "fast" and len(view.rejected) == 1
    assert "shards written 0, reused 3" in CliRunner().invoke(app, [*args, "--decode", "fast"]).output
    assert "shards written 3, reused 0" in CliRunner().invoke(app, args).output  # default: reference, recomputed
    assert manifests.read(tmp_path / "f", kind="features").decode == "reference"
    assert "shards written 0, reused 3" in CliRunner().invoke(app, args).output


def _shard_keys(out) -> dict[int, str]:
    from isood.features.featurestore import stored_key

    return {k: stored_key(out, k)[1] for k in range(3)}


def test_decode_gpu_is_recorded_never_mixed_and_rejects_what_the_reference_rejects(tiny_clip_spec, tiny_images,
                                                                                   tmp_path):
    base = ["extract", "--images", str(tiny_images), "--clip", tiny_clip_spec, "--shard-size", "8",
            "--batch-size", "4", "--workers", "2", "--device", "cpu"]
    outs = {}
    for mode in ("reference", "gpu", "fast"):
        outs[mode] = tmp_path / mode
        res = CliRunner().invoke(app, [*base, "--out", str(outs[mode]), "--decode", mode])
        assert res.exit_code == 0, res.output
        assert f"{N_GOOD} images -> 32-d features, 1 rejected; shards written 3, reused 0" in res.output
    views = {m: manifests.read(o, kind="features") for m, o in outs.items()}
    assert {m: v.decode for m, v in views.items()} == {"reference": "reference", "gpu": "gpu", "fast": "fast"}
    assert views["gpu"].rejected.equals(views["reference"].rejected)  # the same file, the same words
    ref, gpu = (dict(zip(load_features(outs[m])[1]["path"], load_features(outs[m])[0])) for m in ("reference", "gpu"))
    assert sorted(ref) == sorted(gpu)
    cos = np.array([float(ref[p] @ gpu[p]) for p in ref])
    assert cos.min() >= 0.999 and not np.array_equal(np.stack(list(ref.values())), np.stack(list(gpu.values())))
    keys = {m: _shard_keys(o) for m, o in outs.items()}
    assert all(keys["gpu"][k] != keys["reference"][k] != keys["fast"][k] != keys["gpu"][k] for k in range(3))
    gpu_out = ["--out", str(outs["gpu"])]
    assert "shards written 0, reused 3" in CliRunner().invoke(app, [*base, *gpu_out, "--decode", "gpu"]).output
    assert "shards written 3, reused 0" in CliRunner().invoke(app, [*base, *gpu_out]).output  # reference now
    assert _shard_keys(outs["gpu"]) == keys["reference"]
    assert "shards written 3, reused 0" in CliRunner().invoke(app, [*base, *gpu_out, "--decode", "fast"]).output
    assert manifests.read(outs["gpu"], kind="features").decode == "fast"


@pytest.mark.parametrize("extra, words", [
    (["--decode", "turbo"], "--decode 'turbo'"),
])
def test_bad_decode_options_are_one_line_before_any_work(extra, words, tiny_clip_spec, tiny_images, tmp_path):
    res = CliRunner().invoke(app, ["extract", "--images", str(tiny_images), "--clip", tiny_clip_spec, "--out",
                                   str(tmp_path / "o"), *extra])
    assert res.exit_code == 2 and len(_lines(res.output)) == 1 and words in res.output, res.output
    assert not (tmp_path / "o").exists()


@pytest.mark.parametrize("workers", [0, 2])
def test_an_interrupted_gpu_decode_run_resumes_to_the_same_bytes(workers, tiny_images, tiny_encoder, tmp_path):
    """`--decode gpu`, decoding in processes or not: a run stopped after its second shard, rerun, writes every
    file of an uninterrupted run (the resume reuses the two shards)."""
    kw = dict(decode="gpu", decode_processes=workers)
    whole = tmp_path / "whole"
    _run(tiny_images, tiny_encoder, whole, **kw)

    def stop(k):
        if k == 1:
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        run_extract(ExtractOptions(images=tiny_images, clip=tiny_encoder, out=tmp_path / "o", **{**KW, **kw}),
                    on_shard=stop)
    again = _run(tiny_images, tiny_encoder, tmp_path / "o", **kw)
    assert again.shards_reused == [0, 1] and again.shards_written == [2, 3, 4, 5]
    files = lambda d: {p.relative_to(d).as_posix(): p.read_bytes() for p in d.rglob("*")  # noqa: E731
                       if p.is_file() and not p.name.startswith((".~", "manifest.json", "README.md"))}
    assert files(tmp_path / "o") == files(whole)
    assert manifests.read(tmp_path / "o").meta["content_sha256"] == manifests.read(whole).meta["content_sha256"]


def test_offline_weights_error_through_the_cli_is_one_line(tmp_path, monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    images = tmp_path / "images"
    images.mkdir()
    args = ["extract", "--images", str(images), "--clip", "ViT-B-32:openai", "--out", str(tmp_path / "o")]
    res = CliRunner().invoke(app, args)
    assert res.exit_code == 2  # the image folder is empty: that is reported first
    (images / "n01440764").mkdir()
    Image.new("RGB", (8, 8)).save(images / "n01440764" / "a.png")
    res = CliRunner().invoke(app, args)
    assert res.exit_code == 2
    lines = _lines(res.output)
    assert len(lines) == 1 and lines[0].startswith("error:") and "local-dir:PATH" in lines[0]
    assert not (tmp_path / "o" / "manifest.json").exists()


def test_bad_shard_arguments(tiny_images, tiny_clip_spec, tmp_path):
    res = CliRunner().invoke(app, ["extract", "--images", str(tiny_images), "--clip", tiny_clip_spec, "--out",
                                   str(tmp_path / "o"), "--num-shards", "3", "--shard-index", "3"])
    assert res.exit_code == 2 and "--shard-index" in res.output and len(_lines(res.output)) == 1
    with pytest.raises(IsoodError, match="--num-shards"):
        _run(tiny_images, tiny_clip_spec, tmp_path / "o", num_shards=0)
    assert not (tmp_path / "o").exists()


# ----------------------------------------------------------------------------------------------- job arrays
@pytest.fixture(scope="module")
def single(tiny_images, tiny_encoder, tmp_path_factory):
    out = tmp_path_factory.mktemp("single")
    _run(tiny_images, tiny_encoder, out)
    return out


@pytest.fixture(scope="module")
def parts3(tiny_images, tiny_encoder, tmp_path_factory):
    root = tmp_path_factory.mktemp("parts3")
    results = [_run(tiny_images, tiny_encoder, root / f"p{i}", num_shards=3, shard_index=i) for i in range(3)]
    return [root / f"p{i}" for i in range(3)], results


def test_each_task_writes_only_its_shards_as_a_part(parts3, tiny_encoder, tiny_images):
    dirs, results = parts3
    for i, (d, r) in enumerate(zip(dirs, results)):
        m = manifests.read(d, kind="features-part")
        assert manifests.verify(d).ok
        assert r.shards_written == [i, i + 3] and m.frame("shards")["shard"].tolist() == [i, i + 3]
        assert sorted(p.name for p in d.glob("features-*.npy")) == [SHARD_NAME.format(i), SHARD_NAME.format(i + 3)]
        assert m.config["part"] == {"index": i, "count": 3, "units": 6, "unit": "feature shard"}
    assert sum(r.n_images for r in results) == N_GOOD and sum(r.n_rejected for r in results) == 1
    with pytest.raises(IsoodError, match="features-part"):
        load_features(dirs[0])  # a part is not a feature set until merged
    again = _run(tiny_images, tiny_encoder, dirs[1], num_shards=3, shard_index=1)
    assert again.shards_written == [] and again.shards_reused == [1, 4]


def test_cli_merge_gives_the_single_run_files(parts3, single, tmp_path):
    dirs, _ = parts3
    res = CliRunner().invoke(app, ["merge", str(dirs[2]), str(dirs[0]), str(dirs[1]), "--out", str(tmp_path / "m")])
    assert res.exit_code == 0, res.output
    merged, one = manifests.read(tmp_path / "m").meta, manifests.read(single).meta
    assert manifests.verify(tmp_path / "m").ok and merged["kind"] == "features"
    assert merged["content_sha256"] == one["content_sha256"]
    data = [{r["path"]: r["sha256"] for r in m["files"] if r["path"] != "README.md"} for m in (merged, one)]
    assert data[0] == data[1]  # the card is derived: it quotes each command line
    assert merged["command"]["config"] == one["command"]["config"] and merged["summary"] == one["summary"]
    fm, im = load_features(tmp_path / "m")
    fs, is_ = load_features(single)
    assert np.array_equal(fm, fs) and im.equals(is_)


def test_more_tasks_than_shards(tiny_images, tiny_encoder, single, tmp_path):
    dirs = []
    for i in range(8):  # 6 shards over 8 tasks: tasks 6 and 7 get none and still write an (empty) part
        d = tmp_path / f"p{i}"
        _run(tiny_images, tiny_encoder, d, num_shards=8, shard_index=i)
        dirs.append(d)
    assert manifests.read(dirs[7]).meta["summary"]["shards"] == 0
    m = merge_dirs(dirs, tmp_path / "m")
    assert m.meta["content_sha256"] == manifests.read(single).meta["content_sha256"]


def test_merge_refuses_parts_of_different_decode_modes(parts3, tiny_images, tiny_encoder, tmp_path):
    dirs, _ = parts3
    _run(tiny_images, tiny_encoder, tmp_path / "fast1", num_shards=3, shard_index=1, decode="fast")
    with pytest.raises(IsoodError, match="decode"):
        merge_dirs([dirs[0], tmp_path / "fast1", dirs[2]], tmp_path / "m")
    fast = [tmp_path / "fast1"]
    for i in (0, 2):
        _run(tiny_images, tiny_encoder, tmp_path / f"fast{i}", num_shards=3, shard_index=i, decode="fast")
        fast.append(tmp_path / f"fast{i}")
    merge_dirs(fast, tmp_path / "merged")
    assert manifests.read(tmp_path / "merged", kind="features").decode == "fast"


def test_merge_refuses_what_is_not_one_complete_run(parts3, single, tiny_images, tiny_encoder, tmp_path):
    dirs, _ = parts3
    with pytest.raises(IsoodError, match=r"\[1\] of 3"):
        merge_dirs([dirs[0], dirs[2]], tmp_path / "a")
    with pytest.raises(IsoodError, match="given twice"):
        merge_dirs([dirs[0], dirs[1], dirs[1], dirs[2]], tmp_path / "a")
    with pytest.raises(IsoodError, match="not a part"):
        merge_dirs([single, dirs[0]], tmp_path / "a")
    with pytest.raises(IsoodError, match="is also an input of this command"):
        merge_dirs(dirs, dirs[0])
    other = tmp_path / "other1"  # task 1 of an array run with another batch size
    _run(tiny_images, tiny_encoder, other, num_shards=3, shard_index=1, batch_size=5)
    with pytest.raises(IsoodError, match="batch_size"):
        merge_dirs([dirs[0], other, dirs[2]], tmp_path / "a")
    bad = tmp_path / "bad2"
    shutil.copytree(dirs[2], bad)
    (bad / SHARD_NAME.format(2)).write_bytes(b"not the shard")
    with pytest.raises(IsoodError, match="fails verification"):
        merge_dirs([dirs[0], dirs[1], bad], tmp_path / "a")
    assert not (tmp_path / "a" / "manifest.json").exists()
    res = CliRunner().invoke(app, ["merge", str(dirs[0]), "--out", str(tmp_path / "a")])
    assert res.exit_code == 2 and "missing" in res.output and len(_lines(res.output)) == 1
