"""The errors users see as one clear line (the CLI prints the message and exits 2).

Every error meant for a user is an ``IsoodError`` whose message names the problem and what to pass instead.
Errors about a bad value given to a function also subclass ``ValueError`` (``BadInputError``), so library code
that catches ``ValueError`` keeps working, while the CLI turns every ``IsoodError`` into exit status 2.
"""

from __future__ import annotations

__all__ = [
    "one_line", "require", "IsoodError", "BadInputError", "MissingWeightsError", "ManifestError", "SchemaError", "DetectorParamError",
    "IsoodWarning",
]


class IsoodError(Exception):
    """A problem with the user's input or environment, described in one line with what to do instead."""


class BadInputError(IsoodError, ValueError):
    """A value passed to a function or an option is malformed or out of range."""


class MissingWeightsError(IsoodError):
    """Model weights could not be loaded (offline, or not in the local cache)."""


class ManifestError(IsoodError):
    """A manifest is malformed, of an unknown schema version or kind, or fails verification."""


class SchemaError(ManifestError):
    """A manifest table does not match the schema of its kind (the message names the table and column)."""


class DetectorParamError(BadInputError):
    """A detector was given an unknown or out-of-range hyper-parameter (e.g. ``knn:k=0``)."""


class IsoodWarning(UserWarning):
    """Something a run recovered from but the user should know (e.g. a corrupt cache entry recomputed); the CLI
    prints each as one line on stderr (``warnings.warn(message, IsoodWarning)``)."""


def one_line(error: BaseException | str, limit: int = 200) -> str:
    """An exception (or text) as one short line: whitespace collapsed, cut at ``limit`` characters."""
    text = " ".join(str(error).split()) or (type(error).__name__ if isinstance(error, BaseException) else "")
    return text if len(text) <= limit else text[: limit - 3] + "..."


def require(condition: bool, message: str, error: type[IsoodError] | None = None) -> None:
    """Raise ``error(message)`` unless ``condition``: one-line guards for user input."""
    if not condition:
        raise (error or BadInputError)(message)
