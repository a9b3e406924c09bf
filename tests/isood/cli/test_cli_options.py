"""Each option is defined once (``isood.core.optspec``: the field of its command's options dataclass) and the same
bounds are enforced everywhere: this test walks every command built from an options class
(``isood.cli.options.COMMANDS``) and, for each bounded option, passes a value just outside its bounds on the
command line, with dummies for the required options: one line naming the flag and the bound, exit 2, before any
work. It also checks that a flag means one thing across commands (one kind, one set of bounds and choices) and
that ``--help`` shows each option's default or that it is required, and its bounds."""

from __future__ import annotations

import dataclasses
import math

import pytest
from typer.testing import CliRunner

from isood.cli import app
from isood.cli.options import COMMANDS
from isood.core.optspec import REQUIRED, option_fields


def _num(x) -> str:
    return str(int(x)) if float(x).is_integer() else f"{x:g}"


def _rows():
    for words, cls in COMMANDS:
        for f, spec, kind in option_fields(cls):
            if spec.cli:
                yield words, cls, f, spec, kind


def _dummies(cls, skip: str) -> list[str]:
    """Values for the required options of ``cls`` (paths that do not exist: refused only after the check)."""
    args, positional = [], []
    for f, spec, kind in option_fields(cls):
        if f.name == skip or (f.default is not dataclasses.MISSING and f.default is not REQUIRED
                               and not spec.required):
            continue
        value = "/nonexistent/x" if kind in ("path", "list") else "x"
        if spec.argument:
            positional.append(value)
        else:
            args += [spec.flag_name(f.name), value]
    return positional + args


BOUNDED = [pytest.param(words, cls, f, spec, kind, id=f"{' '.join(words)} {spec.flag_name(f.name)}")
           for words, cls, f, spec, kind in _rows() if kind in ("int", "float") and
           (spec.least is not None or spec.most is not None)]


def test_every_command_is_walked():
    names = {" ".join(words) for words, _ in COMMANDS}
    assert {"wordnet filter", "wordnet audit", "verify", "publish", "card", "merge", "demo", "splits clean",
            "import isood-lists", "import imagenet-ood", "import openood-imglist"} <= names
    assert len(BOUNDED) >= 3
    from isood.cli.reference import walk_commands

    every = {" ".join(words) for words, _cmd in walk_commands()}
    assert every - names == set(), "commands whose options are not described once (isood.cli.options.command)"


