"""``isood evaluate``: parse the options, run the evaluation stage, render its summary table."""

from __future__ import annotations

from dataclasses import replace
from typing import TYPE_CHECKING

from rich.table import Table

from isood.cli._app import app, out_console
from isood.cli.options import command
from isood.stages.evaluate.options import EvaluateOptions, check_options

if TYPE_CHECKING:  # the stage pulls in torch: imported when the command runs
    from isood.stages.evaluate.job import EvaluateResult

__all__ = ["evaluate", "with_benchmark", "signed", "summary_console_table", "sets_console_table"]


def signed(x: float) -> str:
    """A correlation as the console shows it: two decimals with its sign, 'n/a' when there is none (a constant level
    curve, too few measured levels)."""
    return "n/a" if x != x else f"{x:+.2f}"


def summary_console_table(result: EvaluateResult) -> Table:
    """A rich table of an ``isood.stages.evaluate.job.EvaluateResult``: per detector and dataset the mean AUROC /
    FPR@95 (and AUROC_M) over measured cells and the AUROC correlation with each axis' level (Table 1)."""
    ev = result.evaluation
    means, summary = ev.means, ev.summary
    assert means is not None and summary is not None, "CellEvaluation.__post_init__ computes both"
    t = Table(title="isood evaluate: mean over measured cells; Table 1 correlation of AUROC with the level")
    cols = ["detector", "dataset", "AUROC", "FPR@95", "corr sem", "corr cov"]
    with_m = "auroc_m" in means.columns
    if with_m:
        cols.insert(4, "AUROC_M")
    if result.sanity is not None:
        cols += ["AUROC random", "AUROC_M random"]
    for c in cols:
        t.add_column(c, justify="left" if c in ("detector", "dataset") else "right")
    corr = summary[summary["metric"] == "auroc"].set_index(["detector", "dataset", "axis"])["correlation"]
    san = result.sanity.set_index(["detector", "dataset"]) if result.sanity is not None else None
    for rec in means.itertuples(index=False):
        row = [rec.detector, rec.dataset, f"{rec.auroc:.3f}", f"{rec.fpr95:.3f}"]
        if with_m:
            row.append(f"{rec.auroc_m:.3f}")
        row += [signed(corr.get((rec.detector, rec.dataset, ax), float("nan"))) for ax in ("sem", "cov")]
        if san is not None:
            r = san.loc[(rec.detector, rec.dataset)]
            row += [f"{r['auroc_random']:.3f}", f"{r['auroc_m_random']:.3f}"]
        t.add_row(*row)
    return t


def sets_console_table(result: EvaluateResult) -> Table | None:
    """A rich table of the per-set rows (AUROC, FPR@95 per detector and OOD set, with OpenOOD's nearood /
    farood means), or None when there are none."""
    sets = result.set_metrics
    if sets is None or sets.empty:
        return None
    t = Table(title="isood evaluate: per OOD set (ID test vs the whole set)")
    for c in ("detector", "set", "group", "images", "AUROC", "FPR@95"):
        t.add_column(c, justify="left" if c in ("detector", "set", "group") else "right")
    for rec in sets.itertuples(index=False):
        t.add_row(rec.detector, rec.dataset, rec.group, str(rec.n), f"{rec.auroc:.3f}", f"{rec.fpr95:.3f}")
    return t


def with_benchmark(opts: EvaluateOptions) -> EvaluateOptions:
    """``opts`` with its ``--benchmark`` resolved under ``--data-root``: the benchmark's OOD sets and roots added
    to the ones given, its ID test set (and list root, labels) used where the options give none."""
    from isood.benchmarks.registry import get_benchmark
    from isood.benchmarks.resolve import resolve_benchmark

    assert opts.benchmark is not None and opts.data_root is not None, "check_options: they go together"
    r = resolve_benchmark(get_benchmark(opts.benchmark), opts.data_root, verify=opts.verify)
    own = opts.id_test is None
    return replace(opts, ood=(*opts.ood, *r.ood), ood_root=(*opts.ood_root, *r.ood_root),
                   id_test=r.id_test if own else opts.id_test,
                   id_test_root=r.id_test_root if own and opts.id_test_root is None else opts.id_test_root,
                   id_test_labels=r.id_test_labels if own and opts.id_test_labels is None else opts.id_test_labels)


@command(app, "evaluate", EvaluateOptions,
         help="Score OOD detectors on an ID test set and any OOD sets: per cell of every grid (level curves, Table 1, "
              "heatmaps), per set (OpenOOD-style near / far rows), and a report.")
def evaluate(opts: EvaluateOptions) -> None:
    check_options(opts)  # a bad option is refused before torch, timm or matplotlib load
    if opts.benchmark is not None:  # its sets found under --data-root (lists imported once, cached by content)
        opts = with_benchmark(opts)
        check_options(opts)
    # the stage pulls in torch, timm and matplotlib: loaded only when the options are good
    from isood.stages.evaluate.job import run_evaluate

    r = run_evaluate(opts)
    if not r.evaluation.per_cell.empty:
        out_console.print(summary_console_table(r))
    per_set = sets_console_table(r)
    if per_set is not None:
        out_console.print(per_set)
    na = (r.manifest.meta.get("summary") or {}).get("na_thresholds") or {}
    if na:
        how = "--na-threshold" if opts.na_threshold is not None else "the manifest's"
        out_console.print("N/A threshold: " + "; ".join(f"{ds} {t['used']} ({how}; manifest {t['manifest']})"
                                                         for ds, t in na.items()), highlight=False, soft_wrap=True)
    out_console.print(f"report: {opts.out}/report.html; manifest: {opts.out} ({r.manifest.kind} "
                      f"v{r.manifest.dataset_version}, {r.seconds:.1f} s)", highlight=False, soft_wrap=True)
