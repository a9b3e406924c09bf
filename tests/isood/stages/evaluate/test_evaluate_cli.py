"""`isood evaluate` end to end on a tiny timm model (random weights saved as a local checkpoint, no download) and
tiny images made here, plus a tiny splits and Syn-IS manifest written by their stages' writers; bad input gives
exit status 2, one line on stderr naming the offending value, no traceback and never a manifest."""

import base64
import hashlib

import numpy as np
import pandas as pd
import pytest
import torch
from typer.testing import CliRunner

import manifests
from isood.stages.syn import write_syn_manifest
from isood.cli import app
from isood.evaluation import metrics as M
from isood.stages.evaluate.outputs import save_outputs
from isood.science.grid import cell_name, cell_table, edges_table
from isood.stages.splits import write_splits

pytestmark = pytest.mark.usefixtures("one_thread")

ID = ["n01440764", "n01443537", "n01484850"]
OOD = ["n02084071", "n04399382"]
SPEC = {(0, 0): 6, (0, 1): 6, (1, 0): 6, (1, 1): 2}  # (cov, sem) -> images; cov_1_sem_1 is N/A (< 5)


def _image(path, colour, rng, shift=0.0):
    from PIL import Image

    path.parent.mkdir(parents=True, exist_ok=True)
    a = np.clip(colour + shift + rng.normal(0, 25, (20, 20, 3)), 0, 255).astype(np.uint8)
    Image.fromarray(a).save(path)


def _splits_manifest(root, test_root, spec=SPEC, cells_override=None):
    """A splits manifest written by the splits stage's own writer (``write_splits``)."""
    rows = []
    for (c, s), n in spec.items():
        for i in range(n):
            w = ID[i % 3] if s == 0 else OOD[i % 2]
            rows.append({"path": f"{w}/{w}_c{c}s{s}_{i}.png", "wnid": w, "d_sem": 0.1 + s, "d_cov": 0.1 + c,
                         "sem_level": s, "cov_level": c, "cell": cell_name(c, s)})
    images = pd.DataFrame(rows)
    cells = cell_table(images["cov_level"], images["sem_level"], n_levels=2, na_threshold=5)
    if cells_override is not None:
        cells = cells_override
    edges = edges_table([0.0, 1.0, 2.0], [0.0, 1.0, 2.0])
    return write_splits(root, images=images, cells=cells, edges=edges, argv=["test"],
                        config={"test_root": str(test_root), "n_levels": 2, "na_threshold": 5})


def _syn_manifest(root, rng, colour):
    """A Syn-IS manifest (written by generate-syn's writer): 2 measured cells on covariate level 1."""
    images, prompts = [], []
    for s, n in ((0, 5), (1, 5)):
        for i in range(n):
            w = ID[i % 3] if s == 0 else OOD[i % 2]
            rel = f"images/sdxl-art/{w}_{s}_{i}.png"
            _image(root / rel, colour[w], rng, shift=-50.0)
            pid = f"p{s}{i}"
            common = {"prompt": f"art of {w}", "negative_prompt": "", "style": "sdxl-art", "wnid": w, "label": w,
                      "prompt_id": pid, "d_sem": 0.1 + s, "d_cov": 1.1, "sem_level": s, "cov_level": 1,
                      "cell": cell_name(1, s)}
            images.append({"path": rel, "image_index": 0, "seed": i,
                           "sha256": hashlib.sha256((root / rel).read_bytes()).hexdigest(), **common})
            prompts.append({**{k: v for k, v in common.items()}, "selected": True})
    rejected = pd.DataFrame({c: pd.Series(dtype=str) for c in
                             ("stage", "path", "prompt_id", "style", "wnid", "label", "prompt", "reason")})
    write_syn_manifest(root, images=pd.DataFrame(images), prompts=pd.DataFrame(prompts), rejected=rejected,
                       edges=edges_table([0.0, 1.0, 2.0], [0.0, 1.0, 2.0]), argv=["test"],
                       config={"n_levels": 2, "na_threshold": 5})


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    """ID train (6 per class) / ID test (3 per class) folders, test images of the splits, checkpoints."""
    from isood.dev.tiny_models import build_tiny_classifier

    root = tmp_path_factory.mktemp("evaluate")
    rng = np.random.default_rng(0)
    colour = {w: rng.integers(30, 225, 3) for w in ID + OOD}
    for w in ID:
        for i in range(6):
            _image(root / "train" / w / f"{w}_{i}.png", colour[w], rng)
        for i in range(3):
            _image(root / "val" / w / f"{w}_{i}.png", colour[w], rng)
    for (c, s), n in SPEC.items():
        for i in range(n):
            w = ID[i % 3] if s == 0 else OOD[i % 2]
            _image(root / "test" / w / f"{w}_c{c}s{s}_{i}.png", colour[w], rng, shift=60.0 * c)
    _splits_manifest(root / "splits", root / "test")
    _syn_manifest(root / "syn", rng, colour)
    for name, n_classes in (("test_resnet", 3), ("test_vit", 3), ("test_resnet5", 5)):
        build_tiny_classifier(root / f"{name}.safetensors", num_classes=n_classes, arch=name.rstrip("5"))
    return root


