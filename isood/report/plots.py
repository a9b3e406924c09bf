"""Plots of a per-cell evaluation (matplotlib, Agg; figures are built with ``matplotlib.figure.Figure``, never
pyplot, so nothing global changes and no display is needed).

- ``heatmap_figure`` / ``heatmap_png``: the n x n grid of one detector and metric. Semantic level on the x axis
  (0 left), covariate level on the y axis (0 at the bottom); each measured cell shows its value and its number
  of images (``n=``, one point smaller than the value and in the same contrasting colour; left out when the
  grid is too fine for a legible font, ``MIN_COUNT_FONTSIZE``), N/A cells are grey (``NA_COLOR``) and labelled
  ``N/A`` with their count in dark text; a colorbar on the right. The colour range is the metric's own (``metric_limits``: the range of its values, shared by every
  detector of a dataset in ``render_plots``, so AUTC's or DER's variation is visible where a fixed [0, 1] hid it);
  the colour map is reversed for lower-is-better metrics so that "good" is always the bright end (viridis),
  from the metric registry (``metrics.METRICS``).
- ``compare_figure``: one figure per dataset and metric comparing the detectors: their heatmaps side by side on
  one shared colour range with one colorbar (the paper figure).
- ``level_curve_figure`` / ``level_curve_png``: one metric along one axis, one line per detector (N/A levels
  leave a gap), on the range of its values (matplotlib's autoscale, not a fixed [0, 1]).
- ``leak_diff_figure`` / ``leak_diff_png``: after a leak audit, the n x n grid of leak-free minus all-images
  values of one detector and metric (``levels.leak_effect``), a diverging map centred on 0 whose blue end is
  "better without the leaking images" (red: worse), N/A grey.
- ``render_plots``: the heatmaps, comparison figures and level curves of a ``CellEvaluation`` for the metrics to
  draw (``plot_metric_names``: by default ``isood.core.defaults.DEFAULT_PLOT_METRICS``, AUROC and FPR@95; ``'all'``:
  every computed metric) as ``{relative path: bytes}``, with the deterministic names of ``heatmap_name`` /
  ``compare_name`` / ``level_curve_name`` / ``leak_diff_name``. The paper figures (comparisons and level
  curves) and the per-detector heatmaps also come as SVG and PDF beside the PNG (``VECTOR_FORMATS``; in the SVG
  each cell's count is the group ``count_cov_<c>_sem_<s>``). Files per grid dataset with D detectors and M
  metrics drawn: 3*D*M heatmaps + 3*M comparisons + 3*2*M curves.

A PNG is exactly ``figsize * dpi`` pixels (no tight bounding box); PNG, SVG and PDF are identical bytes for
identical input (no dates, a fixed SVG id salt: ``figure_bytes``).
"""

from __future__ import annotations

import io
import re
from typing import Sequence

import matplotlib

matplotlib.use("Agg", force=False)  # headless; a user who already chose a backend keeps it for pyplot

import numpy as np
import pandas as pd
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.colors import to_rgb
from matplotlib.figure import Figure

from isood.core.defaults import ALL_PLOT_METRICS as ALL_METRICS
from isood.core.defaults import DEFAULT_PLOT_METRICS
from isood.core.errors import BadInputError

from isood.science.cells import CellEvaluation
from isood.science.levels import AXES, leak_effect, leak_pairs, metric_choices, one_dataset
from isood.science.metrics import lower_is_better, metric_label

__all__ = [
    "NA_COLOR",
    "HEATMAP_SIZE",
    "CURVE_SIZE",
    "DPI",
    "heatmap_figure",
    "heatmap_png",
    "level_curve_figure",
    "level_curve_png",
    "heatmap_name",
    "level_curve_name",
    "leak_diff_name",
    "leak_diff_figure",
    "leak_diff_png",
    "render_plots",
    "plot_metric_names",
    "ALL_METRICS",
    "figure_png",
    "figure_bytes",
    "heatmap_cmap",
    "grey_rgb",
    "metric_limits",
    "compare_figure",
    "compare_name",
    "VECTOR_FORMATS",
    "NA_TEXT_COLOR",
    "MIN_COUNT_FONTSIZE",
]

