"""`isood wordnet filter` and `isood wordnet audit` (``isood.stages.wordnet.jobs``), and their terminal tables.

Presets (``--preset``, ``wordnet_tools.rules.PRESETS``): ``imagenet-ood-paper`` excludes organism.n.01 (the
ImageNet-OOD paper's rule, the default) and ``imagenet-ood-release`` excludes animal.n.01 (what the published
ImageNet-OOD list follows: it keeps people and plants). An explicit ``--exclude`` wins over any preset."""

from __future__ import annotations

from typing import List, Optional

import pandas as pd
from rich import box
from rich.table import Table

import manifests
from isood.cli._app import out_console, wordnet_app
from isood.cli.options import command
from isood.stages.wordnet.options import AuditOptions, FilterOptions
from wordnet_tools.rules import AUDIT_RULES, LEAK_RULES, resolve_exclude

__all__ = ["wordnet_filter", "wordnet_audit", "counts_table", "leak_table", "summary_table", "level_table",
           "exclusions"]



def exclusions(exclude: Optional[List[str]], preset: Optional[str] = None) -> list[str]:
    """The excluded subtrees: the --exclude values when given ('' entries dropped: `--exclude ''` for none),
    else the --preset's (default imagenet-ood-paper: organism.n.01)."""
    return resolve_exclude(exclude, preset)


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


def _count(n: int) -> str:
    """A count that fits a narrow column: exact below 100,000, else k / M (the manifest has the exact value)."""
    return str(n) if n < 100_000 else (f"{n / 1e3:.0f}k" if n < 10_000_000 else f"{n / 1e6:.1f}M")


def level_table(levels: pd.DataFrame, axis: str = "sem") -> Table:
    """Images per rule at each level of one axis (an audit's ``levels`` table), with the leak share; a rule
    without any image is left out."""
    part = levels[levels["axis"] == axis]
    t = Table(title=f"Images per rule and {'semantic' if axis == 'sem' else 'covariate'} level "
                    f"(leak = {' + '.join(LEAK_RULES)})", box=box.SIMPLE_HEAD, pad_edge=False)
    rules = [f"images_{r}" for r in AUDIT_RULES if part[f"images_{r}"].sum() > 0]
    short = {"images_hypernym": "hyper", "images_hyponym": "hypo", "images_excluded_subtree": "excluded"}
    cols = ["level", "images", "classes", *rules]
    for c in cols + ["leak"]:
        name = short.get(c, c.replace("images_", ""))
        t.add_column(name, justify="right", min_width=len(name))
    for rec in part.itertuples(index=False):
        t.add_row(*[_count(int(getattr(rec, c))) for c in cols], f"{rec.leak_share:.1%}")
    return t


def summary_table(manifest: manifests.Manifest, title: str) -> Table:
    """The counts per rule of a class-filter (or audit) manifest, titled with its candidates and version."""
    counts = manifest.frame("summary")
    n = int(counts["classes"].sum())
    return counts_table(counts, f"{title}: {n} candidates, {manifest.kind} v{manifest.dataset_version}")


@command(wordnet_app, "filter", FilterOptions, section="wordnet-filter",
         help="ImageNet-OOD class filter: drop ID classes, their hypernyms and hyponyms, and excluded subtrees, "
              "with reasons. Presets: imagenet-ood-paper (default) reproduces the paper's rule (no organism); "
              "imagenet-ood-release reproduces the published ImageNet-OOD list (no animal; people and plants kept).")
def wordnet_filter(opts: FilterOptions) -> None:
    from isood.stages.wordnet.jobs import run_filter  # nltk takes ~1.5 s to import: only when the command runs

    manifest = run_filter(opts.candidates, opts.id_classes, exclude=opts.exclude, preset=opts.preset,
                          sisters_only=opts.sisters_only, out=opts.out)
    out_console.print(summary_table(manifest, "Class filter"))
    out_console.print(f"manifest: {opts.out}")


@command(wordnet_app, "audit", AuditOptions, section="wordnet-audit",
         help="Audit an OOD class list, image list or manifest for hierarchy leaks into the ID classes.")
def wordnet_audit(opts: AuditOptions) -> None:
    from isood.stages.wordnet.jobs import run_audit  # nltk takes ~1.5 s to import: only when the command runs

    source = opts.source
    r = run_audit(source, opts.id_classes, exclude=opts.exclude, preset=opts.preset, out=opts.out,
                  verify=opts.verify)
    title = f"Audit of {source} ({r.entries} entries" + (f", manifest {r.manifest.root})" if r.manifest else ")")
    out_console.print(leak_table(r.table))
    out_console.print(counts_table(r.counts, title))
    if r.levels is not None and len(r.levels):
        out_console.print(level_table(r.levels, "sem"))
