"""Table 1 by the IS-OOD release's own rule, and its ``results/<method>.csv`` (pure, frames in, frames out).

The published IS-OOD release computes its per-cell metrics with its ``evaluate.py`` (``eval_ood``), writes them
with pandas (``to_csv(float_format='{:.2f}'.format)``) as ``results/<method>.csv`` and reads that file back with
``analyze_metrics.py``. Its rule, as those two files apply it:

* a cell's value is the metric in percent, written with two decimals (Python's ``format(100 * x, '.2f')``, read
  back as a float); an N/A cell (fewer than 10 images: no loader) is written as ``0.00``;
* the file has a header ``,FPR@95,AUROC,AUPR_IN,AUPR_OUT`` and one row per cell named ``cov_{c}_sem_{s}``, covariate
  level outer, semantic level inner: the 64 ImageNet-21K cells, then the 64 Syn-IS cells (128 rows); its FPR@95 is
  OpenOOD's (isood's ``fpr95_openood``);
* per level, the mean over the cells of that level whose value is > 1e-16: a true 0 (FPR@95 = 0 in an easy cell)
  drops out of the mean exactly like an N/A cell; a level whose every value is 0 divides 0 by 0 (NaN);
* sensitivity = |least-squares slope of the level means on i = 1..n|, correlation = ``scipy.stats.pearsonr`` of
  the centred level means and i (the release's call, on the same operands); both printed with two decimals.

Its per-cell AUROC is OpenOOD's (OOD positive, ``roc_curve(is_ood, -score)`` + ``auc``): isood's ``auroc`` column
is computed the same way, so the printed digits agree where 1 ulp decides how ``.xx5`` rounds. The results file
is written only for the release's two 8 x 8 grids (``release_results_files``; else one warning line), and with
bootstrap replicates Table 1's intervals are on this convention's scale (``release_table1_intervals``).

isood's default (``TABLE_CONVENTIONS[0]``, ``"exact"``: ``levels.summary_table``) keeps every value as computed
(fractions, no rounding), leaves N/A cells out and keeps a measured 0. ``table1(per_cell, convention)`` gives
either; ``release_summary`` has the layout of ``levels.summary_table`` (``SUMMARY_COLUMNS``; ``first`` / ``last``
are level means in percent). ``release_results_csv`` writes the release's results file from a per-cell table.
"""

from __future__ import annotations

import warnings
from typing import Mapping, Sequence

import numpy as np
import pandas as pd

from isood.core.errors import BadInputError, IsoodWarning

from .levels import AXES, SUMMARY_COLUMNS, TABLE1_INTERVAL_COLUMNS, interval_row, metric_columns, summary_table

__all__ = ["TABLE_CONVENTIONS", "RELEASE_METRICS", "RELEASE_ZERO", "release_value", "release_grid",
           "release_level_means", "release_line_fit", "release_summary", "table1", "check_convention",
           "release_results_csv", "RELEASE_GRIDS", "RELEASE_LEVELS", "release_files_refusal",
           "release_results_files", "CONVENTION_BOOTSTRAP", "release_curve_statistics",
           "release_table1_intervals", "release_values"]

#: The Table 1 conventions: isood's exact one (default) and the release's.
TABLE_CONVENTIONS = ("exact", "release")
#: The release's result columns -> isood's per-cell metric columns (the release's FPR@95 is OpenOOD's procedure).
RELEASE_METRICS: Mapping[str, str] = {"FPR@95": "fpr95_openood", "AUROC": "auroc", "AUPR_IN": "aupr_in",
                                      "AUPR_OUT": "aupr_out"}
#: Values at or below this drop out of a level mean (``analyze_metrics.py``: ``np.greater(values, 1e-16)``).
RELEASE_ZERO = 1e-16


def check_convention(convention: str) -> str:
    """``convention`` if it is one of ``TABLE_CONVENTIONS``, else a one-line error naming them."""
    if convention not in TABLE_CONVENTIONS:
        raise BadInputError(f"--table-convention {convention!r}: pass one of {', '.join(TABLE_CONVENTIONS)}")
    return convention


