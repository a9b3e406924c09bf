"""The integrity matrix ("nothing lost, nothing silently wrong"), the rows of `isood evaluate` and `isood demo`:
results that must not be silently wrong (one N/A rule, leak-free == cleaned), errors that must be one line and
exit 2 before the expensive work (leak rules, --model py, seeds, detector parameters) and the rough edges (plots,
checks after the forward pass, one unreadable image per run, library warnings, per-subset imports, slow
refusals). Each test names its guard; every input is made here with the
stages' own writers (a tiny timm ResNet with random weights saved as a local checkpoint, image folders, splits /
Syn-IS / audit manifests, precomputed-outputs folders).

"Before the forward pass" is read off the output cache: a pass over a dataset writes its outputs there, so a run
refused before any pass leaves ``--cache-dir`` empty.
"""

from __future__ import annotations

import hashlib
import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from PIL import Image

import manifests
from isood.evaluation import metrics as M

ID = ["n01440764", "n01443537", "n01484850"]  # tench, goldfish, great white shark (ImageNet-1K)
OOD = ["n02084071", "n04399382"]
FISH = "n02512053"  # a hypernym of tench: a leak by the default rules
CLEAN = ["n02826259", "n03050655", "n02666943"]  # bellows, clothes dryer, abattoir: kept by an audit
SEED_TOO_BIG = str(2**64)


def _image(path: Path, colour, rng, shift: float = 0.0) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    a = np.clip(colour + shift + rng.normal(0, 25, (20, 20, 3)), 0, 255).astype(np.uint8)
    Image.fromarray(a).save(path)


def _write_splits(root: Path, test_root: Path, rows: list[dict], *, n_levels: int, na_threshold: int):
    from isood.science.grid import cell_table, edges_table
    from isood.stages.splits import write_splits

    images = pd.DataFrame(rows)
    cells = cell_table(images["cov_level"], images["sem_level"], n_levels=n_levels, na_threshold=na_threshold)
    edges = edges_table(np.arange(n_levels + 1, dtype=float), np.arange(n_levels + 1, dtype=float))
    return write_splits(root, images=images, cells=cells, edges=edges, argv=["test"],
                        config={"test_root": str(test_root), "n_levels": n_levels, "na_threshold": na_threshold})


def _write_syn(root: Path, rng, colour, per_cell: int) -> None:
    """A Syn-IS manifest (generate-syn's writer, its threshold 10): ``per_cell`` images in two cells of the
    covariate level 1, so both are stored N/A."""
    from isood.stages.syn import write_syn_manifest
    from isood.science.grid import cell_name, edges_table

    images, prompts = [], []
    for s in (0, 1):
        for i in range(per_cell):
            w = ID[i % 3] if s == 0 else OOD[i % 2]
            rel = f"images/sdxl-art/{w}_{s}_{i}.png"
            _image(root / rel, colour[w], rng, shift=-50.0)
            common = {"prompt": f"art of {w}", "negative_prompt": "", "style": "sdxl-art", "wnid": w, "label": w,
                      "prompt_id": f"p{s}{i}", "d_sem": 0.1 + s, "d_cov": 1.1, "sem_level": s, "cov_level": 1,
                      "cell": cell_name(1, s)}
            images.append({"path": rel, "image_index": 0, "seed": i,
                           "sha256": hashlib.sha256((root / rel).read_bytes()).hexdigest(), **common})
            prompts.append({**common, "selected": True})
    rejected = pd.DataFrame({c: pd.Series(dtype=str) for c in
                             ("stage", "path", "prompt_id", "style", "wnid", "label", "prompt", "reason")})
    write_syn_manifest(root, images=pd.DataFrame(images), prompts=pd.DataFrame(prompts), rejected=rejected,
                       edges=edges_table([0.0, 1.0, 2.0], [0.0, 1.0, 2.0]), argv=["test"],
                       config={"n_levels": 2, "na_threshold": 10})


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    """ID train (4 per class) / ID test (2 per class) folders, a 2 x 2 splits manifest (4 images per cell, its
    threshold 2), a Syn-IS manifest (3 images in each of two cells, stored N/A at its threshold 10), a tiny
    timm ResNet checkpoint."""
    from isood.dev.tiny_models import build_tiny_classifier

    from isood.science.grid import cell_name

    root = tmp_path_factory.mktemp("integrity_evaluate")
    rng = np.random.default_rng(0)
    colour = {w: rng.integers(30, 225, 3) for w in ID + OOD}
    for w in ID:
        for i in range(4):
            _image(root / "train" / w / f"{w}_{i}.png", colour[w], rng)
        for i in range(2):
            _image(root / "val" / w / f"{w}_{i}.png", colour[w], rng)
    rows = []
    for c in range(2):
        for s in range(2):
            for i in range(4):
                w = (ID if s == 0 else OOD)[i % (3 if s == 0 else 2)]
                path = f"{w}/{w}_c{c}s{s}_{i}.png"
                _image(root / "test" / path, colour[w], rng, shift=50.0 * c)
                rows.append({"path": path, "wnid": w, "d_sem": 0.1 + s, "d_cov": 0.1 + c, "sem_level": s,
                             "cov_level": c, "cell": cell_name(c, s)})
    _write_splits(root / "splits", root / "test", rows, n_levels=2, na_threshold=2)
    _write_syn(root / "syn", rng, colour, per_cell=3)
    build_tiny_classifier(root / "test_resnet.safetensors", num_classes=3)
    return root


