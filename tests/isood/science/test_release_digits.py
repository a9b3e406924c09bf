"""The IS-OOD release's convention to the last printed digit, against a reimplementation of the release's own
code path written from its ``evaluate.py`` (``compute_all_metrics``: OOD positive, scores negated,
``roc_curve`` + ``auc``), ``calculate_metrics.py`` (``DataFrame(100 * metrics).to_csv(float_format='{:.2f}'.format)``)
and ``analyze_metrics.py`` (rows but the last 64 / the last 64, level means over the entries > 1e-16, centred
means, ``scipy.stats.pearsonr``, ``'{:.2f}'``), on tie-heavy grids where 1 ulp decides how ``.xx5`` rounds; the
rule for which runs get the release's results file; and the exact convention's constant level curves."""

import io
import warnings

import numpy as np
import pandas as pd
import pytest
from scipy.stats import pearsonr
from sklearn import metrics as skm

from isood.core.errors import IsoodWarning
from isood.science.cells import evaluate_cells
from isood.science.conventions import release_results_csv, release_results_files, table1
from isood.science.levels import all_level_curves, curve_statistics, summary_table
from isood.science.level_stats import level_correlation
from isood.science.grid import cell_name

pytestmark = pytest.mark.usefixtures("one_thread")

N = 8
DATASETS = ("imagenet21k", "SynIS")


