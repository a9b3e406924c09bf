"""The docs agree with the code: the generated CLI reference names every command and option; every `isood ...`
command line in the docs and README parses with the real CLI (the options exist and take the values shown); the
quickstart runs the commands `isood dev tiny-models` prints. (`make test` builds the site with `mkdocs build
--strict`, which checks links, anchors and the API reference.)"""

from __future__ import annotations

import re
import shlex
from pathlib import Path

import pytest

from isood.cli.options import COMMANDS
from isood.cli.reference import reference_markdown, walk_commands
from isood.core.optspec import option_fields

ROOT = next(p for p in Path(__file__).resolve().parents if (p / "pyproject.toml").is_file())
PAGES = sorted((ROOT / "docs").rglob("*.md")) + [ROOT / "README.md"]


def test_the_committed_cli_reference_is_current():
    """docs/cli.md (linked from the README, readable without building the site) is what the code generates."""
    committed = (ROOT / "docs" / "cli.md").read_text(encoding="utf-8")
    assert committed == reference_markdown(), "docs/cli.md is stale: python -m isood.cli.reference > docs/cli.md"


def test_the_cli_reference_names_every_command_and_option():
    page = reference_markdown()
    commands = list(walk_commands())
    assert len(commands) >= 17
    for words, cmd in commands:
        assert f"## `isood {' '.join(words)}`" in page
        section = page.split(f"## `isood {' '.join(words)}`", 1)[1].split("\n## ", 1)[0]
        for param in cmd.params:
            if getattr(param, "hidden", False) or "--help" in param.opts:
                continue
            if getattr(param, "param_type_name", "") == "argument":
                assert f"`{(param.metavar or param.name.upper())}`" in section or param.name.upper() in section
            else:
                assert f"`{param.opts[0]}" in section, (words, param.opts)
    for words, cls in COMMANDS:  # an options dataclass: its own words, bounds and aliases
        section = page.split(f"## `isood {' '.join(words)}`", 1)[1].split("\n## ", 1)[0]
        for f, spec, _kind in option_fields(cls):
            if spec.cli:
                assert " ".join(spec.help.split())[:40].replace("<", "&lt;").replace("*", "\\*") in section
                for alias in spec.aliases:
                    assert f"Deprecated alias: {alias}" in section


def _shell_commands(text: str) -> list[str]:
    """The `isood ...` command lines of the fenced bash blocks of a Markdown text (continuations joined, comments
    dropped)."""
    found = []
    for block in re.findall(r"```bash\n(.*?)```", text, flags=re.S):
        for line in block.replace("\\\n", " ").splitlines():
            line = " ".join(line.split(" # ", 1)[0].split())
            if line.startswith("isood "):
                found.append(line)
    return found


DOC_COMMANDS = [pytest.param(line, id=f"{page.relative_to(ROOT)}: {line[:60]}")
                for page in PAGES for line in _shell_commands(page.read_text())]


def test_the_docs_show_commands():
    assert len(DOC_COMMANDS) >= 30


@pytest.mark.parametrize("line", DOC_COMMANDS)
def test_every_command_line_in_the_docs_parses(line):
    """Each command exists and takes the options shown (click parses them; nothing runs)."""
    commands = {words: cmd for words, cmd in walk_commands()}
    words = shlex.split(line)[1:]
    for n in (2, 1):
        if tuple(words[:n]) in commands:
            cmd, args = commands[tuple(words[:n])], words[n:]
            break
    else:
        pytest.fail(f"no such command: {line}")
    cmd.make_context(" ".join(("isood", *words[:n])), list(args))


def _quickstart(text: str) -> list[str]:
    return [c for c in _shell_commands(text) if c.split()[1] != "dev"]


def test_the_quickstarts_run_what_tiny_models_prints():
    """docs/quickstart.md and README.md run exactly the commands `isood dev tiny-models tiny` prints (README.txt),
    with `tiny` for its folder."""
    from isood.dev.tiny_models import _layout

    expected = _layout(Path("tiny")).commands()
    docs = _quickstart((ROOT / "docs" / "quickstart.md").read_text())
    assert docs[: len(expected)] == expected
    readme = _quickstart((ROOT / "README.md").read_text())
    assert readme == expected[: len(readme)] and len(readme) >= 4
    assert "isood dev tiny-models tiny" in (ROOT / "README.md").read_text()