def _args(world: Path, out: Path, *extra, id_test=None, id_train=None, detectors="msp") -> list:
    return ["evaluate", "--splits", world / "splits", "--id-test", id_test or world / "val", "--id-train",
            id_train or world / "train", "--model", "test_resnet", "--checkpoint", world / "test_resnet.safetensors",
            "--na-threshold", "2", "--cache-dir", out.parent / "cache", "--plot-metrics", "auroc", "--detectors",
            detectors, "--out", out, *extra]


def _nothing_computed(out: Path) -> None:
    """No manifest, and no forward pass: the output cache next to ``out`` holds no outputs (the ``.~`` stat
    caches of the images' content hashes, taken before the pass, are bookkeeping, not outputs)."""
    assert not (out / "manifest.json").exists()
    cache = out.parent / "cache"
    outputs = [p for p in cache.rglob("*") if p.is_file() and not p.name.startswith(".~")] if cache.exists() else []
    assert not outputs, outputs


# ================================================================================= one N/A rule for every set
def test_syn_cells_follow_the_runs_threshold_not_the_stored_flag(world, cli, tmp_path):
    """Guard: cells.cell_grid decides N/A with isood.science.grid.is_na on the observed counts for every set. The Syn-IS
    manifest stores its two 3-image cells as N/A (its threshold 10): at --na-threshold 1 they are measured, and
    their AUROC is the AUROC of the scores the run wrote; at --na-threshold 4 both sets' 3- and 4-image cells
    follow the same rule."""
    syn = manifests.read(world / "syn", kind="syn-is")
    assert syn.cells.set_index("cell").loc[["cov_1_sem_0", "cov_1_sem_1"], "na"].all()  # stored N/A
    out = tmp_path / "ev"
    r = cli.invoke(_args(world, out, "--syn", world / "syn", "--na-threshold", "1"))
    assert r.exit_code == 0, r.output
    ev = manifests.read(out, kind="evaluation")
    pc = ev.cell_metrics.query("detector == 'msp'").set_index(["dataset", "cell"])
    scores = ev.frame("scores")
    id_msp = scores.query("dataset == 'id_test'")["msp"].to_numpy()
    for cell in ("cov_1_sem_0", "cov_1_sem_1"):
        assert not pc.loc[("syn-is", cell), "na"] and pc.loc[("syn-is", cell), "n"] == 3
        cell_msp = scores.query("dataset == 'syn-is' and cell == @cell")["msp"].to_numpy()
        assert pc.loc[("syn-is", cell), "auroc"] == pytest.approx(M.auroc(id_msp, cell_msp), abs=1e-12)
    # the empty cells of the Syn-IS grid stay N/A (0 images), the splits cells (4 images) are measured
    assert pc.loc[("syn-is", "cov_0_sem_0"), "na"] and pc.loc[("syn-is", "cov_0_sem_0"), "n"] == 0
    assert not pc.loc["splits", "na"].any()

    r = cli.invoke(_args(world, tmp_path / "ev4", "--syn", world / "syn", "--na-threshold", "4"))
    assert r.exit_code == 0, r.output
    pc4 = manifests.read(tmp_path / "ev4", kind="evaluation").cell_metrics.query("detector == 'msp'")
    assert (pc4["na"] == (pc4["n"] < 4)).all() and not pc4.query("dataset == 'splits'")["na"].any()


