"""One description per command option: the field of the command's options dataclass.

Every command's options are one frozen dataclass (``SplitsOptions``, ``EvaluateOptions``, ...) whose fields carry
their description in their metadata (``option(...)``): the flag, the help text, the default, the type, the
bounds or choices, a deprecated alias. From that one description:

* ``check(opts)`` validates every field (one rule per type: an integer in [least, most], a finite number, one of
  the choices, ...): one line naming the flag and what to pass, the same wherever the option appears;
  ``check_field(cls, name, value)`` / ``check_described`` check one value against a field's description (for a
  value the Python API takes outside a command, e.g. ``isood.engines.ray.RayOptions``);
* ``isood.cli`` builds the typer command (``cli_params``), with the default and the bounds in ``--help`` and
  required options marked (``help_text``), and a deprecated alias that still works but prints one warning line;
* ``isood.core.optconfig`` reads ``--config FILE.toml`` and records the options in a manifest, as the
  description says which values hold paths (``OptionSpec.path_form``);
* ``isood.core.shared_options`` holds the options many commands share (``--seed``, ``--workers``, the engine and
  job-array fields).

This module knows no command; it needs only the standard library.
"""

from __future__ import annotations

import dataclasses
import math
import os
import types
import typing
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterable, Sequence

from isood.core.errors import BadInputError

__all__ = ["OptionSpec", "option", "spec_of", "option_fields", "check", "check_value", "check_field", "check_described",
           "format_bound", "one_of", "help_text", "REQUIRED"]

#: The default of an option that has none (the command refuses to run without it).
REQUIRED: Any = dataclasses.MISSING

_KINDS = ("int", "float", "str", "path", "bool", "list")


@dataclass(frozen=True)
class OptionSpec:
    """How one option is named, shown and checked (see ``option``)."""

    help: str
    flag: str | None = None           # "--na-threshold"; None: the field name with - for _
    kind: str | None = None           # int | float | str | path | bool | list (default: from the annotation)
    least: float | None = None
    most: float | None = None
    least_open: bool = False          # the lower bound itself is refused: (least, most]
    choices: tuple[str, ...] | None = None
    metavar: str | None = None
    aliases: tuple[str, ...] = ()     # deprecated spellings, accepted with one warning line
    argument: bool = False            # positional
    secondary: str | None = None      # the "off" flag of a bool: "--no-der"
    cli: bool = True                  # False: Python API only (e.g. progress)
    path_in_config: bool = False      # a path: relative values in --config are relative to the file
    why: str = ""                     # said by a refusal of an out-of-bound value
    required: bool = False            # the command line needs it though the Python API may leave it None
    objects: bool = False             # the Python API may pass a loaded object instead (only strings are checked)
    maybe_path: bool = False          # a name or a file: a relative value in --config that exists there is a path
    commas: bool = False              # a comma-separated list in one string: --config may give a TOML list
    named_path: bool = False          # NAME=PATH entries: the PATH part is a path

    def flag_name(self, field_name: str) -> str:
        return self.flag or "--" + field_name.replace("_", "-")

    @property
    def path_form(self) -> str:
        """How a value of this option holds a path: 'path' (all of it), 'maybe' (a name, or a file when one
        exists there), 'named' (the PATH of NAME=PATH), or '' (none, but a ``local-dir:PATH`` model spec)."""
        return "path" if self.path_in_config else "maybe" if self.maybe_path else "named" if self.named_path else ""


