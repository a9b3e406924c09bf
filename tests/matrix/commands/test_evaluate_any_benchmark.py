"""`isood evaluate` scores every benchmark a user already has, the release's way and
isood's, from the CLI or in memory.

The world: made-up images written at the paths of the published IS-OOD release's lists (a few of its real lines,
the rest in the same patterns): ``imglist/imagenet21k/{train,val}/cov_{c}_sem_{s}.txt`` (``./imagenet21k_train/
<wnid>/<wnid>_<k>.JPEG``), ``imglist/SynIS/cov_{c}_sem_{s}.txt`` (``./cov_3_sem_4/1328_297_18.png``) and the flat
ID test list ``imglist/imagenet1k/test_imagenet.txt`` (``./val/ILSVRC2012_val_00024235.JPEG``, no wnid), imported
with the real importers; an ImageNet-OOD list; a tiny timm ResNet (random weights, local checkpoint). References are
independent: the release's per-set transforms rebuilt here with torchvision, Table 1 recomputed from the written
``results/msp.csv`` by the release's rule as described, scikit-learn for the per-set AUROC.
"""

from __future__ import annotations

import hashlib
import io
import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from PIL import Image

import manifests

ID = ["n01440764", "n01443537", "n01484850"]
OOD_WNIDS = ["n00005787", "n00007846", "n00015388", "n00324978", "n00433661", "n02084071"]
#: real lines of the release (imagenet21k/train/cov_5_sem_3.txt, SynIS/cov_3_sem_4.txt, imagenet1k/test_imagenet.txt)
REAL_21K = ["./imagenet21k_train/n00005787/n00005787_5679.JPEG", "./imagenet21k_train/n00005787/n00005787_9778.JPEG",
            "./imagenet21k_train/n00007846/n00007846_18059.JPEG"]
REAL_SYN = ["./cov_3_sem_4/1328_297_18.png", "./cov_3_sem_4/2565_7910_12.png", "./cov_3_sem_4/4668_15274_37.png"]
REAL_VAL = ["./val/ILSVRC2012_val_00024235.JPEG", "./val/ILSVRC2012_val_00037375.JPEG",
            "./val/ILSVRC2012_val_00031094.JPEG", "./val/ILSVRC2012_val_00025527.JPEG"]
N = 8
RELEASE_METRICS = {"FPR@95": "fpr95_openood", "AUROC": "auroc", "AUPR_IN": "aupr_in", "AUPR_OUT": "aupr_out"}


def _image(path: Path, rng, base: float, size=(24, 20)) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    a = np.clip(base + rng.normal(0, 30, (size[1], size[0], 3)), 0, 255).astype(np.uint8)
    Image.fromarray(a).save(path, format="PNG" if path.suffix.lower() == ".png" else "JPEG")


