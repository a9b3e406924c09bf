"""`isood build-splits --ann-recall`: approximate search tuned to a recall target, its numbers in the manifest
(checked against brute force), and the one-line refusals (exit 2)."""
import numpy as np
import pandas as pd
import pytest
from typer.testing import CliRunner

import manifests
from isood.cli import app
from isood.kinds import SPLITS
from isood.science.laid import LAID
from isood.science.simulate import random_orthogonal

FAST = ["--levels", "4", "--na-threshold", "2"]


def _unit(x):
    return (x / np.linalg.norm(x, axis=1, keepdims=True)).astype(np.float32)


def _features(dest, x):
    """A precomputed feature set (features.npy + index.parquet), one wnid-like folder per 100 rows."""
    dest.mkdir(parents=True)
    np.save(dest / "features.npy", x)
    paths = [f"n{i // 100:08d}/img_{i}.JPEG" for i in range(len(x))]
    pd.DataFrame({"path": paths, "wnid": [p.split("/")[0] for p in paths]}).to_parquet(dest / "index.parquet")
    return dest


def _brute_distance(q, r):
    """Exact nearest cosine distance per axis half (float64), by hand."""
    q, r = q.astype(np.float64), r.astype(np.float64)
    q, r = q / np.linalg.norm(q, axis=1, keepdims=True), r / np.linalg.norm(r, axis=1, keepdims=True)
    return 1.0 - (q @ r.T).max(axis=1)


@pytest.fixture(scope="module")
def inputs(tmp_path_factory):
    base = tmp_path_factory.mktemp("ann")
    rng = np.random.default_rng(0)
    dim = 32
    centres = rng.standard_normal((40, dim))
    x_id = _unit(centres[rng.integers(0, 30, 6000)] + 0.25 * rng.standard_normal((6000, dim)))
    x_test = _unit(centres[rng.integers(0, 40, 6000)] + 0.25 * rng.standard_normal((6000, dim)))
    laid = LAID(random_orthogonal(dim, seed=1))
    laid.save(base / "laid.safetensors")
    noise = _unit(rng.standard_normal((6000, dim)))
    return {"base": base, "id": _features(base / "id", x_id), "test": _features(base / "test", x_test),
            "noise_id": _features(base / "noise_id", noise[:4000]), "noise_test": _features(base / "noise_test", noise[4000:]),
            "laid": base / "laid.safetensors", "x_id": x_id, "x_test": x_test, "W": laid}


def _run(inputs, out, *extra, id_key="id", test_key="test"):
    return CliRunner().invoke(app, ["build-splits", "--id", str(inputs[id_key]), "--test", str(inputs[test_key]),
                                    "--laid", str(inputs["laid"]), "--out", str(out), *FAST, *extra])


def _level(d, edges):
    """Equal-width level of each distance, ends folded (written out)."""
    return np.clip(np.floor((d - edges[0]) / (edges[1] - edges[0])), 0, len(edges) - 2)


def _one_error_line(res):
    from isood.core.progress import is_progress_line

    lines = [ln for ln in res.output.splitlines() if ln.strip() and not is_progress_line(ln)]
    assert res.exit_code == 2, res.output
    assert len(lines) == 1, res.output
    return lines[0]


