"""The generate-syn stage, step by step: check -> load -> prompts (pure) -> measure -> plan (pure) -> generate
(through an engine) -> write. See ``isood.stages.syn`` for the output layout."""

from __future__ import annotations

import os
from dataclasses import asdict
from pathlib import Path
from typing import Any, Callable

import pandas as pd

import manifests
from generation.outputs import prune_images
from generation.prompts import apply_blocklist, build_prompts
from generation.safety import load_image_checker
from generation.fingerprint import plan_fingerprint
from generation.sdxl import generate_images
from isood.stages.syn.edges import PromptEdges, choose_edges, spread_warnings
from isood.stages.syn.load import SynInputs, load_inputs, measure_prompts
from isood.stages.syn.options import (KIND, KIND_PART, KIND_PROMPTS, SynOptions, SynResult, check_options,
                                    input_paths, output_kinds)
from isood.stages.syn.steps import PromptPlan, n_batches, plan_prompts, rejected_rows, split_generated, task_rows
from isood.stages.syn.write import write_part, write_syn_manifest
from isood.core.defaults import NA_THRESHOLD
from isood.core.errors import BadInputError
from isood.science.grid import edges_table
from isood.core.engine import BatchEngine, LocalEngine
from isood.kinds import SplitsView
from isood.core.workers import resolve_workers
from isood.core.optconfig import absolute_spec
from isood.core.parts import part_info

__all__ = ["run_generate_syn", "candidate_prompts", "generate_step", "prompt_edges", "na_threshold", "syn_config",
           "input_records"]


def candidate_prompts(inputs: SynInputs) -> tuple[pd.DataFrame, pd.DataFrame]:
    """Every style x label prompt, split into (kept, blocklisted) by the prompt blocklist."""
    kept, blocked = apply_blocklist(build_prompts(inputs.labels.frame, inputs.styles), inputs.blocklist)
    if kept.empty:
        raise BadInputError("every prompt was blocklisted; pass other --labels or a smaller --blocklist")
    return kept, blocked


def generate_step(plan: pd.DataFrame, opts: SynOptions, root: Path, *, engine: BatchEngine,
                  generator: Callable | None, image_checker: Callable | None,
                  on_image: Callable[[dict], None] | None) -> tuple[pd.DataFrame, pd.DataFrame, dict, dict]:
    """Generate this task's share of the image plan into ``root`` (the stage's work folder,
    ``manifests.writing``); returns ``(images, image rejections, generation counts, generator config)``."""
    settings = opts.settings()
    mine = (task_rows(plan, batch_size=opts.batch_size, num_shards=opts.num_shards, shard_index=opts.shard_index)
            if opts.partial else plan)
    checker: Callable | str | None = image_checker or opts.safety_checker
    if isinstance(checker, str):
        load_image_checker(checker)  # a bad name fails here, in one line; each worker imports it itself
    fingerprint = plan_fingerprint(settings, generator=generator, engine=engine)
    result = generate_images(mine, root, settings=settings, fingerprint=fingerprint, generator=generator,
                             engine=engine, image_checker=checker, on_image=on_image, progress=opts.progress)
    prune_images(root, set(mine["path"]))
    images, rejected = split_generated(mine, sha256=result.sha256, rejected=result.rejected)
    counts = {**result.as_dict(), "images": len(images)}
    return images, rejected, counts, {"settings": asdict(settings), "fingerprint": fingerprint}


def _recorded_path(value: str) -> str:
    """A name-or-file option as the manifest records it: a file or folder absolute (explicit roots), a name as is."""
    return os.path.abspath(value) if value and os.path.exists(value) else value


def prompt_edges(opts: SynOptions, splits: SplitsView | None, d_sem, d_cov) -> PromptEdges:
    """The edges of ``--prompt-edges`` (``isood.stages.syn.edges``) with the levels and quantile clip the splits
    manifest chose (its typed view), else ``--levels`` and the grid's default clip."""
    if splits is None:
        return choose_edges(d_sem, d_cov, mode=opts.prompt_edges, n_levels=opts.levels)
    images = splits.images
    return choose_edges(d_sem, d_cov, mode=opts.prompt_edges, n_levels=splits.n_levels, clip=splits.clip_quantile,
                        splits_edges=(splits.axis_edges("sem"), splits.axis_edges("cov")),
                        splits_distances=(images["d_sem"].to_numpy(), images["d_cov"].to_numpy()))


