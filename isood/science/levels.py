"""What is derived from a per-cell table (``cells.evaluate_cells``): level curves, Table 1 (IS-OOD) and the
per-detector means. Pure functions over DataFrames.

A level's value is the mean of a metric over the level's non-N/A cells; an all-N/A level keeps its place (NaN),
so level ``i`` is always the i-th level of the grid (IS-OOD, Sec. 4).

Leak-aware evaluation (``isood evaluate --leak-audit``): a grid dataset ``X`` is scored twice, on all its images
(``images`` = ``all``) and on its leak-free images only (dataset ``X-leak-free``, ``images`` = ``leak_free``).
``leak_effect`` pairs the two per cell and metric (``diff`` = leak-free minus all); ``leak_ranking`` compares the
detectors' ranking with and without the leaking images per cell, per level and over the cell means (Kendall's
tau between the two orderings, and whether the order changed).
"""

from __future__ import annotations

from typing import Iterable, Sequence

import numpy as np
import pandas as pd

from isood.core.errors import BadInputError

from .bootstrap import percentile_interval
from .level_stats import is_constant, level_correlation, level_sensitivity
from .metrics import METRICS, lower_is_better

__all__ = [
    "AXES", "axis_name", "metric_columns", "metric_choices", "one_dataset", "level_curves", "all_level_curves",
    "summary_table", "detector_means", "LEVEL_COLUMNS", "SUMMARY_COLUMNS", "ALL_IMAGES", "LEAK_FREE", "leak_free_name",
    "leak_pairs", "leak_effect", "detector_order", "measured_in_both", "leak_ranking", "LEAK_EFFECT_COLUMNS",
    "RANKING_COLUMNS", "level_means", "curve_statistics", "INTERVAL_COLUMNS", "TABLE1_INTERVAL_COLUMNS", "interval_row",
    "cell_intervals", "table1_intervals",
]

#: axis -> the per-cell column holding its level
AXES = {"sem": "sem_level", "cov": "cov_level"}
_AXIS_ALIASES = {"sem": "sem", "semantic": "sem", "sem_level": "sem", "cov": "cov", "covariate": "cov",
                 "cov_level": "cov"}
LEVEL_COLUMNS = ["detector", "dataset", "axis", "level", "metric", "value", "n_cells"]
SUMMARY_COLUMNS = ["detector", "dataset", "axis", "metric", "correlation", "sensitivity", "first", "last",
                   "n_levels"]


def axis_name(axis: str) -> str:
    """'sem' or 'cov' for an axis name or alias ('semantic', 'covariate', 'sem_level', ...)."""
    try:
        return _AXIS_ALIASES[str(axis).lower()]
    except KeyError:
        raise BadInputError(f"unknown axis {axis!r}: pass 'sem' (semantic) or 'cov' (covariate)") from None


def metric_columns(per_cell: pd.DataFrame) -> list[str]:
    """The registered metric columns present (with at least one value) in a per-cell table, in table order."""
    return [m for m in METRICS if m in per_cell.columns and per_cell[m].notna().any()]


def metric_choices(per_cell: pd.DataFrame) -> str:
    """The end of a message naming a metric the per-cell table has no values of: "pass one of" the metrics it
    has, or, when it has none (never an empty list), why and what to do."""
    have = metric_columns(per_cell)
    if have:
        return f"pass one of {', '.join(have)}"
    if len(per_cell) and "na" in per_cell.columns and per_cell["na"].astype(bool).all():
        return ("no metric has a value: every cell is N/A (fewer images than the N/A threshold); lower "
                "--na-threshold or add images")
    return "no metric has a value in any cell; check that the datasets hold images"


def one_dataset(rows: pd.DataFrame, dataset: str | None = None, owner: str = "") -> pd.DataFrame:
    """The rows of ``dataset``; with none named, all rows when they hold a single dataset, else an error
    (``owner``, e.g. "detector 'msp' has ", prefixes the message)."""
    if dataset is not None:
        return rows[rows["dataset"] == dataset]
    if rows["dataset"].nunique() > 1:
        raise BadInputError(f"{owner}several datasets ({', '.join(rows['dataset'].unique())}): pass dataset=")
    return rows


def _keyed(per_cell: pd.DataFrame) -> pd.DataFrame:
    """The table with ``detector`` / ``dataset`` columns (defaults 'scores' / 'test' when absent)."""
    df = per_cell
    if "detector" not in df.columns:
        df = df.assign(detector="scores")
    if "dataset" not in df.columns:
        df = df.assign(dataset="test")
    return df


