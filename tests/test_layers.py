"""The layer list is written once in pyproject.toml's import-linter contract; docs/development.md shows it. These tests
hold the two against each other and check that every module of the four packages sits in a layer."""

from __future__ import annotations

import ast
import re
import tomllib
from pathlib import Path

ROOT = next(p for p in Path(__file__).resolve().parents if (p / "pyproject.toml").is_file())
PACKAGES = ("isood", "manifests", "wordnet_tools", "generation")


def _contract_layers() -> list[str]:
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())
    contracts = config["tool"]["importlinter"]["contracts"]
    (layers,) = [c["layers"] for c in contracts if c["type"] == "layers"]
    return layers


def _documented_layers() -> list[str]:
    text = (ROOT / "docs" / "development.md").read_text()
    section = text.split("## The layers", 1)[1].split("\n## ", 1)[0]
    rows = [line for line in section.splitlines() if line.startswith("| `")]
    return [row[3:].split("` |", 1)[0].replace("\\|", "|") for row in rows]


def _folders(layer: str) -> list[str]:
    return [name.strip() for name in re.split(r"[|:]", layer)]


def _modules() -> list[str]:
    names = []
    for package in PACKAGES:
        for path in (ROOT / package).rglob("*.py"):
            parts = path.relative_to(ROOT).with_suffix("").parts
            names.append(".".join(parts[:-1] if parts[-1] == "__init__" else parts))
    return sorted(names)


def test_the_documented_layers_are_the_contract_s_entry_for_entry():
    assert _documented_layers() == _contract_layers()


def test_every_module_sits_in_exactly_one_layer():
    folders = [folder for layer in _contract_layers() for folder in _folders(layer)]
    homeless, doubled = [], []
    for module in _modules():
        if module in PACKAGES:  # a package's own __init__ (isood's lazy names, manifests' API) is no layer
            continue
        homes = [f for f in folders if module == f or module.startswith(f + ".")]
        if not homes:
            homeless.append(module)
        elif len(homes) > 1:
            doubled.append(module)
    assert homeless == [] and doubled == []


def test_no_module_docstring_carries_a_hand_written_layer_label():
    labelled = []
    for module in _modules():
        path = ROOT / Path(*module.split("."))
        path = path / "__init__.py" if path.is_dir() else path.with_suffix(".py")
        doc = ast.get_docstring(ast.parse(path.read_text())) or ""
        if re.match(r"L\d\b", doc):
            labelled.append(module)
    assert labelled == []
