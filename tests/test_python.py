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

ROOT = Path(__file__).resolve().parents[1]


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
