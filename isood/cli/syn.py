"""`isood generate-syn`: parse the options, build the engine, run the Syn-IS stage, render its summary."""

from __future__ import annotations

import math
from typing import Any

import pandas as pd
from rich.console import Group
from rich.table import Table

from isood.stages.syn import SynOptions, SynResult, run_generate_syn
from isood.cli._app import app, console, out_console
from isood.cli.extract import engine_of  # the one --engine builder (local | ray), shared with `isood extract`
from isood.cli.options import command

__all__ = ["generate_syn", "summary_table", "summary_rows", "cells_grid"]


def cells_grid(cells: pd.DataFrame) -> Table:
    """Images per cell (rows: covariate level, columns: semantic level; ``*``: N/A)."""
    n = int(cells["cov_level"].max()) + 1
    grid = Table(title="images per cell (N/A: fewer than the threshold)")
    grid.add_column("cov \\ sem")
    for s in range(n):
        grid.add_column(str(s), justify="right")
    for c in range(n):
        row = cells[cells["cov_level"] == c].sort_values("sem_level")
        grid.add_row(str(c), *[f"{k}" + ("*" if na else "") for k, na in zip(row["n"], row["na"])])
    return grid


#: What each summary count means, in the order shown (keys not listed follow, with their name spelled out).
SUMMARY_LABELS = {
    "labels": "labels", "styles": "styles", "prompts": "prompts (style x label)",
    "prompts_blocklisted": "prompts blocklisted", "prompts_sampled": "prompts sampled",
    "images_planned": "images planned", "generated": "images generated",
    "skipped": "images already there (kept)", "rejected": "images rejected by the safety checker",
    "images": "images in the manifest", "cells_not_na": "cells with enough images", "batches": "batches",
    "seconds": "generation time", "images_per_second": "images per second",
}
_LAID_FROM = {"splits": "reused from the splits manifest", "--laid": "read from --laid",
              "trained": "trained here"}


def _value(key: str, value: Any) -> str:
    """A summary value as a reader reads it: no None, no [] and no nan."""
    if value is None or (isinstance(value, float) and not math.isfinite(value)):
        return "not measured"
    if isinstance(value, (list, tuple, dict)):
        return "none" if not value else "; ".join(str(v) for v in value)
    if key == "seconds":
        return f"{float(value):.1f} s"
    if isinstance(value, float):
        return f"{value:.3g}"
    return f"{value}"


def summary_rows(summary: dict[str, Any]) -> list[tuple[str, str]]:
    """The run's summary as (label, value) rows a user reads: the LAID's origin as a sentence, the warnings as
    their messages or ``none``, counts under a spelled-out label."""
    s = dict(summary)
    fit, origin, notes = s.pop("laid_fit_seconds", None), s.pop("laid_from", None), s.pop("warnings", [])
    rows = [(SUMMARY_LABELS[k], _value(k, s.pop(k))) for k in SUMMARY_LABELS if k in s]
    rows += [(k.replace("_", " "), _value(k, v)) for k, v in s.items()]
    if isinstance(fit, (int, float)) and math.isfinite(fit):
        laid = f"trained here in {fit:.1f} s"
    else:
        laid = _LAID_FROM.get(str(origin), "given (not trained here)")
    rows.append(("LAID", laid))
    rows.append(("warnings", _value("warnings", notes)))
    return rows


def summary_table(result: SynResult):
    """A rich table of the run's counts, and the per-cell image grid when there is one."""
    table = Table(title="Syn-IS", show_header=True)
    table.add_column("what")
    table.add_column("value", justify="right")
    for label, value in summary_rows(result.summary):
        table.add_row(label, value)
    if result.cells is not None and len(result.cells):
        return Group(table, cells_grid(result.cells))
    return table


def _warn(message: str) -> None:
    console.print(f"[yellow]warning:[/yellow] {message}", highlight=False, soft_wrap=True)


@command(app, "generate-syn", SynOptions,
         help="Syn-IS: style x label prompts binned by shift, generated with SDXL-Turbo.")
def generate_syn(opts: SynOptions) -> None:
    runner = engine_of(opts, device=opts.device)
    result = run_generate_syn(opts, engine=runner, warn=_warn)
    out_console.print(summary_table(result))
    out_console.print(f"manifest: {opts.out} ({result.manifest.kind} v{result.manifest.dataset_version})")