def option(default: Any = REQUIRED, *, help: str, flag: str | None = None, kind: str | None = None,
           least: float | None = None, most: float | None = None, least_open: bool = False,
           choices: Sequence[str] | None = None,
           metavar: str | None = None, aliases: Sequence[str] = (), argument: bool = False,
           secondary: str | None = None, cli: bool = True, why: str = "", required: bool = False,
           objects: bool = False, maybe_path: bool = False, named_path: bool = False, path: bool = False,
           commas: bool = False,
           default_factory: Callable[[], Any] | None = None) -> Any:
    """A dataclass field described for the command line (module docstring). ``least`` / ``most`` bound numbers
    (and the count of a list); ``choices`` the allowed strings; ``kind='path'`` marks a path; ``required``: the
    command line needs it (the Python API may leave it None); ``objects``: the Python API may pass a loaded
    object (a model, an encoder) instead of its name, which is then not checked; ``least_open``: ``least``
    itself is refused (the bound reads ``(least, most]`` in ``--help`` and in the refusal); ``maybe_path``: a
    name or a file (``--labels 21k`` or ``--labels my.txt``): in ``--config``, a relative value naming a file
    next to it is that file; ``named_path``: ``NAME=PATH`` values (one or a list) whose PATH is a path;
    ``path``: a string option that is a path but for a special value the path kind refuses (``--cache-dir ''``).
    Every path form resolves against the ``--config`` file's folder. ``commas``: a comma-separated list in one
    string (``--detectors msp,knn:k=10``), which ``--config`` may also give as a TOML list of strings
    (``detectors = ["msp", "knn:k=10"]``)."""
    if kind is not None and kind not in _KINDS:
        raise ValueError(f"unknown option kind {kind!r}")
    spec = OptionSpec(help=help, flag=flag, kind=kind, least=least, most=most, least_open=least_open,
                      choices=tuple(choices) if choices is not None else None, metavar=metavar,
                      aliases=tuple(aliases), argument=argument, secondary=secondary, cli=cli,
                      path_in_config=kind == "path" or path, why=why, required=required, objects=objects,
                      maybe_path=maybe_path, named_path=named_path, commas=commas)
    meta = {"isood": spec}
    if default_factory is not None:
        return dataclasses.field(default_factory=default_factory, metadata=meta)
    return dataclasses.field(default=default, metadata=meta)


def spec_of(f: dataclasses.Field) -> OptionSpec | None:
    return f.metadata.get("isood")


def option_fields(cls: type) -> list[tuple[dataclasses.Field, OptionSpec, str]]:
    """``(field, spec, kind)`` of every described field of an options dataclass, in declaration order, the
    fields it inherits (``EngineFields``, ``JobArrayFields``) last (the kind from the spec, else from the
    annotation)."""
    hints = typing.get_type_hints(cls)
    own = set(cls.__dict__.get("__annotations__", {}))
    out = []
    for f in sorted(dataclasses.fields(cls), key=lambda f: f.name not in own):  # the command's own first
        spec = spec_of(f)
        if spec is not None:
            out.append((f, spec, spec.kind or _kind_of(hints.get(f.name, str))))
    return out


def _kind_of(annotation: Any) -> str:
    if typing.get_origin(annotation) in (typing.Union, types.UnionType):  # X | None
        annotation = next(a for a in typing.get_args(annotation) if a is not type(None))
    base = typing.get_origin(annotation) or annotation
    if base in (list, tuple):
        return "list"
    if base is bool:
        return "bool"
    if base is int:
        return "int"
    if base is float:
        return "float"
    if base in (Path, os.PathLike):
        return "path"
    return "str"


def _default(f: dataclasses.Field) -> Any:
    if f.default is not dataclasses.MISSING:
        return f.default
    if f.default_factory is not dataclasses.MISSING:
        return f.default_factory()
    return REQUIRED


# ------------------------------------------------------------------------------------------------ checking
def format_bound(x: float) -> str:
    """A bound as written: integers in full (2147483647, not 2.14748e+09), other numbers in %g."""
    return str(int(x)) if float(x).is_integer() else f"{x:g}"


def _range(least: float | None, most: float | None, least_open: bool = False) -> str:
    if least is not None and most is not None:
        return f"in {'(' if least_open else '['}{format_bound(least)}, {format_bound(most)}]"
    if least is not None:
        return f"{'>' if least_open else '>='} {format_bound(least)}"
    if most is not None:
        return f"<= {format_bound(most)}"
    return ""


def one_of(choices: Iterable[str]) -> str:
    """``a, b or c``: the values a choice option accepts, as error messages name them."""
    names = [str(c) for c in choices]
    return names[0] if len(names) == 1 else f"{', '.join(names[:-1])} or {names[-1]}"