def test_evaluate_cells_ignores_a_stored_na_flag():
    """Guard: cells._table_rows (Python API): a cells table marking a 12-image cell N/A is measured at threshold
    10; na_cells still marks one (the caller's explicit choice)."""
    from isood.science.cells import evaluate_cells

    rng = np.random.default_rng(3)
    images = pd.DataFrame({"cov_level": [0] * 12 + [1] * 12, "sem_level": [0] * 24})
    table = pd.DataFrame({"cell": ["cov_0_sem_0", "cov_1_sem_0"], "cov_level": [0, 1], "sem_level": [0, 0],
                          "n": [12, 12], "na": [True, False]})
    idd, ood = rng.normal(1, 1, 30), rng.normal(0, 1, 24)
    df = evaluate_cells(idd, ood, images, cells=table, na_threshold=10).set_index("cell")
    assert not df["na"].any()
    assert df.loc["cov_0_sem_0", "auroc"] == pytest.approx(M.auroc(idd, ood[:12]), abs=1e-12)
    marked = evaluate_cells(idd, ood, images, cells=table, na_cells=["cov_1_sem_0"], na_threshold=10)
    assert marked.set_index("cell")["na"].to_dict() == {"cov_0_sem_0": False, "cov_1_sem_0": True}


# ================================================================================= leak-free == cleaned
def _outputs(root: Path, name: str, wnids, logits, rng) -> None:
    from isood.stages.evaluate.outputs import save_outputs

    idx = pd.DataFrame({"path": [f"{w}/{name}_{i}.png" for i, w in enumerate(wnids)], "wnid": wnids})
    save_outputs(root / name, idx, logits=logits, features=rng.normal(size=(len(wnids), 4)))


def _leak_world(root: Path, counts: dict, pools: dict) -> pd.DataFrame:
    """Precomputed outputs (ID train 30, ID test 15, the test images) and a splits manifest (threshold 10) with
    ``counts[(c, s)]`` images per cell drawn round robin from ``pools[s]``; leaking images look like tench."""
    from isood.science.grid import cell_name

    rng = np.random.default_rng(0)
    onehot = lambda w: np.eye(3)[ID.index(w)] if w in ID else np.eye(3)[0]  # noqa: E731
    train, val = [ID[i % 3] for i in range(30)], [ID[i % 3] for i in range(15)]
    _outputs(root, "train", train, rng.normal(0, 1, (30, 3)) + 5 * np.stack([onehot(w) for w in train]), rng)
    _outputs(root, "val", val, rng.normal(0, 1, (15, 3)) + 5 * np.stack([onehot(w) for w in val]), rng)
    rows = []
    for (c, s), n in counts.items():
        for i in range(n):
            w = pools[s][i % len(pools[s])]
            rows.append({"path": f"{w}/c{c}s{s}_{i}.png", "wnid": w, "d_sem": 0.1, "d_cov": 0.1, "sem_level": s,
                         "cov_level": c, "cell": cell_name(c, s)})
    images = pd.DataFrame(rows)
    _write_splits(root / "splits", root / "test", rows, n_levels=3, na_threshold=10)
    leak = images["wnid"].isin(ID + [FISH]).to_numpy()
    from isood.stages.evaluate.outputs import save_outputs

    save_outputs(root / "test", images[["path", "wnid"]], features=rng.normal(size=(len(images), 4)),
                 logits=rng.normal(0, 1, (len(images), 3)) + 5 * leak[:, None] * np.eye(3)[0])
    return images


LEAKY = [ID[0], FISH] + CLEAN  # 2 of 5 leak by the default rules


