"""The `isood` command line. It parses options, builds the engine, calls a stage, renders its result.

One module per command group registers its commands on ``isood.cli._app.app``; importing this package
registers them all (in the order ``isood --help`` lists them).
"""

from __future__ import annotations

from isood.cli._app import app
from isood.cli import (wordnet, manifest_commands, demo, extract, splits, clean, syn, evaluate, compare,  # noqa: E402,F401
                       show, benchmarks, dev)  # (register)


def main() -> None:
    """Console-script entry point (``isood``)."""
    app()


__all__ = ["app", "main"]
