"""Table 1 of the evaluation (correlation and sensitivity of each detector's metric with the semantic and
covariate shift level) rendered: in the IS-OOD paper's layout as LaTeX and markdown (``table1_latex`` /
``table1_markdown``: rows = detectors, per dataset; columns = FPR@95 and AUROC x semantic / covariate shift x
correlation / sensitivity), laid out wide (``table1_frame``) and as the report's HTML table, with bootstrap 95%
intervals when given (``levels.table1_intervals``). Pure string builders over a ``CellEvaluation``."""

from __future__ import annotations

import html
from typing import Sequence

import numpy as np
import pandas as pd

from isood.science.cells import CellEvaluation
from isood.science.metrics import metric_label

from .blocks import ci_text, fmt_value

__all__ = ["TABLE1_METRICS", "table1_metrics", "table1_paper", "table1_latex", "table1_markdown", "table1_frame",
           "table1_html", "table1_digits", "convention_note"]

TABLE1_METRICS = ("fpr95", "auroc")  # IS-OOD Table 1 reports FPR@95 and AUROC; the tables hold every metric
_AXIS_WORD = {"sem": "semantic", "cov": "covariate"}


def table1_metrics(result: CellEvaluation, metrics: Sequence[str] | None = None) -> Sequence[str]:
    """Table 1's metrics: ``metrics`` when given, else FPR@95 and AUROC (under the release's convention its FPR@95,
    OpenOOD's ``fpr95_openood``)."""
    if metrics is not None:
        return metrics
    return ("fpr95_openood", "auroc") if result.convention == "release" else TABLE1_METRICS


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
                cells.append(f"{text} {ci_text(lo, hi, digits)}".strip())
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


def table1_html(result: CellEvaluation, intervals: pd.DataFrame | None) -> str:
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
            text = fmt_value(rec[col], table1_digits(result))
            key = (rec["detector"], rec["dataset"], labels.get(label), axis)
            span = ""
            if ci is not None and key in ci.index:
                c = ci.loc[key]
                name = "correlation" if kind == "corr" else "sensitivity"
                span = ci_text(float(c[f"{name}_low"]), float(c[f"{name}_high"]), table1_digits(result))
            cls = "na" if text == "N/A" else ""
            cells.append(f'<td class="{cls}">{html.escape(text)}'
                         + (f' <span class="ci">{html.escape(span)}</span>' if span else "") + "</td>")
        rows.append("<tr>" + "".join(cells) + "</tr>")
    return f"<table><thead><tr>{head}</tr></thead><tbody>{''.join(rows)}</tbody></table>"


def convention_note(result: CellEvaluation) -> str:
    """The sentence explaining the release's Table 1 convention ('' under the exact one)."""
    if result.convention != "release":
        return ""
    return (" Release convention (the IS-OOD release's analyze_metrics.py): cell values in percent rounded to 0.01, "
            "N/A cells as 0, a level's mean over its values > 1e-16 (a measured 0 drops out too), printed to 2 "
            "decimals as the release prints them; intervals from every resample's Table 1 by the same rule.")


def table1_digits(result: CellEvaluation) -> int:
    """The decimals Table 1 is printed with: 2 as the release prints it, 3 for the exact convention."""
    return 2 if result.convention == "release" else 3