def _args(world, out, *extra, model="test_resnet", ckpt="test_resnet"):
    return ["evaluate", "--splits", str(world / "splits"), "--id-test", str(world / "val"), "--id-train",
            str(world / "train"), "--model", model, "--checkpoint", str(world / f"{ckpt}.safetensors"),
            "--na-threshold", "5", "--cache-dir", str(world / "cache"), "--plot-metrics", "auroc",
            "--out", str(out), *extra]


def _invoke(args):
    torch.set_num_threads(1)
    return CliRunner().invoke(app, args)


def _direct_msp(world, paths):
    """MSP of the checkpointed model on these images, computed here with timm's own preprocessing."""
    import timm
    import timm.data
    from PIL import Image

    model = timm.create_model("test_resnet", pretrained=False, num_classes=3,
                              checkpoint_path=str(world / "test_resnet.safetensors")).eval()
    tf = timm.data.create_transform(**timm.data.resolve_data_config(model=model))
    x = torch.stack([tf(Image.open(p).convert("RGB")) for p in paths])
    with torch.no_grad():
        return torch.softmax(model(x), dim=1).max(dim=1).values.numpy()


def test_evaluate_end_to_end_with_sanity_model(world, tmp_path):
    out = tmp_path / "ev"
    r = _invoke(_args(world, out, "--detectors", "msp,energy,knn:k=5,mds,ash", "--sanity-random-model",
                      "--syn", str(world / "syn")))
    assert r.exit_code == 0, r.output
    assert manifests.verify(out).ok
    m = manifests.read(out, kind="evaluation")
    both = m.cell_metrics
    syn = both[both["dataset"] == "syn-is"]
    # the Syn-IS cells table lists the whole 2 x 2 grid; only the two cells with images are measured
    assert sorted(syn.loc[~syn["na"], "cell"].unique()) == ["cov_1_sem_0", "cov_1_sem_1"]
    assert (syn.loc[syn["na"], "n"] == 0).all() and syn.loc[syn["na"], "auroc"].isna().all()
    per_cell = both[both["dataset"] == "splits"].reset_index(drop=True)
    assert sorted(per_cell["detector"].unique()) == ["ash", "energy", "knn", "mds", "msp"]
    assert len(per_cell) == 5 * 4 and len(syn) == 5 * 4
    na = per_cell[per_cell["cell"] == "cov_1_sem_1"]
    assert na["na"].all() and na["auroc"].isna().all() and (na["n"] == 2).all()
    assert not per_cell.loc[per_cell["cell"] != "cov_1_sem_1", "auroc"].isna().any()

    # per-image MSP equals the model's softmax maximum computed directly
    scores = m.frame("scores")
    id_rows = scores[scores["dataset"] == "id_test"]
    assert np.allclose(id_rows["msp"], _direct_msp(world, [world / "val" / p for p in id_rows["path"]]), atol=1e-5)
    cell_rows = scores[scores["cell"] == "cov_0_sem_1"]
    assert np.allclose(cell_rows["msp"], _direct_msp(world, [world / "test" / p for p in cell_rows["path"]]),
                       atol=1e-5)
    # the cell's metrics are the metrics of those scores
    got = per_cell.query("detector == 'msp' and cell == 'cov_0_sem_1'").iloc[0]
    assert got["auroc"] == pytest.approx(M.auroc(id_rows["msp"], cell_rows["msp"]))
    assert got["fpr95"] == pytest.approx(M.fpr_at_tpr(id_rows["msp"], cell_rows["msp"]))
    assert got["auroc_m"] == pytest.approx(M.auroc_model(id_rows["msp"], cell_rows["msp"],
                                                         id_correct=id_rows["correct"], ood_correct=cell_rows["correct"]))
    # labels: ID-class test images keep their class index (sorted wnids), OOD classes are -1
    labels = dict(zip(cell_rows["path"].str.split("/").str[0], cell_rows["label"]))
    assert set(labels.values()) == {-1}
    sem0 = scores[scores["cell"] == "cov_0_sem_0"]
    assert set(sem0["label"]) == {0, 1, 2}

    syn_scores = scores[scores["dataset"] == "syn-is"]
    assert np.allclose(syn_scores["msp"], _direct_msp(world, [world / "syn" / p for p in syn_scores["path"]]),
                       atol=1e-5)

    # sanity check: random-init model next to the trained one
    sanity = m.frame("sanity").query("dataset == 'splits'").set_index("detector")
    assert set(sanity.columns) >= {"auroc", "auroc_random", "auroc_m", "auroc_m_random"}
    rand = m.frame("cell_metrics_random")
    assert len(rand) == len(both)
    assert not np.allclose(rand["auroc"].dropna(), both["auroc"].dropna())
    assert sanity.loc["msp", "auroc"] == pytest.approx(per_cell.query("detector == 'msp' and not na")["auroc"].mean())

    html = (out / "report.html").read_text()
    # per grid dataset: 5 heatmaps, the detectors compared, 2 level curves, the mosaic of its images
    assert html.count("data:image/png;base64,") == 2 * (5 + 1 + 2 + 1) and "http" not in html
    for ds in ("splits", "syn-is"):
        assert f"Images per cell: {ds}" in html
        png = (out / "plots" / f"mosaic_{ds}.png").read_bytes()
        assert base64.b64encode(png).decode() in html
    assert (out / "summary.md").is_file()

    # a second evaluation with another detector does no forward pass: the output cache is reused (its `.~` stat
    # caches, bookkeeping of the images' content hashes, may be refreshed)
    def outputs_cache():
        return sorted((p.relative_to(world / "cache"), p.stat().st_mtime_ns) for p in (world / "cache").rglob("*")
                      if not p.name.startswith(".~"))

    cached = outputs_cache()
    r2 = _invoke(_args(world, tmp_path / "ev2", "--detectors", "maxlogit"))
    assert r2.exit_code == 0, r2.output
    assert outputs_cache() == cached


