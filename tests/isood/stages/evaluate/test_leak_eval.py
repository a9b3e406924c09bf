"""`isood evaluate --leak-audit`: every metric per cell on all images and on the leak-free ones, the difference,
and where the leaks change the detectors' ranking. Planted data whose answer is known: leaking images are
ID-like, so removing them raises AUROC in exactly the cells that hold them and leaves the others unchanged."""

import numpy as np
import pandas as pd
import pytest
from sklearn.metrics import roc_auc_score
from typer.testing import CliRunner

import manifests
from isood.cli import app
from isood.evaluation import metrics as M
from isood.stages.evaluate.assemble import ID_TEST, EvalSet, evaluate_with_leaks
from isood.science.levels import leak_effect, leak_ranking
from isood.stages.evaluate.outputs import save_outputs
from isood.report.plots import leak_diff_name
from isood.classifiers.scoring import DetectorScores
from isood.stages.evaluate.write import write_evaluation
from isood.science.grid import cell_name, cell_table, edges_table
from isood.stages.splits import write_splits

pytestmark = pytest.mark.usefixtures("one_thread")


def _planted():
    """Two detectors on a 2 x 2 grid. In the sem-0 cells 30 leaking + 10 clean images, elsewhere 20 clean.
    'a' scores leaking images 0 (caught) and clean ones 0.75 (inside the ID range); 'b' the other way round.
    ID test scores: 50 values spread over [0.5, 1]."""
    rows, a, b, leak = [], [], [], []
    for c in (0, 1):
        for s in (0, 1):
            n_leak, n_clean = (30, 10) if s == 0 else (0, 20)
            for i in range(n_leak + n_clean):
                rows.append({"path": f"{c}{s}/{i}", "cov_level": c, "sem_level": s, "cell": cell_name(c, s)})
                is_leak = i < n_leak
                leak.append(is_leak)
                a.append(0.0 if is_leak else 0.75)
                b.append(0.75 if is_leak else 0.0)
    images = pd.DataFrame(rows)
    id_scores = np.linspace(0.5, 1.0, 50)
    scores = DetectorScores(scores={"a": {ID_TEST: id_scores, "splits": np.array(a)},
                                    "b": {ID_TEST: id_scores, "splits": np.array(b)}},
                            predictions={ID_TEST: np.zeros(50, int), "splits": np.zeros(len(images), int)},
                            labels={ID_TEST: None, "splits": None})
    cells = cell_table(images["cov_level"], images["sem_level"], n_levels=2, na_threshold=5)
    sets = {ID_TEST: EvalSet(ID_TEST, np.zeros(50, int)),
            "splits": EvalSet("splits", np.full(len(images), -1), images=images, cells=cells)}
    return scores, sets, np.array(leak), id_scores


def _auroc(id_s, ood_s):
    return roc_auc_score(np.r_[np.ones(len(id_s)), np.zeros(len(ood_s))], np.r_[id_s, ood_s])


def test_leak_free_metrics_and_ranking_on_planted_scores(tmp_path):
    scores, sets, leak, id_s = _planted()
    ev = evaluate_with_leaks(scores, sets, ["a", "b"], leaking={"splits": leak}, na_threshold=5, der=False)
    pc = ev.per_cell.set_index(["dataset", "detector", "cell"])
    assert set(ev.per_cell["images"]) == {"all", "leak_free"}
    images = sets["splits"].images
    for det in ("a", "b"):
        ood = scores.scores[det]["splits"]
        for cell in images["cell"].unique():
            sel = (images["cell"] == cell).to_numpy()
            assert pc.loc[("splits", det, cell), "auroc"] == pytest.approx(_auroc(id_s, ood[sel]))
            assert pc.loc[("splits-leak-free", det, cell), "auroc"] == pytest.approx(_auroc(id_s, ood[sel & ~leak]))
            assert pc.loc[("splits-leak-free", det, cell), "n"] == int((sel & ~leak).sum())
    eff = leak_effect(ev.per_cell).query("metric == 'auroc'").set_index(["detector", "cell"])["diff"]
    # b: leaking images were ID-like, so removing them raises AUROC exactly in the sem-0 cells; a: the reverse
    for cell in ("cov_0_sem_0", "cov_1_sem_0"):
        assert eff[("b", cell)] > 0 and eff[("a", cell)] < 0
    for cell in ("cov_0_sem_1", "cov_1_sem_1"):
        assert eff[("a", cell)] == 0 and eff[("b", cell)] == 0
    rank = leak_ranking(ev.per_cell, ["auroc"]).set_index(["scope", "key"])
    # with the leaks a beats b in the sem-0 cells (caught leaks), without them b wins everywhere
    assert rank.loc[("cell", "cov_0_sem_0"), "order_all"] == "a > b"
    assert rank.loc[("cell", "cov_0_sem_0"), "order_leak_free"] == "b > a"
    assert sorted(rank.index[(rank.index.get_level_values(0) == "cell") & rank["changed"]].get_level_values(1)) == [
        "cov_0_sem_0", "cov_1_sem_0"]
    assert bool(rank.loc[("sem_level", "0"), "changed"]) and not bool(rank.loc[("sem_level", "1"), "changed"])

    m = write_evaluation(ev, tmp_path / "ev", argv=["t"], metrics=["auroc"])
    view = manifests.read(tmp_path / "ev", kind="evaluation")
    assert set(view.tables) >= {"leak_effect", "leak_ranking"} and manifests.verify(m.root).ok
    for det in ("a", "b"):
        assert view.path(leak_diff_name("splits", det, "auroc")).is_file()
    assert "leak-free" in (tmp_path / "ev" / "summary.md").read_text()