def test_leak_free_rows_equal_the_evaluation_of_the_cleaned_splits(cli, tmp_path):
    """Guard: one N/A rule (cells.cell_grid + assemble.leak_free_cells). At --na-threshold 5, below the
    manifest's 10, the sem-1 cells keep 9 of 16 images: `splits clean` stores them N/A (its threshold), which
    the cleaned evaluation used to honour while the leak-free rows measured them. Every metric of every cell,
    the counts and the N/A flags must agree (same precomputed scores: tolerance 1e-12)."""
    counts = {(c, s): n for c in (0, 1) for s, n in ((0, 30), (1, 16), (2, 12))}
    _leak_world(tmp_path, counts, {0: LEAKY, 1: LEAKY, 2: CLEAN})
    for args in (["wordnet", "audit", tmp_path / "splits", "--out", tmp_path / "audit"],
                 ["splits", "clean", tmp_path / "splits", "--audit", tmp_path / "audit", "--out", tmp_path / "clean"]):
        r = cli.invoke(args)
        assert r.exit_code == 0, r.output
    common = ["--id-train", tmp_path / "train", "--id-test", tmp_path / "val", "--test-root", tmp_path / "test",
              "--detectors", "msp,maxlogit,knn:k=5,mds", "--na-threshold", "5"]
    for splits, out, extra in ((tmp_path / "splits", tmp_path / "ev", ["--leak-audit", tmp_path / "audit"]),
                               (tmp_path / "clean", tmp_path / "evc", [])):
        r = cli.invoke(["evaluate", "--splits", splits, "--out", out, *common, *extra])
        assert r.exit_code == 0, r.output
    a = manifests.read(tmp_path / "ev", kind="evaluation").cell_metrics
    b = manifests.read(tmp_path / "evc", kind="evaluation").cell_metrics
    free = a[a["dataset"] == "splits-leak-free"].set_index(["detector", "cell"]).sort_index()
    cleaned = b[b["dataset"] == "splits"].set_index(["detector", "cell"]).sort_index()
    assert list(free.index) == list(cleaned.index) and len(free) == 4 * 9  # 4 detectors x the 3 x 3 grid
    for col in ("n", "na", "cov_level", "sem_level"):
        assert free[col].tolist() == cleaned[col].tolist(), col
    metrics = [m for m in M.METRICS if m in cleaned.columns]
    assert {"auroc", "fpr95", "autc", "auroc_m", "der95"} <= set(metrics)
    for m in metrics:
        np.testing.assert_allclose(free[m].to_numpy(float), cleaned[m].to_numpy(float), rtol=0, atol=1e-12,
                                   equal_nan=True, err_msg=m)
    # the case that disagreed: 9 leak-free images, measured at threshold 5 in both
    assert (free.xs("cov_0_sem_1", level="cell")["n"] == 9).all()
    assert not free.xs("cov_0_sem_1", level="cell")["na"].any()


# ================================================================================ leak rules flagging everything
def test_rules_flagging_every_image_are_refused_before_scoring(cli, tmp_path, monkeypatch):
    """Guard: inputs.leak_masks. A splits manifest holding only ID and hypernym classes: the default rules flag all
    its images; refused with one line before anything is scored (it raised KeyError 'cell' after the run)."""
    import isood.stages.evaluate.job as job

    _leak_world(tmp_path, {(0, 0): 12, (1, 1): 12}, {0: [ID[0], FISH], 1: [ID[1], FISH]})
    r = cli.invoke(["wordnet", "audit", tmp_path / "splits", "--out", tmp_path / "audit"])
    assert r.exit_code == 0, r.output

    def scored(*a, **k):
        raise AssertionError("scored before the refusal")

    monkeypatch.setattr(job, "score_precomputed", scored)
    out = tmp_path / "ev"
    line = cli.one_line_error(cli.invoke(["evaluate", "--splits", tmp_path / "splits", "--id-train",
                                          tmp_path / "train", "--id-test", tmp_path / "val", "--test-root",
                                          tmp_path / "test", "--detectors", "msp", "--leak-audit",
                                          tmp_path / "audit", "--out", out]))
    assert "--leak-rules" in line and "all 24 images" in line and "drop --leak-audit" in line, line
    assert not out.exists()


def test_every_leak_free_cell_na_evaluates(cli, tmp_path):
    """Guard: levels.measured_in_both (no cell measured in both: empty tables, not a KeyError). Leak-free cells
    all fall below the threshold: the run succeeds, the leak-free rows are all N/A and no ranking is claimed."""
    _leak_world(tmp_path, {(0, 0): 12, (1, 1): 12}, {0: LEAKY, 1: LEAKY})
    r = cli.invoke(["wordnet", "audit", tmp_path / "splits", "--out", tmp_path / "audit"])
    assert r.exit_code == 0, r.output
    out = tmp_path / "ev"
    r = cli.invoke(["evaluate", "--splits", tmp_path / "splits", "--id-train", tmp_path / "train", "--id-test",
                    tmp_path / "val", "--test-root", tmp_path / "test", "--detectors", "msp,maxlogit",
                    "--leak-audit", tmp_path / "audit", "--na-threshold", "10", "--out", out])
    assert r.exit_code == 0, r.output
    ev = manifests.read(out, kind="evaluation")
    pc = ev.cell_metrics
    free = pc[pc["dataset"] == "splits-leak-free"].set_index(["detector", "cell"])
    full = pc[pc["dataset"] == "splits"].set_index(["detector", "cell"])
    held = ["cov_0_sem_0", "cov_1_sem_1"]  # 12 images each, 6 of them leaks
    assert free["na"].all() and (free.loc[(slice(None), held), "n"] == 6).all()
    assert not full.loc[(slice(None), held), "na"].any()
    assert len(ev.frame("leak_ranking")) == 0 and ev.frame("leak_effect")["diff"].isna().all()


