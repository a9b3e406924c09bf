"""isood.science.grid: equal-width levels over a robust range, folding, binning on given edges, NaN, the 8x8 cell table
and the edges table."""
import inspect

import numpy as np
import pandas as pd
import pytest

from isood.core.defaults import QUANTILE_CLIP
from isood.core.errors import BadInputError, IsoodError
from isood.science.grid import (assign_levels, axis_edges, bin_with_edges, cell_name, cell_names, cell_table, edges_table,
                        level_edges)


def test_equal_width_over_observed_range_without_clip():
    v = np.array([0.0, 0.1, 0.2499, 0.25, 0.5, 0.74, 0.99, 1.0])
    levels, edges = assign_levels(v, n_levels=4, clip=(0.0, 1.0))
    np.testing.assert_allclose(edges, [0.0, 0.25, 0.5, 0.75, 1.0])
    # v in [edges[i], edges[i+1]) -> level i; the maximum falls into the last level
    assert levels.tolist() == [0, 0, 0, 1, 2, 2, 3, 3]


def test_default_clip_is_robust_and_folds_extremes_into_end_levels():
    rng = np.random.default_rng(0)
    v = np.concatenate([rng.uniform(0.0, 1.0, 1000), [-50.0, 80.0]])
    levels, edges = assign_levels(v)
    assert QUANTILE_CLIP == (0.01, 0.99)
    widths = np.diff(edges)
    np.testing.assert_allclose(widths, widths[0])
    assert len(edges) == 9
    # outliers do not stretch the range: edges stay near the 1st/99th percentile of the bulk
    assert -0.05 < edges[0] < 0.05 and 0.95 < edges[-1] < 1.05
    assert levels[-2] == 0 and levels[-1] == 7
    assert levels.min() == 0 and levels.max() == 7
    # every level of a uniform sample holds about 1/8 of the values
    counts = np.bincount(levels[:1000], minlength=8)
    assert counts.min() > 90 and counts.max() < 160


def test_nan_values_get_level_minus_one_and_do_not_move_edges():
    v = np.array([0.0, np.nan, 0.5, 1.0, np.inf])
    levels, edges = assign_levels(v, n_levels=2, clip=(0.0, 1.0))
    assert levels.tolist() == [0, -1, 1, 1, -1]
    np.testing.assert_allclose(edges, [0.0, 0.5, 1.0])


def test_edges_reuse_bins_another_set_on_the_same_scale():
    _, edges = assign_levels(np.linspace(0.2, 1.0, 101), n_levels=8, clip=(0.0, 1.0))
    other = np.array([0.0, 0.2, 0.31, 0.61, 0.99, 5.0])
    levels = bin_with_edges(other, edges)
    # width 0.1: 0.31 -> level 1, 0.61 -> level 4; below/above the edges fold to 0/7
    assert levels.tolist() == [0, 0, 1, 4, 7, 7]


@pytest.mark.parametrize("edges", [[1.0, 0.0, 2.0], [0.0], [0.0, np.nan, 1.0], [[0.0, 1.0]]])
def test_bin_with_edges_rejects_bad_edges(edges):
    with pytest.raises(BadInputError, match="non-decreasing 1-D array"):
        bin_with_edges([0.1], edges)


def test_bin_with_edges_levels_follow_the_edges():
    assert bin_with_edges([0.1, 3.5, 2.0, np.nan], [0, 1, 2, 3, 4]).tolist() == [0, 3, 2, -1]
    assert bin_with_edges([5.0, -1.0], [0.3, 0.3]).tolist() == [0, 0]  # degenerate edges: one level


def test_assign_levels_is_level_edges_then_bin_with_edges():
    v = np.random.default_rng(1).normal(size=300)
    levels, edges = assign_levels(v, 5, clip=(0.05, 0.9))
    np.testing.assert_array_equal(edges, level_edges(v, 5, clip=(0.05, 0.9)))
    np.testing.assert_array_equal(levels, bin_with_edges(v, edges))
    # an independent reference: the quantile range cut into 5 equal parts
    lo, hi = np.quantile(v, [0.05, 0.9])
    np.testing.assert_allclose(edges, lo + (hi - lo) * np.arange(6) / 5)
    params = inspect.signature(assign_levels).parameters
    assert "edges" not in params and params["clip"].kind is inspect.Parameter.KEYWORD_ONLY


