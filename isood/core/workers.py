"""How many workers a run uses, one meaning per value, passed as one ``WorkerSpec``.

* ``decode_processes``: the image decoders of each model worker (``--workers`` of extract, build-splits and
  evaluate). In this process's engine they are the processes of a torch ``DataLoader`` that read and decode the
  next batches while the model runs (0: decode in the model's own process); inside a Ray actor (the actor is the
  model worker's process) they are its decoding threads. The features do not depend on it.
* ``ray_actors``: the model workers of the Ray engine (``--ray-workers``; None: one per GPU, else one per CPU,
  known only on the cluster, ``isood.engines.ray.RayOptions.resolve``); None in this process's engine.

``resolve_workers`` holds the one default rule; a manifest records the spec once (``WorkerSpec.as_config``, its
``workers`` entry: a machine-dependent field, not content).
"""

from __future__ import annotations

import os
from dataclasses import dataclass

from isood.core.engine import BatchEngine

__all__ = ["WorkerSpec", "resolve_workers", "MAX_DECODE_PROCESSES", "MAX_DEFAULT_DECODE_PROCESSES",
           "RAY_DECODE_PROCESSES"]

#: The most ``--workers`` (decoding processes) any command takes.
MAX_DECODE_PROCESSES = 256
#: The most decoding processes the default picks in this process's engine (each holds a few batches in memory).
MAX_DEFAULT_DECODE_PROCESSES = 32
#: The decoders of a Ray actor by default (threads of the actor, which holds one CPU of its own).
RAY_DECODE_PROCESSES = 4


@dataclass(frozen=True)
class WorkerSpec:
    """The workers of a run (module docstring): ``decode_processes`` per model worker, ``ray_actors`` (None: this
    process's engine, or as many actors as the cluster's GPUs / CPUs)."""

    decode_processes: int
    ray_actors: int | None = None

    def as_config(self) -> dict[str, int | None]:
        """The manifest's ``workers`` entry."""
        return {"decode_processes": self.decode_processes, "ray_actors": self.ray_actors}


def resolve_workers(decode_processes: int | None = None, engine: BatchEngine | None = None) -> WorkerSpec:
    """The ``WorkerSpec`` of a run on ``engine`` (None: this process) with ``decode_processes`` asked (None: the
    default). The one default rule: in this process's engine every CPU but the one that runs the model (at most
    ``MAX_DEFAULT_DECODE_PROCESSES``, at least 0); in a cluster's actor ``RAY_DECODE_PROCESSES``. The actors are
    the engine's (``BatchEngine.actors``)."""
    local = engine is None or engine.name == "local"
    if decode_processes is None:
        decode_processes = (max(0, min(MAX_DEFAULT_DECODE_PROCESSES, (os.cpu_count() or 1) - 1)) if local
                            else RAY_DECODE_PROCESSES)
    return WorkerSpec(int(decode_processes), None if engine is None else engine.actors)