def level_curves(per_cell: pd.DataFrame, metric: str = "auroc", axis: str = "sem") -> pd.DataFrame:
    """Per-level values of ``metric`` along ``axis`` ('sem' or 'cov'): the mean over the level's non-N/A cells.

    One row per (detector, dataset, level) with ``value`` (NaN when every cell of that level is N/A) and
    ``n_cells`` (the non-N/A cells averaged). Levels are those of the grid in ``per_cell`` (N/A cells included).
    """
    if metric not in per_cell.columns:
        raise BadInputError(f"metric {metric!r} is not in the per-cell table: {metric_choices(per_cell)}")
    return _curves(per_cell, [metric], [axis_name(axis)])


def _axis_curves(df: pd.DataFrame, metrics: Sequence[str], ax: str) -> pd.DataFrame:
    """The level curves of every metric along one axis (unordered)."""
    keys = ["detector", "dataset"]
    col = AXES[ax]
    measured = ~df["na"].astype(bool)
    grid = df[keys + [col]].drop_duplicates()  # every level of the grid, N/A cells included
    long = df.loc[measured, keys + [col] + list(metrics)].melt(id_vars=keys + [col], var_name="metric")
    stats = long.groupby(keys + [col, "metric"], sort=False)["value"].agg(["mean", "count"])
    full = grid.merge(pd.DataFrame({"metric": list(metrics)}), how="cross")
    full = full.merge(stats.reset_index(), on=keys + [col, "metric"], how="left")
    full = full.rename(columns={col: "level", "mean": "value", "count": "n_cells"})
    full["axis"] = ax
    return full


def _curves(per_cell: pd.DataFrame, metrics: Sequence[str], axes: Sequence[str]) -> pd.DataFrame:
    df = _keyed(per_cell)
    if df.empty or not metrics:
        return pd.DataFrame(columns=LEVEL_COLUMNS)
    out = pd.concat([_axis_curves(df, metrics, ax) for ax in axes], ignore_index=True)
    out["n_cells"] = out["n_cells"].fillna(0).astype(np.int64)
    out["level"] = out["level"].astype(np.int64)
    out["value"] = out["value"].astype(np.float64)
    # order: axis, metric (given order), detector/dataset as first seen, level
    det_order = {k: i for i, k in enumerate(dict.fromkeys(zip(df["detector"], df["dataset"])))}
    out["_g"] = [det_order[k] for k in zip(out["detector"], out["dataset"])]
    out["_a"] = out["axis"].map({a: i for i, a in enumerate(axes)})
    out["_m"] = out["metric"].map({m: i for i, m in enumerate(metrics)})
    out = out.sort_values(["_a", "_m", "_g", "level"], kind="stable")
    return out[LEVEL_COLUMNS].reset_index(drop=True)


def all_level_curves(per_cell: pd.DataFrame, metrics: Sequence[str] | None = None) -> pd.DataFrame:
    """``level_curves`` for every metric (default: all present) and both axes, stacked."""
    metrics = list(metrics) if metrics is not None else metric_columns(per_cell)
    return _curves(per_cell, metrics, list(AXES))


def summary_table(per_cell: pd.DataFrame, metrics: Sequence[str] | None = None) -> pd.DataFrame:
    """Table 1 (IS-OOD): per detector, dataset, axis and metric the Pearson correlation between the level curve
    and the level index (``metrics.level_correlation``) and its sensitivity = |least-squares slope|
    (``metrics.level_sensitivity``); plus the curve's first and last defined values and the number of levels with
    a value. Levels are indexed 1..n in grid order; N/A levels are skipped, keeping the others' indices."""
    metrics = list(metrics) if metrics is not None else metric_columns(per_cell)
    rows = []
    curves = all_level_curves(per_cell, metrics)
    for (det, ds, ax, name), g in curves.groupby(["detector", "dataset", "axis", "metric"], sort=False):
        x = g.sort_values("level")["value"].to_numpy(dtype=np.float64)
        defined = x[np.isfinite(x)]
        rows.append({
            "detector": det, "dataset": ds, "axis": ax, "metric": name,
            "correlation": level_correlation(x), "sensitivity": level_sensitivity(x),
            "first": float(defined[0]) if defined.size else np.nan,
            "last": float(defined[-1]) if defined.size else np.nan,
            "n_levels": int(defined.size),
        })
    return pd.DataFrame(rows, columns=SUMMARY_COLUMNS)


