"""L6: ``isood evaluate``: parse the options, run the evaluation stage, render its summary table."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, List, Optional

import typer
from rich.table import Table

from isood.cli._app import app, out_console, verify_option
from isood.defaults import DEFAULT_DETECTORS, DEFAULT_PLOT_METRICS, NA_THRESHOLD
from isood.evaluation.options import DEFAULT_PRECISION, EvaluateOptions, check_options
from isood.images import REFERENCE_DECODE
from wordnet_tools.rules import LEAK_RULES

if TYPE_CHECKING:  # the stage pulls in torch: imported when the command runs
    from isood.evaluation.job import EvaluateResult

__all__ = ["evaluate", "summary_console_table", "sets_console_table"]

def summary_console_table(result: EvaluateResult) -> Table:
    """A rich table of an ``isood.evaluation.job.EvaluateResult``: per detector and dataset the mean AUROC /
    FPR@95 (and AUROC_M) over measured cells and the AUROC correlation with each axis' level (Table 1)."""
    ev = result.evaluation
    t = Table(title="isood evaluate: mean over measured cells; Table 1 correlation of AUROC with the level")
    cols = ["detector", "dataset", "AUROC", "FPR@95", "corr sem", "corr cov"]
    with_m = "auroc_m" in ev.means.columns
    if with_m:
        cols.insert(4, "AUROC_M")
    if result.sanity is not None:
        cols += ["AUROC random", "AUROC_M random"]
    for c in cols:
        t.add_column(c, justify="left" if c in ("detector", "dataset") else "right")
    corr = ev.summary[ev.summary["metric"] == "auroc"].set_index(["detector", "dataset", "axis"])["correlation"]
    san = result.sanity.set_index(["detector", "dataset"]) if result.sanity is not None else None
    for rec in ev.means.itertuples(index=False):
        row = [rec.detector, rec.dataset, f"{rec.auroc:.3f}", f"{rec.fpr95:.3f}"]
        if with_m:
            row.append(f"{rec.auroc_m:.3f}")
        row += [f"{corr.get((rec.detector, rec.dataset, ax), float('nan')):+.2f}" for ax in ("sem", "cov")]
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


def _benchmark_options(ood, ood_root, id_test_root, id_test_labels, preprocess, table_convention) -> dict:
    """The options of issue 18 (any benchmark) as ``EvaluateOptions`` fields."""
    return dict(ood=tuple(ood or ()), ood_root=tuple(ood_root or ()), id_test_root=id_test_root,
                id_test_labels=str(id_test_labels) if id_test_labels else None, preprocess=tuple(preprocess or ()),
                table_convention=table_convention)


