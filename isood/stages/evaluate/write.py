"""An evaluation as an ``evaluation`` manifest: Parquet tables (``cell_metrics``, ``level_curves``, ``table1``,
``detector_means``; with them ``scores``, ``sanity``, ``cell_metrics_random``, ``set_metrics`` (one row per OOD
set, ``assemble.set_metrics``); after a leak audit ``leak_effect`` and ``leak_ranking``, ``levels.leak_effect`` /
``leak_ranking``; with per-image ``scores`` the bootstrap intervals ``cell_intervals`` and ``table1_intervals``),
``results/*.csv`` copies (and any ``extra_files``, e.g. the release's ``results/<method>.csv``), Table 1 in the
IS-OOD paper's layout (``results/table1.tex``, ``results/table1.md``), the per-set table in OpenOOD's layout
(``results/sets.tex``, ``results/sets.md``: ``set_tables``; with OOD sets), ``plots/*.png`` (+ ``.svg`` / ``.pdf``;
none without a grid), ``report.html``, ``summary.md`` and the dataset card; ``manifest.json``
last.

Bootstrap intervals (``bootstrap_tables``): per grid dataset, the ID test images and every measured cell's images
are resampled with replacement ``bootstrap`` times (``metrics.bootstrap_replicates``, seeded: one seed, the same
intervals), each replicate's AUROC and FPR@95 per cell, its level curves and their Table 1 correlation and
sensitivity are recomputed, and the percentile 95% intervals are kept (``levels.cell_intervals`` /
``levels.table1_intervals``). Under the release's Table 1 convention the replicates are those of its metrics
(AUROC and OpenOOD's FPR@95, ``fpr95_openood``) and Table 1's intervals are on its own scale: every replicate's
Table 1 by the release's rule, in percent rounded as it rounds (``conventions.release_table1_intervals``). The cost is O(bootstrap x detectors x scored images): about 35 ns per
(replicate, detector, image) on one core, e.g. 13 s for 200 replicates of 5 detectors on 50,000 ID + 320,000 OOD
images; ``bootstrap=0`` leaves the intervals out.
"""

from __future__ import annotations

import os
from typing import Any, Mapping, Sequence

import numpy as np
import pandas as pd

import manifests
from isood.core.defaults import CI_LEVEL, DEFAULT_BOOTSTRAP
from isood.core.optspec import check_field
from isood.kinds import EVALUATION

from isood.science.cells import CellEvaluation
from isood.science.conventions import CONVENTION_BOOTSTRAP, release_table1_intervals
from isood.science.levels import (INTERVAL_COLUMNS, TABLE1_INTERVAL_COLUMNS, cell_intervals, leak_effect, leak_pairs, leak_ranking,
                     table1_intervals)
from isood.science.bootstrap import bootstrap_replicates
from isood.report.plots import plot_metric_names, render_plots
from isood.report.html import render_html, render_markdown
from isood.report.table1 import table1_frame, table1_latex, table1_markdown
from isood.report.set_tables import sets_latex, sets_markdown

from .options import EvaluateOptions

__all__ = ["evaluation_tables", "evaluation_files", "write_evaluation", "bootstrap_tables"]


def _id_test_name() -> str:
    """The dataset name of the ID test rows of a ``scores`` table (``assemble.ID_TEST``; imported here, at first
    use, because ``assemble`` loads torch)."""
    from .assemble import ID_TEST

    return ID_TEST


