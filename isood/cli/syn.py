"""L6: `isood generate-syn`: parse the options, build the engine, run the Syn-IS stage, render its summary."""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import pandas as pd
import typer
from rich.console import Group
from rich.table import Table

from generation.syn import SynOptions, SynResult, run_generate_syn
from isood.cli._app import app, console, out_console, verify_option
from isood.cli.extract import build_engine  # the one --engine builder (local | ray), shared with `isood extract`
from isood.defaults import DEFAULT_PIPELINE

__all__ = ["generate_syn", "summary_table", "cells_grid"]


def cells_grid(cells: pd.DataFrame) -> Table:
    """Images per cell (rows: covariate level, columns: semantic level; ``*``: N/A)."""
    n = int(cells["cov_level"].max()) + 1
    grid = Table(title="images per cell (N/A: fewer than the threshold)")
    grid.add_column("cov \\ sem")
    for s in range(n):
        grid.add_column(str(s), justify="right")
    for c in range(n):
        row = cells[cells["cov_level"] == c].sort_values("sem_level")
        grid.add_row(str(c), *[f"{k}" + ("*" if na else "") for k, na in zip(row["n"], row["na"])])
    return grid


def summary_table(result: SynResult):
    """A rich table of the run's counts, and the per-cell image grid when there is one."""
    table = Table(title="Syn-IS", show_header=True)
    table.add_column("what")
    table.add_column("value", justify="right")
    for key, value in result.summary.items():
        table.add_row(key, f"{value}")
    if result.cells is not None and len(result.cells):
        return Group(table, cells_grid(result.cells))
    return table


def _warn(message: str) -> None:
    console.print(f"[yellow]warning:[/yellow] {message}", highlight=False, soft_wrap=True)


@app.command("generate-syn")
def generate_syn(
    styles: str = typer.Option("sdxl", help="Styles: sdxl, sdxl:NAME,NAME, FILE.json (SDXL style file) or FILE.json:NAME,NAME."),
    labels: str = typer.Option("21k", help="Labels: 21k (default), 1k, 21k-p, 12k, a class-filter manifest, or a file of wnids/labels."),
    clip: Optional[str] = typer.Option(None, help="CLIP of the image splits: MODEL:PRETRAINED or local-dir:PATH (default: the --splits manifest's)."),
    laid: Optional[Path] = typer.Option(None, help="LAID W (.safetensors); default: the --splits manifest's, else trained here."),
    id_features: Optional[Path] = typer.Option(None, help="Features of the ID images (extraction output directory)."),
    splits: Optional[Path] = typer.Option(None, help="An image-splits manifest: bin prompts with its edges (else the prompts' own)."),
    per_cell: int = typer.Option(10, help="Prompts sampled per grid cell (seeded)."),
    images_per_prompt: int = typer.Option(1, help="Images generated per prompt."),
    pipeline: str = typer.Option(DEFAULT_PIPELINE, help="diffusers pipeline: a Hub name or local-dir:PATH."),
    size: int = typer.Option(512, help="Image height and width."),
    steps: int = typer.Option(1, help="Denoising steps."),
    guidance_scale: float = typer.Option(0.0, help="Classifier-free guidance (SDXL-Turbo: 0)."),
    batch_size: int = typer.Option(4, help="Images per pipeline call."),
    seed: int = typer.Option(0, help="Global seed (prompt sampling, LAID training, per-image seeds)."),
    prompts_only: bool = typer.Option(False, "--prompts-only", help="Write the binned prompt manifest without generating."),
    device: Optional[str] = typer.Option(None, help="cpu, cuda, cuda:N (default: cuda when available)."),
    blocklist: Optional[Path] = typer.Option(None, help="Extra prompt blocklist terms, one per line."),
    default_blocklist: bool = typer.Option(True, help="Use the built-in prompt blocklist."),
    safety_checker: Optional[str] = typer.Option(None, help="Image safety checker package.module:function (image, item) -> reason|None."),
    engine: str = typer.Option("local", help="local (this process) or ray (SDXL on Ray Data actors; pip install 'isood[ray]'; --out on a shared file system)."),
    ray_address: Optional[str] = typer.Option(None, help="Ray cluster to join (auto, HOST:PORT, ray://HOST:10001; default: $RAY_ADDRESS, else a local one)."),
    num_gpus_per_worker: Optional[float] = typer.Option(None, help="GPUs per Ray actor (default: 1 when the cluster has GPUs, else 0)."),
    workers: Optional[int] = typer.Option(None, help="Ray actors, one pipeline each (default: one per GPU, else per CPU)."),
    num_shards: int = typer.Option(1, help="Job arrays: split the pipeline batches over this many tasks (merge with `isood merge`)."),
    shard_index: int = typer.Option(0, help="Job arrays: this task's index, 0..num-shards-1 (e.g. $SLURM_ARRAY_TASK_ID)."),
    out: Path = typer.Option(..., help="Output Syn-IS manifest directory."),
    verify: str = verify_option(),
) -> None:
    """Syn-IS: style x label prompts binned by shift, generated with SDXL-Turbo."""
    opts = SynOptions(
        out=out, styles=styles, labels=labels, clip=clip, laid=str(laid) if laid else None,
        id_features=str(id_features) if id_features else None, splits=str(splits) if splits else None,
        per_cell=per_cell, images_per_prompt=images_per_prompt, pipeline=pipeline, size=size, steps=steps,
        guidance_scale=guidance_scale, batch_size=batch_size, seed=seed, prompts_only=prompts_only, device=device,
        blocklist=str(blocklist) if blocklist else None, default_blocklist=default_blocklist,
        safety_checker=safety_checker, num_shards=num_shards, shard_index=shard_index, verify=verify,
    )
    runner = build_engine(engine, ray_address=ray_address, ray_workers=workers, num_gpus_per_worker=num_gpus_per_worker,
                          device=device)
    result = run_generate_syn(opts, engine=runner, warn=_warn)
    out_console.print(summary_table(result))
    out_console.print(f"manifest: {out} ({result.manifest.kind} v{result.manifest.dataset_version})")
