"""The CLI reference (Markdown), generated from the commands themselves: every command of ``isood``, each option
with what it takes, its default and its description.

A command built from an options dataclass (``isood.cli.options.COMMANDS``) is described from its fields
(``isood.core.optspec.option_fields``: flag, bounds, choices, deprecated aliases, required); any other command from its
click parameters (``typer.main.get_command``). The page is kept in the repository as ``docs/cli.md`` (readable
without building the site): ``python -m isood.cli.reference > docs/cli.md`` writes it, and ``tests/test_docs.py``
fails when it differs from what the code generates, and checks that every command and option appears.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Iterator

from isood.core.optspec import REQUIRED, format_bound, option_fields

__all__ = ["walk_commands", "reference_markdown"]


def walk_commands() -> Iterator[tuple[tuple[str, ...], Any]]:
    """``(words, click command)`` of every command under ``isood`` (groups descended), in ``--help`` order."""
    import typer.main

    from isood.cli import app

    root = typer.main.get_command(app)

    def walk(group: Any, words: tuple[str, ...], ctx: Any) -> Iterator[tuple[tuple[str, ...], Any]]:
        for name in group.list_commands(ctx):
            cmd = group.get_command(ctx, name)
            if cmd is None or cmd.hidden:
                continue
            if hasattr(cmd, "list_commands"):
                yield from walk(cmd, (*words, name), cmd.context_class(cmd, parent=ctx, info_name=name))
            else:
                yield (*words, name), cmd

    yield from walk(root, (), root.context_class(root, info_name="isood"))


def _cell(text: Any) -> str:
    """Text fit for one Markdown table cell: one line; ``|`` escaped (a cell break), ``<`` and ``*`` too (an HTML
    tag, emphasis)."""
    return " ".join(str(text).split()).replace("|", "\\|").replace("<", "&lt;").replace("*", "\\*")


def _code(text: str) -> str:
    return f"`{text}`" if text else ""


def _shown(default: Any) -> str:
    if isinstance(default, (list, tuple)):
        return ",".join(map(str, default))
    return str(default)


def _rows_from_options(cls: type, cmd: Any) -> list[tuple[str, str, str, str]]:
    """The rows of the described fields of ``cls``, then of the command's other parameters (``--config``)."""
    from isood.cli.options import METAVARS

    rows = []
    for f, spec, kind in option_fields(cls):
        if not spec.cli:
            continue
        flag = f.name.upper() if spec.argument else spec.flag_name(f.name)
        if spec.secondary:
            flag += f" / {spec.secondary}"
        takes = "" if kind == "bool" else (spec.metavar or METAVARS.get(kind, ""))
        if spec.choices and kind != "list":
            takes = " | ".join(spec.choices)
        elif kind in ("int", "float") and (spec.least is not None or spec.most is not None):
            low = "" if spec.least is None else f"{format_bound(spec.least)} <= "
            high = "" if spec.most is None else f" <= {format_bound(spec.most)}"
            takes = f"{low}{takes}{high}"
        elif kind == "list" and (spec.least is not None or spec.most is not None):
            takes = f"{takes} ({format_bound(spec.least or 0)}..{'' if spec.most is None else format_bound(spec.most)} values)"
        default = f.default if f.default is not dataclasses.MISSING else REQUIRED
        shown = "**required**" if default is REQUIRED else (
            "" if default is None or default == () or (kind == "bool" and default is False) else _code(_shown(default)))
        text = spec.help + (f" Deprecated alias: {', '.join(spec.aliases)}." if spec.aliases else "")
        rows.append((_code(flag), _cell(takes), shown, _cell(text)))
    described = {spec.flag_name(f.name) for f, spec, _kind in option_fields(cls)}
    others = [p for p in cmd.params if getattr(p, "param_type_name", "") != "argument" and not described & set(p.opts)]
    return rows + _rows_from_click(cmd, others)


def _metavar(param: Any) -> str:
    """What a click / typer parameter takes, in ``METAVARS``' words (typer keeps the annotation, click a type)."""
    import os
    import typing
    from pathlib import Path

    from isood.cli.options import METAVARS

    annotation = getattr(getattr(param, "type_descriptor", None), "annotation", None)
    if annotation is not None:
        if typing.get_origin(annotation) is not None:  # Optional[X], List[X]
            args = [a for a in typing.get_args(annotation) if a is not type(None)]
            annotation = args[0] if args else str
        kind = {int: "int", float: "float", str: "str", Path: "path", os.PathLike: "path"}.get(annotation, "str")
        return METAVARS[kind]
    name = getattr(getattr(param, "type", None), "name", "") or ""
    return {"integer": "N", "float": "X", "text": "TEXT", "path": "PATH"}.get(name.lower(), name.upper())


def _rows_from_click(cmd: Any, params: list | None = None) -> list[tuple[str, str, str, str]]:
    rows = []
    for p in cmd.params if params is None else params:
        if getattr(p, "hidden", False) or "--help" in p.opts:
            continue
        argument = getattr(p, "param_type_name", "") == "argument"
        flag = (p.metavar or p.name.upper()) if argument else " / ".join(p.opts + list(p.secondary_opts))
        flagish = getattr(p, "is_flag", False)
        takes = "" if flagish else (p.metavar or _metavar(p))
        default = p.default
        if p.required:
            shown = "**required**"
        elif default is None or default == () or default is False or (flagish and not p.secondary_opts):
            shown = ""
        elif flagish:
            shown = _code(p.opts[0] if default else p.secondary_opts[0])
        else:
            shown = _code(_shown(default))
        rows.append((_code(flag), _cell(takes), shown, _cell(getattr(p, "help", "") or "")))
    return rows


def reference_markdown() -> str:
    """The whole CLI reference page (Markdown)."""
    from isood.cli.options import COMMANDS

    by_words = {words: cls for words, cls in COMMANDS}
    out = ["# CLI reference", "",
           "Every command, generated from the code (`python -m isood.cli.reference > docs/cli.md`): the options "
           "and their defaults are those of this version. Every command also has `-h` / `--help`. A command with "
           "`--config FILE.toml` reads any of its options from a TOML file (keys: the long option names; the "
           "command line wins). Errors about your input are one line on stderr and exit status 2.", ""]
    commands = list(walk_commands())
    out += [f"- [`isood {' '.join(w)}`](#{'-'.join(('isood', *w))})" for w, _ in commands]
    for words, cmd in commands:
        name = " ".join(("isood", *words))
        cls = by_words.get(words)
        rows = _rows_from_options(cls, cmd) if cls is not None else _rows_from_click(cmd)
        out += ["", f"## `{name}` {{#{'-'.join(('isood', *words))}}}", "", " ".join((cmd.help or "").split()), "",
                "| option | takes | default | description |", "|---|---|---|---|"]
        out += [f"| {flag} | {takes} | {default} | {text} |" for flag, takes, default, text in rows]
    return "\n".join(out) + "\n"


if __name__ == "__main__":  # python -m isood.cli.reference > cli.md
    print(reference_markdown(), end="")
