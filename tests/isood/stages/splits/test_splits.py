"""`isood build-splits` end to end (tiny open_clip model, images made by fixtures) and on precomputed features.
The pure steps have their own tests (test_splits_steps.py)."""

import json

import numpy as np
import pandas as pd
import pytest
from typer.testing import CliRunner

import manifests
from isood.cli import app
from isood.features.featurestore import load_features
from isood.science.grid import bin_with_edges
from isood.kinds import SPLITS
from isood.science.laid import LAID
from isood.features.shift import shift_distances
from isood.stages.wordnet.jobs import run_filter

LABELS = ["tench", "goldfish", "great white shark", "dog", "teddy bear", "cat", "car", "house", "tree", "boat"]
ID_CLASSES = {"n01440764": 6, "n02123045": 5}  # shares n01440764 (tench) with the test images
FAST = ["--triplets", "150", "--laid-steps", "40", "--levels", "4", "--na-threshold", "2", "--workers", "0"]


def _one_error_line(res):
    lines = [ln for ln in res.output.splitlines() if ln.strip()]
    assert res.exit_code == 2, res.output
    assert len(lines) == 1, res.output
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


def _read(path):
    return manifests.read(path, kind=SPLITS)


def test_build_splits_from_images_end_to_end(built, tiny_images):
    out = built["out"]
    assert manifests.verify(out).ok
    m = _read(out)
    assert m.meta["summary"]["test_images"] == 16 and m.meta["summary"]["id_images"] == 11
    images = m.images
    assert len(images) == 16 and images["path"].is_unique
    assert not images["path"].str.contains("broken").any()
    assert images[["d_sem", "d_cov"]].notna().all().all()

    # levels are those of the stored edges (equal width over the clipped range, folded ends)
    for axis in ("sem", "cov"):
        edges = m.axis_edges(axis)
        assert len(edges) == 5 and np.allclose(np.diff(edges), np.diff(edges)[0])
        levels = bin_with_edges(images[f"d_{axis}"].to_numpy(), edges)
        assert np.array_equal(levels, images[f"{axis}_level"].to_numpy())
        assert images[f"{axis}_level"].between(0, 3).all()
    assert (images["cell"] == "cov_" + images["cov_level"].astype(str) + "_sem_" + images["sem_level"].astype(str)).all()

    # the cell table counts the rows; every cell has a list file holding exactly its rows' paths
    cells = m.cells
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
    x_test, idx_test = load_features(out / "features-test")
    x_id, _ = load_features(out / "features-id")
    d_sem, d_cov = shift_distances(x_test, x_id, laid, backend="torch")
    assert idx_test["path"].tolist() == images["path"].tolist()
    np.testing.assert_allclose(images["d_sem"], d_sem, atol=1e-5)
    np.testing.assert_allclose(images["d_cov"], d_cov, atol=1e-5)

    dropped = m.frame("dropped")
    assert dropped["path"].tolist() == ["n01443537/n01443537_broken.JPEG"]
    assert dropped["set"][0] == "test" and dropped["reason"][0].startswith("unreadable: ")
    assert m.n_levels == 4 and m.na_threshold == 2 and m.test_root == str(tiny_images)
    assert m.id_root == str(built["id_root"]) and m.id_features == str(out / "features-id")
    assert m.laid_path == out / "laid.safetensors" and m.clip_identity == laid.config["clip_identity"]
    assert {i["name"] for i in m.meta["inputs"]} == {"id_images", "test_images"}


def test_rerun_is_identical_and_uses_caches(built):
    before = manifests.read(built["out"]).meta
    cache = {p: p.stat().st_mtime_ns for p in (built["base"] / "cache").rglob("*.npy")}
    assert len(cache) == 1  # the LAID texts, encoded once
    res = CliRunner().invoke(app, built["args"])
    assert res.exit_code == 0, res.output
    after = manifests.read(built["out"]).meta
    assert after["content_sha256"] == before["content_sha256"]  # deterministic LAID, shift, levels, lists
    assert after["dataset_version"] == before["dataset_version"] == "1.0.0"
    assert {p: p.stat().st_mtime_ns for p in (built["base"] / "cache").rglob("*.npy")} == cache  # cache hit
    assert manifests.verify(built["out"]).ok


