"""``--config FILE.toml`` and the options a manifest records, as the options' descriptions say which values hold
paths (``isood.core.optspec.OptionSpec.path_form``).

* ``from_config(cls, path, section)`` reads ``--config FILE.toml`` (keys = the long option names, ``-`` or ``_``;
  relative paths relative to the file), ``merge_values`` puts command-line values over the file's, defaults
  under both. The path forms: the whole value (``kind='path'``, or ``path=True`` for a string option such as a
  cache folder), a name or a file (``maybe_path``), the PATH of ``NAME=PATH`` entries (``named_path``), the PATH
  of a ``local-dir:PATH`` model; each item of a list.
* ``recorded(opts)``: the options as a manifest's config records them, every path against an explicit root
  (``absolute_spec`` for model specs), never the working directory.
"""

from __future__ import annotations

import dataclasses
import os
import tomllib
from pathlib import Path
from typing import Any, Iterable, Mapping

from isood.core.errors import BadInputError
from isood.core.optspec import OptionSpec, check, option_fields

__all__ = ["LOCAL_DIR", "from_config", "merge_values", "absolute_spec", "recorded"]

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
