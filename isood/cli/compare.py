"""`isood compare RUN...`: a leaderboard across evaluation runs (``isood.stages.compare``)."""

from __future__ import annotations

from pathlib import Path

from isood.cli._app import app, out_console
from isood.cli.options import command
from isood.stages.compare import LEADERBOARD_CSV, LEADERBOARD_MD, CompareOptions, compare_runs

__all__ = ["compare", "counted"]


def counted(n: int, noun: str, plural: str | None = None) -> str:
    """``n`` and the noun in the number it takes: ``1 run``, ``2 runs``, ``0 runs``."""
    return f"{n} {noun if n == 1 else (plural or noun + 's')}"


@command(app, "compare", CompareOptions,
         help="A leaderboard across evaluation runs: per dataset, every run's detectors ranked by their mean metric, "
              "with Table 1, their settings and the content hashes of what was compared.")
def compare(opts: CompareOptions) -> None:
    labels = [n.strip() for n in opts.names.split(",")] if opts.names is not None else None
    out = Path(opts.out)
    r = compare_runs([Path(p) for p in opts.runs], out, names=labels, rank_by=opts.rank_by, verify=opts.verify)
    for ds, g in r.board.groupby("dataset", sort=False):
        best = g.iloc[0]
        out_console.print(f"{ds}: {counted(len(g), 'row')} from {counted(g['run'].nunique(), 'run')}; best by {opts.rank_by}: "
                          f"{best['run']} / {best['detector']} ({best[opts.rank_by]:.4f})", highlight=False,
                          soft_wrap=True)
    out_console.print(f"leaderboard -> {out / LEADERBOARD_CSV}, {out / LEADERBOARD_MD}", highlight=False,
                      soft_wrap=True)