def na_threshold(opts: SynOptions, splits: SplitsView | None) -> tuple[int, str]:
    """The N/A threshold of the cells and where it came from: ``--na-threshold``, else the splits manifest's
    (its typed view), else the grid's default."""
    if opts.na_threshold is not None:
        return int(opts.na_threshold), "--na-threshold"
    if splits is not None:
        return splits.na_threshold, "splits"
    return NA_THRESHOLD, "default"


def syn_config(opts: SynOptions, inputs: SynInputs, plan: PromptPlan, edges: PromptEdges, *, generator_config: dict,
               engine: BatchEngine, image_checker: Callable | None) -> dict[str, Any]:
    """The manifest's ``command.config``: every option that shapes the content, and where the inputs came from."""
    laid = inputs.laid
    threshold, threshold_from = na_threshold(opts, inputs.splits)
    config = {
        "styles": _recorded_path(str(opts.styles)), "style_names": [s.name for s in inputs.styles],
        "labels": _recorded_path(str(opts.labels)),
        "clip": absolute_spec(inputs.clip_spec), "clip_identity": inputs.encoder.identity,
        "laid": laid.origin if laid.origin == "trained" else os.path.abspath(laid.origin),
        "laid_config": laid.laid.config, "id_features": os.path.abspath(inputs.id_features),
        "splits": os.path.abspath(opts.splits) if opts.splits else None, "per_cell": opts.per_cell,
        "images_per_prompt": opts.images_per_prompt, "seed": opts.seed, "n_levels": plan.n_levels,
        "na_threshold": threshold, "na_threshold_from": threshold_from, "edges_from": edges.mode,
        "prompt_edges": edges.as_config(),
        "blocklist": {"default": opts.default_blocklist, "terms": len(inputs.blocklist),
                      "file": _recorded_path(opts.blocklist) if opts.blocklist else None},
        "safety_checker": opts.safety_checker or (getattr(image_checker, "__name__", "custom")
                                                  if image_checker else None),
        "generator": generator_config or {"settings": asdict(opts.settings()), "generated": False},
        "engine": engine.name,
    }
    config["generator"] = {**config["generator"], "settings": {**config["generator"]["settings"],
                                                               "pipeline": absolute_spec(opts.pipeline)}}
    if engine.name != "local":  # the actors in its workers entry (the pipeline decodes no image: 0 processes)
        config["workers"] = resolve_workers(0, engine).as_config()
        config[engine.name] = engine.as_config()
    return config


def input_records(opts: SynOptions, inputs: SynInputs) -> list[dict]:
    """The manifest's inputs: the ID features and every input given as an existing file or folder."""
    records = [manifests.input_record("id_features", inputs.id_features)]
    for name, value in (("styles", opts.styles), ("labels", opts.labels), ("laid", inputs.laid.source),
                        ("splits", opts.splits), ("blocklist", opts.blocklist)):
        if value and Path(str(value)).exists():
            records.append(manifests.input_record(name, value))
    return records


def _summary(inputs: SynInputs, plan: PromptPlan, blocked: pd.DataFrame, notes: list[str]) -> dict[str, Any]:
    return {"labels": len(inputs.labels), "styles": len(inputs.styles),
            "prompts": int(len(plan.prompts) + len(blocked)), "prompts_blocklisted": len(blocked),
            "prompts_sampled": len(plan.sampled), "images_planned": len(plan.images),
            "laid_fit_seconds": inputs.laid.fit_seconds, "laid_from": _laid_from(inputs), "warnings": notes}


def _laid_from(inputs: SynInputs) -> str:
    """Where the LAID map came from: ``trained`` here, the ``splits`` manifest's, or the ``--laid`` file."""
    if inputs.laid.origin == "trained":
        return "trained"
    splits_laid = inputs.splits.laid_path if inputs.splits is not None else None
    return "splits" if splits_laid and str(splits_laid) == inputs.laid.source else "--laid"