def _write_list(path: Path, lines) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(f"{ln}\n" for ln in lines))


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    """The release's folders (``data/imglist``, ``data/imagenet1k``, ``data/imagenet21k``, ``data/SynIS``), their
    imports, an ImageNet-OOD import, ID training folders, labels, a tiny timm ResNet checkpoint."""
    import timm
    import torch
    from safetensors.torch import save_file

    from isood.stages.interop import import_imagenet_ood, import_isood_lists

    root = tmp_path_factory.mktemp("any_benchmark")
    data = root / "data"
    rng = np.random.default_rng(0)
    k = 0
    # ImageNet-21K cells: train + val lists of every cell (pooled by the release); about half the cells measured
    for c in range(N):
        for s in range(N):
            for split in ("train", "val"):
                n = int(rng.integers(0, 3)) if (c + s) % 2 == 0 else int(rng.integers(0, 2))
                lines = []
                for _ in range(n):
                    w = (ID if s == 0 else OOD_WNIDS)[k % (3 if s == 0 else 6)]
                    lines.append(f"./imagenet21k_{split}/{w}/{w}_{k}.JPEG")
                    k += 1
                if (c, s, split) == (5, 3, "train"):
                    lines += REAL_21K
                for ln in lines:
                    _image(data / "imagenet21k" / ln, rng, 120 - 8 * s + 6 * c)
                _write_list(data / "imglist" / "imagenet21k" / split / f"cov_{c}_sem_{s}.txt", lines)
            # Syn-IS cells: one list per cell, paths relative to the SynIS folder
            n = int(rng.integers(0, 4))
            lines = [f"./cov_{c}_sem_{s}/{int(rng.integers(1, 5000))}_{int(rng.integers(1, 20000))}_{i}.png"
                     for i in range(n)] + (REAL_SYN if (c, s) == (3, 4) else [])
            lines = list(dict.fromkeys(lines))
            for ln in lines:
                _image(data / "SynIS" / ln, rng, 90 + 10 * s - 5 * c)
            _write_list(data / "imglist" / "SynIS" / f"cov_{c}_sem_{s}.txt", lines)
    # the ID test list (flat, no wnid) and its ground truth in ImageNet's LOC_val_solution.csv form
    val = REAL_VAL + [f"./val/ILSVRC2012_val_{40000 + i:08d}.JPEG" for i in range(8)]
    truth = ["ImageId,PredictionString"]
    for i, ln in enumerate(val):
        w = ID[i % 3]
        _image(data / "imagenet1k" / ln, rng, 60 + 50 * (i % 3))
        truth.append(f"{Path(ln).stem},{w} 1 2 3 4")
    _write_list(data / "imglist" / "imagenet1k" / "test_imagenet.txt", val)
    _write_list(root / "LOC_val_solution.csv", truth)
    for w_i, w in enumerate(ID):
        for i in range(4):
            _image(root / "train" / w / f"{w}_{i}.JPEG", rng, 60 + 50 * w_i)
    # an ImageNet-OOD list: paths relative to the ImageNet-21K folder
    inood = [f"imagenet21k_extra/{w}/{w}_{i}.JPEG" for i, w in enumerate(OOD_WNIDS * 2)]
    for ln in inood:
        _image(data / "imagenet21k" / ln, rng, 30)
    _write_list(root / "imagenet_ood.txt", inood)
    import_isood_lists(data / "imglist" / "imagenet21k", root / "m_in21k")
    import_isood_lists(data / "imglist" / "SynIS", root / "m_synis")
    import_imagenet_ood(root / "imagenet_ood.txt", root / "m_inood")
    torch.manual_seed(0)
    model = timm.create_model("test_resnet", pretrained=False, num_classes=3)
    save_file({k: v.contiguous() for k, v in model.state_dict().items()}, str(root / "test_resnet.safetensors"))
    return root


def _sets(world: Path) -> list:
    data = world / "data"
    return ["--ood", f"in21k={world / 'm_in21k'}", "--ood-root", f"in21k={data / 'imagenet21k'}",
            "--ood", f"synis={world / 'm_synis'}", "--ood-root", f"synis={data / 'SynIS'}",
            "--ood", f"far:inood={world / 'm_inood'}", "--ood-root", f"inood={data / 'imagenet21k'}"]


def _base(world: Path, out: Path, *extra, detectors="msp,energy,knn:k=3") -> list:
    data = world / "data"
    return ["evaluate", "--id-test", data / "imglist" / "imagenet1k" / "test_imagenet.txt", "--id-test-root",
            data / "imagenet1k", "--id-train", world / "train", "--model", "test_resnet", "--checkpoint",
            world / "test_resnet.safetensors", "--na-threshold", "2", "--detectors", detectors, "--plot-metrics",
            "auroc", "--cache-dir", out.parent / "cache", "--out", out, *extra]


def _msp(world: Path, files, resize: int) -> np.ndarray:
    """MSP of the checkpointed model with the release's transform (Resize(resize) + CenterCrop(224) + ImageNet
    mean/std), built here with torchvision."""
    import timm
    import torch
    from torchvision import transforms as T

    model = timm.create_model("test_resnet", pretrained=False, num_classes=3,
                              checkpoint_path=str(world / "test_resnet.safetensors")).eval()
    tf = T.Compose([T.Resize(resize), T.CenterCrop(224), T.ToTensor(),
                    T.Normalize([0.485, 0.456, 0.406], [0.229, 0.224, 0.225])])
    x = torch.stack([tf(Image.open(f).convert("RGB")) for f in files])
    with torch.no_grad():
        return torch.softmax(model(x), dim=1).max(dim=1).values.numpy()