def test_precomputed_outputs_need_no_model(tmp_path):
    rng = np.random.default_rng(1)

    def outputs(name, wnids, shift):
        logits = rng.normal(0, 1, (len(wnids), 3)) + shift * np.eye(3)[[ID.index(w) if w in ID else 0 for w in wnids]]
        idx = pd.DataFrame({"path": [f"{w}/{name}_{i}.png" for i, w in enumerate(wnids)], "wnid": wnids})
        save_outputs(tmp_path / name, idx, logits=logits, features=rng.normal(size=(len(wnids), 4)))
        return idx, logits

    outputs("train", [ID[i % 3] for i in range(30)], 4.0)
    val_idx, val_logits = outputs("val", [ID[i % 3] for i in range(12)], 4.0)
    # test outputs keyed by the manifest's paths
    spec = {(0, 0): 6, (0, 1): 6}
    m = _splits_manifest(tmp_path / "splits", tmp_path / "unused", spec)
    images = m.images
    t_logits = rng.normal(0, 1, (len(images), 3)) + 4.0 * (images["sem_level"].to_numpy() == 0)[:, None] * np.eye(3)[0]
    save_outputs(tmp_path / "test", images[["path", "wnid"]], logits=t_logits, features=rng.normal(size=(12, 4)))
    out = tmp_path / "ev"
    r = _invoke(["evaluate", "--splits", str(tmp_path / "splits"), "--id-train", str(tmp_path / "train"),
                 "--id-test", str(tmp_path / "val"), "--test-root", str(tmp_path / "test"), "--detectors",
                 "msp,knn:k=3", "--na-threshold", "5", "--plot-metrics", "auroc", "--out", str(out)])
    assert r.exit_code == 0, r.output
    per_cell = manifests.read(out, kind="evaluation").cell_metrics.set_index(["detector", "cell"])
    msp = lambda z: np.exp(z - z.max(1, keepdims=True)).max(1) / np.exp(z - z.max(1, keepdims=True)).sum(1)  # noqa: E731
    sem1 = (images["sem_level"] == 1).to_numpy()
    assert per_cell.loc[("msp", "cov_0_sem_1"), "auroc"] == pytest.approx(M.auroc(msp(val_logits), msp(t_logits[sem1])))
    # a detector needing the fc layer cannot run on outputs without it
    r = _invoke(["evaluate", "--splits", str(tmp_path / "splits"), "--id-train", str(tmp_path / "train"),
                 "--id-test", str(tmp_path / "val"), "--test-root", str(tmp_path / "test"), "--detectors", "react",
                 "--out", str(tmp_path / "ev3")])
    line = _one_line_error(r)
    assert "'react'" in line and "fc" in line


