"""The evaluation report: one self-contained HTML page (PNG plots embedded as base64 ``data:`` URIs, inline CSS,
no script, no external link or resource; a table of contents linking its sections) and a markdown summary
(Table 1 + per-detector mean metrics); Table 1 in the IS-OOD paper's layout as LaTeX and markdown
(``table1_latex`` / ``table1_markdown``: rows = detectors, per dataset; columns = FPR@95 and AUROC x semantic /
covariate shift x correlation / sensitivity), with bootstrap 95% intervals when given
(``levels.cell_intervals`` / ``levels.table1_intervals``).

All are pure string builders over a ``CellEvaluation`` and ``{relative path: bytes}`` (``plots.render_plots``; only
the PNGs are embedded).
After a leak audit (``images`` column in the per-cell table) both get a section comparing all images with the
leak-free ones: the means side by side, where removing the leaking images changes the detectors' ranking
(``levels.leak_ranking``, in words and as a table) and the difference heatmaps.
"""

from __future__ import annotations

import base64
import html
import math
import re
from typing import Mapping, Sequence

import numpy as np
import pandas as pd

from isood.science.cells import CellEvaluation
from isood.science.levels import detector_means, leak_pairs, leak_ranking, measured_in_both
from isood.science.metrics import lower_is_better, metric_label
from .mosaic import mosaic_name
from .plots import compare_name, heatmap_name, leak_diff_name, level_curve_name

__all__ = ["render_html", "render_markdown", "markdown_table", "table1_frame", "leak_means", "ranking_summary",
           "table1_paper", "table1_latex", "table1_markdown", "section_id"]

_TABLE1_METRICS = ("fpr95", "auroc")  # IS-OOD Table 1 reports FPR@95 and AUROC; the tables hold every metric
_CSS = """
body{font-family:-apple-system,Segoe UI,Helvetica,Arial,sans-serif;margin:24px auto;max-width:1320px;color:#222;padding:0 16px}
h1{font-size:1.6em}h2{font-size:1.3em;border-bottom:1px solid #ddd;padding-bottom:4px;margin-top:2em}
h3{font-size:1.1em;margin-top:1.4em}
table{border-collapse:collapse;font-size:13px;margin:8px 0}
th,td{border:1px solid #ccc;padding:3px 7px;text-align:right}th{background:#f2f2f2}
td.l,th.l{text-align:left}.na{color:#999}
.grid{display:flex;flex-wrap:wrap;gap:10px}.grid figure{margin:0}
.grid img{width:420px;height:auto;border:1px solid #eee}.grid.wide img{width:auto;max-width:100%}
figcaption{font-size:12px;color:#555;text-align:center}
.meta td{text-align:left}details{margin:8px 0}summary{cursor:pointer;font-weight:600}
.note{color:#555;font-size:13px}.ci{color:#666;font-size:11px;white-space:nowrap}
nav.toc{border:1px solid #ddd;background:#fafafa;padding:6px 16px;margin:12px 0;display:inline-block}
nav.toc ol{margin:4px 0;padding-left:20px}nav.toc a{color:#1a5fb4;text-decoration:none}
"""


def _fmt(v, digits: int = 3) -> str:
    if v is None:
        return ""
    if isinstance(v, (float, np.floating)):
        return "N/A" if math.isnan(v) else f"{v:.{digits}f}"
    if isinstance(v, (bool, np.bool_)):
        return "yes" if v else "no"
    return str(v)


def _html_table(df: pd.DataFrame, digits: int = 3, left: Sequence[str] = ()) -> str:
    cols = list(df.columns)
    head = "".join(f'<th class="{"l" if c in left else ""}">{html.escape(str(c))}</th>' for c in cols)
    rows = []
    for rec in df.itertuples(index=False):
        cells = []
        for c, v in zip(cols, rec):
            s = _fmt(v, digits)
            cls = "l" if c in left else ("na" if s == "N/A" else "")
            cells.append(f'<td class="{cls}">{html.escape(s)}</td>')
        rows.append("<tr>" + "".join(cells) + "</tr>")
    return f"<table><thead><tr>{head}</tr></thead><tbody>{''.join(rows)}</tbody></table>"


