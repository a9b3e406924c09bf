"""L6: `isood generate-syn`: parse the options, build the engine, run the Syn-IS stage, render its summary."""

from __future__ import annotations

import pandas as pd
from rich.console import Group
from rich.table import Table

from generation.syn import SynOptions, SynResult, run_generate_syn
from isood.cli._app import app, console, out_console
from isood.cli.extract import engine_of  # the one --engine builder (local | ray), shared with `isood extract`
from isood.cli.options import command

__all__ = ["generate_syn", "summary_table", "cells_grid"]


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


def summary_table(result: SynResult):
    """A rich table of the run's counts, and the per-cell image grid when there is one."""
    table = Table(title="Syn-IS", show_header=True)
    table.add_column("what")
    table.add_column("value", justify="right")
    for key, value in result.summary.items():
        table.add_row(key, f"{value}")
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