# ================================================================================ --model py: that is no model
def _odd_module(folder: Path) -> str:
    """A module whose ``make()`` builds a net with avgpool + fc whose forward returns a tuple, not logits."""
    (folder / "odd_models_tuple.py").write_text(
        "from torch import nn\n\n"
        "class Odd(nn.Module):\n"
        "    def __init__(self):\n"
        "        super().__init__()\n"
        "        self.conv, self.avgpool, self.fc = nn.Conv2d(3, 4, 3), nn.AdaptiveAvgPool2d(1), nn.Linear(4, 3)\n"
        "    def forward(self, x):\n"
        "        return self.fc(self.avgpool(self.conv(x)).flatten(1)), 'and more'\n\n"
        "def make():\n"
        "    return Odd()\n")
    return "py:odd_models_tuple:make"


@pytest.mark.parametrize("option, names", [
    pytest.param("py:os:getcwd", ["py:os:getcwd", "returned a str", "nn.Module"], id="callable_not_a_factory"),
    pytest.param("py:math:pi", ["py:math:pi", "is a float", "not a function"], id="not_callable"),
    pytest.param("py:torch.nn:Identity", ["py:torch.nn:Identity", "cannot find the layers of Identity"],
                 id="module_class_without_layers"),
    pytest.param("ODD", ["odd_models_tuple:make", "returns tuple as its logits"], id="module_without_logits"),
])
def test_model_function_that_is_no_classifier_is_one_line(option, names, world, cli, tmp_path, monkeypatch):
    """Guard: classifiers._from_function (callable / returned value / layers) and models.check_outputs (one
    image through the model before any pass)."""
    if option == "ODD":
        monkeypatch.syspath_prepend(str(tmp_path))
        option = _odd_module(tmp_path)
    args = _args(world, tmp_path / "ev")
    args[args.index("--model") + 1] = option
    del args[args.index("--checkpoint"):args.index("--checkpoint") + 2]
    line = cli.one_line_error(cli.invoke(args))
    assert all(n in line for n in names), line
    _nothing_computed(tmp_path / "ev")


# ================================================================================ one seed bound, every command
@pytest.mark.parametrize("command", [
    pytest.param(["evaluate", "--splits", "S", "--id-test", "V", "--id-train", "T", "--out", "OUT"], id="evaluate"),
    pytest.param(["demo", "--out", "OUT"], id="demo"),
    pytest.param(["build-splits", "--id", "I", "--test", "T", "--out", "OUT"], id="build-splits"),
    pytest.param(["generate-syn", "--labels", "L", "--laid", "W", "--id-features", "I", "--prompts-only", "--out",
                  "OUT"], id="generate-syn"),
])
@pytest.mark.parametrize("seed", [SEED_TOO_BIG, str(2**31), "-1"])
def test_seed_outside_the_one_bound_is_one_line(command, seed, cli, tmp_path):
    """Guard: isood.core.shared_options.seed_option, checked by every command's option check before anything is read."""
    args = [str(tmp_path / a) if a in ("S", "V", "T", "I", "L", "W") else a for a in command]
    out = tmp_path / "out"
    args[args.index("OUT")] = str(out)
    line = cli.one_line_error(cli.invoke([*args, "--seed", seed]))
    assert "--seed" in line and seed in line and "2147483647" in line, line
    assert not out.exists()


def test_largest_seed_reaches_torch_and_faiss():
    """The bound is what the code needs: the largest seed works where it is consumed (torch, faiss k-means,
    numpy's legacy generator for the demo's seed + 1)."""
    import faiss
    import torch

    from isood.core.defaults import SEED_MAX
    from isood.science.simulate import random_orthogonal

    torch.Generator().manual_seed(SEED_MAX)
    faiss.Kmeans(4, 2, seed=SEED_MAX)
    random_orthogonal(3, SEED_MAX + 1)
    with pytest.raises(OverflowError):
        faiss.Kmeans(4, 2, seed=SEED_MAX + 1)