def markdown_table(df: pd.DataFrame, digits: int = 3) -> str:
    """A GitHub markdown table of ``df`` (floats with ``digits`` decimals, NaN as N/A)."""
    cols = [str(c) for c in df.columns]
    lines = ["| " + " | ".join(cols) + " |", "|" + "|".join("---" for _ in cols) + "|"]
    for rec in df.itertuples(index=False):
        lines.append("| " + " | ".join(_fmt(v, digits).replace("|", "\\|") for v in rec) + " |")
    return "\n".join(lines)


_AXIS_WORD = {"sem": "semantic", "cov": "covariate"}


def section_id(title: str) -> str:
    """The HTML id of a report section (its title in lower case, runs of other characters as '-')."""
    return re.sub(r"[^a-z0-9]+", "-", title.lower()).strip("-") or "section"


def _ci(low, high, digits: int) -> str:
    return "" if low is None or not np.isfinite(low) else f"[{low:.{digits}f}, {high:.{digits}f}]"


def table1_metrics(result: CellEvaluation, metrics: Sequence[str] | None = None) -> Sequence[str]:
    """Table 1's metrics: ``metrics`` when given, else FPR@95 and AUROC (under the release's convention its FPR@95,
    OpenOOD's ``fpr95_openood``)."""
    if metrics is not None:
        return metrics
    return ("fpr95_openood", "auroc") if result.convention == "release" else _TABLE1_METRICS


def table1_paper(result: CellEvaluation, intervals: pd.DataFrame | None = None,
                 metrics: Sequence[str] | None = None) -> dict[str, list[dict]]:
    """Table 1 in the IS-OOD paper's layout, per dataset (pure): ``{dataset: [row per detector]}``, a row being
    ``{"detector", (metric, axis, "corr" | "sens"): (value, low, high)}``, axes semantic then covariate, the
    interval NaN without ``intervals`` (``levels.table1_intervals``)."""
    s = result.summary
    assert s is not None  # filled by CellEvaluation.__post_init__
    metrics = [m for m in table1_metrics(result, metrics) if m in set(s["metric"])]
    ci = intervals.set_index(["detector", "dataset", "metric", "axis"]) if intervals is not None and len(intervals) \
        else None
    out: dict[str, list[dict]] = {}
    for (det, ds), g in s.groupby(["detector", "dataset"], sort=False):
        row: dict = {"detector": det}
        for m in metrics:
            for ax in ("sem", "cov"):
                r = g[(g["metric"] == m) & (g["axis"] == ax)]
                for kind, col in (("corr", "correlation"), ("sens", "sensitivity")):
                    v = float(r[col].iloc[0]) if len(r) else np.nan
                    lo = hi = np.nan
                    if ci is not None and (det, ds, m, ax) in ci.index:
                        c = ci.loc[(det, ds, m, ax)]
                        lo, hi = float(c[f"{col}_low"]), float(c[f"{col}_high"])
                    row[(m, ax, kind)] = (v, lo, hi)
        out.setdefault(ds, []).append(row)
    return out


def _paper_columns(rows: Sequence[dict]) -> list[tuple[str, str, str]]:
    return [k for k in rows[0] if isinstance(k, tuple)] if rows else []


def _tex(text: str) -> str:
    for a, b in (("\\", r"\textbackslash{}"), ("&", r"\&"), ("%", r"\%"), ("$", r"\$"), ("#", r"\#"),
                 ("_", r"\_"), ("{", r"\{"), ("}", r"\}"), ("~", r"\textasciitilde{}"), ("^", r"\^{}")):
        text = text.replace(a, b)
    return text


