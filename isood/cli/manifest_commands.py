"""L6: the manifest commands: `isood verify`, `isood publish`, `isood card`, `isood import isood-lists /
imagenet-ood / openood-imglist` and `isood export openood` (``manifests``, ``isood.stages.interop``)."""

from __future__ import annotations

import contextlib
import json
from pathlib import Path
from typing import Optional

import typer

import manifests
from isood.cli._app import app, export_app, import_app, out_console, verify_option
from isood.defaults import N_LEVELS, NA_THRESHOLD
from isood.files import output_lock
from isood.stages import interop
from manifests import add_card, hub

__all__ = ["verify", "publish", "card", "import_isood_lists", "import_imagenet_ood", "import_openood_imglist",
           "export_openood"]


def _say(text: str) -> None:
    out_console.print(text, highlight=False, soft_wrap=True)


@app.command()
def verify(manifest_dir: Path = typer.Argument(..., help="A manifest directory.")) -> None:
    """Recompute every hash of a manifest; name each missing, extra or changed file (exit 1 if any)."""
    report = manifests.verify(manifest_dir)
    if report.ok:
        m = manifests.read(manifest_dir)
        out_console.print(f"OK {manifest_dir}: {m.kind} v{m.dataset_version}, {len(m.meta['files'])} files verified")
        return
    for line in report.lines():  # one line per problem, never wrapped: scripts grep them
        out_console.print(line, highlight=False, soft_wrap=True)
    out_console.print(f"FAILED {manifest_dir}: {len(report.lines())} problem(s)", highlight=False, soft_wrap=True)
    raise typer.Exit(1)


def _write_receipt(out: Path, result: hub.PublishResult, repo_id: str) -> None:
    p = result.plan
    out.mkdir(parents=True, exist_ok=True)
    receipt = {"repo_id": repo_id, "tag": p.tag, "dataset_version": p.dataset_version, "kind": p.kind,
               "commit": result.commit_oid, "commit_url": result.commit_url,
               "files": [{"path": f, "bytes": b} for f, b in p.files],
               "left_out": [{"path": f, "bytes": b} for f, b in p.left_out]}
    (out / "publish.json").write_text(json.dumps(receipt, indent=2) + "\n")


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
    include_features: bool = typer.Option(
        False, "--include-features", help="Also upload the feature shards (features-id/, features-test/, *.npy; "
        "~24 GB of test features at IS-OOD's size); left out by default."
    ),
) -> None:
    """Publish a verified manifest to the Hugging Face Hub as a dataset, tagged with its dataset version."""
    with output_lock(out) if out is not None else contextlib.nullcontext():
        _publish(manifest_dir, repo_id, private=private, revision=revision, dry_run=dry_run,
                 token_from_env=token_from_env, out=out, include_features=include_features)


def _publish(manifest_dir: Path, repo_id: str, *, private: bool, revision: Optional[str], dry_run: bool,
             token_from_env: bool, out: Optional[Path], include_features: bool = False) -> None:
    result = hub.publish(manifest_dir, repo_id, private=private, tag=revision, dry_run=dry_run,
                         token_from_env=token_from_env, echo=_say, include_features=include_features)
    if dry_run:
        for line in result.lines():
            _say(line)
        if out is not None:
            hub.copy_plan(result, out)
            _say(f"dry run: copied the upload folder to {out}")
    elif out is not None:
        _write_receipt(out, result, repo_id)


@app.command()
def card(
    manifest_dir: Path = typer.Argument(..., help="A manifest directory (e.g. one written without a dataset card)."),
) -> None:
    """(Re)write a manifest's dataset card (README.md) and its per-config Parquet files, so `datasets` can load it
    (a manifest whose card is current is left as it is; the content hash and dataset version never change)."""
    m = add_card(manifest_dir)
    _say(f"card: {manifest_dir}/README.md ({m.kind} v{m.dataset_version})")


def _imported(m: manifests.Manifest) -> None:
    _say(f"manifest: {m.root} ({m.kind} v{m.dataset_version}, {m.meta['summary'].get('images')} images)")


@import_app.command("isood-lists")
def import_isood_lists(
    directory: Path = typer.Argument(..., help="A release folder of cov_{c}_sem_{s}.txt lists, e.g. "
                                     "<release>/imagenet21k (one sub-folder per subset: train/, val/) or "
                                     "<release>/SynIS."),
    out: Path = typer.Option(..., help="Output manifest directory."),
    levels: int = typer.Option(N_LEVELS, help="Levels per axis of the grid the lists come from."),
    na_threshold: int = typer.Option(NA_THRESHOLD, help="A cell with fewer images is N/A."),
    na_rule: str = typer.Option("pooled", help="pooled: a cell pools its lists across the subsets and is N/A when "
                                "the pooled count is below the threshold (the release's rule); per-subset: each "
                                "subset folder decided on its own."),
    allow_missing: bool = typer.Option(False, "--allow-missing", help="Import a release lacking some lists: their "
                                       "cells are flagged missing (default: an error naming them)."),
) -> None:
    """IS-OOD release lists -> a splits manifest (levels from the file names; shift values unknown, NaN)."""
    m = interop.import_isood_lists(directory, out, n_levels=levels, na_threshold=na_threshold, na_rule=na_rule,
                                   allow_missing=allow_missing)
    _imported(m)
    s = m.meta["summary"]
    _say(f"cells: {s['cells_usable']} usable, {s['cells_na']} N/A (rule {s['na_rule']}, threshold {na_threshold}; "
         f"subsets: {', '.join(x or '.' for x in s['subsets'])})")
    for subset, cells in sorted(s["missing_lists"].items()):
        _say(f"missing lists in {subset or '.'} ({len(cells)}, flagged missing): {', '.join(cells)}")


