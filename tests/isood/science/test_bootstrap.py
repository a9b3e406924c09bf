"""Bootstrap 95% intervals per cell and in Table 1 (``metrics.bootstrap_replicates``,
``levels.curve_statistics`` / ``table1_intervals``, ``write.bootstrap_tables``), against brute-force references:
scikit-learn's ``roc_auc_score`` and isood's own ``fpr_at_tpr`` on the resampled arrays drawn by the documented
protocol, the scalar ``level_correlation`` / ``level_sensitivity`` per replicate, and the coverage of the true AUROC
of a planted distribution."""

import numpy as np
import pandas as pd
import pytest
from scipy.stats import norm
from sklearn.metrics import roc_auc_score

from isood.core.errors import BadInputError
from isood.evaluation import evaluate_scores
from isood.science.levels import curve_statistics, level_means
from isood.science.bootstrap import bootstrap_replicates, percentile_interval
from isood.science.level_stats import level_correlation, level_sensitivity
from isood.science.ood_metrics import fpr_at_tpr
from isood.stages.evaluate.write import bootstrap_tables, write_evaluation

pytestmark = pytest.mark.usefixtures("one_thread")


def reference(id_s, groups, n_boot, seed):
    """The documented draws, one resample at a time: AUROC by sklearn, FPR@95 by ``fpr_at_tpr``."""
    rng_id = np.random.default_rng([seed, 0])
    rngs = [np.random.default_rng([seed, g + 1]) for g in range(len(groups))]
    auroc = np.empty((len(groups), n_boot))
    fpr = np.empty((len(groups), n_boot))
    for b in range(n_boot):
        ids = id_s[rng_id.integers(0, len(id_s), len(id_s))]
        for g, ood in enumerate(groups):
            o = ood[rngs[g].integers(0, len(ood), len(ood))]
            auroc[g, b] = roc_auc_score(np.r_[np.ones(len(ids)), np.zeros(len(o))], np.r_[ids, o])
            fpr[g, b] = fpr_at_tpr(ids, o)
    return auroc, fpr


def test_replicates_equal_the_metrics_of_the_resampled_arrays():
    rng = np.random.default_rng(7)
    id_s = rng.normal(1.0, 1.0, 61).round(1)  # rounded: many ties, which AUROC counts one half
    groups = [rng.normal(0.0, 1.0, 23).round(1), rng.normal(0.6, 1.5, 40).round(1), np.full(12, 0.3)]
    got = bootstrap_replicates(id_s, groups, n_boot=40, seed=11)
    auroc, fpr = reference(id_s, groups, 40, 11)
    assert np.abs(got["auroc"] - auroc).max() < 1e-12
    assert np.abs(got["fpr95"] - fpr).max() < 1e-12
    # several detectors share every resample; chunks never change the draws
    two = bootstrap_replicates(np.vstack([id_s, -id_s]), [np.vstack([g, -g]) for g in groups], n_boot=40, seed=11)
    assert np.array_equal(two["auroc"][0], got["auroc"])
    assert np.allclose(two["auroc"][1], 1.0 - got["auroc"], atol=1e-12)  # negated scores flip the ranking
    import isood.science.bootstrap as B

    small = B._CHUNK_ELEMENTS
    try:
        B._CHUNK_ELEMENTS = 100  # one replicate per chunk
        assert np.array_equal(bootstrap_replicates(id_s, groups, n_boot=40, seed=11)["fpr95"], got["fpr95"])
    finally:
        B._CHUNK_ELEMENTS = small
    assert not np.array_equal(bootstrap_replicates(id_s, groups, n_boot=40, seed=12)["auroc"], got["auroc"])