def table1_latex(result: CellEvaluation, intervals: pd.DataFrame | None = None, digits: int = 2) -> str:
    """Table 1 as a LaTeX ``table`` (booktabs) in the IS-OOD paper's layout: one block of detector rows per
    dataset; FPR@95 and AUROC, each semantic and covariate shift, each corr and sens; a bootstrap 95% interval
    beside each value (in small type) when ``intervals`` are given; N/A as --."""
    blocks = table1_paper(result, intervals)
    cols = _paper_columns(next(iter(blocks.values()), []))
    metrics = list(dict.fromkeys(m for m, _, _ in cols))
    n = 1 + len(cols)
    lines = ["% isood: Table 1 (IS-OOD layout). corr = Pearson correlation between the per-level metric (mean over",
             "% the level's measured cells) and the level 1..n; sens = |least-squares slope| per level.",
             r"\begin{table}[t]", r"\centering", r"\small",
             r"\caption{Correlation and sensitivity of each detector's performance with the semantic and covariate "
             r"shift level" + (r" (brackets: bootstrap 95\% intervals)." if intervals is not None and len(intervals)
                               else ".") + "}",
             r"\begin{tabular}{l" + "cccc" * len(metrics) + "}", r"\toprule",
             " & " + " & ".join(rf"\multicolumn{{4}}{{c}}{{{_tex(metric_label(m))}}}" for m in metrics) + r" \\",
             " ".join(rf"\cmidrule(lr){{{2 + 4 * i}-{5 + 4 * i}}}" for i in range(len(metrics))),
             " & " + " & ".join(r"\multicolumn{2}{c}{Semantic} & \multicolumn{2}{c}{Covariate}" for _ in metrics)
             + r" \\",
             " ".join(rf"\cmidrule(lr){{{2 + 2 * i}-{3 + 2 * i}}}" for i in range(2 * len(metrics))),
             "Method & " + " & ".join("corr & sens" for _ in range(2 * len(metrics))) + r" \\", r"\midrule"]
    for k, (ds, rows) in enumerate(blocks.items()):
        if k:
            lines.append(r"\midrule")
        if len(blocks) > 1:
            lines.append(rf"\multicolumn{{{n}}}{{l}}{{\textit{{{_tex(str(ds))}}}}} \\")
        for row in rows:
            cells = []
            for key in cols:
                v, lo, hi = row[key]
                text = "--" if not np.isfinite(v) else f"{v:.{digits}f}"
                if np.isfinite(lo):
                    text += rf"{{\tiny\,[{lo:.{digits}f}, {hi:.{digits}f}]}}"
                cells.append(text)
            lines.append(_tex(str(row["detector"])) + " & " + " & ".join(cells) + r" \\")
    lines += [r"\bottomrule", r"\end{tabular}", r"\end{table}", ""]
    return "\n".join(lines)


def table1_markdown(result: CellEvaluation, intervals: pd.DataFrame | None = None, digits: int = 2) -> str:
    """Table 1 as markdown in the IS-OOD paper's layout: a table per dataset, rows = detectors, columns
    ``<metric> <semantic|covariate> corr|sens`` (FPR@95 then AUROC), each value with its bootstrap 95% interval
    when ``intervals`` are given; N/A as N/A."""
    out = []
    for ds, rows in table1_paper(result, intervals).items():
        cols = _paper_columns(rows)
        head = ["detector"] + [f"{metric_label(m)} {_AXIS_WORD[ax]} {kind}" for m, ax, kind in cols]
        lines = ["| " + " | ".join(head) + " |", "|" + "|".join(["---"] + ["---:"] * len(cols)) + "|"]
        for row in rows:
            cells = []
            for key in cols:
                v, lo, hi = row[key]
                text = "N/A" if not np.isfinite(v) else f"{v:.{digits}f}"
                cells.append(f"{text} {_ci(lo, hi, digits)}".strip())
            lines.append("| " + " | ".join([str(row["detector"]).replace("|", "\\|")] + cells) + " |")
        out += [f"### {ds}", "", *lines, ""]
    return "\n".join(out)