def _precomputed(dest, feats_dir, scale=1.0, nan_rows=()):
    """A folder with features.npy + index.parquet made from an extraction directory."""
    x, index = load_features(feats_dir)
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
    m = _read(tmp_path / "s")
    dropped = m.frame("dropped")
    nan = dropped[dropped["reason"] == "non-finite or zero feature"]
    _, idx_id = load_features(pre_id)
    _, idx_test = load_features(pre_test)
    assert sorted(zip(nan["set"], nan["path"])) == sorted([("id", idx_id["path"][0]), ("test", idx_test["path"][2])])
    images = m.frame("images")
    assert len(images) == 15 and idx_test["path"][2] not in set(images["path"])
    # the scaled test features were normalised: same distances as a clean run against the same (reduced) ID set
    x_id, _ = load_features(out / "features-id")
    x_test, idx = load_features(out / "features-test")
    keep = np.arange(len(x_test)) != 2
    d_sem, d_cov = shift_distances(x_test[keep], x_id[1:], LAID.load(out / "laid.safetensors"), backend="torch")
    np.testing.assert_allclose(images["d_sem"], d_sem, atol=1e-5)
    np.testing.assert_allclose(images["d_cov"], d_cov, atol=1e-5)
    # warnings: the NaN ID row, the NaN test row, the unnormalised test rows
    assert len(m.meta["summary"]["warnings"]) == 3


def test_filters_exclude_id_classes_and_class_filter(built, tmp_path):
    out = built["out"]
    common = ["--id", str(out / "features-id"), "--test", str(out / "features-test"), "--laid", str(out / "laid.safetensors"), *FAST]
    res = CliRunner().invoke(app, ["build-splits", *common, "--exclude-id-classes", "--out", str(tmp_path / "a")])
    assert res.exit_code == 0, res.output
    m = _read(tmp_path / "a")
    assert "n01440764" not in set(m.frame("images")["wnid"]) and len(m.frame("images")) == 11
    d = m.frame("dropped")
    assert (d.loc[d["reason"] == "ID class", "wnid"] == "n01440764").sum() == 5

    flt = tmp_path / "filter"  # the real writer: dog and teddy kept, goldfish dropped (under fish.n.01)
    (tmp_path / "candidates.txt").write_text("n02084071\nn04399382\nn01443537\n")
    (tmp_path / "id.txt").write_text("n01440764\n")
    run_filter(str(tmp_path / "candidates.txt"), str(tmp_path / "id.txt"), out=flt, exclude=["fish.n.01"])
    assert manifests.read(flt, kind="class-filter").kept()[0] == ["n02084071", "n04399382"]
    res = CliRunner().invoke(app, ["build-splits", *common, "--class-filter", str(flt), "--out", str(tmp_path / "b")])
    assert res.exit_code == 0, res.output
    m = _read(tmp_path / "b")
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
    m = _read(tmp_path / "conf" / "splits-out")  # relative to the TOML file
    cfg = m.meta["command"]["config"]
    assert cfg["levels"] == 3 and cfg["na_threshold"] == 3 and cfg["clip_quantile"] == [0.0, 1.0]
    images = m.frame("images")
    sem = m.axis_edges("sem")
    assert len(sem) == 4 and sem[0] == pytest.approx(images["d_sem"].min()) and sem[-1] == pytest.approx(images["d_sem"].max())
    assert len(list((tmp_path / "conf" / "splits-out" / "lists").glob("*.txt"))) == 9

    toml.write_text('id = "x"\nnot_an_option = 1\n')
    line = _one_error_line(CliRunner().invoke(app, ["build-splits", "--config", str(toml)]))
    assert "not_an_option" in line


def test_bad_inputs_are_one_line_errors_and_leave_nothing_half_written(built, tmp_path):
    out = built["out"]
    fid, ftest, laid = out / "features-id", out / "features-test", out / "laid.safetensors"
    x, index = load_features(fid)
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
    assert "is also an input of this command" in line and manifests.verify(fid).ok
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
