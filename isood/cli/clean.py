"""The `isood splits` command group: `isood splits clean` (the stage is ``isood.stages.clean``)."""

from __future__ import annotations

from rich.table import Table

from isood.cli._app import out_console, splits_app
from isood.cli.options import command
from isood.stages.clean import CleanOptions, CleanResult, clean_splits

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


@command(splits_app, "clean", CleanOptions, section="splits-clean",
         help="A leak-free copy of a splits manifest: images of ID classes, their hypernyms and hyponyms removed "
              "(same cells and edges, N/A recomputed), with provenance to both inputs.")
def splits_clean(opts: CleanOptions) -> None:
    r = clean_splits(opts.splits, opts.audit, out=opts.out, rules=opts.rules, verify=opts.verify,
                     na_threshold=opts.na_threshold)
    out_console.print(clean_table(r))
    na = r.manifest.config["clean"]["na_threshold"]
    how = "--na-threshold" if opts.na_threshold is not None else "the manifest's"
    out_console.print(f"N/A threshold: {na['used']} ({how}; manifest {na['manifest']})", highlight=False)
    out_console.print(f"manifest: {opts.out} ({r.manifest.kind} v{r.manifest.dataset_version})", highlight=False)