def bootstrap_tables(result: CellEvaluation, scores: pd.DataFrame, *, n_boot: int = DEFAULT_BOOTSTRAP,
                     seed: int = 0, level: float = CI_LEVEL,
                     id_name: str | None = None) -> dict[str, pd.DataFrame]:
    """``{"cell_intervals", "table1_intervals"}`` of ``result`` from the per-image ``scores`` table
    (``assemble.scores_table``: dataset, cell, one column per detector; the ID test rows under ``id_name``, a
    leak-free dataset from its base dataset's rows without ``leak``); see the module docstring. A dataset whose
    rows do not match its per-cell counts, or a detector with non-finite scores, gets no interval (never a wrong
    one)."""
    id_name = id_name or _id_test_name()
    per_cell = result.per_cell
    metrics = [m for m in CONVENTION_BOOTSTRAP[result.convention] if m in per_cell.columns]
    intervals_of = release_table1_intervals if result.convention == "release" else table1_intervals
    empty = {"cell_intervals": pd.DataFrame(columns=INTERVAL_COLUMNS),
             "table1_intervals": pd.DataFrame(columns=TABLE1_INTERVAL_COLUMNS)}
    if not metrics or n_boot <= 0 or scores is None or "cell" not in scores.columns:
        return empty
    base_of = {free: base for base, free in leak_pairs(per_cell).items()}
    id_rows = scores[scores["dataset"] == id_name]
    ci, t1 = [], []
    for ds in result.datasets:
        rows = scores[scores["dataset"] == base_of.get(ds, ds)]
        if ds in base_of and "leak" in rows.columns:
            rows = rows[~rows["leak"].astype(bool)]
        sub = per_cell[(per_cell["dataset"] == ds) & ~per_cell["na"].astype(bool)]
        if sub.empty:  # an image list (no grid) or every cell N/A: nothing to resample
            continue
        n_levels = int(max(per_cell.loc[per_cell["dataset"] == ds, ["cov_level", "sem_level"]].max()) + 1)
        cells = list(dict.fromkeys(sub["cell"]))
        by_cell = {c: g for c, g in rows.groupby("cell", sort=False)}
        dets = [d for d in dict.fromkeys(sub["detector"]) if d in scores.columns
                and np.isfinite(id_rows[d].to_numpy(dtype=np.float64)).all()
                and np.isfinite(rows[d].to_numpy(dtype=np.float64)).all()]
        counts = sub.drop_duplicates("cell").set_index("cell")["n"]
        if not cells or not dets or not len(id_rows) or any(len(by_cell.get(c, ())) != counts[c] for c in cells):
            continue
        reps = bootstrap_replicates(id_rows[dets].to_numpy(dtype=np.float64).T,
                                    [by_cell[c][dets].to_numpy(dtype=np.float64).T for c in cells],
                                    n_boot=n_boot, seed=seed, metrics=metrics)
        for k, det in enumerate(dets):
            cells_df = sub[sub["detector"] == det].set_index("cell").loc[cells].reset_index()
            r = {m: reps[m][k] for m in metrics}
            ci.append(cell_intervals(cells_df, r, level=level))
            t1.append(intervals_of(cells_df, r, n_levels, summary=result.summary, level=level))
    if not ci:
        return empty
    return {"cell_intervals": pd.concat(ci, ignore_index=True), "table1_intervals": pd.concat(t1, ignore_index=True)}


def evaluation_tables(result: CellEvaluation, *, scores: pd.DataFrame | None = None,
                      sanity: pd.DataFrame | None = None, random_per_cell: pd.DataFrame | None = None,
                      intervals: Mapping[str, pd.DataFrame] | None = None,
                      set_metrics: pd.DataFrame | None = None) -> dict[str, pd.DataFrame]:
    """The manifest's tables by name (optional ones only when given; intervals only when they hold rows)."""
    tables = {"cell_metrics": result.per_cell, "level_curves": result.levels, "table1": result.summary,
              "detector_means": result.means}
    leaks = leak_pairs(result.per_cell)
    optional = {"scores": scores, "sanity": sanity, "cell_metrics_random": random_per_cell, "set_metrics": set_metrics,
                "leak_effect": leak_effect(result.per_cell) if leaks else None,
                "leak_ranking": leak_ranking(result.per_cell) if leaks else None,
                **{k: v for k, v in (intervals or {}).items() if len(v)}}
    return {**tables, **{k: v for k, v in optional.items() if v is not None}}


