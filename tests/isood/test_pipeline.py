"""`isood build-splits` end to end (tiny open_clip model, images made by fixtures) and on precomputed features."""

import json

import numpy as np
import pandas as pd
import pytest
from typer.testing import CliRunner

import manifests
from isood import features as F
from isood.cli import app
from isood.grid import assign_levels
from isood.laid import LAID
from isood.pipeline import load_build_config, load_labels, read_edges
from isood.shift import shift_distances

LABELS = ["tench", "goldfish", "great white shark", "dog", "teddy bear", "cat", "car", "house", "tree", "boat"]
ID_CLASSES = {"n01440764": 6, "n02123045": 5}  # shares n01440764 (tench) with the test images
FAST = ["--triplets", "150", "--laid-steps", "40", "--levels", "4", "--na-threshold", "2", "--workers", "0"]


def _one_error_line(res):
    lines = [ln for ln in res.output.splitlines() if ln.strip()]
    assert res.exit_code == 2, res.output
    assert len(lines) == 1 and lines[0].startswith("error:"), res.output
    return lines[0]


@pytest.fixture(scope="module")
def built(tmp_path_factory, tiny_clip_spec, tiny_images, image_dataset_factory):
    """One build-splits run from images (ID and test extracted on the fly), shared by the tests below."""
    import torch

    torch.set_num_threads(1)  # tiny tensors: threads only add contention on the shared 2 cores
    base = tmp_path_factory.mktemp("build")
    id_root = image_dataset_factory(base / "id_images", classes=ID_CLASSES, seed=7, corrupt=None)
    labels = base / "labels.txt"
    labels.write_text("# LAID labels\n" + "\n".join(LABELS) + "\nn02084071\n")
    out = base / "splits"
    args = ["build-splits", "--id", str(id_root), "--test", str(tiny_images), "--clip", tiny_clip_spec,
            "--labels", str(labels), "--out", str(out), "--cache-dir", str(base / "cache"), *FAST]
    res = CliRunner().invoke(app, args)
    assert res.exit_code == 0, res.output
    return {"base": base, "out": out, "args": args, "output": res.output, "labels": labels, "id_root": id_root}


def _edges(m, axis):
    return read_edges(m.frame("edges"), axis)


def test_build_splits_from_images_end_to_end(built, tiny_images):
    out = built["out"]
    assert manifests.verify(out).ok
    m = manifests.read(out)
    assert m.kind == "splits"
    assert "16 test images vs 11 ID images" in built["output"]
    images = m.frame("images")
    assert len(images) == 16 and images["path"].is_unique
    assert not images["path"].str.contains("broken").any()
    assert images[["d_sem", "d_cov"]].notna().all().all()

    # levels are those of the stored edges (equal width over the clipped range, folded ends)
    for axis in ("sem", "cov"):
        edges = _edges(m, axis)
        assert len(edges) == 5 and np.allclose(np.diff(edges), np.diff(edges)[0])
        levels, _ = assign_levels(images[f"d_{axis}"].to_numpy(), 4, edges=edges)
        assert np.array_equal(levels, images[f"{axis}_level"].to_numpy())
        assert images[f"{axis}_level"].between(0, 3).all()
    assert (images["cell"] == "cov_" + images["cov_level"].astype(str) + "_sem_" + images["sem_level"].astype(str)).all()

    # the cell table counts the rows; every cell has a list file holding exactly its rows' paths
    cells = m.frame("cells")
    assert len(cells) == 16 and cells["n"].sum() == 16
    counts = images.groupby("cell").size()
    for row in cells.itertuples():
        assert row.n == counts.get(row.cell, 0) and row.na == (row.n < 2)
        listed = (out / "lists" / f"{row.cell}.txt").read_text().splitlines()
        assert sorted(listed) == sorted(images.loc[images["cell"] == row.cell, "path"])
    assert all((tiny_images / p).is_file() for p in images["path"])

    # recomputing the shift from the stored features and W gives the stored distances
    laid = LAID.load(out / "laid.safetensors")
    assert laid.W.shape == (32, 32) and laid.config["n_triplets"] == 150
    assert laid.config["text_hash"] and laid.config["clip_identity"].startswith("local-dir:sha256=")
    x_test, idx_test = F.load_features(out / "features-test")
    x_id, _ = F.load_features(out / "features-id")
    d_sem, d_cov = shift_distances(x_test, x_id, laid, backend="torch")
    assert idx_test["path"].tolist() == images["path"].tolist()
    np.testing.assert_allclose(images["d_sem"], d_sem, atol=1e-5)
    np.testing.assert_allclose(images["d_cov"], d_cov, atol=1e-5)

    dropped = m.frame("dropped")
    assert dropped["path"].tolist() == ["n01443537/n01443537_broken.JPEG"]
    assert dropped["set"][0] == "test" and dropped["reason"][0].startswith("unreadable: ")
    cfg = m.meta["command"]["config"]
    assert cfg["levels"] == 4 and cfg["na_threshold"] == 2 and cfg["test_root"] == str(tiny_images)
    assert {i["name"] for i in m.meta["inputs"]} == {"id_images", "test_images"}


