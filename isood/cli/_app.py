"""The `isood` Typer application and its command groups; command modules register on these objects.

Every ``IsoodError`` raised below a command becomes one red line on stderr and exit status 2 (no traceback);
so does an ``OSError`` from the environment (disk full, read-only or unwritable folder, a missing file), with
the path it concerns. A Python warning raised while a command runs (a library's, or an ``isood.core.errors.IsoodWarning``:
something a run recovered from) is one yellow ``warning:`` line on stderr, without the file and source line Python
would print. Ctrl-C stops cleanly with exit status 130: a stage writes ``manifest.json`` last, so an interrupted
output never looks complete, and rerunning the same command resumes it.
"""

from __future__ import annotations

import contextlib
import errno
import os
import warnings
from typing import TYPE_CHECKING

import typer
from rich.console import Console
from rich.markup import escape
from typer.core import TyperGroup

from isood.core.errors import IsoodError, IsoodWarning
from manifests.output import public_path

if TYPE_CHECKING:  # the click TyperGroup's methods take: typer (>= 0.2x) runs its own copy, not the click package
    from typer._click import Context, HelpFormatter

__all__ = ["make_console", "LOG_WIDTH", "app", "wordnet_app", "import_app", "export_app", "splits_app", "dev_app", "console", "out_console", "error_exit",
           "isood_warnings"]


#: The width a console takes when its stream is not a terminal (a log, a pipe) and COLUMNS is unset: wide enough
#: that no table is cut or wrapped (rich would take 80 columns and shorten "detector" to "detec…").
LOG_WIDTH = 1000


def make_console(stderr: bool = False) -> Console:
    """A rich console on stdout or stderr: the terminal's width on a terminal (or COLUMNS), else ``LOG_WIDTH``, so
    tables keep their natural width in logs."""
    c = Console(stderr=stderr)
    if not c.is_terminal and not os.environ.get("COLUMNS"):
        c = Console(stderr=stderr, width=LOG_WIDTH)
    return c


console = make_console(stderr=True)
out_console = make_console()


def warning_line(message, category, filename, lineno, file=None, line=None) -> None:  # noqa: ARG001
    """``warnings.showwarning`` while a command runs: the message as one yellow line on stderr."""
    console.print(f"[yellow]warning:[/yellow] {escape(' '.join(str(message).split()))}", highlight=False,
                  soft_wrap=True)


def error_exit(ctx: Context, error: IsoodError) -> None:
    """Print an IsoodError as one line and exit 2."""
    console.print(f"[red]error:[/red] {escape(str(error))}", highlight=False, soft_wrap=True)
    ctx.exit(2)


_OS_HINTS = {
    errno.ENOSPC: "the disk is full; free space or pass an --out on another disk",
    errno.EDQUOT: "the disk quota is exceeded; free space or pass an --out on another disk",
    errno.EROFS: "the file system is read-only; pass a writable --out",
    errno.EACCES: "permission denied; pass a folder you can write (or read)",
    errno.EPERM: "operation not permitted; pass a folder you can write (or read)",
    errno.ENOENT: "it does not exist; check the paths you passed",
}


def os_error_message(error: OSError) -> str:
    """One line for an OSError: what failed, on which path (a file of a staging folder named by the output it
    becomes: ``manifests.output.public_path``), and what to do."""
    where = f" {public_path(error.filename)}" if error.filename else ""
    hint = _OS_HINTS.get(error.errno or -1, "check the paths you passed and the disk")
    return f"cannot use{where}: {error.strerror or type(error).__name__}; {hint}"


@contextlib.contextmanager
def isood_warnings():
    """Show every warning raised meanwhile as one yellow line on stderr (``warning_line``), each
    ``IsoodWarning`` every time it is raised; the caller's warning display is restored afterwards."""
    with warnings.catch_warnings():
        warnings.simplefilter("always", IsoodWarning)
        warnings.showwarning = warning_line
        yield