def _release_table1(csv_text: str, part: str) -> dict:
    """{(axis, column): (corr, sens)} by the release's rule, as described: the file's rows (the first 64 after the
    header: ImageNet-21K; the last 64: Syn-IS) grouped per covariate level, values as read, a level's mean over
    its values > 1e-16, |least-squares slope| and Pearson r against 1..8."""
    from scipy.stats import pearsonr

    frame = pd.read_csv(io.StringIO(csv_text), index_col=0)
    rows = frame.iloc[:64] if part == "first" else frame.iloc[-64:]
    out = {}
    for col in frame.columns:
        grid = rows[col].to_numpy(dtype=float).reshape(N, N)  # rows: cov levels (cov outer in the file)
        for axis, levels in (("sem", grid.T), ("cov", grid)):
            means = np.array([lv[lv > 1e-16].mean() for lv in levels])
            out[(axis, col)] = (pearsonr(means, np.arange(1, N + 1))[0],
                                abs(np.polyfit(np.arange(1, N + 1), means, 1)[0]))
    return out


# ================================================================================ the release, Syn-IS, ImageNet-OOD
@pytest.fixture(scope="module")
def release_run(world, cli, tmp_path_factory):
    out = tmp_path_factory.mktemp("runs") / "release"
    r = cli.invoke(_base(world, out, *_sets(world), "--preprocess", "release", "--table-convention", "release",
                     "--id-test-labels", world / "LOC_val_solution.csv"))
    assert r.exit_code == 0, r.output
    return out


def test_one_call_scores_the_release_grid_syn_is_and_an_imagenet_ood_import(world, release_run):
    m = manifests.read(release_run, kind="evaluation")
    pc = m.frame("cell_metrics")
    assert set(pc["dataset"]) == {"in21k", "synis"}
    assert (pc.groupby(["detector", "dataset"]).size() == 64).all()
    sets = m.frame("set_metrics")
    msp = sets[sets["detector"] == "msp"]
    assert msp["dataset"].tolist() == ["inood", "farood", "in21k", "synis"]  # far group first, as OpenOOD
    assert msp.set_index("dataset").loc["inood", "n"] == 12 and msp.set_index("dataset").loc["farood", "kind"] == "mean"
    # per-set AUROC against scikit-learn from the per-image scores
    from sklearn.metrics import roc_auc_score

    scores = m.frame("scores")
    id_s = scores.loc[scores["dataset"] == "id_test", "msp"].to_numpy()
    for ds in ("in21k", "synis", "inood"):
        o = scores.loc[scores["dataset"] == ds, "msp"].to_numpy()
        ref = roc_auc_score(np.r_[np.ones(id_s.size), np.zeros(o.size)], np.r_[id_s, o])
        assert msp.set_index("dataset").loc[ds, "auroc"] == pytest.approx(ref, abs=1e-12)
    # the ID test labels come from the ground-truth file: accuracy is the share of predictions equal to them
    ids = scores[scores["dataset"] == "id_test"]
    truth = {Path(p).stem: ID[i % 3] for i, p in enumerate(REAL_VAL + [f"./val/ILSVRC2012_val_{40000 + i:08d}.JPEG"
                                                                       for i in range(8)])}
    labels = [ID.index(truth[Path(p).stem]) for p in ids["path"]]
    assert ids["label"].tolist() == labels
    assert m.meta["summary"]["accuracy on id_test"] == round(float(np.mean(ids["prediction"] == labels)), 4)


