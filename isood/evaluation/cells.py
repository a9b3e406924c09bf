"""Per-cell evaluation of OOD scores on a shift grid: the "bring your own scores" API.

A user with one score per image (HIGHER = MORE in-distribution, OpenOOD's convention) evaluates a detector per
grid cell without any model::

    from isood.evaluation import evaluate_scores
    import manifests

    images = manifests.read("splits/").frame("images")      # path, ..., cov_level, sem_level, cell
    cells = manifests.read("splits/").frame("cells")        # cell, cov_level, sem_level, n, na
    result = evaluate_scores(
        {"msp": msp_id, "energy": energy_id},                 # ID test scores (N_id,)
        {"msp": msp_ood, "energy": energy_ood},               # one score per row of `images`
        images, na=cells,
        id_correct=pred_id == y_id,                           # optional: DER / AUROC_M / ADR
    )
    result.per_cell        # one row per (detector, cell): n, na, auroc, fpr95, ... (N/A cells: NaN, na=True)
    result.levels          # per-level curves: mean over the level's non-N/A cells, both axes, every metric
    result.summary         # Table 1 (IS-OOD): Pearson correlation and |slope| of the level curve per axis

Each cell is compared against the whole ID test set (IS-OOD: ID = ImageNet-1K val vs the cell's images).
A cell with fewer than ``na_threshold`` (default 10) images, or marked ``na`` in the manifest's ``cells`` table, is
N/A: it is kept in ``per_cell`` with ``na=True`` and NaN metrics, and never enters a level mean.

Metrics (isood.evaluation.metrics; ``LOWER_IS_BETTER`` lists those where lower is better):

=============  ======================================================================================
``auroc``      area under the ROC curve, ID vs the cell
``fpr95``      FPR@95, OpenOOD convention (OOD positive: ID flagged at 95 % of the cell detected)
``fpr95_id``   FPR@95, ID-positive convention (the cell's images accepted at 95 % of ID accepted)
``aupr_in``    AUPR with ID positive; ``aupr_out`` with OOD positive
``autc``       AUTC (Humblot-Renaux et al.) and its halves ``aufpr``, ``aufnr``
``der95``      human-centric DER with the 95 % / 99 % training threshold (``der99``); needs ``id_correct``,
               ``train_scores`` and ``train_correct``
``auroc_m``    model-view AUROC_M and ``adr`` (Yang et al.); need ``id_correct`` (``ood_correct`` optional:
               images of a cell whose label the model still gets right)
=============  ======================================================================================

Pure functions over arrays and DataFrames: no file I/O (``isood.evaluation.job.write_evaluation`` writes).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Iterable, Mapping, Sequence

import numpy as np
import pandas as pd
import sklearn

from isood.errors import IsoodError

from . import metrics as M

__all__ = [
    "BASE_METRICS",
    "CORRECTNESS_METRICS",
    "DER_METRICS",
    "MODEL_VIEW_METRICS",
    "ALL_METRICS",
    "LOWER_IS_BETTER",
    "METRIC_LABELS",
    "AXES",
    "NA_THRESHOLD",
    "EmptyCellError",
    "CellEvaluation",
    "cell_name",
    "evaluate_cells",
    "evaluate_scores",
    "level_curves",
    "all_level_curves",
    "summary_table",
    "detector_means",
    "metric_columns",
]

BASE_METRICS = ("auroc", "fpr95", "fpr95_id", "aupr_in", "aupr_out", "autc", "aufpr", "aufnr")
DER_METRICS = ("der95", "der99")
MODEL_VIEW_METRICS = ("auroc_m", "adr")
CORRECTNESS_METRICS = DER_METRICS + MODEL_VIEW_METRICS
ALL_METRICS = BASE_METRICS + CORRECTNESS_METRICS
LOWER_IS_BETTER = frozenset({"fpr95", "fpr95_id", "autc", "aufpr", "aufnr", "der95", "der99"})
METRIC_LABELS = {
    "auroc": "AUROC", "fpr95": "FPR@95 (OpenOOD)", "fpr95_id": "FPR@95 (ID positive)", "aupr_in": "AUPR-In",
    "aupr_out": "AUPR-Out", "autc": "AUTC", "aufpr": "AUFPR", "aufnr": "AUFNR", "der95": "DER95",
    "der99": "DER99", "auroc_m": "AUROC_M", "adr": "ADR",
}
AXES = {"sem": "sem_level", "cov": "cov_level"}
_AXIS_ALIASES = {"sem": "sem", "semantic": "sem", "sem_level": "sem", "cov": "cov", "covariate": "cov",
                 "cov_level": "cov"}
NA_THRESHOLD = 10
KEY_COLUMNS = ("detector", "dataset", "cell", "cov_level", "sem_level", "n", "n_id", "na")
_CELL_RE = re.compile(r"^cov_(\d+)_sem_(\d+)$")


class EmptyCellError(IsoodError):
    """A cell the grid says is measured (not N/A) got no score at all, or fewer than it should."""


def cell_name(cov_level: int, sem_level: int) -> str:
    """``cov_{c}_sem_{s}`` (0-based levels), the grid's cell name."""
    return f"cov_{int(cov_level)}_sem_{int(sem_level)}"


