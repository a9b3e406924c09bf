"""Filter presets: `imagenet-ood-paper` excludes organism.n.01 (the paper's rule), `imagenet-ood-release` excludes
animal.n.01 (the published ImageNet-OOD list keeps people and plants); an explicit --exclude wins. Checked on a
made-up hierarchy (``toy``, conftest) whose answer is worked out by hand below, and through the command."""

import pytest
from typer.testing import CliRunner

import manifests
from isood.cli import app
from isood.core.errors import BadInputError
from wordnet_tools.class_filter import filter_classes
from wordnet_tools.rules import PRESETS, resolve_exclude

# By hand, from the graph in conftest (ID: diver, beagle, car). Hypernyms of an ID class and the ID classes
# themselves are dropped whatever the exclusion; lemon_beagle sits under the ID beagle.
ALWAYS = {"entity": "hypernym", "organism": "hypernym", "person": "hypernym", "animal": "hypernym",
          "dog": "hypernym", "artifact": "hypernym", "vehicle": "hypernym", "diver": "id", "beagle": "id",
          "car": "id", "lemon_beagle": "hyponym"}
PAPER = {**ALWAYS, "pianist": "excluded_subtree", "plant": "excluded_subtree", "rose": "excluded_subtree",
         "poodle": "excluded_subtree", "cat": "excluded_subtree", "bike": "", "tool": "", "hammer": ""}
RELEASE = {**PAPER, "pianist": "", "plant": "", "rose": ""}


def _rules(toy, preset=None, exclude=None, sisters_only=False):
    df = filter_classes(list(toy.graph), toy.id_wnids, toy, exclude=resolve_exclude(exclude, preset),
                        sisters_only=sisters_only)
    by_wnid = df.set_index("wnid")["rule"].to_dict()
    return {name: by_wnid[w] for name, w in toy.w.items()}


def test_presets_on_a_made_up_hierarchy(toy):
    assert _rules(toy) == PAPER  # no preset: the paper's rule, as before presets existed
    assert _rules(toy, "imagenet-ood-paper") == PAPER
    assert _rules(toy, "imagenet-ood-release") == RELEASE
    # the release preset keeps people and plants and nothing under animal
    kept = {n for n, r in _rules(toy, "imagenet-ood-release").items() if r == ""}
    assert kept == {"pianist", "plant", "rose", "bike", "tool", "hammer"}
    assert not any(toy.in_subtree(toy.w[n], "animal.n.01") for n in kept)
    # the sister step on top: kept classes sharing a direct hypernym with an ID class (person, dog, vehicle)
    sis = {n for n, r in _rules(toy, "imagenet-ood-release", sisters_only=True).items() if r == ""}
    assert sis == {"pianist", "bike"}
    assert {n for n, r in _rules(toy, "imagenet-ood-paper", sisters_only=True).items() if r == ""} == {"bike"}


def test_explicit_exclude_wins_over_the_preset(toy):
    got = _rules(toy, "imagenet-ood-release", exclude=["plant.n.02"])
    assert got["plant"] == got["rose"] == "excluded_subtree"
    assert got["pianist"] == got["poodle"] == got["cat"] == ""
    assert _rules(toy, "imagenet-ood-paper", exclude=[""])["pianist"] == ""  # --exclude '' = none
    assert resolve_exclude(None, "imagenet-ood-release") == ["animal.n.01"]
    assert resolve_exclude(None, None) == ["organism.n.01"] == list(PRESETS["imagenet-ood-paper"].exclude)
    with pytest.raises(BadInputError, match="bogus"):
        resolve_exclude(None, "bogus")


def test_filter_command_records_the_preset_and_follows_it(tmp_path, hierarchy):
    # real WordNet: pianist (a person), oak and rose (plants), aardvark (an animal)
    names = ["pianist.n.01", "oak.n.02", "rose.n.01", "aardvark.n.01"]
    wnids = [hierarchy.resolve(n) for n in names]
    cand = tmp_path / "c.txt"
    cand.write_text("\n".join(wnids) + "\n")
    runner = CliRunner()
    got = {}
    for args in (["--preset", "imagenet-ood-paper"], ["--preset", "imagenet-ood-release"],
                 ["--preset", "imagenet-ood-release", "--exclude", "organism.n.01"]):
        out = tmp_path / f"cf{len(got)}"
        r = runner.invoke(app, ["wordnet", "filter", "--candidates", str(cand), *args, "--out", str(out)])
        assert r.exit_code == 0, r.output
        m = manifests.read(out, kind="class-filter")
        got[len(got)] = (m.kept()[0], m.meta["command"]["config"])
    assert got[0][0] == []  # every one of them is an organism
    assert got[1][0] == sorted(wnids[:3]) and got[1][1]["exclude"] == ["animal.n.01"]
    assert got[1][1]["preset"] == "imagenet-ood-release"
    assert got[2][0] == [] and got[2][1]["exclude"] == ["organism.n.01"] and got[2][1]["preset"] is None
    r = runner.invoke(app, ["wordnet", "filter", "--candidates", str(cand), "--preset", "bogus", "--out",
                            str(tmp_path / "x")])
    assert r.exit_code == 2 and "bogus" in r.output and not (tmp_path / "x").exists()
