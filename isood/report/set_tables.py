"""The per-set table beside Table 1, in LaTeX and markdown (``results/sets.tex``, ``results/sets.md``).

OpenOOD v1.5 reports each detector against every OOD set of a benchmark, the near sets then ``nearood`` (their
mean), the far sets then ``farood``; this lays the ``set_metrics`` table (``assemble.set_metrics``) out the same
way: one block per metric (FPR@95 then AUROC, OpenOOD's order), rows = detectors, columns = the OOD sets in the
table's order (the group means in their place, the sets in no group last), values in percent with two decimals
as OpenOOD prints them; a value that was not measured is N/A (markdown) or -- (LaTeX).
"""

from __future__ import annotations

from typing import Sequence

import numpy as np
import pandas as pd

from isood.science.metrics import metric_label

__all__ = ["SET_TABLE_METRICS", "sets_wide", "sets_markdown", "sets_latex"]

#: The metrics of the per-set table (present in the table), in OpenOOD's order.
SET_TABLE_METRICS = ("fpr95", "auroc")


def _metrics(sets: pd.DataFrame, metrics: Sequence[str] | None) -> list[str]:
    return [m for m in (metrics or SET_TABLE_METRICS) if m in sets.columns]


def sets_wide(sets: pd.DataFrame, metric: str) -> pd.DataFrame:
    """One metric of ``set_metrics`` in percent: index = detectors (in order), columns = the OOD sets and group
    means (in the table's order)."""
    columns = list(dict.fromkeys(sets["dataset"]))
    wide = sets.pivot_table(index="detector", columns="dataset", values=metric, aggfunc="first", dropna=False,
                            sort=False)
    wide = wide.reindex(index=list(dict.fromkeys(sets["detector"])), columns=columns)
    return wide.astype(np.float64) * 100.0


def _cell(v: float, digits: int, missing: str) -> str:
    return missing if not np.isfinite(v) else f"{v:.{digits}f}"


def sets_markdown(sets: pd.DataFrame, metrics: Sequence[str] | None = None, digits: int = 2) -> str:
    """The per-set table as markdown: a ``### <metric> (%)`` table per metric, rows = detectors, columns = the OOD
    sets with OpenOOD's ``nearood`` / ``farood`` means in their place."""
    out = []
    for m in _metrics(sets, metrics):
        wide = sets_wide(sets, m)
        head = ["detector", *(str(c).replace("|", "\\|") for c in wide.columns)]
        lines = ["| " + " | ".join(head) + " |", "|" + "|".join(["---"] + ["---:"] * len(wide.columns)) + "|"]
        for det, row in wide.iterrows():
            cells = [_cell(float(v), digits, "N/A") for v in row]
            lines.append("| " + " | ".join([str(det).replace("|", "\\|"), *cells]) + " |")
        out += [f"### {metric_label(m)} (%)", "", *lines, ""]
    return "\n".join(out)


def _tex(text: str) -> str:
    for a, b in (("\\", r"\textbackslash{}"), ("&", r"\&"), ("%", r"\%"), ("$", r"\$"), ("#", r"\#"),
                 ("_", r"\_"), ("{", r"\{"), ("}", r"\}"), ("~", r"\textasciitilde{}"), ("^", r"\^{}")):
        text = text.replace(a, b)
    return text


def sets_latex(sets: pd.DataFrame, metrics: Sequence[str] | None = None, digits: int = 2) -> str:
    """The per-set table as a LaTeX ``table`` (booktabs): per metric a block of columns (the OOD sets, the group
    means in italics), rows = detectors, percent; -- where not measured."""
    chosen = _metrics(sets, metrics)
    wides = {m: sets_wide(sets, m) for m in chosen}
    means = set(sets.loc[sets["kind"] == "mean", "dataset"]) if "kind" in sets.columns else set()
    n_cols = [len(w.columns) for w in wides.values()]
    lines = ["% isood: per-set results (OpenOOD layout): the ID test set against each OOD set; nearood / farood =",
             "% the mean over the group's sets. Values in percent.",
             r"\begin{table}[t]", r"\centering", r"\small",
             r"\caption{Each detector against every OOD set (percent); \textit{nearood} and \textit{farood} are the "
             r"means over OpenOOD's near and far groups.}",
             r"\begin{tabular}{l" + "".join("r" * k for k in n_cols) + "}", r"\toprule"]
    lines.append(" & " + " & ".join(rf"\multicolumn{{{k}}}{{c}}{{{_tex(metric_label(m))}}}"
                                    for m, k in zip(chosen, n_cols)) + r" \\")
    start, rules = 2, []
    for k in n_cols:
        rules.append(rf"\cmidrule(lr){{{start}-{start + k - 1}}}")
        start += k
    lines.append(" ".join(rules))
    names = [rf"\textit{{{_tex(str(c))}}}" if c in means else _tex(str(c)) for w in wides.values() for c in w.columns]
    lines += ["Method & " + " & ".join(names) + r" \\", r"\midrule"]
    detectors = list(dict.fromkeys(sets["detector"]))
    for det in detectors:
        cells = [_cell(float(v), digits, "--") for w in wides.values() for v in w.loc[det]]
        lines.append(_tex(str(det)) + " & " + " & ".join(cells) + r" \\")
    lines += [r"\bottomrule", r"\end{tabular}", r"\end{table}", ""]
    return "\n".join(lines)
