"""L2: what is derived from a per-cell table (``cells.evaluate_cells``): level curves, Table 1 (IS-OOD) and the
per-detector means. Pure functions over DataFrames.

A level's value is the mean of a metric over the level's non-N/A cells; an all-N/A level keeps its place (NaN),
so level ``i`` is always the i-th level of the grid (IS-OOD, Sec. 4).
"""

from __future__ import annotations

from typing import Iterable, Sequence

import numpy as np
import pandas as pd

from isood.errors import BadInputError

from .metrics import METRICS, level_correlation, level_sensitivity

__all__ = [
    "AXES", "axis_name", "metric_columns", "one_dataset", "level_curves", "all_level_curves", "summary_table",
    "detector_means", "LEVEL_COLUMNS", "SUMMARY_COLUMNS",
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
        raise BadInputError(f"metric {metric!r} is not in the per-cell table: pass one of "
                            f"{', '.join(metric_columns(per_cell))}")
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