def evaluation_files(result: CellEvaluation, tables: Mapping[str, pd.DataFrame], images: Mapping[str, bytes], *,
                     title: str, meta: Mapping[str, Any] | None, sanity: pd.DataFrame | None,
                     set_metrics: pd.DataFrame | None = None) -> dict[str, bytes | str]:
    """The manifest's other files: the plots, CSV copies of the tables (not ``scores``), Table 1 laid out wide and
    in the IS-OOD paper's layout (LaTeX, markdown), the HTML report and the markdown summary."""
    files: dict[str, bytes | str] = dict(images)
    for name, t in tables.items():
        if name != "scores":
            files[f"results/{name}.csv"] = t.to_csv(index=False, float_format="%.6g")
    intervals = {k: tables[k] for k in ("cell_intervals", "table1_intervals") if k in tables}
    t1 = intervals.get("table1_intervals")
    files["results/table1_wide.csv"] = table1_frame(result).to_csv(index=False, float_format="%.6g")
    files["results/table1.tex"] = table1_latex(result, t1)
    files["results/table1.md"] = table1_markdown(result, t1)
    if set_metrics is not None and len(set_metrics):
        files["results/sets.tex"] = sets_latex(set_metrics)
        files["results/sets.md"] = sets_markdown(set_metrics)
    files["report.html"] = render_html(result, images, title=title, meta=meta, sanity=sanity, intervals=intervals,
                                       sets=set_metrics)
    files["summary.md"] = render_markdown(result, title=title, meta=meta, sanity=sanity, intervals=intervals,
                                          sets=set_metrics)
    return files


def write_evaluation(result: CellEvaluation, out: str | os.PathLike, *, config: Mapping[str, Any] | None = None,
                     inputs: Sequence[dict] = (), scores: pd.DataFrame | None = None,
                     sanity: pd.DataFrame | None = None, random_per_cell: pd.DataFrame | None = None,
                     metrics: Sequence[str] | str | None = None,
                     heatmap_metrics: Sequence[str] | str | None = None,
                     meta: Mapping[str, Any] | None = None, title: str = "isood evaluation",
                     summary: Mapping[str, Any] | None = None, argv: list[str] | None = None,
                     bootstrap: int = DEFAULT_BOOTSTRAP, seed: int = 0,
                     set_metrics: pd.DataFrame | None = None,
                     extra_files: Mapping[str, bytes | str] | None = None,
                     mosaics: Mapping[str, bytes] | None = None) -> manifests.Manifest:
    """Write a ``CellEvaluation`` (plus optional per-image ``scores`` and the sanity tables) as an ``evaluation``
    manifest in ``out`` (through ``manifests.writing``). ``metrics`` / ``heatmap_metrics``: what to draw
    (``plots.plot_metric_names``: default AUROC and FPR@95, ``'all'`` every computed metric; every metric is in the
    tables and CSVs whatever is drawn). With ``scores``, ``bootstrap`` resamples (seeded by ``seed``; 0: none) give
    the 95% intervals (``bootstrap_tables``). ``set_metrics``: the per-set table (``assemble.set_metrics``), also
    in the report; ``extra_files``: more files by relative path; ``mosaics``: the grids' mosaics
    (``mosaic.grid_mosaics``), written and shown in the report. Returns the manifest's typed view."""
    check_field(EvaluateOptions, "bootstrap", bootstrap)
    images: dict[str, bytes] = {}
    if not result.per_cell.empty:  # image lists only: no grid, nothing to draw
        for chosen in (metrics, heatmap_metrics):
            plot_metric_names(result, chosen)  # a metric that was not computed: one line, before anything is drawn
        images = render_plots(result, metrics=metrics, heatmap_metrics=heatmap_metrics)
    images.update(mosaics or {})
    intervals = bootstrap_tables(result, scores, n_boot=int(bootstrap), seed=seed) \
        if scores is not None and not result.per_cell.empty else None
    tables = evaluation_tables(result, scores=scores, sanity=sanity, random_per_cell=random_per_cell,
                               intervals=intervals, set_metrics=set_metrics)
    files = evaluation_files(result, tables, images, title=title, meta=meta, sanity=sanity, set_metrics=set_metrics)
    files.update(extra_files or {})
    n_na = int(result.per_cell["na"].sum())
    summ = {"cells": int(len(result.per_cell)), "cells_na": n_na, "plots": len(images),
            "bootstrap": int(bootstrap) if intervals and len(intervals["cell_intervals"]) else 0, **(summary or {})}
    with manifests.writing(out, EVALUATION) as o:
        manifests.write_with_card(
            o.work, kind=EVALUATION, tables=tables, config=dict(config or {}), inputs=list(inputs), files=files,
            summary=summ, note=f"{len(result.detectors)} detectors on {', '.join(result.datasets)}", argv=argv,
            title=title)
    return manifests.read(o.final, kind=EVALUATION)