def _axis(axis: str) -> str:
    try:
        return _AXIS_ALIASES[str(axis).lower()]
    except KeyError:
        raise ValueError(f"unknown axis {axis!r}: pass 'sem' (semantic) or 'cov' (covariate)") from None


# ---------------------------------------------------------------------------------------------- inputs
def _image_cells(cells, n: int) -> pd.DataFrame:
    """Per-image (cov_level, sem_level) as an int frame; -1 = the image is in no cell."""
    if isinstance(cells, pd.DataFrame):
        if {"cov_level", "sem_level"} <= set(cells.columns):
            lv = cells[["cov_level", "sem_level"]]
            ok = lv.notna().all(axis=1)
            cov = lv["cov_level"].where(ok, -1).astype(np.int64).to_numpy().copy()
            sem = lv["sem_level"].where(ok, -1).astype(np.int64).to_numpy().copy()
        elif "cell" in cells.columns:
            return _image_cells(cells["cell"].tolist(), n)
        else:
            raise ValueError("cells frame needs columns cov_level and sem_level (or cell): pass the manifest's "
                             "`images` table")
    else:
        names = list(cells)
        cov = np.full(len(names), -1, np.int64)
        sem = np.full(len(names), -1, np.int64)
        for i, name in enumerate(names):
            if name is None or (isinstance(name, float) and np.isnan(name)) or name == "":
                continue
            m = _CELL_RE.match(str(name))
            if not m:
                raise ValueError(f"cell name {name!r} is not of the form cov_{{c}}_sem_{{s}}: pass grid cell names")
            cov[i], sem[i] = int(m.group(1)), int(m.group(2))
    if len(cov) != n:
        raise ValueError(f"cells has {len(cov)} entries but ood_scores has {n}: pass one cell per OOD image")
    bad = (cov < 0) | (sem < 0)
    cov[bad], sem[bad] = -1, -1
    return pd.DataFrame({"cov_level": cov, "sem_level": sem})


def _grid(levels: pd.DataFrame, na, na_threshold: int) -> pd.DataFrame:
    """The grid's cells: cell, cov_level, sem_level, n (observed), na, expected_n (from a cells table or NaN)."""
    keyed = levels[levels["cov_level"] >= 0]
    counts = keyed.groupby(["cov_level", "sem_level"]).size()
    if isinstance(na, pd.DataFrame):
        need = {"cov_level", "sem_level"}
        if not need <= set(na.columns):
            if "cell" not in na.columns:
                raise ValueError("na table needs columns cov_level, sem_level (or cell) and na: pass the manifest's "
                                 "`cells` table")
            lv = _image_cells(na["cell"].tolist(), len(na))
            na = na.assign(cov_level=lv["cov_level"].to_numpy(), sem_level=lv["sem_level"].to_numpy())
        if "source" in na.columns and na["source"].fillna("").astype(str).nunique() > 1:
            raise ValueError("the cells table has several sources: evaluate one source at a time "
                             "(select its rows of `images` and `cells`)")
        table = na.drop_duplicates(["cov_level", "sem_level"])
        rows = []
        for rec in table.to_dict("records"):
            c, s = int(rec["cov_level"]), int(rec["sem_level"])
            if c < 0 or s < 0:
                continue
            n_obs = int(counts.get((c, s), 0))
            flag = bool(rec["na"]) if "na" in rec and pd.notna(rec.get("na")) else False
            expected = int(rec["n"]) if "n" in rec and pd.notna(rec.get("n")) else np.nan
            rows.append({"cov_level": c, "sem_level": s, "n": n_obs, "na": flag or n_obs < na_threshold,
                         "marked_na": flag, "expected_n": expected})
        listed = {(r["cov_level"], r["sem_level"]) for r in rows}
        stray = [cell_name(c, s) for (c, s) in counts.index if (c, s) not in listed]
        if stray:
            raise ValueError(f"images in cells the cells table does not list: {', '.join(sorted(stray)[:5])}: "
                             "pass the cells table of the same manifest")
    else:
        marked = set() if na is None else {str(x) for x in na}
        rows = [{"cov_level": int(c), "sem_level": int(s), "n": int(k),
                 "na": cell_name(c, s) in marked or int(k) < na_threshold,
                 "marked_na": cell_name(c, s) in marked, "expected_n": np.nan}
                for (c, s), k in counts.items()]
    grid = pd.DataFrame(rows, columns=["cov_level", "sem_level", "n", "na", "marked_na", "expected_n"])
    grid.insert(0, "cell", [cell_name(c, s) for c, s in zip(grid["cov_level"], grid["sem_level"])])
    return grid.sort_values(["cov_level", "sem_level"]).reset_index(drop=True)