# ------------------------------------------------------------------------------------------ bootstrap intervals
INTERVAL_COLUMNS = ["detector", "dataset", "cell", "metric", "value", "low", "high", "n_boot"]
TABLE1_INTERVAL_COLUMNS = ["detector", "dataset", "axis", "metric", "correlation", "correlation_low",
                           "correlation_high", "sensitivity", "sensitivity_low", "sensitivity_high", "n_boot"]


def level_means(values: np.ndarray, levels: Sequence[int], n_levels: int) -> np.ndarray:
    """Per level, the mean of the rows of ``values`` (cells x replicates) whose level it is (pure): an
    ``(n_levels, replicates)`` array, NaN for a level without a row (an all-N/A level keeps its place)."""
    v = np.asarray(values, dtype=np.float64)
    lev = np.asarray(levels, dtype=np.int64)
    out = np.full((int(n_levels), v.shape[1]), np.nan)
    for level in range(int(n_levels)):
        rows = v[lev == level]
        if len(rows):
            out[level] = rows.mean(axis=0)
    return out


def curve_statistics(curves: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``metrics.level_correlation`` and ``metrics.level_sensitivity`` of every column of ``curves`` (levels x
    replicates), vectorised (pure): a level that is NaN in every column is skipped keeping the others' indices
    1..n; NaN where fewer than two levels are left or (correlation) a column is constant (``metrics.is_constant``)."""
    c = np.asarray(curves, dtype=np.float64)
    keep = np.isfinite(c).all(axis=1)
    i = np.arange(1, c.shape[0] + 1, dtype=np.float64)[keep]
    x = c[keep]
    if len(i) < 2:
        nan = np.full(c.shape[1], np.nan)
        return nan, nan.copy()
    di = (i - i.mean())[:, None]
    dx = x - x.mean(axis=0)
    cov = (di * dx).sum(axis=0)
    slope = np.abs(cov / (di ** 2).sum())
    spread = np.sqrt((di ** 2).sum() * (dx ** 2).sum(axis=0))
    constant = is_constant(x, axis=0)
    with np.errstate(invalid="ignore", divide="ignore"):
        corr = np.where(constant, np.nan, cov / spread)
    return corr, slope


def cell_intervals(cells: pd.DataFrame, replicates: dict[str, np.ndarray], *, level: float = 0.95) -> pd.DataFrame:
    """The per-cell intervals of one detector and dataset (pure): ``cells`` (detector, dataset, cell per row)
    with ``replicates[metric]`` (rows x n_boot, row order of ``cells``) and the point values in ``cells[metric]``
    -> one row per cell and metric (``INTERVAL_COLUMNS``: percentile interval at ``level``)."""
    parts = []
    for m, reps in replicates.items():
        low, high = percentile_interval(reps, level, axis=1)
        parts.append(pd.DataFrame({"detector": cells["detector"].to_numpy(), "dataset": cells["dataset"].to_numpy(),
                                   "cell": cells["cell"].to_numpy(), "metric": m,
                                   "value": cells[m].to_numpy(dtype=np.float64), "low": low, "high": high,
                                   "n_boot": np.int64(reps.shape[1])}))
    return pd.concat(parts, ignore_index=True) if parts else pd.DataFrame(columns=INTERVAL_COLUMNS)


def table1_intervals(cells: pd.DataFrame, replicates: dict[str, np.ndarray], n_levels: int, *,
                     summary: pd.DataFrame | None = None, level: float = 0.95) -> pd.DataFrame:
    """Table 1's intervals of one detector and dataset (pure): for each metric and axis the correlation and
    sensitivity of every replicate's level curve (``level_means`` of the measured ``cells``' replicates, rows
    as in ``cell_intervals``; ``curve_statistics``) and their percentile intervals at ``level``; the point values
    from ``summary`` (``summary_table``) when given, else from the cells' own values."""
    det, ds = cells["detector"].iloc[0], cells["dataset"].iloc[0]
    rows = []
    for m, reps in replicates.items():
        for ax, col in AXES.items():
            levels = cells[col].to_numpy(dtype=np.int64)
            corr, sens = curve_statistics(level_means(reps, levels, n_levels))
            point = level_means(cells[[m]].to_numpy(dtype=np.float64), levels, n_levels)[:, 0]
            rows.append(interval_row((det, ds, ax, m), (level_correlation(point), level_sensitivity(point)),
                                     (corr, sens), summary=summary, level=level))
    return pd.DataFrame(rows, columns=TABLE1_INTERVAL_COLUMNS)