def test_ann_recall_reaches_its_target_and_records_it(inputs, tmp_path):
    res = _run(inputs, tmp_path / "s", "--ann-recall", "0.95")
    assert res.exit_code == 0, res.output
    m = manifests.read(tmp_path / "s", kind=SPLITS)
    ann = m.ann
    assert m.config["ann_recall"] == 0.95 and ann["target_recall"] == 0.95
    assert ann["held_out_images"] == 1500 and set(ann["axes"]) == {"sem", "cov"}
    images = m.images
    # brute force over every image: the search as a whole meets the target, and is approximate
    t_sem, t_cov = inputs["W"].transform(inputs["x_test"])
    i_sem, i_cov = inputs["W"].transform(inputs["x_id"])
    for axis, q, r in (("sem", t_sem, i_sem), ("cov", t_cov, i_cov)):
        exact = _brute_distance(q, r)
        got = images[f"d_{axis}"].to_numpy()
        assert np.all(got >= exact - 1e-5)  # approximate search can only miss the nearest row
        hit = np.abs(got - exact) < 1e-5
        assert 0.93 <= hit.mean() < 1.0
        a = ann["axes"][axis]
        assert a["recall_heldout"] >= 0.93 and a["recall_tune"] >= 0.95 and a["reprobe"] >= a["nprobe"] >= 1
        # recorded level agreement is that of the whole set measured by hand, within sampling error
        edges = m.axis_edges(axis)
        same = _level(got, edges) == _level(exact, edges)
        assert abs(a["level_agreement"] - np.mean(same)) < 0.02
        assert a["level_agreement"] >= 0.95
    assert 0.9 <= ann["cell_agreement"] <= min(ann["axes"]["sem"]["level_agreement"],
                                               ann["axes"]["cov"]["level_agreement"])


def test_exact_by_default_records_no_ann(inputs, tmp_path):
    res = _run(inputs, tmp_path / "s")
    assert res.exit_code == 0, res.output
    m = manifests.read(tmp_path / "s", kind=SPLITS)
    assert m.ann is None and m.config["ann_recall"] is None
    t_sem, _ = inputs["W"].transform(inputs["x_test"])
    i_sem, _ = inputs["W"].transform(inputs["x_id"])
    np.testing.assert_allclose(m.images["d_sem"], _brute_distance(t_sem, i_sem), atol=1e-5)


def test_an_unreachable_target_is_one_line_exit_2(inputs, tmp_path):
    line = _one_error_line(_run(inputs, tmp_path / "s", "--ann-recall", "0.99", id_key="noise_id",
                                test_key="noise_test"))
    assert "0.99" in line and "--ann-recall" in line
    assert not (tmp_path / "s" / manifests.MANIFEST_FILE).exists()


@pytest.mark.parametrize("extra, named", [(["--ann-recall", "1.5"], "--ann-recall"),
                                          (["--ann-recall", "0"], "--ann-recall"),
                                          (["--ann-recall", "0.99", "--backend", "torch"], "--backend torch")])
def test_bad_ann_options_are_one_line_exit_2(inputs, tmp_path, extra, named):
    assert named in _one_error_line(_run(inputs, tmp_path / "s", *extra))


def test_ann_levels_keeps_levels_and_records_the_held_out_bound(inputs, tmp_path):
    res = _run(inputs, tmp_path / "s", "--ann-levels", "0.999")
    assert res.exit_code == 0, res.output
    assert "--ann-levels 0.999" in res.output and "lower bound" in res.output
    m = manifests.read(tmp_path / "s", kind=SPLITS)
    ann = m.ann
    assert m.config["ann_levels"] == 0.999 and ann["target_levels"] == 0.999 and ann["target_recall"] is None
    t_sem, t_cov = inputs["W"].transform(inputs["x_test"])
    i_sem, i_cov = inputs["W"].transform(inputs["x_id"])
    for axis, q, r in (("sem", t_sem, i_sem), ("cov", t_cov, i_cov)):
        exact = _brute_distance(q, r)
        got = m.images[f"d_{axis}"].to_numpy()
        assert np.all(got >= exact - 1e-5)
        edges = m.axis_edges(axis)  # the build's edges; brute force at them, every image
        assert np.mean(_level(got, edges) == _level(exact, edges)) >= 0.999
        a = ann["axes"][axis]
        assert a["levels_heldout_lower"] < a["levels_heldout"] and a["uncovered"] == 0


@pytest.mark.parametrize("extra, named", [(["--ann-levels", "1.5"], "--ann-levels"),
                                          (["--ann-levels", "0.999", "--ann-recall", "0.99"], "not both"),
                                          (["--ann-levels", "0.999", "--backend", "faiss-flat"], "--backend")])
def test_bad_ann_levels_options_are_one_line_exit_2(inputs, tmp_path, extra, named):
    assert named in _one_error_line(_run(inputs, tmp_path / "s", *extra))
