"""`--config FILE.toml`: every path an option holds resolves against the file's folder, never the working
directory. Which options hold paths is said once, in their description (``isood.core.optspec.OptionSpec.path_form``:
a path, a name or a file, NAME=PATH entries; and the PATH of a ``local-dir:PATH`` model spec). This walks every
option of every command: a path option given relative in a TOML file in another folder than the working
directory is read as the file next to the TOML; any other string option is on a reasoned list of values that are
not paths on this machine. The case that motivates it: `wordnet filter`'s `candidates` and `id-classes` must
not resolve against the cwd.
"""

from __future__ import annotations

import json

import pytest

from isood.cli.options import COMMANDS
from isood.core.optconfig import from_config
from isood.core.optspec import option_fields

#: String options that never name a file or folder on this machine, and why.
NOT_PATHS = {
    "exclude": "WordNet synset names (organism.n.01)",
    "repo_id": "a Hub repository id (USER/NAME)",
    "revision": "a git tag on the Hub",
    "name": "a benchmark name, a folder name inside the export",
    "data_root": "OpenOOD's data root, written into the exported YAML and resolved by OpenOOD on its machine",
    "data_dir": "a folder under OpenOOD's data root, written into the export (not read here)",
    "val_cells": "grid cell names",
    "cells": "grid cell names",
    "device": "a torch device",
    "ray_address": "a Ray cluster address",
    "clip_quantile": "two numbers",
    "rules": "audit verdict names",
    "leak_rules": "audit verdict names",
    "safety_checker": "an importable package.module:function (runs as trusted code, as --model py:)",
    "detectors": "detector names and parameters",
    "plot_metrics": "metric names",
    "preprocess": "preset names per set name",
    "names": "labels of runs",
    "rank_by": "a metric name",
}


def _rows():
    for words, cls in COMMANDS:
        for f, spec, kind in option_fields(cls):
            if spec.cli and not spec.argument:
                yield words, cls, f, spec, kind


def _is_spec(spec) -> bool:
    """A model spec that may be ``local-dir:PATH`` (its help says so)."""
    return "local-dir:" in spec.help


PATHS = [pytest.param(w, c, f, s, k, id=f"{' '.join(w)} {s.flag_name(f.name)}") for w, c, f, s, k in _rows()
         if k == "path" or s.path_form or _is_spec(s)]


def test_every_string_option_is_a_described_path_or_reasoned():
    unmarked = {f.name for _w, _c, f, spec, kind in _rows()
                if kind in ("str", "list") and not spec.choices and not spec.path_form and not _is_spec(spec)}
    assert unmarked <= set(NOT_PATHS), sorted(unmarked - set(NOT_PATHS))
    assert {"candidates", "id_classes", "cache_dir", "ood", "ood_root", "styles"} <= \
        {f.name for _w, _c, f, s, _k in _rows() if s.path_form}
    assert len(PATHS) >= 40


@pytest.mark.parametrize("words, cls, field, spec, kind", PATHS)
def test_a_relative_path_in_config_is_relative_to_the_file(words, cls, field, spec, kind, tmp_path,
                                                          monkeypatch):
    conf, elsewhere = tmp_path / "conf", tmp_path / "cwd"
    conf.mkdir()
    elsewhere.mkdir()
    (conf / "thing.txt").write_text("n01440764\n")
    (elsewhere / "thing.txt").write_text("n01440764\n")  # the cwd holds a same-named decoy
    monkeypatch.chdir(elsewhere)
    key = spec.flag_name(field.name)[2:]
    if spec.path_form == "named":
        value, want = "a=thing.txt", f"a={conf / 'thing.txt'}"
    elif _is_spec(spec) and kind != "path" and not spec.path_form:
        prefix = "clip:" if "clip:SPEC" in spec.help else ""
        value, want = f"{prefix}local-dir:thing.txt", f"{prefix}local-dir:{conf / 'thing.txt'}"
    else:
        value, want = "thing.txt", str(conf / "thing.txt")
    toml = conf / "c.toml"
    toml.write_text(f"{key} = {json.dumps([value] if kind == 'list' else value)}\n")
    got = from_config(cls, toml, " ".join(words))[field.name]
    assert (got[0] if kind == "list" else got) == want, (key, got)


def test_a_name_stays_a_name_and_a_file_with_names_resolves(tmp_path, monkeypatch):
    """A name-or-file option (``maybe``) keeps a name that is no file there (``21k``), and resolves
    ``FILE:NAMES`` (``--styles my.json:a,b``) by its FILE part."""
    from isood.stages.syn.options import SynOptions
    from isood.stages.wordnet.options import FilterOptions

    (tmp_path / "my.json").write_text("[]")
    toml = tmp_path / "c.toml"
    toml.write_text('styles = "my.json:a,b"\n')
    monkeypatch.chdir("/")
    assert from_config(SynOptions, toml, "generate-syn")["styles"] == f"{tmp_path / 'my.json'}:a,b"
    toml.write_text('candidates = "21k"\nid-classes = "1k"\n')
    assert from_config(FilterOptions, toml, "wordnet filter") == {"candidates": "21k", "id_classes": "1k"}


def test_wordnet_filter_reads_the_class_lists_next_to_its_config(cli, tmp_path, monkeypatch):
    """End to end: `isood wordnet filter --config sub/c.toml` from another folder reads the
    candidate and ID lists next to the TOML file (the cwd holds other lists of the same names)."""
    import manifests

    sub, cwd = tmp_path / "sub", tmp_path / "cwd"
    sub.mkdir()
    cwd.mkdir()
    (sub / "cands.txt").write_text("n02084071\nn04399382\nn03000134\n")  # dog, teddy, chainlink fence
    (sub / "ids.txt").write_text("n01440764\n")
    (cwd / "cands.txt").write_text("n01443537\n")
    (cwd / "ids.txt").write_text("n01484850\n")
    (sub / "c.toml").write_text('candidates = "cands.txt"\nid-classes = "ids.txt"\nout = "filtered"\n'
                                'exclude = [""]\n')
    monkeypatch.chdir(cwd)
    r = cli.invoke(["wordnet", "filter", "--config", sub / "c.toml"])
    assert r.exit_code == 0, r.output
    m = manifests.read(sub / "filtered", kind="class-filter")
    assert sorted(m.classes["wnid"]) == ["n02084071", "n03000134", "n04399382"]