def _outputs(root, name, wnids, logits):
    idx = pd.DataFrame({"path": [f"{w}/{name}_{i}.png" for i, w in enumerate(wnids)], "wnid": wnids})
    save_outputs(root / name, idx, logits=logits, features=np.eye(len(wnids), 4))
    return idx


# real WordNet classes: ID tench, goldfish, great white shark; fish (a hypernym of tench) and tench leak;
# bellows, clothes dryer, abattoir are clean OOD classes
ID = ["n01440764", "n01443537", "n01484850"]
LEAKING = ["n01440764", "n02512053"]
CLEAN = ["n02826259", "n03050655", "n02666943"]


def test_evaluate_leak_audit_end_to_end_with_precomputed_outputs(tmp_path):
    rng = np.random.default_rng(0)
    onehot = lambda w: np.eye(3)[ID.index(w)] if w in ID else np.eye(3)[0]  # noqa: E731
    train = [ID[i % 3] for i in range(30)]
    val = [ID[i % 3] for i in range(15)]
    _outputs(tmp_path, "train", train, rng.normal(0, 1, (30, 3)) + 5 * np.stack([onehot(w) for w in train]))
    val_logits = rng.normal(0, 1, (15, 3)) + 5 * np.stack([onehot(w) for w in val])
    _outputs(tmp_path, "val", val, val_logits)
    rows = []
    for c in (0, 1):
        for s in (0, 1):
            pool = LEAKING + CLEAN if s == 0 else CLEAN
            for i in range(16):
                w = pool[i % len(pool)]
                rows.append({"path": f"{w}/c{c}s{s}_{i}.png", "wnid": w, "d_sem": 0.1, "d_cov": 0.1,
                             "sem_level": s, "cov_level": c, "cell": cell_name(c, s)})
    images = pd.DataFrame(rows)
    write_splits(tmp_path / "splits", images=images, edges=edges_table([0, 1, 2], [0, 1, 2]), argv=["t"],
                 cells=cell_table(images["cov_level"], images["sem_level"], n_levels=2, na_threshold=4),
                 config={"test_root": str(tmp_path / "test"), "n_levels": 2, "na_threshold": 4})
    is_leak = images["wnid"].isin(LEAKING).to_numpy()
    # leaking images look like the ID class tench (confident), clean ones are flat
    t_logits = rng.normal(0, 1, (len(images), 3)) + 5 * is_leak[:, None] * np.eye(3)[0]
    save_outputs(tmp_path / "test", images[["path", "wnid"]], logits=t_logits, features=np.eye(len(images), 4))
    runner = CliRunner()
    r = runner.invoke(app, ["wordnet", "audit", str(tmp_path / "splits"), "--out", str(tmp_path / "audit")])
    assert r.exit_code == 0, r.output
    r = runner.invoke(app, ["evaluate", "--splits", str(tmp_path / "splits"), "--id-train", str(tmp_path / "train"),
                            "--id-test", str(tmp_path / "val"), "--detectors", "msp,maxlogit", "--na-threshold", "4",
                            "--plot-metrics", "auroc", "--leak-audit", str(tmp_path / "audit"),
                            "--out", str(tmp_path / "ev")])
    assert r.exit_code == 0, r.output
    ev = manifests.read(tmp_path / "ev", kind="evaluation")
    pc = ev.cell_metrics.set_index(["dataset", "detector", "cell"])
    def msp(z):
        e = np.exp(z - z.max(1, keepdims=True))
        return (e / e.sum(1, keepdims=True)).max(1)

    for cell in images["cell"].unique():
        sel = (images["cell"] == cell).to_numpy()
        free = M.auroc(msp(val_logits), msp(t_logits[sel & ~is_leak]))
        assert pc.loc[("splits-leak-free", "msp", cell), "auroc"] == pytest.approx(free)
        before = pc.loc[("splits", "msp", cell), "auroc"]
        if is_leak[sel].any():
            assert free > before + 0.1  # the ID-like leaks pulled AUROC down
        else:
            assert free == pytest.approx(before)
    scores = ev.frame("scores").query("dataset == 'splits'")
    assert scores["leak"].tolist() == images["wnid"].isin(LEAKING).tolist()
    assert {i["name"] for i in ev.meta["inputs"]} >= {"leak_audit", "splits_manifest"}
    eff = ev.frame("leak_effect")
    assert set(eff["cell"]) == set(images["cell"]) and set(eff["detector"]) == {"msp", "maxlogit"}
    html = (tmp_path / "ev" / "report.html").read_text()
    assert html.count('alt="msp: AUROC leak-free - all"') == 1

    # an audit without a verdict for one of the classes: one line naming it, nothing written
    partial = manifests.read(tmp_path / "audit", kind="audit")
    from isood.stages.wordnet.jobs import write_audit

    classes = partial.classes[partial.classes["wnid"] != CLEAN[0]]
    write_audit(tmp_path / "partial", classes=classes, config={"list": "x"}, argv=["t"])
    r = runner.invoke(app, ["evaluate", "--splits", str(tmp_path / "splits"), "--id-train", str(tmp_path / "train"),
                            "--id-test", str(tmp_path / "val"), "--detectors", "msp", "--na-threshold", "4",
                            "--leak-audit", str(tmp_path / "partial"), "--out", str(tmp_path / "ev2")])
    assert r.exit_code == 2 and CLEAN[0] in r.output and "Traceback" not in r.output
    assert not (tmp_path / "ev2" / "manifest.json").exists()