def release_value(x: float) -> float:
    """A metric as the release's results file holds it: percent with two decimals (``'{:.2f}'.format``, read back
    as a float); NaN (an N/A cell) is 0."""
    x = float(x)
    return 0.0 if np.isnan(x) else float(f"{100.0 * x:.2f}")


def release_grid(rows: pd.DataFrame, metric: str, n_levels: int) -> np.ndarray:
    """The (cov, sem) grid of one detector and dataset's per-cell ``rows`` as the release stores it:
    ``release_value`` of ``metric`` (0 for an N/A cell and for a cell the table does not list)."""
    grid = np.zeros((n_levels, n_levels), dtype=np.float64)
    na = rows["na"].astype(bool).to_numpy() if "na" in rows.columns else np.zeros(len(rows), bool)
    for c, s, v, is_na in zip(rows["cov_level"].astype(int), rows["sem_level"].astype(int),
                              rows[metric].to_numpy(dtype=np.float64), na):
        grid[c, s] = 0.0 if is_na else release_value(v)
    return grid


def release_level_means(grid: np.ndarray, axis: str) -> np.ndarray:
    """Per level of ``axis`` ('sem': columns, 'cov': rows): the sum over the level's cells divided by the number
    of its cells whose value is > ``RELEASE_ZERO`` (0 / 0 = NaN for a level of zeros, as the release divides)."""
    over = 0 if axis == "sem" else 1
    with np.errstate(invalid="ignore", divide="ignore"):
        return grid.sum(axis=over) / np.greater(grid, RELEASE_ZERO).sum(axis=over)


def release_line_fit(means: np.ndarray) -> tuple[float, float]:
    """``(correlation, sensitivity)`` of level means against i = 1..n as ``analyze_metrics.py`` computes them:
    both centred first, sensitivity = |sum(yc * ic) / sum(ic * ic)| and correlation =
    ``scipy.stats.pearsonr(yc, ic)`` (NaN when a mean is NaN or the means are constant)."""
    from scipy.stats import pearsonr

    y = np.asarray(means, dtype=np.float64)
    if y.size < 2 or not np.all(np.isfinite(y)):
        return float("nan"), float("nan")
    i = np.array([k + 1 for k in range(y.size)])
    yc, ic = y - y.mean(), i - i.mean()
    slope = float((yc * ic).sum() / (ic * ic).sum())
    with warnings.catch_warnings():  # constant means: scipy warns and returns NaN, as the release prints
        warnings.simplefilter("ignore")
        corr = float(pearsonr(yc, ic)[0])
    return corr, abs(slope)


def _n_levels(rows: pd.DataFrame) -> int:
    return 1 + int(max(rows["cov_level"].max(), rows["sem_level"].max())) if len(rows) else 0


def release_summary(per_cell: pd.DataFrame, metrics: Sequence[str] | None = None) -> pd.DataFrame:
    """Table 1 by the release's rule (module docstring): per detector, dataset, axis and metric the correlation
    and sensitivity of the release's level means, with ``first`` / ``last`` (the first and last finite level
    means, percent) and ``n_levels`` (levels with a finite mean); the layout of ``levels.summary_table``."""
    metrics = list(metrics) if metrics is not None else metric_columns(per_cell)
    rows = []
    if per_cell.empty:
        return pd.DataFrame(columns=SUMMARY_COLUMNS)
    for (det, ds), g in per_cell.groupby(["detector", "dataset"], sort=False):
        n = _n_levels(g)
        for ax in AXES:
            for m in metrics:
                means = release_level_means(release_grid(g, m, n), ax)
                corr, sens = release_line_fit(means)
                defined = means[np.isfinite(means)]
                rows.append({"detector": det, "dataset": ds, "axis": ax, "metric": m, "correlation": corr,
                             "sensitivity": sens, "first": float(defined[0]) if defined.size else np.nan,
                             "last": float(defined[-1]) if defined.size else np.nan, "n_levels": int(defined.size)})
    return pd.DataFrame(rows, columns=SUMMARY_COLUMNS)