def table1_frame(result: CellEvaluation, metrics: Sequence[str] | None = None) -> pd.DataFrame:
    """Table 1 laid out wide: one row per detector and dataset, columns ``<metric> corr/sens <axis>`` (default
    FPR@95 and AUROC; under the release's convention its FPR@95, OpenOOD's ``fpr95_openood``)."""
    metrics = table1_metrics(result, metrics)
    summary = result.summary
    assert summary is not None  # filled by CellEvaluation.__post_init__
    s = summary[summary["metric"].isin(metrics)]
    rows = []
    for (det, ds), g in s.groupby(["detector", "dataset"], sort=False):
        row = {"detector": det, "dataset": ds}
        for m in metrics:
            for ax in ("sem", "cov"):
                r = g[(g["metric"] == m) & (g["axis"] == ax)]
                label = metric_label(m).split(" ")[0]
                row[f"{label} corr {ax}"] = float(r["correlation"].iloc[0]) if len(r) else np.nan
                row[f"{label} sens {ax}"] = float(r["sensitivity"].iloc[0]) if len(r) else np.nan
        rows.append(row)
    return pd.DataFrame(rows)


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


def _leak_html(result: CellEvaluation, images: Mapping[str, bytes]) -> list[str]:
    """The report section comparing all images with the leak-free ones (empty without a leak audit)."""
    pairs = leak_pairs(result.per_cell)
    if not pairs:
        return []
    heads = [m for m in _TABLE1_METRICS if m in result.metrics] or result.metrics[:1]
    ranking = leak_ranking(result.per_cell, heads)
    parts = ["<h2>Leaks: all images vs leak-free images</h2>",
             '<p class="note">Each grid dataset is scored twice: on all its images and without the images the leak '
             'audit flags (ID classes, their hypernyms and hyponyms by default): dataset <code>&lt;name&gt;-leak-free'
             '</code>. diff = leak-free - all. Means, level values and rankings use the cells measured in both '
             '(a cell can become N/A once its leaks are gone). The ranking compares the detectors\' order on both, '
             'per cell, per level and over the mean of the cells (Kendall tau between the two sets of values).</p>']
    for ds, free in pairs.items():
        parts.append(f"<h3>{html.escape(ds)}: mean over the cells measured in both</h3>")
        parts.append(_html_table(leak_means(result, ds, free, heads), left=("detector",)))
        parts.append("<ul>" + "".join(f"<li>{html.escape(ranking_summary(ranking, ds, m))}</li>" for m in heads)
                     + "</ul>")
        changed = ranking[(ranking["dataset"] == ds) & ranking["changed"].astype(bool)]
        if len(changed):
            cols = ["scope", "key", "metric", "order_all", "order_leak_free", "kendall_tau"]
            parts.append(f"<h3>{html.escape(ds)}: where the ranking changes</h3>"
                         + _html_table(changed[cols].head(40), left=cols[:5]))
        for det in dict.fromkeys(result.per_cell.loc[result.per_cell["dataset"] == ds, "detector"]):
            figs = [_figure(images[leak_diff_name(ds, det, m)], f"{det}: {metric_label(m)} leak-free - all")
                    for m in result.metrics if leak_diff_name(ds, det, m) in images]
            if figs:
                parts.append(f"<h3>{html.escape(det)}: difference</h3><div class=\"grid\">{''.join(figs)}</div>")
    return parts


def _leak_markdown(result: CellEvaluation) -> list[str]:
    pairs = leak_pairs(result.per_cell)
    if not pairs:
        return []
    heads = [m for m in _TABLE1_METRICS if m in result.metrics] or result.metrics[:1]
    ranking = leak_ranking(result.per_cell, heads)
    out = ["## Leaks: all images vs leak-free images", ""]
    for ds, free in pairs.items():
        out += [f"### {ds}", "", markdown_table(leak_means(result, ds, free, heads)), ""]
        out += [f"- {ranking_summary(ranking, ds, m)}" for m in heads] + [""]
    return out


def _img(png: bytes, alt: str) -> str:
    data = base64.b64encode(png).decode("ascii")
    return f'<img alt="{html.escape(alt)}" src="data:image/png;base64,{data}">'


def _figure(png: bytes, caption: str) -> str:
    return f"<figure>{_img(png, caption)}<figcaption>{html.escape(caption)}</figcaption></figure>"


