"""The `isood` Typer application and its command groups; command modules register on these objects.

Every ``IsoodError`` raised below a command becomes one red line on stderr and exit status 2 (no traceback).
"""

from __future__ import annotations

import click
import typer
from rich.console import Console
from rich.markup import escape
from typer.core import TyperGroup

from isood.errors import IsoodError

__all__ = ["app", "wordnet_app", "import_app", "export_app", "console", "out_console", "error_exit"]

console = Console(stderr=True)
out_console = Console()


def error_exit(ctx: click.Context, error: IsoodError) -> None:
    """Print an IsoodError as one line and exit 2."""
    console.print(f"[red]error:[/red] {escape(str(error))}", highlight=False, soft_wrap=True)
    ctx.exit(2)


class FriendlyGroup(TyperGroup):
    """Turns an IsoodError raised anywhere below into one red line and exit status 2 (no traceback)."""

    def invoke(self, ctx: click.Context):
        try:
            return super().invoke(ctx)
        except IsoodError as e:
            error_exit(ctx, e)


_SETTINGS = {"help_option_names": ["-h", "--help"]}

app = typer.Typer(
    cls=FriendlyGroup,
    help="Build out-of-distribution benchmarks graded by semantic and covariate shift, and evaluate detectors on them.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
    context_settings=_SETTINGS,
)
wordnet_app = typer.Typer(cls=FriendlyGroup, no_args_is_help=True, context_settings=_SETTINGS,
                          help="WordNet tools: the ImageNet-OOD class filter and the hierarchy-leak audit.")
import_app = typer.Typer(cls=FriendlyGroup, no_args_is_help=True, context_settings=_SETTINGS,
                         help="Import OOD lists from other tools (IS-OOD release lists, ImageNet-OOD, OpenOOD "
                              "imglists) as manifests.")
export_app = typer.Typer(cls=FriendlyGroup, no_args_is_help=True, context_settings=_SETTINGS,
                         help="Export manifests for other tools (OpenOOD).")
app.add_typer(wordnet_app, name="wordnet")
app.add_typer(import_app, name="import")
app.add_typer(export_app, name="export")