# ============================================================================================= detector checks
@pytest.mark.parametrize("spec, names", [
    pytest.param("pytorch-ood:EnergyBased:t=abc", ["EnergyBased", "t must be a number", "'abc'"], id="t_abc"),
    pytest.param("pytorch-ood:KNN:k=1.5", ["KNN", "k must be an integer", "1.5"], id="k_float"),
    pytest.param("pytorch-ood:ViM:d=10000", ["ViM", "d=10000", "feature dimension"], id="vim_d_too_big"),
    pytest.param("pytorch-ood:KNN:k=100", ["KNN", "k=100", "12 ID training images"], id="pyood_knn_k_too_big"),
    pytest.param("knn:k=100", ["knn", "k=100", "12 ID training images"], id="knn_k_too_big"),
    pytest.param("vim:dim=500", ["vim", "dim=500", "feature dimension"], id="vim_dim_too_big"),
])
def test_detector_parameter_is_one_line_before_the_pass(spec, names, world, cli, tmp_path):
    """Guards: pytorch_ood._typed (types at parse time), Detector.preflight through scoring.preflight (counts
    and the feature dimension, known before the pass: ViM's d was silently halved to 48 by pytorch-ood, knn
    refused only after the ID training pass)."""
    pytest.importorskip("pytorch_ood")
    out = tmp_path / "ev"
    line = cli.one_line_error(cli.invoke(_args(world, out, detectors=f"msp,{spec}")))
    assert all(n in line for n in names), line
    _nothing_computed(out)


# ======================================================================================= a small set of plots
def test_default_plots_are_auroc_and_fpr95_and_all_draws_every_metric(world, cli, tmp_path):
    """Guard: options.plot_metrics / plots.plot_metric_names. By default the heatmaps and level curves of AUROC
    and FPR@95 only (the report embeds exactly those and says where the rest is); --plot-metrics all draws every
    computed metric."""
    from isood.report.plots import VECTOR_FORMATS, compare_name, heatmap_name, level_curve_name

    args = _args(world, tmp_path / "ev", detectors="msp,energy")
    del args[args.index("--plot-metrics"):args.index("--plot-metrics") + 2]
    r = cli.invoke(args)
    assert r.exit_code == 0, r.output
    ev = manifests.read(tmp_path / "ev", kind="evaluation")
    plots = sorted(p.name for p in (tmp_path / "ev" / "plots").iterdir())
    paper = [n for m in ("auroc", "fpr95") for n in [compare_name("splits", m)]
             + [level_curve_name("splits", ax, m) for ax in ("sem", "cov")]
             + [heatmap_name("splits", d, m) for d in ("msp", "energy")]]  # + SVG and PDF beside each PNG
    from isood.report.mosaic import mosaic_name

    want = sorted([Path(n).name for n in paper] + [Path(n).name[:-3] + fmt for n in paper for fmt in VECTOR_FORMATS]
                  + [Path(mosaic_name("splits")).name])  # and the grid's mosaic of sampled images
    assert plots == want
    html = (tmp_path / "ev" / "report.html").read_text()
    assert html.count("data:image/png;base64,") == len([p for p in want if p.endswith(".png")])
    assert "--plot-metrics all" in html
    computed = [m for m in M.METRICS if m in ev.cell_metrics.columns and ev.cell_metrics[m].notna().any()]
    assert len(computed) > 8  # every metric is still in the tables

    args = _args(world, tmp_path / "all", "--plot-metrics", "all", detectors="msp,energy")
    del args[args.index("--plot-metrics"):args.index("--plot-metrics") + 2]
    r = cli.invoke(args)
    assert r.exit_code == 0, r.output
    # per metric: 2 heatmaps, its comparison and 2 level curves, each also as SVG and PDF
    assert len(list((tmp_path / "all" / "plots").iterdir())) == len(computed) * 5 * (1 + len(VECTOR_FORMATS)) + 1


