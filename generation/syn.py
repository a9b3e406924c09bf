"""The `isood generate-syn` job: styles x labels -> binned prompts -> SDXL-Turbo images -> a Syn-IS manifest.

Steps (IS-OOD, Syn-IS): build prompts (generation.prompts), drop blocklisted ones (generation.safety), encode
each prompt with the same CLIP as the image splits, split it with LAID (given, taken from the splits manifest,
or trained here on labels x CLIP templates), measure D_sem / D_cov against the ID image features, bin with the
splits' edges (else the prompts' own), sample K prompts per cell, generate M images per prompt
(generation.sdxl), and write a ``syn-is`` manifest whose file list covers every image (``isood verify``).

Output directory::

    manifest.json, README.md             (kind syn-is; --prompts-only: kind syn-is-prompts, no card)
    data/images.parquet                  path, prompt, negative_prompt, style, wnid, label, prompt_id,
                                         image_index, seed, d_sem, d_cov, sem_level, cov_level, cell, sha256
    data/prompts.parquet                 every candidate prompt with its shift, levels and `selected`
    data/cells.parquet                   cell, cov_level, sem_level, n (images), na, prompts_available, prompts_sampled
    data/edges.parquet                   axis (sem|cov), level, lower, upper (the splits format)
    data/rejected.parquet                stage (prompt|image), path, prompt_id, style, wnid, label, prompt, reason
    laid.safetensors (+ laid.json)       the LAID map used
    lists/cov_{c}_sem_{s}.txt            image paths per non-empty cell
    images/<style>/<prompt_id>_<i>.png   the images
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

import numpy as np
import pandas as pd

from generation.prompts import (
    apply_blocklist,
    bin_prompts,
    build_prompts,
    expand_images,
    load_labels,
    sample_per_cell,
)
from generation.safety import PromptBlocklist
from generation.sdxl import DEFAULT_PIPELINE, GeneratorSettings, SDXLGenerator, generate_images, prune_images
from generation.styles import load_styles
from isood.errors import IsoodError

KIND = "syn-is"
KIND_PROMPTS = "syn-is-prompts"
N_LEVELS = 8
NA_THRESHOLD = 10
LAID_FILE = "laid.safetensors"
DEFAULT_LAID_TRIPLETS = 10_000  # as isood.pipeline.DEFAULT_TRIPLETS: same recipe, same W
IMAGE_COLUMNS = ["path", "prompt", "negative_prompt", "style", "wnid", "label", "prompt_id", "image_index", "seed",
                 "d_sem", "d_cov", "sem_level", "cov_level", "cell", "sha256"]
REJECTED_COLUMNS = ["stage", "path", "prompt_id", "style", "wnid", "label", "prompt", "reason"]


@dataclass
class SynOptions:
    """Everything `isood generate-syn` takes (CLI flags map 1:1)."""

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
    n_levels: int = N_LEVELS
    na_threshold: int = NA_THRESHOLD
    blocklist: str | None = None
    default_blocklist: bool = True
    safety_checker: str | None = None
    laid_triplets: int = DEFAULT_LAID_TRIPLETS
    progress: bool = True


@dataclass
class SynResult:
    manifest: Any
    summary: dict = field(default_factory=dict)
    cells: pd.DataFrame | None = None


# ------------------------------------------------------------------------------------------------ inputs
def read_splits(path: str | Path) -> dict[str, Any]:
    """Edges (per axis, as written by `isood build-splits`), n_levels, CLIP spec and LAID file of a splits manifest."""
    import manifests
    from isood.pipeline import read_edges

    m = manifests.read(path)
    if "edges" not in m.tables:
        raise IsoodError(f"--splits {path}: manifest ({m.kind}) has no 'edges' table; pass a build-splits output")
    edges = m.frame("edges")
    if not {"axis", "level", "lower", "upper"} <= set(edges.columns):
        raise IsoodError(f"--splits {path}: edges table lacks axis/level/lower/upper columns; pass a build-splits output")
    sem_edges, cov_edges = read_edges(edges, "sem"), read_edges(edges, "cov")
    if len(sem_edges) != len(cov_edges):
        raise IsoodError(f"--splits {path}: sem and cov have different numbers of levels ({len(sem_edges) - 1} vs {len(cov_edges) - 1})")
    cfg = (m.meta.get("command") or {}).get("config") or {}
    has_laid = any(r["path"] == LAID_FILE for r in m.meta["files"])
    from isood.features import is_feature_dir

    id_features = None  # the ID features build-splits used: extracted into the splits folder, or given to it
    for candidate in (m.root / "features-id", cfg.get("id")):
        if candidate and Path(candidate).exists() and is_feature_dir(candidate):
            id_features = str(candidate)
            break
    return {
        "sem_edges": sem_edges,
        "cov_edges": cov_edges,
        "n_levels": len(sem_edges) - 1,
        "clip": cfg.get("clip"),
        "laid_path": str(m.path(LAID_FILE)) if has_laid else None,
        "version": m.dataset_version,
        "id_features": id_features,
    }


def edges_table(sem_edges: np.ndarray, cov_edges: np.ndarray) -> pd.DataFrame:
    """The splits manifests' edges format: axis ('sem'|'cov'), level, lower, upper."""
    n = len(sem_edges) - 1
    return pd.DataFrame({
        "axis": ["sem"] * n + ["cov"] * n,
        "level": np.concatenate([np.arange(n)] * 2).astype(np.int64),
        "lower": np.concatenate([sem_edges[:-1], cov_edges[:-1]]).astype(np.float64),
        "upper": np.concatenate([sem_edges[1:], cov_edges[1:]]).astype(np.float64),
    })


