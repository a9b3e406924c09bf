"""isood.stages.splits: the pure steps on arrays and frames (no files), the config merge, and the write step."""

import numpy as np
import pandas as pd
import pytest

import manifests
from isood.core.errors import BadInputError, SchemaError
from isood.science.grid import axis_edges
from isood.kinds import SplitsView
from isood.science.laid import LAID
from isood.features.shift import shift_distances
from isood.science.simulate import random_orthogonal
from isood.stages.splits import (SplitsOptions, FeatureSet, bin_shifts, cell_lists, clean_features, dropped_rows,
                                 filter_test_rows, load_splits_options, measure_shift, parse_quantile, rejected_rows,
                                 splits_config, write_splits)
from isood.features.featurestore.loading import FeatureReader
from isood.stages.splits.load import check_feature_sets


def _index(wnids):
    return pd.DataFrame({"path": [f"{w}/{w}_{i}.JPEG" for i, w in enumerate(wnids)], "wnid": list(wnids)})


def _unit(rng, n, d=8):
    x = rng.standard_normal((n, d))
    return (x / np.linalg.norm(x, axis=1, keepdims=True)).astype(np.float32)


# ---------------------------------------------------------------------------------------------- clean
def test_clean_features_drops_bad_rows_and_normalises_with_warnings():
    rng = np.random.default_rng(0)
    x = _unit(rng, 5) * 2.0
    x[1, 3] = np.nan
    x[3] = 0.0
    index = _index(["n01", "n02", "n03", "n04", "n05"])
    seen = []
    clean, kept, dropped = clean_features(x, index, "test", warn=seen.append)
    np.testing.assert_allclose(clean, x[[0, 2, 4]] / 2.0, atol=1e-6)
    assert kept["path"].tolist() == index["path"][[0, 2, 4]].tolist() and kept.index.tolist() == [0, 1, 2]
    assert dropped.to_dict("list") == {"set": ["test", "test"], "path": index["path"][[1, 3]].tolist(),
                                       "wnid": ["n02", "n04"], "reason": ["non-finite or zero feature"] * 2}
    assert len(seen) == 2 and all(m.startswith("--test features:") for m in seen)


def test_clean_features_of_clean_rows_drops_nothing():
    x = _unit(np.random.default_rng(1), 4)
    clean, kept, dropped = clean_features(x, _index("abcd"), "id")
    assert dropped is None and len(kept) == 4
    np.testing.assert_allclose(clean, x, atol=1e-7)


def test_rejected_and_dropped_rows():
    rejected = pd.DataFrame({"path": ["a/x.jpg"], "wnid": ["n1"], "error": ["cannot identify image"]})
    assert rejected_rows("id", rejected).to_dict("list") == {
        "set": ["id"], "path": ["a/x.jpg"], "wnid": ["n1"], "reason": ["unreadable: cannot identify image"]}
    assert rejected_rows("id", None) is None and rejected_rows("id", rejected.iloc[:0]) is None
    assert list(dropped_rows("test", _index(["n1"]), "ID class").columns) == ["set", "path", "wnid", "reason"]


# ---------------------------------------------------------------------------------------------- filter
WNIDS = ["n1", "n2", "n3", "n1", "", "n4"]


@pytest.mark.parametrize("kept, id_wnids, keep, reasons", [
    (None, None, [1, 1, 1, 1, 1, 1], []),
    (["n1", "n4"], None, [1, 0, 0, 1, 0, 1], ["class filter: not kept"] * 3),
    (None, ["n1", "", "n9"], [0, 1, 1, 0, 1, 1], ["ID class"] * 2),  # '' (no wnid) is never an ID class
    (["n1", "n2"], ["n2", "n3"], [1, 0, 0, 1, 0, 0],                # n3: class filter first, not counted twice
     ["class filter: not kept"] * 3 + ["ID class"]),
])
def test_filter_test_rows(kept, id_wnids, keep, reasons):
    index = _index(WNIDS)
    mask, dropped = filter_test_rows(index, kept_wnids=kept, id_wnids=id_wnids)
    assert mask.tolist() == [bool(k) for k in keep]
    if not reasons:
        assert dropped is None
    else:
        assert dropped["reason"].tolist() == reasons and set(dropped["set"]) == {"test"}
        assert sorted(dropped["path"]) == sorted(index["path"][~mask])