# ======================================================================================= every unreadable image
def test_every_unreadable_image_is_named_in_one_run(world, cli, tmp_path):
    """Guard: capture.ImageList.collate / _forward_passes / scan_unreadable, scoring.run_detectors. Two broken
    ID training images and two broken ID test images: one run, one line with the count, the first three and
    the file listing all four (it named one per run)."""
    import shutil

    train = Path(shutil.copytree(world / "train", tmp_path / "train"))
    val = Path(shutil.copytree(world / "val", tmp_path / "val"))
    bad = [train / ID[0] / f"{ID[0]}_1.png", train / ID[2] / f"{ID[2]}_3.png", val / ID[1] / f"{ID[1]}_0.png"]
    for p in bad:
        p.write_bytes(p.read_bytes()[:60])
    (val / ID[2] / "empty.png").write_bytes(b"")
    bad.append(val / ID[2] / "empty.png")
    out = tmp_path / "ev"
    line = cli.one_line_error(cli.invoke(_args(world, out, id_train=train, id_test=val)))
    assert "cannot read images: 4 are unreadable" in line, line
    listed = Path(line.split("all 4 listed in ")[1].split(")")[0])
    rows = [ln.split("\t") for ln in listed.read_text().splitlines()]
    assert sorted(r[0] for r in rows) == sorted(map(str, bad))
    assert dict(rows)[str(bad[-1])] == "UnidentifiedImageError" and dict(rows)[str(bad[0])] == "OSError"
    assert not (out / "manifest.json").exists()


# ======================================================================================== library messages
def test_pytorch_ood_messages_are_one_warning_line_each(world, tmp_path):
    """Guard: pytorch_ood._library_messages and cli._app.warning_line. A pytorch-ood detector that logs a device
    note (noise) and warns twice with the same two-line message: on a real stderr (a fresh interpreter: pytest
    would capture both logging and warnings) one 'warning:' line prefixed by its name and nothing else
    (pytorch-ood's log line reached the terminal as it is, the warning with its file and source line)."""
    pytest.importorskip("pytorch_ood")
    script = tmp_path / "noisy_run.py"
    script.write_text(
        "import logging, sys, warnings\n"
        "import pytorch_ood.detector as library\n"
        "from pytorch_ood.detector import MaxLogit\n\n"
        "class Noisy(MaxLogit):\n"
        "    def predict_logits(self, logits):\n"
        "        logging.getLogger('pytorch_ood.detector.noisy').warning(\"No device set. Will use 'cpu'.\")\n"
        "        warnings.warn('scores are\\n   nearly constant', UserWarning)\n"
        "        return super().predict_logits(logits)\n\n"
        "library.Noisy = Noisy\n"
        "from isood.cli import main\n"
        "sys.argv = ['isood'] + sys.argv[1:]\n"
        "main()\n")
    args = [str(a) for a in _args(world, tmp_path / "ev", detectors="msp,pytorch-ood:Noisy")]
    r = subprocess.run([sys.executable, str(script), *args], capture_output=True, text=True, timeout=300,
                       cwd=next(p for p in Path(__file__).resolve().parents if (p / "pyproject.toml").is_file()))
    assert r.returncode == 0, r.stderr
    from isood.core.progress import is_progress_line

    lines = [ln for ln in r.stderr.splitlines() if ln.strip() and not is_progress_line(ln)]
    assert lines == ["warning: pytorch-ood:Noisy: scores are nearly constant"], r.stderr


