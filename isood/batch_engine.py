"""L0: where batch work runs: the ``BatchEngine`` protocol and the in-process ``LocalEngine`` (the Ray engine is
``isood.engines.ray``, built by the CLI and passed into stages).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Iterable, Iterator, Mapping, Protocol, Sequence, runtime_checkable

from isood.devices import resolve_device
from isood.progress import progress_bar

__all__ = ["BatchEngine", "LocalEngine", "batch_rows"]


@runtime_checkable
class BatchEngine(Protocol):
    """Where batch work runs: in this process (``LocalEngine``) or on a cluster (``isood.engines.ray``).

    A *worker* is a class built once per process or actor (``worker(*args)``: the heavy part, e.g. loading a
    model) and then called on batches: ``worker(batch) -> result``, both ``dict[str, numpy array]`` with one
    row per item. ``map`` yields the results, locally in input order, on a cluster as they complete; each
    input batch is passed to exactly one worker call, unsplit, so batch composition (and hence numerics) is
    the same on every engine. Stages receive an engine from the CLI and never import a cluster backend.
    """

    name: str

    def map(self, worker: type, args: Sequence[Any], batches: Iterable[Mapping[str, Any]], *, total: int,
            description: str, progress: bool) -> Iterator[dict[str, Any]]: ...

    def as_config(self) -> dict[str, Any]: ...

    def device_name(self, device: str | None) -> str: ...


@dataclass
class LocalEngine:
    """The in-process engine: one worker built here, called on each batch in order."""

    name: str = "local"

    def map(self, worker: type, args: Sequence[Any], batches: Iterable[Mapping[str, Any]], *, total: int,
            description: str, progress: bool) -> Iterator[dict[str, Any]]:
        instance = worker(*args)
        with progress_bar(progress) as bar:
            task = bar.add_task(description, total=total)
            for batch in batches:
                out = instance(batch)
                bar.advance(task, batch_rows(batch))
                yield out

    def as_config(self) -> dict[str, Any]:
        return {"engine": "local"}

    def device_name(self, device: str | None) -> str:
        return resolve_device(device)


def batch_rows(batch: Mapping[str, Any]) -> int:
    """Rows of a ``dict[str, array]`` batch (the length of its first column)."""
    for v in batch.values():
        return len(v)
    return 0
