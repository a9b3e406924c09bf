"""Where batch work runs: the ``BatchEngine`` protocol and the in-process ``LocalEngine`` (the Ray engine is
``isood.engines.ray``, built by the CLI and passed into stages).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Iterable, Iterator, Mapping, Protocol, Sequence, runtime_checkable

from isood.core.devices import resolve_device
from isood.core.progress import progress_bar

__all__ = ["BatchEngine", "LocalEngine", "batch_rows"]


@runtime_checkable
class BatchEngine(Protocol):
    """Where batch work runs: in this process (``LocalEngine``) or on a cluster (``isood.engines.ray``).

    A *worker* is a class built once per process or actor (``worker(*args)``: the heavy part, e.g. loading a
    model) and then called on batches: ``worker(batch) -> result``, both ``dict[str, numpy array]`` with one
    row per item. ``map`` yields the results, locally in input order, on a cluster as they complete; each
    input batch is passed to exactly one worker call, unsplit, so batch composition (and hence numerics) is
    the same on every engine. A worker may also offer ``stream(batches)``: the results of the batches in input
    order, the same as its calls (the local engine uses it, so that the worker can prepare the next batches
    while one runs, e.g. decode images in other processes). Stages receive an engine from the CLI and never
    import a cluster backend.
    """

    name: str

    @property
    def actors(self) -> int | None:
        """The model workers asked for on a cluster (None: this process, or as many as the cluster holds)."""
        ...

    def map(self, worker: type, args: Sequence[Any], batches: Iterable[Mapping[str, Any]], *, total: int,
            description: str, progress: bool) -> Iterator[dict[str, Any]]: ...

    def as_config(self) -> dict[str, Any]: ...

    def device_name(self, device: str | None) -> str: ...


@dataclass
class LocalEngine:
    """The in-process engine: one worker built here, run on the batches in order (its ``stream`` when it has
    one, else a call per batch)."""

    name: str = "local"

    @property
    def actors(self) -> int | None:
        return None

    def map(self, worker: type, args: Sequence[Any], batches: Iterable[Mapping[str, Any]], *, total: int,
            description: str, progress: bool) -> Iterator[dict[str, Any]]:
        instance = worker(*args)
        batches = list(batches)
        stream = getattr(instance, "stream", None)
        results = stream(batches) if stream is not None else (instance(batch) for batch in batches)
        with progress_bar(progress) as bar:
            task = bar.add_task(description, total=total)
            for batch, out in zip(batches, results):
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
