"""The report's section on a leak audit (``isood evaluate --leak-audit``: an ``images`` column in the per-cell
table): each grid dataset's means on all images beside the leak-free ones, where removing the leaking images
changes the detectors' ranking (``levels.leak_ranking``, in words and as a table) and the difference heatmaps;
in HTML and in markdown."""

from __future__ import annotations

import html
from typing import Mapping, Sequence

import numpy as np
import pandas as pd

from isood.science.cells import CellEvaluation
from isood.science.levels import detector_means, leak_pairs, leak_ranking, measured_in_both
from isood.science.metrics import metric_label

from .blocks import figure, html_table, markdown_table
from .plots import leak_diff_name
from .table1 import TABLE1_METRICS

__all__ = ["leak_means", "ranking_summary", "leak_html", "leak_markdown"]


def leak_means(result: CellEvaluation, dataset: str, free: str, metrics: Sequence[str]) -> pd.DataFrame:
    """Per detector: each metric's mean over the cells measured on all images and on the leak-free ones
    (``levels.measured_in_both``), both ways, and the difference (leak-free - all)."""
    a, b = measured_in_both(result.per_cell, dataset, free)
    ma = detector_means(a, metrics).set_index("detector")
    mb = detector_means(b, metrics).set_index("detector")
    rows = []
    for det in dict.fromkeys(result.per_cell.loc[result.per_cell["dataset"] == dataset, "detector"]):
        row = {"detector": det, "cells": int(ma.loc[det, "cells"]) if det in ma.index else 0}
        for m in metrics:
            va = float(ma.loc[det, m]) if det in ma.index else np.nan
            vb = float(mb.loc[det, m]) if det in mb.index else np.nan
            label = metric_label(m).split(" ")[0]
            row.update({f"{label} all": va, f"{label} leak-free": vb, f"{label} diff": vb - va})
        rows.append(row)
    return pd.DataFrame(rows)


def ranking_summary(ranking: pd.DataFrame, dataset: str, metric: str) -> str:
    """One sentence: in how many cells / levels removing the leaking images changes the detectors' order of
    ``metric``, and the order over the cell means."""
    r = ranking[(ranking["dataset"] == dataset) & (ranking["metric"] == metric)]
    if r.empty:
        return f"{metric_label(metric)}: fewer than two detectors measured in both; no ranking to compare."
    parts = []
    scopes = (("cell", "cells measured in both"), ("sem_level", "semantic levels"), ("cov_level", "covariate levels"))
    for scope, what in scopes:
        g = r[r["scope"] == scope]
        changed = g.loc[g["changed"].astype(bool), "key"].tolist()
        shown = f" ({', '.join(changed[:8])}{', ...' if len(changed) > 8 else ''})" if changed else ""
        parts.append(f"{len(changed)} of {len(g)} {what}{shown}")
    mean = r[r["scope"] == "mean"]
    tail = ""
    if len(mean):
        m = mean.iloc[0]
        how = f"changes from {m['order_all']} to " if m["changed"] else "stays "
        tail = f"; over the mean of the cells it {how}{m['order_leak_free']} (Kendall tau {m['kendall_tau']:.2f})"
    return f"{metric_label(metric)}: the detectors' order changes in " + ", ".join(parts) + tail + "."


def leak_html(result: CellEvaluation, images: Mapping[str, bytes]) -> list[str]:
    """The report section comparing all images with the leak-free ones (empty without a leak audit)."""
    pairs = leak_pairs(result.per_cell)
    if not pairs:
        return []
    heads = [m for m in TABLE1_METRICS if m in result.metrics] or result.metrics[:1]
    ranking = leak_ranking(result.per_cell, heads)
    parts = ["<h2>Leaks: all images vs leak-free images</h2>",
             '<p class="note">Each grid dataset is scored twice: on all its images and without the images the leak '
             'audit flags (ID classes, their hypernyms and hyponyms by default): dataset <code>&lt;name&gt;-leak-free'
             '</code>. diff = leak-free - all. Means, level values and rankings use the cells measured in both '
             '(a cell can become N/A once its leaks are gone). The ranking compares the detectors\' order on both, '
             'per cell, per level and over the mean of the cells (Kendall tau between the two sets of values).</p>']
    for ds, free in pairs.items():
        parts.append(f"<h3>{html.escape(ds)}: mean over the cells measured in both</h3>")
        parts.append(html_table(leak_means(result, ds, free, heads), left=("detector",)))
        parts.append("<ul>" + "".join(f"<li>{html.escape(ranking_summary(ranking, ds, m))}</li>" for m in heads)
                     + "</ul>")
        changed = ranking[(ranking["dataset"] == ds) & ranking["changed"].astype(bool)]
        if len(changed):
            cols = ["scope", "key", "metric", "order_all", "order_leak_free", "kendall_tau"]
            parts.append(f"<h3>{html.escape(ds)}: where the ranking changes</h3>"
                         + html_table(changed[cols].head(40), left=cols[:5]))
        for det in dict.fromkeys(result.per_cell.loc[result.per_cell["dataset"] == ds, "detector"]):
            figs = [figure(images[leak_diff_name(ds, det, m)], f"{det}: {metric_label(m)} leak-free - all")
                    for m in result.metrics if leak_diff_name(ds, det, m) in images]
            if figs:
                parts.append(f"<h3>{html.escape(det)}: difference</h3><div class=\"grid\">{''.join(figs)}</div>")
    return parts


def leak_markdown(result: CellEvaluation) -> list[str]:
    pairs = leak_pairs(result.per_cell)
    if not pairs:
        return []
    heads = [m for m in TABLE1_METRICS if m in result.metrics] or result.metrics[:1]
    ranking = leak_ranking(result.per_cell, heads)
    out = ["## Leaks: all images vs leak-free images", ""]
    for ds, free in pairs.items():
        out += [f"### {ds}", "", markdown_table(leak_means(result, ds, free, heads)), ""]
        out += [f"- {ranking_summary(ranking, ds, m)}" for m in heads] + [""]
    return out