class FriendlyGroup(TyperGroup):
    """Turns an IsoodError (or an OSError from the environment) raised anywhere below into one red line and exit
    status 2 (no traceback); Ctrl-C into a one-line note and exit status 130; an ``IsoodWarning`` into one yellow
    line."""

    def invoke(self, ctx: Context):
        try:
            with isood_warnings():
                return super().invoke(ctx)
        except IsoodError as e:
            error_exit(ctx, e)
        except OSError as e:
            error_exit(ctx, IsoodError(os_error_message(e)))
        except KeyboardInterrupt:
            console.print("[yellow]interrupted:[/yellow] no output was marked complete; rerun the same command to "
                          "resume", highlight=False, soft_wrap=True)
            ctx.exit(130)

    def get_command(self, ctx: Context, cmd_name: str):
        """The command, its arguments shown by their metavar alone (typer adds the Python type, e.g. ``<str>``,
        which says nothing to a user: the help says what to pass)."""
        cmd = super().get_command(ctx, cmd_name)
        for param in getattr(cmd, "params", ()):
            if getattr(param, "param_type_name", "") == "argument" and getattr(param, "metavar", None):
                param.display_type_rich = lambda ctx: None
        return cmd

    def format_commands(self, ctx: Context, formatter: HelpFormatter) -> None:
        """The command list with each command's whole first sentence, wrapped (click cuts it to one line)."""
        rows = [(name, cmd.get_short_help_str(limit=10 * formatter.width)) for name in self.list_commands(ctx)
                if (cmd := self.get_command(ctx, name)) is not None and not cmd.hidden]
        if rows:
            with formatter.section("Commands"):
                formatter.write_dl(rows)


# --help is click's plain layout (rich_markup_mode=None below), at most HELP_WIDTH columns wide. Typer's rich panel
# puts options in six columns, so at 80 columns the descriptions of `isood evaluate --help` started at column 52
# and long defaults were cut with "…"; click's two columns start them at column 25. $COLUMNS narrows it.
HELP_WIDTH = 100
_SETTINGS = {"help_option_names": ["-h", "--help"], "max_content_width": HELP_WIDTH}

app = typer.Typer(
    cls=FriendlyGroup,
    help="Build out-of-distribution benchmarks graded by semantic and covariate shift, and evaluate detectors on them.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
    context_settings=_SETTINGS,
    rich_markup_mode=None,
)
wordnet_app = typer.Typer(cls=FriendlyGroup, no_args_is_help=True, context_settings=_SETTINGS, rich_markup_mode=None,
                          help="WordNet tools: the ImageNet-OOD class filter and the hierarchy-leak audit.")
import_app = typer.Typer(cls=FriendlyGroup, no_args_is_help=True, context_settings=_SETTINGS, rich_markup_mode=None,
                         help="Import OOD lists from other tools (IS-OOD release lists, ImageNet-OOD, OpenOOD "
                              "imglists) as manifests.")
export_app = typer.Typer(cls=FriendlyGroup, no_args_is_help=True, context_settings=_SETTINGS, rich_markup_mode=None,
                         help="Export manifests for other tools (OpenOOD).")
splits_app = typer.Typer(cls=FriendlyGroup, no_args_is_help=True, context_settings=_SETTINGS, rich_markup_mode=None,
                         help="Work on splits manifests: clean removes the images that leak ID semantics.")
dev_app = typer.Typer(cls=FriendlyGroup, no_args_is_help=True, context_settings=_SETTINGS, rich_markup_mode=None,
                      help="Tools for trying isood and developing it: tiny models that run offline.")
def _print_version(value: bool) -> None:
    if value:
        from manifests.meta import package_version

        out_console.print(f"isood {package_version()}", highlight=False)
        raise typer.Exit()


@app.callback()
def _root(version: bool = typer.Option(False, "--version", callback=_print_version, is_eager=True,
                                       help="Print isood's version and exit.")) -> None:
    """Build out-of-distribution benchmarks graded by semantic and covariate shift, and evaluate detectors on them."""


app.add_typer(wordnet_app, name="wordnet")
app.add_typer(import_app, name="import")
app.add_typer(export_app, name="export")
app.add_typer(splits_app, name="splits")
app.add_typer(dev_app, name="dev")
