"""The `isood` command line: parse, load, call, write. The science lives in the modules it calls."""

from __future__ import annotations

from pathlib import Path
from typing import List, Optional

import click
import typer
from rich.console import Console
from typer.core import TyperGroup

from isood.errors import IsoodError

console = Console(stderr=True)
out_console = Console()


class _FriendlyGroup(TyperGroup):
    """Turns an IsoodError raised anywhere below into one red line and exit status 2 (no traceback)."""

    def invoke(self, ctx: click.Context):
        try:
            return super().invoke(ctx)
        except IsoodError as e:
            console.print(f"[red]error:[/red] {e}", highlight=False, soft_wrap=True)
            ctx.exit(2)


def _not_built(command: str, issue: str) -> None:
    console.print(f"isood {command}: not built yet ({issue}); see README 'Status'.")
    raise typer.Exit(2)


app = typer.Typer(
    cls=_FriendlyGroup,
    help="Build out-of-distribution benchmarks graded by semantic and covariate shift, and evaluate detectors on them.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
    context_settings={"help_option_names": ["-h", "--help"]},
)
wordnet_app = typer.Typer(
    cls=_FriendlyGroup,
    help="WordNet tools: the ImageNet-OOD class filter and the hierarchy-leak audit.",
    no_args_is_help=True,
)
app.add_typer(wordnet_app, name="wordnet")

_EXCLUDE_DEFAULT = ["organism.n.01"]


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
    from wordnet_tools.jobs import run_filter, summary_table

    excl = _EXCLUDE_DEFAULT if exclude is None else [e for e in exclude if e]
    manifest = run_filter(candidates, id_classes, excl, sisters_only, out)
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
    from wordnet_tools.jobs import run_audit

    excl = _EXCLUDE_DEFAULT if exclude is None else [e for e in exclude if e]
    table, counts = run_audit(list_file, id_classes, excl, out)
    out_console.print(table)
    out_console.print(counts)


@app.command()
def verify(manifest_dir: Path = typer.Argument(..., help="A manifest directory.")) -> None:
    """Recompute every hash of a manifest; name each missing, extra or changed file (exit 1 if any)."""
    import manifests

    report = manifests.verify(manifest_dir)
    if report.ok:
        m = manifests.read(manifest_dir)
        out_console.print(f"OK {manifest_dir}: {m.kind} v{m.dataset_version}, {len(m.meta['files'])} files verified")
        return
    for line in report.lines():
        out_console.print(line, highlight=False)
    out_console.print(f"FAILED {manifest_dir}: {len(report.lines())} problem(s)")
    raise typer.Exit(1)


@app.command()
def demo(
    out: Path = typer.Option(Path("demo-out"), help="Output directory for the demo manifests."),
    seed: int = typer.Option(0, help="Seed of the planted world."),
) -> None:
    """Run the whole pipeline on the embedded default: the WordNet class filter and a planted synthetic world."""
    from isood.demo import run_demo

    run_demo(out, seed=seed, console=out_console)


@app.command("build-splits")
def build_splits() -> None:
    """Measure each test image's semantic and covariate shift to the ID set and bin them into an 8x8 grid."""
    _not_built("build-splits", "issue: IS-OOD core")


@app.command("generate-syn")
def generate_syn() -> None:
    """Syn-IS: style x label prompts binned by shift, generated with SDXL-Turbo."""
    _not_built("generate-syn", "issue: Syn-IS generation")


@app.command()
def evaluate() -> None:
    """Score OOD detectors per shift cell; metrics, heatmaps and a report."""
    _not_built("evaluate", "issue: evaluation core")


@app.command()
def publish() -> None:
    """Publish a verified manifest to the Hugging Face Hub."""
    _not_built("publish", "issue: Hub publishing")


def main() -> None:
    app()


if __name__ == "__main__":
    main()
