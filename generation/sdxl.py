"""SDXL-Turbo image generation for Syn-IS over diffusers: deterministic, resumable, batched, engine-agnostic.

The pipeline, its settings and loading are :mod:`generation.pipeline`; the fingerprint the images are keyed with
is :mod:`generation.fingerprint`.

Determinism: each image has its own seed (``generation.prompts.image_seed``) fed through its own CPU
``torch.Generator``, so an image's latent does not depend on its batch-mates or the device. Batches are fixed
slices of the planned image list (one pipeline call each); a resumed run regenerates a whole slice when any image
of it is missing (writing only the missing ones), so batch composition - and hence numerics - match an
uninterrupted run. Files, content keys and markers: ``generation.outputs``.

Engines: :class:`GeneratorWorker` is an ``isood.core.engine.BatchEngine`` worker (built once per process or actor,
called once per plan slice), so :func:`generate_images` runs in this process (``LocalEngine``) or on a cluster
(``isood.engines.ray.RayEngine``, given by the CLI) through the same code.
"""

from __future__ import annotations

import inspect
import os
import time
from collections import deque
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace
from pathlib import Path
from typing import Any, Callable, Iterable, Iterator, Mapping, Sequence

import numpy as np
import pandas as pd

from generation.fingerprint import generator_fingerprint, pipeline_weights, plan_fingerprint
from generation.outputs import GenerationResult, finish_hashes, prepare_outputs, write_image
from generation.pipeline import GeneratorSettings, load_pipeline, quiet_libraries
from generation.safety import load_image_checker
from isood.core.engine import BatchEngine, LocalEngine
from isood.core.errors import BadInputError, IsoodError
from isood.core.progress import progress_bar

__all__ = ["BATCH_COLUMNS", "SDXLGenerator", "GeneratorWorker", "IN_FLIGHT", "default_write_threads", "plan_batches",
           "generate_images"]


