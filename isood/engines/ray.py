"""The Ray Data engine (``--engine ray``): ``RayEngine`` runs any ``isood.core.engine.BatchEngine`` worker class on
a pool of Ray actors.

The driver lists the work (the stage's batches), Ray Data feeds it to a fixed pool of actors (``map_batches``
with a callable class; each actor builds ONE worker, e.g. holding a CLIP encoder or an SDXL pipeline, on
``num_gpus_per_worker`` GPUs when the cluster has GPUs), and the driver consumes the results as they stream
back. Each input batch travels as one row (pickled), so it reaches exactly one worker call, unsplit: the batch
composition, hence the numerics, is the local engine's. Results come back in completion order.

``ray.init`` joins ``--ray-address`` (``auto``, ``HOST:PORT``, ``ray://HOST:10001``) or ``$RAY_ADDRESS``, else
starts a local cluster for the command (shut down afterwards); an already initialised Ray is used as is.
Workers of a remote cluster need isood installed (``pip install 'isood[ray]'`` on every node), and a worker
that writes files needs a file system shared with the driver.
"""

from __future__ import annotations

import contextlib
import logging
import math
import os
import pickle
from dataclasses import dataclass
from typing import Any, Iterable, Iterator, Mapping, Sequence

import numpy as np
import pyarrow as pa

from isood.core.errors import BadInputError, IsoodError
from isood.core.engine import batch_rows
from isood.core.devices import explicit_device
from isood.core.errors import one_line
from isood.core.optspec import check_field
from isood.core.shared_options import EngineFields
from isood.core.progress import progress_bar

__all__ = ["RAY_HINT", "require_ray", "RayOptions", "ray_connection", "RayEngine",
           "BatchActor", "WorkerFailure", "pack_blocks"]

RAY_HINT = "pip install 'isood[ray]'"
#: Input blocks per actor: enough to balance the load, few enough to keep per-block overhead small.
BLOCKS_PER_ACTOR = 4


def require_ray() -> None:
    """Import Ray Data or raise a one-line IsoodError saying how to install it."""
    try:
        import ray  # noqa: F401
        import ray.data  # noqa: F401
    except ImportError:
        raise IsoodError(f"--engine ray needs Ray Data, which is not installed: {RAY_HINT}") from None