def _one_line_error(result) -> str:
    """The single stderr line of a run that failed with exit status 2 (no traceback, nothing on stdout)."""
    assert result.exit_code == 2, result.output
    assert result.exception is None or isinstance(result.exception, SystemExit)
    from isood.core.progress import is_progress_line

    lines = [ln for ln in result.stderr.strip().splitlines() if ln.strip() and not is_progress_line(ln)]
    assert len(lines) == 1 and "Traceback" not in result.output, result.output
    return " ".join(lines[0].split())


@pytest.mark.parametrize("spec, names", [
    ("knn:k=0", ("knn", "k")), ("knn:k=abc", ("knn", "k", "abc")), ("react:percentile=150", ("react", "percentile")),
    ("msp:foo=1", ("msp", "foo")), ("nonexistent", ("nonexistent",)), ("msp,nonexistent", ("nonexistent",)),
])
def test_bad_detectors_exit_2_with_one_line(spec, names, tmp_path):
    """The error contract: a bad --detectors spec is refused before anything is read (the paths need not exist)."""
    r = _invoke(["evaluate", "--splits", str(tmp_path / "splits"), "--id-test", str(tmp_path / "val"), "--id-train",
                 str(tmp_path / "train"), "--out", str(tmp_path / "ev"), "--detectors", spec])
    line = _one_line_error(r)
    assert all(n in line for n in names), line
    assert not (tmp_path / "ev").exists()


def test_manifest_failing_verification_is_refused(world, tmp_path):
    import shutil

    bad = tmp_path / "splits"
    shutil.copytree(world / "splits", bad)
    images = pd.read_parquet(bad / "data" / "images.parquet")
    images.loc[0, "cov_level"] = 1
    images.to_parquet(bad / "data" / "images.parquet")
    args = _args(world, tmp_path / "ev", "--detectors", "msp")
    args[args.index("--splits") + 1] = str(bad)
    line = _one_line_error(_invoke(args))
    assert str(bad) in line and "data/images.parquet" in line
    assert not (tmp_path / "ev").exists()


def test_detector_needing_feature_maps_on_a_vit(world, tmp_path):
    r = _invoke(_args(world, tmp_path / "ev", "--detectors", "msp,rankfeat", model="test_vit", ckpt="test_vit"))
    line = _one_line_error(r)
    assert "'rankfeat'" in line and "feature_maps" in line and "test_vit" in line
    assert not (tmp_path / "ev" / "manifest.json").exists()


def test_class_count_mismatch(world, tmp_path):
    r = _invoke(_args(world, tmp_path / "ev", "--detectors", "msp", "--num-classes", "5", ckpt="test_resnet5"))
    line = _one_line_error(r)
    assert "test_resnet" in line and "5" in line and "3" in line and "--classes" in line


