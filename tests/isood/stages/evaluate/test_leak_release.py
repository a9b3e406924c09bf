"""The official IS-OOD release layout end to end: `isood import isood-lists <release>/imagenet21k` (lists for the
train and val subsets, paths `./imagenet21k_train/<wnid>/<wnid>_<n>.JPEG`) -> `isood evaluate --splits <import>
--test-root <folder with imagenet21k_train/ and imagenet21k_val/>` on tiny images written at the listed paths and
a tiny timm model (random weights, local checkpoint). Then the leak-aware path on the same import: `isood wordnet
audit` -> `evaluate --leak-audit`, and `isood splits clean` -> `evaluate`, which must agree cell for cell."""

import numpy as np
import pandas as pd
import pytest
import torch
from typer.testing import CliRunner

import manifests
from isood.cli import app
from isood.evaluation import metrics as M

pytestmark = pytest.mark.usefixtures("one_thread")

ID = ["n01440764", "n01443537", "n01484850"]  # tench, goldfish, great white shark (ImageNet-1K)
FISH = "n02512053"  # a hypernym of the three
CLEAN = ["n02826259", "n03050655", "n02666943"]  # bellows, clothes dryer, abattoir: no relation to 1K classes
# (cov, sem) -> (train images, val images) and their classes (row i gets pool[i % len(pool)]). Pooled counts 12,
# 16, 16, 12, 5: with the release's N/A threshold 10 all but the last are measured, cov_0_sem_0 and cov_2_sem_5
# although neither subset alone reaches 10. Leaks: 8 of 12 in cov_0_sem_0 (N/A once they are gone), 5 of 16 in
# cov_1_sem_1 and cov_3_sem_2 (still measured), none elsewhere.
CELLS = {(0, 0): (6, 6, ID + [FISH] + CLEAN), (1, 1): (10, 6, ID[:1] + CLEAN), (3, 2): (10, 6, [FISH] + CLEAN),
         (2, 5): (8, 4, CLEAN), (7, 7): (3, 2, CLEAN)}


def _image(path, rng, colour):
    from PIL import Image

    path.parent.mkdir(parents=True, exist_ok=True)
    a = np.clip(colour + rng.normal(0, 25, (16, 16, 3)), 0, 255).astype(np.uint8)
    Image.fromarray(a).save(path, format="JPEG")


@pytest.fixture(scope="module")
def release(tmp_path_factory):
    """The release's list folder (all 64 lists per subset, most empty), the image root, ID folders, a model."""
    from isood.dev.tiny_models import build_tiny_classifier

    root = tmp_path_factory.mktemp("release")
    rng = np.random.default_rng(0)
    colour = {w: rng.integers(30, 225, 3) for w in ID + [FISH] + CLEAN}
    listed = {}
    for subset in ("train", "val"):
        folder = root / "imglist" / "imagenet21k" / subset
        folder.mkdir(parents=True)
        for c in range(8):
            for s in range(8):
                n_train, n_val, pool = CELLS.get((c, s), (0, 0, []))
                n = n_train if subset == "train" else n_val
                lines = []
                for i in range(n):
                    w = pool[i % len(pool)]
                    rel = f"imagenet21k_{subset}/{w}/{w}_{c}{s}{i}.JPEG"
                    _image(root / "images" / rel, rng, colour[w])
                    lines.append(f"./{rel}\n")
                    listed[rel] = (c, s, subset, w)
                (folder / f"cov_{c}_sem_{s}.txt").write_text("".join(lines))
    for split, n in (("train", 6), ("val", 3)):
        for w in ID:
            for i in range(n):
                _image(root / split / w / f"{w}_{i}.png", rng, colour[w])
    build_tiny_classifier(root / "model.safetensors", num_classes=3)
    return root, listed


def _run(args):
    torch.set_num_threads(1)
    r = CliRunner().invoke(app, args)
    assert r.exit_code == 0, r.output
    return r


def _evaluate(root, splits, out, *extra):
    return _run(["evaluate", "--splits", str(splits), "--test-root", str(root / "images"), "--id-train",
                 str(root / "train"), "--id-test", str(root / "val"), "--model", "test_resnet", "--checkpoint",
                 str(root / "model.safetensors"), "--detectors", "msp,energy", "--cache-dir", str(root / "cache"),
                 "--plot-metrics", "auroc", "--out", str(out), *extra])


def _msp(root, files):
    import timm
    import timm.data
    from PIL import Image

    model = timm.create_model("test_resnet", pretrained=False, num_classes=3,
                              checkpoint_path=str(root / "model.safetensors")).eval()
    tf = timm.data.create_transform(**timm.data.resolve_data_config(model=model))
    with torch.no_grad():
        x = torch.stack([tf(Image.open(f).convert("RGB")) for f in files])
        return torch.softmax(model(x), dim=1).max(dim=1).values.numpy()