class SDXLGenerator:
    """Calls a diffusers pipeline on a batch: ``generator(prompts, negative_prompts, seeds) -> [(image, flag)]``.

    ``flag`` is a rejection reason from the pipeline's own safety checker (pipelines that have one) or None.
    ``calls`` counts pipeline invocations, ``encoded`` the prompts whose text embeddings were computed.

    Text embeddings: for an SDXL-family pipeline (its ``encode_prompt`` returns pooled embeddings) each unique
    prompt of a batch (with its negative prompt, where classifier-free guidance uses it) is encoded once, in
    one ``encode_prompt`` call, and the pipeline gets ``prompt_embeds`` / ``pooled_prompt_embeds`` (and the
    negative ones) instead of the strings: a prompt's images (``--images-per-prompt``) share one encoding.
    The images are those of passing the strings up to float rounding (the text encoders see another batch).
    Only the batch's own prompts are encoded together, never a cache across batches: a batch's numerics do not
    depend on what ran before it, so a resumed run regenerates a slice as the uninterrupted run did.
    ``prompt_embeds=False`` passes the strings (other pipelines always do).
    """

    def __init__(self, pipe, settings: GeneratorSettings, *, prompt_embeds: bool = True):
        self.pipe = pipe
        self.settings = settings
        self.prompt_embeds = prompt_embeds
        self.calls = 0
        self.encoded = 0
        self._weights: str | None = None

    @classmethod
    def load(cls, settings: GeneratorSettings) -> "SDXLGenerator":
        return cls(load_pipeline(settings.pipeline, settings.device), settings)

    @property
    def fingerprint(self) -> dict[str, Any]:
        if self._weights is None:  # the folder's content, fingerprinted once per generator
            self._weights = pipeline_weights(self.settings.pipeline) or ""
        return generator_fingerprint(self.settings, pipeline_class=type(self.pipe).__name__,
                                     dtype=getattr(self.pipe, "dtype", None), weights=self._weights or None)

    def _encodes_prompts(self) -> bool:
        """Whether the pipeline takes pooled prompt embeddings from its own ``encode_prompt`` (SDXL family)."""
        encode = getattr(self.pipe, "encode_prompt", None)
        if not self.prompt_embeds or encode is None:
            return False
        try:
            return "pooled_prompt_embeds" in inspect.signature(encode).parameters
        except (TypeError, ValueError):  # pragma: no cover - a builtin without a signature
            return False

    def _guided(self) -> bool:
        """Classifier-free guidance, as the SDXL pipeline decides it (guidance > 1, a UNet without guidance
        embedding): then the negative prompts are encoded too."""
        unet = getattr(self.pipe, "unet", None)
        cond = getattr(getattr(unet, "config", None), "time_cond_proj_dim", None)
        return self.settings.guidance_scale > 1 and cond is None

    def text_inputs(self, prompts: Sequence[str], negative_prompts: Sequence[str]) -> dict[str, Any]:
        """The pipeline's text arguments for a batch: each unique prompt (and negative prompt, when guided)
        encoded once (class docstring), or the strings themselves."""
        if not self._encodes_prompts():
            return {"prompt": list(prompts), "negative_prompt": list(negative_prompts)}
        import torch

        guided = self._guided()
        keys = [(p, n if guided else "") for p, n in zip(prompts, negative_prompts)]
        unique = list(dict.fromkeys(keys))
        device = getattr(self.pipe, "_execution_device", None) or getattr(self.pipe, "device", None)
        with torch.no_grad(), quiet_libraries():
            pe, npe, ppe, nppe = self.pipe.encode_prompt(
                prompt=[p for p, _ in unique], device=device, num_images_per_prompt=1,
                do_classifier_free_guidance=guided, negative_prompt=[n for _, n in unique] if guided else None)
        self.encoded += len(unique)
        at = {k: j for j, k in enumerate(unique)}
        rows = torch.tensor([at[k] for k in keys], device=pe.device)
        out = {"prompt_embeds": pe[rows], "pooled_prompt_embeds": ppe[rows]}
        if guided:
            out.update(negative_prompt_embeds=npe[rows], negative_pooled_prompt_embeds=nppe[rows])
        return out

    def __call__(self, prompts: Sequence[str], negative_prompts: Sequence[str], seeds: Sequence[int]):
        import torch

        s = self.settings
        generators = [torch.Generator("cpu").manual_seed(int(seed)) for seed in seeds]
        text = self.text_inputs(prompts, negative_prompts)
        self.calls += 1
        with quiet_libraries():
            out = self.pipe(**text, num_inference_steps=s.steps, guidance_scale=s.guidance_scale, height=s.size,
                            width=s.size, generator=generators)
        flags = getattr(out, "nsfw_content_detected", None) or [False] * len(out.images)
        return [(img, "pipeline safety checker" if flag else None) for img, flag in zip(out.images, flags)]


# ------------------------------------------------------------------------------------------- engine worker
#: Columns every generation batch (one plan slice) has; the plan's other columns (style, label, ...) ride along for
#: the image checker. ``done`` rows are generated (batch composition) but not written.
BATCH_COLUMNS = ("path", "prompt", "negative_prompt", "seed", "done")


#: Generation batches in flight at most in :meth:`GeneratorWorker.stream`: one being encoded and written on the
#: thread pool while the next one generates (so at most two batches of images are held in memory).
IN_FLIGHT = 2


def default_write_threads() -> int:
    """Threads that encode, hash, check and write the PNGs of a batch while the next one generates: up to 4 (PNG
    encoding releases the GIL), at most the CPUs there are. Whether 4 keep up with a GPU is what
    ``bench/gpu_generate.py`` measures (not measured on a GPU yet)."""
    return max(1, min(4, os.cpu_count() or 1))