def test_rerun_is_identical_and_uses_caches(built):
    before = manifests.read(built["out"]).meta
    res = CliRunner().invoke(app, built["args"])
    assert res.exit_code == 0, res.output
    after = manifests.read(built["out"]).meta
    assert after["content_sha256"] == before["content_sha256"]  # deterministic LAID, shift, levels, lists
    assert after["dataset_version"] == before["dataset_version"] == "1.0.0"
    assert "encoding LAID texts" not in res.output  # text features came from the cache
    assert manifests.verify(built["out"]).ok


def _precomputed(dest, feats_dir, scale=1.0, nan_rows=()):
    """A folder with features.npy + index.parquet made from an extraction directory."""
    x, index = F.load_features(feats_dir)
    x = x * scale
    x[list(nan_rows)] = np.nan
    dest.mkdir(parents=True, exist_ok=True)
    np.save(dest / "features.npy", x)
    index[["path", "wnid"]].to_parquet(dest / "index.parquet")
    return dest


def test_precomputed_features_and_laid_reproduce_the_image_run(built, tmp_path):
    out = built["out"]
    pre_id = _precomputed(tmp_path / "id", out / "features-id")
    res = CliRunner().invoke(app, ["build-splits", "--id", str(pre_id), "--test", str(out / "features-test"),
                                   "--laid", str(out / "laid.safetensors"), "--out", str(tmp_path / "s"), *FAST])
    assert res.exit_code == 0, res.output
    a, b = manifests.read(out), manifests.read(tmp_path / "s")
    assert manifests.verify(tmp_path / "s").ok
    for table in ("images", "cells", "edges"):
        pd.testing.assert_frame_equal(a.frame(table), b.frame(table))
    assert (out / "laid.safetensors").read_bytes() == (tmp_path / "s" / "laid.safetensors").read_bytes()
    assert not (tmp_path / "s" / "features-id").exists()  # nothing extracted
    # the corrupt test image is still reported: the features manifest's rejected table is carried over
    assert b.frame("dropped")["reason"].str.startswith("unreadable").sum() == 1


def test_nan_rows_dropped_and_unnormalised_features_normalised(built, tmp_path):
    out = built["out"]
    pre_id = _precomputed(tmp_path / "id", out / "features-id", nan_rows=[0])
    pre_test = _precomputed(tmp_path / "test", out / "features-test", scale=3.0, nan_rows=[2])
    res = CliRunner().invoke(app, ["build-splits", "--id", str(pre_id), "--test", str(pre_test),
                                   "--laid", str(out / "laid.safetensors"), "--out", str(tmp_path / "s"), *FAST])
    assert res.exit_code == 0, res.output
    assert "not L2-normalised" in res.output and "normalising" in res.output
    m = manifests.read(tmp_path / "s")
    dropped = m.frame("dropped")
    nan = dropped[dropped["reason"] == "non-finite or zero feature"]
    _, idx_id = F.load_features(pre_id)
    _, idx_test = F.load_features(pre_test)
    assert sorted(zip(nan["set"], nan["path"])) == sorted([("id", idx_id["path"][0]), ("test", idx_test["path"][2])])
    images = m.frame("images")
    assert len(images) == 15 and idx_test["path"][2] not in set(images["path"])
    # the scaled test features were normalised: same distances as a clean run against the same (reduced) ID set
    x_id, _ = F.load_features(out / "features-id")
    x_test, idx = F.load_features(out / "features-test")
    keep = np.arange(len(x_test)) != 2
    d_sem, d_cov = shift_distances(x_test[keep], x_id[1:], LAID.load(out / "laid.safetensors"), backend="torch")
    np.testing.assert_allclose(images["d_sem"], d_sem, atol=1e-5)
    np.testing.assert_allclose(images["d_cov"], d_cov, atol=1e-5)
    assert m.meta["summary"]["warnings"]