def _opt_flags(x, n: int, name: str):
    if x is None:
        return None
    a = np.asarray(x).ravel()
    if a.shape[0] != n:
        raise ValueError(f"{name} has {a.shape[0]} entries but there are {n} images: pass one flag per image")
    return a.astype(bool)


# ------------------------------------------------------------------------------------------ per cell
def evaluate_cells(
    id_scores,
    ood_scores,
    cells,
    *,
    detector: str = "scores",
    dataset: str = "test",
    id_correct=None,
    ood_correct=None,
    train_scores=None,
    train_correct=None,
    na=None,
    na_threshold: int = NA_THRESHOLD,
) -> pd.DataFrame:
    """Every metric of one detector's scores, per grid cell (IS-OOD: the ID test set vs each cell's images).

    ``id_scores`` (N_id,) and ``ood_scores`` (N,) are per-image scores, higher = more ID. ``cells`` gives each OOD
    image's cell: the manifest's ``images`` table (columns ``cov_level``, ``sem_level``; rows without levels are
    in no cell and ignored) or a sequence of names ``cov_{c}_sem_{s}``.

    ``na``: ``None`` (the grid is the cells that have images; N/A = fewer than ``na_threshold`` images), the
    manifest's ``cells`` table (its cells form the grid, its ``na`` flags are honoured, a cell it lists with
    ``n`` images must get exactly ``n`` scores), or a collection of cell names to mark N/A.

    Correctness (optional; booleans "the classifier got this image right"): ``id_correct`` (N_id,) enables
    ``auroc_m`` and ``adr`` (``ood_correct`` (N,) marks OOD images whose label the model gets right, default all
    wrong); with ``train_scores`` and ``train_correct`` of the ID *training* images also ``der95``/``der99``.

    Returns one row per grid cell: ``detector, dataset, cell, cov_level, sem_level, n, n_id, na`` and the
    metric columns (NaN for N/A cells). A measured (non-N/A) cell without any image raises ``EmptyCellError``.
    """
    id_s = M._scores(id_scores, "id_scores")
    ood_s = np.asarray(ood_scores, dtype=np.float64).ravel()
    levels = _image_cells(cells, ood_s.size)
    in_cell = levels["cov_level"].to_numpy() >= 0
    if ood_s.size and not np.all(np.isfinite(ood_s[in_cell])):
        bad = int(np.sum(~np.isfinite(ood_s[in_cell])))
        raise ValueError(f"ood_scores of detector '{detector}' has {bad} non-finite value(s): fix those images")
    id_c = _opt_flags(id_correct, id_s.size, "id_correct")
    ood_c = _opt_flags(ood_correct, ood_s.size, "ood_correct")
    if ood_c is not None and id_c is None:
        raise ValueError("ood_correct needs id_correct too: pass both (or neither)")
    with_der = train_scores is not None or train_correct is not None
    thresholds = None
    if with_der:
        if train_scores is None or train_correct is None or id_c is None:
            raise ValueError("DER needs train_scores, train_correct and id_correct together: pass all three")
        thresholds = {name: M.der_threshold(train_scores, train_correct, rate)
                      for name, rate in (("der95", 0.95), ("der99", 0.99))}
    grid = _grid(levels, na, na_threshold)
    for rec in grid.itertuples():
        listed = 0 if np.isnan(rec.expected_n) else int(rec.expected_n)
        if rec.n == 0 and not rec.marked_na and (listed > 0 or not rec.na):
            raise EmptyCellError(f"detector '{detector}', {dataset} cell {rec.cell}: no image has a score "
                                 f"(the grid lists {listed} images and does not mark it N/A): score its images")
        if not np.isnan(rec.expected_n) and rec.n != rec.expected_n and not rec.marked_na:
            raise EmptyCellError(f"detector '{detector}', {dataset} cell {rec.cell}: {rec.n} scores for the "
                                 f"{int(rec.expected_n)} images the manifest lists: score every image of the cell")

    metric_names = list(BASE_METRICS)
    if id_c is not None:
        metric_names += list(MODEL_VIEW_METRICS)
    if with_der:
        metric_names += list(DER_METRICS)
    cov_all = levels["cov_level"].to_numpy()
    sem_all = levels["sem_level"].to_numpy()
    rows = []
    # inputs were validated above (finite, aligned): skip sklearn's per-call re-validation (~4x faster per cell)
    with sklearn.config_context(assume_finite=True, skip_parameter_validation=True):
        for rec in grid.itertuples():
            rows.append(_cell_row(rec, detector, dataset, id_s, ood_s, cov_all, sem_all, id_c, ood_c,
                                  metric_names, thresholds))
    return pd.DataFrame(rows, columns=list(KEY_COLUMNS) + metric_names)


