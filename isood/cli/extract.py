"""L6: `isood extract` (CLIP features into resumable shards, on this process or Ray) and `isood merge` (the parts
of a job array -> the manifest a single run writes; each kind's merge belongs to the stage that writes it)."""

from __future__ import annotations

import os
from dataclasses import replace
from pathlib import Path
from typing import Callable, Optional, Sequence

import typer

from generation.syn import merge_parts as merge_syn_parts
from isood.cli._app import app, out_console
from isood.engines.ray import DEFAULT_DECODE_THREADS, RayEngine, RayOptions
from isood.errors import BadInputError, IsoodError
from isood.images import FAST_DECODE, REFERENCE_DECODE
from isood.kinds import FEATURES, SYN_IS
from isood.batch_engine import BatchEngine, LocalEngine
from isood.stages.extract import ExtractOptions, merge_parts as merge_feature_parts, run_extract, validate
from isood.cli.options import command
from manifests.options import MergeOptions
from manifests.parts import read_parts
from manifests.store import Manifest
from manifests.verify import verify

__all__ = ["extract", "merge", "build_engine", "merge_dirs", "MERGES"]

#: The merge of each kind a job array's parts combine into (the stage that writes the kind owns it).
MERGES: dict[str, Callable[..., Manifest]] = {FEATURES: merge_feature_parts, SYN_IS: merge_syn_parts}


def build_engine(engine: str, *, ray_address: str | None = None, workers: int | None = None,
                 num_gpus_per_worker: float | None = None, device: str | None = None) -> BatchEngine:
    """The engine of ``--engine``: ``local`` (this process) or ``ray`` (Ray Data actors, ``isood.engines.ray``)."""
    if engine == "local":
        return LocalEngine()
    if engine == "ray":
        options = RayOptions(address=ray_address, workers=workers, num_gpus_per_worker=num_gpus_per_worker)
        return RayEngine(options, device=device)
    raise BadInputError(f"unknown engine {engine!r}; pass --engine local or --engine ray")


@app.command()
def extract(
    images: Path = typer.Option(..., help="Images: a dataset root with wnid subfolders, or a file list (one path per line)."),
    clip: str = typer.Option(..., help="CLIP encoder: MODEL:PRETRAINED (e.g. ViT-B-32:openai), local-dir:PATH or hf-hub:ORG/REPO."),
    out: Path = typer.Option(..., help="Output directory (features manifest; rerun to resume)."),
    batch_size: int = typer.Option(64, help="Images per batch."),
    workers: Optional[int] = typer.Option(None, help="Local engine: image-decoding processes, running ahead of the model (default: CPUs - 1, at most 32; 0: decode in the model's process); the features do not depend on it. Ray engine: model actors (default: one per GPU, else per CPU)."),
    shard_size: int = typer.Option(10_000, help="Images per features-NNNNN.npy shard (the unit of resuming)."),
    device: Optional[str] = typer.Option(None, help="cpu, cuda or cuda:N (default: cuda when available; AMP on CUDA)."),
    engine: str = typer.Option("local", help="local (this process) or ray (Ray Data actors; pip install 'isood[ray]')."),
    ray_address: Optional[str] = typer.Option(None, help="Ray cluster to join (auto, HOST:PORT, ray://HOST:10001; default: $RAY_ADDRESS, else a local one)."),
    num_gpus_per_worker: Optional[float] = typer.Option(None, help="GPUs per Ray actor (default: 1 when the cluster has GPUs, else 0)."),
    num_shards: int = typer.Option(1, help="Job arrays: split the feature shards over this many tasks (merge with `isood merge`)."),
    shard_index: int = typer.Option(0, help="Job arrays: this task's index, 0..num-shards-1 (e.g. $SLURM_ARRAY_TASK_ID)."),
    decode: str = typer.Option(REFERENCE_DECODE, "--decode", help="Image decoding: reference (default: PIL + the model's own preprocessing, comparable across runs); fast (large JPEGs decoded at reduced size, resizing on uint8 tensors); gpu (JPEGs decoded in one batched torchvision decode_jpeg call per batch on the model's --device, nvJPEG on CUDA, then resized, cropped and normalised there; other files (PNG, CMYK, cut short) by the reference path; with --device cpu the same batched code runs on the CPU). fast and gpu keep cosine >= 0.999 to the reference features (bench/decode.py on the CPU; bench/gpu_extract.py measures nvJPEG's); the mode is recorded in the manifest and shards of different modes never mix."),
    fast_decode: bool = typer.Option(False, "--fast-decode", help="Deprecated: the same as --decode fast."),
    follow_symlinks: bool = typer.Option(False, "--follow-symlinks", help="Also read images whose symlinks lead outside the --images root (default: listed in the rejected table, since manifest paths promise files inside the root)."),
) -> None:
    """Extract L2-normalised CLIP image features into resumable shards (unreadable images are listed, not fatal)."""
    if fast_decode and decode not in (REFERENCE_DECODE, FAST_DECODE):
        raise BadInputError(f"--fast-decode (the same as --decode fast) contradicts --decode {decode}; pass one of "
                            "them")
    opts = ExtractOptions(images=images, clip=clip, out=out, batch_size=batch_size, workers=workers,
                          shard_size=shard_size, device=device, num_shards=num_shards, shard_index=shard_index,
                          decode=FAST_DECODE if fast_decode else decode, follow_symlinks=follow_symlinks)
    validate(opts)
    eng = build_engine(engine, ray_address=ray_address, workers=workers, num_gpus_per_worker=num_gpus_per_worker,
                       device=device)
    if eng.name != "local":  # --workers names the actors; each decodes with the Ray options' threads
        opts = replace(opts, workers=DEFAULT_DECODE_THREADS)
    r = run_extract(opts, engine=eng)
    part = f" (part {shard_index} of {num_shards}: merge with `isood merge`)" if num_shards > 1 else ""
    out_console.print(
        f"{r.n_images} images -> {r.embed_dim}-d features, {r.n_rejected} rejected; "
        f"shards written {len(r.shards_written)}, reused {len(r.shards_reused)}; manifest: {out}{part}",
        highlight=False,
    )


def merge_dirs(dirs: Sequence[str | os.PathLike], out: str | os.PathLike, *,
               argv: list[str] | None = None) -> Manifest:
    """``isood merge``: check the parts (``manifests.parts.read_parts``), merge them with their kind's merge into
    ``out``, verify every hash of the result."""
    parts, kind, config = read_parts(dirs)
    out = Path(out)
    merge = MERGES.get(kind)
    if merge is None:
        raise BadInputError(f"isood merge does not know parts of kind {kind!r} (knows: {', '.join(sorted(MERGES))})")
    manifest = merge(parts, out, config, argv=argv)
    report = verify(out)
    if not report.ok:
        raise IsoodError(f"merged manifest {out} fails verification: {'; '.join(report.lines()[:3])}")
    return manifest


@command(app, "merge", MergeOptions, config=False,
         help="Combine the parts of a job array (`isood extract` / `isood generate-syn` with --num-shards) into one "
              "verified manifest.")
def merge(opts: MergeOptions) -> None:
    m = merge_dirs(opts.parts, opts.out)
    out_console.print(f"merged {len(opts.parts)} parts -> {opts.out} ({m.kind} v{m.dataset_version}, "
                      f"{len(m.meta['files'])} files verified)", highlight=False, soft_wrap=True)
