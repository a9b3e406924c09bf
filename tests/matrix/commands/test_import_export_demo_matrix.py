"""The bad-input matrix, rows "options" of the other commands with counts: `isood import isood-lists` (``--levels``,
``--na-threshold``, ``--na-rule``), `isood export openood` (``--num-classes``) and `isood demo` (``--seed``).
Each row: exit 2, one line on stderr naming the option and value, no traceback, no ``manifest.json`` (and no
export) in ``--out``. The guard is named in the row id."""

from __future__ import annotations

from pathlib import Path

import pytest


@pytest.fixture(scope="module")
def release(tmp_path_factory) -> Path:
    """A 2 x 2 IS-OOD release folder: one list per cell, 3 images each."""
    root = tmp_path_factory.mktemp("release") / "imagenet21k"
    root.mkdir()
    for c in range(2):
        for s in range(2):
            (root / f"cov_{c}_sem_{s}.txt").write_text("".join(f"n01440764/n01440764_{c}{s}{i}.JPEG\n"
                                                               for i in range(3)))
    return root


@pytest.fixture(scope="module")
def imported(release, cli):
    out = release.parent / "splits"
    r = cli.invoke(["import", "isood-lists", release, "--out", out, "--levels", "2", "--na-threshold", "1"])
    assert r.exit_code == 0, r.output
    return out


IMPORT_ROWS = [
    pytest.param(["--levels", "0"], ["--levels", "0"], id="levels_0-release.import_isood_lists+scan_release"),
    pytest.param(["--levels", "-2"], ["--levels", "-2"], id="levels_neg-release.import_isood_lists+scan_release"),
    pytest.param(["--na-threshold", "-1"], ["--na-threshold", "-1"], id="na_threshold_neg-release.import_isood_lists"),
    pytest.param(["--na-rule", "nope"], ["--na-rule", "'nope'"], id="na_rule_unknown-release.scan_release"),
]


@pytest.mark.parametrize("extra, names", IMPORT_ROWS)
def test_import_isood_lists_bad_count(extra, names, release, cli, tmp_path):
    out = tmp_path / "out"
    line = cli.one_line_error(cli.invoke(["import", "isood-lists", release, "--out", out, "--levels", "2",
                                          "--na-threshold", "1", *extra]))
    assert all(n in line for n in names), line
    assert not (out / "manifest.json").exists()


@pytest.mark.parametrize("value", ["0", "-5"])
def test_export_openood_num_classes_below_1(value, imported, cli, tmp_path):
    """Guard: isood.stages.interop.openood.export_openood (num_classes >= 1)."""
    out = tmp_path / "export"
    line = cli.one_line_error(cli.invoke(["export", "openood", imported, "--out", out, "--num-classes", value]))
    assert "--num-classes" in line and value in line, line
    assert not out.exists() or not any(out.rglob("*.txt"))


def test_demo_negative_seed_before_anything_runs(cli, tmp_path):
    """Guard: isood.core.shared_options.seed_option, checked by the CLI before the class filter (numpy refuses negative seeds with
    a traceback)."""
    out = tmp_path / "demo"
    line = cli.one_line_error(cli.invoke(["demo", "--out", out, "--seed", "-1"]))
    assert "--seed" in line and "-1" in line, line
    assert not list(out.rglob("manifest.json"))
