"""`isood evaluate --help` reads well in an 80- and a 120-column terminal.

Rendered in-process as a terminal of that width renders it (``$COLUMNS``, read by click and rich alike), and
checked against the command's own click parameters: every option name and every default appears whole (never cut
with an ellipsis), each option's help reads through in full down the description column, the descriptions get at
least half the width, and no line is wider than the terminal or than ``HELP_WIDTH`` (long prose lines are hard to
read). Measured before the fix (typer's rich panel): at 80 columns the descriptions started at column 52 (28
columns left) and the default of --detectors was cut to ``msp,maxlogit,energy,mds,k…``; at 120 columns lines were
120 wide. After: descriptions start at column 25 (53 columns used at 80, 73 at 120), lines at most 78 / 98 wide.
"""

from __future__ import annotations

import re

import click
import pytest
import typer

from isood.cli import app
from isood.cli._app import HELP_WIDTH


def render_help(args: list[str], columns: int, monkeypatch, capsys) -> str:
    """What ``isood <args>`` prints in a terminal ``columns`` wide."""
    monkeypatch.setenv("COLUMNS", str(columns))
    monkeypatch.delenv("TERMINAL_WIDTH", raising=False)
    with pytest.raises(SystemExit) as done:
        app(args, prog_name="isood")
    assert done.value.code in (0, None)
    return capsys.readouterr().out


def command(*path: str) -> click.Command:
    """The click command behind ``isood <path>``."""
    cmd = typer.main.get_command(app)
    for name in path:
        cmd = cmd.get_command(click.Context(cmd), name)
    return cmd


def _words(text: str) -> str:
    return " ".join(text.split())


def description_column(lines: list[str], cmd: click.Command) -> int:
    """The column where the option descriptions start: where the first option's help begins."""
    first = next(p.help for p in cmd.params if getattr(p, "help", None))
    start = " ".join(first.split()[:3])
    return next(line.index(start) for line in lines if start in line)


def read_down(lines: list[str], column: int) -> str:
    """The description column read top to bottom as a person reads it (a word split at a hyphen is rejoined)."""
    text = ""
    for line in lines:
        part = line[column:].rstrip().rstrip("│").strip()
        if not part:
            continue
        text += part if text.endswith("-") and not text.endswith(" -") else " " + part
    return _words(text)


@pytest.mark.parametrize("columns", [80, 120])
def test_evaluate_help_reads_well(columns, monkeypatch, capsys):
    out = render_help(["evaluate", "--help"], columns, monkeypatch, capsys)
    lines = out.splitlines()
    cmd = command("evaluate")
    assert max(len(line) for line in lines) <= min(columns, HELP_WIDTH)
    assert "…" not in out  # nothing cut
    for p in cmd.params:
        for name in (*p.opts, *p.secondary_opts):
            assert re.search(rf"(?<![\w-]){re.escape(name)}(?![\w-])", out), name
    options = lines[next(i for i, line in enumerate(lines) if "Options" in line) + 1:]
    column = description_column(lines, cmd)
    assert columns - column >= columns // 2, f"descriptions start at column {column} of {columns}"
    described = read_down(options, column)
    for p in cmd.params:
        if getattr(p, "help", None):
            assert _words(p.help) in described, p.name
        if p.default is not None and not isinstance(p.default, bool) and getattr(p, "show_default", True):
            assert f"default: {p.default}" in described, p.name


@pytest.mark.parametrize("columns", [80, 120])
def test_command_list_shows_each_summary_whole(columns, monkeypatch, capsys):
    out = render_help(["--help"], columns, monkeypatch, capsys)
    lines = out.splitlines()
    assert max(len(line) for line in lines) <= min(columns, HELP_WIDTH)
    assert "…" not in out and "..." not in out.split("Commands", 1)[1]
    group = typer.main.get_command(app)
    for name in group.list_commands(click.Context(group)):
        summary = group.get_command(click.Context(group), name).get_short_help_str(limit=10_000)
        row = next(i for i, line in enumerate(lines) if re.match(rf"\W*{re.escape(name)}\s", line.lstrip("│ ")))
        column = lines[row].index(name) + len(name)
        column += len(lines[row][column:]) - len(lines[row][column:].lstrip())
        block = [lines[row]] + [line for line in lines[row + 1:row + 4] if not line[:column].strip(" │")]
        assert _words(summary) in read_down(block, column), name


def _command_paths(cmd: click.Command, path: tuple[str, ...] = ()):
    yield path
    if hasattr(cmd, "list_commands"):  # a group (TyperGroup is not a click.Group subclass)
        for name in cmd.list_commands(click.Context(cmd)):
            yield from _command_paths(cmd.get_command(click.Context(cmd), name), (*path, name))


def test_every_help_fits_80_columns_and_shows_plain_text(monkeypatch, capsys):
    """Every command's --help at 80 columns: no line wider, nothing cut, no rich-markup escape (``\\[``) left."""
    paths = list(_command_paths(typer.main.get_command(app)))
    assert ("evaluate",) in paths and len(paths) > 10
    for path in paths:
        out = render_help([*path, "--help"], 80, monkeypatch, capsys)
        assert out.startswith(f"Usage: isood {' '.join(path)}".rstrip()), path
        assert max(len(line) for line in out.splitlines()) <= 80, path
        assert "…" not in out and "\\[" not in out, path
