"""The Ray Data engine (``--engine ray``) for ``isood extract`` and ``isood generate-syn``.

A Ray Data pipeline: the driver lists the work (the sorted image files, or the planned images), Ray Data
feeds it in batches to a pool of actors (``map_batches`` with a callable class: each actor holds ONE model,
the CLIP encoder or the SDXL pipeline, on ``num_gpus_per_worker`` GPUs when the cluster has GPUs), and the
driver consumes the results as they stream back. The output is the local engine's, written by the local
engine's code:

* extraction: actors decode (``decode_threads`` threads), preprocess and encode images and return features;
  the driver writes each feature shard (``features-NNNNN.npy`` + ``.rows.parquet``) when complete, in file
  order, and the same manifest. Input blocks start at a shard start plus a multiple of ``batch_size`` and
  never straddle shards, so Ray's batches are the local engine's batches (same batch composition whenever
  ``shard_size >= batch_size``; the actor also splits a Ray batch at local batch boundaries);
* generation: actors generate the planned images and write them (atomically, as the local loop does) into
  the output directory, which must be on a file system the actors share with the driver; each pipeline call
  gets the same slice of the plan as in a local run.

``ray.init`` joins ``--ray-address`` (``auto``, ``HOST:PORT``, ``ray://HOST:10001``) or ``$RAY_ADDRESS``, else
starts a local cluster for this command (shut down afterwards); an already initialised Ray is used as is.
Workers of a remote cluster need isood installed (``pip install 'isood[ray]'`` on every node).
"""

from __future__ import annotations

import contextlib
import logging
import math
import os
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Callable, Iterator, Sequence

import numpy as np

from isood.errors import IsoodError

RAY_HINT = "pip install 'isood[ray]'"
DEFAULT_DECODE_THREADS = 4


def require_ray() -> None:
    """Import Ray Data or raise a one-line IsoodError saying how to install it."""
    try:
        import ray  # noqa: F401
        import ray.data  # noqa: F401
    except ImportError:
        raise IsoodError(f"--engine ray needs Ray Data, which is not installed: {RAY_HINT}") from None