def _with_contents(body: str) -> str:
    """``body`` with an id on every ``<h2>`` (``section_id``, made unique) and a table of contents linking them
    inserted before the first one."""
    entries: list[tuple[str, str]] = []

    def anchor(match: re.Match) -> str:
        base = section_id(html.unescape(re.sub(r"<[^>]+>", "", match.group(1))))
        sid, k = base, 2
        while any(sid == e for e, _ in entries):
            sid, k = f"{base}-{k}", k + 1
        entries.append((sid, match.group(1)))
        return f'<h2 id="{sid}">{match.group(1)}</h2>'

    body = re.sub(r"<h2>(.*?)</h2>", anchor, body)
    if not entries:
        return body
    nav = ('<nav class="toc" aria-label="Contents"><strong>Contents</strong><ol>'
           + "".join(f'<li><a href="#{sid}">{text}</a></li>' for sid, text in entries) + "</ol></nav>")
    first = body.index(f'<h2 id="{entries[0][0]}">')
    return body[:first] + nav + "\n" + body[first:]


def _table1_html(result: CellEvaluation, intervals: pd.DataFrame | None) -> str:
    """``table1_frame`` as HTML, each value followed by its bootstrap interval (``<span class="ci">``) when
    ``intervals`` (``levels.table1_intervals``) hold it."""
    frame = table1_frame(result)
    ci = intervals.set_index(["detector", "dataset", "metric", "axis"]) if intervals is not None and len(intervals) \
        else None
    labels = {metric_label(m).split(" ")[0]: m for m in table1_metrics(result)}
    head = "".join(f'<th class="{"l" if c in ("detector", "dataset") else ""}">{html.escape(str(c))}</th>'
                   for c in frame.columns)
    rows = []
    for rec in frame.to_dict("records"):
        cells = [f'<td class="l">{html.escape(str(rec["detector"]))}</td>',
                 f'<td class="l">{html.escape(str(rec["dataset"]))}</td>']
        for col in frame.columns[2:]:
            label, kind, axis = col.split(" ")
            text = _fmt(rec[col], _digits(result))
            key = (rec["detector"], rec["dataset"], labels.get(label), axis)
            span = ""
            if ci is not None and key in ci.index:
                c = ci.loc[key]
                name = "correlation" if kind == "corr" else "sensitivity"
                span = _ci(float(c[f"{name}_low"]), float(c[f"{name}_high"]), _digits(result))
            cls = "na" if text == "N/A" else ""
            cells.append(f'<td class="{cls}">{html.escape(text)}'
                         + (f' <span class="ci">{html.escape(span)}</span>' if span else "") + "</td>")
        rows.append("<tr>" + "".join(cells) + "</tr>")
    return f"<table><thead><tr>{head}</tr></thead><tbody>{''.join(rows)}</tbody></table>"


def _convention_note(result: CellEvaluation) -> str:
    if result.convention != "release":
        return ""
    return (" Release convention (the IS-OOD release's analyze_metrics.py): cell values in percent rounded to 0.01, "
            "N/A cells as 0, a level's mean over its values > 1e-16 (a measured 0 drops out too), printed to 2 "
            "decimals as the release prints them; intervals from every resample's Table 1 by the same rule.")


def _digits(result: CellEvaluation) -> int:
    """The decimals Table 1 is printed with: 2 as the release prints it, 3 for the exact convention."""
    return 2 if result.convention == "release" else 3


def _set_note() -> str:
    return ("Each OOD set as a whole against the ID test set (a grid: every image in a cell); nearood / farood: "
            "the mean over the sets of OpenOOD's near / far group. results/sets.tex and results/sets.md hold "
            "FPR@95 and AUROC per set in OpenOOD's layout (percent).")


