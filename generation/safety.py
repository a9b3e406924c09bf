"""Safety for Syn-IS generation: a prompt blocklist (before generation) and a pluggable image checker (after).

The default blocklist is deliberately small and blunt (whole-word, case-insensitive matches against the full
prompt): it keeps sexual, gore and hate-symbol prompts out of an automatically generated benchmark. It also
catches some harmless labels (e.g. ``rape``, the oilseed plant); users extend or replace it with a file of
terms, one per line. Rejected prompts and images are recorded with their reason, never silently dropped.

An image safety checker is any callable ``checker(image: PIL.Image.Image, item: Mapping) -> str | None``
returning a rejection reason (or None to accept); ``item`` holds the image's row (prompt, style, label, ...).
``load_image_checker("package.module:function")`` imports one by name (used by the CLI's --safety-checker).
A local run calls the checker on the threads that write the PNGs while the next batch generates
(``generation.sdxl.GeneratorWorker.stream``): it must be safe to call from several threads at once.
"""

from __future__ import annotations

import importlib
import inspect
import re
from pathlib import Path
from typing import Any, Callable, Iterable, Mapping, Optional

from isood.core.errors import BadInputError
from isood.core.errors import one_line
from isood.core.textio import read_lines

ImageChecker = Callable[[Any, Mapping[str, Any]], Optional[str]]

DEFAULT_BLOCKLIST: tuple[str, ...] = (
    "nude", "nudity", "naked", "topless", "porn", "porno", "pornography", "pornographic", "erotic", "erotica",
    "nsfw", "sex", "sexual", "sexy", "genitals", "rape", "slut", "whore", "prostitute",
    "corpse", "cadaver", "gore", "gory", "decapitated", "beheading", "mutilated", "torture", "suicide",
    "lynching", "swastika", "nazi",
)


def read_blocklist(path: str | Path) -> list[str]:
    """Terms from a file: one per line, blank lines and ``#`` comments ignored."""
    lines = read_lines(path, what="--blocklist")
    return [t for t in (line.split("#", 1)[0].strip() for line in lines) if t]


class PromptBlocklist:
    """Whole-word, case-insensitive term matcher; ``match(text)`` returns the first term found or None."""

    def __init__(self, terms: Iterable[str]):
        self.terms = tuple(dict.fromkeys(t.strip().lower() for t in terms if t and t.strip()))
        if self.terms:
            alternatives = "|".join(re.escape(t) for t in sorted(self.terms, key=len, reverse=True))
            self._regex: re.Pattern[str] | None = re.compile(rf"(?<![\w])({alternatives})(?![\w])", re.IGNORECASE)
        else:
            self._regex = None

    @classmethod
    def build(cls, extra_file: str | Path | None = None, *, use_default: bool = True) -> "PromptBlocklist":
        """The default terms (unless ``use_default`` is False) plus the terms of ``extra_file``."""
        terms = list(DEFAULT_BLOCKLIST) if use_default else []
        if extra_file:
            terms += read_blocklist(extra_file)
        return cls(terms)

    def match(self, text: str) -> str | None:
        if self._regex is None:
            return None
        m = self._regex.search(text)
        return m.group(1).lower() if m else None

    def __len__(self) -> int:
        return len(self.terms)


def load_image_checker(spec: str) -> ImageChecker:
    """Import ``package.module:function`` (a callable ``(image, item) -> reason | None``); a name that does not
    import, or names something that is not callable with ``(image, item)`` (e.g. ``os:getcwd``), is a one-line
    ``BadInputError``. Callables whose signature Python cannot tell (some built-ins) are taken as given."""
    module_name, sep, attr = spec.partition(":")
    if not sep or not module_name or not attr:
        raise BadInputError(f"--safety-checker {spec!r} must look like package.module:function")
    try:
        obj = getattr(importlib.import_module(module_name), attr)
    except Exception as e:  # ImportError, AttributeError, or whatever the module's own code raises on import
        raise BadInputError(f"cannot import safety checker {spec!r} ({one_line(e)}); pass an importable "
                            "package.module:function") from None
    if not callable(obj):
        raise BadInputError(f"safety checker {spec!r} is not callable; pass a function (image, item) -> reason or None")
    try:
        signature = inspect.signature(obj)
    except (TypeError, ValueError):  # no signature to check (some built-ins)
        return obj
    try:
        signature.bind(None, {})
    except TypeError:
        raise BadInputError(f"safety checker {spec!r} takes {signature}, not (image, item); pass a function "
                            "(image, item) -> reason or None") from None
    return obj