# ---------------------------------------------------------------------------------------------- measure, bin
def test_measure_shift_is_shift_distances_whatever_the_device_spelling():
    rng = np.random.default_rng(2)
    laid = LAID(random_orthogonal(8, seed=3))
    x_test, x_id = _unit(rng, 30), _unit(rng, 50)
    want = shift_distances(x_test, x_id, laid, backend="torch", device="cpu")
    for device in (None, "", "auto", "cpu"):
        got = measure_shift(x_test, x_id, laid, backend="torch", device=device)
        np.testing.assert_allclose(got[0], want[0], atol=1e-6)
        np.testing.assert_allclose(got[1], want[1], atol=1e-6)


def test_bin_shifts_builds_images_cells_and_edges():
    d_sem = np.array([0.0, 0.1, 0.2, 0.3, 0.4, np.nan])
    d_cov = np.array([0.4, 0.3, 0.2, 0.1, 0.0, 0.2])
    grid = bin_shifts(_index(["a", "b", "c", "d", "e", "f"]), d_sem, d_cov, n_levels=2, na_threshold=2, clip=(0, 1))
    im = grid.images
    assert list(im.columns) == ["path", "wnid", "d_sem", "d_cov", "sem_level", "cov_level", "cell"]
    assert im["d_sem"].dtype == np.float32 and im["sem_level"].dtype == np.int64
    assert im["sem_level"].tolist() == [0, 0, 1, 1, 1, -1]  # edges 0, 0.2, 0.4; NaN -> -1
    assert im["cov_level"].tolist() == [1, 1, 1, 0, 0, 1]
    assert im["cell"].tolist() == ["cov_1_sem_0", "cov_1_sem_0", "cov_1_sem_1", "cov_0_sem_1", "cov_0_sem_1",
                                   "cov_1_sem_-1"]
    np.testing.assert_allclose(axis_edges(grid.edges, "sem"), [0.0, 0.2, 0.4])
    np.testing.assert_allclose(axis_edges(grid.edges, "cov"), [0.0, 0.2, 0.4])
    cells = grid.cells.set_index("cell")
    assert cells["n"].to_dict() == {"cov_0_sem_0": 0, "cov_0_sem_1": 2, "cov_1_sem_0": 2, "cov_1_sem_1": 1}
    assert cells["na"].to_dict() == {"cov_0_sem_0": True, "cov_0_sem_1": False, "cov_1_sem_0": False,
                                     "cov_1_sem_1": True}
    with pytest.raises(BadInputError, match="3 images but 2/2"):
        bin_shifts(_index("abc"), d_sem[:2], d_cov[:2], n_levels=2, na_threshold=1)


def test_cell_lists_hold_each_cells_paths_in_order_and_empty_cells():
    grid = bin_shifts(_index(["a", "b", "c", "d"]), np.array([0.0, 1.0, 0.1, 0.9]), np.zeros(4), n_levels=2,
                      na_threshold=1, clip=(0, 1))
    lists = cell_lists(grid.images, grid.cells)
    assert sorted(lists) == [f"lists/{c}.txt" for c in sorted(grid.cells["cell"])]
    assert lists["lists/cov_0_sem_0.txt"] == "a/a_0.JPEG\nc/c_2.JPEG\n"
    assert lists["lists/cov_0_sem_1.txt"] == "b/b_1.JPEG\nd/d_3.JPEG\n"
    assert lists["lists/cov_1_sem_0.txt"] == "" and lists["lists/cov_1_sem_1.txt"] == ""


# ---------------------------------------------------------------------------------------------- feature sets
def _set(name, n=3, d=8, identity=None):
    return FeatureSet(name, FeatureReader.from_array(np.ones((n, d), np.float32), _index(["n1"] * n)), f"/data/{name}",
                      identity, None)


@pytest.mark.parametrize("sets, kwargs, match", [
    ({"id": _set("id", identity="A")}, dict(clip="c", clip_identity="B"), "extracted with another CLIP"),
    ({"id": _set("id", identity="A"), "test": _set("test", identity="B")}, {}, "different CLIP models"),
    ({"id": _set("id", d=16), "test": _set("test")}, {}, "--id has 16, --test has 8"),
    ({"test": _set("test")}, dict(laid_dim=16), "--laid W is 16x16"),
    ({"id": _set("id", n=0)}, {}, "ID feature set is empty"),
    ({"id": _set("id"), "test": _set("test")}, dict(clip="c", clip_dim=32), "--clip c gives 32"),
])
def test_check_feature_sets_refuses_sets_that_cannot_be_measured_together(sets, kwargs, match):
    with pytest.raises(BadInputError, match=match):
        check_feature_sets(sets, **kwargs)


def test_check_feature_sets_accepts_matching_sets():
    check_feature_sets({"id": _set("id", identity="A"), "test": _set("test")}, clip="c", clip_identity="A",
                       clip_dim=8, laid_dim=8)