def render_html(result: CellEvaluation, images: Mapping[str, bytes], *, title: str = "isood evaluation",
                meta: Mapping[str, object] | None = None, sanity: pd.DataFrame | None = None,
                intervals: Mapping[str, pd.DataFrame] | None = None, sets: pd.DataFrame | None = None) -> str:
    """The self-contained HTML report: a table of contents, run details, per-set results (``sets``:
    ``assemble.set_metrics``), Table 1 (with bootstrap 95% intervals when ``intervals`` holds ``table1_intervals``),
    per-detector means, the detectors compared per metric, level curves, heatmaps per detector, the per-cell table
    and its intervals (``cell_intervals``). ``images`` are the plots of ``plots.render_plots`` (by their names; the
    PNGs are embedded); ``sanity`` is the random-model comparison table (``assemble.sanity_table``), when run."""
    intervals = intervals or {}
    parts = [f"<h1>{html.escape(title)}</h1>"]
    if meta:
        rows = "".join(f'<tr><th class="l">{html.escape(str(k))}</th><td>{html.escape(_fmt(v))}</td></tr>'
                       for k, v in meta.items())
        parts.append(f'<table class="meta">{rows}</table>')
    metrics = result.metrics
    lower = ", ".join(metric_label(m) for m in metrics if lower_is_better(m))
    parts.append('<p class="note">Scores: higher = more in-distribution. Each cell is compared with the whole ID '
                 'test set; N/A cells (too few images) are grey and never enter a level mean. Level value = mean '
                 f'over the level\'s measured cells. Lower is better for: {html.escape(lower)}.</p>')
    drawn = [m for m in metrics if any(level_curve_name(ds, ax, m) in images or heatmap_name(ds, det, m) in images
                                       for ds in result.datasets for ax in ("sem", "cov")
                                       for det in result.detectors)]
    rest = [m for m in metrics if m not in drawn]
    if rest:
        parts.append(f'<p class="note">Plots drawn for: {html.escape(", ".join(map(metric_label, drawn)) or "none")}. '
                     f'The other metrics ({html.escape(", ".join(map(metric_label, rest)))}) are in the tables below '
                     'and in results/*.csv; <code>isood evaluate --plot-metrics all</code> draws every one.</p>')

    if sets is not None and len(sets):
        parts.append("<h2>Per-set results</h2>")
        parts.append(f'<p class="note">{html.escape(_set_note())}</p>')
        parts.append(_html_table(sets, left=("detector", "dataset", "group", "kind")))
    parts.append("<h2>Table 1: correlation and sensitivity with the shift level</h2>")
    t1 = intervals.get("table1_intervals")
    boot = f" In brackets: the bootstrap 95% interval ({int(t1['n_boot'].iloc[0])} resamples of the ID set and " \
           "of every cell)." if t1 is not None and len(t1) else ""
    parts.append('<p class="note">corr = Pearson correlation between the per-level metric and the level index '
                 f'(1..n); sens = |least-squares slope| per level.{html.escape(boot)}'
                 f'{html.escape(_convention_note(result))} results/table1.tex and results/table1.md hold it in the '
                 'IS-OOD paper\'s layout.</p>')
    parts.append(_table1_html(result, t1))
    parts.append("<details><summary>Every metric</summary>"
                 + _html_table(result.summary, left=("detector", "dataset", "axis", "metric")) + "</details>")

    parts.append("<h2>Mean over measured cells</h2>")
    parts.append(_html_table(result.means, left=("detector", "dataset")))
    if sanity is not None and len(sanity):
        parts.append("<h2>Sanity check: trained vs randomly initialised model</h2>")
        parts.append('<p class="note">AUROC (data view: ID vs the cell) next to AUROC_M (model view: correctly '
                     'classified vs misclassified or semantic OOD). A random model can still separate shifted '
                     'data (AUROC), but it should not rank its own correct predictions above its errors '
                     '(AUROC_M near 0.5).</p>')
        parts.append(_html_table(sanity, left=("detector", "dataset")))

    for ds in result.datasets:
        if mosaic_name(ds) in images:
            parts.append(f"<h2>Images per cell: {html.escape(ds)}</h2>")
            parts.append('<p class="note">A few sampled images of every cell (semantic level left to right, '
                         'covariate level bottom to top; N/A cells grey); <code>isood show MANIFEST</code> draws more.</p>')
            parts.append(_figure(images[mosaic_name(ds)], f"{ds}: images per cell"))
        figs = [_figure(images[compare_name(ds, m)], metric_label(m)) for m in metrics if compare_name(ds, m) in images]
        if figs:
            parts.append(f"<h2>Detectors compared: {html.escape(ds)}</h2>")
            parts.append('<p class="note">One colour range per metric, shared by every detector (the range of its '
                         'values); the SVG and PDF beside each PNG in plots/ are the same figure.</p>')
            parts.append(f'<div class="grid wide">{"".join(figs)}</div>')
        parts.append(f"<h2>Level curves: {html.escape(ds)}</h2>")
        for axis in ("sem", "cov"):
            figs = [_figure(images[level_curve_name(ds, axis, m)], f"{metric_label(m)}, {axis}")
                    for m in metrics if level_curve_name(ds, axis, m) in images]
            if figs:
                parts.append(f'<div class="grid">{"".join(figs)}</div>')
        parts.append(f"<h2>Heatmaps: {html.escape(ds)}</h2>")
        for det in dict.fromkeys(result.per_cell.loc[result.per_cell["dataset"] == ds, "detector"]):
            figs = [_figure(images[heatmap_name(ds, det, m)], f"{det}: {metric_label(m)}")
                    for m in metrics if heatmap_name(ds, det, m) in images]
            if figs:
                parts.append(f"<h3>{html.escape(det)}</h3><div class=\"grid\">{''.join(figs)}</div>")

    parts += _leak_html(result, images)
    parts.append("<h2>Per-cell results</h2><details><summary>Show the table</summary>"
                 + _html_table(result.per_cell, left=("detector", "dataset", "cell")) + "</details>")
    ci = intervals.get("cell_intervals")
    if ci is not None and len(ci):
        parts.append("<h2>Per-cell bootstrap intervals</h2>")
        parts.append(f'<p class="note">The percentile bootstrap 95% interval of each measured cell\'s metric '
                     f'({int(ci["n_boot"].iloc[0])} resamples of the ID set and of the cell); '
                     'results/cell_intervals.csv.</p>')
        parts.append("<details><summary>Show the table</summary>"
                     + _html_table(ci, left=("detector", "dataset", "cell", "metric")) + "</details>")
    body = _with_contents("\n".join(parts))
    return ("<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">"
            f"<title>{html.escape(title)}</title><style>{_CSS}</style></head>\n<body>\n{body}\n</body></html>\n")