def test_interval_covers_the_true_auroc_about_95_percent_of_the_time():
    """ID ~ N(1, 1), OOD ~ N(0, 1): the true AUROC is P(ID > OOD) = Phi(1 / sqrt(2)) = 0.760. Over 200 independent
    samples (n_id 150, n_ood 60), the percentile interval of 400 replicates must cover it in 88-99% of them (a
    binomial 95% band around 0.95 is 0.92-0.98; the percentile bootstrap undercovers a little at small n)."""
    truth = norm.cdf(1.0 / np.sqrt(2.0))
    rng = np.random.default_rng(2024)
    covered, widths = 0, []
    for trial in range(200):
        reps = bootstrap_replicates(rng.normal(1.0, 1.0, 150), [rng.normal(0.0, 1.0, 60)], n_boot=400,
                                    seed=trial, metrics=("auroc",))["auroc"][0]
        low, high = percentile_interval(reps)
        covered += low <= truth <= high
        widths.append(high - low)
    assert 0.88 <= covered / 200 <= 0.99, covered
    # the width matches the AUROC's sampling spread (Hanley-McNeil standard error ~0.036 here: width ~4 SE)
    assert 0.10 < np.median(widths) < 0.18


def test_percentile_interval_and_bad_input():
    low, high = percentile_interval(np.arange(101.0))
    assert (low, high) == (pytest.approx(2.5), pytest.approx(97.5))
    low, high = percentile_interval(np.array([[np.nan, np.nan], [1.0, 3.0]]), axis=1)
    assert np.isnan(low[0]) and low[1] == pytest.approx(1.05)
    with pytest.raises(BadInputError, match="cannot bootstrap autc"):
        bootstrap_replicates([1.0], [[0.0]], metrics=("autc",))
    with pytest.raises(BadInputError, match="n_boot must be an integer >= 1"):
        bootstrap_replicates([1.0], [[0.0]], n_boot=0)
    with pytest.raises(BadInputError, match="non-finite"):
        bootstrap_replicates([1.0, np.nan], [[0.0]])


def test_curve_statistics_equal_the_scalar_ones_per_replicate():
    rng = np.random.default_rng(3)
    curves = rng.normal(size=(8, 30))
    curves[2] = np.nan  # an N/A level keeps the others' indices
    curves[:, 5] = 0.7  # a constant replicate: no correlation
    corr, sens = curve_statistics(curves)
    for b in range(30):
        ref_c, ref_s = level_correlation(curves[:, b]), level_sensitivity(curves[:, b])
        assert (np.isnan(corr[b]) and np.isnan(ref_c)) or corr[b] == pytest.approx(ref_c, abs=1e-12)
        assert sens[b] == pytest.approx(ref_s, abs=1e-12)
    means = level_means(np.array([[1.0, 2.0], [3.0, 4.0], [5.0, 6.0]]), [0, 0, 2], 4)
    assert np.array_equal(means[[0, 2]], [[2.0, 3.0], [5.0, 6.0]]) and np.isnan(means[[1, 3]]).all()


@pytest.fixture(scope="module")
def grid_result():
    """A 3 x 3 grid (cov_2_sem_2 N/A with 4 images), two detectors, and its per-image scores table."""
    rng = np.random.default_rng(0)
    cov, sem = np.meshgrid(np.arange(3), np.arange(3), indexing="ij")
    counts = np.full((3, 3), 25)
    counts[2, 2] = 4
    cov, sem = np.repeat(cov.ravel(), counts.ravel()), np.repeat(sem.ravel(), counts.ravel())
    images = pd.DataFrame({"cov_level": cov, "sem_level": sem, "cell": [f"cov_{c}_sem_{s}" for c, s in zip(cov, sem)]})
    ood = rng.normal(-0.7 * sem, 1.0)
    idd = rng.normal(0.0, 1.0, 80)
    result = evaluate_scores({"msp": idd, "energy": 3 * idd}, {"msp": ood, "energy": 3 * ood + cov}, images,
                             dataset="splits")
    scores = pd.concat([pd.DataFrame({"dataset": "id_test", "cell": "", "msp": idd, "energy": 3 * idd}),
                        pd.DataFrame({"dataset": "splits", "cell": images["cell"], "msp": ood,
                                      "energy": 3 * ood + cov})], ignore_index=True)
    return result, scores, images, idd, ood