def tie_heavy_grid(seed, n_id=400):
    """Integer scores (few distinct values, so many ties), ID test scores and per-cell OOD scores of an 8 x 8
    grid whose shift grows with both levels; some cells have fewer than 10 images (N/A)."""
    rng = np.random.default_rng(seed)
    id_s = rng.integers(0, 7, n_id).astype(np.float64)
    rows, scores = [], []
    for c in range(N):
        for s in range(N):
            n = int(rng.choice([5, 20, 25, 40, 50, 80]))
            scores.append(rng.integers(-(c + s) // 3 - 1, 7 - (c + s) // 3, n).astype(np.float64))
            rows += [{"cov_level": c, "sem_level": s, "cell": cell_name(c, s)}] * n
    return id_s, scores, pd.DataFrame(rows)


# ------------------------------------------------------------------------ the release's code path, re-typed
def release_compute_all_metrics(id_conf, ood_conf):
    """``evaluate.py``: ``[fpr, auroc, aupr_in, aupr_out]`` of ID (labels >= 0) vs OOD (label -1)."""
    conf = np.concatenate([id_conf, ood_conf])
    label = np.concatenate([np.zeros(len(id_conf), dtype=np.int64), -1 * np.ones(len(ood_conf), dtype=np.int64)])
    ood_indicator = np.zeros_like(label)
    ood_indicator[label == -1] = 1
    fpr_list, tpr_list, _ = skm.roc_curve(ood_indicator, -conf)
    fpr = fpr_list[np.argmax(tpr_list >= 0.95)]
    precision_in, recall_in, _ = skm.precision_recall_curve(1 - ood_indicator, conf)
    precision_out, recall_out, _ = skm.precision_recall_curve(ood_indicator, -conf)
    return [fpr, skm.auc(fpr_list, tpr_list), skm.auc(recall_in, precision_in), skm.auc(recall_out, precision_out)]


def release_results_text(grids):
    """``calculate_metrics.py``'s file: 64 rows per grid (N/A cells [0, 0, 0, 0]), x 100, '{:.2f}'."""
    metrics_list, index = [], []
    for id_s, scores, _ in grids:
        for k, x in enumerate(scores):
            metrics_list.append([0.0, 0.0, 0.0, 0.0] if len(x) < 10 else release_compute_all_metrics(id_s, x))
            index.append(cell_name(k // N, k % N))
    frame = pd.DataFrame(np.array(metrics_list) * 100, index=index, columns=["FPR@95", "AUROC", "AUPR_IN", "AUPR_OUT"])
    return frame.to_csv(float_format="{:.2f}".format)


def release_analyze(text, target_metric):
    """``analyze_metrics.py`` on a results file: {dataset: {axis: 'corr|sens'}} as it prints them."""
    all_result = text.splitlines(keepends=True)
    title = [t.strip() for t in all_result[0].split(",")]
    out = {}
    for target_dataset in DATASETS:
        results = all_result[1:-64] if target_dataset == "imagenet21k" else all_result[-64:]
        value_index = title.index(target_metric)
        output_dict: dict = {}
        for result in results:
            info = [t.strip() for t in result.split(",")]
            output_dict.setdefault(info[0][:5], []).append(info[value_index])
        all_values = np.array([[float(v) for v in vs] for vs in output_dict.values()])

        def cal_sensitivity(mean_array):
            i_list = np.array([i + 1 for i in range(mean_array.size)])
            mean_array = mean_array - mean_array.mean()
            i_list = i_list - i_list.mean()
            sensitivity = (mean_array * i_list).sum() / (i_list * i_list).sum()
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                corr_pearsonr, _ = pearsonr(mean_array, i_list)
            return sensitivity, corr_pearsonr

        with np.errstate(invalid="ignore", divide="ignore"):
            cov_mean = all_values.sum(axis=1) / np.greater(all_values, 1e-16).sum(axis=1)
            sem_mean = all_values.sum(axis=0) / np.greater(all_values, 1e-16).sum(axis=0)
        out[target_dataset] = {}
        for axis, mean in (("sem", sem_mean), ("cov", cov_mean)):
            sens, corr = cal_sensitivity(mean)
            out[target_dataset][axis] = "{:.2f}|{:.2f}".format(corr, abs(sens))
    return out


def _per_cell(grids, detector="msp"):
    parts = [evaluate_cells(id_s, np.concatenate(scores), images, detector=detector, dataset=ds)
             for ds, (id_s, scores, images) in zip(DATASETS, grids)]
    return pd.concat(parts, ignore_index=True)


# ------------------------------------------------------------------------------------------------ tests
@pytest.mark.parametrize("seeds", [(0, 4), (1, 5)])
def test_release_file_and_table1_match_the_release_digit_for_digit_on_tied_scores(seeds):
    grids = [tie_heavy_grid(s) for s in seeds]
    # the grids exercise the tie: the ID-positive AUROC prints another digit than the release in some cells
    flips = 0
    for id_s, scores, _ in grids:
        for x in scores:
            if len(x) >= 10:
                y = np.r_[np.ones(len(id_s)), np.zeros(len(x))]
                id_positive = skm.roc_auc_score(y, np.r_[id_s, x])
                flips += f"{100 * id_positive:.2f}" != f"{100 * release_compute_all_metrics(id_s, x)[1]:.2f}"
    assert flips >= 2
    per_cell = _per_cell(grids)
    text = release_results_csv(per_cell, "msp", list(DATASETS))
    assert text == release_results_text(grids)  # every cell, every metric, every digit
    summary = table1(per_cell, "release").set_index(["dataset", "axis", "metric"])
    for column, metric in (("FPR@95", "fpr95_openood"), ("AUROC", "auroc"), ("AUPR_IN", "aupr_in"),
                           ("AUPR_OUT", "aupr_out")):
        printed = release_analyze(text, column)
        for ds in DATASETS:
            for axis in ("sem", "cov"):
                row = summary.loc[(ds, axis, metric)]
                assert f"{row['correlation']:.2f}|{row['sensitivity']:.2f}" == printed[ds][axis], (ds, axis, metric)


def test_release_correlation_is_scipys_pearsonr_of_the_centred_means():
    from isood.science.conventions import release_line_fit

    rng = np.random.default_rng(7)
    for _ in range(200):
        means = np.round(rng.normal(80, 3, N), 2) + rng.integers(0, 2) * 1e-13
        i = np.array([k + 1 for k in range(N)])
        ref = pearsonr(means - means.mean(), i - i.mean())[0]
        assert release_line_fit(means)[0] == ref  # the same library call on the same operands: bit for bit


def test_release_results_file_only_for_the_releases_two_grids():
    g1, g2, g3 = (tie_heavy_grid(s) for s in (0, 1, 2))
    three = pd.concat([evaluate_cells(i, np.concatenate(s), im, detector="msp", dataset=ds)
                       for ds, (i, s, im) in zip(("a", "b", "c"), (g1, g2, g3))], ignore_index=True)
    for grids in (["a"], ["a", "b", "c"]):
        with pytest.warns(IsoodWarning, match=r"not written: .*exactly two") as told:
            assert release_results_files(three, grids, ["msp"]) == {}
        assert len(told) == 1 and "\n" not in str(told[0].message)
    small = three[(three["cov_level"] < 4) & (three["sem_level"] < 4)]
    with pytest.warns(IsoodWarning, match="16 cells"):
        assert release_results_files(small, ["a", "b"], ["msp"]) == {}
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        files = release_results_files(three, ["a", "b"], ["msp"])
    assert list(files) == ["results/msp.csv"] and len(files["results/msp.csv"].splitlines()) == 1 + 128
    # what the release's reader needs: its first grid is the rows but the last 64, its second the last 64
    frame = pd.read_csv(io.StringIO(files["results/msp.csv"]), index_col=0)
    assert frame.iloc[-64:]["AUROC"].tolist() == frame.iloc[64:]["AUROC"].tolist()


# ------------------------------------------------------------------------------- exact: constant level curves
def _constant_grid(value):
    """A per-cell table whose measured cells hold ``value`` up to a few units in its last place (a constant metric,
    rounded differently per cell); one cell of every level but the last is N/A (means of 7 or 8 cells)."""
    rows = []
    for c in range(N):
        for s in range(N):
            na = s == (c + 1) % N and c < N - 1
            v = value + (s % 3 + 2 * (c % 2)) * np.spacing(value)
            rows.append({"detector": "d", "dataset": "g", "cell": cell_name(c, s), "cov_level": c, "sem_level": s,
                         "n": 5 if na else 50, "n_id": 100, "na": na, "auroc": np.nan if na else v})
    return pd.DataFrame(rows)


def test_exact_convention_constant_level_curve_has_no_correlation():
    per_cell = _constant_grid(0.7)
    curves = all_level_curves(per_cell, ["auroc"])
    for axis in ("sem", "cov"):
        x = curves[curves["axis"] == axis].sort_values("level")["value"].to_numpy()
        assert len(set(x.tolist())) > 1 and np.ptp(x) < 1e-15  # the curve differs only in its last bits
        assert abs(np.corrcoef(np.arange(1, N + 1), x)[0, 1]) > 0.1  # and Pearson's r of those bits is not small
        assert np.isnan(level_correlation(x))
    summary = summary_table(per_cell, ["auroc"]).set_index("axis")
    assert summary["correlation"].isna().all() and (summary["sensitivity"] < 1e-15).all()
    # the bootstrap's curves (numpy means of 7 and of 8 equal values differ in the last bit for 0.7)
    seven, eight = np.full(7, 0.7).mean(), np.full(8, 0.7).mean()
    assert seven != eight
    curve = np.array([seven] * (N - 1) + [eight])
    reps = np.stack([curve, curve * 0.5, np.linspace(0.5, 0.9, N)], axis=1)
    corr, _ = curve_statistics(reps)
    assert np.isnan(corr[0]) and np.isnan(corr[1]) and corr[2] == pytest.approx(1.0)


# ----------------------------------------------------------------------------------- intervals on its scale
def _release_point(values_by_cell, levels_by_cell):
    """The release's (corr, sens) per axis of one replicate: {axis: ...} from {cell: fraction} via the release
    reader's arithmetic (``release_analyze``'s, on a grid built cell by cell)."""
    grid = np.zeros((N, N))
    for (c, s), v in zip(levels_by_cell, values_by_cell):
        grid[c, s] = float("{:.2f}".format(v * 100))
    out = {}
    with np.errstate(invalid="ignore", divide="ignore"):
        means = {"cov": grid.sum(axis=1) / np.greater(grid, 1e-16).sum(axis=1),
                 "sem": grid.sum(axis=0) / np.greater(grid, 1e-16).sum(axis=0)}
    for axis, mean in means.items():
        i = np.array([k + 1 for k in range(N)])
        yc, ic = mean - mean.mean(), i - i.mean()
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            corr = pearsonr(yc, ic)[0] if np.isfinite(mean).all() else np.nan
        out[axis] = (corr, abs((yc * ic).sum() / (ic * ic).sum()))
    return out


def test_release_bootstrap_intervals_are_on_its_own_scale_and_cover_openoods_fpr():
    from isood.science.cells import CellEvaluation
    from isood.science.bootstrap import bootstrap_replicates
    from isood.report.table1 import table1_markdown
    from isood.stages.evaluate.write import bootstrap_tables

    rng = np.random.default_rng(11)
    id_s = rng.normal(1.0, 1.0, 300).round(1)
    rows, scores = [], []
    for c in range(N):
        for s in range(N):
            n = 6 if (c, s) == (2, 5) else 30
            x = rng.normal(1.0 - 0.12 * (c + s), 1.0, n).round(1)
            rows += [{"dataset": "splits", "cell": cell_name(c, s), "cov_level": c, "sem_level": s}] * n
            scores.append(x)
    images = pd.DataFrame(rows)
    per_cell = evaluate_cells(id_s, np.concatenate(scores), images, detector="msp", dataset="splits")
    result = CellEvaluation(per_cell, convention="release")
    table = pd.concat([pd.DataFrame({"dataset": "id", "cell": "", "msp": id_s}),
                       images[["dataset", "cell"]].assign(msp=np.concatenate(scores))], ignore_index=True)
    got = bootstrap_tables(result, table, n_boot=50, seed=3, id_name="id")["table1_intervals"]
    got = got.set_index(["metric", "axis"])
    assert set(got.index.get_level_values("metric")) == {"auroc", "fpr95_openood"}
    # reference: every replicate's Table 1 by the release's rule, then the percentile interval
    measured = [k for k in range(N * N) if len(scores[k]) >= 10]
    reps = bootstrap_replicates(id_s, [scores[k] for k in measured], n_boot=50, seed=3,
                                metrics=("auroc", "fpr95_openood"))
    levels = [(k // N, k % N) for k in measured]
    point = table1(per_cell, "release").set_index(["metric", "axis"])
    for m in ("auroc", "fpr95_openood"):
        per_rep = [_release_point(reps[m][:, b], levels) for b in range(50)]
        for axis in ("sem", "cov"):
            for j, col in enumerate(("correlation", "sensitivity")):
                vals = np.array([r[axis][j] for r in per_rep])
                low, high = np.nanquantile(vals, [0.025, 0.975])
                row = got.loc[(m, axis)]
                assert row[f"{col}_low"] == pytest.approx(low, abs=1e-9)
                assert row[f"{col}_high"] == pytest.approx(high, abs=1e-9)
                assert row[col] == point.loc[(m, axis), col]
        # percent scale: the sensitivity interval brackets the point value's magnitude, not a fraction of it
        sens = got.loc[(m, "sem")]
        assert sens["sensitivity_high"] > 0.2 * sens["sensitivity"] and sens["sensitivity_high"] > 0.05
    text = table1_markdown(result, got.reset_index())
    assert text.count("[") == 8  # every value of FPR@95 (OpenOOD) and AUROC, both axes, has its interval