@app.command()
def evaluate(
    splits: Optional[Path] = typer.Option(None, help="A splits manifest (isood build-splits or import isood-lists): dataset 'splits'; must pass `isood verify`. Same as --ood splits=SPLITS, with --test-root."),
    id_test: str = typer.Option(..., "--id-test", help="ID test set: image folder with wnid sub-folders, a file list (flat paths without wnids too: see --id-test-root, --id-test-labels), or a precomputed-outputs folder."),
    id_train: Optional[str] = typer.Option(None, "--id-train", help="ID training set (fits MDS/KNN/ViM..., DER threshold): a folder with wnid sub-folders (or file list), or precomputed outputs. Optional when no detector is fitted (then no DER)."),
    model: Optional[str] = typer.Option(None, help="Classifier: a timm name, 'torchvision/<name>', py:MODULE:FUNCTION, or clip:SPEC for a CLIP zero-shot classifier (SPEC: an open_clip name such as ViT-B-16:openai or local-dir:PATH; classes from --classes or --id-train; detectors mcm, glmcm) (not needed with precomputed outputs)."),
    out: Path = typer.Option(..., help="Output directory (evaluation manifest, plots, report.html, summary.md)."),
    detectors: str = typer.Option(DEFAULT_DETECTORS, help="Comma-separated detectors, with parameters as name:key=value (e.g. knn:k=10): msp, maxlogit, energy, odin, mds, knn, vim, react, dice, gradnorm, klm; ash (ASH-B at percentile 90 on the pooled feature, as OpenOOD; ash:variant=p|s); rankfeat (OpenOOD's block 3 + 4 fusion; rankfeat:blocks=4 for block 4 only); pytorch-ood:NAME for pytorch-ood's detectors (e.g. pytorch-ood:ViM; pip install 'isood[pytorch-ood]')."),
    syn: Optional[Path] = typer.Option(None, help="A Syn-IS manifest (isood generate-syn): dataset 'syn-is', alone or with others (paths relative to it)."),
    test_root: Optional[str] = typer.Option(None, help="Folder the --splits image paths are relative to (default: the manifest's test_root), or a precomputed-outputs folder."),
    checkpoint: Optional[Path] = typer.Option(None, help="Local weights for --model (.safetensors / .pth); no download."),
    num_classes: Optional[int] = typer.Option(None, help="Classifier head size with --checkpoint (default: the number of --id-train classes)."),
    classes: Optional[Path] = typer.Option(None, help="The model's class wnids in logit order, one per line, optionally followed by the class name (CLIP prompts) (default: sorted --id-train wnids, or ImageNet-1K order for 1000-class models)."),
    batch_size: int = typer.Option(64, help="Images per batch."),
    device: Optional[str] = typer.Option(None, help="cpu, cuda or cuda:N (default: cuda when available)."),
    workers: int = typer.Option(0, help="DataLoader workers (image-decoding processes)."),
    decode: str = typer.Option(REFERENCE_DECODE, "--decode", help="Image decoding: reference (default: PIL + the classifier's own transform, as OpenOOD) or gpu (JPEGs decoded in one batched torchvision decode_jpeg call per batch on the --device, nvJPEG on CUDA, then resized, cropped and normalised there; other files and JPEGs the device refuses by the reference path; with --device cpu the same batched code runs on the CPU). Part of the output-cache key."),
    precision: str = typer.Option(DEFAULT_PRECISION, "--precision", help="Forward passes in fp32 (default, OpenOOD's numbers), fp16 (CUDA only) or bf16, the last two under autocast with the model channels-last. Part of the output-cache key."),
    cache_dir: Optional[str] = typer.Option(None, help="Model-output cache (default $ISOOD_CACHE_DIR/outputs; '' for none)."),
    sanity_random_model: bool = typer.Option(False, "--sanity-random-model", help="Also run the detectors on a randomly initialised copy of the model (AUROC vs AUROC_M)."),
    na_threshold: int = typer.Option(NA_THRESHOLD, help="A cell with fewer images is N/A: one rule for every set (--splits, --syn, the leak-free images), on the images each evaluates (a manifest's stored N/A flags are not read)."),
    der: bool = typer.Option(True, "--der/--no-der", help="Score the ID training set for DER95/DER99 (--no-der skips it)."),
    plot_metrics: str = typer.Option(DEFAULT_PLOT_METRICS, help="Metrics to draw (heatmaps and level curves), comma-separated, or 'all' (every computed metric); every metric is in the tables and CSVs."),
    seed: int = typer.Option(0, help="Seed of the random re-initialisation (--sanity-random-model), 0..2147483647."),
    leak_audit: Optional[Path] = typer.Option(None, help="An audit of the --splits classes (isood wordnet audit SPLITS --out AUDIT): report every metric per cell on all images and on the leak-free ones, with difference heatmaps and ranking changes."),
    leak_rules: str = typer.Option(",".join(LEAK_RULES), help="Audit verdicts that count as leaks with --leak-audit (among unknown, id, hypernym, hyponym, excluded_subtree)."),
    verify: str = verify_option(),
    ood: Optional[List[str]] = typer.Option(None, "--ood", help="An OOD set, repeatable: [GROUP:]NAME=MANIFEST, a splits (cells: per-cell rows and Table 1), syn-is, or image-list manifest (isood import imagenet-ood / openood-imglist: per-set rows); GROUP near or far adds OpenOOD's nearood / farood mean rows."),
    ood_root: Optional[List[str]] = typer.Option(None, "--ood-root", help="NAME=DIR, repeatable: the folder an OOD set's image paths are relative to (required for image lists; default: a splits manifest's test_root, a Syn-IS manifest's folder)."),
    id_test_root: Optional[str] = typer.Option(None, "--id-test-root", help="The folder the --id-test file list's entries are relative to (default: the list's folder), e.g. the ImageNet-1K root for the release's test_imagenet.txt."),
    id_test_labels: Optional[Path] = typer.Option(None, "--id-test-labels", help="Ground truth of --id-test: '<image> <label>' lines (image: path, file name or stem; label: wnid or class index). Without it (and without wnids in the paths) OOD metrics only: no accuracy."),
    preprocess: Optional[List[str]] = typer.Option(None, "--preprocess", help="Preprocessing preset for every set (PRESET) or one set (NAME=PRESET; names: id_train, id_test, splits, syn-is, --ood names), repeatable: model (default), imagenet, openood, timm, release (per set as the IS-OOD release: Resize(224) for splits manifests, Resize(256) otherwise), release-1k, release-21k."),
    table_convention: str = typer.Option("exact", "--table-convention", help="Table 1's rule: exact (default: fractions, N/A left out) or release (the IS-OOD release's analyze_metrics.py: percent rounded to 0.01, N/A as 0, level means over values > 1e-16; also writes results/<detector>.csv in the release's format)."),
) -> None:
    """Score OOD detectors on an ID test set and any OOD sets: per cell of every grid (level curves, Table 1,
    heatmaps), per set (OpenOOD-style near / far rows), and a report."""
    opts = EvaluateOptions(
        splits=str(splits) if splits else None, out=str(out), id_test=id_test, id_train=id_train, model=model,
        detectors=detectors,
        syn=str(syn) if syn else None, test_root=test_root, checkpoint=str(checkpoint) if checkpoint else None,
        num_classes=num_classes, classes=str(classes) if classes else None, batch_size=batch_size, device=device,
        workers=workers, cache_dir=cache_dir, sanity_random_model=sanity_random_model, na_threshold=na_threshold,
        der=der, plot_metrics=plot_metrics, seed=seed, leak_audit=str(leak_audit) if leak_audit else None,
        leak_rules=leak_rules, verify=verify, decode=decode, precision=precision,
        **_benchmark_options(ood, ood_root, id_test_root, id_test_labels, preprocess, table_convention),
    )
    check_options(opts)  # a bad option is refused before torch, timm or matplotlib load
    # the stage pulls in torch, timm and matplotlib: loaded only when the options are good
    from isood.evaluation.job import run_evaluate

    r = run_evaluate(opts)
    if not r.evaluation.per_cell.empty:
        out_console.print(summary_console_table(r))
    per_set = sets_console_table(r)
    if per_set is not None:
        out_console.print(per_set)
    out_console.print(f"report: {out}/report.html; manifest: {out} ({r.manifest.kind} v{r.manifest.dataset_version}, "
                      f"{r.seconds:.1f} s)", highlight=False, soft_wrap=True)
