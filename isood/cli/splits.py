"""isood CLI: `isood build-splits` (the stage is ``isood.stages.splits``)."""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer

from isood.cli._app import VERIFY_HELP, app, console, out_console
from isood.stages.splits import build_splits as run_build_splits, load_build_config

__all__ = ["build_splits", "print_warning", "ann_line"]


def print_warning(message: str) -> None:
    """A stage warning as one yellow line on stderr."""
    console.print(f"[yellow]warning:[/yellow] {message}", highlight=False, soft_wrap=True)


def ann_line(ann: dict) -> str:
    """The ``ann`` summary of a splits manifest in one line: recall@1 on the held-out images, and the share of
    images whose cell / level equals an exact build's with its confidence interval (older manifests record
    the agreement at the build's own edges only)."""
    axes = ann["axes"]
    recall = " / ".join(f"{a} {v['recall_heldout']:.4f}" for a, v in axes.items())
    text = f"approximate search (--ann-recall {ann['target_recall']:g}) on {ann['held_out_images']} held-out images: " \
           f"recall@1 {recall}"
    if "cell_agreement_ci" not in ann:
        return text + ", cell agreement {:.2%} (at this build's edges)".format(ann["cell_agreement"])
    lo, hi = ann["cell_agreement_ci"]
    return text + (
        "; images in the cell an exact build gives them: {:.2%} ({:.0%} CI {:.2%} to {:.2%}), levels {}; edges moved "
        "by up to {}; at this build's edges: {:.2%}").format(
        ann["cell_agreement"], ann["confidence"], lo, hi,
        " / ".join(f"{a} {v['level_agreement']:.2%}" for a, v in axes.items()),
        " / ".join(f"{a} {v['edge_shift']:.4g}" for a, v in axes.items()), ann["cell_agreement_fixed_edges"])


@app.command("build-splits")
def build_splits(
    id_source: Optional[str] = typer.Option(None, "--id", help="ID set: image folder / file list, or a feature set (isood extract output, or features.npy + index.parquet)."),
    test: Optional[str] = typer.Option(None, help="Test images (same forms as --id)."),
    clip: Optional[str] = typer.Option(None, help="CLIP encoder (MODEL:PRETRAINED, local-dir:PATH, hf-hub:...); needed to extract images or train LAID."),
    laid: Optional[str] = typer.Option(None, help="A trained LAID W (.safetensors); default: train it on label x template texts."),
    labels: Optional[str] = typer.Option(None, help="LAID labels: 21k (default), 1k, 21k-p, ..., a class-filter manifest, or a file (wnids or labels)."),
    class_filter: Optional[str] = typer.Option(None, help="Keep only test images whose wnid this class-filter manifest keeps."),
    exclude_id_classes: Optional[bool] = typer.Option(None, "--exclude-id-classes/--keep-id-classes", help="Drop test images of ID wnids."),
    levels: Optional[int] = typer.Option(None, help="Levels per axis (default 8)."),
    na_threshold: Optional[int] = typer.Option(None, help="A cell with fewer images is N/A (default 10)."),
    clip_quantile: Optional[str] = typer.Option(None, help="Quantiles bounding the level range: LO,HI or LO (default 0.01,0.99)."),
    triplets: Optional[int] = typer.Option(None, help="LAID training triplets (default 10000)."),
    laid_steps: Optional[int] = typer.Option(None, help="LAID optimisation steps (default: isood.laid's)."),
    seed: Optional[int] = typer.Option(None, help="Seed of triplet sampling and LAID training (default 0)."),
    backend: Optional[str] = typer.Option(None, help="Nearest-neighbour backend: auto (exact; approximate IVF with --ann-recall), torch, faiss-flat, faiss-ivf (nprobe 32)."),
    ann_recall: Optional[float] = typer.Option(None, help="Search approximately, tuned to this recall@1 (e.g. 0.99) on a sample of the test images against exact search; the achieved recall and level agreement go into the manifest. Default: exact."),
    batch_size: Optional[int] = typer.Option(None, help="Images per batch when extracting (default 64)."),
    workers: Optional[int] = typer.Option(None, help="Image-decoding processes when extracting, running ahead of the model (default: CPUs - 1, at most 32; 0: decode in the model's process)."),
    shard_size: Optional[int] = typer.Option(None, help="Images per feature shard when extracting (default 10000)."),
    device: Optional[str] = typer.Option(None, help="cpu, cuda or cuda:N (default: cuda when available)."),
    cache_dir: Optional[str] = typer.Option(None, help="Text-feature cache (default $ISOOD_CACHE_DIR/text-features)."),
    out: Optional[Path] = typer.Option(None, help="Output directory (splits manifest)."),
    config: Optional[Path] = typer.Option(None, help="TOML file with any of these options (command-line values win)."),
    verify: Optional[str] = typer.Option(None, "--verify", help=VERIFY_HELP + " Default: fast."),
) -> None:
    """Measure each test image's semantic and covariate shift to the ID set and bin them into an 8x8 grid."""
    cfg = load_build_config(config, dict(
        id=id_source, test=test, clip=clip, laid=laid, labels=labels, class_filter=class_filter,
        exclude_id_classes=exclude_id_classes, levels=levels, na_threshold=na_threshold, clip_quantile=clip_quantile,
        triplets=triplets, laid_steps=laid_steps, seed=seed, backend=backend, ann_recall=ann_recall,
        batch_size=batch_size, workers=workers,
        shard_size=shard_size, device=device, cache_dir=cache_dir, out=str(out) if out is not None else None,
        verify=verify,
    ))
    r = run_build_splits(cfg, warn=print_warning)
    n_ok = int((~r.cells["na"]).sum())
    out_console.print(
        f"{r.n_test} test images vs {r.n_id} ID images -> {n_ok}/{len(r.cells)} cells with >= {cfg.na_threshold} "
        f"images; {r.n_dropped} dropped; manifest: {cfg.out}",
        highlight=False,
    )
    ann = r.manifest.ann
    if ann:
        out_console.print(ann_line(ann), highlight=False, soft_wrap=True)
