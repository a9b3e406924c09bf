"""The evaluation report: one self-contained HTML page (PNG plots embedded as base64 ``data:`` URIs, inline CSS,
no script, no external link or resource; a table of contents linking its sections) and a markdown summary
(Table 1 in the IS-OOD paper's layout, :mod:`isood.report.table1`, + per-detector mean metrics).

Both are pure string builders over a ``CellEvaluation`` and ``{relative path: bytes}`` (``plots.render_plots``; only
the PNGs are embedded). After a leak audit both get the section of :mod:`isood.report.leak_section`.
"""

from __future__ import annotations

import html
import re
from typing import Mapping

import pandas as pd

from isood.science.cells import CellEvaluation
from isood.science.metrics import lower_is_better, metric_label

from .blocks import figure, fmt_value, html_table, markdown_table
from .leak_section import leak_html, leak_markdown
from .mosaic import mosaic_name
from .plots import compare_name, heatmap_name, level_curve_name
from .table1 import convention_note, table1_digits, table1_html, table1_markdown

__all__ = ["render_html", "render_markdown", "section_id"]

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


def section_id(title: str) -> str:
    """The HTML id of a report section (its title in lower case, runs of other characters as '-')."""
    return re.sub(r"[^a-z0-9]+", "-", title.lower()).strip("-") or "section"


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
        rows = "".join(f'<tr><th class="l">{html.escape(str(k))}</th><td>{html.escape(fmt_value(v))}</td></tr>'
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
        parts.append(html_table(sets, left=("detector", "dataset", "group", "kind")))
    parts.append("<h2>Table 1: correlation and sensitivity with the shift level</h2>")
    t1 = intervals.get("table1_intervals")
    boot = f" In brackets: the bootstrap 95% interval ({int(t1['n_boot'].iloc[0])} resamples of the ID set and " \
           "of every cell)." if t1 is not None and len(t1) else ""
    parts.append('<p class="note">corr = Pearson correlation between the per-level metric and the level index '
                 f'(1..n); sens = |least-squares slope| per level.{html.escape(boot)}'
                 f'{html.escape(convention_note(result))} results/table1.tex and results/table1.md hold it in the '
                 'IS-OOD paper\'s layout.</p>')
    parts.append(table1_html(result, t1))
    parts.append("<details><summary>Every metric</summary>"
                 + html_table(result.summary, left=("detector", "dataset", "axis", "metric")) + "</details>")

    parts.append("<h2>Mean over measured cells</h2>")
    parts.append(html_table(result.means, left=("detector", "dataset")))
    if sanity is not None and len(sanity):
        parts.append("<h2>Sanity check: trained vs randomly initialised model</h2>")
        parts.append('<p class="note">AUROC (data view: ID vs the cell) next to AUROC_M (model view: correctly '
                     'classified vs misclassified or semantic OOD). A random model can still separate shifted '
                     'data (AUROC), but it should not rank its own correct predictions above its errors '
                     '(AUROC_M near 0.5).</p>')
        parts.append(html_table(sanity, left=("detector", "dataset")))

    for ds in result.datasets:
        if mosaic_name(ds) in images:
            parts.append(f"<h2>Images per cell: {html.escape(ds)}</h2>")
            parts.append('<p class="note">A few sampled images of every cell (semantic level left to right, '
                         'covariate level bottom to top; N/A cells grey); <code>isood show MANIFEST</code> draws more.</p>')
            parts.append(figure(images[mosaic_name(ds)], f"{ds}: images per cell"))
        figs = [figure(images[compare_name(ds, m)], metric_label(m)) for m in metrics if compare_name(ds, m) in images]
        if figs:
            parts.append(f"<h2>Detectors compared: {html.escape(ds)}</h2>")
            parts.append('<p class="note">One colour range per metric, shared by every detector (the range of its '
                         'values); the SVG and PDF beside each PNG in plots/ are the same figure.</p>')
            parts.append(f'<div class="grid wide">{"".join(figs)}</div>')
        parts.append(f"<h2>Level curves: {html.escape(ds)}</h2>")
        for axis in ("sem", "cov"):
            figs = [figure(images[level_curve_name(ds, axis, m)], f"{metric_label(m)}, {axis}")
                    for m in metrics if level_curve_name(ds, axis, m) in images]
            if figs:
                parts.append(f'<div class="grid">{"".join(figs)}</div>')
        parts.append(f"<h2>Heatmaps: {html.escape(ds)}</h2>")
        for det in dict.fromkeys(result.per_cell.loc[result.per_cell["dataset"] == ds, "detector"]):
            figs = [figure(images[heatmap_name(ds, det, m)], f"{det}: {metric_label(m)}")
                    for m in metrics if heatmap_name(ds, det, m) in images]
            if figs:
                parts.append(f"<h3>{html.escape(det)}</h3><div class=\"grid\">{''.join(figs)}</div>")

    parts += leak_html(result, images)
    parts.append("<h2>Per-cell results</h2><details><summary>Show the table</summary>"
                 + html_table(result.per_cell, left=("detector", "dataset", "cell")) + "</details>")
    ci = intervals.get("cell_intervals")
    if ci is not None and len(ci):
        parts.append("<h2>Per-cell bootstrap intervals</h2>")
        parts.append(f'<p class="note">The percentile bootstrap 95% interval of each measured cell\'s metric '
                     f'({int(ci["n_boot"].iloc[0])} resamples of the ID set and of the cell); '
                     'results/cell_intervals.csv.</p>')
        parts.append("<details><summary>Show the table</summary>"
                     + html_table(ci, left=("detector", "dataset", "cell", "metric")) + "</details>")
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
        out.append(f"- **{k}**: {fmt_value(v)}")
    if meta:
        out.append("")
    if sets is not None and len(sets):
        out += ["## Per-set results", "", _set_note(), "", markdown_table(sets), ""]
    out += ["## Table 1: correlation and sensitivity with the shift level", "",
            "corr = Pearson correlation between the per-level metric (mean over the level's measured cells) and "
            "the level index; sens = |least-squares slope|" + (" (brackets: bootstrap 95% interval)."
                                                                if t1 is not None and len(t1) else ".")
            + convention_note(result), "",
            table1_markdown(result, t1, digits=table1_digits(result)),
            "## Mean over measured cells", "", markdown_table(result.means), ""]
    if sanity is not None and len(sanity):
        out += ["## Sanity check: trained vs randomly initialised model", "", markdown_table(sanity), ""]
    out += leak_markdown(result)
    return "\n".join(out)