def interval_row(key: tuple[str, str, str, str], point: tuple[float, float], stats: tuple[np.ndarray, np.ndarray], *,
                 summary: pd.DataFrame | None, level: float) -> dict:
    """One row of Table 1's intervals for ``key`` = (detector, dataset, axis, metric): the point (correlation,
    sensitivity), taken from ``summary`` when it has the row, and the percentile intervals at ``level`` of the
    replicates' ``stats`` (correlations, sensitivities)."""
    det, ds, ax, m = key
    pc, ps = (float(x) for x in point)
    if summary is not None:
        s = summary[(summary["detector"] == det) & (summary["dataset"] == ds) & (summary["metric"] == m)
                    & (summary["axis"] == ax)]
        if len(s):
            pc, ps = float(s["correlation"].iloc[0]), float(s["sensitivity"].iloc[0])
    corr, sens = stats
    (cl, ch), (sl, sh) = percentile_interval(corr, level), percentile_interval(sens, level)
    return {"detector": det, "dataset": ds, "axis": ax, "metric": m, "correlation": pc,
            "correlation_low": float(cl), "correlation_high": float(ch), "sensitivity": ps,
            "sensitivity_low": float(sl), "sensitivity_high": float(sh), "n_boot": int(np.shape(corr)[-1])}


def _groups(per_cell: pd.DataFrame) -> Iterable[tuple[tuple[str, str], pd.DataFrame]]:
    return _keyed(per_cell).groupby(["detector", "dataset"], sort=False)


def detector_means(per_cell: pd.DataFrame, metrics: Sequence[str] | None = None) -> pd.DataFrame:
    """Mean of each metric over the non-N/A cells, per detector and dataset (plus the cell counts)."""
    metrics = list(metrics) if metrics is not None else metric_columns(per_cell)
    rows = []
    for (det, ds), g in _groups(per_cell):
        ok = g[~g["na"].astype(bool)]
        rows.append({"detector": det, "dataset": ds, "cells": int(len(ok)), "cells_na": int(len(g) - len(ok)),
                     **{m: float(ok[m].mean()) if len(ok) else np.nan for m in metrics}})
    return pd.DataFrame(rows, columns=["detector", "dataset", "cells", "cells_na", *metrics])


# ------------------------------------------------------------------------------------------ leak-aware
ALL_IMAGES, LEAK_FREE = "all", "leak_free"
_LEAK_SUFFIX = "-leak-free"
LEAK_EFFECT_COLUMNS = ["detector", "dataset", "cell", "cov_level", "sem_level", "metric", "all", "leak_free",
                       "diff", "n_all", "n_leak_free"]
RANKING_COLUMNS = ["dataset", "scope", "key", "metric", "detectors", "kendall_tau", "top_all", "top_leak_free",
                   "order_all", "order_leak_free", "changed"]


def leak_free_name(dataset: str) -> str:
    """The dataset name of the leak-free images of ``dataset`` (``splits`` -> ``splits-leak-free``)."""
    return f"{dataset}{_LEAK_SUFFIX}"


def leak_pairs(per_cell: pd.DataFrame) -> dict[str, str]:
    """{dataset: its leak-free dataset} of a per-cell table with an ``images`` column (empty without one)."""
    if "images" not in per_cell.columns:
        return {}
    free = per_cell.loc[per_cell["images"] == LEAK_FREE, "dataset"].unique()
    present = set(per_cell["dataset"])
    return {d[: -len(_LEAK_SUFFIX)]: d for d in free if d.endswith(_LEAK_SUFFIX) and d[: -len(_LEAK_SUFFIX)] in present}


def leak_effect(per_cell: pd.DataFrame, metrics: Sequence[str] | None = None) -> pd.DataFrame:
    """Per detector, dataset (the all-images one), cell and metric: the value on all images, on the leak-free
    ones and ``diff`` = leak_free - all (NaN where either is N/A), with both image counts."""
    metrics = list(metrics) if metrics is not None else metric_columns(per_cell)
    keys = ["detector", "cell", "cov_level", "sem_level"]
    parts = []
    for ds, free in leak_pairs(per_cell).items():
        a = per_cell[per_cell["dataset"] == ds]
        b = per_cell[per_cell["dataset"] == free]
        both = a.merge(b, on=keys, suffixes=("_a", "_b"), how="left")
        for m in metrics:
            va = both[f"{m}_a"].where(~both["na_a"].astype(bool))
            vb = both[f"{m}_b"].where(~both["na_b"].fillna(True).astype(bool))
            parts.append(pd.DataFrame({
                **{k: both[k] for k in keys}, "dataset": ds, "metric": m, "all": va.astype(float),
                "leak_free": vb.astype(float), "diff": (vb - va).astype(float),
                "n_all": both["n_a"].astype(np.int64), "n_leak_free": both["n_b"].fillna(0).astype(np.int64)}))
    if not parts:
        return pd.DataFrame(columns=LEAK_EFFECT_COLUMNS)
    return pd.concat(parts, ignore_index=True)[LEAK_EFFECT_COLUMNS]


