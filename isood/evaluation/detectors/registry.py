"""Registry of OOD detectors by name, so users can add their own.

>>> from isood.evaluation.detectors import register_detector, Detector
>>> @register_detector("my-score")
... class MyScore(Detector):
...     requires = frozenset({"logits"})
...     def score(self, outputs):
...         return outputs.logits.std(axis=1)
"""

from __future__ import annotations

from typing import Callable

from isood.errors import IsoodError

from .base import KINDS, Detector

__all__ = ["UnknownDetectorError", "register_detector", "get_detector", "available_detectors"]

_REGISTRY: dict[str, type[Detector]] = {}
_ALIASES: dict[str, str] = {}


class UnknownDetectorError(IsoodError):
    """No detector is registered under that name."""


def _norm(name: str) -> str:
    return name.strip().lower().replace("_", "-")


def register_detector(name: str, cls: type[Detector] | None = None, *, aliases: tuple[str, ...] = (),
                      overwrite: bool = False) -> Callable[[type[Detector]], type[Detector]] | type[Detector]:
    """Register ``cls`` under ``name`` (and ``aliases``); usable as a decorator ``@register_detector('x')``.

    The class must subclass ``Detector`` and declare ``requires`` within
    ``{'logits', 'features', 'feature_maps', 'fc', 'input'}``. Re-using a name raises unless ``overwrite=True``.
    """

    def _add(c: type[Detector]) -> type[Detector]:
        if not (isinstance(c, type) and issubclass(c, Detector)):
            raise TypeError(f"register_detector('{name}') expects a Detector subclass, got {c!r}")
        bad = set(c.requires) - set(KINDS)
        if bad:
            raise ValueError(f"detector '{name}' requires unknown kind(s) {sorted(bad)}: use among {list(KINDS)}")
        key = _norm(name)
        for k in (key, *map(_norm, aliases)):
            if not overwrite and (k in _REGISTRY or k in _ALIASES) and _REGISTRY.get(_ALIASES.get(k, k)) is not c:
                raise ValueError(f"a detector named '{k}' is already registered: pick another name or overwrite=True")
        _REGISTRY[key] = c
        for a in aliases:
            _ALIASES[_norm(a)] = key
        if not c.name:
            c.name = key
        return c

    return _add(cls) if cls is not None else _add


def get_detector(name: str, **kwargs) -> Detector:
    """A new instance of the detector registered as ``name`` (case-insensitive; ``_`` == ``-``)."""
    key = _norm(name)
    key = _ALIASES.get(key, key)
    if key not in _REGISTRY:
        raise UnknownDetectorError(
            f"unknown detector '{name}': pass one of {', '.join(available_detectors())} or register_detector() yours")
    return _REGISTRY[key](**kwargs)


def available_detectors() -> list[str]:
    """Registered detector names, sorted."""
    return sorted(_REGISTRY)