@import_app.command("imagenet-ood")
def import_imagenet_ood(
    list_file: Path = typer.Argument(..., help="ImageNet-OOD list: one relative image path per line."),
    out: Path = typer.Option(..., help="Output manifest directory."),
) -> None:
    """ImageNet-OOD image list -> an image-list manifest (label -1)."""
    _imported(interop.import_imagenet_ood(list_file, out))


@import_app.command("openood-imglist")
def import_openood_imglist(
    list_file: Path = typer.Argument(..., help="OpenOOD imglist: '<path> <label>' per line."),
    out: Path = typer.Option(..., help="Output manifest directory."),
) -> None:
    """OpenOOD imglist -> an image-list manifest (labels kept)."""
    _imported(interop.import_openood_imglist(list_file, out))


@export_app.command("openood")
def export_openood(
    manifest_dir: Optional[Path] = typer.Argument(None, help="A splits, syn-is or image-list manifest (leave out to "
                                                  "write ID lists only)."),
    out: Path = typer.Option(..., help="Output folder: new, or an earlier export to add to (each benchmark under "
                             "its --name; a re-export replaces only its own files)."),
    name: Optional[str] = typer.Option(None, help="Benchmark name: imglist/<name>/ and benchmark_imglist/<name>/ "
                                       "(default: an imported release's folder name, e.g. imagenet21k, else isood; "
                                       "SynIS for the release's Syn-IS layout)."),
    data_root: str = typer.Option("./data/", help="OpenOOD data root used in the YAML config."),
    data_dir: Optional[str] = typer.Option(None, help="Image root of this benchmark under the data root (default: "
                                           "<name>/, the release's root: imagenet21k/ holds imagenet21k_train/ and "
                                           "imagenet21k_val/); the listed paths are relative to it."),
    num_classes: int = typer.Option(1000, help="Number of ID classes (ImageNet-1K: 1000)."),
    near_axis: Optional[str] = typer.Option(None, help="Grid cells are near-OOD when their level on this axis (sem, "
                                            "the default, or cov) is below --near-below, far-OOD otherwise."),
    near_below: Optional[int] = typer.Option(None, help="K: cells with level < K are near-OOD (default: the lower "
                                             "half of the levels, 4 of 8)."),
    group: Optional[str] = typer.Option(None, help="OpenOOD group of an image list: near (the default: semantic "
                                        "shift only, e.g. ImageNet-OOD), far (a domain shift too) or val (the OOD val "
                                        "split)."),
    val_cells: Optional[str] = typer.Option(None, help="Grid cells held out as OpenOOD's OOD val split (comma-"
                                            "separated, e.g. cov_0_sem_7,cov_7_sem_7): not registered for near/far; "
                                            "APS-mode postprocessors tune on them."),
    id_train: Optional[Path] = typer.Option(None, help="ID training images: a folder of wnid sub-folders, or a list "
                                            "('path' or 'path label' per line)."),
    id_val: Optional[Path] = typer.Option(None, help="ID validation images (APS-mode postprocessors tune on them)."),
    id_test: Optional[Path] = typer.Option(None, help="ID test images."),
    id_root: Optional[Path] = typer.Option(None, help="The folder the ID paths are written relative to, linked as "
                                           "<data root>/imagenet1k (default: the parent of the ID folders)."),
    classes: Optional[Path] = typer.Option(None, help="Class list (one wnid per line, in logit order) labelling ID "
                                           "images by their wnid folder (default: the sorted wnids of --id-train)."),
    verify: str = verify_option(),
) -> None:
    """OpenOOD v1.5 imglists (one per cell), ID lists, an OOD val split, a DATA_INFO entry and a YAML config, merged
    with the exports already in --out; for a grid also the release's own list layout
    (imglist/<name>/<subset>/cov_{c}_sem_{s}.txt) that its evaluation code reads."""
    r = interop.export_openood(manifest_dir, out, name=name, data_root=data_root, data_dir=data_dir,
                               num_classes=num_classes, verify=verify, near_axis=near_axis, near_below=near_below,
                               group=group, val_cells=val_cells, id_train=id_train, id_val=id_val, id_test=id_test,
                               id_root=id_root, classes=classes)
    if r.name is not None:
        na = sum(1 for g in r.groups.values() if g == "na")
        _say(f"{len(r.imglists)} imglists ({len(r.registered)} registered for OpenOOD, {na} N/A), "
             f"{r.rows - r.skipped} rows -> {out} ({r.name})")
    if r.val:
        _say(f"OOD val split: {r.val['n']} images -> {out / r.val['imglist_path']}")
    if r.release_lists:
        _say(f"{len(r.release_lists)} release-format lists -> {out / '/'.join(r.release_lists[0].split('/')[:2])}")
    for split, n in r.id_lists.items():
        _say(f"ID {split}: {n} images -> {out / interop.id_list_paths(split)[1]} (+ the release's list)")
    if r.skipped:
        _say(f"{r.skipped} rows without a cell (no shift level) were not exported")
    for tool, label in (("openood", "OpenOOD Evaluator"), ("release", "the release's datasets.py")):
        missing = r.ready.get(tool, [])
        _say(f"{label}: " + ("ready" if not missing else "still lacks " + "; ".join(missing)))
