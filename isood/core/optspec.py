"""One description per command option: the field of the command's options dataclass.

Every command's options are one frozen dataclass (``BuildConfig``, ``EvaluateOptions``, ...) whose fields carry
their description in their metadata (``option(...)``): the flag, the help text, the default, the type, the
bounds or choices, a deprecated alias. From that one description:

* ``check(opts)`` validates every field (one rule per type: an integer in [least, most], a finite number, one of
  the choices, ...): one line naming the flag and what to pass, the same wherever the option appears;
* ``isood.cli`` builds the typer command (``cli_params``), with the default and the bounds in ``--help`` and
  required options marked, and a deprecated alias that still works but prints one warning line;
* ``from_config(cls, path, section)`` reads ``--config FILE.toml`` (keys = the long option names, ``-`` or ``_``;
  relative paths relative to the file), command-line values winning over the file's, defaults under both. Which
  values hold paths is said once, in the description (``OptionSpec.path_form``): the whole value (``kind='path'``,
  or ``path=True`` for a string option such as a cache folder), a name or a file (``maybe_path``), the PATH of
  ``NAME=PATH`` entries (``named_path``), the PATH of a ``local-dir:PATH`` model; each item of a list.

This module knows no command; it needs only the standard library (and ``tomllib``).
"""

from __future__ import annotations

import dataclasses
import math
import os
import tomllib
import types
import typing
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterable, Mapping, Sequence

from isood.core.defaults import (DEFAULT_BATCH_SIZE, DEFAULT_VERIFY, ENGINES, LEVELS_NOTE, MAX_LEVELS, N_LEVELS,
                            NA_THRESHOLD, SEED_MAX, VERIFY_HELP, VERIFY_MODES)
from isood.core.errors import BadInputError

__all__ = ["OptionSpec", "option", "spec_of", "option_fields", "check", "check_value", "format_bound", "one_of", "from_config",
           "merge_values", "help_text", "REQUIRED", "verify_option", "seed_option", "out_option", "levels_option",
           "na_threshold_option", "batch_size_option", "workers_option", "device_option", "EngineFields",
           "JobArrayFields", "MAX_WORKERS", "absolute_spec", "recorded"]

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


# ------------------------------------------------------------------------------------------------ --config
#: A model spec naming a local folder (``--clip local-dir:PATH``, ``--pipeline local-dir:PATH``).
LOCAL_DIR = "local-dir:"


#: What may come before ``local-dir:PATH`` in a model spec (``--model clip:local-dir:PATH``).
_SPEC_PREFIXES = ("", "clip:")


def _maybe(value: str, base: Path) -> str:
    """A name-or-file value: the file next to the ``--config`` file when one is there (``FILE`` or
    ``FILE:NAMES``, as ``--styles my.json:a,b``), else the value as written (a name)."""
    if (base / value).exists():
        return str(base / value)
    head, colon, tail = value.rpartition(":")
    if colon and head and (base / head).exists():
        return f"{base / head}:{tail}"
    return value


def _resolve(value: Any, spec: OptionSpec, kind: str, base: Path) -> Any:
    """A ``--config`` value with its relative path made relative to the file's folder ``base``, as the
    option's description says (``OptionSpec.path_form``); each item of a list; the PATH of a ``local-dir:PATH``
    model spec; a TOML list of strings for a ``commas`` option joined with commas."""
    if spec.commas and isinstance(value, list) and all(isinstance(v, str) and "," not in v for v in value):
        return ",".join(value)
    if isinstance(value, list) and kind == "list":
        return [_resolve(v, spec, "str", base) for v in value]
    if not isinstance(value, str) or not value:
        return value
    form = "path" if kind == "path" else spec.path_form
    if form == "path":
        return str(base / Path(value).expanduser())
    if form == "maybe":
        return _maybe(value, base)
    if form == "named":
        name, eq, rest = value.partition("=")
        return f"{name}={base / Path(rest.strip()).expanduser()}" if eq and rest.strip() else value
    prefix, local, rest = value.partition(LOCAL_DIR)
    if local and prefix in _SPEC_PREFIXES:
        return prefix + LOCAL_DIR + str(base / Path(rest).expanduser())
    return value


#: The files a ``MODEL:FILE`` spec may name (open_clip's checkpoint files).
_WEIGHT_FILES = (".safetensors", ".bin", ".pth", ".pt", ".ckpt")