def test_release_preprocessing_is_applied_and_recorded_per_set(world, release_run):
    m = manifests.read(release_run, kind="evaluation")
    pre = m.config["preprocess"]
    assert {k: v["preset"] for k, v in pre.items()} == {
        "id_train": "release-1k", "id_test": "release-1k", "in21k": "release-21k", "synis": "release-1k",
        "inood": "release-1k"}
    assert "Resize(size=224" in pre["in21k"]["transform"] and "Resize(size=256" in pre["synis"]["transform"]
    roots = {s["name"]: s["root"] for s in m.config["ood_sets"]}
    assert roots["synis"] == str(world / "data" / "SynIS")
    scores = m.frame("scores")
    data = world / "data"
    for ds, folder, resize in (("in21k", data / "imagenet21k", 224), ("synis", data / "SynIS", 256),
                               ("id_test", data / "imagenet1k", 256)):
        rows = scores[scores["dataset"] == ds].head(6)
        ref = _msp(world, [folder / p for p in rows["path"]], resize)
        np.testing.assert_allclose(rows["msp"].to_numpy(), ref, rtol=1e-5, atol=1e-6)
    # the 21K cells through the 1K transform would differ: the per-set transform matters on these images
    rows = scores[scores["dataset"] == "in21k"].head(6)
    assert not np.allclose(rows["msp"].to_numpy(), _msp(world, [data / "imagenet21k" / p for p in rows["path"]],
                                                           256), rtol=1e-5, atol=1e-6)


def test_release_convention_gives_the_releases_table1_and_results_file(release_run):
    m = manifests.read(release_run, kind="evaluation")
    text = (release_run / "results" / "msp.csv").read_text()
    lines = text.splitlines()
    assert lines[0] == ",FPR@95,AUROC,AUPR_IN,AUPR_OUT" and len(lines) == 129
    assert lines[1].startswith("cov_0_sem_0,") and lines[65].startswith("cov_0_sem_0,")
    t1 = m.frame("table1").set_index(["detector", "dataset", "axis", "metric"])
    for ds, part in (("in21k", "first"), ("synis", "last")):
        for (axis, col), (corr, sens) in _release_table1(text, part).items():
            row = t1.loc[("msp", ds, axis, RELEASE_METRICS[col])]
            assert row["correlation"] == pytest.approx(corr, abs=1e-9, nan_ok=True)
            assert row["sensitivity"] == pytest.approx(sens, abs=1e-9, nan_ok=True)


def test_syn_is_alone(world, cli, tmp_path):
    """Guard: --splits is optional; a Syn-IS manifest (written by generate-syn's writer) is evaluated alone."""
    from isood.stages.syn import write_syn_manifest
    from isood.science.grid import cell_name, edges_table

    syn = tmp_path / "syn"
    rng = np.random.default_rng(1)
    images, prompts = [], []
    for s in (0, 1):
        for i in range(4):
            rel = f"images/sdxl-art/{OOD_WNIDS[i]}_{s}_{i}.png"
            _image(syn / rel, rng, 40 + 100 * s)
            common = {"prompt": "art", "negative_prompt": "", "style": "sdxl-art", "wnid": OOD_WNIDS[i],
                      "label": "x", "prompt_id": f"p{s}{i}", "d_sem": 0.1 + s, "d_cov": 1.1, "sem_level": s,
                      "cov_level": 1, "cell": cell_name(1, s)}
            images.append({"path": rel, "image_index": 0, "seed": i,
                           "sha256": hashlib.sha256((syn / rel).read_bytes()).hexdigest(), **common})
            prompts.append({**common, "selected": True})
    write_syn_manifest(syn, images=pd.DataFrame(images), prompts=pd.DataFrame(prompts),
                       rejected=pd.DataFrame({c: pd.Series(dtype=str) for c in ("stage", "path", "prompt_id", "style",
                                                                                "wnid", "label", "prompt", "reason")}),
                       edges=edges_table([0.0, 1.0, 2.0], [0.0, 1.0, 2.0]), argv=["test"],
                       config={"n_levels": 2, "na_threshold": 10})
    out = tmp_path / "ev"
    r = cli.invoke(_base(world, out, "--syn", syn, detectors="msp"))
    assert r.exit_code == 0, r.output
    m = manifests.read(out, kind="evaluation")
    assert set(m.frame("cell_metrics")["dataset"]) == {"syn-is"}
    assert m.frame("set_metrics")["dataset"].tolist() == ["syn-is"]
    # no --id-test-labels and no wnid in the flat list: OOD metrics only, no accuracy
    assert "auroc_m" not in m.frame("cell_metrics").columns and "accuracy on id_test" not in m.meta["summary"]