@pytest.mark.parametrize("words, cls, field, spec, kind", BOUNDED)
def test_a_value_outside_the_bounds_is_refused_in_one_line_before_any_work(words, cls, field, spec, kind,
                                                                           tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    flag = spec.flag_name(field.name)
    bad = []
    if spec.least is not None:
        bad.append(spec.least if spec.least_open else spec.least - 1)
    if spec.most is not None:
        bad.append(spec.most + 1)
    if kind == "float":
        bad.append(math.nan)
    for value in bad:
        text = str(int(value)) if kind == "int" else repr(value)
        r = CliRunner().invoke(app, [*words, *_dummies(cls, field.name), flag, text])
        assert r.exit_code == 2, (words, flag, r.output)
        lines = [ln for ln in r.stderr.splitlines() if ln.strip()]
        assert len(lines) == 1 and flag in lines[0] and "must be" in lines[0], lines
        assert not any(tmp_path.iterdir())  # nothing written


def test_a_flag_means_one_thing_across_commands():
    meaning: dict[str, set] = {}
    for words, _cls, f, spec, kind in _rows():
        if spec.argument:  # a positional argument has no flag to share
            continue
        key = (kind, spec.least, spec.least_open, spec.most, spec.choices, spec.argument)
        meaning.setdefault(spec.flag_name(f.name), set()).add(key)
    mixed = {flag: keys for flag, keys in meaning.items() if len(keys) > 1}
    assert not mixed, mixed


@pytest.mark.parametrize("words, cls", COMMANDS, ids=[" ".join(w) for w, _ in COMMANDS])
def test_help_shows_defaults_required_and_bounds(words, cls, monkeypatch):
    monkeypatch.setenv("COLUMNS", "200")
    out = " ".join(CliRunner().invoke(app, [*words, "--help"]).output.split())
    for f, spec, kind in option_fields(cls):
        if not spec.cli:
            continue
        default = f.default
        if default is REQUIRED or spec.required:
            assert "[required" in out.split(spec.help.split(".")[0], 1)[1][:len(spec.help) + 40], f.name
        elif default not in (None, False, ()):
            shown = ",".join(map(str, default)) if isinstance(default, tuple) else default
            assert f"default: {shown}" in out, (words, f.name)
        if kind in ("int", "float") and spec.least is not None and spec.most is not None:
            bracket = "(" if spec.least_open else "["
            assert f"in {bracket}{_num(spec.least)}, {_num(spec.most)}]" in out, (words, f.name)
        assert "<" + "str>" not in out and "list[" not in out  # no Python types in --help


def _toml_value(spec, kind):
    if spec.choices and kind != "list":
        return f'"{spec.choices[0]}"'
    return {"int": str(int(spec.least or 1)), "float": repr(float(spec.least or 0.5)), "bool": "true",
            "list": '["x"]'}.get(kind, '"x"')


@pytest.mark.parametrize("words, cls", COMMANDS, ids=[" ".join(w) for w, _ in COMMANDS])
def test_config_keys_are_the_long_option_names(words, cls, tmp_path):
    """--config FILE.toml takes each option under its long name (``--levels`` -> ``levels``, also where the
    field is named otherwise, e.g. generate-syn's ``n_levels``), relative paths against the file."""
    from isood.core.optconfig import from_config

    rows = [(f, spec, kind) for f, spec, kind in option_fields(cls) if spec.cli and not spec.argument]
    toml = tmp_path / "c.toml"
    toml.write_text("".join(f"{spec.flag_name(f.name)[2:]} = {_toml_value(spec, kind)}\n" for f, spec, kind in rows))
    got = from_config(cls, toml, " ".join(words))
    assert set(got) == {f.name for f, _spec, _kind in rows}
    for f, spec, kind in rows:
        if kind == "path":
            assert got[f.name] == str(tmp_path / "x"), f.name


@pytest.mark.parametrize("words, cls", COMMANDS, ids=[" ".join(w) for w, _ in COMMANDS])
def test_config_takes_a_toml_list_for_every_comma_separated_option(words, cls, tmp_path):
    """An option that takes a comma-separated list in one string (``--detectors msp,knn:k=10``) also takes a TOML
    list in --config (``detectors = ["msp", "knn:k=10"]``), joined with commas; every option whose help says
    "comma-separated" is such an option."""
    from isood.core.optconfig import from_config

    rows = [(f, spec, kind) for f, spec, kind in option_fields(cls) if spec.cli and not spec.argument]
    for f, spec, kind in rows:
        if "comma-separated" in spec.help.lower():
            assert spec.commas and kind == "str", (words, f.name)
    listed = [(f, spec) for f, spec, _kind in rows if spec.commas]
    if not listed:
        return
    toml = tmp_path / "c.toml"
    toml.write_text("".join(f'{spec.flag_name(f.name)[2:]} = ["a", "b:k=1"]\n' for f, spec in listed))
    got = from_config(cls, toml, " ".join(words))
    assert {f.name: got[f.name] for f, _spec in listed} == {f.name: "a,b:k=1" for f, _spec in listed}


def test_evaluate_config_detectors_as_a_toml_list(tmp_path):
    """The whole path: a TOML list of detectors in --config is checked like the same string on the command line."""
    from isood.stages.evaluate.options import EvaluateOptions
    from isood.core.optconfig import from_config, merge_values

    toml = tmp_path / "e.toml"
    toml.write_text('detectors = ["msp", "knn:k=10", "vim"]\nout = "o"\nid-test = "t"\nsplits = "s"\n')
    opts = merge_values(EvaluateOptions, {}, from_config(EvaluateOptions, toml, "evaluate"))
    assert opts.detectors == "msp,knn:k=10,vim"
