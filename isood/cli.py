"""The `isood` command line: parse, load, call, write. The science lives in the modules it calls."""

from __future__ import annotations

from pathlib import Path
from typing import List, Optional

import click
import typer
from rich.console import Console
from typer.core import TyperGroup

from isood.errors import IsoodError

console = Console(stderr=True)
out_console = Console()


class _FriendlyGroup(TyperGroup):
    """Turns an IsoodError raised anywhere below into one red line and exit status 2 (no traceback)."""

    def invoke(self, ctx: click.Context):
        try:
            return super().invoke(ctx)
        except IsoodError as e:
            console.print(f"[red]error:[/red] {e}", highlight=False, soft_wrap=True)
            ctx.exit(2)


app = typer.Typer(
    cls=_FriendlyGroup,
    help="Build out-of-distribution benchmarks graded by semantic and covariate shift, and evaluate detectors on them.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
    context_settings={"help_option_names": ["-h", "--help"]},
)
wordnet_app = typer.Typer(
    cls=_FriendlyGroup,
    help="WordNet tools: the ImageNet-OOD class filter and the hierarchy-leak audit.",
    no_args_is_help=True,
)
app.add_typer(wordnet_app, name="wordnet")

_EXCLUDE_DEFAULT = ["organism.n.01"]


@wordnet_app.command("filter")
def wordnet_filter(
    candidates: str = typer.Option("21k", help="Candidate classes: 1k, 21k, 21k-p, 12k, a wnid file, or a dataset root."),
    id_classes: str = typer.Option("1k", "--id", help="In-distribution classes (same forms as --candidates)."),
    exclude: Optional[List[str]] = typer.Option(
        None, help="Drop classes under this synset (repeatable; default organism.n.01). Pass --exclude '' for none."
    ),
    sisters_only: bool = typer.Option(False, help="Keep only sister classes of ID classes (ImageNet-OOD candidate step)."),
    out: Path = typer.Option(..., help="Output manifest directory."),
) -> None:
    """ImageNet-OOD class filter: drop ID classes, their hypernyms and hyponyms, and excluded subtrees, with reasons."""
    from wordnet_tools.jobs import run_filter, summary_table

    excl = _EXCLUDE_DEFAULT if exclude is None else [e for e in exclude if e]
    manifest = run_filter(candidates, id_classes, excl, sisters_only, out)
    out_console.print(summary_table(manifest, "Class filter"))
    out_console.print(f"manifest: {out}")


@wordnet_app.command("audit")
def wordnet_audit(
    list_file: Path = typer.Argument(..., help="A list of wnids or image paths (<wnid>/<file> or <wnid>_<n>.JPEG)."),
    id_classes: str = typer.Option("1k", "--id", help="In-distribution classes: 1k, 21k, a wnid file, or a dataset root."),
    exclude: Optional[List[str]] = typer.Option(None, help="Excluded subtree (repeatable; default organism.n.01; '' for none)."),
    out: Optional[Path] = typer.Option(None, help="Write the audit as a manifest here."),
) -> None:
    """Audit an existing OOD class or image list for hierarchy leaks into the ID classes."""
    from wordnet_tools.jobs import run_audit

    excl = _EXCLUDE_DEFAULT if exclude is None else [e for e in exclude if e]
    table, counts = run_audit(list_file, id_classes, excl, out)
    out_console.print(table)
    out_console.print(counts)


@app.command()
def verify(manifest_dir: Path = typer.Argument(..., help="A manifest directory.")) -> None:
    """Recompute every hash of a manifest; name each missing, extra or changed file (exit 1 if any)."""
    import manifests

    report = manifests.verify(manifest_dir)
    if report.ok:
        m = manifests.read(manifest_dir)
        out_console.print(f"OK {manifest_dir}: {m.kind} v{m.dataset_version}, {len(m.meta['files'])} files verified")
        return
    for line in report.lines():
        out_console.print(line, highlight=False)
    out_console.print(f"FAILED {manifest_dir}: {len(report.lines())} problem(s)")
    raise typer.Exit(1)


@app.command()
def demo(
    out: Path = typer.Option(Path("demo-out"), help="Output directory for the demo manifests."),
    seed: int = typer.Option(0, help="Seed of the planted world."),
) -> None:
    """Run the whole pipeline on the embedded default: the WordNet class filter and a planted synthetic world."""
    from isood.demo import run_demo

    run_demo(out, seed=seed, console=out_console)


