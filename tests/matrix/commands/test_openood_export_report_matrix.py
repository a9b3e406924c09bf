"""Bad input to `isood export openood` (the OpenOOD data root of several benchmarks, ID
lists, the OOD val split, near/far) and to `isood compare`. Each row: exit 2, one line on stderr naming the option
and value, no traceback, and nothing written (an earlier export in --out unchanged). The guard is named in the
row id."""

from __future__ import annotations

import json
from pathlib import Path

import pytest


@pytest.fixture(scope="module")
def grid(tmp_path_factory, cli) -> Path:
    """A 2 x 2 splits manifest imported from release lists (cells of 3, 12, 12 and 0 images)."""
    root = tmp_path_factory.mktemp("rel") / "imagenet21k"
    root.mkdir()
    for (c, s), n in {(0, 0): 3, (0, 1): 12, (1, 0): 12, (1, 1): 0}.items():
        (root / f"cov_{c}_sem_{s}.txt").write_text("".join(f"n0144{c}{s}64/n0144{c}{s}64_{i}.JPEG\n" for i in range(n)))
    out = root.parent / "splits"
    assert cli.invoke(["import", "isood-lists", root, "--out", out, "--levels", "2"]).exit_code == 0
    return out


@pytest.fixture(scope="module")
def image_list(tmp_path_factory, cli) -> Path:
    base = tmp_path_factory.mktemp("list")
    (base / "ood.txt").write_text("n09990000/a.JPEG\nn09990001/b.JPEG\n")
    assert cli.invoke(["import", "imagenet-ood", base / "ood.txt", "--out", base / "ood"]).exit_code == 0
    return base / "ood"


@pytest.fixture(scope="module")
def id_files(tmp_path_factory) -> Path:
    base = tmp_path_factory.mktemp("id")
    (base / "mixed.txt").write_text("val/ILSVRC2012_val_00000001.JPEG 3\nval/ILSVRC2012_val_00000002.JPEG\n")
    (base / "big.txt").write_text("val/a.JPEG 3\nval/b.JPEG 1000\n")  # label 1000 of 1000 classes
    for w in ("n01440764", "n01443537"):
        (base / "in1k/train" / w).mkdir(parents=True)
        (base / "in1k/train" / w / f"{w}_1.JPEG").touch()
    return base


def _snapshot(folder: Path) -> dict:
    return {p.relative_to(folder): p.read_bytes() for p in folder.rglob("*") if p.is_file()} if folder.exists() else {}


ROWS = [  # (extra args, substrings of the one line); guard in the id
    pytest.param(["--near-below", "2"], ["--near-below 2", "1..1"], id="near_below_out_of_grid-openood_info.GroupRule"),
    pytest.param(["--near-axis", "semantic"], ["--near-axis 'semantic'", "sem", "cov"],
                 id="near_axis_unknown-openood_info.GroupRule"),
    pytest.param(["--val-cells", "cov_2_sem_0"], ["--val-cells 'cov_2_sem_0'", "2x2"],
                 id="val_cell_outside-openood._held_out"),
    pytest.param(["--val-cells", "cell7"], ["cell7", "cov_{c}_sem_{s}"], id="val_cell_malformed-grid.parse_cell_name"),
    pytest.param(["--val-cells", "cov_1_sem_1"], ["--val-cells cov_1_sem_1", "no image"],
                 id="val_cells_empty-openood._export_grid"),
    pytest.param(["--id-test", "{id}/big.txt"], ["--id-test", "big.txt:2", "label 1000"],
                 id="id_label_out_of_range-id_lists.id_labels"),
    pytest.param(["--id-test", "{id}/mixed.txt"], ["--id-test", "mixed.txt:2", "no class label and no wnid"],
                 id="id_line_without_label-id_lists.id_labels"),
    pytest.param(["--id-val", "{id}/missing"], ["--id-val", "missing", "does not exist"],
                 id="id_source_missing-id_lists.read_id_source"),
    pytest.param(["--id-train", "{id}/in1k/train", "--id-root", "{id}/elsewhere"], ["--id-train", "--id-root"],
                 id="id_folder_outside_root-id_lists.read_id_source"),
    pytest.param(["--num-classes", "10"], ["--num-classes 10", "1000"], id="num_classes_differs-openood_info.merge_info"),
    pytest.param(["--group", "far"], ["--group far", "--near-axis"], id="group_of_a_grid-openood.export_openood"),
]


@pytest.mark.parametrize("extra, names", ROWS)
def test_export_bad_option_writes_nothing(extra, names, grid, id_files, cli, tmp_path):
    out = tmp_path / "out"
    assert cli.invoke(["export", "openood", grid, "--out", out, "--name", "first", "--num-classes", "1000"]).exit_code == 0
    before = _snapshot(out)
    extra = [a.replace("{id}", str(id_files)) for a in extra]
    line = cli.one_line_error(cli.invoke(["export", "openood", grid, "--out", out, "--name", "second", *extra]))
    assert all(n in line for n in names), line
    assert _snapshot(out) == before


