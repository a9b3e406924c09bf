"""L0: lazy re-exports of a package's names (PEP 562), so importing a package loads nothing heavy."""

from __future__ import annotations

import importlib
from typing import Any, Mapping

__all__ = ["lazy_exports"]


def lazy_exports(package: str, exports: Mapping[str, str]) -> tuple[Any, Any]:
    """``(__getattr__, __dir__)`` for a package that re-exports ``name -> module`` lazily (PEP 562): a name is
    imported from its module on first access, so importing the package loads nothing heavy."""

    def __getattr__(name: str) -> Any:
        if name in exports:
            return getattr(importlib.import_module(exports[name]), name)
        raise AttributeError(f"module {package!r} has no attribute {name!r}")

    def __dir__() -> list[str]:
        return sorted(set(vars(importlib.import_module(package))) | set(exports))

    return __getattr__, __dir__
