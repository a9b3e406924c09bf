"""Table 1 by the IS-OOD release's rule and its results file, against an independent
implementation of that rule written from its description (README / ARCHITECTURE: per-cell values in percent rounded
to 0.01, N/A stored as 0, per level the mean over the entries > 1e-16, sensitivity = |least-squares slope| over
levels 1..n, correlation = Pearson, printed with 2 decimals); the file against pandas' own ``to_csv`` as the release
writes it; per-set rows against scikit-learn."""

import io

import numpy as np
import pandas as pd
import pytest
from scipy.stats import pearsonr
from sklearn.metrics import auc, precision_recall_curve, roc_auc_score

from isood.science.cells import CellEvaluation, evaluate_cells
from isood.science.conventions import RELEASE_METRICS, release_results_csv, release_summary, table1
from isood.science.sets import evaluate_set, set_table
from isood.science.grid import cell_name

pytestmark = pytest.mark.usefixtures("one_thread")

N = 8
RELEASE_COLUMNS = ["FPR@95", "AUROC", "AUPR_IN", "AUPR_OUT"]


def _grid_scores(seed, n_zero=8, n_na=5):
    """ID scores and OOD scores per cell of an 8 x 8 grid: the OOD shift grows with both levels; ``n_zero``
    cells lie wholly below the ID scores (FPR@95 = 0 exactly), ``n_na`` cells have fewer than 10 images."""
    rng = np.random.default_rng(seed)
    id_s = rng.normal(0.0, 1.0, 400)
    cells = [(c, s) for c in range(N) for s in range(N)]
    order = rng.permutation(len(cells))
    zero = {cells[i] for i in order[:n_zero]}
    na = {cells[i] for i in order[n_zero:n_zero + n_na]}
    rows, scores = [], []
    for c, s in cells:
        n = 6 if (c, s) in na else int(rng.integers(12, 40))
        x = (id_s.min() - 1.0 - rng.random(n)) if (c, s) in zero else rng.normal(-0.15 * (c + s), 1.0, n)
        rows += [{"cov_level": c, "sem_level": s, "cell": cell_name(c, s)}] * n
        scores.append(x)
    return id_s, np.concatenate(scores), pd.DataFrame(rows), zero, na


def _per_cell(seed, detector="msp", dataset="imagenet21k", **kw):
    id_s, ood_s, images, zero, na = _grid_scores(seed, **kw)
    return evaluate_cells(id_s, ood_s, images, detector=detector, dataset=dataset), zero, na


# ------------------------------------------------------------------------------------ the independent rule
def reference_values(per_cell, metric):
    """8 x 8 values (cov rows, sem columns) as the release stores them: percent, 2 decimals, N/A -> 0."""
    grid = np.zeros((N, N))
    for r in per_cell.itertuples():
        v = getattr(r, metric)
        grid[r.cov_level, r.sem_level] = 0.0 if r.na or np.isnan(v) else round(100 * v, 2)
    return grid


def reference_table1(grid):
    """{axis: (correlation, sensitivity)} of a stored grid: level means over the entries > 1e-16."""
    out = {}
    for axis, values in (("sem", grid.T), ("cov", grid)):  # rows of ``values`` = the levels of the axis
        means = np.array([row[row > 1e-16].mean() for row in values])
        levels = np.arange(1, N + 1)
        slope = np.polyfit(levels, means, 1)[0]
        out[axis] = (pearsonr(means, levels)[0], abs(slope))
    return out


def parse_results(text, part):
    """The 8 x 8 grid of ``part`` ('first': the rows after the header but the last 64, 'last': the last 64) of
    each column of a release results file."""
    frame = pd.read_csv(io.StringIO(text), index_col=0)
    rows = frame.iloc[:-64] if part == "first" else frame.iloc[-64:]
    grids = {}
    for col in frame.columns:
        g = np.zeros((N, N))
        for name, v in rows[col].items():
            c, s = int(name.split("_")[1]), int(name.split("_")[3])
            g[c, s] = v
        grids[col] = g
    return grids


# ------------------------------------------------------------------------------------------------ tests
def test_release_table1_equals_the_independent_rule_and_differs_from_exact():
    per_cell, zero, na = _per_cell(0)
    assert (per_cell.set_index(["cov_level", "sem_level"]).loc[sorted(zero), "fpr95_openood"] == 0).all()
    got = release_summary(per_cell).set_index(["axis", "metric"])
    exact = table1(per_cell, "exact").set_index(["axis", "metric"])
    for metric in RELEASE_METRICS.values():
        ref = reference_table1(reference_values(per_cell, metric))
        for axis, (corr, sens) in ref.items():
            row = got.loc[(axis, metric)]
            assert row["correlation"] == pytest.approx(corr, abs=1e-12)
            assert row["sensitivity"] == pytest.approx(sens, abs=1e-10)
            assert f"{row['correlation']:.2f}|{row['sensitivity']:.2f}" == f"{corr:.2f}|{sens:.2f}"
    # FPR@95 = 0 cells drop out of the release's means but are measured by the exact rule: the numbers differ
    fpr_exact, fpr_release = exact.loc[("sem", "fpr95_openood")], got.loc[("sem", "fpr95_openood")]
    assert abs(fpr_release["sensitivity"] - 100 * fpr_exact["sensitivity"]) > 0.05