def test_intervals_of_an_evaluation_against_a_loop_reference(grid_result):
    result, scores, images, idd, ood = grid_result
    tables = bootstrap_tables(result, scores, n_boot=60, seed=5, id_name="id_test")
    ci, t1 = tables["cell_intervals"], tables["table1_intervals"]
    measured = result.per_cell[~result.per_cell["na"]]
    assert len(ci) == 2 * len(measured) and "cov_2_sem_2" not in set(ci["cell"])  # N/A: no interval
    msp = measured[measured["detector"] == "msp"]
    cells = list(dict.fromkeys(msp["cell"]))
    auroc, fpr = reference(idd, [ood[images["cell"] == c] for c in cells], 60, 5)
    for metric, reps in (("auroc", auroc), ("fpr95", fpr)):
        rows = ci[(ci["detector"] == "msp") & (ci["metric"] == metric)].set_index("cell").loc[cells]
        assert np.allclose(rows["low"], np.quantile(reps, 0.025, axis=1), atol=1e-12)
        assert np.allclose(rows["high"], np.quantile(reps, 0.975, axis=1), atol=1e-12)
        assert np.allclose(rows["value"], msp.set_index("cell").loc[cells, metric], atol=0)
        assert ((rows["low"] <= rows["value"] + 1e-9) | (rows["high"] >= rows["value"] - 1e-9)).all()
    # Table 1: the correlation of every replicate's semantic level curve, by the scalar function
    sem_levels = msp.set_index("cell").loc[cells, "sem_level"].to_numpy()
    curves = np.array([[auroc[sem_levels == lv, b].mean() for lv in range(3)] for b in range(60)])
    ref = np.array([level_correlation(c) for c in curves])
    row = t1[(t1["detector"] == "msp") & (t1["axis"] == "sem") & (t1["metric"] == "auroc")].iloc[0]
    assert row["correlation_low"] == pytest.approx(np.nanquantile(ref, 0.025), abs=1e-12)
    assert row["correlation_high"] == pytest.approx(np.nanquantile(ref, 0.975), abs=1e-12)
    summary = result.summary.query("detector == 'msp' and axis == 'sem' and metric == 'auroc'").iloc[0]
    assert row["correlation"] == summary["correlation"] and row["n_boot"] == 60
    # one seed, the same intervals; no scores rows for a cell: no interval rather than a wrong one
    assert bootstrap_tables(result, scores, n_boot=60, seed=5, id_name="id_test")["cell_intervals"].equals(ci)
    short = scores.drop(index=scores.index[scores["cell"] == "cov_0_sem_0"][0])
    assert bootstrap_tables(result, short, n_boot=10, id_name="id_test")["cell_intervals"].empty


def test_written_evaluation_holds_the_intervals_and_table1_in_the_paper_layout(grid_result, tmp_path):
    result, scores, *_ = grid_result
    scores = scores.assign(label=-1, prediction=0, correct=False, path="p")
    m = write_evaluation(result, tmp_path / "ev", scores=scores, bootstrap=50)
    ci, t1 = m.frame("cell_intervals"), m.frame("table1_intervals")
    assert len(ci) and len(t1) and (ci["n_boot"] == 50).all() and m.meta["summary"]["bootstrap"] == 50
    tex = (tmp_path / "ev/results/table1.tex").read_text()
    rows = [ln for ln in tex.splitlines() if ln.startswith(("msp &", "energy &"))]
    assert len(rows) == 2 and all(ln.count("&") == 8 and ln.endswith(r"\\") for ln in rows)
    assert tex.count("{") == tex.count("}") and r"\multicolumn{4}{c}{FPR@95}" in tex and r"\tiny" in tex
    msp = t1.query("detector == 'msp' and metric == 'fpr95' and axis == 'sem'").iloc[0]
    assert rows[0].startswith(f"msp & {msp['correlation']:.2f}{{\\tiny\\,[{msp['correlation_low']:.2f}, "
                              f"{msp['correlation_high']:.2f}]}} & {msp['sensitivity']:.2f}")
    md = (tmp_path / "ev/results/table1.md").read_text().splitlines()
    head = md[2].strip("|").split("|")
    assert [h.strip() for h in head[:3]] == ["detector", "FPR@95 semantic corr", "FPR@95 semantic sens"]
    cells = [c.strip() for c in md[4].strip("|").split("|")]
    assert cells[1] == f"{msp['correlation']:.2f} [{msp['correlation_low']:.2f}, {msp['correlation_high']:.2f}]"
    html = (tmp_path / "ev/report.html").read_text()
    assert "Per-cell bootstrap intervals" in html and 'class="ci"' in html
    none = write_evaluation(result, tmp_path / "ev0", scores=scores, bootstrap=0)
    assert "cell_intervals" not in none.meta["tables"] and r"\tiny" not in (tmp_path / "ev0/results/table1.tex").read_text()
    with pytest.raises(BadInputError, match="--bootstrap must be an integer >= 0"):
        write_evaluation(result, tmp_path / "ev1", scores=scores, bootstrap=-1)