def test_empty_cell_is_an_error_and_nothing_is_written(world, tmp_path):
    cells = pd.DataFrame([{"cell": "cov_0_sem_0", "cov_level": 0, "sem_level": 0, "n": 6, "na": False},
                          {"cell": "cov_0_sem_1", "cov_level": 0, "sem_level": 1, "n": 6, "na": False},
                          {"cell": "cov_1_sem_0", "cov_level": 1, "sem_level": 0, "n": 6, "na": False},
                          {"cell": "cov_1_sem_1", "cov_level": 1, "sem_level": 1, "n": 2, "na": True},
                          {"cell": "cov_0_sem_2", "cov_level": 0, "sem_level": 2, "n": 12, "na": False}])
    _splits_manifest(tmp_path / "splits", world / "test", cells_override=cells)
    args = _args(world, tmp_path / "ev", "--detectors", "msp")
    args[args.index("--splits") + 1] = str(tmp_path / "splits")
    line = _one_line_error(_invoke(args))
    assert "'msp'" in line and "cov_0_sem_2" in line
    assert not (tmp_path / "ev" / "manifest.json").exists()


def test_missing_images(world, tmp_path):
    (tmp_path / "elsewhere").mkdir()
    args = _args(world, tmp_path / "ev", "--detectors", "msp", "--test-root", str(tmp_path / "elsewhere"))
    line = _one_line_error(_invoke(args))
    assert str(tmp_path / "elsewhere") in line and "--test-root" in line
    assert not (tmp_path / "ev").exists()


@pytest.mark.parametrize("spec, built, names", [
    ("knn:k=100", 0, ("knn", "k=100", "18")),  # 18 ID training images: known from the listing, no model built
    ("vim:dim=96", 1, ("vim", "dim=96", "96")),  # test_resnet's 96-d features: known from the weights, no pass
])
def test_data_dependent_parameters_are_refused_before_any_image_is_decoded(world, tmp_path, monkeypatch, capsys,
                                                                            spec, built, names):
    """knn:k above the number of ID training images is refused before any model is built, vim:dim at or above the
    feature size before any image is decoded or the model run (counted); the time to refusal is printed."""
    import time

    import isood.classifiers.image_list as capture
    import isood.stages.evaluate.model as model_step

    counts = {"models": 0, "forward": 0, "decoded": 0}
    build = model_step.adapter_from_option

    def counting_build(*a, **kw):
        counts["models"] += 1
        adapter = build(*a, **kw)
        adapter.model.register_forward_pre_hook(lambda *_: counts.__setitem__("forward", counts["forward"] + 1))
        return adapter

    get = capture.ImageList.__getitem__

    def counting_get(self, i):
        counts["decoded"] += 1
        return get(self, i)

    monkeypatch.setattr(model_step, "adapter_from_option", counting_build)
    monkeypatch.setattr(capture.ImageList, "__getitem__", counting_get)
    t0 = time.perf_counter()
    r = _invoke(_args(world, tmp_path / "ev", "--detectors", f"msp,{spec}"))
    seconds = time.perf_counter() - t0
    line = _one_line_error(r)
    assert all(n in line for n in names), line
    assert counts == {"models": built, "forward": 0, "decoded": 0}, counts
    assert not (tmp_path / "ev").exists()
    with capsys.disabled():
        print(f"\n{spec}: refused in {seconds:.2f} s ({counts})")


def test_data_dependent_defaults_are_recorded_and_shown_resolved(world, tmp_path):
    """vim without dim: the manifest's config, report.html, summary.md and `isood compare` show the dim the run
    used (the ViM paper's rule for test_resnet's 96-d features: half of them), never dim=None."""
    import timm

    from isood.stages.compare import compare_runs

    out = tmp_path / "ev"
    r = _invoke(_args(world, out, "--detectors", "msp,vim"))
    assert r.exit_code == 0, r.output
    expected = timm.create_model("test_resnet", pretrained=False).num_features // 2
    m = manifests.read(out, kind="evaluation")
    assert m.detector_params["vim"] == {"dim": expected}
    for name in ("report.html", "summary.md"):
        text = (out / name).read_text()
        assert f"vim (dim={expected})" in text and "dim=None" not in text, name
    board = compare_runs([out], tmp_path / "lb").board
    assert set(board.loc[board["detector"] == "vim", "params"]) == {f"dim={expected}"}