def run_generate_syn(opts: SynOptions, *, engine: BatchEngine | None = None, generator: Callable | None = None,
                     image_checker: Callable | None = None, on_image: Callable[[dict], None] | None = None,
                     warn: Callable[[str], None] | None = None, argv: list[str] | None = None) -> SynResult:
    """Run the Syn-IS stage (``isood.stages.syn``). ``engine``: where the images are generated (default
    ``LocalEngine()``; the CLI builds ``isood.engines.ray.RayEngine`` for ``--engine ray``). ``generator``
    replaces the SDXL pipeline (local engine; tests); ``image_checker`` is a safety checker callable (else
    ``opts.safety_checker`` is imported); ``on_image(row)`` runs after each image is written (local engine);
    ``warn(message)`` reports a warning (also kept in the summary)."""
    engine = engine or LocalEngine()
    opts = check_options(opts, engine=engine.name, custom_generator=generator is not None)
    if opts.safety_checker and image_checker is None and not opts.prompts_only:
        load_image_checker(opts.safety_checker)  # an unusable checker is refused before anything is loaded
    with manifests.writing(opts.out, output_kinds(opts), inputs=input_paths(opts)) as o:
        summary, cells = _run(opts, o.work, engine=engine, generator=generator, image_checker=image_checker,
                              on_image=on_image, warn=warn, argv=argv)
    kind = KIND_PART if opts.partial else (KIND_PROMPTS if opts.prompts_only else KIND)
    return SynResult(manifest=manifests.read(o.final, kind=kind), summary=summary, cells=cells)


def _run(opts: SynOptions, out: Path, *, engine: BatchEngine, generator: Callable | None,
         image_checker: Callable | None, on_image: Callable[[dict], None] | None,
         warn: Callable[[str], None] | None, argv: list[str] | None) -> tuple[dict, pd.DataFrame | None]:
    """The stage in its work folder ``out``: load -> prompts -> measure -> plan -> generate -> write."""
    notes: list[str] = []

    def note(message: str) -> None:
        notes.append(message)
        if warn is not None:
            warn(message)

    inputs = load_inputs(opts, warn=note)
    kept, blocked = candidate_prompts(inputs)
    d_sem, d_cov = measure_prompts(inputs, kept["prompt"], device=opts.device, progress=opts.progress)
    edges = prompt_edges(opts, inputs.splits, d_sem, d_cov)
    for message in spread_warnings(d_sem, d_cov, edges):
        note(message)
    plan = plan_prompts(kept, d_sem, d_cov, n_levels=len(edges.sem) - 1, sem_edges=edges.sem, cov_edges=edges.cov,
                        per_cell=opts.per_cell, images_per_prompt=opts.images_per_prompt, seed=opts.seed)
    summary = _summary(inputs, plan, blocked, notes)
    rejected = [rejected_rows(blocked, "prompt")]
    gen_config: dict[str, Any]
    if opts.prompts_only:
        images, gen_config = plan.images.assign(sha256=""), {}
    else:
        images, img_rejected, counts, gen_config = generate_step(plan.images, opts, out, engine=engine,
                                                                 generator=generator, image_checker=image_checker,
                                                                 on_image=on_image)
        rejected.append(img_rejected)
        summary.update(counts)
    config = syn_config(opts, inputs, plan, edges, generator_config=gen_config, engine=engine,
                        image_checker=image_checker)
    tables = dict(images=images, prompts=plan.prompts, edges=edges_table(plan.sem_edges, plan.cov_edges),
                  rejected=pd.concat(rejected, ignore_index=True))
    laid_files = inputs.laid.laid.files()
    if opts.partial:
        config["part"] = part_info(opts.num_shards, opts.shard_index, n_batches(len(plan.images), opts.batch_size),
                                   "generation batch")
        write_part(out, **tables, plan=plan.images, config=config, inputs=input_records(opts, inputs),
                   laid_files=laid_files, summary=summary, argv=argv)
        return summary, None
    manifest, cells = write_syn_manifest(out, **tables, config=config, inputs=input_records(opts, inputs),
                                         laid_files=laid_files, summary=summary, prompts_only=opts.prompts_only,
                                         argv=argv)
    summary["cells_not_na"] = manifest.meta["summary"]["cells_not_na"]
    return summary, cells