# ------------------------------------------------------------------------------------------------ the job
def run_generate_syn(
    opts: SynOptions,
    *,
    generator: Callable | None = None,
    image_checker: Callable | None = None,
    on_image: Callable[[dict], None] | None = None,
    console=None,
) -> SynResult:
    """Run the whole Syn-IS job (see the module docstring). ``generator`` replaces the SDXL pipeline (tests);
    ``image_checker`` is a safety checker callable (else ``opts.safety_checker`` is imported)."""
    import manifests
    from generation.safety import load_image_checker
    from isood.pipeline import laid_files, train_laid_from_labels

    from rich.console import Console

    console = console or Console(stderr=True)
    notes: list[str] = []

    def warn(msg: str) -> None:
        notes.append(msg)
        console.print(f"[yellow]warning:[/yellow] {msg}", highlight=False, soft_wrap=True)

    out = Path(opts.out)
    splits = read_splits(opts.splits) if opts.splits else None
    id_features = opts.id_features or (splits or {}).get("id_features")
    if not id_features:
        raise IsoodError(
            "generate-syn needs the ID image features to measure each prompt's shift: pass --id-features DIR "
            "(features of the in-distribution images, e.g. ImageNet-1K, extracted with the same --clip), "
            "or --splits of a build-splits run that extracted them"
        )
    previous = manifests.existing_kind(out)
    if previous not in (None, KIND, KIND_PROMPTS):
        raise IsoodError(f"--out {out} holds a {previous!r} manifest; pass another --out (Syn-IS never overwrites other kinds)")
    if opts.prompts_only and previous == KIND:
        raise IsoodError(f"{out} holds a generated Syn-IS set; pass another --out for --prompts-only")
    if opts.per_cell < 1:
        raise IsoodError(f"--per-cell must be >= 1, got {opts.per_cell}")
    settings = GeneratorSettings(pipeline=opts.pipeline, steps=opts.steps, guidance_scale=opts.guidance_scale,
                                 size=opts.size, batch_size=opts.batch_size, device=opts.device)

    # 1. prompts
    styles = load_styles(opts.styles)
    labels = load_labels(opts.labels)
    candidates = build_prompts(labels, styles)
    blocklist = PromptBlocklist.build(opts.blocklist, use_default=opts.default_blocklist)
    candidates, blocked = apply_blocklist(candidates, blocklist)
    if candidates.empty:
        raise IsoodError("every prompt was blocklisted; pass other --labels or a smaller --blocklist")

    # 2. shift of every prompt
    from isood.features import encode_texts, load_clip, load_features
    from isood.laid import LAID
    from isood.shift import shift_distances

    clip_spec = opts.clip or (splits or {}).get("clip")
    if not clip_spec:
        raise IsoodError("pass --clip MODEL:PRETRAINED or local-dir:PATH (the CLIP used for the image splits)")
    id_feats, _ = load_features(id_features)
    if len(id_feats) == 0:
        raise IsoodError(f"--id-features {id_features} holds no features; extract the ID images first")
    encoder = load_clip(clip_spec, device=opts.device)
    if encoder.embed_dim != id_feats.shape[1]:
        raise IsoodError(
            f"--clip {clip_spec} gives {encoder.embed_dim}-d features but --id-features holds {id_feats.shape[1]}-d; "
            "pass the CLIP the ID features were extracted with"
        )
    laid_source = opts.laid or (splits or {}).get("laid_path")
    fit_seconds = None
    if laid_source:
        laid = LAID.load(laid_source)
        laid_origin = str(laid_source)
        trained_with = laid.config.get("clip_identity")
        if laid.dim != encoder.embed_dim:
            raise IsoodError(f"--laid W is {laid.dim}x{laid.dim} but --clip {clip_spec} gives {encoder.embed_dim}-d "
                             "features; pass the LAID fitted for this CLIP")
        if trained_with not in (None, encoder.identity):
            warn(f"LAID {laid_source} was trained with {trained_with}, not {encoder.identity}")
    else:
        laid, fit_seconds = train_laid_from_labels(encoder, list(labels["label"]), labels_from=f"--labels {opts.labels}",
                                                   triplets=opts.laid_triplets, seed=opts.seed, progress=opts.progress)
        laid_origin = "trained"
    text_feats = encode_texts(encoder, list(candidates["prompt"]), progress=opts.progress, description="encoding prompts")
    d_sem, d_cov = shift_distances(text_feats, id_feats, laid, device=None if opts.device in (None, "auto") else opts.device)

    # 3. levels and sampling
    n_levels = splits["n_levels"] if splits else opts.n_levels
    binned, sem_edges, cov_edges = bin_prompts(
        candidates, d_sem, d_cov, n_levels=n_levels,
        sem_edges=splits["sem_edges"] if splits else None, cov_edges=splits["cov_edges"] if splits else None,
    )
    sampled = sample_per_cell(binned, opts.per_cell, seed=opts.seed)
    binned["selected"] = binned["prompt_id"].isin(set(sampled["prompt_id"]))
    plan = expand_images(sampled, opts.images_per_prompt, opts.seed)

    rejected = [_rejected_rows(blocked, "prompt")]
    out.mkdir(parents=True, exist_ok=True)
    manifests.park(out)

    summary: dict[str, Any] = {
        "labels": len(labels), "styles": len(styles), "prompts": int(len(binned) + len(blocked)),
        "prompts_blocklisted": len(blocked), "prompts_sampled": len(sampled), "images_planned": len(plan),
        "laid_fit_seconds": fit_seconds, "warnings": notes,
    }
    gen_config: dict[str, Any] = {}
    if opts.prompts_only:
        images = plan.assign(sha256="")
    else:
        gen = generator if generator is not None else SDXLGenerator.load(settings)
        checker = image_checker or (load_image_checker(opts.safety_checker) if opts.safety_checker else None)
        fingerprint = gen.fingerprint if hasattr(gen, "fingerprint") else {"generator": type(gen).__name__,
                                                                           "size": opts.size, "steps": opts.steps}
        result = generate_images(plan, out, gen, fingerprint=fingerprint, size=opts.size, batch_size=opts.batch_size,
                                 image_checker=checker, on_image=on_image, progress=opts.progress)
        prune_images(out, set(plan["path"]))
        ok = ~plan["path"].isin(set(result.rejected))
        images = plan[ok].assign(sha256=[result.sha256[p] for p in plan.loc[ok, "path"]])
        img_rej = plan[~ok].assign(reason=[result.rejected[p] for p in plan.loc[~ok, "path"]])
        rejected.append(_rejected_rows(img_rej, "image"))
        gen_config = {"settings": {**settings.__dict__}, "fingerprint": fingerprint}
        summary.update(result.as_dict())
        summary["images"] = len(images)

    images = images[IMAGE_COLUMNS].reset_index(drop=True)
    cells = _cells(images, binned, sampled, n_levels, opts.na_threshold)
    summary["cells_not_na"] = int((~cells["na"]).sum())
    tables = {
        "images": images,
        "prompts": binned.reset_index(drop=True),
        "cells": cells,
        "edges": edges_table(sem_edges, cov_edges),
        "rejected": pd.concat(rejected, ignore_index=True)[REJECTED_COLUMNS],
    }
    config = {
        "styles": opts.styles, "style_names": [s.name for s in styles], "labels": str(opts.labels),
        "clip": clip_spec, "clip_identity": encoder.identity, "laid": laid_origin, "laid_config": laid.config,
        "id_features": str(id_features), "splits": str(opts.splits) if opts.splits else None,
        "per_cell": opts.per_cell, "images_per_prompt": opts.images_per_prompt, "seed": opts.seed,
        "n_levels": n_levels, "na_threshold": opts.na_threshold, "edges_from": "splits" if splits else "prompts",
        "blocklist": {"default": opts.default_blocklist, "file": opts.blocklist, "terms": len(blocklist)},
        "safety_checker": opts.safety_checker or (getattr(image_checker, "__name__", "custom") if image_checker else None),
        "generator": gen_config or {"settings": {**settings.__dict__}, "generated": False},
    }
    inputs = [manifests.input_record("id_features", id_features)]
    for name, value in (("styles", opts.styles), ("labels", opts.labels), ("laid", laid_source),
                        ("splits", opts.splits), ("blocklist", opts.blocklist)):
        if value and Path(str(value)).exists():
            inputs.append(manifests.input_record(name, value))

    manifests.unpark(out)
    if opts.prompts_only:
        manifest = manifests.write_manifest(out, kind=KIND_PROMPTS, tables=tables, config=config, inputs=inputs,
                                            files=laid_files(laid), summary=summary, note="Syn-IS prompts")
    else:
        from manifests.card import write_with_card

        lists = {f"lists/{cell}.txt": "".join(f"{p}\n" for p in group["path"])
                 for cell, group in images.groupby("cell", sort=True)}
        manifest = write_with_card(out, kind=KIND, tables=tables, config=config, inputs=inputs,
                                   files={**lists, **laid_files(laid)}, existing_files=list(images["path"]), summary=summary,
                                   note="Syn-IS images", title="Syn-IS", na_threshold=opts.na_threshold)
    return SynResult(manifest=manifest, summary=summary, cells=cells)