class GeneratorWorker:
    """A ``BatchEngine`` worker: one generator per process or actor; each call generates one plan slice in one
    pipeline call and writes its images (or rejection markers) into ``root``.

    Built with ``(root, settings, fingerprint, image_checker=None, generator=None, on_image=None,
    write_threads=None)``: without a ``generator`` the pipeline is loaded from ``settings`` and its fingerprint
    must be ``fingerprint``; ``image_checker`` is a callable or a ``package.module:function`` name (imported
    here, e.g. in each actor); ``on_image(row)`` is called after each accepted image is written (local runs;
    tests interrupt with it), in plan order, from the calling thread. A call returns, per row, ``path``,
    ``sha256`` ('' when rejected or not written), ``rejected`` (reason or '') and ``written`` (False for rows
    that were already done).

    :meth:`stream` (the local engine's path) keeps the device busy: while batch ``i + 1`` generates, the
    images of batch ``i`` are PNG-encoded, hashed, safety-checked and written (by rename, as a call does) on
    ``write_threads`` threads (default :func:`default_write_threads`; 0 = in line, as a call), at most
    :data:`IN_FLIGHT` batches at a time. The files are byte-identical to the calls' (the same images through
    the same ``write_image``); an ``image_checker`` must then be safe to call from several threads. An error
    (e.g. a failing checker: one line) stops the stream: writes not yet started are cancelled, the ones running
    finish, so an interrupted run may have written a few images past the one it stopped at (each complete, by
    rename; a rerun keeps them).
    """

    def __init__(self, root: str, settings: GeneratorSettings, fingerprint: Mapping[str, Any],
                 image_checker: Callable | str | None = None, generator: Callable | None = None,
                 on_image: Callable[[dict], None] | None = None, write_threads: int | None = None):
        self.root = Path(root)
        if generator is None:
            generator = SDXLGenerator.load(settings)
            if generator.fingerprint != dict(fingerprint):
                raise BadInputError(f"the worker's pipeline {generator.fingerprint} is not the expected "
                                    f"{dict(fingerprint)}; give every worker the same --pipeline and device")
        self.generator = generator
        self.checker = load_image_checker(image_checker) if isinstance(image_checker, str) else image_checker
        self.on_image = on_image
        self.write_threads = default_write_threads() if write_threads is None else max(0, int(write_threads))

    def _generate(self, batch: Mapping[str, Any]) -> tuple[list[dict], list]:
        """The batch's rows and the generator's (image, flag) per row (one pipeline call)."""
        columns = list(batch)
        rows = [dict(zip(columns, vals)) for vals in zip(*(np.asarray(batch[c]).tolist() for c in columns))]
        outputs = self.generator([r["prompt"] for r in rows], [r["negative_prompt"] for r in rows],
                                 [int(r["seed"]) for r in rows])
        return rows, list(outputs)

    def _result(self, rows: list[dict],
                written: Iterable[tuple[int, Callable[[], tuple[str, str]]]]) -> dict[str, np.ndarray]:
        """The call's result from ``(row index, write)`` pairs in row order, ``write()`` giving (sha, reason);
        ``on_image`` after each accepted one."""
        sha, rejected, done = [""] * len(rows), [""] * len(rows), [False] * len(rows)
        for j, write in written:
            sha[j], rejected[j] = write()
            done[j] = True
            if self.on_image is not None and not rejected[j]:
                self.on_image(rows[j])
        return {"path": np.array([r["path"] for r in rows], dtype=object), "sha256": np.array(sha, dtype=object),
                "rejected": np.array(rejected, dtype=object), "written": np.array(done, dtype=bool)}

    def __call__(self, batch: Mapping[str, Any]) -> dict[str, np.ndarray]:
        rows, outputs = self._generate(batch)

        def writer(row: dict, image: Any, flag: str | None) -> Callable[[], tuple[str, str]]:
            return lambda: write_image(self.root, row, image, flag, self.checker)

        return self._result(rows, ((j, writer(r, image, flag))
                                   for j, (r, (image, flag)) in enumerate(zip(rows, outputs)) if not r["done"]))

    def stream(self, batches: Iterable[Mapping[str, Any]]) -> Iterator[dict[str, np.ndarray]]:
        """The results of ``batches`` in order, the same as the calls', with each batch's images written on
        the thread pool while the next batch generates (class docstring)."""
        if self.write_threads < 1:
            yield from (self(batch) for batch in batches)
            return
        pool = ThreadPoolExecutor(self.write_threads, thread_name_prefix="isood-png")
        pending: deque = deque()
        try:
            for batch in batches:
                rows, outputs = self._generate(batch)
                futures = [(j, pool.submit(write_image, self.root, r, image, flag, self.checker))
                           for j, (r, (image, flag)) in enumerate(zip(rows, outputs)) if not r["done"]]
                del outputs
                pending.append((rows, futures))
                if len(pending) >= IN_FLIGHT:
                    rows, futures = pending.popleft()
                    yield self._result(rows, ((j, f.result) for j, f in futures))
            while pending:
                rows, futures = pending.popleft()
                yield self._result(rows, ((j, f.result) for j, f in futures))
        finally:
            pool.shutdown(wait=True, cancel_futures=True)


