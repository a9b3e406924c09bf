"""The per-set table beside Table 1 (``results/sets.md``, ``results/sets.tex``): read back, its numbers are the
manifest's ``set_metrics`` in percent, its near / far means OpenOOD's (the mean of scikit-learn's AUROC over the
group's sets)."""

import numpy as np
import pandas as pd
import pytest
from sklearn.metrics import roc_auc_score

import manifests
from isood.evaluation import evaluate_scores
from isood.science.sets import evaluate_set, set_table
from isood.stages.evaluate.write import write_evaluation

pytestmark = pytest.mark.usefixtures("one_thread")

SETS = {"ssb": ("near", 1.0), "ninco": ("near", 0.5), "inat": ("far", 2.0), "odd|one": ("", 0.2)}


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    rng = np.random.default_rng(3)
    id_scores = {d: rng.normal(0, 1, 80) for d in ("msp", "energy")}
    ood = {s: {d: rng.normal(-shift * (1 + (d == "energy")), 1, 40 + 5 * i) for d in id_scores}
           for i, (s, (_, shift)) in enumerate(SETS.items())}
    rows = [evaluate_set(id_scores[d], ood[s][d], detector=d, dataset=s, group=g, kind="list")
            for d in id_scores for s, (g, _) in SETS.items()]
    per_set = set_table(rows)
    cov, sem = np.meshgrid(np.arange(2), np.arange(2), indexing="ij")
    images = pd.DataFrame({"cov_level": np.repeat(cov.ravel(), 12), "sem_level": np.repeat(sem.ravel(), 12)})
    cells = evaluate_scores(id_scores, {d: rng.normal(-1, 1, 48) for d in id_scores}, images, dataset="splits")
    out = tmp_path_factory.mktemp("sets") / "ev"
    write_evaluation(cells, out, metrics=["auroc"], bootstrap=0, set_metrics=per_set)
    return out, id_scores, ood


def _read_markdown(text: str) -> dict[str, pd.DataFrame]:
    """Each ``### <metric>`` table of the markdown as a frame (detector index, set columns, floats; N/A NaN)."""
    tables, name, lines = {}, None, []
    for line in [*text.splitlines(), "### end"]:
        if line.startswith("### "):
            if name is not None:
                head = [c.strip().replace("\\|", "|") for c in lines[0].strip("|").split(" | ")]
                body = [[c.strip() for c in ln.strip().strip("|").split(" | ")] for ln in lines[2:]]
                frame = pd.DataFrame(body, columns=head).set_index("detector")
                tables[name] = frame.replace("N/A", np.nan).astype(float)
            name, lines = line[4:], []
        elif line.startswith("|"):
            lines.append(line)
    return tables


def test_markdown_read_back_equals_the_set_metrics_table(run):
    out, id_scores, ood = run
    m = manifests.read(out, kind="evaluation")
    per_set = m.frame("set_metrics")
    tables = _read_markdown((out / "results" / "sets.md").read_text())
    assert list(tables) == ["FPR@95 (%)", "AUROC (%)"]
    fpr, auroc = tables["FPR@95 (%)"], tables["AUROC (%)"]
    # OpenOOD's column order: near sets, nearood, far sets, farood, then the sets in no group
    assert list(auroc.columns) == ["ssb", "ninco", "nearood", "inat", "farood", "odd|one"]
    for table, metric in ((auroc, "auroc"), (fpr, "fpr95")):
        expected = per_set.pivot(index="detector", columns="dataset", values=metric) * 100
        assert np.allclose(table.to_numpy(), expected.loc[table.index, table.columns].to_numpy(), atol=0.005 + 1e-9)
    for det in id_scores:  # the group means against scikit-learn, ID as the positive class
        near = np.mean([roc_auc_score(np.r_[np.ones(80), np.zeros(len(ood[s][det]))],
                                      np.r_[id_scores[det], ood[s][det]]) for s in ("ssb", "ninco")])
        assert abs(auroc.loc[det, "nearood"] - 100 * near) <= 0.005 + 1e-9
    tex = (out / "results" / "sets.tex").read_text()
    assert tex.count(r"\begin{tabular}") == 1 and r"\textit{nearood}" in tex and r"odd|one" in tex
    for det in id_scores:
        row = next(ln for ln in tex.splitlines() if ln.startswith(f"{det} & "))
        values = [float(v) for v in row.rstrip(r" \\").split(" & ")[1:]]
        assert np.allclose(values, [*fpr.loc[det], *auroc.loc[det]], atol=1e-9)
