"""mkdocs hook: the CLI reference page (``cli.md``) is generated from the code of this checkout at build time
(``isood.cli.reference.reference_markdown``: every command's options with their defaults, bounds and help), so it
cannot fall out of date. It is added as a generated file; nothing is written into docs/."""

from __future__ import annotations

import sys
from pathlib import Path

from mkdocs.structure.files import File

ROOT = Path(__file__).resolve().parents[1]


def on_files(files, config):
    if str(ROOT) not in sys.path:  # document this checkout, whatever isood the environment has installed
        sys.path.insert(0, str(ROOT))
    from isood.cli.reference import reference_markdown

    files.append(File.generated(config, "cli.md", content=reference_markdown()))
    return files