def table1(per_cell: pd.DataFrame, convention: str = "exact", metrics: Sequence[str] | None = None) -> pd.DataFrame:
    """Table 1 of a per-cell table by ``convention``: ``'exact'`` (``levels.summary_table``) or ``'release'``
    (``release_summary``)."""
    check_convention(convention)
    return summary_table(per_cell, metrics) if convention == "exact" else release_summary(per_cell, metrics)


def release_results_csv(per_cell: pd.DataFrame, detector: str, datasets: Sequence[str]) -> str:
    """The release's ``results/<method>.csv`` of one detector: the header ``,FPR@95,AUROC,AUPR_IN,AUPR_OUT``, then
    for each of ``datasets`` (grid datasets, in order: the release writes ImageNet-21K, then Syn-IS) one row per
    cell ``cov_{c}_sem_{s}`` (covariate outer, semantic inner, every cell of the n x n grid) with
    ``release_value`` of each metric (N/A and unlisted cells ``0.00``)."""
    rows = per_cell[per_cell["detector"] == detector]
    missing = [m for m in RELEASE_METRICS.values() if m not in rows.columns]
    if missing:
        raise BadInputError(f"the per-cell table lacks {', '.join(missing)}: the release's results file needs "
                            f"{', '.join(RELEASE_METRICS.values())}")
    lines = ["," + ",".join(RELEASE_METRICS)]
    for ds in datasets:
        g = rows[rows["dataset"] == ds]
        if g.empty:
            raise BadInputError(f"detector '{detector}' has no per-cell rows on {ds}: pass a grid dataset")
        n = _n_levels(g)
        grids = [release_grid(g, m, n) for m in RELEASE_METRICS.values()]
        for c in range(n):
            for s in range(n):
                lines.append(f"cov_{c}_sem_{s}," + ",".join(f"{grid[c, s]:.2f}" for grid in grids))
    return "\n".join(lines) + "\n"


#: The grids of the release's results file: its ImageNet-21K grid, then its Syn-IS grid, each of 8 x 8 cells.
RELEASE_GRIDS, RELEASE_LEVELS = 2, 8


def release_files_refusal(per_cell: pd.DataFrame, grids: Sequence[str]) -> str | None:
    """Why the release's ``results/<method>.csv`` cannot be written for the grid datasets ``grids`` (None when it
    can). ``analyze_metrics.py`` reads a file's rows but the last 64 as ImageNet-21K and the last 64 as Syn-IS,
    so the file is written only for exactly two grids of 8 x 8 cells (in the run's order: the first as the
    ImageNet-21K rows, the second as the Syn-IS rows); with one grid the script fails, with three it would mix
    two of them into one table without a word."""
    if len(grids) != RELEASE_GRIDS:
        return (f"{len(grids)} grid dataset(s) ({', '.join(grids) or 'none'}), but the release's analyze_metrics.py "
                "reads exactly two (ImageNet-21K, then Syn-IS): pass --splits and --syn")
    for ds in grids:
        g = per_cell[per_cell["dataset"] == ds]
        n = _n_levels(g)
        if n != RELEASE_LEVELS or g.drop_duplicates(["cov_level", "sem_level"]).shape[0] != n * n:
            return (f"grid {ds} has {g.drop_duplicates(['cov_level', 'sem_level']).shape[0]} cells, but the "
                    f"release's analyze_metrics.py reads {RELEASE_LEVELS} x {RELEASE_LEVELS} = "
                    f"{RELEASE_LEVELS ** 2} per grid")
    return None


def release_results_files(per_cell: pd.DataFrame, grids: Sequence[str],
                          detectors: Sequence[str]) -> dict[str, str]:
    """``{"results/<detector>.csv": text}`` (``release_results_csv``) of every detector for the grid datasets
    ``grids`` in the run's order, or, when ``release_files_refusal`` says the release cannot read them, none and
    one ``IsoodWarning`` line saying why (the per-cell rows stay in ``results/cell_metrics.csv``)."""
    if not grids or per_cell.empty:
        return {}
    reason = release_files_refusal(per_cell, grids)
    if reason is not None:
        warnings.warn(f"results/<detector>.csv in the release's format not written: {reason}; every grid's "
                      "per-cell rows are in results/cell_metrics.csv", IsoodWarning, stacklevel=2)
        return {}
    return {f"results/{det}.csv": release_results_csv(per_cell, det, grids) for det in detectors}