def check_value(flag: str, spec: OptionSpec, kind: str, value: Any) -> Any:
    """``value`` checked (and normalised: paths to str) against the option's kind, bounds and choices; a
    one-line ``BadInputError`` naming ``flag`` otherwise. None passes (an optional option not given)."""
    if value is None:
        return None
    if spec.objects and not isinstance(value, (str, os.PathLike)):
        return value
    bound = _range(spec.least, spec.most, spec.least_open)
    if kind == "int":
        if isinstance(value, bool) or not hasattr(value, "__index__"):
            raise BadInputError(f"{flag} must be an integer{' ' + bound if bound else ''}, got {value!r}")
        value = value.__index__()
        if (spec.least is not None and value < spec.least) or (spec.most is not None and value > spec.most):
            raise BadInputError(f"{flag} must be an integer {bound}, got {value!r}"
                                + (f" ({spec.why})" if spec.why else ""))
    elif kind == "float":
        if isinstance(value, bool) or not isinstance(value, (int, float)) and not hasattr(value, "__float__"):
            raise BadInputError(f"{flag} must be a number{' ' + bound if bound else ''}, got {value!r}")
        value = float(value)
        below = spec.least is not None and (value <= spec.least if spec.least_open else value < spec.least)
        if not math.isfinite(value) or below or (spec.most is not None and value > spec.most):
            raise BadInputError(f"{flag} must be a finite number{' ' + bound if bound else ''}, got {value!r}")
    elif kind == "bool":
        if not isinstance(value, bool):
            raise BadInputError(f"{flag} must be true or false, got {value!r}")
    elif kind == "path":
        if not isinstance(value, (str, os.PathLike)) or str(value) == "":
            raise BadInputError(f"{flag} must be a path, got {value!r}")
        value = os.fspath(value)
    elif kind == "list":
        if isinstance(value, (str, bytes)) or not isinstance(value, Iterable):
            raise BadInputError(f"{flag} must be a list of values, got {value!r}")
        value = tuple(value)
        if (spec.least is not None and len(value) < spec.least) or (spec.most is not None and len(value) > spec.most):
            raise BadInputError(f"{flag} takes {bound} values, got {len(value)}")
    else:
        if not isinstance(value, str):
            raise BadInputError(f"{flag} must be a string, got {value!r}")
    if spec.choices is not None and kind != "list" and value not in spec.choices:
        raise BadInputError(f"{flag} {value!r}: unknown value; pass {one_of(spec.choices)}")
    return value


def check(opts: Any) -> Any:
    """Validate every described field of ``opts`` (module docstring); returns a copy with normalised values
    (paths as strings). A required option left unset is a one-line error naming its flag."""
    changes = {}
    for f, spec, kind in option_fields(type(opts)):
        flag = spec.flag_name(f.name)
        value = getattr(opts, f.name)
        if value is REQUIRED:
            raise BadInputError(f"{flag} is required")
        checked = check_value(flag, spec, kind, value)
        if checked is not value:
            changes[f.name] = checked
    return dataclasses.replace(opts, **changes) if changes else opts


def check_described(name: str, described: Any, value: Any, kind: str = "int") -> Any:
    """``value`` checked against ``described``, an ``option(...)`` field of ``kind`` named ``name`` (a shared
    option such as ``isood.core.shared_options.seed_option(...)``), as ``check`` checks it: the one bound, for a
    value the Python API takes outside an options dataclass."""
    spec = spec_of(described)
    if spec is None:
        raise TypeError("check_described takes a field made by option(...)")
    return check_value(spec.flag_name(name), spec, kind, value)


def check_field(cls: type, name: str, value: Any) -> Any:
    """``value`` checked against the description of the field ``name`` of the options dataclass ``cls``
    (``check_value``): the one bound, for a value given outside a command (the Python API)."""
    for f, spec, kind in option_fields(cls):
        if f.name == name:
            return check_value(spec.flag_name(name), spec, kind, value)
    raise KeyError(f"{cls.__name__} describes no option {name!r}")


# ------------------------------------------------------------------------------------------------ help
def help_text(spec: OptionSpec, kind: str, default: Any) -> str:
    """The help of an option with what ``--help`` must show: its default (or that it is required), its bounds
    or choices, its deprecated aliases."""
    notes = []
    if default is REQUIRED or spec.required:
        notes.append("required")
    elif default is not None and not (kind == "bool" and default is False) and default != ():
        shown = ",".join(map(str, default)) if isinstance(default, (list, tuple)) else default
        notes.append(f"default: {shown}")
    bound = _range(spec.least, spec.most, spec.least_open)
    if bound and kind in ("int", "float"):
        notes.append(bound)
    if spec.choices and kind != "list":
        notes.append("one of " + ", ".join(spec.choices))
    if spec.aliases:
        notes.append("deprecated alias: " + ", ".join(spec.aliases))
    return spec.help + (f" [{'; '.join(notes)}]" if notes else "")