def absolute_spec(value: Any) -> Any:
    """A model spec as a manifest records it, against an explicit root, never the working directory: the PATH of
    ``local-dir:PATH`` (also inside ``clip:local-dir:PATH``) made absolute, and so a checkpoint file named after
    the last ``:`` (``MODEL:FILE``, a weights file); any other value (a Hub name, a tag) unchanged."""
    if not isinstance(value, str) or not value:
        return value
    head, sep, path = value.partition(LOCAL_DIR)
    if sep and path:
        return head + LOCAL_DIR + os.path.abspath(os.path.expanduser(path))
    head, sep, tail = value.rpartition(":")
    if sep and tail.endswith(_WEIGHT_FILES) and not os.path.isabs(tail) and os.path.isfile(os.path.expanduser(tail)):
        return f"{head}:{os.path.abspath(os.path.expanduser(tail))}"
    return value


def _recorded_value(value: Any, spec: OptionSpec, kind: str) -> Any:
    if isinstance(value, (tuple, list)):
        if spec.path_form != "named":
            return value
        out = []
        for item in value:  # NAME=PATH pairs (--ood, --ood-root): the path made absolute
            name, sep, path = str(item).partition("=")
            out.append(f"{name}={os.path.abspath(os.path.expanduser(path))}" if sep and path else item)
        return type(value)(out)
    if not isinstance(value, str) or not value:
        return value
    if spec.path_form == "named" and "=" in value:
        return _recorded_value((value,), spec, "list")[0]
    if spec.path_form == "path" or (spec.maybe_path and os.path.exists(value)):
        return os.path.abspath(os.path.expanduser(value))
    return absolute_spec(value)


def recorded(opts: Any, *, skip: Iterable[str] = ()) -> dict[str, Any]:
    """The options as a manifest's config records them (every field but ``skip``): path options, a ``maybe_path``
    value naming a file or folder, the paths of ``NAME=PATH`` pairs and model specs (``absolute_spec``) made
    absolute, so a manifest read from another working directory names the same files."""
    described = {f.name: (spec, kind) for f, spec, kind in option_fields(type(opts))}
    skipped = set(skip)
    out = {}
    for f in dataclasses.fields(opts):
        if f.name in skipped:
            continue
        value = getattr(opts, f.name)
        out[f.name] = _recorded_value(value, *described[f.name]) if f.name in described else value
    return out


def from_config(cls: type, path: str | os.PathLike, section: str) -> dict[str, Any]:
    """The options of a TOML file for the command ``section`` (its keys at the top, or under ``[section]``):
    long option names with - or _; paths relative to the file's folder; an unknown key is a one-line error."""
    from isood.core.textio import read_text

    p = Path(path)
    try:
        data = tomllib.loads(read_text(p, what="--config"))
    except tomllib.TOMLDecodeError as e:
        raise BadInputError(f"--config {p}: invalid TOML ({' '.join(str(e).split())})") from None
    keys = {section, section.replace("-", "_")}
    if len(data) == 1 and set(data) <= keys and isinstance(next(iter(data.values())), dict):  # a [section] table
        data = next(iter(data.values()))
    described = [(f, spec, kind) for f, spec, kind in option_fields(cls) if not spec.argument]
    names = {spec.flag_name(f.name)[2:].replace("-", "_"): f.name for f, spec, _kind in described}  # the flag's
    names.update({f.name: f.name for f, _spec, _kind in described})  # ... or the Python API's field name
    known = {f.name: (spec, kind) for f, spec, kind in described}
    values = {}
    for key, value in data.items():
        name = names.get(key.replace("-", "_"))
        if name is None:
            raise BadInputError(f"--config {p}: unknown key {key!r} for `isood {section}`; known: "
                                f"{', '.join(sorted(spec.flag_name(f.name)[2:] for f, spec, _kind in described))}")
        values[name] = _resolve(value, *known[name], p.parent)
    return values


def merge_values(cls: type, given: Mapping[str, Any], config: Mapping[str, Any] | None = None) -> Any:
    """``cls(...)`` from defaults < ``config`` (a TOML file's values) < ``given`` (the command line: None = not
    given), checked (``check``)."""
    values = dict(config or {})
    values.update({k: v for k, v in given.items() if v is not None})
    return check(cls(**values))


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