@app.command()
def extract(
    images: Path = typer.Option(..., help="Images: a dataset root with wnid subfolders, or a file list (one path per line)."),
    clip: str = typer.Option(..., help="CLIP encoder: MODEL:PRETRAINED (e.g. ViT-B-32:openai), local-dir:PATH or hf-hub:ORG/REPO."),
    out: Path = typer.Option(..., help="Output directory (features manifest; rerun to resume)."),
    batch_size: int = typer.Option(64, help="Images per batch."),
    workers: Optional[int] = typer.Option(None, help="Local engine: DataLoader workers (default: min(8, CPUs - 1)). Ray engine: model actors (default: one per GPU, else per CPU)."),
    shard_size: int = typer.Option(10_000, help="Images per features-NNNNN.npy shard (the unit of resuming)."),
    device: Optional[str] = typer.Option(None, help="cpu, cuda or cuda:N (default: cuda when available; AMP on CUDA)."),
    engine: str = typer.Option("local", help="local (this process) or ray (Ray Data actors; pip install 'isood\\[ray]')."),
    ray_address: Optional[str] = typer.Option(None, help="Ray cluster to join (auto, HOST:PORT, ray://HOST:10001; default: $RAY_ADDRESS, else a local one)."),
    num_gpus_per_worker: Optional[float] = typer.Option(None, help="GPUs per Ray actor (default: 1 when the cluster has GPUs, else 0)."),
    num_shards: int = typer.Option(1, help="Job arrays: split the feature shards over this many tasks (merge with `isood merge`)."),
    shard_index: int = typer.Option(0, help="Job arrays: this task's index, 0..num-shards-1 (e.g. $SLURM_ARRAY_TASK_ID)."),
) -> None:
    """Extract L2-normalised CLIP image features into resumable shards (unreadable images are listed, not fatal)."""
    from isood.features import extract_features

    ray = None
    if engine == "ray":
        from isood.distributed import RayOptions

        ray = RayOptions(address=ray_address, workers=workers, num_gpus_per_worker=num_gpus_per_worker)
    r = extract_features(images, clip, out, batch_size=batch_size, workers=workers, shard_size=shard_size, device=device,
                         engine=engine, ray=ray, num_shards=num_shards, shard_index=shard_index)
    part = f" (part {shard_index} of {num_shards}: merge with `isood merge`)" if num_shards > 1 else ""
    out_console.print(
        f"{r.n_images} images -> {r.embed_dim}-d features, {r.n_rejected} rejected; "
        f"shards written {len(r.shards_written)}, reused {len(r.shards_reused)}; manifest: {out}{part}",
        highlight=False,
    )


