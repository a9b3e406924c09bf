"""The options and result of the generate-syn stage, and the checks of the options against each other and the
output folder (pure: they run before anything is loaded or written)."""

from __future__ import annotations

from dataclasses import dataclass, field
from numbers import Integral
from pathlib import Path
from typing import Any

import pandas as pd

from generation.sdxl import GeneratorSettings
from isood.defaults import DEFAULT_PIPELINE, DEFAULT_VERIFY, LAID_TRIPLETS, N_LEVELS, NA_THRESHOLD
from isood.errors import BadInputError
from isood.grid import check_levels
from isood.kinds import SYN_IS, SYN_IS_PART, SYN_IS_PROMPTS
from isood.defaults import check_seed
from isood.parts import check_shard_args
from manifests.store import Manifest
from manifests.verify import check_verify_mode

__all__ = ["KIND", "KIND_PROMPTS", "KIND_PART", "SynOptions", "SynResult", "check_options", "output_kinds",
           "input_paths"]

KIND, KIND_PROMPTS, KIND_PART = SYN_IS, SYN_IS_PROMPTS, SYN_IS_PART


@dataclass(frozen=True, kw_only=True)
class SynOptions:
    """Everything `isood generate-syn` takes (CLI flags map 1:1; the engine options build the engine the CLI
    passes to :func:`generation.syn.run_generate_syn`)."""

    out: Path
    styles: str = "sdxl"
    labels: str = "21k"
    clip: str | None = None
    laid: str | None = None
    id_features: str | None = None
    splits: str | None = None
    per_cell: int = 10
    images_per_prompt: int = 1
    pipeline: str = DEFAULT_PIPELINE
    size: int = 512
    steps: int = 1
    guidance_scale: float = 0.0
    batch_size: int = 4
    seed: int = 0
    prompts_only: bool = False
    device: str | None = None
    n_levels: int = N_LEVELS  # without --splits (with it: the splits' levels)
    na_threshold: int = NA_THRESHOLD
    blocklist: str | None = None
    default_blocklist: bool = True
    safety_checker: str | None = None
    laid_triplets: int = LAID_TRIPLETS
    progress: bool = True
    num_shards: int = 1  # job arrays: this task generates pipeline batches b % num_shards == shard_index
    shard_index: int = 0
    verify: str = DEFAULT_VERIFY  # how the manifests read (--splits, --id-features, --labels) are checked

    @property
    def partial(self) -> bool:
        """A job-array task (writes a part)."""
        return int(self.num_shards) > 1

    def settings(self) -> GeneratorSettings:
        """The generator settings (checked: steps, size, batch size)."""
        return GeneratorSettings(pipeline=self.pipeline, steps=self.steps, guidance_scale=self.guidance_scale,
                                 size=self.size, batch_size=self.batch_size, device=self.device)


@dataclass
class SynResult:
    """The manifest written, the run's summary counts, and the cells table (None for a part)."""

    manifest: Manifest
    summary: dict[str, Any] = field(default_factory=dict)
    cells: pd.DataFrame | None = None


def output_kinds(opts: SynOptions) -> tuple[str, ...]:
    """The kinds ``opts.out`` may hold for this run (``manifests.writing``): a part for one array task, the
    prompts manifest for --prompts-only, else Syn-IS (which replaces its own prompts-only manifest)."""
    if opts.partial:
        return (KIND_PART,)
    return (KIND_PROMPTS,) if opts.prompts_only else (KIND, KIND_PROMPTS)


def input_paths(opts: SynOptions) -> list[str]:
    """The files and folders the run reads, which ``--out`` may not be (or be inside, or hold)."""
    return [str(v) for v in (opts.id_features, opts.splits, opts.styles, opts.labels, opts.laid, opts.blocklist)
            if v and Path(str(v)).exists()]


def check_options(opts: SynOptions, *, engine: str = "local", custom_generator: bool = False) -> None:
    """One-line errors for options that contradict each other or the engine (by name); what ``opts.out`` may
    hold is checked by the writer (``output_kinds``)."""
    check_shard_args(opts.num_shards, opts.shard_index)
    if custom_generator and engine != "local":
        raise BadInputError(f"a custom generator runs only with the local engine, not {engine!r}")
    if opts.partial and opts.prompts_only:
        raise BadInputError("--num-shards splits image generation; --prompts-only runs once (drop --num-shards)")
    check_levels(opts.n_levels, "n_levels")
    check_verify_mode(opts.verify)
    for flag, value, least in (("--per-cell", opts.per_cell, 1), ("--images-per-prompt", opts.images_per_prompt, 1),
                               ("na_threshold", opts.na_threshold, 0), ("laid_triplets", opts.laid_triplets, 1)):
        if isinstance(value, bool) or not isinstance(value, Integral) or value < least:
            raise BadInputError(f"{flag} must be an integer >= {least}, got {value!r}")
    check_seed(opts.seed)
    opts.settings()