@dataclass
class RayOptions:
    """How to run on Ray. ``actors``: the model workers (``--ray-workers``; default: GPUs / num_gpus_per_worker
    on a GPU cluster, else CPUs / cpus_per_worker). ``num_gpus_per_worker``: default 1 when the cluster has GPUs,
    else 0 (fractions share a GPU). The two are checked against their option descriptions
    (``isood.core.shared_options.EngineFields``), also when given from Python. ``cpus_per_worker`` (Python
    only): the CPUs Ray reserves for each actor. The image decoders of an extraction actor are the run's
    ``isood.core.workers.WorkerSpec.decode_processes`` (threads of the actor)."""

    address: str | None = None
    actors: int | None = None
    num_gpus_per_worker: float | None = None
    cpus_per_worker: float = 1.0

    def __post_init__(self) -> None:
        check_field(EngineFields, "ray_actors", self.actors)
        check_field(EngineFields, "num_gpus_per_worker", self.num_gpus_per_worker)
        if not (math.isfinite(float(self.cpus_per_worker)) and float(self.cpus_per_worker) > 0):
            raise BadInputError(f"cpus_per_worker must be a finite number > 0, got {self.cpus_per_worker}")

    def check_device(self, device: str | None) -> None:
        """``--device`` with Ray: auto/None, ``cpu`` (no GPUs for the actors) or ``cuda`` (GPUs required)."""
        if explicit_device(device) is None:
            return
        if device == "cpu":
            if self.num_gpus_per_worker:
                raise BadInputError("--device cpu contradicts --num-gpus-per-worker > 0; drop one of them")
            return
        if str(device).startswith("cuda"):
            if self.num_gpus_per_worker == 0:
                raise BadInputError("--device cuda contradicts --num-gpus-per-worker 0; drop one of them")
            if str(device) != "cuda":
                raise BadInputError(f"--device {device}: with --engine ray Ray assigns the GPUs; pass --device cuda")
            return
        raise BadInputError(f"unknown device {device!r}; pass cpu, cuda or auto")

    def device_name(self, device: str | None) -> str:
        """The actors' device as requested (for the manifest config): cpu, cuda, or auto."""
        if device == "cpu" or self.num_gpus_per_worker == 0:
            return "cpu"
        if (device or "").startswith("cuda") or self.num_gpus_per_worker:
            return "cuda"
        return "auto"

    def as_config(self) -> dict[str, Any]:
        """The manifest's ``ray`` entry (the actors asked for are in its ``workers`` entry, ``isood.core.workers``)."""
        return {"address": self.address or os.environ.get("RAY_ADDRESS") or "local",
                "num_gpus_per_worker": self.num_gpus_per_worker, "cpus_per_worker": self.cpus_per_worker}

    def resolve(self, device: str | None = None) -> tuple[int, float, str]:
        """``(actors, GPUs per actor, actor device)`` for the running cluster."""
        import ray

        resources = ray.cluster_resources()
        gpus, cpus = float(resources.get("GPU", 0)), float(resources.get("CPU", 1))
        if device == "cpu":
            g = 0.0
        elif self.num_gpus_per_worker is not None:
            g = float(self.num_gpus_per_worker)
        else:
            g = 1.0 if gpus > 0 else 0.0
        if (device or "").startswith("cuda") and g == 0:
            raise BadInputError("--device cuda but the Ray cluster has no GPUs; pass --device cpu")
        if g > 0 and gpus < g:
            raise BadInputError(f"--num-gpus-per-worker {g:g} but the Ray cluster has {gpus:g} GPU(s); "
                                "pass --num-gpus-per-worker 0 to run on CPUs")
        if self.actors is not None:
            actors = int(self.actors)
        elif g > 0:
            actors = max(1, int(gpus // g))
        else:
            actors = max(1, int(cpus // float(self.cpus_per_worker)))
        return actors, g, "cuda" if g > 0 else "cpu"


@contextlib.contextmanager
def ray_connection(address: str | None = None) -> Iterator[Any]:
    """Ray for one command: an initialised Ray is used as is; else ``ray.init(address)`` (a local cluster when
    neither ``address`` nor ``$RAY_ADDRESS`` is set), shut down at the end."""
    require_ray()
    import ray

    if ray.is_initialized():
        yield ray
        return
    kwargs: dict[str, Any] = {"logging_level": logging.WARNING}
    if address is None and not os.environ.get("RAY_ADDRESS"):
        kwargs["include_dashboard"] = False
    try:
        ray.init(address=address, **kwargs)
    except ConnectionError as e:
        raise IsoodError(f"cannot connect to the Ray cluster at {address or os.environ.get('RAY_ADDRESS')} "
                         f"({one_line(e, 160)}); start one with `ray start --head` or pass --ray-address "
                         "auto|HOST:PORT") from None
    try:
        yield ray
    finally:
        ray.shutdown()


@contextlib.contextmanager
def _data_context(progress: bool):
    """Ray Data's own progress bars off (the driver shows one); its INFO logs only when progress is on."""
    import ray.data

    ctx = ray.data.DataContext.get_current()
    old_bars = ctx.enable_progress_bars
    logger = logging.getLogger("ray.data")
    old_level = logger.level
    ctx.enable_progress_bars = False
    if not progress:
        logger.setLevel(logging.WARNING)
    try:
        yield ctx
    finally:
        ctx.enable_progress_bars = old_bars
        logger.setLevel(old_level)


def _isood_cause(e: BaseException) -> IsoodError | None:
    """The IsoodError a worker raised behind a Ray error (Ray's own wrapper, which may subclass the user's
    exception class, is looked through)."""
    from ray.exceptions import RayError

    seen: set[int] = set()
    stack: list[BaseException | None] = [e]
    while stack:
        x = stack.pop()
        if x is None or id(x) in seen:
            continue
        seen.add(id(x))
        if isinstance(x, IsoodError) and not isinstance(x, RayError):
            return x
        stack.extend([x.__context__, x.__cause__, getattr(x, "cause", None)])
    return None


def _one_line(cause: IsoodError) -> IsoodError:
    """A worker's IsoodError as one line of the same class."""
    message = f"Ray worker: {one_line(cause, 400)}"
    try:
        return type(cause)(message)
    except Exception:
        return IsoodError(message)


def _stream(ds, progress: bool) -> Iterator[dict]:
    """Iterate a dataset's output blocks as numpy dicts; an IsoodError behind a Ray error comes out as one line."""
    try:
        with _data_context(progress):
            yield from ds.iter_batches(batch_size=None, batch_format="numpy")
    except Exception as e:
        cause = _isood_cause(e)
        if cause is None:
            raise
        raise _one_line(cause) from None


@dataclass
class WorkerFailure:
    """An IsoodError a worker raised (building or on a batch), sent back as a result: Ray does not carry the
    user's exception to the driver (only its traceback text), the driver re-raises it as one line."""

    error: IsoodError


class BatchActor:
    """Ray Data callable class: builds ``worker_cls(*args)`` once per actor; each row of a Ray batch is one
    pickled input batch (column ``payload``, id in ``batch``) -> one worker call -> one pickled result (or a
    ``WorkerFailure``)."""

    def __init__(self, worker_cls: type, args: Sequence[Any]):
        self.worker: Any = None  # a worker_cls instance: called on each batch
        self.failure: WorkerFailure | None = None
        try:
            self.worker = worker_cls(*args)
        except IsoodError as e:
            self.failure = WorkerFailure(e)

    def _run(self, batch: dict[str, Any]) -> Any:
        if self.failure is not None:
            return self.failure
        try:
            return self.worker(batch)
        except IsoodError as e:
            return WorkerFailure(e)

    def __call__(self, block: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        results = [pickle.dumps(self._run(pickle.loads(p)), protocol=pickle.HIGHEST_PROTOCOL) for p in block["payload"]]
        return {"batch": np.asarray(block["batch"], dtype=np.int64), "result": np.array(results, dtype=object)}


def pack_blocks(batches: Sequence[Mapping[str, Any]], actors: int) -> list[tuple[list[int], list[bytes]]]:
    """Group the input batches, in order, into ~``BLOCKS_PER_ACTOR`` blocks per actor by rows: each block is
    ``(batch ids, pickled batches)``; a batch is never split."""
    rows = [batch_rows(b) for b in batches]
    target = max(1, math.ceil(sum(rows) / (BLOCKS_PER_ACTOR * max(1, int(actors)))))
    blocks: list[tuple[list[int], list[bytes]]] = []
    ids: list[int] = []
    payloads: list[bytes] = []
    filled = 0
    for b, (batch, n) in enumerate(zip(batches, rows)):
        ids.append(b)
        payloads.append(pickle.dumps(dict(batch), protocol=pickle.HIGHEST_PROTOCOL))
        filled += n
        if filled >= target:
            blocks.append((ids, payloads))
            ids, payloads, filled = [], [], 0
    if ids:
        blocks.append((ids, payloads))
    return blocks


class RayEngine:
    """``isood.core.engine.BatchEngine`` on Ray actors (module docstring).

    ``RayEngine(RayOptions(...), device=...)``, or ``RayEngine(address=, actors=, num_gpus_per_worker=,
    device=)`` for the common options. ``device``: the ``--device`` asked for (``cpu`` keeps the actors off the
    GPUs; ``cuda`` requires GPUs). Ray Data missing or contradictory options: a one-line error here, before any
    work. ``as_config()`` is the manifest's ``ray`` entry; ``actors`` the actors asked for (``isood.core.workers``).
    """

    name = "ray"

    def __init__(self, options: RayOptions | None = None, *, address: str | None = None,
                 actors: int | None = None, num_gpus_per_worker: float | None = None, device: str | None = None):
        if options is not None and (address, actors, num_gpus_per_worker) != (None, None, None):
            raise TypeError("pass RayOptions or its fields, not both")
        self.options = options if options is not None else RayOptions(
            address=address, actors=actors, num_gpus_per_worker=num_gpus_per_worker)
        self.device = device
        self._cluster_device: str | None = None
        require_ray()
        self.options.check_device(device)

    def __repr__(self) -> str:
        return f"RayEngine({self.options!r}, device={self.device!r})"

    @property
    def actors(self) -> int | None:
        """The actors asked for (None: one per GPU, else per CPU of the cluster)."""
        return self.options.actors

    def check_device(self, device: str | None) -> None:
        self.options.check_device(device)

    def device_name(self, device: str | None) -> str:
        """The device the actors run on: ``cpu``/``cuda`` as asked, or, when nothing was asked, what the cluster
        gives them (``cuda`` when it has GPUs), so the driver can key outputs (e.g. the fp16 generator
        fingerprint) for the actors' device, not its own."""
        asked = self.options.device_name(device if device is not None else self.device)
        if asked != "auto":
            return asked
        if self._cluster_device is None:
            with ray_connection(self.options.address):
                self._cluster_device = self.options.resolve(device if device is not None else self.device)[2]
        return self._cluster_device

    def as_config(self) -> dict[str, Any]:
        return self.options.as_config()

    def map(self, worker: type, args: Sequence[Any], batches: Iterable[Mapping[str, Any]], *, total: int,
            description: str, progress: bool) -> Iterator[dict[str, Any]]:
        """``worker(*args)`` on each actor; yields one result per input batch, as they complete."""
        batches = list(batches)
        if not batches:
            return
        rows = [batch_rows(b) for b in batches]
        with ray_connection(self.options.address):
            import ray.data

            actors, gpus, _ = self.options.resolve(self.device)
            tables = [pa.table({"batch": pa.array(ids, pa.int64()), "payload": pa.array(payloads, pa.binary())})
                      for ids, payloads in pack_blocks(batches, actors)]
            ds = ray.data.from_arrow(tables).map_batches(
                BatchActor, fn_constructor_args=(worker, tuple(args)), batch_size=1, batch_format="numpy",
                compute=ray.data.ActorPoolStrategy(size=int(actors)), num_cpus=float(self.options.cpus_per_worker),
                num_gpus=gpus if gpus > 0 else None)
            with progress_bar(progress) as bar:
                task = bar.add_task(f"{description} on {actors} Ray actor(s)", total=total)
                for out in _stream(ds, progress):
                    for b, payload in zip(out["batch"], out["result"]):
                        result = pickle.loads(payload)
                        if isinstance(result, WorkerFailure):
                            raise _one_line(result.error)
                        yield result
                        bar.advance(task, rows[int(b)])
