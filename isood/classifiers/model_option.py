"""The text of ``--model``'s ``py:MODULE:FUNCTION`` form, parsed without importing torch (the CLI checks it before
any model library loads)."""

from __future__ import annotations

from isood.core.errors import BadInputError

__all__ = ["model_function"]


def model_function(option: str) -> tuple[str, str]:
    """``(module, function)`` of ``--model py:MODULE:FUNCTION``, or a one-line error saying how to write it."""
    mod, _, attr = option[3:].partition(":")
    if not mod.strip() or not attr.strip() or ":" in attr:
        raise BadInputError(f"--model {option}: write py:package.module:function (a function returning the model)")
    return mod.strip(), attr.strip()