def test_leak_free_cells_resample_the_images_without_leaks(grid_result):
    """A leak audit's ``<dataset>-leak-free`` rows come from the base dataset's scores without the flagged
    images: their intervals equal those of the same images evaluated as a dataset of their own."""
    from isood.science.cells import CellEvaluation
    from isood.science.levels import ALL_IMAGES, LEAK_FREE

    result, scores, images, idd, ood = grid_result
    leak = np.zeros(len(scores), bool)
    leak[np.flatnonzero(scores["dataset"] == "splits")[::4]] = True  # every 4th OOD image leaks
    keep = ~leak[scores["dataset"].to_numpy() == "splits"]
    free = evaluate_scores({"msp": idd, "energy": 3 * idd},
                           {"msp": ood[keep], "energy": (3 * ood + images["cov_level"].to_numpy())[keep]},
                           images[keep].reset_index(drop=True), dataset="splits-leak-free")
    both = CellEvaluation(pd.concat([result.per_cell.assign(images=ALL_IMAGES),
                                     free.per_cell.assign(images=LEAK_FREE)], ignore_index=True))
    got = bootstrap_tables(both, scores.assign(leak=leak), n_boot=30, seed=1, id_name="id_test")["cell_intervals"]
    alone = bootstrap_tables(free, scores[~leak].replace({"splits": "splits-leak-free"}), n_boot=30, seed=1,
                             id_name="id_test")["cell_intervals"]
    mine = got[got["dataset"] == "splits-leak-free"].reset_index(drop=True)
    assert len(mine) == len(alone) > 0
    pd.testing.assert_frame_equal(mine, alone.reset_index(drop=True))


def test_openood_fpr_replicates_equal_openoods_procedure_on_the_resampled_arrays():
    """``fpr95_openood`` (the release convention's FPR@95): scikit-learn's ``drop_intermediate`` on every resample,
    tied and untied scores, against ``fpr_at_tpr(convention='openood')`` on the arrays the documented draws give."""
    rng = np.random.default_rng(3)
    cases = [(rng.integers(0, 6, 50).astype(float), [rng.integers(-3, 4, n).astype(float) for n in (20, 41, 12)]),
             (rng.normal(1.0, 1.0, 37), [rng.normal(0.0, 1.0, n) for n in (15, 30)]),
             (rng.normal(0.0, 1.0, 30).round(0), [np.full(11, 0.0), rng.normal(-2.0, 1.0, 25).round(0)]),
             (np.arange(40.0), [np.arange(40.0), np.arange(0.0, 40.0, 2.0)])]  # one ID and one OOD per score
    differs = 0
    for id_s, groups in cases:
        got = bootstrap_replicates(id_s, groups, n_boot=60, seed=5, metrics=("fpr95", "fpr95_openood"))
        rng_id = np.random.default_rng([5, 0])
        rngs = [np.random.default_rng([5, g + 1]) for g in range(len(groups))]
        for b in range(60):
            ids = id_s[rng_id.integers(0, len(id_s), len(id_s))]
            for g, ood in enumerate(groups):
                o = ood[rngs[g].integers(0, len(ood), len(ood))]
                assert got["fpr95_openood"][g, b] == fpr_at_tpr(ids, o, convention="openood"), (g, b)
                differs += got["fpr95_openood"][g, b] != got["fpr95"][g, b]
    assert differs > 0  # the resamples exercise the dropped points
