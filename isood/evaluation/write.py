"""L3: an evaluation as an ``evaluation`` manifest: Parquet tables (``cell_metrics``, ``level_curves``, ``table1``,
``detector_means``; with them ``scores``, ``sanity``, ``cell_metrics_random``, ``set_metrics`` (one row per OOD
set, ``assemble.set_metrics``); after a leak audit ``leak_effect`` and ``leak_ranking``, ``levels.leak_effect`` /
``leak_ranking``), ``results/*.csv`` copies (and any ``extra_files``, e.g. the release's ``results/<method>.csv``),
``plots/*.png`` (none without a grid), ``report.html``, ``summary.md`` and the dataset card; ``manifest.json``
last.
"""

from __future__ import annotations

import os
from typing import Any, Mapping, Sequence

import pandas as pd

import manifests
from isood.kinds import EVALUATION

from .cells import CellEvaluation
from .levels import leak_effect, leak_pairs, leak_ranking
from .plots import plot_metric_names, render_plots
from .report import render_html, render_markdown, table1_frame

__all__ = ["evaluation_tables", "evaluation_files", "write_evaluation"]


def evaluation_tables(result: CellEvaluation, *, scores: pd.DataFrame | None = None,
                      sanity: pd.DataFrame | None = None, random_per_cell: pd.DataFrame | None = None,
                      set_metrics: pd.DataFrame | None = None) -> dict[str, pd.DataFrame]:
    """The manifest's tables by name (optional ones only when given)."""
    tables = {"cell_metrics": result.per_cell, "level_curves": result.levels, "table1": result.summary,
              "detector_means": result.means}
    leaks = leak_pairs(result.per_cell)
    optional = {"scores": scores, "sanity": sanity, "cell_metrics_random": random_per_cell, "set_metrics": set_metrics,
                "leak_effect": leak_effect(result.per_cell) if leaks else None,
                "leak_ranking": leak_ranking(result.per_cell) if leaks else None}
    return {**tables, **{k: v for k, v in optional.items() if v is not None}}


def evaluation_files(result: CellEvaluation, tables: Mapping[str, pd.DataFrame], images: Mapping[str, bytes], *,
                     title: str, meta: Mapping[str, Any] | None, sanity: pd.DataFrame | None,
                     set_metrics: pd.DataFrame | None = None) -> dict[str, bytes | str]:
    """The manifest's other files: the plots, CSV copies of the tables (not ``scores``), Table 1 laid out wide,
    the HTML report and the markdown summary."""
    files: dict[str, bytes | str] = dict(images)
    for name, t in tables.items():
        if name != "scores":
            files[f"results/{name}.csv"] = t.to_csv(index=False, float_format="%.6g")
    files["results/table1_wide.csv"] = table1_frame(result).to_csv(index=False, float_format="%.6g")
    files["report.html"] = render_html(result, images, title=title, meta=meta, sanity=sanity, sets=set_metrics)
    files["summary.md"] = render_markdown(result, title=title, meta=meta, sanity=sanity, sets=set_metrics)
    return files


def write_evaluation(result: CellEvaluation, out: str | os.PathLike, *, config: Mapping[str, Any] | None = None,
                     inputs: Sequence[dict] = (), scores: pd.DataFrame | None = None,
                     sanity: pd.DataFrame | None = None, random_per_cell: pd.DataFrame | None = None,
                     metrics: Sequence[str] | str | None = None,
                     heatmap_metrics: Sequence[str] | str | None = None,
                     meta: Mapping[str, Any] | None = None, title: str = "isood evaluation",
                     summary: Mapping[str, Any] | None = None, argv: list[str] | None = None,
                     set_metrics: pd.DataFrame | None = None,
                     extra_files: Mapping[str, bytes | str] | None = None) -> manifests.Manifest:
    """Write a ``CellEvaluation`` (plus optional per-image ``scores`` and the sanity tables) as an ``evaluation``
    manifest in ``out`` (through ``manifests.writing``). ``metrics`` / ``heatmap_metrics``: what to draw
    (``plots.plot_metric_names``: default AUROC and FPR@95, ``'all'`` every computed metric; every metric is in the
    tables and CSVs whatever is drawn). ``set_metrics``: the per-set table (``assemble.set_metrics``), also in the
    report; ``extra_files``: more files by relative path. Returns the manifest's typed view."""
    images: dict[str, bytes] = {}
    if not result.per_cell.empty:  # image lists only: no grid, nothing to draw
        for chosen in (metrics, heatmap_metrics):
            plot_metric_names(result, chosen)  # a metric that was not computed: one line, before anything is drawn
        images = render_plots(result, metrics=metrics, heatmap_metrics=heatmap_metrics)
    tables = evaluation_tables(result, scores=scores, sanity=sanity, random_per_cell=random_per_cell,
                               set_metrics=set_metrics)
    files = evaluation_files(result, tables, images, title=title, meta=meta, sanity=sanity, set_metrics=set_metrics)
    files.update(extra_files or {})
    n_na = int(result.per_cell["na"].sum())
    summ = {"cells": int(len(result.per_cell)), "cells_na": n_na, "plots": len(images), **(summary or {})}
    with manifests.writing(out, EVALUATION) as o:
        manifests.write_with_card(
            o.work, kind=EVALUATION, tables=tables, config=dict(config or {}), inputs=list(inputs), files=files,
            summary=summ, note=f"{len(result.detectors)} detectors on {', '.join(result.datasets)}", argv=argv,
            title=title)
    return manifests.read(o.final, kind=EVALUATION)