# ------------------------------------------------------------------------------------------------ shared options
def verify_option() -> Any:
    """``--verify fast|full`` of every command that reads manifests."""
    return option(DEFAULT_VERIFY, help=VERIFY_HELP, choices=VERIFY_MODES, metavar="MODE")


def seed_option(help: str) -> Any:
    """``--seed``: one bound for every command (``isood.core.defaults.SEED_MAX``)."""
    return option(0, help=help, least=0, most=SEED_MAX)


def levels_option(help: str = "Levels per axis of the grid.", *, flag: str | None = None) -> Any:
    """``--levels``: one bound for every command (``isood.core.defaults.MAX_LEVELS``; ``isood.science.grid.check_levels``);
    ``flag`` for a field named otherwise (``n_levels``)."""
    return option(N_LEVELS, help=help, flag=flag, least=1, most=MAX_LEVELS, why=LEVELS_NOTE)


def out_option(help: str = "Output manifest directory.", *, required: bool = True) -> Any:
    """``--out``: the folder a command writes (``manifests.writing``)."""
    return option(REQUIRED if required else None, help=help, kind="path", metavar="DIR")


#: The most ``--workers`` (decoding processes) any command takes.
MAX_WORKERS = 256


def na_threshold_option(help: str = "A cell with fewer images is N/A.", *, from_manifest: bool = False) -> Any:
    """``--na-threshold``: one bound for every command (a cell needs an image to be measured). A command that
    writes a grid defaults to ``NA_THRESHOLD``; one that reads a grid manifest (``from_manifest``) defaults to
    None: the manifest's own threshold (``GridView.na_threshold``), which an explicit value overrides."""
    return option(None if from_manifest else NA_THRESHOLD, help=help, least=1,
                  why=f"a cell needs images to be measured; IS-OOD uses {NA_THRESHOLD}")


def batch_size_option(help: str = "Images per batch.", default: int = DEFAULT_BATCH_SIZE) -> Any:
    """``--batch-size``: images per forward pass."""
    return option(default, help=help, least=1)


def workers_option(default: int | None = None, help: str = "") -> Any:
    """``--workers``: image-decoding processes running ahead of the model, in every command (0: decode in the
    model's process); ``default`` None: ``isood.core.devices.default_workers`` (CPUs - 1, at most 32)."""
    text = "Image-decoding processes, running ahead of the model (0: decode in the model's process" + \
        ("; default: CPUs - 1, at most 32)" if default is None else ")") + (f"; {help}" if help else "") + "."
    return option(default, help=text, least=0, most=MAX_WORKERS)


def device_option(help: str = "") -> Any:
    """``--device``: where the model runs."""
    return option(None, metavar="DEVICE", help="cpu, cuda or cuda:N (default: cuda when available)"
                                               + (f"; {help}" if help else "") + ".")


@dataclass(frozen=True, kw_only=True)
class EngineFields:
    """The engine options of the commands that run on Ray too (extract, build-splits, generate-syn)."""

    engine: str = option("local", choices=ENGINES, metavar="ENGINE",
                         help="local (this process) or ray (Ray Data actors; pip install 'isood[ray]').")
    ray_address: str | None = option(None, metavar="ADDRESS",
                                     help="Ray cluster to join (auto, HOST:PORT, ray://HOST:10001; default: "
                                          "$RAY_ADDRESS, else a local one).")
    ray_workers: int | None = option(None, least=1, metavar="N", aliases=(),
                                     help="Ray engine: model actors (default: one per GPU, else per CPU).")
    num_gpus_per_worker: float | None = option(None, least=0, help="GPUs per Ray actor (default: 1 when the "
                                                                   "cluster has GPUs, else 0).")


@dataclass(frozen=True, kw_only=True)
class JobArrayFields:
    """A job array's task (``isood.core.parts``): the units split over ``num_shards`` tasks, this one ``shard_index``."""

    num_shards: int = option(1, least=1, help="Job arrays: split the work over this many tasks (merge with "
                                              "`isood merge`).")
    shard_index: int = option(0, least=0, help="Job arrays: this task's index, 0..num-shards-1 (e.g. "
                                               "$SLURM_ARRAY_TASK_ID).")
