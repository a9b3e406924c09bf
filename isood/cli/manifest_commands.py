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
from isood.cli.options import command
from isood.files import atomic_write_bytes, output_lock
from isood.stages import interop
from isood.stages.interop.options import ImportListOptions, ImportListsOptions
from manifests import add_card, hub
from manifests.options import CardOptions, PublishOptions, VerifyOptions

__all__ = ["verify", "publish", "card", "import_isood_lists", "import_imagenet_ood", "import_openood_imglist",
           "export_openood"]


def _say(text: str) -> None:
    out_console.print(text, highlight=False, soft_wrap=True)


@command(app, "verify", VerifyOptions, config=False,
         help="Recompute every hash of a manifest and check every field of its manifest.json; name each missing, "
              "extra or changed file and each inconsistent field (exit 1 if any).")
def verify(opts: VerifyOptions) -> None:
    report = manifests.verify(opts.manifest_dir, mode=opts.verify)
    if report.ok:
        m = manifests.read(opts.manifest_dir)
        out_console.print(f"OK {opts.manifest_dir}: {m.kind} v{m.dataset_version}, {len(m.meta['files'])} files "
                          "verified")
        return
    for line in report.lines():  # one line per problem, never wrapped: scripts grep them
        out_console.print(line, highlight=False, soft_wrap=True)
    out_console.print(f"FAILED {opts.manifest_dir}: {len(report.lines())} problem(s)", highlight=False,
                      soft_wrap=True)
    raise typer.Exit(1)


def _write_receipt(out: Path, result: hub.PublishResult, repo_id: str) -> None:
    p = result.plan
    receipt = {"repo_id": repo_id, "tag": p.tag, "dataset_version": p.dataset_version, "kind": p.kind,
               "commit": result.commit_oid, "commit_url": result.commit_url,
               "files": [{"path": f, "bytes": b} for f, b in p.files],
               "left_out": [{"path": f, "bytes": b} for f, b in p.left_out]}
    atomic_write_bytes(out / "publish.json", (json.dumps(receipt, indent=2) + "\n").encode())


@command(app, "publish", PublishOptions,
         help="Publish a verified manifest to the Hugging Face Hub as a dataset, tagged with its dataset version.")
def publish(opts: PublishOptions) -> None:
    with output_lock(opts.out) if opts.out is not None else contextlib.nullcontext():
        _publish(opts)


def _publish(opts: PublishOptions) -> None:
    result = hub.publish(opts.manifest_dir, opts.repo_id, private=opts.private, tag=opts.revision,
                         dry_run=opts.dry_run, token_from_env=opts.token_from_env, echo=_say,
                         include_features=opts.include_features)
    if opts.dry_run:
        for line in result.lines():
            _say(line)
        if opts.out is not None:
            hub.copy_plan(result, opts.out)
            _say(f"dry run: copied the upload folder to {opts.out}")
    elif opts.out is not None:
        _write_receipt(Path(opts.out), result, opts.repo_id)


@command(app, "card", CardOptions, config=False,
         help="(Re)write a manifest's dataset card (README.md) and its per-config Parquet files, so `datasets` can "
              "load it (a manifest whose card is current is left as it is; the content hash and dataset version "
              "never change).")
def card(opts: CardOptions) -> None:
    m = add_card(opts.manifest_dir)
    _say(f"card: {opts.manifest_dir}/README.md ({m.kind} v{m.dataset_version})")


def _imported(m: manifests.Manifest) -> None:
    _say(f"manifest: {m.root} ({m.kind} v{m.dataset_version}, {m.meta['summary'].get('images')} images)")


@command(import_app, "isood-lists", ImportListsOptions, section="import-isood-lists",
         help="IS-OOD release lists -> a splits manifest (levels from the file names; shift values unknown, NaN).")
def import_isood_lists(opts: ImportListsOptions) -> None:
    m = interop.import_isood_lists(opts.directory, opts.out, n_levels=opts.levels, na_threshold=opts.na_threshold,
                                   na_rule=opts.na_rule, allow_missing=opts.allow_missing)
    _imported(m)
    s = m.meta["summary"]
    _say(f"cells: {s['cells_usable']} usable, {s['cells_na']} N/A (rule {s['na_rule']}, threshold "
         f"{opts.na_threshold}; subsets: {', '.join(x or '.' for x in s['subsets'])})")
    for subset, cells in sorted(s["missing_lists"].items()):
        _say(f"missing lists in {subset or '.'} ({len(cells)}, flagged missing): {', '.join(cells)}")


@command(import_app, "imagenet-ood", ImportListOptions, section="import-imagenet-ood",
         help="ImageNet-OOD image list (one relative image path per line) -> an image-list manifest (label -1).")
def import_imagenet_ood(opts: ImportListOptions) -> None:
    _imported(interop.import_imagenet_ood(opts.list_file, opts.out))


@command(import_app, "openood-imglist", ImportListOptions, section="import-openood-imglist",
         help="OpenOOD imglist ('<path> <label>' per line) -> an image-list manifest (labels kept).")
def import_openood_imglist(opts: ImportListOptions) -> None:
    _imported(interop.import_openood_imglist(opts.list_file, opts.out))


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
