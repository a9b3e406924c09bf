"""The Python versions isood supports: ``requires-python`` says >= 3.11 (``tomllib``; the pinned torch), and an
older interpreter importing the package from a checkout gets one line saying so, not a traceback from deep inside.
The Python 3.10 check runs where a 3.10 interpreter is found (this machine image has pyenv's 3.10.13)."""

from __future__ import annotations

import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

ROOT = next(p for p in Path(__file__).resolve().parents if (p / "pyproject.toml").is_file())


def test_requires_python_is_what_the_code_needs():
    meta = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    assert meta["requires-python"] == ">=3.11"
    assert sys.version_info >= (3, 11)


def test_type_checker_is_pinned_and_targets_the_oldest_python():
    """``make test`` runs mypy (``[tool.mypy]``): pinned in the test extra (a new release may flag new things) and
    checking the code as the oldest supported Python reads it, on the four packages."""
    toml = tomllib.loads((ROOT / "pyproject.toml").read_text())
    mypy = toml["tool"]["mypy"]
    assert mypy["python_version"] == toml["project"]["requires-python"].removeprefix(">=")
    assert sorted(mypy["files"]) == sorted(toml["tool"]["importlinter"]["root_packages"])
    pins = [r for r in toml["project"]["optional-dependencies"]["test"] if r.split("=")[0].strip() == "mypy"]
    assert len(pins) == 1 and "==" in pins[0], pins
    assert "$(PY) -m mypy" in (ROOT / "Makefile").read_text()


def _python310() -> str | None:
    pyenv = sorted(Path.home().glob(".pyenv/versions/3.10.*/bin/python3.10"))
    for found in [shutil.which("python3.10"), *map(str, pyenv)]:
        if found:
            r = subprocess.run([found, "-c", "import sys; print(sys.version_info[:2])"], capture_output=True,
                               text=True)
            if r.returncode == 0 and r.stdout.strip() == "(3, 10)":
                return found
    return None


def test_python_310_gets_one_line():
    python = _python310()
    if python is None:
        pytest.skip("no Python 3.10 interpreter on this machine (pyenv's python3.10 runs this check)")
    r = subprocess.run([python, "-c", "import isood"], capture_output=True, text=True, cwd=ROOT,
                       env={"PATH": "/usr/bin:/bin", "PYTHONPATH": str(ROOT), "HOME": str(Path.home())})
    assert r.returncode == 1
    assert "ImportError: isood needs Python >= 3.11, this is 3.10" in r.stderr.strip().splitlines()[-1]


def test_project_metadata_builds_without_deprecation_warnings():
    """`make setup` builds the editable install quietly: the project table is read by setuptools without a
    deprecation warning (a TOML-table ``license`` printed 13 lines three times per install)."""
    import warnings

    setuptools = pytest.importorskip("setuptools")
    from setuptools.config.pyprojecttoml import apply_configuration
    from setuptools.dist import Distribution

    wanted = tomllib.loads((ROOT / "pyproject.toml").read_text())["build-system"]["requires"]
    floor = int(next(r for r in wanted if r.startswith("setuptools")).split(">=")[1].split(".")[0])
    if int(setuptools.__version__.split(".")[0]) < floor:
        pytest.skip(f"setuptools {setuptools.__version__} here; the build uses >= {floor}")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        dist = apply_configuration(Distribution(), ROOT / "pyproject.toml")
    assert dist.get_name() == "isood"
    assert [str(w.message).splitlines()[0] for w in caught] == []


def test_setup_prints_what_it_does_and_keeps_pip_output_in_a_log():
    """`make setup` says in one line per step what it is doing; pip's output goes to a log shown on failure."""
    make = shutil.which("make")
    if make is None:
        pytest.skip("no make on this machine")
    plan = subprocess.run([make, "-n", "-B", "-f", str(ROOT / "Makefile"), "-C", str(ROOT), ".venv/.isood-installed"],
                          capture_output=True, text=True, check=True).stdout
    pip_lines = [line for line in plan.splitlines() if "pip install" in line]
    assert pip_lines and all("setup.log" in line for line in pip_lines), plan
    assert "echo \"setup: installing isood" in plan


def test_dir_lists_the_public_names_only():
    """``dir(isood)`` shows the API, not the helpers ``isood/__init__.py`` imports (``sys``, ``annotations``,
    ``lazy_exports``); every name it lists resolves."""
    import isood
    import wordnet_tools

    for package in (isood, wordnet_tools):
        names = dir(package)
        assert not {"sys", "annotations", "lazy", "lazy_exports", "_EXPORTS"} & set(names), names
        assert set(package.__all__) <= set(names)
        for name in names:
            assert getattr(package, name) is not None
