"""The options and result of the generate-syn stage, and the checks of the options against each other and the
output folder (pure: they run before anything is loaded or written)."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pandas as pd

from generation.pipeline import MAX_SIZE, GeneratorSettings
from isood.stages.syn.edges import PROMPT_EDGE_MODES
from isood.core.defaults import DEFAULT_PIPELINE, LAID_TRIPLETS, NA_THRESHOLD
from isood.core.errors import BadInputError
from isood.kinds import SYN_IS, SYN_IS_PART, SYN_IS_PROMPTS
from isood.core.optconfig import LOCAL_DIR
from isood.core.shared_options import (EngineFields, JobArrayFields, batch_size_option, device_option, levels_option,
                                       na_threshold_option, out_option, seed_option, verify_option)
from isood.core.optspec import check, option
from isood.core.parts import check_shard_args
from manifests.store import Manifest

__all__ = ["KIND", "KIND_PROMPTS", "KIND_PART", "SynOptions", "SynResult", "check_options", "output_kinds",
           "input_paths"]

KIND, KIND_PROMPTS, KIND_PART = SYN_IS, SYN_IS_PROMPTS, SYN_IS_PART
#: The most images one prompt gets, and the most images one run may plan (--per-cell x cells x
#: --images-per-prompt): the plan is one table in memory (about 1 KB a row); the release's Syn-IS is 320,000.
MAX_IMAGES_PER_PROMPT, MAX_PLANNED_IMAGES = 10_000, 10_000_000


@dataclass(frozen=True, kw_only=True)
class SynOptions(EngineFields, JobArrayFields):
    """Everything `isood generate-syn` takes, one description per option (``isood.core.optspec``; the engine options
    build the engine the CLI passes to :func:`isood.stages.syn.run_generate_syn`; a job-array task generates the
    pipeline batches b % num_shards == shard_index)."""

    out: str = out_option("Output Syn-IS manifest directory.")
    styles: str = option("sdxl", metavar="STYLES", maybe_path=True,
                         help="Styles: sdxl, sdxl:NAME,NAME, FILE.json (SDXL style file) or FILE.json:NAME,NAME.")
    labels: str = option("21k", metavar="LABELS", maybe_path=True,
                         help="Labels: 21k, 1k, 21k-p, 12k, a class-filter manifest, or a file of wnids/labels.")
    clip: str | None = option(None, metavar="MODEL:PRETRAINED",
                              help="CLIP of the image splits: MODEL:PRETRAINED or local-dir:PATH (default: the "
                                   "--splits manifest's).")
    laid: str | None = option(None, kind="path", metavar="FILE",
                              help="LAID W (.safetensors); default: the --splits manifest's, else trained here.")
    id_features: str | None = option(None, kind="path", metavar="DIR",
                                     help="Features of the ID images (extraction output directory).")
    splits: str | None = option(None, kind="path", metavar="DIR",
                                help="An image-splits manifest: its CLIP, LAID, ID features, levels, quantile "
                                     "clip and N/A threshold.")
    prompt_edges: str = option(PROMPT_EDGE_MODES[0], choices=PROMPT_EDGE_MODES, metavar="MODE",
                               help="Edges the prompts are binned with: prompts (equal-width levels over the "
                                    "prompts' own clipped range, as the release's Syn-IS), splits (the --splits "
                                    "edges as they are: text-to-image distances lie beyond image-to-image edges) "
                                    "or calibrated (the --splits edges moved by the median prompt distance minus "
                                    "the median image distance, per axis).")
    per_cell: int = option(10, least=1, help="Prompts sampled per grid cell (seeded).")
    images_per_prompt: int = option(1, least=1, most=MAX_IMAGES_PER_PROMPT, help="Images generated per prompt.",
                                    why="each planned image is a row of the plan held in memory; sample more "
                                        "prompts (--per-cell) instead")
    pipeline: str = option(DEFAULT_PIPELINE, metavar="PIPELINE", help="diffusers pipeline: a Hub name or "
                                                                        "local-dir:PATH.")
    size: int = option(512, least=8, most=MAX_SIZE, help="Image height and width (a multiple of 8).")
    steps: int = option(1, least=1, help="Denoising steps.")
    guidance_scale: float = option(0.0, least=0.0, help="Classifier-free guidance (SDXL-Turbo: 0).")
    batch_size: int = batch_size_option("Images per pipeline call.", default=4)
    seed: int = seed_option("Global seed (prompt sampling, LAID training, per-image seeds).")
    prompts_only: bool = option(False, help="Write the binned prompt manifest without generating.")
    device: str | None = device_option()
    levels: int = levels_option("Levels per axis without --splits (with it: the splits' levels).")
    na_threshold: int | None = na_threshold_option(
        "A cell with fewer images is N/A (default: the --splits manifest's threshold, else 10).", from_manifest=True)
    blocklist: str | None = option(None, kind="path", metavar="FILE",
                                   help="Extra prompt blocklist terms, one per line.")
    default_blocklist: bool = option(True, secondary="--no-default-blocklist",
                                     help="Use the built-in prompt blocklist.")
    safety_checker: str | None = option(None, metavar="MODULE:FUNCTION",
                                        help="Image safety checker package.module:function (image, item) -> "
                                             "reason|None; imported and called (also from --config): it runs "
                                             "as trusted code, pass only code you would run yourself.")
    triplets: int = option(LAID_TRIPLETS, least=1, help="LAID training triplets (when LAID is trained here).")
    progress: bool = option(True, cli=False, help="Progress bars.")
    verify: str = verify_option()
    ray_actors: int | None = option(None, least=1, flag="--ray-workers", metavar="N",
                                    help="Ray engine: SDXL actors, one pipeline each (default: one per GPU, else "
                                         "per CPU).")

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


def check_options(opts: SynOptions, *, engine: str = "local", custom_generator: bool = False) -> SynOptions:
    """The checked options: every bound (``isood.core.optspec.check``, one line naming the flag), then the options
    that contradict each other or the engine (by name); what ``opts.out`` may hold is checked by the writer
    (``output_kinds``)."""
    opts = check(opts)
    check_shard_args(opts.num_shards, opts.shard_index)
    if custom_generator and engine != "local":
        raise BadInputError(f"a custom generator runs only with the local engine, not {engine!r}")
    if opts.prompt_edges != PROMPT_EDGE_MODES[0] and not opts.splits:
        raise BadInputError(f"--prompt-edges {opts.prompt_edges} bins on an image-splits manifest's edges: pass "
                            "--splits DIR (or --prompt-edges prompts)")
    if opts.partial and opts.prompts_only:
        raise BadInputError("--num-shards splits image generation; --prompts-only runs once (drop --num-shards)")
    most = int(opts.per_cell) * int(opts.levels) ** 2 * int(opts.images_per_prompt)
    if most > MAX_PLANNED_IMAGES:
        raise BadInputError(f"--per-cell {opts.per_cell} x {int(opts.levels) ** 2} cells x --images-per-prompt "
                            f"{opts.images_per_prompt} may plan {most:,} images, more than {MAX_PLANNED_IMAGES:,} "
                            "(the plan is held in memory); lower --per-cell or --images-per-prompt")
    pipeline = str(opts.pipeline)
    if (not opts.prompts_only and not custom_generator and pipeline.startswith(LOCAL_DIR)
            and not Path(pipeline[len(LOCAL_DIR):]).expanduser().is_dir()):
        raise BadInputError(f"--pipeline {pipeline}: no folder at {pipeline[len(LOCAL_DIR):]}; pass the folder of a "
                            "saved diffusers pipeline (model_index.json), or a Hub name")
    opts.settings()
    return opts