def test_results_file_is_what_the_release_writes_and_reads_back_to_the_same_table1():
    ood, _, _ = _per_cell(1, dataset="imagenet21k")
    syn, _, _ = _per_cell(2, dataset="SynIS")
    per_cell = pd.concat([ood, syn], ignore_index=True)
    text = release_results_csv(per_cell, "msp", ["imagenet21k", "SynIS"])
    # the release's writer: a frame in percent (N/A rows 0) written by pandas with float_format '{:.2f}'.format
    values = []
    for part in (ood, syn):
        for r in part.sort_values(["cov_level", "sem_level"]).itertuples():
            values.append([0.0 if r.na else 100 * getattr(r, m) for m in RELEASE_METRICS.values()])
    index = [cell_name(c, s) for c in range(N) for s in range(N)] * 2
    expected = pd.DataFrame(values, index=index, columns=RELEASE_COLUMNS).to_csv(float_format="{:.2f}".format)
    assert text == expected and len(text.splitlines()) == 129
    # read back the release's way: ImageNet-21K first, Syn-IS the last 64 rows
    release = table1(per_cell, "release").set_index(["dataset", "axis", "metric"])
    for ds, part in (("imagenet21k", "first"), ("SynIS", "last")):
        grids = parse_results(text, part)
        for col, metric in RELEASE_METRICS.items():
            for axis, (corr, sens) in reference_table1(grids[col]).items():
                row = release.loc[(ds, axis, metric)]
                assert (row["correlation"], row["sensitivity"]) == pytest.approx((corr, sens), abs=1e-10)


def test_cell_evaluation_follows_its_convention():
    per_cell, _, _ = _per_cell(3)
    assert CellEvaluation(per_cell).summary.equals(table1(per_cell, "exact"))
    rel = CellEvaluation(per_cell, convention="release")
    assert rel.summary.equals(release_summary(per_cell)) and rel.levels.equals(CellEvaluation(per_cell).levels)
    with pytest.raises(ValueError, match="release"):
        CellEvaluation(per_cell, convention="paper")


def test_a_level_of_zeros_is_nan_as_the_release_divides():
    per_cell, _, _ = _per_cell(4, n_zero=0, n_na=0)
    per_cell.loc[per_cell["sem_level"] == 3, "na"] = True  # a whole semantic level N/A: 0 / 0
    row = release_summary(per_cell, ["auroc"]).set_index("axis").loc["sem"]
    assert np.isnan(row["correlation"]) and np.isnan(row["sensitivity"]) and row["n_levels"] == N - 1


def test_per_set_rows_against_sklearn_and_openood_group_means():
    rng = np.random.default_rng(5)
    id_s = rng.normal(1.0, 1.0, 300)
    sets = {"a": ("near", rng.normal(0.2, 1.0, 80)), "b": ("near", rng.normal(0.5, 1.0, 50)),
            "c": ("far", rng.normal(-1.0, 1.0, 60)), "d": ("", rng.normal(0.0, 1.0, 40))}
    rows = [evaluate_set(id_s, x, detector=det, dataset=name, group=g)
            for det in ("msp", "energy") for name, (g, x) in sets.items()]
    table = set_table(rows)
    assert table[table["detector"] == "msp"]["dataset"].tolist() == ["a", "b", "nearood", "c", "farood", "d"]
    y = lambda x: np.r_[np.ones(id_s.size), np.zeros(x.size)]  # noqa: E731  (ID = positive, AUPR-In)
    for name, (_, x) in sets.items():
        r = table[(table["detector"] == "msp") & (table["dataset"] == name)].iloc[0]
        assert r["auroc"] == pytest.approx(roc_auc_score(y(x), np.r_[id_s, x]), abs=1e-12)
        p, rc, _ = precision_recall_curve(y(x), np.r_[id_s, x])
        assert r["aupr_in"] == pytest.approx(auc(rc, p), abs=1e-12) and r["n"] == x.size and r["n_id"] == 300
    near = table[(table["detector"] == "msp") & table["dataset"].isin(["a", "b"])]
    mean = table[(table["detector"] == "msp") & (table["dataset"] == "nearood")].iloc[0]
    assert mean["auroc"] == pytest.approx(near["auroc"].mean()) and mean["kind"] == "mean" and mean["n"] == 130
    with pytest.raises(ValueError, match="group"):
        evaluate_set(id_s, sets["a"][1], group="middle")
