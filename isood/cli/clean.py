"""L6: the `isood splits` command group: `isood splits clean` (the stage is ``isood.stages.clean``)."""

from __future__ import annotations

from pathlib import Path

import typer
from rich.table import Table

from isood.cli._app import out_console, splits_app, verify_option
from isood.stages.clean import CleanResult, clean_splits
from wordnet_tools.rules import LEAK_RULES

__all__ = ["splits_clean", "clean_table"]


def clean_table(r: CleanResult) -> Table:
    """Images kept, removed per rule, and the N/A cells before / after."""
    t = Table(title="isood splits clean")
    t.add_column("images", justify="left")
    t.add_column("count", justify="right")
    t.add_row("kept", str(r.kept))
    for rule, n in sorted(r.removed_by_rule.items()):
        t.add_row(f"removed: {rule}", str(n))
    t.add_row("N/A cells before -> after", f"{r.na_before} -> {r.na_after}")
    return t


@splits_app.command("clean")
def splits_clean(
    splits: Path = typer.Argument(..., help="A splits manifest (isood build-splits or isood import isood-lists)."),
    audit: Path = typer.Option(..., help="An audit of its classes (isood wordnet audit SPLITS --out AUDIT)."),
    out: Path = typer.Option(..., help="Output directory (the leak-free splits manifest)."),
    rules: str = typer.Option(",".join(LEAK_RULES), help="Audit verdicts to remove, comma-separated (among unknown, "
                              "id, hypernym, hyponym, excluded_subtree)."),
    verify: str = verify_option(),
) -> None:
    """A leak-free copy of a splits manifest: images of ID classes, their hypernyms and hyponyms removed (same
    cells and edges, N/A recomputed), with provenance to both inputs."""
    r = clean_splits(splits, audit, out=out, rules=rules, verify=verify)
    out_console.print(clean_table(r))
    out_console.print(f"manifest: {out} ({r.manifest.kind} v{r.manifest.dataset_version})", highlight=False)