@app.command()
def merge(
    parts: List[Path] = typer.Argument(..., help="The part directories of one job array (written with --num-shards N --shard-index i)."),
    out: Path = typer.Option(..., help="Output directory: the manifest a single run writes."),
) -> None:
    """Combine the parts of a job array (`isood extract` / `isood generate-syn` with --num-shards) into one verified manifest."""
    import manifests
    from isood.shards import merge_parts

    m = merge_parts(parts, out)
    report = manifests.verify(out)
    if not report.ok:
        raise IsoodError(f"merged manifest {out} fails verification: {'; '.join(report.lines()[:3])}")
    out_console.print(f"merged {len(parts)} parts -> {out} ({m.kind} v{m.dataset_version}, {len(m.meta['files'])} files verified)",
                      highlight=False, soft_wrap=True)


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
    backend: Optional[str] = typer.Option(None, help="Nearest-neighbour backend: auto (exact), torch, faiss-flat, faiss-ivf."),
    batch_size: Optional[int] = typer.Option(None, help="Images per batch when extracting (default 64)."),
    workers: Optional[int] = typer.Option(None, help="DataLoader workers when extracting."),
    shard_size: Optional[int] = typer.Option(None, help="Images per feature shard when extracting (default 10000)."),
    device: Optional[str] = typer.Option(None, help="cpu, cuda or cuda:N (default: cuda when available)."),
    cache_dir: Optional[str] = typer.Option(None, help="Text-feature cache (default $ISOOD_CACHE_DIR/text-features)."),
    out: Optional[Path] = typer.Option(None, help="Output directory (splits manifest)."),
    config: Optional[Path] = typer.Option(None, help="TOML file with any of these options (command-line values win)."),
) -> None:
    """Measure each test image's semantic and covariate shift to the ID set and bin them into an 8x8 grid."""
    from isood.pipeline import build_splits as run_build, load_build_config

    cfg = load_build_config(
        config, id=id_source, test=test, clip=clip, laid=laid, labels=labels, class_filter=class_filter,
        exclude_id_classes=exclude_id_classes, levels=levels, na_threshold=na_threshold, clip_quantile=clip_quantile,
        triplets=triplets, laid_steps=laid_steps, seed=seed, backend=backend, batch_size=batch_size, workers=workers,
        shard_size=shard_size, device=device, cache_dir=cache_dir, out=str(out) if out is not None else None,
    )
    r = run_build(cfg, console=console)
    n_cells = len(r.cells)
    n_ok = int((~r.cells["na"]).sum())
    out_console.print(
        f"{r.n_test} test images vs {r.n_id} ID images -> {n_ok}/{n_cells} cells with >= {cfg.na_threshold} images; "
        f"{r.n_dropped} dropped; manifest: {cfg.out}",
        highlight=False,
    )


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
    pipeline: str = typer.Option("stabilityai/sdxl-turbo", help="diffusers pipeline: a Hub name or local-dir:PATH."),
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
    engine: str = typer.Option("local", help="local (this process) or ray (SDXL on Ray Data actors; pip install 'isood\\[ray]'; --out on a shared file system)."),
    ray_address: Optional[str] = typer.Option(None, help="Ray cluster to join (auto, HOST:PORT, ray://HOST:10001; default: $RAY_ADDRESS, else a local one)."),
    num_gpus_per_worker: Optional[float] = typer.Option(None, help="GPUs per Ray actor (default: 1 when the cluster has GPUs, else 0)."),
    workers: Optional[int] = typer.Option(None, help="Ray actors, one pipeline each (default: one per GPU, else per CPU)."),
    num_shards: int = typer.Option(1, help="Job arrays: split the pipeline batches over this many tasks (merge with `isood merge`)."),
    shard_index: int = typer.Option(0, help="Job arrays: this task's index, 0..num-shards-1 (e.g. $SLURM_ARRAY_TASK_ID)."),
    out: Path = typer.Option(..., help="Output Syn-IS manifest directory."),
) -> None:
    """Syn-IS: style x label prompts binned by shift, generated with SDXL-Turbo."""
    from generation.syn import SynOptions, run_generate_syn, summary_table

    opts = SynOptions(
        out=out, styles=styles, labels=labels, clip=clip, laid=str(laid) if laid else None,
        id_features=str(id_features) if id_features else None, splits=str(splits) if splits else None,
        per_cell=per_cell, images_per_prompt=images_per_prompt, pipeline=pipeline, size=size, steps=steps,
        guidance_scale=guidance_scale, batch_size=batch_size, seed=seed, prompts_only=prompts_only, device=device,
        blocklist=str(blocklist) if blocklist else None, default_blocklist=default_blocklist,
        safety_checker=safety_checker, engine=engine, ray_address=ray_address, num_gpus_per_worker=num_gpus_per_worker,
        workers=workers, num_shards=num_shards, shard_index=shard_index,
    )
    result = run_generate_syn(opts)
    out_console.print(summary_table(result))
    out_console.print(f"manifest: {out} ({result.manifest.kind} v{result.manifest.dataset_version})")