# ---------------------------------------------------------------------------------------------- config
@pytest.mark.parametrize("value, expected", [
    (0.01, (0.01, 0.99)), ("0.05", (0.05, 0.95)), ("0.0, 1.0", (0.0, 1.0)), ([0.1, 0.8], (0.1, 0.8)),
])
def test_parse_quantile(value, expected):
    assert parse_quantile(value) == pytest.approx(expected)


@pytest.mark.parametrize("value", ["0.9,0.1", "a,b", [0.1, 0.2, 0.3], 0.5, "1.2"])
def test_parse_quantile_rejects_bad_values(value):
    with pytest.raises(BadInputError, match="--clip-quantile"):
        parse_quantile(value)


def test_load_build_config_merges_defaults_toml_and_command_line(tmp_path):
    cfg = load_splits_options(None, dict(id="a", test="b", out="c", clip_quantile="0.05"))
    assert cfg.clip_quantile == (0.05, 0.95) and cfg.levels == 8 and cfg.na_threshold == 10 and cfg.labels == "21k"
    toml = tmp_path / "conf" / "b.toml"
    toml.parent.mkdir()
    toml.write_text('[build-splits]\nid = "ids"\ntest = "/abs/test"\nout = "o"\nlevels = 5\nna-threshold = 3\n')
    cfg = load_splits_options(toml, dict(levels=4, seed=None))
    assert (cfg.id, cfg.test, cfg.out) == (str(toml.parent / "ids"), "/abs/test", str(toml.parent / "o"))
    assert (cfg.levels, cfg.na_threshold, cfg.seed) == (4, 3, 0)  # command line > TOML > default
    with pytest.raises(TypeError):
        load_splits_options(None, dict(id="a", test="b", out="c", not_an_option=1))


@pytest.mark.parametrize("overrides, match", [
    (dict(test="b", out="c"), "--id is required"),
    (dict(id="a", test="b", out="c", levels=0), "--levels must be an integer in \\[1, 32\\]"),
    (dict(id="a", test="b", out="c", na_threshold=-1), "--na-threshold"),
])
def test_load_build_config_rejects_bad_values(overrides, match):
    with pytest.raises(BadInputError, match=match):
        load_splits_options(None, overrides)


def test_splits_config_records_every_option_but_progress_and_the_view_fields(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    cfg = SplitsOptions(id="a", test="b", out="c")
    config = splits_config(cfg, clip_identity="X", id_root="ids", test_root="/test")
    assert "progress" not in config and "verify" not in config and config["levels"] == 8
    # paths against explicit roots, never the working directory
    assert config["test"] == str(tmp_path / "b") and config["id_root"] == str(tmp_path / "ids")
    assert (config["clip_identity"], config["test_root"]) == ("X", "/test")


# ---------------------------------------------------------------------------------------------- write
def _grid():
    rng = np.random.default_rng(4)
    return bin_shifts(_index([f"n{i % 3}" for i in range(40)]), rng.random(40), rng.random(40), n_levels=3,
                      na_threshold=5)


@pytest.mark.parametrize("card", [False, True])
def test_write_splits_writes_a_readable_view_with_lists(tmp_path, card):
    grid = _grid()
    config = splits_config(SplitsOptions(id="a", test="b", out=str(tmp_path), levels=3, na_threshold=5),
                           clip_identity="X", id_root="/ids", test_root="/test")
    view = write_splits(tmp_path / "s", images=grid.images, cells=grid.cells, edges=grid.edges, config=config,
                        files={"extra.txt": "x"}, argv=["test"], card=card)
    assert isinstance(view, SplitsView) and manifests.verify(tmp_path / "s").ok
    assert view.test_root == "/test" and view.clip_identity == "X" and view.n_levels == 3 and view.na_threshold == 5
    pd.testing.assert_frame_equal(view.images, grid.images)
    np.testing.assert_allclose(view.axis_edges("cov"), axis_edges(grid.edges, "cov"))
    for cell in grid.cells["cell"]:
        listed = (tmp_path / "s" / "lists" / f"{cell}.txt").read_text().splitlines()
        assert listed == grid.images.loc[grid.images["cell"] == cell, "path"].tolist()
    assert (tmp_path / "s" / "README.md").is_file() == card


def test_write_splits_refuses_tables_that_do_not_match_the_schema(tmp_path):
    grid = _grid()
    bad_edges = grid.edges.rename(columns={"lower": "value"})
    with pytest.raises(SchemaError, match="edges.*lower"):
        write_splits(tmp_path / "s", images=grid.images, cells=grid.cells, edges=bad_edges, config={}, card=False)
    assert not (tmp_path / "s" / "manifest.json").exists()