def _column(values: list) -> np.ndarray:
    return np.array(values, dtype=object) if any(isinstance(v, str) for v in values) else np.asarray(values)


def plan_batches(rows: Sequence[Mapping[str, Any]], done: set[str], batch_size: int) -> list[dict[str, np.ndarray]]:
    """The generation batches of a plan: fixed slices of ``batch_size`` rows (every plan column, plus ``done``),
    leaving out the slices whose rows are all ``done`` (a slice with some missing rows is regenerated whole, so
    numerics match a full run)."""
    batches = []
    for start in range(0, len(rows), int(batch_size)):
        chunk = rows[start:start + int(batch_size)]
        if all(r["path"] in done for r in chunk):
            continue
        batch = {c: _column([r[c] for r in chunk]) for c in chunk[0] if c != "done"}
        batch["seed"] = np.array([int(r["seed"]) for r in chunk], dtype=np.int64)
        batch["done"] = np.array([r["path"] in done for r in chunk], dtype=bool)
        batches.append(batch)
    return batches


def _collect(results: Iterator[dict[str, Any]], result: GenerationResult, bar, task, t0: float) -> None:
    for out in results:
        result.batches += 1
        for path, sha, reason, written in zip(out["path"], out["sha256"], out["rejected"], out["written"]):
            if not written:
                continue
            if reason:
                result.rejected[str(path)] = str(reason)
            else:
                result.sha256[str(path)] = str(sha)
                result.generated += 1
            elapsed = time.perf_counter() - t0
            bar.update(task, advance=1, rate=result.generated / elapsed if elapsed > 0 else 0.0)


def generate_images(plan: pd.DataFrame, root: str | Path, *, settings: GeneratorSettings,
                    fingerprint: Mapping[str, Any] | None = None, generator: Callable | None = None,
                    engine: BatchEngine | None = None, image_checker: Callable | str | None = None,
                    on_image: Callable[[dict], None] | None = None, progress: bool = True,
                    write_threads: int | None = None) -> GenerationResult:
    """Generate the planned images into ``root`` (``plan``: path, prompt, negative_prompt, seed, ...).

    Images already present and valid for the same content key are kept; rejected ones are not written and are
    remembered (``generation.outputs``). ``generator`` replaces the pipeline of ``settings`` (local engine only);
    ``fingerprint`` defaults to the generator's, else :func:`expected_fingerprint` on the engine's device.
    ``engine`` (default ``LocalEngine()``) runs :class:`GeneratorWorker` on the plan slices; with a cluster
    engine ``root`` must be on a file system the workers share. ``write_threads``: the threads that write a
    batch's PNGs while the next generates (local engine: ``GeneratorWorker.stream``; None = its default, 0 =
    write in line).
    """
    engine = engine or LocalEngine()
    if generator is not None and engine.name != "local":
        raise BadInputError(f"a custom generator runs only with the local engine, not {engine.name!r}")
    settings = replace(settings, device=engine.device_name(settings.device))  # the workers' device
    if fingerprint is None:
        fingerprint = plan_fingerprint(settings, generator=generator, engine=engine)
    rows, done, result = prepare_outputs(plan, root, fingerprint, settings.size)
    batches = plan_batches(rows, done, settings.batch_size)
    t0 = time.perf_counter()
    if batches:
        args = (str(root), settings, dict(fingerprint), image_checker, generator, on_image, write_threads)
        results = engine.map(GeneratorWorker, args, batches, total=sum(len(b["path"]) for b in batches),
                             description="generating", progress=False)
        with progress_bar(progress, rate_unit="images") as bar:
            task = bar.add_task("generating", total=len(rows), completed=len(done), rate=0.0)
            _collect(results, result, bar, task, t0)
    result.seconds = time.perf_counter() - t0
    missing = [r["path"] for r in rows if r["path"] not in result.rejected and not (Path(root) / r["path"]).is_file()]
    if missing:
        raise IsoodError(f"{len(missing)} planned image(s) were not written by the {engine.name} workers (e.g. "
                            f"{missing[0]}); rerun to resume")
    return finish_hashes(rows, root, result)