def test_release_import_evaluates_end_to_end(release, tmp_path):
    root, listed = release
    _run(["import", "isood-lists", str(root / "imglist" / "imagenet21k"), "--out", str(tmp_path / "import")])
    view = manifests.read(tmp_path / "import", kind="splits")
    assert len(view.images) == len(listed)
    _evaluate(root, tmp_path / "import", tmp_path / "ev")
    ev = manifests.read(tmp_path / "ev", kind="evaluation")
    pc = ev.cell_metrics.query("dataset == 'splits' and detector == 'msp'").set_index("cell")
    # the release's N/A rule: a cell pools its train and val lists
    pooled = {f"cov_{c}_sem_{s}": a + b for (c, s), (a, b, _) in CELLS.items()}
    measured = sorted(k for k, n in pooled.items() if n >= 10)
    assert sorted(pc.index[~pc["na"]]) == measured == ["cov_0_sem_0", "cov_1_sem_1", "cov_2_sem_5", "cov_3_sem_2"]
    for cell in measured:
        assert pc.loc[cell, "n"] == pooled[cell]
    # the listed paths resolve under the one root that holds imagenet21k_train/ and imagenet21k_val/
    scores = ev.frame("scores")
    id_msp = scores.query("dataset == 'id_test'")["msp"].to_numpy()
    rels = [r for r, (c, s, _, _) in listed.items() if (c, s) == (2, 5)]
    assert {listed[r][2] for r in rels} == {"train", "val"}
    direct = _msp(root, [root / "images" / r for r in rels])
    got = scores.query("dataset == 'splits' and cell == 'cov_2_sem_5'")
    assert sorted(got["path"].str.removeprefix("./")) == sorted(rels)  # as listed ('./' kept or not)
    assert np.allclose(np.sort(got["msp"].to_numpy()), np.sort(direct), atol=1e-5)
    assert pc.loc["cov_2_sem_5", "auroc"] == pytest.approx(M.auroc(id_msp, direct), abs=1e-6)


def test_leak_audit_and_clean_agree_on_the_release(release, tmp_path):
    root, listed = release
    _run(["import", "isood-lists", str(root / "imglist" / "imagenet21k"), "--out", str(tmp_path / "import")])
    _run(["wordnet", "audit", str(tmp_path / "import"), "--out", str(tmp_path / "audit")])
    audit = manifests.read(tmp_path / "audit", kind="audit")
    rules = dict(zip(audit.optional("images")["path"].str.removeprefix("./"), audit.optional("images")["rule"]))
    leaking = {r for r, (_, _, _, w) in listed.items() if w in ID + [FISH]}
    assert {p for p, r in rules.items() if r in ("id", "hypernym", "hyponym")} == leaking
    assert audit.optional("cells").set_index("cell").loc["cov_0_sem_0", "leak_images"] == sum(
        1 for r in leaking if listed[r][:2] == (0, 0))

    _evaluate(root, tmp_path / "import", tmp_path / "ev", "--leak-audit", str(tmp_path / "audit"))
    _run(["splits", "clean", str(tmp_path / "import"), "--audit", str(tmp_path / "audit"), "--out",
          str(tmp_path / "clean")])
    clean = manifests.read(tmp_path / "clean", kind="splits")
    assert set(clean.images["path"].str.removeprefix("./")) == set(listed) - leaking
    _evaluate(root, tmp_path / "clean", tmp_path / "ev_clean")
    a = manifests.read(tmp_path / "ev", kind="evaluation").cell_metrics
    b = manifests.read(tmp_path / "ev_clean", kind="evaluation").cell_metrics
    free = a[a["dataset"] == "splits-leak-free"].set_index(["detector", "cell"]).sort_index()
    cleaned = b[b["dataset"] == "splits"].set_index(["detector", "cell"]).sort_index()
    # the leak-free images of one run and the cleaned manifest of the other: the same cells, counts, N/A, metrics
    pd.testing.assert_series_equal(free["n"], cleaned["n"])
    pd.testing.assert_series_equal(free["na"], cleaned["na"])
    np.testing.assert_allclose(free["auroc"].to_numpy(float), cleaned["auroc"].to_numpy(float), atol=1e-9)
    # cov_0_sem_0 lost its 8 leaking images: 4 left, below the threshold, N/A in both; the others stay measured
    n_leak = {cell: sum(1 for r in leaking if listed[r][:2] == cell) for cell in CELLS}
    assert n_leak == {(0, 0): 8, (1, 1): 5, (3, 2): 5, (2, 5): 0, (7, 7): 0}
    assert bool(free.loc[("msp", "cov_0_sem_0"), "na"]) and free.loc[("msp", "cov_0_sem_0"), "n"] == 4
    assert sorted(free.loc["msp"].index[~free.loc["msp"]["na"]]) == ["cov_1_sem_1", "cov_2_sem_5", "cov_3_sem_2"]