def detector_order(values: pd.Series, metric: str) -> list[str]:
    """Detectors (the index of ``values``) best first for ``metric``; ties broken by name."""
    sign = 1.0 if lower_is_better(metric) else -1.0
    frame = pd.DataFrame({"key": sign * values.to_numpy(dtype=np.float64), "name": values.index.astype(str)})
    return frame.sort_values(["key", "name"], kind="stable")["name"].tolist()


def _compare(a: pd.Series, b: pd.Series, metric: str) -> dict | None:
    """The ranking comparison of one group: detectors with a value in both (None when fewer than two)."""
    from scipy.stats import kendalltau

    ok = a.notna() & b.reindex(a.index).notna()
    a, b = a[ok], b.reindex(a.index)[ok]
    if len(a) < 2:
        return None
    oa, ob = detector_order(a, metric), detector_order(b, metric)
    tau = kendalltau(a.to_numpy(), b.to_numpy())[0]
    return {"detectors": int(len(a)), "kendall_tau": float(tau), "top_all": oa[0], "top_leak_free": ob[0],
            "order_all": " > ".join(oa), "order_leak_free": " > ".join(ob), "changed": oa != ob}


def _ranking_rows(a: pd.DataFrame, b: pd.DataFrame, *, group: str, scope: str, metrics: Sequence[str]) -> list[dict]:
    """Ranking comparisons of two wide tables (detector x group key, one column per metric)."""
    rows = []
    for key in sorted(set(a[group]) & set(b[group]), key=lambda k: (str(type(k)), k)):
        ga = a[a[group] == key].set_index("detector")
        gb = b[b[group] == key].set_index("detector")
        for m in metrics:
            if m not in ga.columns or m not in gb.columns:
                continue
            found = _compare(ga[m], gb[m], m)
            if found is not None:
                rows.append({"scope": scope, "key": str(key), "metric": m, **found})
    return rows


def measured_in_both(per_cell: pd.DataFrame, dataset: str, free: str) -> tuple[pd.DataFrame, pd.DataFrame]:
    """The rows of ``dataset`` and of its leak-free ``free`` restricted to the (detector, cell) pairs measured
    (not N/A) in both, so that means and level values compare the same cells."""
    a, b = per_cell[per_cell["dataset"] == dataset], per_cell[per_cell["dataset"] == free]
    a, b = a[~a["na"].astype(bool)], b[~b["na"].astype(bool)]
    both = set(zip(a["detector"], a["cell"])) & set(zip(b["detector"], b["cell"]))
    keep = lambda t: t[np.array([k in both for k in zip(t["detector"], t["cell"])], dtype=bool)]  # noqa: E731
    return keep(a), keep(b)


def leak_ranking(per_cell: pd.DataFrame, metrics: Sequence[str] | None = None) -> pd.DataFrame:
    """Does removing the leaking images change which detector is best? Per dataset and metric, over the cells
    measured in both (``measured_in_both``): for every cell, every level of each axis (level curves) and the
    mean over the cells, the detectors' order on all images and on the leak-free ones, Kendall's tau between
    the two sets of values and ``changed``."""
    metrics = list(metrics) if metrics is not None else metric_columns(per_cell)
    rows = []
    for ds, free in leak_pairs(per_cell).items():
        a, b = measured_in_both(per_cell, ds, free)
        found = _ranking_rows(a, b, group="cell", scope="cell", metrics=metrics)
        curves = all_level_curves(pd.concat([a, b]), metrics)
        for ax in AXES:
            wide = curves[curves["axis"] == ax].pivot_table(index=["detector", "dataset", "level"], columns="metric",
                                                            values="value").reset_index()
            found += _ranking_rows(wide[wide["dataset"] == ds], wide[wide["dataset"] == free], group="level",
                                   scope=f"{ax}_level", metrics=metrics)
        means = detector_means(pd.concat([a, b]), metrics).assign(key="mean")
        found += _ranking_rows(means[means["dataset"] == ds], means[means["dataset"] == free], group="key",
                               scope="mean", metrics=metrics)
        rows += [{"dataset": ds, **r} for r in found]
    return pd.DataFrame(rows, columns=RANKING_COLUMNS)
