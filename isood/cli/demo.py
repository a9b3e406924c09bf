"""isood CLI: `isood demo` — runs the steps of ``isood.dev.demo`` and prints their tables (stdout)."""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from rich.table import Table

from isood.cli._app import app, out_console
from isood.cli.options import command
from isood.cli.wordnet import summary_table
from isood.core.files import output_lock
from isood.core.optspec import option
from isood.core.shared_options import seed_option

if TYPE_CHECKING:
    from isood.dev.demo import PlantedReport

__all__ = ["demo", "report_table"]


def report_table(report: PlantedReport) -> Table:
    """The planted world's ground-truth checks (learned W vs a random orthogonal W) as a rich table."""
    t = Table(title="Planted world: LAID and shift against the ground truth")
    t.add_column("check")
    t.add_column("learned W", justify="right")
    t.add_column("random W", justify="right")
    for name, learned, rand in report.rows():
        t.add_row(name, f"{learned:.3f}", f"{rand:.3f}")
    t.add_row("Spearman(grid level, planted level): semantic / covariate",
              f"{report.level_agreement_sem:.3f} / {report.level_agreement_cov:.3f}", "")
    return t


def _warn(message: str) -> None:
    out_console.print(f"[yellow]warning:[/yellow] {message}", highlight=False, soft_wrap=True)


@dataclass(frozen=True, kw_only=True)
class DemoOptions:
    """`isood demo` (one description per option: ``isood.core.optspec``)."""

    out: str = option("demo-out", kind="path", metavar="DIR", help="Output directory for the demo manifests.")
    seed: int = seed_option("Seed of the planted world.")


@command(app, "demo", DemoOptions, config=False,
         help="Run the whole pipeline on the embedded default: the WordNet class filter and a planted synthetic "
              "world.")
def demo(opts: DemoOptions) -> None:
    with output_lock(opts.out):
        _run_demo(Path(opts.out), opts.seed)


def _run_demo(out: Path, seed: int) -> None:
    """The demo's steps, printing their tables (``isood demo``)."""
    # WordNet (nltk) and the evaluation (torch) take seconds to import: only when the command runs
    from isood.dev.demo import (FILTER_ARGS, FILTER_EXCLUDE, check_demo_out, run_class_filter, run_modality_gap,
                            run_planted)
    from isood.dev.planted import evaluate_planted, planted_table

    check_demo_out(out)  # every output the demo writes, before the first one

    console, t0 = out_console, time.perf_counter()
    with console.status(f"WordNet class filter: ImageNet-{FILTER_ARGS[0].upper()} candidates vs "
                        f"ImageNet-{FILTER_ARGS[1].upper()}"):
        class_filter = run_class_filter(out / "class-filter")
    console.print(summary_table(class_filter, f"ImageNet-OOD class filter ({FILTER_ARGS[0]} vs {FILTER_ARGS[1]}, "
                                              f"excluding {', '.join(FILTER_EXCLUDE)})"))
    world, result, report = run_planted(out, seed=seed, warn=_warn)
    console.print(report_table(report))
    cells = result.cells
    console.print(f"splits: {result.n_test} test images in {len(cells)} cells ({int(cells['na'].sum())} N/A), "
                  f"LAID fit {report.extra['fit_seconds']} s, ||W^T W - I|| = {report.extra['orthogonality_error']:.4f}")
    with console.status("Evaluation: OOD detectors per cell on the planted world"):
        ev = evaluate_planted(world, result.manifest, out / "evaluation", seed=seed)
    console.print(planted_table(ev))
    n_detectors = len(ev.evaluation.detectors)
    console.print(f"evaluation: {out}/evaluation/report.html ({n_detectors} detectors, "
                  f"{int((~ev.evaluation.per_cell['na']).sum()) // n_detectors} measured cells)")
    gap = run_modality_gap(seed)
    cos = gap.cosines
    console.print(f"Syn-IS on a CLIP-like world (cosine caption/own image {cos['caption_image']:.2f}, text/text "
                  f"{cos['text_text']:.2f}, image/image {cos['image_image']:.2f}): prompts in "
                  f"{gap.cells_on_splits_edges}/{gap.n_cells} cells on the image grid's edges "
                  f"({len(gap.warnings)} warnings), {gap.cells_on_prompt_edges}/{gap.n_cells} on their own "
                  f"(generate-syn's default)")
    console.print(f"manifests under {out}/ (verify with `isood verify {out}/splits`); total "
                  f"{time.perf_counter() - t0:.1f} s")