# ------------------------------------------------------------------------------------------ bootstrap intervals
#: The metrics Table 1's intervals resample per convention (its FPR@95 and AUROC).
CONVENTION_BOOTSTRAP = {"exact": ("auroc", "fpr95"), "release": ("auroc", "fpr95_openood")}


def release_curve_statistics(values: np.ndarray, levels: np.ndarray, n_levels: int) -> tuple[np.ndarray, np.ndarray]:
    """``release_line_fit`` of every column of ``values`` (cells x replicates, fractions; the measured cells of
    one grid, their levels on one axis in ``levels``), vectorised: each value as the release stores it
    (``release_value``: percent, ``'{:.2f}'``), N/A and unlisted cells 0, a level's mean over its values
    > ``RELEASE_ZERO``; sensitivity = |slope| and correlation = ``scipy.stats.pearsonr`` of the centred means,
    NaN for a replicate with a level of zeros (0 / 0) or constant means."""
    return _stored_statistics(release_values(values), levels, n_levels)


def release_values(values: np.ndarray) -> np.ndarray:
    """``release_value`` of every entry of ``values`` (an array of the same shape)."""
    v = np.asarray(values, dtype=np.float64)
    flat = [0.0 if x != x else float(f"{100.0 * x:.2f}") for x in v.ravel().tolist()]  # NaN -> 0, as stored
    return np.array(flat, dtype=np.float64).reshape(v.shape)


def _stored_statistics(stored: np.ndarray, levels: np.ndarray, n_levels: int) -> tuple[np.ndarray, np.ndarray]:
    """``release_curve_statistics`` of values already as the release stores them."""
    from scipy.stats import pearsonr

    lev = np.asarray(levels, dtype=np.int64)
    sums = np.stack([stored[lev == k].sum(axis=0) for k in range(int(n_levels))])
    counts = np.stack([np.greater(stored[lev == k], RELEASE_ZERO).sum(axis=0) for k in range(int(n_levels))])
    with np.errstate(invalid="ignore", divide="ignore"):
        means = sums / counts
    bad = ~np.isfinite(means).all(axis=0)
    means[:, bad] = 0.0
    i = np.array([k + 1 for k in range(int(n_levels))])
    yc, ic = means - means.mean(axis=0), (i - i.mean())[:, None]
    slope = np.abs((yc * ic).sum(axis=0) / (ic * ic).sum())
    with warnings.catch_warnings():  # constant columns: NaN, as for the point value
        warnings.simplefilter("ignore")
        corr = np.asarray(pearsonr(yc, np.broadcast_to(ic, yc.shape), axis=0)[0], dtype=np.float64)
    corr[bad], slope[bad] = np.nan, np.nan
    return corr, slope


def release_table1_intervals(cells: pd.DataFrame, replicates: dict[str, np.ndarray], n_levels: int, *,
                             summary: pd.DataFrame | None = None, level: float = 0.95) -> pd.DataFrame:
    """``levels.table1_intervals`` on the release convention's own scale: each replicate's Table 1 computed by
    the release's rule (``release_curve_statistics``: percent, rounded as the release rounds), percentile
    intervals at ``level``; the point values from ``summary`` (``release_summary``) when given, else from the
    cells' own values."""
    det, ds = cells["detector"].iloc[0], cells["dataset"].iloc[0]
    rows = []
    for m, reps in replicates.items():
        stored = release_values(reps)
        for ax, col in AXES.items():
            levels = cells[col].to_numpy(dtype=np.int64)
            corr, sens = _stored_statistics(stored, levels, n_levels)
            pc, ps = (float(x[0]) for x in release_curve_statistics(cells[[m]].to_numpy(), levels, n_levels))
            rows.append(interval_row((det, ds, ax, m), (pc, ps), (corr, sens), summary=summary, level=level))
    return pd.DataFrame(rows, columns=TABLE1_INTERVAL_COLUMNS)

