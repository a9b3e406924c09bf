"""Lazy re-exports of a package's names (PEP 562), so importing a package loads nothing heavy."""

from __future__ import annotations

import importlib
from typing import Any, Mapping

__all__ = ["lazy_exports"]

#: Foundation modules that show up as attributes of a package once imported, but are not part of its API.
_PRIVATE_SUBMODULES = frozenset({"lazy"})


def lazy_exports(package: str, exports: Mapping[str, str], extra: tuple[str, ...] = ()) -> tuple[Any, Any]:
    """``(__getattr__, __dir__)`` for a package that re-exports ``name -> module`` lazily (PEP 562): a name is
    imported from its module on first access, so importing the package loads nothing heavy. ``dir(package)`` lists
    the public names only (the exports, ``extra`` names and the package's public sub-packages), not the helpers the
    package module itself imports."""

    def __getattr__(name: str) -> Any:
        if name in exports:
            return getattr(importlib.import_module(exports[name]), name)
        raise AttributeError(f"module {package!r} has no attribute {name!r}")

    def __dir__() -> list[str]:
        module = importlib.import_module(package)
        loaded = {name for name, value in vars(module).items()
                  if not name.startswith("_") and getattr(value, "__name__", "") == f"{package}.{name}"
                  and name not in _PRIVATE_SUBMODULES}
        return sorted(set(exports) | set(extra) | loaded)

    return __getattr__, __dir__