def _cell_row(rec, detector, dataset, id_s, ood_s, cov_all, sem_all, id_c, ood_c, metric_names, thresholds):
    """One grid cell's row of ``evaluate_cells`` (metrics only for a measured cell)."""
    row = {"detector": detector, "dataset": dataset, "cell": rec.cell, "cov_level": rec.cov_level,
           "sem_level": rec.sem_level, "n": rec.n, "n_id": int(id_s.size), "na": bool(rec.na)}
    values = dict.fromkeys(metric_names, np.nan)
    if not rec.na:
        sel = (cov_all == rec.cov_level) & (sem_all == rec.sem_level)
        o = ood_s[sel]
        values["auroc"] = M.auroc(id_s, o)
        values["fpr95"] = M.fpr_at_tpr(id_s, o, 0.95, convention="openood")
        values["fpr95_id"] = M.fpr_at_tpr(id_s, o, 0.95, convention="id-positive")
        values["aupr_in"] = M.aupr_in(id_s, o)
        values["aupr_out"] = M.aupr_out(id_s, o)
        t = M.autc(id_s, o)
        values["autc"], values["aufpr"], values["aufnr"] = t.autc, t.aufpr, t.aufnr
        if id_c is not None:
            oc = None if ood_c is None else ood_c[sel]
            values["auroc_m"] = M.auroc_model(id_s, o, id_correct=id_c, ood_correct=oc)
            values["adr"] = M.adr(id_s, o, id_correct=id_c, ood_correct=oc)
        if thresholds is not None:
            values.update(_der_at(id_s, o, id_c, None if ood_c is None else ood_c[sel], thresholds))
    return {**row, **values}


def _der_at(id_s, o, id_c, oc, thresholds: Mapping[str, float]) -> dict:
    """DER (metrics.der) with the precomputed training thresholds: (FN + FP) / N over ID test + the cell."""
    s = np.concatenate([id_s, o])
    c = np.concatenate([id_c, np.zeros(o.size, bool) if oc is None else oc])
    out = {}
    for name, gamma in thresholds.items():
        accepted = s >= gamma
        out[name] = float((np.sum(c & ~accepted) + np.sum(~c & accepted)) / s.size)
    return out


def metric_columns(per_cell: pd.DataFrame) -> list[str]:
    """The metric columns present in a per-cell table, in ``ALL_METRICS`` order."""
    return [m for m in ALL_METRICS if m in per_cell.columns and per_cell[m].notna().any()]


# ------------------------------------------------------------------------------------------ per level
def _groups(per_cell: pd.DataFrame) -> Iterable[tuple[tuple[str, str], pd.DataFrame]]:
    df = per_cell
    if "detector" not in df.columns:
        df = df.assign(detector="scores")
    if "dataset" not in df.columns:
        df = df.assign(dataset="test")
    return df.groupby(["detector", "dataset"], sort=False)


