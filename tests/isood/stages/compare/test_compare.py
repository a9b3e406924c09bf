"""`isood compare RUN...`, a leaderboard across evaluation runs (``isood.stages.compare``), against the runs' own
tables and an independent ranking (scipy's ``rankdata``); runs made with other settings flagged, a run given twice
compared once."""

import shutil
import warnings

import numpy as np
import pandas as pd
import pytest
from scipy.stats import rankdata
from typer.testing import CliRunner

import manifests
from isood.cli import app
from isood.core.errors import IsoodWarning
from isood.evaluation import evaluate_scores
from isood.stages.evaluate.write import write_evaluation
from isood.stages.compare import LEADERBOARD_CSV, LEADERBOARD_MD, MARKER, compare_runs

pytestmark = pytest.mark.usefixtures("one_thread")


def _run(out, seed, shift, *, benchmark="b" * 64, temperature=1.0, settings=None):
    """An evaluation of two detectors on a 3 x 3 grid; ``shift`` moves energy's separation."""
    rng = np.random.default_rng(seed)
    cov, sem = np.meshgrid(np.arange(3), np.arange(3), indexing="ij")
    cov, sem = np.repeat(cov.ravel(), 15), np.repeat(sem.ravel(), 15)
    images = pd.DataFrame({"cov_level": cov, "sem_level": sem})
    ood, idd = rng.normal(-0.6 * sem, 1.0), rng.normal(0.0, 1.0, 60)
    result = evaluate_scores({"msp": idd, "energy": idd}, {"msp": ood, "energy": ood - shift}, images,
                             dataset="splits")
    inputs = [manifests.input_record("splits_manifest", "/s", sha256=benchmark),
              manifests.input_record("id_test", "/id", sha256="c" * 64)]
    config = {"detector_params": {"msp": {"temperature": temperature}, "energy": {"temperature": 1.0}},
              "na_threshold": 10, "table_convention": "exact", **(settings or {})}
    return write_evaluation(result, out, inputs=inputs, metrics=["auroc"], summary={"model": f"model{seed}"},
                            bootstrap=0, config=config)


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    base = tmp_path_factory.mktemp("runs")
    return [_run(base / "a" / "ev", 0, 1.0).root, _run(base / "b" / "ev", 1, -0.5).root,
            _run(base / "c", 2, 0.0, benchmark="d" * 64).root]


def test_leaderboard_ranks_every_run_by_its_own_tables(runs, tmp_path):
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        r = compare_runs(runs[:2], tmp_path / "lb")
    assert not [w for w in caught if issubclass(w.category, IsoodWarning)]  # same benchmark, same ID set
    board = r.board
    assert list(board["run"].unique()) != [] and set(board["run"]) == {"a/ev", "b/ev"}  # folder names, disambiguated
    expected = []
    for label, root in zip(("a/ev", "b/ev"), runs[:2]):
        m = manifests.read(root, kind="evaluation")
        means = m.frame("detector_means").assign(run=label)
        t1 = m.frame("table1").query("metric == 'auroc' and axis == 'sem'").set_index("detector")
        means["auroc_sem_corr"] = means["detector"].map(t1["correlation"])
        means["model"] = m.meta["summary"]["model"]
        expected.append(means)
    expected = pd.concat(expected, ignore_index=True)
    expected["rank"] = rankdata(-expected["auroc"], method="min").astype(int)
    got = board.set_index(["run", "detector"]).sort_index()
    ref = expected.set_index(["run", "detector"]).sort_index()
    assert (got["rank"] == ref["rank"]).all() and np.allclose(got["auroc"], ref["auroc"])
    assert np.allclose(got["auroc_sem_corr"], ref["auroc_sem_corr"]) and (got["model"] == ref["model"]).all()
    assert list(board["rank"]) == sorted(board["rank"])  # best first
    assert (board["benchmark_sha256"] == "b" * 64).all() and (board["run_sha256"].str.len() == 64).all()
    csv = pd.read_csv(tmp_path / "lb" / LEADERBOARD_CSV)
    assert np.allclose(csv["auroc"], board["auroc"], rtol=1e-5) and list(csv["detector"]) == list(board["detector"])
    md = (tmp_path / "lb" / LEADERBOARD_MD).read_text()
    assert md.startswith(MARKER) and "## splits" in md and md.count("| splits |") == 0
    best = board.iloc[0]
    assert f"| 1 | {best['run']} | {best['model']} | {best['detector']} |" in md
    # lower-is-better metrics rank ascending
    fpr = compare_runs(runs[:2], tmp_path / "lb", rank_by="fpr95").board
    assert list(fpr["rank"]) == list(rankdata(fpr["fpr95"], method="min").astype(int))


def test_runs_on_different_benchmarks_are_flagged(runs, tmp_path):
    with pytest.warns(IsoodWarning, match="dataset 'splits' was evaluated on different benchmark manifests"):
        r = compare_runs(runs, tmp_path / "lb", names=["one", "two", "three"])
    assert len(r.notes) == 1 and "three (dddddddddddd)" in r.notes[0]
    assert "> **Note:** dataset 'splits'" in (tmp_path / "lb" / LEADERBOARD_MD).read_text()