def test_a_second_val_split_is_refused(grid, image_list, cli, tmp_path):
    """Guard: isood.stages.interop.openood.export_openood (OpenOOD takes one OOD val split)."""
    out = tmp_path / "out"
    assert cli.invoke(["export", "openood", grid, "--out", out, "--val-cells", "cov_0_sem_1"]).exit_code == 0
    before = _snapshot(out)
    line = cli.one_line_error(cli.invoke(["export", "openood", image_list, "--out", out, "--group", "val"]))
    assert "OOD val split comes from 'imagenet21k'" in line, line
    assert _snapshot(out) == before
    ok = cli.invoke(["export", "openood", grid, "--out", out])  # re-exported without it: the list may be the val
    assert ok.exit_code == 0, ok.output
    assert cli.invoke(["export", "openood", image_list, "--out", out, "--group", "val"]).exit_code == 0
    info = json.loads((out / "openood_data_info.json").read_text())
    assert info["data_info"]["ood"]["val"]["imglist_path"] == "benchmark_imglist/ood/val_ood.txt"


@pytest.mark.parametrize("args, names", [
    pytest.param(["{list}", "--val-cells", "cov_0_sem_0"], ["--val-cells", "--group val"],
                 id="val_cells_of_a_list-openood.export_openood"),
    pytest.param(["{list}", "--group", "test"], ["--group 'test'", "near, far or val"],
                 id="group_unknown-openood_info.GroupRule"),
    pytest.param([], ["nothing to export", "--id-train"], id="nothing-openood.export_openood"),
    pytest.param(["{list}", "--near-below", "2"], ["--near-below", "--group"], id="near_below_of_a_list-openood.export_openood"),
    pytest.param(["{list}", "--name", "../x"], ["--name '../x'"], id="name_unsafe-openood.export_openood"),
])
def test_export_refusals(args, names, image_list, cli, tmp_path):
    out = tmp_path / "out"
    args = [a.replace("{list}", str(image_list)) for a in args]
    line = cli.one_line_error(cli.invoke(["export", "openood", *args, "--out", out]))
    assert all(n in line for n in names), line
    assert not out.exists()


def test_out_inside_the_manifest_is_refused(image_list, cli):
    """Guard: isood.stages.interop.openood._read_manifest (an --out inside an input)."""
    out = image_list / "export"
    line = cli.one_line_error(cli.invoke(["export", "openood", image_list, "--out", out]))
    assert "inside the manifest" in line and not out.exists()


# ====================================================================================== isood compare
@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> list[Path]:
    """Two evaluation manifests written by ``write_evaluation`` (2 detectors, a 2 x 2 grid)."""
    import numpy as np
    import pandas as pd

    from isood.evaluation import evaluate_scores
    from isood.stages.evaluate.write import write_evaluation

    base = tmp_path_factory.mktemp("runs")
    rng = np.random.default_rng(0)
    images = pd.DataFrame({"cov_level": np.repeat([0, 0, 1, 1], 12), "sem_level": np.repeat([0, 1, 0, 1], 12)})
    out = []
    for name in ("a", "b"):
        ood, idd = rng.normal(-images["sem_level"].to_numpy(), 1.0), rng.normal(0.0, 1.0, 40)
        result = evaluate_scores({"msp": idd, "energy": idd}, {"msp": ood, "energy": ood + 0.5}, images,
                                 dataset="splits")
        out.append(write_evaluation(result, base / name, metrics=["auroc"], bootstrap=0).root)
    return out


COMPARE_ROWS = [  # (extra args, substrings); {a} {b} are the runs, {grid} a splits manifest
    pytest.param(["--rank-by", "accuracy"], ["--rank-by 'accuracy'", "auroc"], id="rank_by_unknown-compare.compare_runs"),
    pytest.param(["--rank-by", "der95"], ["--rank-by 'der95'", "no run has it"], id="rank_by_absent-compare.leaderboard"),
    pytest.param(["--names", "x"], ["--names lists 1 names for 2 runs"], id="names_count-compare._labels"),
    pytest.param(["--names", "x,x"], ["--names x,x", "differ"], id="names_twice-compare._labels"),
    pytest.param(["{grid}"], ["'splits' manifest", "'evaluation'"], id="run_not_an_evaluation-manifests.read"),
    pytest.param(["{a}/nope"], ["nope"], id="run_missing-manifests.read"),
]


@pytest.mark.parametrize("extra, names", COMPARE_ROWS)
def test_compare_bad_input(extra, names, runs, grid, cli, tmp_path):
    out = tmp_path / "lb"
    extra = [a.replace("{grid}", str(grid)).replace("{a}", str(runs[0])) for a in extra]
    args = [*map(str, runs), *extra] if not extra or extra[0].startswith("--") else [str(runs[0]), *extra]
    line = cli.one_line_error(cli.invoke(["compare", *args, "--out", out]))
    assert all(n in line for n in names), line
    assert not out.exists()


@pytest.mark.parametrize("where", ["holds_other_files", "is_a_manifest", "inside_a_run"])
def test_compare_out_is_refused(where, runs, grid, cli, tmp_path):
    """Guard: isood.stages.compare.stage._check_out (never overwrite what isood compare did not write)."""
    out = {"holds_other_files": tmp_path / "busy", "is_a_manifest": grid, "inside_a_run": runs[0] / "lb"}[where]
    if where == "holds_other_files":
        out.mkdir()
        (out / "leaderboard.csv").write_text("mine\n")
    before = _snapshot(out)
    line = cli.one_line_error(cli.invoke(["compare", *map(str, runs), "--out", out]))
    assert "--out" in line and str(out.name) in line, line
    assert _snapshot(out) == before and not (out / "leaderboard.md").exists()