def level_curves(per_cell: pd.DataFrame, metric: str = "auroc", axis: str = "sem") -> pd.DataFrame:
    """Per-level values of ``metric`` along ``axis`` ('sem' or 'cov'): the mean over the level's non-N/A cells.

    One row per (detector, dataset, level) with ``value`` (NaN when every cell of that level is N/A) and
    ``n_cells`` (the non-N/A cells averaged). Levels are those of the grid in ``per_cell`` (N/A cells included),
    so an all-N/A level keeps its place (IS-OOD, Sec. 4: level ``i`` is the i-th of the 8 levels).
    """
    if metric not in per_cell.columns:
        raise ValueError(f"metric {metric!r} is not in the per-cell table: pass one of {', '.join(metric_columns(per_cell))}")
    return _curves(per_cell, [metric], [_axis(axis)])


def _curves(per_cell: pd.DataFrame, metrics: Sequence[str], axes: Sequence[str]) -> pd.DataFrame:
    cols = ["detector", "dataset", "axis", "level", "metric", "value", "n_cells"]
    df = per_cell
    if "detector" not in df.columns:
        df = df.assign(detector="scores")
    if "dataset" not in df.columns:
        df = df.assign(dataset="test")
    if df.empty or not metrics:
        return pd.DataFrame(columns=cols)
    keys = ["detector", "dataset"]
    measured = ~df["na"].astype(bool)
    parts = []
    for ax in axes:
        col = AXES[ax]
        grid = df[keys + [col]].drop_duplicates()  # every level of the grid, N/A cells included
        long = df.loc[measured, keys + [col] + list(metrics)].melt(id_vars=keys + [col], var_name="metric")
        stats = long.groupby(keys + [col, "metric"], sort=False)["value"].agg(["mean", "count"])
        full = grid.merge(pd.DataFrame({"metric": list(metrics)}), how="cross")
        full = full.merge(stats.reset_index(), on=keys + [col, "metric"], how="left")
        full = full.rename(columns={col: "level", "mean": "value", "count": "n_cells"})
        full["axis"] = ax
        parts.append(full)
    out = pd.concat(parts, ignore_index=True)
    out["n_cells"] = out["n_cells"].fillna(0).astype(np.int64)
    out["level"] = out["level"].astype(np.int64)
    out["value"] = out["value"].astype(np.float64)
    # order: detector/dataset as first seen, then axis, metric (given order), level
    det_order = {k: i for i, k in enumerate(dict.fromkeys(zip(df["detector"], df["dataset"])))}
    out["_g"] = [det_order[k] for k in zip(out["detector"], out["dataset"])]
    out["_a"] = out["axis"].map({a: i for i, a in enumerate(axes)})
    out["_m"] = out["metric"].map({m: i for i, m in enumerate(metrics)})
    out = out.sort_values(["_a", "_m", "_g", "level"], kind="stable")
    return out[cols].reset_index(drop=True)


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
    for (det, ds, ax, metric), g in curves.groupby(["detector", "dataset", "axis", "metric"], sort=False):
        x = g.sort_values("level")["value"].to_numpy(dtype=np.float64)
        defined = x[np.isfinite(x)]
        rows.append({
            "detector": det, "dataset": ds, "axis": ax, "metric": metric,
            "correlation": M.level_correlation(x), "sensitivity": M.level_sensitivity(x),
            "first": float(defined[0]) if defined.size else np.nan,
            "last": float(defined[-1]) if defined.size else np.nan,
            "n_levels": int(defined.size),
        })
    return pd.DataFrame(rows, columns=["detector", "dataset", "axis", "metric", "correlation", "sensitivity",
                                       "first", "last", "n_levels"])


def detector_means(per_cell: pd.DataFrame, metrics: Sequence[str] | None = None) -> pd.DataFrame:
    """Mean of each metric over the non-N/A cells, per detector and dataset (plus the cell counts)."""
    metrics = list(metrics) if metrics is not None else metric_columns(per_cell)
    rows = []
    for (det, ds), g in _groups(per_cell):
        ok = g[~g["na"].astype(bool)]
        rows.append({"detector": det, "dataset": ds, "cells": int(len(ok)), "cells_na": int(len(g) - len(ok)),
                     **{m: float(ok[m].mean()) if len(ok) else np.nan for m in metrics}})
    return pd.DataFrame(rows, columns=["detector", "dataset", "cells", "cells_na", *metrics])


