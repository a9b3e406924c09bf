"""Registry of OOD detectors by name, so users can add their own, and the ``--detectors`` spec parser.

>>> from isood.science.detectors import register_detector, Detector
>>> @register_detector("my-score")
... class MyScore(Detector):
...     requires = frozenset({"logits"})
...     def _score(self, outputs):
...         return outputs.logits.std(axis=1)

Registering the same class again (a re-run notebook cell defines it anew: same module and qualified name) replaces
the entry; a different class under a taken name is an error unless ``overwrite=True``.

A namespace resolves ``prefix:Name`` names through a factory (``register_namespace``): ``pytorch-ood:ViM`` builds
the adapter of pytorch-ood's ViM (``isood.classifiers.pytorch_ood`` registers it when imported).
"""

from __future__ import annotations

import inspect
from typing import Callable, Sequence, TypeVar, overload

from isood.core.errors import BadInputError, DetectorParamError, IsoodError

from .base import KINDS, Detector

__all__ = ["UnknownDetectorError", "register_detector", "register_namespace", "get_detector", "detector_class",
           "available_detectors", "parse_detectors", "detector_parameters"]

_REGISTRY: dict[str, type[Detector]] = {}
_D = TypeVar("_D", bound=type[Detector])
_ALIASES: dict[str, str] = {}
_NAMESPACES: dict[str, Callable[[str, dict], Detector]] = {}


class UnknownDetectorError(IsoodError):
    """No detector is registered under that name."""


def _norm(name: str) -> str:
    return name.strip().lower().replace("_", "-")


def _same_class(a: type | None, b: type) -> bool:
    """The same class, or its re-definition (same module and qualified name, e.g. a re-run notebook cell)."""
    return a is not None and (a is b or (a.__module__, a.__qualname__) == (b.__module__, b.__qualname__))


@overload
def register_detector(name: str, cls: None = None, *, aliases: tuple[str, ...] = (),
                      overwrite: bool = False) -> Callable[[_D], _D]: ...


@overload
def register_detector(name: str, cls: _D, *, aliases: tuple[str, ...] = (), overwrite: bool = False) -> _D: ...


def register_detector(name: str, cls: type[Detector] | None = None, *, aliases: tuple[str, ...] = (),
                      overwrite: bool = False) -> Callable[[_D], _D] | type[Detector]:
    """Register ``cls`` under ``name`` (and ``aliases``) and set ``cls.name``; usable as a decorator
    ``@register_detector('x')``. The class must subclass ``Detector`` and declare ``requires`` within
    ``KINDS`` (logits, features, feature_maps, block3, local_logits, fc, tail, input)."""

    def add(c: _D) -> _D:
        if not (isinstance(c, type) and issubclass(c, Detector)):
            raise BadInputError(f"register_detector('{name}') expects a Detector subclass, got {c!r}")
        bad = set(c.requires) - set(KINDS)
        if bad:
            raise BadInputError(f"detector '{name}' requires unknown kind(s) {sorted(bad)}: use among {list(KINDS)}")
        key = _norm(name)
        for k in (key, *map(_norm, aliases)):
            taken = _REGISTRY.get(_ALIASES.get(k, k))
            if taken is not None and not overwrite and not _same_class(taken, c):
                raise BadInputError(f"a detector named '{k}' is already registered ({taken.__qualname__}): pick "
                                    "another name or pass overwrite=True")
        _REGISTRY[key] = c
        for a in aliases:
            _ALIASES[_norm(a)] = key
        c.name = key
        return c

    return add(cls) if cls is not None else add


def register_namespace(prefix: str, factory: Callable[[str, dict], Detector]) -> None:
    """Resolve names ``prefix:Name`` (``get_detector``, ``--detectors prefix:Name:key=value``) with
    ``factory(Name, params) -> Detector``."""
    _NAMESPACES[_norm(prefix)] = factory


def _namespace(name: str) -> tuple[Callable[[str, dict], Detector], str] | None:
    """``(factory, Name)`` when ``name`` is ``prefix:Name`` of a registered namespace."""
    prefix, sep, rest = name.partition(":")
    factory = _NAMESPACES.get(_norm(prefix)) if sep else None
    return (factory, rest.strip()) if factory is not None else None