NA_COLOR = "#bdbdbd"
NA_TEXT_COLOR = "#262626"  # dark on the grey N/A cells (legible contrast)
MIN_COUNT_FONTSIZE = 6  # below this the image counts are left out of the cells (a large grid)
HEATMAP_SIZE = (6.4, 5.6)  # inches -> 640 x 560 px at DPI
CURVE_SIZE = (6.4, 4.4)   # -> 640 x 440 px
DPI = 100
_AXIS_TITLE = {"sem": "semantic shift level", "cov": "covariate shift level"}


def _slug(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9.]+", "-", str(text)).strip("-").lower() or "x"


def heatmap_name(dataset: str, detector: str, metric: str) -> str:
    """``plots/heatmap_<dataset>_<detector>_<metric>.png`` (names slugged to ``[a-z0-9.-]``)."""
    return f"plots/heatmap_{_slug(dataset)}_{_slug(detector)}_{metric}.png"


def level_curve_name(dataset: str, axis: str, metric: str) -> str:
    """``plots/levels_<dataset>_<axis>_<metric>.png``."""
    return f"plots/levels_{_slug(dataset)}_{axis}_{metric}.png"


def compare_name(dataset: str, metric: str) -> str:
    """``plots/compare_<dataset>_<metric>.png``: the detectors side by side on one colour range."""
    return f"plots/compare_{_slug(dataset)}_{metric}.png"


def leak_diff_name(dataset: str, detector: str, metric: str) -> str:
    """``plots/leakdiff_<dataset>_<detector>_<metric>.png``."""
    return f"plots/leakdiff_{_slug(dataset)}_{_slug(detector)}_{metric}.png"


#: The formats of the paper figures and heatmaps beside their PNG.
VECTOR_FORMATS = ("svg", "pdf")
_NO_DATES = {"png": {"Software": None}, "svg": {"Date": None, "Creator": None},
             "pdf": {"CreationDate": None, "ModDate": None, "Creator": None, "Producer": None}}


def figure_bytes(fig: Figure, fmt: str = "png", dpi: int = DPI) -> bytes:
    """The bytes of a figure as ``fmt`` ('png', 'svg' or 'pdf') at ``dpi``: no timestamp or software tag, and
    SVG element ids from a fixed salt (matplotlib draws them from a random one), so identical input gives
    identical bytes."""
    if fmt not in _NO_DATES:
        raise BadInputError(f"figure format {fmt!r}: pass png, svg or pdf")
    if fig.canvas is None or not isinstance(fig.canvas, FigureCanvasAgg):
        FigureCanvasAgg(fig)
    buf = io.BytesIO()
    with matplotlib.rc_context({"svg.hashsalt": "isood", "svg.fonttype": "path"}):
        fig.savefig(buf, format=fmt, dpi=dpi, metadata=_NO_DATES[fmt])
    return buf.getvalue()


def figure_png(fig: Figure, dpi: int = DPI) -> bytes:
    """PNG bytes of a figure at ``dpi`` (no timestamp or software tag: identical input, identical bytes)."""
    return figure_bytes(fig, "png", dpi)


def metric_limits(values) -> tuple[float, float]:
    """The colour range of a metric: the range of its finite ``values`` (a constant widened by 0.05 each way;
    none: [0, 1])."""
    v = np.asarray(values, dtype=np.float64)
    v = v[np.isfinite(v)]
    if not v.size:
        return 0.0, 1.0
    lo, hi = float(v.min()), float(v.max())
    return (lo - 0.05, hi + 0.05) if hi == lo else (lo, hi)


