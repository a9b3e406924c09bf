"""Typer commands built from an options dataclass (``isood.core.optspec``): the one description of every option.

``command(group, name, Options)`` registers ``run(opts)`` as ``isood <group> <name>``: one typer parameter per
described field (flag, help with its default / bounds / choices / ``required``, a metavar saying what to pass),
a hidden parameter per deprecated alias (it works, with one warning line), and ``--config FILE.toml``. When the
command runs, the values are merged (defaults < ``--config`` < command line) into ``Options`` and checked by
``isood.core.optspec.check`` before ``run`` is called: an out-of-range value is one line naming the flag, the same
rule wherever the option appears.
"""

from __future__ import annotations

import dataclasses
import inspect
import warnings
from typing import Any, Callable, List, Optional

import typer

from isood.core.errors import BadInputError, IsoodWarning
from isood.core.optspec import REQUIRED, help_text, option_fields
from isood.core.optconfig import from_config, merge_values

__all__ = ["command", "METAVARS", "COMMANDS"]

#: What ``--help`` says an option takes, by kind (a spec's ``metavar`` wins).
METAVARS = {"int": "N", "float": "X", "str": "TEXT", "path": "PATH", "list": "VALUE"}
_TYPES: dict[str, Any] = {"int": Optional[int], "float": Optional[float], "str": Optional[str],
                          "path": Optional[str], "bool": Optional[bool], "list": Optional[List[str]]}
_CONFIG = "config_file"
#: Every command built here: (command words, options class); ``tests/isood/cli/test_cli_options.py`` walks them.
COMMANDS: list[tuple[tuple[str, ...], type]] = []


def _alias_name(field: str, i: int) -> str:
    return f"deprecated_{field}_{i}"


def _parameters(cls: type, config: bool) -> list[inspect.Parameter]:
    params = []
    for f, spec, kind in option_fields(cls):
        if not spec.cli:
            continue
        default = f.default if f.default is not dataclasses.MISSING else REQUIRED
        text = help_text(spec, kind, default)
        flag = spec.flag_name(f.name)
        metavar = spec.metavar or METAVARS.get(kind)
        if spec.argument:
            info = typer.Argument(None if default is REQUIRED else default, help=text, metavar=metavar,
                                  show_default=False)
        elif kind == "bool":
            names = [f"{flag}/{spec.secondary}"] if spec.secondary else [flag]
            info = typer.Option(None, *names, help=text, show_default=False)
        else:
            info = typer.Option(None, flag, help=text, metavar=metavar, show_default=False)
        params.append(inspect.Parameter(f.name, inspect.Parameter.KEYWORD_ONLY, default=info,
                                        annotation=_TYPES[kind]))
        for i, alias in enumerate(spec.aliases):
            hidden = typer.Option(None, alias, hidden=True, metavar=metavar, show_default=False)
            params.append(inspect.Parameter(_alias_name(f.name, i), inspect.Parameter.KEYWORD_ONLY,
                                            default=hidden, annotation=_TYPES[kind]))
    if config:
        params.append(inspect.Parameter(_CONFIG, inspect.Parameter.KEYWORD_ONLY, annotation=Optional[str],
                                        default=typer.Option(None, "--config", metavar="FILE.toml",
                                                             show_default=False,
                                                             help="Read any of these options from a TOML file "
                                                                  "(keys: the long option names); the command "
                                                                  "line wins.")))
    return params


def _values(cls: type, given: dict[str, Any]) -> dict[str, Any]:
    """The command line's values by field, deprecated aliases folded in (one warning line each)."""
    values = {}
    for f, spec, _kind in option_fields(cls):
        if not spec.cli:
            continue
        value = given.get(f.name)
        for i, alias in enumerate(spec.aliases):
            old = given.get(_alias_name(f.name, i))
            if old is not None:
                warnings.warn(f"{alias} is deprecated; pass {spec.flag_name(f.name)}", IsoodWarning, stacklevel=2)
                value = old if value is None else value
        if isinstance(value, list):
            value = tuple(value) if value else None
        values[f.name] = value
    return values


def build(cls: type, section: str, given: dict[str, Any]) -> Any:
    """The checked options of one run: defaults < ``--config`` < the command line (``given``)."""
    config_file = given.pop(_CONFIG, None)
    config = from_config(cls, config_file, section) if config_file else {}
    values = _values(cls, given)
    for f, spec, _kind in option_fields(cls):
        needed = spec.required or (f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING)
        if needed and values.get(f.name) is None and config.get(f.name) is None:
            raise BadInputError(f"{'argument ' + f.name.upper() if spec.argument else spec.flag_name(f.name)} is "
                                "required")
    return merge_values(cls, values, config)


def _group_words(group: typer.Typer) -> tuple[str, ...]:
    """The words of a command group under ``isood`` (``('wordnet',)``; the root app: ``()``)."""
    from isood.cli._app import app

    if group is app:
        return ()
    for info in app.registered_groups:
        if info.typer_instance is group:
            assert info.name is not None, "_app adds every group with its name"
            return (info.name,)
    return ()


def command(group: typer.Typer, name: str, cls: type, *, help: str, section: str | None = None,
            config: bool = True, hidden: bool = False) -> Callable[[Callable[[Any], None]], Callable[..., None]]:
    """Register ``run(opts: cls)`` as the command ``name`` of ``group``, its options built from ``cls``'s field
    descriptions (module docstring). ``section``: the ``[table]`` of a ``--config`` file (default: ``name``)."""

    def register(run: Callable[[Any], None]) -> Callable[..., None]:
        def cli_command(**given: Any) -> None:
            run(build(cls, section or name, given))

        # typeshed gives functions no __signature__; inspect.signature (so typer) reads it
        cli_command.__signature__ = inspect.Signature(_parameters(cls, config))  # type: ignore[attr-defined]
        cli_command.__name__ = run.__name__
        cli_command.__doc__ = help
        group.command(name, help=help, hidden=hidden)(cli_command)
        COMMANDS.append(((*_group_words(group), name), cls))
        return cli_command

    return register