def test_constant_values_and_all_nan():
    levels, edges = assign_levels(np.full(5, 0.3))
    assert levels.tolist() == [0] * 5 and np.all(edges == 0.3)
    with pytest.raises(IsoodError, match="no finite values"):
        assign_levels([np.nan, np.nan])
    with pytest.raises(IsoodError, match="clip must be"):
        assign_levels([0.1, 0.2], clip=(0.9, 0.1))


@pytest.mark.parametrize("kwargs", [{"n_levels": 0}, {"n_levels": 2.5}, {"clip": (0.1,)}, {"clip": "ab"}])
def test_assign_levels_rejects_bad_options_with_bad_input_error(kwargs):
    with pytest.raises(BadInputError):
        assign_levels([0.1, 0.2, 0.3], **kwargs)


@pytest.mark.parametrize("cov, sem, name", [(0, 7, "cov_0_sem_7"), (np.int64(3), 1, "cov_3_sem_1"),
                                             (7, 0, "cov_7_sem_0"), (-1, 2, "cov_-1_sem_2")])
def test_cell_name_is_zero_based_cov_then_sem(cov, sem, name):
    assert cell_name(cov, sem) == name
    assert cell_names([cov], [sem]) == [name]


def test_cell_names_is_vectorised_cell_name():
    rng = np.random.default_rng(0)
    cov, sem = rng.integers(-1, 8, 200), rng.integers(-1, 8, 200)
    got = cell_names(cov, sem)
    assert got == [cell_name(c, s) for c, s in zip(cov, sem)] and all(type(x) is str for x in got)
    assert cell_names([], []) == []
    with pytest.raises(BadInputError, match="differ in length"):
        cell_names([1, 2], [3])


def test_cell_table_counts_every_cell_and_flags_na():
    cov = np.array([0] * 10 + [7] * 9 + [2] * 3 + [-1, 5])
    sem = np.array([0] * 10 + [7] * 9 + [5] * 3 + [1, -1])
    t = cell_table(cov, sem, n_levels=8, na_threshold=10)
    assert len(t) == 64 and t["cell"].is_unique
    assert list(t.columns) == ["cell", "cov_level", "sem_level", "n", "na"]
    by = t.set_index("cell")
    assert by.loc["cov_0_sem_0", "n"] == 10 and not by.loc["cov_0_sem_0", "na"]
    assert by.loc["cov_7_sem_7", "n"] == 9 and by.loc["cov_7_sem_7", "na"]
    assert by.loc["cov_2_sem_5", "n"] == 3
    assert by.loc["cov_2_sem_5", "cov_level"] == 2 and by.loc["cov_2_sem_5", "sem_level"] == 5
    assert t["n"].sum() == 22  # the two rows with a -1 level are not counted
    assert t["na"].sum() == 63  # only cov_0_sem_0 reaches 10
    assert cell_table(cov, sem, na_threshold=3).set_index("cell").loc["cov_2_sem_5", "na"] == False  # noqa: E712


def test_cell_table_rejects_out_of_range_levels():
    with pytest.raises(IsoodError, match="levels must be in -1..7"):
        cell_table([8], [0])


def test_edges_table_layout_and_round_trip():
    sem, cov = np.array([0.1, 0.2, 0.4]), np.array([0.0, 0.5, 1.0])
    t = edges_table(sem, cov)
    expected = pd.DataFrame({"axis": ["sem", "sem", "cov", "cov"], "level": np.array([0, 1, 0, 1], np.int64),
                             "lower": [0.1, 0.2, 0.0, 0.5], "upper": [0.2, 0.4, 0.5, 1.0]})
    pd.testing.assert_frame_equal(t, expected)
    np.testing.assert_array_equal(axis_edges(t, "sem"), sem)
    np.testing.assert_array_equal(axis_edges(t.iloc[::-1], "cov"), cov)  # row order does not matter
    nan = edges_table(np.full(9, np.nan), np.full(9, np.nan))  # an import without shift values
    assert len(nan) == 16 and nan["lower"].isna().all()


@pytest.mark.parametrize("table, axis, match", [
    (edges_table([0, 1], [0, 1]), "depth", "unknown axis"),
    (edges_table([0, 1], [0, 1]).rename(columns={"lower": "value"}), "sem", "lacks column"),
    (edges_table([0, 1], [0, 1]).query("axis == 'sem'"), "cov", "no rows for axis 'cov'"),
])
def test_axis_edges_rejects_bad_tables(table, axis, match):
    with pytest.raises(BadInputError, match=match):
        axis_edges(table, axis)