@app.command()
def evaluate(
    splits: Path = typer.Option(..., help="A splits manifest (isood build-splits); must pass `isood verify`."),
    id_test: str = typer.Option(..., "--id-test", help="ID test set: image folder with wnid sub-folders (or file list), or a precomputed-outputs folder."),
    id_train: str = typer.Option(..., "--id-train", help="ID training set (fits MDS/KNN/ViM..., DER threshold): same forms as --id-test."),
    model: Optional[str] = typer.Option(None, help="Classifier: a timm name, 'torchvision/<name>' or py:MODULE:FUNCTION (not needed with precomputed outputs)."),
    out: Path = typer.Option(..., help="Output directory (evaluation manifest, plots, report.html, summary.md)."),
    detectors: str = typer.Option("msp,maxlogit,energy,mds,knn", help="Comma-separated detectors, with parameters as name:key=value (e.g. knn:k=10)."),
    syn: Optional[Path] = typer.Option(None, help="A Syn-IS manifest to evaluate as well (paths relative to it)."),
    test_root: Optional[str] = typer.Option(None, help="Folder the --splits image paths are relative to (default: the manifest's test_root), or a precomputed-outputs folder."),
    checkpoint: Optional[Path] = typer.Option(None, help="Local weights for --model (.safetensors / .pth); no download."),
    num_classes: Optional[int] = typer.Option(None, help="Classifier head size with --checkpoint (default: the number of --id-train classes)."),
    classes: Optional[Path] = typer.Option(None, help="The model's class wnids in logit order, one per line (default: sorted --id-train wnids, or ImageNet-1K order for 1000-class models)."),
    batch_size: int = typer.Option(64, help="Images per batch."),
    device: Optional[str] = typer.Option(None, help="cpu, cuda or cuda:N (default: cuda when available)."),
    workers: int = typer.Option(0, help="DataLoader workers."),
    cache_dir: Optional[str] = typer.Option(None, help="Model-output cache (default $ISOOD_CACHE_DIR/outputs)."),
    sanity_random_model: bool = typer.Option(False, "--sanity-random-model", help="Also run the detectors on a randomly initialised copy of the model (AUROC vs AUROC_M)."),
    na_threshold: int = typer.Option(10, help="A cell with fewer images (or marked N/A in the manifest) is N/A."),
    der: bool = typer.Option(True, "--der/--no-der", help="Score the ID training set for DER95/DER99 (--no-der skips it)."),
    plot_metrics: Optional[str] = typer.Option(None, help="Metrics to draw (heatmaps and level curves), comma-separated (default: all computed)."),
    seed: int = typer.Option(0, help="Seed of the random re-initialisation (--sanity-random-model)."),
) -> None:
    """Score OOD detectors per shift cell; every metric, level curves, Table 1, heatmaps and a report."""
    from isood.evaluation.job import EvaluateOptions, run_evaluate, summary_console_table

    opts = EvaluateOptions(
        splits=str(splits), out=str(out), id_test=id_test, id_train=id_train, model=model, detectors=detectors,
        syn=str(syn) if syn else None, test_root=test_root, checkpoint=str(checkpoint) if checkpoint else None,
        num_classes=num_classes, classes=str(classes) if classes else None, batch_size=batch_size, device=device,
        workers=workers, cache_dir=cache_dir, sanity_random_model=sanity_random_model, na_threshold=na_threshold,
        der=der, plot_metrics=plot_metrics, seed=seed,
    )
    r = run_evaluate(opts, console=console)
    out_console.print(summary_console_table(r))
    out_console.print(f"report: {out}/report.html; manifest: {out} ({r.manifest.kind} v{r.manifest.dataset_version}, "
                      f"{r.seconds:.1f} s)", highlight=False, soft_wrap=True)


@app.command()
def publish(
    manifest_dir: Path = typer.Argument(..., help="A manifest directory (must pass `isood verify` and have a README.md card)."),
    repo_id: str = typer.Option(..., "--repo-id", help="Hub dataset repository, USER/NAME (created if missing)."),
    private: bool = typer.Option(False, "--private", help="Create the repository as private."),
    revision: Optional[str] = typer.Option(None, "--revision", help="Tag to create (default: v<dataset version>, e.g. v1.2.0)."),
    dry_run: bool = typer.Option(False, "--dry-run", help="List exactly the files and sizes that would be uploaded; no network."),
    token_from_env: bool = typer.Option(
        False, "--token-from-env", help="Take the token only from $HF_TOKEN (default: huggingface_hub's usual sources)."
    ),
    out: Optional[Path] = typer.Option(
        None, help="With --dry-run: copy the exact upload folder here. Otherwise: write publish.json (repo, tag, commit) here."
    ),
) -> None:
    """Publish a verified manifest to the Hugging Face Hub as a dataset, tagged with its dataset version."""
    import json

    from manifests import hub

    result = hub.publish(manifest_dir, repo_id, private=private, tag=revision, dry_run=dry_run,
                         token_from_env=token_from_env, echo=lambda s: out_console.print(s, highlight=False, soft_wrap=True))
    p = result if dry_run else result.plan
    if dry_run:
        for line in p.lines():
            out_console.print(line, highlight=False, soft_wrap=True)
        if out is not None:
            hub.copy_plan(p, out)
            out_console.print(f"dry run: copied the upload folder to {out}", highlight=False, soft_wrap=True)
        return
    if out is not None:
        out.mkdir(parents=True, exist_ok=True)
        receipt = {"repo_id": repo_id, "tag": p.tag, "dataset_version": p.dataset_version, "kind": p.kind,
                   "commit": result.commit_oid, "commit_url": result.commit_url,
                   "files": [{"path": f, "bytes": b} for f, b in p.files]}
        (out / "publish.json").write_text(json.dumps(receipt, indent=2) + "\n")