def _rejected_rows(df: pd.DataFrame, stage: str) -> pd.DataFrame:
    out = pd.DataFrame({c: (df[c] if c in df.columns else "") for c in REJECTED_COLUMNS if c != "stage"},
                       index=df.index)
    out.insert(0, "stage", stage)
    if "path" not in df.columns:
        out["path"] = ""
    return out.reset_index(drop=True).astype({c: str for c in REJECTED_COLUMNS})


def _cells(images: pd.DataFrame, binned: pd.DataFrame, sampled: pd.DataFrame, n_levels: int, na_threshold: int) -> pd.DataFrame:
    from isood.grid import cell_table

    cells = cell_table(images["cov_level"].to_numpy(), images["sem_level"].to_numpy(), n_levels, na_threshold)
    avail = binned.groupby("cell").size()
    taken = sampled.groupby("cell").size()
    cells["prompts_available"] = cells["cell"].map(avail).fillna(0).astype(np.int64)
    cells["prompts_sampled"] = cells["cell"].map(taken).fillna(0).astype(np.int64)
    return cells


def summary_table(result: SynResult):
    """A rich table of the run's counts and the per-cell image grid (rows: covariate level, columns: semantic)."""
    from rich.table import Table

    table = Table(title="Syn-IS", show_header=True)
    table.add_column("what")
    table.add_column("value", justify="right")
    for key, value in result.summary.items():
        table.add_row(key, f"{value}")
    if result.cells is not None and len(result.cells):
        n = int(result.cells["cov_level"].max()) + 1
        grid = Table(title="images per cell (N/A: fewer than the threshold)")
        grid.add_column("cov \\ sem")
        for s in range(n):
            grid.add_column(str(s), justify="right")
        for c in range(n):
            row = result.cells[result.cells["cov_level"] == c].sort_values("sem_level")
            grid.add_row(str(c), *[f"{k}" + ("*" if na else "") for k, na in zip(row["n"], row["na"])])
        from rich.console import Group

        return Group(table, grid)
    return table
