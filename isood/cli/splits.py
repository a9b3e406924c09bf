"""isood CLI: `isood build-splits` (the stage is ``isood.stages.splits``)."""

from __future__ import annotations

from isood.cli._app import app, console, out_console
from isood.cli.options import command
from isood.stages.splits import SplitsOptions, build_splits as run_build_splits

__all__ = ["build_splits", "print_warning", "ann_line"]


def print_warning(message: str) -> None:
    """A stage warning as one yellow line on stderr."""
    console.print(f"[yellow]warning:[/yellow] {message}", highlight=False, soft_wrap=True)


def ann_line(ann: dict) -> str:
    """The ``ann`` summary of a splits manifest in one line: recall@1 on the held-out images, and the share of
    images whose cell / level equals an exact build's with its confidence interval (older manifests record
    the agreement at the build's own edges only)."""
    axes = ann["axes"]
    if ann.get("held_out_check") is False or not ann.get("held_out_images", 1):
        levels = next((v.get("target_levels") for v in axes.values()), None)
        target = f"--ann-recall {ann['target_recall']:g}" if ann.get("target_recall") is not None else \
            f"--ann-levels {levels:g}" if levels is not None else "tuned"
        return (f"approximate search ({target}): too few images to tune on, every image was searched exactly; no "
                "held-out check was possible (no interval)")
    recall = " / ".join(f"{a} {v['recall_heldout']:.4f}" for a, v in axes.items())
    if ann.get("target_levels") is not None:
        bound = " / ".join(f"{a} {v['levels_heldout']:.4%} (one-sided {v['bound_confidence']:.0%} lower bound "
                           f"{v['levels_heldout_lower']:.4%}, searched exactly near an edge {v['exact_share']:.1%})"
                           for a, v in axes.items())
        option = f"--ann-levels {ann['target_levels']:g}"
        recall = f"{recall}; held-out levels {bound}"
    else:
        option = f"--ann-recall {ann['target_recall']:g}"
    text = f"approximate search ({option}) on {ann['held_out_images']} held-out images: recall@1 {recall}"
    if "cell_agreement_ci" not in ann:
        return text + ", cell agreement {:.2%} (at this build's edges)".format(ann["cell_agreement"])
    lo, hi = ann["cell_agreement_ci"]
    return text + (
        "; images in the cell an exact build gives them: {:.2%} ({:.0%} CI {:.2%} to {:.2%}), levels {}; edges moved "
        "by up to {}; at this build's edges: {:.2%}").format(
        ann["cell_agreement"], ann["confidence"], lo, hi,
        " / ".join(f"{a} {v['level_agreement']:.2%}" for a, v in axes.items()),
        " / ".join(f"{a} {v['edge_shift']:.4g}" for a, v in axes.items()), ann["cell_agreement_fixed_edges"])


@command(app, "build-splits", SplitsOptions,
         help="Measure each test image's semantic and covariate shift to the ID set and bin them into an 8x8 grid.")
def build_splits(cfg: SplitsOptions) -> None:
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