def _select(per_cell: pd.DataFrame, detector: str, dataset: str | None) -> pd.DataFrame:
    df = one_dataset(per_cell[per_cell["detector"] == detector], dataset, owner=f"detector '{detector}' has ")
    if df.empty:
        raise BadInputError(f"no per-cell rows for detector '{detector}'"
                         + (f" and dataset '{dataset}'" if dataset else "")
                         + f": have {', '.join(per_cell['detector'].unique())}")
    return df


def heatmap_cmap(metric: str):
    """The heatmap colour map of ``metric``: viridis, reversed when lower is better; N/A (masked) is grey."""
    return matplotlib.colormaps["viridis_r" if lower_is_better(metric) else "viridis"].with_extremes(bad=NA_COLOR)


def _text_color(rgba) -> str:
    r, g, b = rgba[:3]
    return "black" if 0.299 * r + 0.587 * g + 0.114 * b > 0.5 else "white"


def heatmap_figure(per_cell: pd.DataFrame, *, detector: str, metric: str = "auroc", dataset: str | None = None,
                   n_levels: int | None = None, title: str | None = None,
                   figsize: tuple[float, float] = HEATMAP_SIZE, cmap=None, limits: tuple[float, float] | None = None,
                   label: str | None = None) -> Figure:
    """The n x n heatmap of ``metric`` for ``detector`` (x: semantic level, y: covariate level, origin lower
    left). Cells absent from ``per_cell`` or marked ``na`` are grey and labelled N/A; values are printed with two
    decimals. ``n_levels`` defaults to the largest level in the table + 1. ``cmap`` / ``limits`` / ``label``
    override the metric's colour map, range and colorbar label (the leak difference maps)."""
    if metric not in per_cell.columns:
        raise BadInputError(f"metric {metric!r} is not in the per-cell table: {metric_choices(per_cell)}")
    df = _select(per_cell, detector, dataset)
    n = int(n_levels or max(df["cov_level"].max(), df["sem_level"].max()) + 1)
    grid, na, count = _grid(df, metric, n)
    cmap = heatmap_cmap(metric) if cmap is None else cmap
    vmin, vmax = limits if limits is not None else metric_limits(grid)
    fig = Figure(figsize=figsize, dpi=DPI)
    FigureCanvasAgg(fig)
    ax = fig.add_axes((0.11, 0.1, 0.68, 0.8))
    cax = fig.add_axes((0.83, 0.1, 0.035, 0.8))
    img = ax.imshow(np.ma.masked_invalid(grid), origin="lower", cmap=cmap, vmin=vmin, vmax=vmax,
                    interpolation="nearest", aspect="auto")
    fig.colorbar(img, cax=cax, label=label or metric_label(metric))
    fontsize = 9 if n <= 8 else max(4, int(72 / n))
    count_size = fontsize - 1  # counts nearly as large as the values; drawn only where that is legible
    show_counts = count_size >= MIN_COUNT_FONTSIZE
    for c in range(n):
        for s in range(n):
            shown = f"n={count[c, s]}" if count[c, s] >= 0 and show_counts else ""
            if na[c, s]:
                color = NA_TEXT_COLOR
                ax.text(s, c, "N/A", ha="center", va="bottom" if shown else "center", fontsize=fontsize - 1,
                        color=color)
            else:
                rgba = cmap((grid[c, s] - vmin) / (vmax - vmin) if vmax > vmin else 0.5)
                color = _text_color(rgba)
                ax.text(s, c, f"{grid[c, s]:.2f}", ha="center", va="bottom" if shown else "center",
                        fontsize=fontsize, color=color)
            if shown:  # gid: the SVG group of the count is named after its cell
                ax.text(s, c - 0.04, shown, ha="center", va="top", fontsize=count_size, color=color,
                        gid=f"count_cov_{c}_sem_{s}")
    ax.set_xticks(range(n))
    ax.set_yticks(range(n))
    ax.set_xlabel(_AXIS_TITLE["sem"])
    ax.set_ylabel(_AXIS_TITLE["cov"])
    ds = f" on {df['dataset'].iloc[0]}" if "dataset" in df.columns else ""
    ax.set_title(title or f"{detector}: {metric_label(metric)}{ds}", fontsize=11)
    return fig