@app.command()
def card(
    manifest_dir: Path = typer.Argument(..., help="A manifest directory written without a dataset card."),
) -> None:
    """(Re)write a manifest's dataset card (README.md) and its per-config Parquet files, so `datasets` can load it."""
    from manifests.card import add_card

    m = add_card(manifest_dir)
    out_console.print(f"card: {manifest_dir}/README.md ({m.kind} v{m.dataset_version})", highlight=False, soft_wrap=True)


import_app = typer.Typer(
    cls=_FriendlyGroup,
    help="Import OOD lists from other tools (IS-OOD release lists, ImageNet-OOD, OpenOOD imglists) as manifests.",
    no_args_is_help=True,
)
app.add_typer(import_app, name="import")
export_app = typer.Typer(cls=_FriendlyGroup, help="Export manifests for other tools (OpenOOD).", no_args_is_help=True)
app.add_typer(export_app, name="export")


def _imported(m) -> None:
    out_console.print(f"manifest: {m.root} ({m.kind} v{m.dataset_version}, {m.meta['summary'].get('images')} images)",
                      highlight=False, soft_wrap=True)


@import_app.command("isood-lists")
def import_isood_lists(
    directory: Path = typer.Argument(..., help="Folder of cov_{c}_sem_{s}.txt lists, optionally in one sub-folder per source."),
    out: Path = typer.Option(..., help="Output manifest directory."),
    levels: int = typer.Option(8, help="Levels per axis of the grid the lists come from."),
    na_threshold: int = typer.Option(10, help="A cell with fewer images is N/A."),
) -> None:
    """IS-OOD release lists -> a splits manifest (levels from the file names; shift values unknown, NaN)."""
    from manifests.interop import import_isood_lists as run

    _imported(run(directory, out, n_levels=levels, na_threshold=na_threshold))


@import_app.command("imagenet-ood")
def import_imagenet_ood(
    list_file: Path = typer.Argument(..., help="ImageNet-OOD list: one relative image path per line."),
    out: Path = typer.Option(..., help="Output manifest directory."),
) -> None:
    """ImageNet-OOD image list -> an image-list manifest (label -1)."""
    from manifests.interop import import_imagenet_ood as run

    _imported(run(list_file, out))


@import_app.command("openood-imglist")
def import_openood_imglist(
    list_file: Path = typer.Argument(..., help="OpenOOD imglist: '<path> <label>' per line."),
    out: Path = typer.Option(..., help="Output manifest directory."),
) -> None:
    """OpenOOD imglist -> an image-list manifest (labels kept)."""
    from manifests.interop import import_openood_imglist as run

    _imported(run(list_file, out))


@export_app.command("openood")
def export_openood(
    manifest_dir: Path = typer.Argument(..., help="A splits, syn-is or image-list manifest."),
    out: Path = typer.Option(..., help="Output folder (new, or an earlier export to overwrite)."),
    name: str = typer.Option("isood", help="Benchmark name: benchmark_imglist/<name>/."),
    data_root: str = typer.Option("./data/", help="OpenOOD data root used in the YAML config."),
    data_dir: str = typer.Option("images_largescale/", help="Image folder under the data root (+ <source>/ per source)."),
    num_classes: int = typer.Option(1000, help="Number of ID classes (ImageNet-1K: 1000)."),
) -> None:
    """OpenOOD v1.5 benchmark imglists, one per cell, plus a DATA_INFO entry and an ood_dataset YAML config."""
    from manifests.interop import export_openood as run

    r = run(manifest_dir, out, name=name, data_root=data_root, data_dir=data_dir, num_classes=num_classes)
    out_console.print(f"{len(r.imglists)} imglists ({len(r.registered)} registered for OpenOOD, "
                      f"{len(r.imglists) - len(r.registered)} N/A), {r.rows - r.skipped} rows -> {out}", highlight=False, soft_wrap=True)
    if r.skipped:
        out_console.print(f"{r.skipped} rows without a cell (no shift level) were not exported", highlight=False, soft_wrap=True)


def main() -> None:
    app()


if __name__ == "__main__":
    main()