def detector_class(name: str) -> type[Detector]:
    """The class registered as ``name`` (case-insensitive; ``_`` == ``-``; aliases accepted)."""
    key = _norm(name)
    key = _ALIASES.get(key, key)
    if key not in _REGISTRY:
        spaces = "".join(f", {p}:<Name>" for p in _NAMESPACES)
        raise UnknownDetectorError(f"unknown detector '{name}': pass one of {', '.join(available_detectors())}"
                                   f"{spaces} or register_detector() yours")
    return _REGISTRY[key]


def get_detector(name: str, **params) -> Detector:
    """A new instance of the detector registered as ``name`` with hyper-parameters ``params``; an unknown or
    out-of-range parameter is a one-line ``DetectorParamError``. ``prefix:Name`` goes to its namespace."""
    spaced = _namespace(name)
    if spaced is not None:
        return spaced[0](spaced[1], params)
    cls = detector_class(name)
    known = cls.parameters()
    unknown = sorted(set(params) - set(known))
    if unknown:
        if not known:
            raise DetectorParamError(f"{cls.name} takes no parameters, got {unknown[0]!r}; pass it as '{cls.name}'")
        raise DetectorParamError(f"{cls.name}: unknown parameter {unknown[0]!r}; pass one of: {', '.join(known)}")
    try:
        inspect.signature(cls).bind(**params)
    except TypeError as e:
        raise DetectorParamError(f"{cls.name}: {e}; see its documentation") from None
    return cls(**params)


def available_detectors() -> list[str]:
    """Registered detector names, sorted."""
    return sorted(_REGISTRY)


def detector_parameters() -> dict[str, dict]:
    """The documentation of every registered detector, by name: ``{'parameters': {name: default}`` (the
    hyper-parameters, passed as ``name:key=value`` in ``--detectors``), ``'requires'`` (what it needs from the
    forward pass, ``KINDS``), ``'fitted'`` (whether it is fitted on ID training images)``}``."""
    return {name: {"parameters": dict(cls.parameters(settings=False)), "requires": sorted(cls.requires),
                   "fitted": bool(cls.needs_fit)}
            for name, cls in sorted(_REGISTRY.items())}


def _value(text: str):
    """A ``--detectors`` parameter value: int, float, true/false, else the text."""
    for cast in (int, float):
        try:
            return cast(text)
        except ValueError:
            pass
    low = text.lower()
    if low in ("true", "false"):
        return low == "true"
    return text


def _tokens(spec: str | Sequence[str]) -> list[tuple[str, dict]]:
    """``'msp,knn:k=10,foo=1'`` -> ``[('msp', {}), ('knn', {'k': 10, 'foo': 1})]`` (no registry lookup)."""
    tokens = [t.strip() for t in (spec.split(",") if isinstance(spec, str) else spec) if t and t.strip()]
    if not tokens:
        raise BadInputError("--detectors is empty: pass names such as msp,energy,knn")
    order: list[tuple[str, dict]] = []
    for tok in tokens:
        if ":" in tok and _namespace(tok) is not None:  # prefix:Name[:key=value]
            prefix, name, tok = (tok.split(":", 2) + [""])[:3]
            order.append((f"{prefix.strip()}:{name.strip()}", {}))
            if not tok.strip():
                continue
        elif ":" in tok:
            name, tok = tok.split(":", 1)
            order.append((name.strip(), {}))
        elif "=" not in tok:
            order.append((tok, {}))
            continue
        if not order:
            raise DetectorParamError(f"--detectors: {tok!r} has no detector before it: write name:key=value")
        key, sep, val = tok.partition("=")
        if not sep or not key.strip():
            raise DetectorParamError(f"--detectors: cannot read {tok!r}: write name:key=value")
        order[-1][1][key.strip()] = _value(val.strip())
    return order


def parse_detectors(spec: str | Sequence[str]) -> dict[str, Detector]:
    """``'msp,energy,knn:k=10,react:percentile=95'`` -> ``{'msp': MSP(), ..., 'knn': KNN(k=10), ...}``.

    Comma-separated registry names (``available_detectors()``) or ``pytorch-ood:Name``; ``name:key=value`` passes a
    hyper-parameter and a following bare ``key=value`` adds another to the same detector
    (``ash:percentile=85,chunk=64``, ``pytorch-ood:KNN:k=10``). Unknown
    names raise ``UnknownDetectorError``, bad parameters ``DetectorParamError`` (one line each)."""
    out: dict[str, Detector] = {}
    for name, params in _tokens(spec):
        if name in out:
            raise BadInputError(f"--detectors names '{name}' twice: list each detector once")
        out[name] = get_detector(name, **params)
    return out