def test_filters_exclude_id_classes_and_class_filter(built, tmp_path):
    out = built["out"]
    common = ["--id", str(out / "features-id"), "--test", str(out / "features-test"), "--laid", str(out / "laid.safetensors"), *FAST]
    res = CliRunner().invoke(app, ["build-splits", *common, "--exclude-id-classes", "--out", str(tmp_path / "a")])
    assert res.exit_code == 0, res.output
    m = manifests.read(tmp_path / "a")
    assert "n01440764" not in set(m.frame("images")["wnid"]) and len(m.frame("images")) == 11
    d = m.frame("dropped")
    assert (d.loc[d["reason"] == "ID class", "wnid"] == "n01440764").sum() == 5

    flt = tmp_path / "filter"
    manifests.write_manifest(flt, kind="class-filter", config={}, tables={"classes": pd.DataFrame({
        "wnid": ["n02084071", "n04399382", "n01443537"], "name": ["dog", "teddy", "goldfish"],
        "decision": ["keep", "keep", "drop"], "rule": ["", "", "hyponym"]})})
    res = CliRunner().invoke(app, ["build-splits", *common, "--class-filter", str(flt), "--out", str(tmp_path / "b")])
    assert res.exit_code == 0, res.output
    m = manifests.read(tmp_path / "b")
    assert m.frame("images")["wnid"].value_counts().to_dict() == {"n02084071": 4, "n04399382": 3}
    assert "class_filter" in {i["name"] for i in m.meta["inputs"]}


def test_toml_config_with_command_line_override(built, tmp_path):
    out = built["out"]
    (tmp_path / "conf").mkdir()
    toml = tmp_path / "conf" / "build.toml"
    toml.write_text(
        f'id = "{out / "features-id"}"\ntest = "{out / "features-test"}"\nlaid = "{out / "laid.safetensors"}"\n'
        'out = "splits-out"\nlevels = 5\nna-threshold = 3\nclip_quantile = [0.0, 1.0]\n'
    )
    res = CliRunner().invoke(app, ["build-splits", "--config", str(toml), "--levels", "3"])
    assert res.exit_code == 0, res.output
    m = manifests.read(tmp_path / "conf" / "splits-out")  # relative to the TOML file
    cfg = m.meta["command"]["config"]
    assert cfg["levels"] == 3 and cfg["na_threshold"] == 3 and cfg["clip_quantile"] == [0.0, 1.0]
    images = m.frame("images")
    sem = _edges(m, "sem")
    assert len(sem) == 4 and sem[0] == pytest.approx(images["d_sem"].min()) and sem[-1] == pytest.approx(images["d_sem"].max())
    assert len(list((tmp_path / "conf" / "splits-out" / "lists").glob("*.txt"))) == 9

    toml.write_text('id = "x"\nnot_an_option = 1\n')
    line = _one_error_line(CliRunner().invoke(app, ["build-splits", "--config", str(toml)]))
    assert "unknown key 'not_an_option'" in line
    cfg = load_build_config(None, id="a", test="b", out="c", clip_quantile="0.05")
    assert cfg.clip_quantile == (0.05, 0.95) and cfg.levels == 8 and cfg.na_threshold == 10 and cfg.labels == "21k"