def test_cli_writes_the_leaderboard_and_rewrites_its_own_folder(runs, tmp_path):
    runner = CliRunner()
    out = tmp_path / "lb"
    for _ in range(2):  # an earlier leaderboard is replaced
        res = runner.invoke(app, ["compare", *map(str, runs[:2]), "--out", str(out), "--names", "x,y"])
        assert res.exit_code == 0, res.output
    assert "best by auroc" in res.stdout and sorted(p.name for p in out.iterdir()) == [LEADERBOARD_CSV, LEADERBOARD_MD]


def test_detector_params_are_read_back_and_different_settings_flagged(runs, tmp_path):
    """``detector_params`` in a run's config is read back (``EvaluationView.detector_params``): each row says the
    settings it ran with, and the same detector run with other settings in another run is flagged."""
    other = _run(tmp_path / "hot", 3, 1.0, temperature=1000.0).root
    view = manifests.read(other, kind="evaluation")
    assert view.detector_params == {"msp": {"temperature": 1000.0}, "energy": {"temperature": 1.0}}
    with pytest.warns(IsoodWarning, match="detector 'msp' ran with different hyper-parameters") as caught:
        r = compare_runs([runs[0], other], tmp_path / "lb", names=["cold", "hot"])
    assert not [w for w in caught if "'energy'" in str(w.message)]  # same settings: no note
    params = r.board.set_index(["run", "detector"])["params"]
    assert params[("hot", "msp")] == "temperature=1000.0" and params[("cold", "msp")] == "temperature=1.0"
    assert len(r.notes) == 1 and "cold: temperature=1.0" in r.notes[0] and "hot: temperature=1000.0" in r.notes[0]


def test_runs_with_another_na_threshold_or_convention_are_flagged(runs, tmp_path):
    other = _run(tmp_path / "na2", 0, 1.0, settings={"na_threshold": 2, "table_convention": "release"}).root
    with pytest.warns(IsoodWarning, match=r"different settings \(na_threshold: strict=10, loose=2; "
                                          r"table_convention: strict=exact, loose=release\)") as caught:
        r = compare_runs([runs[0], other], tmp_path / "lb", names=["strict", "loose"])
    assert len([w for w in caught if "settings" in str(w.message)]) == 1  # one line for every setting that differs
    settings = r.board.drop_duplicates("run").set_index("run")["settings"]
    assert settings["strict"] == "na_threshold=10, table_convention=exact"
    assert settings["loose"] == "na_threshold=2, table_convention=release"
    md = (tmp_path / "lb" / LEADERBOARD_MD).read_text()
    assert "> **Note:** the runs were made with different settings" in md and "| settings |" in md
    assert "na_threshold=2, table_convention=release" in md
    with warnings.catch_warnings():  # the same settings: no note, no column in the markdown
        warnings.simplefilter("error")
        same = compare_runs(runs[:2], tmp_path / "lb2")
    assert not any("settings" in n for n in same.notes)
    assert "| settings |" not in (tmp_path / "lb2" / LEADERBOARD_MD).read_text()


def test_the_same_run_given_twice_is_compared_once(runs, tmp_path):
    copy = tmp_path / "copy"
    shutil.copytree(runs[0], copy)  # the same content under another path and name
    for given, names in (([runs[0], runs[0], runs[1]], None), ([runs[0], copy, runs[1]], ["a", "a-again", "b"])):
        with pytest.warns(IsoodWarning, match="is the same evaluation as"):
            r = compare_runs(given, tmp_path / "lb", names=names)
        board = r.board
        assert not board.duplicated(["run_sha256", "detector", "dataset"]).any()
        assert board["run"].nunique() == 2 and len(board) == 4
        ranks = board.groupby("dataset")["rank"].apply(lambda x: int((x == 1).sum()))
        assert (ranks == 1).all()  # one best row per dataset, not a repeated one
        assert len([n for n in r.notes if "compared once" in n]) == 1


def test_cli_counts_take_the_singular_for_one(runs, tmp_path):
    """One run with one detector reads '1 row from 1 run', two runs read '... from 2 runs'."""
    one = tmp_path / "one"
    shutil.copytree(runs[0], one)
    res = CliRunner().invoke(app, ["compare", str(one), "--out", str(tmp_path / "lb1")])
    assert res.exit_code == 0, res.output
    n_det = len(manifests.read(one, kind="evaluation").frame("detector_means"))
    assert f"splits: {n_det} rows from 1 run;" in res.stdout and "1 runs" not in res.stdout
    res = CliRunner().invoke(app, ["compare", *map(str, runs[:2]), "--out", str(tmp_path / "lb2")])
    assert f"splits: {2 * n_det} rows from 2 runs;" in res.stdout


def test_the_evaluate_console_shows_no_nan():
    """A correlation that does not exist (a constant level curve) reads 'n/a' in the console table, not '+nan'."""
    from isood.cli.evaluate import signed

    assert signed(float("nan")) == "n/a"
    assert signed(0.5) == "+0.50" and signed(-1.0) == "-1.00"
