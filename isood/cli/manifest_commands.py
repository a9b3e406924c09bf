"""The manifest commands: `isood verify`, `isood publish`, `isood card`, `isood import isood-lists /
imagenet-ood / openood-imglist` and `isood export openood` (``manifests``, ``isood.stages.interop``)."""

from __future__ import annotations

import contextlib
import dataclasses
import json
from pathlib import Path
import typer

import manifests
from isood.report.card_figure import card_mosaic
from isood.cli._app import app, export_app, import_app, out_console
from isood.cli.options import command
from isood.core.files import atomic_write_bytes, output_lock
from isood.stages import interop
from isood.stages.interop.options import ExportOpenoodOptions, ImportListOptions, ImportListsOptions
from manifests import add_card, hub
from isood.stages.publish.options import CardOptions, PublishOptions, VerifyOptions

__all__ = ["verify", "publish", "card", "import_isood_lists", "import_imagenet_ood", "import_openood_imglist",
           "export_openood"]


def _say(text: str) -> None:
    out_console.print(text, highlight=False, soft_wrap=True)


@command(app, "verify", VerifyOptions, config=False,
         help="Recompute every hash of a manifest and check every field of its manifest.json; name each missing, "
              "extra or changed file and each inconsistent field (exit 1 if any).")
def verify(opts: VerifyOptions) -> None:
    report = manifests.verify(opts.manifest_dir, mode=opts.verify)
    if report.ok and report.meta is not None:  # the version it checked, not one swapped in since
        meta = report.meta
        out_console.print(f"OK {opts.manifest_dir}: {meta['kind']} v{meta['dataset_version']}, {len(meta['files'])} "
                          "files verified")
        return
    if report.rewriting:  # a writer kept swapping new versions in: nothing is known to be wrong
        out_console.print(report.lines()[0], highlight=False, soft_wrap=True)
        raise typer.Exit(1)
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
    if opts.out is not None:  # before the lock file, which sits beside --out
        hub.check_publish_out(opts.manifest_dir, opts.out)
    with output_lock(opts.out) if opts.out is not None else contextlib.nullcontext():
        _publish(opts)


def _publish(opts: PublishOptions) -> None:
    result = hub.publish(opts.manifest_dir, opts.repo_id, private=opts.private, tag=opts.revision,
                         dry_run=opts.dry_run, token_from_env=opts.token_from_env, echo=_say,
                         include_features=opts.include_features)
    if isinstance(result, hub.PublishPlan):  # a dry run returns the plan
        try:
            for line in result.lines():
                _say(line)
            if opts.out is not None:
                hub.copy_plan(result, opts.out)
                _say(f"dry run: copied the upload folder to {opts.out}")
        finally:
            result.close()
    elif opts.out is not None:
        _write_receipt(Path(opts.out), result, opts.repo_id)


@command(app, "card", CardOptions, config=False,
         help="(Re)write a manifest's dataset card (README.md) and its per-config Parquet files, so `datasets` can "
              "load it (a manifest whose card is current is left as it is; the content hash and dataset version "
              "never change).")
def card(opts: CardOptions) -> None:
    m = add_card(opts.manifest_dir, figure=card_mosaic)
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


@command(export_app, "openood", ExportOpenoodOptions, section="export-openood",
         help="OpenOOD v1.5 imglists (one per cell), ID lists, an OOD val split, a DATA_INFO entry and a YAML config, "
              "merged with the exports already in --out; for a grid also the release's own list layout "
              "(imglist/<name>/<subset>/cov_{c}_sem_{s}.txt) that its evaluation code reads.")
def export_openood(opts: ExportOpenoodOptions) -> None:
    out = Path(opts.out)
    r = interop.export_openood(**dataclasses.asdict(opts))
    if r.name is not None:
        na = sum(1 for g in r.groups.values() if g == "na")
        _say(f"{len(r.imglists)} imglists ({len(r.registered)} registered for OpenOOD, {na} N/A), "
             f"{r.rows - r.skipped} rows -> {out} ({r.name})")
    if r.val:
        _say(f"OOD val split: {r.val['n']} images -> {out / r.val['imglist_path']}")
    if r.release_lists:
        _say(f"{len(r.release_lists)} release-format lists -> {out / '/'.join(r.release_lists[0].split('/')[:2])}")
    for split, n in r.id_lists.items():
        openood_list = interop.id_list_paths(split)[1]
        _say(f"ID {split}: {n} images -> {out / openood_list} (+ the release's list)" if (out / openood_list).is_file()
             else f"ID {split}: {n} images -> {out / interop.id_list_paths(split)[0]} (the release's list only: no "
                  "class labels for OpenOOD)")
    if r.id_lists:
        _say(f"ID classes: {r.num_classes if r.num_classes is not None else 'unknown (pass --num-classes)'}")
    for folder, target in r.links.items():
        _say(f"images: {out / folder} -> {target}")
    for g in r.empty_groups:
        _say(f"the {g}-OOD group is empty (no dataset of the folder is {g}); OpenOOD's eval_ood needs both groups")
    if r.skipped:
        _say(f"{r.skipped} rows without a cell (no shift level) were not exported")
    for tool, label in (("openood", "OpenOOD Evaluator"), ("release", "the release's datasets.py")):
        missing = r.ready.get(tool, [])
        _say(f"{label}: " + ("ready" if not missing else "still lacks " + "; ".join(missing)))