def test_bad_inputs_are_one_line_errors_and_leave_nothing_half_written(built, tmp_path):
    out = built["out"]
    fid, ftest, laid = out / "features-id", out / "features-test", out / "laid.safetensors"
    x, index = F.load_features(fid)
    small = tmp_path / "small"
    small.mkdir()
    np.save(small / "features.npy", x[:, :16])
    index.to_parquet(small / "index.parquet")
    empty = tmp_path / "empty"
    empty.mkdir()
    np.save(empty / "features.npy", np.zeros((0, 32), np.float32))
    index.iloc[:0].to_parquet(empty / "index.parquet")
    LAID(np.eye(16)).save(tmp_path / "w16.safetensors")

    target = tmp_path / "s"
    ok = CliRunner().invoke(app, ["build-splits", "--id", str(fid), "--test", str(ftest), "--laid", str(laid), "--out", str(target), *FAST])
    assert ok.exit_code == 0, ok.output
    good = manifests.read(target).meta["content_sha256"]

    cases = [
        (["--id", str(small), "--test", str(ftest), "--laid", str(laid)], "feature dimension mismatch: --id has 16, --test has 32"),
        (["--id", str(fid), "--test", str(ftest), "--laid", str(tmp_path / "w16.safetensors")], "--laid W is 16x16"),
        (["--id", str(empty), "--test", str(ftest), "--laid", str(laid)], "ID feature set is empty"),
        (["--id", str(fid), "--test", str(ftest), "--clip", "ViT-Nope-1:openai"], "unknown CLIP model 'ViT-Nope-1'"),
        (["--id", str(fid), "--test", str(ftest)], "--clip is required"),
        (["--id", str(tmp_path / "nope"), "--test", str(ftest), "--laid", str(laid)], "does not exist"),
        (["--id", str(fid), "--test", str(ftest), "--laid", str(laid), "--clip-quantile", "0.9,0.1"], "--clip-quantile"),
    ]
    for args, expected in cases:
        line = _one_error_line(CliRunner().invoke(app, ["build-splits", *args, "--out", str(target), *FAST]))
        assert expected in line, (args, line)
        assert manifests.verify(target).ok and manifests.read(target).meta["content_sha256"] == good
    line = _one_error_line(CliRunner().invoke(app, ["build-splits", "--id", str(fid), "--test", str(ftest), "--laid", str(laid), "--out", str(fid)]))
    assert "holds a 'features' manifest, not 'splits'" in line and manifests.verify(fid).ok
    fresh = tmp_path / "fresh"
    _one_error_line(CliRunner().invoke(app, ["build-splits", "--id", str(fid), "--test", str(ftest), "--clip", "ViT-B-32:openai", "--out", str(fresh)]))
    assert not (fresh / "manifest.json").exists()


def test_features_from_another_clip_are_refused(built, tmp_path, tiny_clip_factory):
    other = tiny_clip_factory(tmp_path / "other")
    # same architecture, other weights (seed 0 again but a changed file): identity differs
    (other / "open_clip_config.json").write_text(json.dumps({**json.loads((other / "open_clip_config.json").read_text()), "note": 1}))
    line = _one_error_line(CliRunner().invoke(app, [
        "build-splits", "--id", str(built["out"] / "features-id"), "--test", str(built["out"] / "features-test"),
        "--clip", f"local-dir:{other}", "--out", str(tmp_path / "s")]))
    assert "extracted with another CLIP" in line


def test_load_labels_sources(tmp_path):
    labels, where = load_labels("21k")
    assert len(labels) > 20_000 and "dog" in labels and where.startswith("21k (21841 wnids")
    f = tmp_path / "l.txt"
    f.write_text("n02084071\nn04399382  # teddy\nred panda\n\nred panda\n")
    assert load_labels(f)[0] == ["dog", "teddy", "red panda"]
    m = tmp_path / "flt"
    manifests.write_manifest(m, kind="class-filter", config={}, tables={"classes": pd.DataFrame({
        "wnid": ["n02084071", "n01440764", "n04399382"], "name": ["dog", "tench", ""], "decision": ["keep", "drop", "keep"]})})
    assert load_labels(m)[0] == ["dog", "teddy"]


def test_laid_file_bytes_are_identical_for_identical_content(tmp_path):
    from isood.laid import LAID

    rng = np.random.default_rng(0)
    laid = LAID(rng.standard_normal((4, 4)), config={"seed": 0, "margin": 1.0, "text_hash": "ab"},
                history={"total": np.arange(3.0), "sem": np.ones(3)})
    saved = {laid.save(tmp_path / f"w{i}.safetensors").read_bytes() for i in range(12)}
    assert len(saved) == 1  # safetensors alone orders a multi-key header differently from call to call
    back = LAID.load(tmp_path / "w0.safetensors")
    assert np.array_equal(back.W, laid.W) and back.config == laid.config
    assert np.array_equal(back.history["total"], laid.history["total"])