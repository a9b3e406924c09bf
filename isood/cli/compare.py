"""L6: `isood compare RUN...`: a leaderboard across evaluation runs (``isood.stages.compare``)."""

from __future__ import annotations

from pathlib import Path
from typing import List, Optional

import typer

from isood.cli._app import app, out_console, verify_option
from isood.stages.compare import LEADERBOARD_CSV, LEADERBOARD_MD, compare_runs

__all__ = ["compare"]


@app.command()
def compare(
    runs: List[Path] = typer.Argument(..., help="Evaluation manifests (isood evaluate --out), one or more."),
    out: Path = typer.Option(..., help="Output folder for leaderboard.csv and leaderboard.md (new, empty, or an "
                             "earlier isood compare --out)."),
    names: Optional[str] = typer.Option(None, help="Comma-separated labels of the runs, in order (default: their "
                                        "folder names)."),
    rank_by: str = typer.Option("auroc", help="Metric ranking the detectors of each dataset (mean over the "
                                "measured cells; lower-is-better metrics rank ascending)."),
    verify: str = verify_option(),
) -> None:
    """A leaderboard across evaluation runs: per dataset, every run's detectors ranked by their mean metric, with
    Table 1's correlation and sensitivity (and bootstrap intervals) and the content hashes of what was compared."""
    labels = [n.strip() for n in names.split(",")] if names is not None else None
    r = compare_runs(runs, out, names=labels, rank_by=rank_by, verify=verify)
    for ds, g in r.board.groupby("dataset", sort=False):
        best = g.iloc[0]
        out_console.print(f"{ds}: {len(g)} rows from {g['run'].nunique()} runs; best by {rank_by}: "
                          f"{best['run']} / {best['detector']} ({best[rank_by]:.4f})", highlight=False, soft_wrap=True)
    out_console.print(f"leaderboard -> {out / LEADERBOARD_CSV}, {out / LEADERBOARD_MD}", highlight=False,
                      soft_wrap=True)