# ======================================================================================== per-subset imports
def test_per_subset_import_is_evaluated_one_dataset_per_subset(cli, tmp_path):
    """Guard: assemble.grid_parts. `isood import isood-lists --na-rule per-subset`: each subset is its own grid
    dataset (splits/train, splits/val), a cell N/A on that subset's own count; the measured cells' metrics are
    those of the subset's images (it was refused: 'mixes several sources')."""
    from isood.stages.evaluate.outputs import save_outputs

    rng = np.random.default_rng(5)
    counts = {"train": {(0, 0): 12, (0, 1): 4, (1, 0): 11, (1, 1): 0},
              "val": {(0, 0): 3, (0, 1): 12, (1, 0): 10, (1, 1): 2}}
    for sub, per_cell in counts.items():
        folder = tmp_path / "release" / "imagenet21k" / sub
        folder.mkdir(parents=True)
        for (c, s), n in per_cell.items():
            (folder / f"cov_{c}_sem_{s}.txt").write_text("".join(
                f"./imagenet21k_{sub}/{CLEAN[i % 3]}/{CLEAN[i % 3]}_{c}{s}{i}.JPEG\n" for i in range(n)))
    r = cli.invoke(["import", "isood-lists", tmp_path / "release" / "imagenet21k", "--out", tmp_path / "imp",
                    "--levels", "2", "--na-rule", "per-subset"])
    assert r.exit_code == 0, r.output
    images = manifests.read(tmp_path / "imp", kind="splits").images
    _outputs(tmp_path, "train", [ID[i % 3] for i in range(30)], rng.normal(0, 1, (30, 3)) + 4 * np.eye(3)[
        [i % 3 for i in range(30)]], rng)
    val_logits = rng.normal(0, 1, (15, 3)) + 4 * np.eye(3)[[i % 3 for i in range(15)]]
    _outputs(tmp_path, "val", [ID[i % 3] for i in range(15)], val_logits, rng)
    t_logits = rng.normal(0, 1, (len(images), 3))
    save_outputs(tmp_path / "test", images[["path", "wnid"]], logits=t_logits,
                 features=rng.normal(size=(len(images), 4)))
    out = tmp_path / "ev"
    r = cli.invoke(["evaluate", "--splits", tmp_path / "imp", "--id-train", tmp_path / "train", "--id-test",
                    tmp_path / "val", "--test-root", tmp_path / "test", "--detectors", "msp", "--out", out])
    assert r.exit_code == 0, r.output
    pc = manifests.read(out, kind="evaluation").cell_metrics.set_index(["dataset", "cell"])
    assert sorted(set(pc.index.get_level_values(0))) == ["splits/train", "splits/val"]

    def msp(z):
        e = np.exp(z - z.max(1, keepdims=True))
        return (e / e.sum(1, keepdims=True)).max(1)

    for sub, per_cell in counts.items():
        for (c, s), n in per_cell.items():
            row = pc.loc[(f"splits/{sub}", f"cov_{c}_sem_{s}")]
            assert row["n"] == n and bool(row["na"]) == (n < 10), (sub, c, s)
            if n >= 10:
                sel = ((images["subset"] == sub) & (images["cov_level"] == c) & (images["sem_level"] == s)).to_numpy()
                assert row["auroc"] == pytest.approx(M.auroc(msp(val_logits), msp(t_logits[sel])), abs=1e-12)


# ======================================================================================== refused before imports
@pytest.mark.parametrize("extra", [
    pytest.param(["--batch-size", "0"], id="batch_size"),
    pytest.param(["--seed", SEED_TOO_BIG], id="seed"),
    pytest.param(["--plot-metrics", "nope"], id="plot_metrics"),
    pytest.param(["--detectors", "knn:k=abc"], id="detector_param"),
    pytest.param(["--leak-rules", "nope"], id="leak_rules"),
    pytest.param(["--model", "py:nomodule"], id="model_form"),
    pytest.param(["DEMO", "--seed", "-1"], id="demo_seed"),
])
def test_bad_option_is_refused_without_importing_torch(extra, tmp_path):
    """Guard: cli.evaluate calls options.check_options before it imports the stage, cli.demo check_seed before
    the demo's modules (torch, timm, sklearn, matplotlib, WordNet). Run in a fresh interpreter: exit 2, one
    line, none of them imported."""
    code = ("import sys\nfrom isood.cli import main\nsys.argv = ['isood'] + sys.argv[1:]\ntry:\n    main()\n"
            "except SystemExit as e:\n    rc = e.code\n"
            "heavy = sorted(m for m in ('torch', 'timm', 'sklearn', 'matplotlib', 'open_clip', 'nltk', 'scipy')"
            " if m in sys.modules)\nprint(json.dumps([rc, heavy]))\n")
    args = (["demo", "--out", tmp_path / "out", *extra[1:]] if extra[0] == "DEMO" else
            ["evaluate", "--splits", tmp_path / "s", "--id-test", tmp_path / "v", "--id-train", tmp_path / "t",
             "--out", tmp_path / "out", *extra])
    r = subprocess.run([sys.executable, "-c", "import json\n" + code, *map(str, args)], capture_output=True,
                       text=True, timeout=120, cwd=next(p for p in Path(__file__).resolve().parents if (p / "pyproject.toml").is_file()))
    rc, heavy = json.loads(r.stdout.strip().splitlines()[-1])
    assert rc == 2 and heavy == [], (rc, heavy, r.stderr)
    assert len([ln for ln in r.stderr.splitlines() if ln.strip()]) == 1, r.stderr