# ------------------------------------------------------------------------------------------ all at once
def one_dataset(rows: pd.DataFrame, dataset: str | None = None, owner: str = "") -> pd.DataFrame:
    """The rows of ``dataset``; with none named, all rows when they hold a single dataset, else ValueError
    (``owner``, e.g. "detector 'msp' has ", prefixes the message)."""
    if dataset is not None:
        return rows[rows["dataset"] == dataset]
    if rows["dataset"].nunique() > 1:
        raise ValueError(f"{owner}several datasets ({', '.join(rows['dataset'].unique())}): pass dataset=")
    return rows


@dataclass
class CellEvaluation:
    """Per-cell metrics and what is derived from them (``evaluate_scores``; stack several with ``concat``)."""

    per_cell: pd.DataFrame
    levels: pd.DataFrame = field(default=None)
    summary: pd.DataFrame = field(default=None)
    means: pd.DataFrame = field(default=None)

    def __post_init__(self) -> None:
        if self.levels is None:
            self.levels = all_level_curves(self.per_cell)
        if self.summary is None:
            self.summary = summary_table(self.per_cell)
        if self.means is None:
            self.means = detector_means(self.per_cell)

    @property
    def detectors(self) -> list[str]:
        return list(dict.fromkeys(self.per_cell["detector"]))

    @property
    def datasets(self) -> list[str]:
        return list(dict.fromkeys(self.per_cell["dataset"]))

    @property
    def metrics(self) -> list[str]:
        return metric_columns(self.per_cell)

    def curve(self, detector: str, metric: str = "auroc", axis: str = "sem", dataset: str | None = None) -> np.ndarray:
        """One level curve as an array (level order), e.g. ``result.curve('msp', 'auroc', 'sem')``."""
        ax = _axis(axis)
        c = self.levels[(self.levels["detector"] == detector) & (self.levels["metric"] == metric)
                        & (self.levels["axis"] == ax)]
        c = one_dataset(c, dataset)
        if c.empty:
            raise ValueError(f"no curve for detector {detector!r}, metric {metric!r}: have {', '.join(self.detectors)}")
        return c.sort_values("level")["value"].to_numpy()

    @staticmethod
    def concat(parts: Iterable["CellEvaluation"]) -> "CellEvaluation":
        parts = list(parts)
        if not parts:
            raise ValueError("nothing to concatenate: pass at least one CellEvaluation")
        return CellEvaluation(pd.concat([p.per_cell for p in parts], ignore_index=True))


def evaluate_scores(
    id_scores,
    ood_scores,
    cells,
    *,
    dataset: str = "test",
    detector: str = "scores",
    id_correct=None,
    ood_correct=None,
    train_scores=None,
    train_correct=None,
    na=None,
    na_threshold: int = NA_THRESHOLD,
) -> CellEvaluation:
    """Evaluate per-image scores per grid cell without any model (see the module docstring for an example).

    ``id_scores`` / ``ood_scores`` (and ``train_scores``) are arrays for one detector (named ``detector``) or
    dicts ``{detector: array}`` with the same keys; ``cells``, ``na`` and the correctness flags are as in
    ``evaluate_cells`` and shared by all detectors. Returns a ``CellEvaluation`` with ``per_cell``, ``levels``
    (every metric, both axes), ``summary`` (Table 1) and ``means`` (per-detector mean over non-N/A cells).
    """
    if isinstance(id_scores, Mapping) != isinstance(ood_scores, Mapping):
        raise ValueError("pass id_scores and ood_scores both as arrays or both as {detector: array} dicts")
    if not isinstance(id_scores, Mapping):
        id_scores, ood_scores = {detector: id_scores}, {detector: ood_scores}
        if train_scores is not None and not isinstance(train_scores, Mapping):
            train_scores = {detector: train_scores}
    if set(id_scores) != set(ood_scores):
        raise ValueError(f"id_scores has detectors {sorted(id_scores)} but ood_scores {sorted(ood_scores)}: "
                         "pass the same keys")
    if train_scores is not None and not isinstance(train_scores, Mapping):
        raise ValueError("with several detectors pass train_scores as {detector: array} too")
    parts = []
    for det in id_scores:
        tr = None if train_scores is None else train_scores.get(det)
        if train_scores is not None and tr is None:
            raise ValueError(f"train_scores has no entry for detector '{det}': pass one per detector")
        parts.append(evaluate_cells(
            id_scores[det], ood_scores[det], cells, detector=str(det), dataset=dataset, id_correct=id_correct,
            ood_correct=ood_correct, train_scores=tr, train_correct=train_correct if tr is not None else None,
            na=na, na_threshold=na_threshold))
    return CellEvaluation(pd.concat(parts, ignore_index=True))
