"""L6: `isood wordnet filter` and `isood wordnet audit` (``wordnet_tools.jobs``), and their terminal tables."""

from __future__ import annotations

from pathlib import Path
from typing import List, Optional

import pandas as pd
import typer
from rich.table import Table

import manifests
from isood.cli._app import out_console, wordnet_app
from isood.defaults import WORDNET_EXCLUDE

__all__ = ["wordnet_filter", "wordnet_audit", "counts_table", "leak_table", "summary_table", "exclusions"]


def exclusions(exclude: Optional[List[str]]) -> list[str]:
    """The --exclude values: the default (organism.n.01) when none is given; '' entries dropped (`--exclude ''`
    for no exclusion)."""
    return list(WORDNET_EXCLUDE) if exclude is None else [e for e in exclude if e]


def counts_table(counts: pd.DataFrame, title: str) -> Table:
    """Counts per rule (``class_filter.summarise``) as a rich table; the kept row reads '(kept)'."""
    t = Table(title=title)
    for col in counts.columns:
        t.add_column(str(col), justify="right" if col in ("classes", "entries") else "left")
    for row in counts.itertuples(index=False):
        t.add_row(*[str(v) if v != "" else "(kept)" for v in row])
    return t


def leak_table(table: pd.DataFrame, limit: int = 50) -> Table:
    """The classes of an audit (or filter) table that break a rule, the first ``limit`` of them."""
    leaks = table[table["decision"] == "drop"]
    t = Table(title=f"Classes breaking a rule: {len(leaks)}" + (f" (first {limit})" if len(leaks) > limit else ""))
    for col in ("wnid", "name", "rule", "conflict_wnid", "conflict_name", "entries"):
        t.add_column(col)
    for row in leaks.head(limit).itertuples(index=False):
        t.add_row(row.wnid, row.name, row.rule, row.conflict_wnid, row.conflict_name, str(getattr(row, "entries", "")))
    return t


def summary_table(manifest: manifests.Manifest, title: str) -> Table:
    """The counts per rule of a class-filter (or audit) manifest, titled with its candidates and version."""
    counts = manifest.frame("summary")
    n = int(counts["classes"].sum())
    return counts_table(counts, f"{title}: {n} candidates, {manifest.kind} v{manifest.dataset_version}")


@wordnet_app.command("filter")
def wordnet_filter(
    candidates: str = typer.Option("21k", help="Candidate classes: 1k, 21k, 21k-p, 12k, a wnid file, or a dataset root."),
    id_classes: str = typer.Option("1k", "--id", help="In-distribution classes (same forms as --candidates)."),
    exclude: Optional[List[str]] = typer.Option(
        None, help="Drop classes under this synset (repeatable; default organism.n.01). Pass --exclude '' for none."
    ),
    sisters_only: bool = typer.Option(False, help="Keep only sister classes of ID classes (ImageNet-OOD candidate step)."),
    out: Path = typer.Option(..., help="Output manifest directory."),
) -> None:
    """ImageNet-OOD class filter: drop ID classes, their hypernyms and hyponyms, and excluded subtrees, with reasons."""
    from wordnet_tools.jobs import run_filter  # nltk takes ~1.5 s to import: only when the command runs

    manifest = run_filter(candidates, id_classes, exclude=exclusions(exclude), sisters_only=sisters_only, out=out)
    out_console.print(summary_table(manifest, "Class filter"))
    out_console.print(f"manifest: {out}")


@wordnet_app.command("audit")
def wordnet_audit(
    list_file: Path = typer.Argument(..., help="A list of wnids or image paths (<wnid>/<file> or <wnid>_<n>.JPEG)."),
    id_classes: str = typer.Option("1k", "--id", help="In-distribution classes: 1k, 21k, a wnid file, or a dataset root."),
    exclude: Optional[List[str]] = typer.Option(None, help="Excluded subtree (repeatable; default organism.n.01; '' for none)."),
    out: Optional[Path] = typer.Option(None, help="Write the audit as a manifest here."),
) -> None:
    """Audit an existing OOD class or image list for hierarchy leaks into the ID classes."""
    from wordnet_tools.jobs import run_audit  # nltk takes ~1.5 s to import: only when the command runs

    r = run_audit(list_file, id_classes, exclude=exclusions(exclude), out=out)
    title = f"Audit of {list_file} ({r.entries} entries" + (f", manifest {r.manifest.root})" if r.manifest else ")")
    out_console.print(leak_table(r.table))
    out_console.print(counts_table(r.counts, title))