@dataclass
class RayOptions:
    """How to run on Ray. ``workers``: actors (default: GPUs / num_gpus_per_worker on a GPU cluster, else
    CPUs / cpus_per_worker). ``num_gpus_per_worker``: default 1 when the cluster has GPUs, else 0 (fractions
    share a GPU). ``decode_threads``: image-decoding threads inside each extraction actor."""

    address: str | None = None
    workers: int | None = None
    num_gpus_per_worker: float | None = None
    cpus_per_worker: float = 1.0
    decode_threads: int = DEFAULT_DECODE_THREADS

    def __post_init__(self) -> None:
        if self.workers is not None and int(self.workers) < 1:
            raise IsoodError(f"--workers must be >= 1 with --engine ray, got {self.workers}")
        if self.num_gpus_per_worker is not None and float(self.num_gpus_per_worker) < 0:
            raise IsoodError(f"--num-gpus-per-worker must be >= 0, got {self.num_gpus_per_worker}")
        if float(self.cpus_per_worker) <= 0 or int(self.decode_threads) < 1:
            raise IsoodError("cpus_per_worker must be > 0 and decode_threads >= 1")

    def check_device(self, device: str | None) -> None:
        """``--device`` with Ray: auto/None, ``cpu`` (no GPUs for the actors) or ``cuda`` (GPUs required)."""
        if device in (None, "", "auto"):
            return
        if device == "cpu":
            if self.num_gpus_per_worker:
                raise IsoodError("--device cpu contradicts --num-gpus-per-worker > 0; drop one of them")
            return
        if str(device).startswith("cuda"):
            if self.num_gpus_per_worker == 0:
                raise IsoodError("--device cuda contradicts --num-gpus-per-worker 0; drop one of them")
            if str(device) != "cuda":
                raise IsoodError(f"--device {device}: with --engine ray Ray assigns the GPUs; pass --device cuda")
            return
        raise IsoodError(f"unknown device {device!r}; pass cpu, cuda or auto")

    def device_name(self, device: str | None) -> str:
        """The actors' device as requested (for the manifest config): cpu, cuda, or auto."""
        if device == "cpu" or self.num_gpus_per_worker == 0:
            return "cpu"
        if (device or "").startswith("cuda") or self.num_gpus_per_worker:
            return "cuda"
        return "auto"

    def as_config(self) -> dict[str, Any]:
        return {"address": self.address or os.environ.get("RAY_ADDRESS") or "local", "workers": self.workers,
                "num_gpus_per_worker": self.num_gpus_per_worker, "cpus_per_worker": self.cpus_per_worker,
                "decode_threads": self.decode_threads}

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
            raise IsoodError("--device cuda but the Ray cluster has no GPUs; pass --device cpu")
        if g > 0 and gpus < g:
            raise IsoodError(f"--num-gpus-per-worker {g:g} but the Ray cluster has {gpus:g} GPU(s); "
                             "pass --num-gpus-per-worker 0 to run on CPUs")
        if self.workers is not None:
            workers = int(self.workers)
        elif g > 0:
            workers = max(1, int(gpus // g))
        else:
            workers = max(1, int(cpus // float(self.cpus_per_worker)))
        return workers, g, "cuda" if g > 0 else "cpu"


@contextlib.contextmanager
def ray_session(address: str | None = None) -> Iterator[Any]:
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
        msg = " ".join(str(e).split())[:160]
        raise IsoodError(f"cannot connect to the Ray cluster at {address or os.environ.get('RAY_ADDRESS')} ({msg}); "
                         "start one with `ray start --head` or pass --ray-address auto|HOST:PORT") from None
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


def _isood_cause(e: BaseException) -> BaseException | None:
    """The IsoodError behind a Ray (task / user-code) error, if any."""
    seen = set()
    stack = [e]
    while stack:
        x = stack.pop()
        if x is None or id(x) in seen:
            continue
        seen.add(id(x))
        if isinstance(x, IsoodError):
            return x
        stack.extend([getattr(x, "cause", None), x.__cause__, x.__context__])
    return None


def _stream(ds, progress: bool) -> Iterator[dict]:
    """Iterate a dataset's output blocks as numpy dicts; an IsoodError raised in an actor comes out as one."""
    try:
        with _data_context(progress):
            yield from ds.iter_batches(batch_size=None, batch_format="numpy")
    except IsoodError:
        raise
    except Exception as e:
        cause = _isood_cause(e)
        if cause is not None:
            raise IsoodError(f"Ray worker: {' '.join(str(cause).split())}") from None
        raise


def _actor_pool(workers: int):
    import ray.data

    return ray.data.ActorPoolStrategy(size=int(workers))


# ------------------------------------------------------------------------------------------------ extraction


class ClipEncodeActor:
    """Ray Data callable class: one CLIP encoder per actor. A batch (columns ``i``, ``path``, ``name``,
    ``batch``) -> ``i``, ``feature`` (n, D; zeros where unreadable), ``ok``, ``error``. Images are decoded by
    ``decode_threads`` threads (PIL and torch release the GIL); rows of one local batch id are encoded in one
    forward pass, as the local engine does."""

    def __init__(self, clip_spec: str, device: str, decode_threads: int = DEFAULT_DECODE_THREADS):
        from concurrent.futures import ThreadPoolExecutor

        from isood.features import load_clip

        self.encoder = load_clip(clip_spec, device)
        self.pool = ThreadPoolExecutor(int(decode_threads)) if int(decode_threads) > 1 else None

    def __call__(self, batch: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        from isood.features import ImageFiles, collate_images, encode_image_batch

        n = len(batch["i"])
        files = ImageFiles([str(p) for p in batch["path"]], self.encoder.preprocess, names=[str(x) for x in batch["name"]])
        items = list(self.pool.map(files.__getitem__, range(n))) if self.pool else [files[j] for j in range(n)]
        feats = np.zeros((n, self.encoder.embed_dim), np.float32)
        ok = np.zeros(n, dtype=bool)
        errors = np.array([""] * n, dtype=object)
        groups = np.asarray(batch["batch"])
        for g in dict.fromkeys(groups.tolist()):
            idx, tensor, bad = collate_images([items[j] for j in np.flatnonzero(groups == g)])
            if idx:
                feats[idx] = encode_image_batch(self.encoder, tensor)
                ok[idx] = True
            for j, err in bad:
                errors[j] = err
        return {"i": np.asarray(batch["i"], dtype=np.int64), "feature": feats, "ok": ok, "error": errors}


def _aligned_blocks(shards: Sequence[tuple[int, int]], batch_size: int, total: int,
                    workers: int) -> list[tuple[int, int, int]]:
    """Split the shards into Ray input blocks that start at a shard start plus a multiple of ``batch_size`` (so
    Ray's batches are the local engine's batches) and are small enough to keep every actor busy (~4 blocks per
    actor), without straddling a shard. Returns ``(shard start, block start, block end)``."""
    rows = max(batch_size, -(-max(1, -(-total // (4 * max(1, workers)))) // batch_size) * batch_size)
    return [(lo, s, min(hi, s + rows)) for lo, hi in shards for s in range(lo, hi, rows)]


def encode_images_ray(
    files: Sequence[os.PathLike | str],
    names: Sequence[str],
    blocks: Sequence[tuple[int, int]],
    clip_spec: str,
    *,
    batch_size: int,
    options: RayOptions,
    on_batch: Callable[[list[int], np.ndarray, list[tuple[int, str]]], None],
    device: str | None = None,
    progress: bool = False,
    description: str = "extracting (ray)",
) -> None:
    """Encode ``files[lo:hi]`` for each ``(lo, hi)`` in ``blocks`` (feature shards) on Ray actors; results
    stream to ``on_batch(ok indices, features (n_ok, D), [(index, error)])`` as the local engine's do."""
    import pyarrow as pa

    from isood.features import _progress

    with ray_session(options.address):
        import ray.data

        workers, gpus, actor_device = options.resolve(device)
        total = sum(hi - lo for lo, hi in blocks)
        tables = []
        for shard_lo, lo, hi in _aligned_blocks(blocks, int(batch_size), total, workers):
            i = np.arange(lo, hi, dtype=np.int64)
            tables.append(pa.table({
                "i": i,
                "path": [str(files[j]) for j in range(lo, hi)],
                "name": [str(names[j]) for j in range(lo, hi)],
                "batch": shard_lo + (i - shard_lo) // int(batch_size),  # the local engine's batch of each image
            }))
        ds = ray.data.from_arrow(tables).map_batches(
            ClipEncodeActor,
            fn_constructor_args=(clip_spec, actor_device, options.decode_threads),
            batch_size=int(batch_size),
            batch_format="numpy",
            compute=_actor_pool(workers),
            num_cpus=float(options.cpus_per_worker),
            num_gpus=gpus if gpus > 0 else None,
        )
        with _progress(progress) as bar:
            task = bar.add_task(f"{description} on {workers} Ray actor(s)", total=total)
            for out in _stream(ds, progress):
                ok = np.asarray(out["ok"], dtype=bool)
                i = np.asarray(out["i"], dtype=np.int64)
                feats = np.asarray(out["feature"], dtype=np.float32).reshape(len(i), -1)
                errors = [(int(j), str(e)) for j, e, good in zip(i, out["error"], ok) if not good]
                on_batch(i[ok].tolist(), feats[ok], errors)
                bar.advance(task, len(i))


# ------------------------------------------------------------------------------------------------ generation


def expected_fingerprint(settings, device: str) -> dict[str, Any]:
    """The generator fingerprint (generation.sdxl.SDXLGenerator.fingerprint) the actors will have, computed
    from the pipeline's model_index.json without loading weights: the driver needs it to key the images
    before any actor has started; each actor checks its own against it."""
    from diffusers import DiffusionPipeline

    from generation.sdxl import LOCAL_PREFIX, _dtype_for

    spec = settings.pipeline
    local = spec.startswith(LOCAL_PREFIX)
    source = str(Path(spec[len(LOCAL_PREFIX):]).expanduser()) if local else spec
    try:
        config = DiffusionPipeline.load_config(source, local_files_only=local or None)
    except Exception as e:
        raise IsoodError(f"cannot read the pipeline config of {spec!r} ({' '.join(str(e).split())[:160]}); "
                         "pass --pipeline local-dir:PATH to a diffusers folder") from None
    name = config.get("_class_name", "unknown")
    try:  # AutoPipelineForText2Image loads the text-to-image class of the family
        from diffusers.pipelines.auto_pipeline import AUTO_TEXT2IMAGE_PIPELINES_MAPPING, _get_task_class

        name = _get_task_class(AUTO_TEXT2IMAGE_PIPELINES_MAPPING, name).__name__
    except Exception:
        pass
    return {
        "pipeline": spec,
        "pipeline_class": name,
        "steps": settings.steps,
        "guidance_scale": float(settings.guidance_scale),
        "size": settings.size,
        "dtype": str(_dtype_for(device)).replace("torch.", ""),
    }


class SDXLActor:
    """Ray Data callable class: one diffusers pipeline per actor. A batch of planned images (``path``,
    ``prompt``, ``negative_prompt``, ``seed``, ``chunk``, ``done``) -> the images of each chunk generated in
    one pipeline call and written into ``root``; returns ``path``, ``sha256``, ``rejected`` (reason or ''),
    ``calls`` for the rows that were not done."""

    def __init__(self, root: str, settings, fingerprint: dict, image_checker=None):
        from generation.safety import load_image_checker
        from generation.sdxl import SDXLGenerator

        self.root = Path(root)
        self.generator = SDXLGenerator.load(settings)
        if self.generator.fingerprint != fingerprint:
            raise IsoodError(f"the Ray worker's pipeline {self.generator.fingerprint} is not the expected {fingerprint}")
        self.checker = load_image_checker(image_checker) if isinstance(image_checker, str) else image_checker

    def __call__(self, batch: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        from generation.sdxl import GenerationResult, write_outputs

        cols = ("path", "prompt", "negative_prompt", "seed", "chunk", "done")
        rows = [dict(zip(cols, vals)) for vals in zip(*(batch[c].tolist() for c in cols))]
        result, calls = GenerationResult(), []
        for chunk_id in dict.fromkeys(r["chunk"] for r in rows):
            chunk = [r for r in rows if r["chunk"] == chunk_id]
            done = {r["path"] for r in chunk if r["done"]}
            outputs = self.generator([r["prompt"] for r in chunk], [r["negative_prompt"] for r in chunk],
                                     [r["seed"] for r in chunk])
            calls.append(1)
            write_outputs(self.root, chunk, outputs, done, result, self.checker)
        todo = [r["path"] for r in rows if not r["done"]]
        n_calls = np.zeros(len(todo), dtype=np.int64)
        if len(todo):
            n_calls[0] = len(calls)
        return {"path": np.array(todo, dtype=object),
                "sha256": np.array([result.sha256.get(p, "") for p in todo], dtype=object),
                "rejected": np.array([result.rejected.get(p, "") for p in todo], dtype=object),
                "calls": n_calls}


def generate_images_ray(
    plan,
    root: str | os.PathLike,
    settings,
    *,
    options: RayOptions,
    image_checker: Callable | str | None = None,
    device: str | None = None,
    progress: bool = False,
):
    """generation.sdxl.generate_images on Ray actors: same skipping, content keys, files and result.
    ``image_checker``: a ``package.module:function`` name (imported in each actor) or a picklable callable.
    Returns ``(GenerationResult, fingerprint)``."""
    import time

    import pyarrow as pa

    from generation.sdxl import _progress, finish_hashes, prepare_outputs

    options.check_device(device)
    root = Path(root)
    batch_size = int(settings.batch_size)
    with ray_session(options.address):
        import ray.data

        workers, gpus, actor_device = options.resolve(device)
        actor_settings = replace(settings, device=actor_device)
        fingerprint = expected_fingerprint(actor_settings, actor_device)
        rows, done, result = prepare_outputs(plan, root, fingerprint, settings.size)
        chunks = [(s, rows[s:s + batch_size]) for s in range(0, len(rows), batch_size)
                  if not all(r["path"] in done for r in rows[s:s + batch_size])]
        t0 = time.perf_counter()
        if chunks:
            per_block = max(1, math.ceil(len(chunks) / (4 * workers)))
            tables = []
            for b in range(0, len(chunks), per_block):  # whole chunks per block: Ray's batches are the chunks
                part = [(s, r) for s, chunk in chunks[b:b + per_block] for r in chunk]
                tables.append(pa.table({
                    "path": [r["path"] for _, r in part],
                    "prompt": [r["prompt"] for _, r in part],
                    "negative_prompt": [r["negative_prompt"] for _, r in part],
                    "seed": np.array([r["seed"] for _, r in part], dtype=np.int64),
                    "chunk": np.array([s for s, _ in part], dtype=np.int64),
                    "done": np.array([r["path"] in done for _, r in part], dtype=bool),
                }))
            ds = ray.data.from_arrow(tables).map_batches(
                SDXLActor,
                fn_constructor_args=(str(root), actor_settings, fingerprint, image_checker),
                batch_size=batch_size,
                batch_format="numpy",
                compute=_actor_pool(workers),
                num_cpus=float(options.cpus_per_worker),
                num_gpus=gpus if gpus > 0 else None,
            )
            with _progress(progress, len(rows)) as bar:
                task = bar.add_task("generate", total=len(rows), completed=len(done), rate=0.0)
                for out in _stream(ds, progress):
                    for path, sha, reason in zip(out["path"], out["sha256"], out["rejected"]):
                        if reason:
                            result.rejected[str(path)] = str(reason)
                        else:
                            result.sha256[str(path)] = str(sha)
                            result.generated += 1
                    result.batches += int(np.sum(out["calls"]))
                    elapsed = time.perf_counter() - t0
                    bar.update(task, advance=len(out["path"]), rate=result.generated / elapsed if elapsed > 0 else 0.0)
        result.seconds = time.perf_counter() - t0
    missing = [r["path"] for r in rows if r["path"] not in result.rejected and not (root / r["path"]).is_file()]
    if missing:
        raise IsoodError(f"{len(missing)} planned image(s) were not written by the Ray workers (e.g. {missing[0]}); "
                         "rerun to resume")
    return finish_hashes(rows, root, result), fingerprint