def render_markdown(result: CellEvaluation, *, title: str = "isood evaluation",
                    meta: Mapping[str, object] | None = None, sanity: pd.DataFrame | None = None,
                    intervals: Mapping[str, pd.DataFrame] | None = None, sets: pd.DataFrame | None = None) -> str:
    """Markdown summary: run details, per-set results, Table 1 (FPR@95 and AUROC, both axes, in the paper's layout
    with bootstrap 95% intervals when ``intervals`` holds ``table1_intervals``), per-detector means, sanity check."""
    t1 = (intervals or {}).get("table1_intervals")
    out = [f"# {title}", ""]
    for k, v in (meta or {}).items():
        out.append(f"- **{k}**: {_fmt(v)}")
    if meta:
        out.append("")
    if sets is not None and len(sets):
        out += ["## Per-set results", "", _set_note(), "", markdown_table(sets), ""]
    out += ["## Table 1: correlation and sensitivity with the shift level", "",
            "corr = Pearson correlation between the per-level metric (mean over the level's measured cells) and "
            "the level index; sens = |least-squares slope|" + (" (brackets: bootstrap 95% interval)."
                                                                if t1 is not None and len(t1) else ".")
            + _convention_note(result), "",
            table1_markdown(result, t1, digits=_digits(result)),
            "## Mean over measured cells", "", markdown_table(result.means), ""]
    if sanity is not None and len(sanity):
        out += ["## Sanity check: trained vs randomly initialised model", "", markdown_table(sanity), ""]
    out += _leak_markdown(result)
    return "\n".join(out)