def test_image_lists_only_write_per_set_rows_and_no_grid(world, cli, tmp_path):
    out = tmp_path / "ev"
    data = world / "data"
    r = cli.invoke(_base(world, out, "--ood", f"near:inood={world / 'm_inood'}", "--ood-root",
                         f"inood={data / 'imagenet21k'}", detectors="msp"))
    assert r.exit_code == 0, r.output
    m = manifests.read(out, kind="evaluation")
    assert m.frame("cell_metrics").empty
    assert m.frame("set_metrics")["dataset"].tolist() == ["inood", "nearood"]
    assert "Per-set results" in (out / "report.html").read_text()


# ================================================================================ in memory, and the CLIP models
@pytest.mark.parametrize("options, words", [
    ({"na_threshhold": 2}, ["unknown option 'na_threshhold'", "na_threshold"]),
    ({"na_threshold": 0}, ["--na-threshold must be an integer >= 1, got 0"]),
    ({"bootstrap": -1}, ["--bootstrap must be an integer >= 0, got -1"]),
])
def test_python_api_checks_options_like_the_cli_before_any_work(options, words, world, tmp_path, monkeypatch):
    """Guard: isood.stages.evaluate.api.evaluate (EvaluateOptions + isood.core.optspec.check): the API's keyword options
    are the CLI's fields, refused in one line before a model is built."""
    import isood
    import isood.stages.evaluate.api as api

    def built(*args, **kwargs):
        raise AssertionError("the model was built before the options were checked")

    monkeypatch.setattr(api, "compute", built)
    monkeypatch.chdir(tmp_path)
    with pytest.raises(isood.IsoodError) as e:
        isood.evaluate("test_resnet", id_test=world / "train", detectors="msp", **options)
    assert all(w in str(e.value) for w in words) and "\n" not in str(e.value), str(e.value)