def _grid(df: pd.DataFrame, metric: str, n: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(values, N/A, image counts) of one detector's cells as n x n arrays (cov rows, sem columns); a cell
    missing from ``df`` is N/A with count -1 (not shown)."""
    grid = np.full((n, n), np.nan)
    na = np.ones((n, n), bool)
    count = np.full((n, n), -1, np.int64)
    for rec in df.itertuples():
        c, s = int(rec.cov_level), int(rec.sem_level)
        v = getattr(rec, metric)
        if "n" in df.columns:
            count[c, s] = int(rec.n)
        if not rec.na and np.isfinite(v):
            grid[c, s], na[c, s] = v, False
    return grid, na, count


def compare_figure(per_cell: pd.DataFrame, *, metric: str = "auroc", dataset: str | None = None,
                   detectors: Sequence[str] | None = None, n_levels: int | None = None,
                   limits: tuple[float, float] | None = None, columns: int | None = None) -> Figure:
    """The detectors' heatmaps of ``metric`` side by side (``columns`` per row, default all in one row up to 5,
    else 4) on one shared colour range
    (``limits``, default ``metric_limits`` of every detector's measured values) with one colorbar; N/A grey."""
    if metric not in per_cell.columns:
        raise BadInputError(f"metric {metric!r} is not in the per-cell table: {metric_choices(per_cell)}")
    rows_ = one_dataset(per_cell, dataset)
    names = list(detectors) if detectors is not None else list(dict.fromkeys(rows_["detector"]))
    if not names:
        raise BadInputError(f"no per-cell rows to compare for dataset {dataset!r}")
    n = int(n_levels or max(rows_["cov_level"].max(), rows_["sem_level"].max()) + 1)
    measured = rows_.loc[~rows_["na"].astype(bool), metric]
    vmin, vmax = limits if limits is not None else metric_limits(measured)
    cols = max(1, min(int(columns or (len(names) if len(names) <= 5 else 4)), len(names)))
    nrows = -(-len(names) // cols)
    panel, left, bottom, right, top = 2.3, 0.7, 0.45, 1.0, 0.4  # inches
    width, height = left + cols * panel + right, bottom + nrows * panel + top
    fig = Figure(figsize=(width, height), dpi=DPI)
    FigureCanvasAgg(fig)
    cmap = heatmap_cmap(metric)
    img = None
    for i, det in enumerate(names):
        r, c = divmod(i, cols)
        ax = fig.add_axes(((left + c * panel) / width, (bottom + (nrows - 1 - r) * panel) / height,
                           (panel - 0.35) / width, (panel - 0.45) / height))
        grid, _, _ = _grid(rows_[rows_["detector"] == det], metric, n)
        img = ax.imshow(np.ma.masked_invalid(grid), origin="lower", cmap=cmap, vmin=vmin, vmax=vmax,
                        interpolation="nearest", aspect="auto")
        ax.set_title(det, fontsize=9)
        ax.set_xticks(range(n))
        ax.set_yticks(range(n))
        ax.tick_params(labelsize=6)
        if r == nrows - 1 or i + cols >= len(names):
            ax.set_xlabel("semantic level", fontsize=7)
        if c == 0:
            ax.set_ylabel("covariate level", fontsize=7)
    cax = fig.add_axes(((left + cols * panel) / width, bottom / height, 0.15 / width,
                        (nrows * panel - 0.45) / height))
    assert img is not None  # one panel per name, and names is not empty
    fig.colorbar(img, cax=cax, label=metric_label(metric))
    ds = rows_["dataset"].iloc[0] if "dataset" in rows_.columns and len(rows_) else ""
    fig.suptitle(f"{metric_label(metric)} per cell on {ds}: detectors compared", fontsize=10,
                 y=1.0 - 0.08 / height, va="top")
    return fig


def heatmap_png(per_cell: pd.DataFrame, **kwargs) -> bytes:
    """``heatmap_figure(per_cell, **kwargs)`` as PNG bytes (640 x 560 pixels by default)."""
    return figure_png(heatmap_figure(per_cell, **kwargs))


def leak_diff_figure(effect: pd.DataFrame, *, detector: str, metric: str = "auroc", dataset: str | None = None,
                     n_levels: int | None = None, figsize: tuple[float, float] = HEATMAP_SIZE) -> Figure:
    """The n x n map of ``diff`` (leak-free minus all images) of ``metric`` for ``detector`` from a
    ``levels.leak_effect`` table; symmetric range around 0 (at least +-0.05), blue = better without the leaks."""
    rows = effect[(effect["metric"] == metric) & (effect["detector"] == detector)]
    rows = one_dataset(rows, dataset)
    if rows.empty:
        raise BadInputError(f"no leak difference for detector '{detector}', metric {metric!r}")
    grid = rows.assign(na=rows["diff"].isna())[["detector", "dataset", "cov_level", "sem_level", "na", "diff"]]
    finite = grid["diff"].abs()[grid["diff"].notna()]
    top = max(0.05, float(finite.max()) if len(finite) else 0.0)
    cmap = matplotlib.colormaps["RdBu_r" if lower_is_better(metric) else "RdBu"].with_extremes(bad=NA_COLOR)
    ds = rows["dataset"].iloc[0]
    return heatmap_figure(grid.rename(columns={"diff": metric}), detector=detector, metric=metric, n_levels=n_levels,
                          figsize=figsize, cmap=cmap, limits=(-top, top),
                          label=f"{metric_label(metric)}: leak-free - all",
                          title=f"{detector}: {metric_label(metric)} leak-free - all images on {ds}")


def leak_diff_png(effect: pd.DataFrame, **kwargs) -> bytes:
    """``leak_diff_figure(effect, **kwargs)`` as PNG bytes."""
    return figure_png(leak_diff_figure(effect, **kwargs))


def level_curve_figure(levels: pd.DataFrame, *, metric: str = "auroc", axis: str = "sem", dataset: str | None = None,
                       detectors: Sequence[str] | None = None, title: str | None = None,
                       figsize: tuple[float, float] = CURVE_SIZE) -> Figure:
    """``metric`` per level along ``axis`` (a ``CellEvaluation.levels`` table), one line per detector."""
    if axis not in AXES:
        raise BadInputError(f"unknown axis {axis!r}: pass 'sem' or 'cov'")
    df = one_dataset(levels[(levels["metric"] == metric) & (levels["axis"] == axis)], dataset)
    if df.empty:
        raise BadInputError(f"no level values for metric {metric!r} on axis {axis!r}")
    fig = Figure(figsize=figsize, dpi=DPI)
    FigureCanvasAgg(fig)
    ax = fig.add_axes((0.1, 0.12, 0.62, 0.78))
    names = list(detectors) if detectors is not None else list(dict.fromkeys(df["detector"]))
    markers = "osD^v<>ph*Xd"
    for i, det in enumerate(names):
        d = df[df["detector"] == det].sort_values("level")
        ax.plot(d["level"], d["value"], marker=markers[i % len(markers)], label=det, linewidth=1.5, markersize=4)
    levels_all = sorted(df["level"].unique())
    ax.set_xticks(levels_all)
    ax.set_xlabel(_AXIS_TITLE[axis])
    ax.set_ylabel(metric_label(metric))
    ax.grid(True, alpha=0.3)
    ax.legend(loc="upper left", bbox_to_anchor=(1.02, 1.0), fontsize=8, frameon=False)
    ds = f" on {df['dataset'].iloc[0]}"
    ax.set_title(title or f"{metric_label(metric)} per {_AXIS_TITLE[axis]}{ds}", fontsize=11)
    return fig


def level_curve_png(levels: pd.DataFrame, **kwargs) -> bytes:
    """``level_curve_figure(levels, **kwargs)`` as PNG bytes (640 x 440 pixels by default)."""
    return figure_png(level_curve_figure(levels, **kwargs))


def plot_metric_names(result: CellEvaluation, metrics: Sequence[str] | str | None = None) -> list[str]:
    """The metrics to draw: ``metrics`` (names, each computed in ``result``, else a one-line error), ``'all'``
    (every computed metric) or None (``DEFAULT_PLOT_METRICS`` among the computed ones)."""
    if metrics is None:
        return [m for m in DEFAULT_PLOT_METRICS.split(",") if m in result.metrics]
    if isinstance(metrics, str):
        if metrics.strip() == ALL_METRICS:
            return list(result.metrics)
        metrics = [m.strip() for m in metrics.split(",") if m.strip()]
    unknown = [m for m in metrics if m not in result.metrics]
    if unknown:
        raise BadInputError(f"--plot-metrics {', '.join(unknown)} were not computed: "
                            f"{metric_choices(result.per_cell)} (or {ALL_METRICS})")
    return list(metrics)


def render_plots(result: CellEvaluation, metrics: Sequence[str] | str | None = None,
                 heatmap_metrics: Sequence[str] | str | None = None) -> dict[str, bytes]:
    """The heatmaps (dataset x detector x heatmap metric) and level curves (dataset x axis x metric) of
    ``result`` as ``{relative path: PNG bytes}``. ``metrics``: see ``plot_metric_names`` (default AUROC and
    FPR@95, ``'all'`` for every computed metric); ``heatmap_metrics`` default to ``metrics``."""
    metrics = plot_metric_names(result, metrics)
    hm = plot_metric_names(result, heatmap_metrics) if heatmap_metrics is not None else metrics
    out: dict[str, bytes] = {}
    per_cell = result.per_cell

    def paper(name: str, fig: Figure) -> None:  # a paper figure: PNG + the vector formats beside it
        out[name] = figure_png(fig)
        for fmt in VECTOR_FORMATS:
            out[f"{name[:-len('.png')]}.{fmt}"] = figure_bytes(fig, fmt)

    for ds in result.datasets:
        sub = per_cell[per_cell["dataset"] == ds]
        n = int(max(sub["cov_level"].max(), sub["sem_level"].max()) + 1)
        for m in hm:
            limits = metric_limits(sub.loc[~sub["na"].astype(bool), m])  # one range for every detector
            drawn = [d for d in dict.fromkeys(sub["detector"]) if sub.loc[sub["detector"] == d, m].notna().any()]
            for det in drawn:
                paper(heatmap_name(ds, det, m), heatmap_figure(sub, detector=det, metric=m, dataset=ds, n_levels=n,
                                                               limits=limits))
            if drawn:
                paper(compare_name(ds, m), compare_figure(sub, metric=m, dataset=ds, detectors=drawn, n_levels=n,
                                                          limits=limits))
        for axis in AXES:
            for m in metrics:
                paper(level_curve_name(ds, axis, m), level_curve_figure(result.levels, metric=m, axis=axis, dataset=ds))
    if leak_pairs(per_cell):
        effect = leak_effect(per_cell, hm)
        for (ds, det, m), rows in effect.groupby(["dataset", "detector", "metric"], sort=False):
            if rows["diff"].notna().any():
                n = int(max(rows["cov_level"].max(), rows["sem_level"].max()) + 1)
                out[leak_diff_name(ds, det, m)] = leak_diff_png(effect, detector=det, metric=m, dataset=ds, n_levels=n)
    return out


def grey_rgb() -> tuple[float, float, float]:
    """``NA_COLOR`` as RGB floats in [0, 1] (for tests and callers checking pixels)."""
    return to_rgb(NA_COLOR)