def test_python_api_returns_the_cli_frames_and_writes_nothing(world, release_run, tmp_path, monkeypatch):
    import isood

    monkeypatch.setenv("ISOOD_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.chdir(tmp_path)
    data = world / "data"
    ev = isood.evaluate(
        "test_resnet", checkpoint=world / "test_resnet.safetensors",
        id_test=data / "imglist/imagenet1k/test_imagenet.txt", id_test_root=data / "imagenet1k", id_train=world / "train", detectors="msp,energy,knn:k=3",
        ood={"in21k": world / "m_in21k", "synis": world / "m_synis", "far:inood": world / "m_inood"},
        roots={"in21k": data / "imagenet21k", "synis": data / "SynIS", "inood": data / "imagenet21k"},
        id_test_labels=world / "LOC_val_solution.csv", preprocess="release", table_convention="release",
        na_threshold=2)
    # no manifest, no report, no output cache: at most the verification cache of the manifests read (manifests.verify
    # remembers the large files it hashed; these small manifests' files are hashed on every read, nothing to keep)
    written = [p.relative_to(tmp_path) for p in tmp_path.rglob("*") if p.is_file()]
    assert all(p.parts[:2] == ("cache", "verified") for p in written), written
    m = manifests.read(release_run, kind="evaluation")
    keys = ["detector", "dataset"]
    cli_sets = m.frame("set_metrics")
    pd.testing.assert_frame_equal(ev.per_set.reset_index(drop=True)[cli_sets.columns], cli_sets, check_dtype=False,
                                  rtol=1e-6)
    cli_t1 = m.frame("table1").sort_values(keys + ["axis", "metric"]).reset_index(drop=True)
    mem_t1 = ev.table1.sort_values(keys + ["axis", "metric"]).reset_index(drop=True)
    pd.testing.assert_frame_equal(mem_t1[cli_t1.columns], cli_t1, check_dtype=False, rtol=1e-6)
    assert len(ev.per_cell) == len(m.frame("cell_metrics"))
    # scores keyed by image path
    frame = ev.scores_frame()
    cli_scores = m.frame("scores").set_index(["dataset", "path"])
    for ds in ("id_test", "in21k", "inood"):
        got = frame.loc[ds, "msp"]
        ref = cli_scores.loc[ds, "msp"]
        np.testing.assert_allclose(got.loc[ref.index].to_numpy(), ref.to_numpy(), rtol=1e-6)
    assert frame.loc["id_test"].index[0].startswith("val/ILSVRC2012_val_")


def test_clip_zero_shot_from_the_cli_and_python(world, tiny_clip_dir, cli, tmp_path):
    import isood

    classes = tmp_path / "classes.txt"
    classes.write_text("".join(f"{w} {name}\n" for w, name in zip(ID, ("tench", "goldfish", "great white shark"))))
    data = world / "data"
    common = ["--ood", f"inood={world / 'm_inood'}", "--ood-root", f"inood={data / 'imagenet21k'}"]
    out = tmp_path / "ev"
    r = cli.invoke(["evaluate", "--id-test", data / "imglist/imagenet1k/test_imagenet.txt", "--id-test-root",
                    data / "imagenet1k", "--model", f"clip:local-dir:{tiny_clip_dir}", "--classes", classes,
                    "--detectors", "mcm,glmcm", "--cache-dir", "", "--out", out, *common])
    assert r.exit_code == 0, r.output
    scores = manifests.read(out, kind="evaluation").frame("scores").set_index(["dataset", "path"])
    ev = isood.evaluate(f"clip:local-dir:{tiny_clip_dir}", classes=classes, detectors="mcm,glmcm",
                        id_test=data / "imglist/imagenet1k/test_imagenet.txt", id_test_root=data / "imagenet1k",
                        ood={"inood": world / "m_inood"}, roots={"inood": data / "imagenet21k"})
    frame = ev.scores_frame()
    for det in ("mcm", "glmcm"):
        np.testing.assert_allclose(frame.loc[scores.index, det].to_numpy(), scores[det].to_numpy(), rtol=1e-5)
    assert (scores["glmcm"] > scores["mcm"]).all()  # the local term is a positive softmax


# ================================================================================ bad input: one line, exit 2
def _audit_manifest(folder: Path) -> Path:
    """A manifest of a kind no evaluation reads (an audit with one class)."""
    from isood.kinds import AUDIT

    classes = pd.DataFrame({"wnid": ["n01440764"], "name": ["tench"], "decision": ["keep"], "rule": [""],
                            "conflict_wnid": [""], "conflict_name": [""], "conflict_hops": [0], "entries": [1]})
    summary = pd.DataFrame({"decision": ["keep"], "rule": [""], "classes": [1], "entries": [1]})
    with manifests.writing(folder, AUDIT) as o:
        manifests.write_with_card(o.work, kind=AUDIT, tables={"classes": classes, "summary": summary}, config={},
                                  inputs=[], summary={}, note="test", argv=["test"], title="audit")
    return folder


@pytest.mark.parametrize("make, extra, names", [
    pytest.param(lambda w, t: ["--ood", f"x={_audit_manifest(t / 'audit')}"], [], ("--ood x=", "'audit'",
                 "'image-list'"), id="unknown_set_kind"),
    pytest.param(lambda w, t: ["--ood", f"mid:x={w / 'm_inood'}"], [], ("mid", "near", "far"), id="unknown_group"),
    pytest.param(lambda w, t: ["--ood", f"inood={w / 'm_inood'}"], [], ("--ood-root inood=DIR",),
                 id="image_list_without_root"),
    pytest.param(lambda w, t: ["--ood", f"inood={w / 'm_inood'}", "--ood-root", f"inood={w / 'data' / 'SynIS'}"], [],
                 ("12 of 12 images are missing", "--ood-root inood=DIR"), id="list_with_missing_files"),
    pytest.param(lambda w, t: ["--ood", f"a={w / 'm_inood'}", "--ood", f"a={w / 'm_synis'}"], [], ("'a'", "taken"),
                 id="name_twice"),
    pytest.param(lambda w, t: ["--ood", f"id_test={w / 'm_inood'}"], [], ("reserved",), id="reserved_name"),
    pytest.param(lambda w, t: ["--ood", "synis"], [], ("NAME=MANIFEST",), id="malformed_ood"),
    pytest.param(lambda w, t: ["--ood", f"s={w / 'm_synis'}", "--ood-root", f"nope={w}"], [], ("nope", "s"),
                 id="root_of_no_set"),
    pytest.param(lambda w, t: ["--ood", f"s={w / 'm_synis'}", "--preprocess", "fancy"], [], ("fancy", "release"),
                 id="unknown_preset"),
    pytest.param(lambda w, t: ["--ood", f"s={w / 'm_synis'}", "--table-convention", "paper"], [],
                 ("paper", "exact", "release"), id="unknown_convention"),
    pytest.param(lambda w, t: [], [], ("no OOD set", "--ood"), id="no_ood_set"),
])
def test_bad_input_is_one_line_and_nothing_written(make, extra, names, world, cli, tmp_path):
    out = tmp_path / "ev"
    r = cli.invoke(_base(world, out, *make(world, tmp_path), *extra, detectors="msp"))
    line = cli.one_line_error(r)
    assert all(n in line for n in names), line
    assert not (out / "manifest.json").exists()


def _labels_file(tmp_path: Path, rows) -> Path:
    f = tmp_path / "labels.txt"
    f.write_text("".join(f"{a} {b}\n" for a, b in rows))
    return f


@pytest.mark.parametrize("rows, names", [
    pytest.param(lambda stems: [(s, "n09999999") for s in stems], ("n09999999", "not a class of the model"),
                 id="wnid_not_a_model_class"),
    pytest.param(lambda stems: [(s, "7") for s in stems], ("label 7", "3 classes"), id="index_out_of_range"),
    pytest.param(lambda stems: [(s, "0") for s in stems[:-2]], ("no label for 2 of 12",), id="images_without_label"),
    pytest.param(lambda stems: [("ILSVRC2012_val_00024235", "n01440764"), ("ILSVRC2012_val_00024235", "n01443537")],
                 ("labelled n01440764 earlier",), id="two_labels_for_one_image"),
])
def test_labels_that_do_not_match_are_one_line(rows, names, world, cli, tmp_path):
    stems = [Path(p).stem for p in REAL_VAL] + [f"ILSVRC2012_val_{40000 + i:08d}" for i in range(8)]
    data = world / "data"
    out = tmp_path / "ev"
    r = cli.invoke(_base(world, out, "--ood", f"s={world / 'm_synis'}", "--ood-root", f"s={data / 'SynIS'}",
                         "--id-test-labels", _labels_file(tmp_path, rows(stems)), detectors="msp"))
    line = cli.one_line_error(r)
    assert all(n in line for n in names), line
    assert not (out / "manifest.json").exists()


def test_flat_id_list_without_labels_is_an_unlabelled_id_set(world, cli, tmp_path):
    """Guard: a flat list without wnids is an unlabelled
    ID test set, relative to --id-test-root; with one wnid-named image among flat ones it stays an error."""
    data = world / "data"
    out = tmp_path / "ev"
    r = cli.invoke(_base(world, out, "--ood", f"s={world / 'm_synis'}", "--ood-root", f"s={data / 'SynIS'}",
                         detectors="msp"))
    assert r.exit_code == 0, r.output
    m = manifests.read(out, kind="evaluation")
    ids = m.frame("scores").query("dataset == 'id_test'")
    assert len(ids) == 12 and ids["path"].str.startswith("val/ILSVRC2012_val_").all()
    assert m.config["id_test_root"] == str(data / "imagenet1k")
    mixed = tmp_path / "mixed.txt"
    import shutil

    root = tmp_path / "id_root"  # the flat images and one in a wnid folder, all inside the list's root
    for p in REAL_VAL:
        (root / p).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(data / "imagenet1k" / p, root / p)
    (root / "train" / ID[0]).mkdir(parents=True)
    shutil.copy(world / "train" / ID[0] / f"{ID[0]}_0.JPEG", root / "train" / ID[0] / f"{ID[0]}_0.JPEG")
    mixed.write_text("".join(f"{p}\n" for p in REAL_VAL) + f"train/{ID[0]}/{ID[0]}_0.JPEG\n")
    r = cli.invoke([
        "evaluate", "--id-test", mixed, "--id-test-root", root, "--model", "test_resnet",
        "--checkpoint", world / "test_resnet.safetensors", "--id-train", world / "train", "--detectors", "msp",
        "--ood", f"s={world / 'm_synis'}", "--ood-root", f"s={data / 'SynIS'}", "--out", tmp_path / "ev2"])
    line = cli.one_line_error(r)
    assert "have no wnid" in line


def test_fitted_detector_without_id_train_is_refused(world, cli, tmp_path):
    data = world / "data"
    r = cli.invoke(["evaluate", "--id-test", data / "imglist/imagenet1k/test_imagenet.txt", "--id-test-root",
                    data / "imagenet1k", "--model", "test_resnet", "--checkpoint", world / "test_resnet.safetensors",
                    "--detectors", "msp,knn", "--ood", f"s={world / 'm_synis'}", "--out", tmp_path / "ev"])
    line = cli.one_line_error(r)
    assert "knn" in line and "--id-train" in line


@pytest.mark.parametrize("extra", [
    pytest.param(["--ood", "near:x"], id="ood_form"),
    pytest.param(["--ood", "mid:x=/nowhere"], id="ood_group"),
    pytest.param(["--preprocess", "fancy"], id="preset"),
    pytest.param(["--table-convention", "paper"], id="convention"),
    pytest.param(["--ood-root", "x"], id="root_form"),
])
def test_new_options_are_refused_without_importing_torch(extra, tmp_path):
    """Guard: options.check_options parses the new options before the stage (and torch) loads."""
    code = ("import sys, json\nfrom isood.cli import main\nsys.argv = ['isood'] + sys.argv[1:]\ntry:\n    main()\n"
            "except SystemExit as e:\n    rc = e.code\n"
            "heavy = sorted(m for m in ('torch', 'timm', 'sklearn', 'open_clip', 'scipy') if m in sys.modules)\n"
            "print(json.dumps([rc, heavy]))\n")
    args = ["evaluate", "--ood", f"s={tmp_path / 's'}", "--id-test", tmp_path / "v", "--out", tmp_path / "out", *extra]
    r = subprocess.run([sys.executable, "-c", code, *map(str, args)], capture_output=True, text=True, timeout=120,
                       cwd=next(p for p in Path(__file__).resolve().parents if (p / "pyproject.toml").is_file()))
    rc, heavy = json.loads(r.stdout.strip().splitlines()[-1])
    assert rc == 2 and heavy == [], (rc, heavy, r.stderr)
    assert len([ln for ln in r.stderr.splitlines() if ln.strip()]) == 1, r.stderr


def test_release_results_file_only_for_the_releases_two_grids(world, release_run, cli, tmp_path):
    """The release's ``analyze_metrics.py`` reads a results file as ImageNet-21K rows then the last 64 as Syn-IS:
    a run with its two 8 x 8 grids gets the file; a run with one grid gets one warning line and none (the release's
    script would crash on it), its per-cell rows in ``results/cell_metrics.csv``."""
    m = manifests.read(release_run, kind="evaluation")
    assert len(m.path("results/msp.csv").read_text().splitlines()) == 1 + 128
    out = tmp_path / "one"
    data = world / "data"
    r = cli.invoke(_base(world, out, "--ood", f"in21k={world / 'm_in21k'}", "--ood-root",
                         f"in21k={data / 'imagenet21k'}", "--table-convention", "release", "--bootstrap", "0",
                         detectors="msp"))
    assert r.exit_code == 0, r.output
    told = [ln for ln in r.stderr.splitlines() if "release's format not written" in ln]
    assert len(told) == 1 and "exactly two" in told[0] and "Traceback" not in r.output
    one = manifests.read(out, kind="evaluation")
    assert not one.path("results/msp.csv").exists()
    assert (one.frame("cell_metrics")["dataset"] == "in21k").sum() == 64
