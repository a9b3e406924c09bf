"""`isood export openood`: one OpenOOD v1.5 data root (and the IS-OOD release's ``data_root``) shared by any
number of exports. Checks (before any work) -> the lists (``openood``) and ID lists (``id_lists``) staged -> the
merged data info (``openood_info``) -> the ledger's intent, the commit, the image-root links, the ledger settled
(``export_folder``) -> the data info, the YAML config and what each loader still lacks (``ready``); see
``isood.stages.interop`` for the layout."""

from __future__ import annotations

import json
import os
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Mapping, Sequence

import yaml

from isood.core.defaults import DEFAULT_VERIFY
from isood.core.errors import BadInputError
from isood.core.files import TMP_PREFIX, atomic_write_bytes, output_lock
from isood.core.optspec import check_field
from isood.stages.interop.options import ExportOpenoodOptions
from isood.kinds import GRID_KINDS, SYN_IS, GridView, SplitsView
from isood.stages.interop.export_folder import (EXPORT_INFO, EXPORT_LEDGER, NAME_RE, RELEASE_DIR, Ledger,
                                                check_data_dir, holds_only_staging, make_link, unresolved)
from isood.stages.interop.id_lists import IdLists, id_list_paths, load_id_lists
from isood.stages.interop.openood import (EXPORT_KINDS, Exported, LineFiles, export_grid, export_lines, export_list,
                                          held_out)
from isood.stages.interop.openood_info import (ID_NAME, RELEASE_GRIDS, GroupRule, benchmark_record, dataset_config,
                                               folder_classes, folder_info, merge_info, missing_for_openood,
                                               missing_for_release)
from manifests import Manifest, read
from manifests.paths import is_inside

__all__ = ["EXPORT_YAML", "ExportResult", "export_openood", "USAGE"]

EXPORT_YAML = "openood_ood_dataset.yml"


@dataclass
class ExportResult:
    out: Path
    name: str | None = None  # the benchmark exported (None: ID lists only)
    imglists: dict[str, str] = field(default_factory=dict)  # dataset name -> OpenOOD imglist (relative to out)
    registered: list[str] = field(default_factory=list)  # datasets of this export in OpenOOD's near / far groups
    groups: dict[str, str] = field(default_factory=dict)  # dataset -> near / far / val / na
    rows: int = 0
    skipped: int = 0  # rows without a cell (level -1)
    release_lists: list[str] = field(default_factory=list)  # release-format lists written (relative to out)
    val: dict | None = None  # this export's OOD val split
    id_lists: dict[str, int] = field(default_factory=dict)  # ID split -> images written
    ready: dict[str, list[str]] = field(default_factory=dict)  # "openood" / "release" -> what the folder lacks
    num_classes: int | None = None  # the folder's number of ID classes (None: unknown yet)
    links: dict[str, str] = field(default_factory=dict)  # image folder of the data root -> what it links to
    empty_groups: list[str] = field(default_factory=list)  # OpenOOD groups (near / far) the folder leaves empty



def _read_info(out: Path) -> dict | None:
    """The folder's ``openood_data_info.json`` (None when there is none); a one-line error when it is not ours."""
    p = out / EXPORT_INFO
    if not p.is_file():
        return None
    try:
        data = json.loads(p.read_text(encoding="utf-8"))
    except (OSError, ValueError) as e:
        raise BadInputError(f"{p} cannot be read ({type(e).__name__}); remove it or pass a new --out") from None
    if not isinstance(data, dict):
        raise BadInputError(f"{p} is not an isood export's data info; pass a new --out")
    return data


def _prepare_out(out: Path) -> None:
    """Refuse an --out that is a file, or a folder holding anything but an earlier export (its data info or its
    ledger: an export killed before its data info) and the temporaries of a killed export."""
    if out.exists() and not out.is_dir():
        raise BadInputError(f"--out {out} is a file; pass a folder")
    if out.is_dir() and not ((out / EXPORT_INFO).is_file() or (out / EXPORT_LEDGER).is_file()):
        if any(not p.name.startswith(TMP_PREFIX) and not holds_only_staging(p) for p in out.iterdir()):
            raise BadInputError(f"--out {out} is not empty and holds no earlier isood export; pass a new folder")
    out.mkdir(parents=True, exist_ok=True)


def _default_name(m: Manifest) -> str:
    """An imported release keeps its folder name (`imagenet21k`), so its loader finds `imglist/imagenet21k/`;
    another manifest is named after its folder (`out/imagenet-ood` -> `imagenet-ood`), so exports of different
    manifests into one folder do not replace each other; `isood` when the folder name is not a usable name."""
    release = m.release_name if isinstance(m, SplitsView) else None
    for candidate in (release, Path(m.root).name):
        if candidate and re.fullmatch(NAME_RE, candidate):
            return candidate
    return "isood"


def _manifest_record(m: Manifest) -> dict:
    return {"path": str(m.root), "kind": m.kind, "dataset_version": m.dataset_version,
            "content_sha256": m.content_sha256}


def _grid_view(m: Manifest | None) -> GridView | None:
    """``m`` when it is a grid (a splits or syn-is manifest, ``GRID_KINDS``), else None."""
    if m is None or m.kind not in GRID_KINDS:
        return None
    assert isinstance(m, GridView)  # read(kind=...) returns the kind's registered view
    return m


def _read_manifest(manifest_dir, out: Path, verify: str) -> Manifest:
    m = read(manifest_dir, kind=EXPORT_KINDS, verify=verify)
    if is_inside(os.path.abspath(out), os.path.abspath(m.root)):
        raise BadInputError(f"--out {out} is inside the manifest {m.root}; pass a folder outside it")
    return m


def _image_root(m: Manifest | None, image_root: str | os.PathLike | None) -> str | None:
    """The folder a benchmark's image paths are relative to: ``--image-root``, else a splits manifest's
    ``test_root``, else a Syn-IS manifest's own folder; None when unknown (an imported list)."""
    if m is None:
        return None
    if image_root is not None:
        root = Path(os.path.abspath(Path(image_root).expanduser()))
        if not root.is_dir():
            raise BadInputError(f"--image-root {image_root} is not a folder; pass the folder the manifest's image "
                                "paths are relative to")
        return str(root)
    if isinstance(m, SplitsView) and m.test_root:  # stored absolute, or relative to the manifest
        return os.path.abspath(os.path.join(m.root, m.test_root))
    return str(m.root) if m.kind == SYN_IS else None


def _check_placement(out: Path, ids: Mapping[str, str | os.PathLike | None], id_root: str | os.PathLike | None,
                     image_root: str | None) -> None:
    """Refuse, before any work, an --out inside an input the export reads or links: an ID folder, the ID image
    root (``--id-root``, else the ID folders' parent), the benchmark's image root."""
    real = os.path.realpath(out)
    inputs = [(f"--id-{s}", v) for s, v in ids.items() if v is not None and Path(v).is_dir()]
    if id_root is not None:
        inputs.append(("--id-root", id_root))
    else:
        inputs += [(f"the ID image root (the parent of {opt}, linked as OUT/{ID_NAME})", Path(os.path.abspath(v)).parent)
                   for opt, v in list(inputs)]
    if image_root is not None:
        inputs.append(("the manifest's image root (linked as OUT/<data dir>)", image_root))
    for what, path in inputs:
        if is_inside(real, os.path.realpath(path)):
            raise BadInputError(f"--out {out} is inside {what} {path}, which the export reads; pass a folder "
                                "outside it")


def export_openood(manifest_dir: str | os.PathLike | None, out: str | os.PathLike, *, name: str | None = None,
                   data_root: str = "./data/", data_dir: str | None = None, num_classes: int | None = None,
                   verify: str = DEFAULT_VERIFY, near_axis: str | None = None, near_below: int | None = None,
                   group: str | None = None, val_cells: Sequence[str] | str | None = None,
                   id_train: str | os.PathLike | None = None, id_val: str | os.PathLike | None = None,
                   id_test: str | os.PathLike | None = None, id_root: str | os.PathLike | None = None,
                   classes: str | os.PathLike | None = None,
                   image_root: str | os.PathLike | None = None) -> ExportResult:
    """Export a splits, syn-is or image-list manifest (or none) and/or ID lists into the OpenOOD data root
    ``out``, merged with the exports already there (see the module docstring of ``isood.stages.interop``); holds
    ``out``'s lock (``isood.core.files.output_lock``). The images are read one row group at a time."""
    check_field(ExportOpenoodOptions, "num_classes", num_classes)
    ids = {"train": id_train, "val": id_val, "test": id_test}
    if manifest_dir is None and not any(ids.values()):
        raise BadInputError("nothing to export: pass a manifest, or ID lists (--id-train / --id-val / --id-test)")
    if manifest_dir is None and image_root is not None:
        raise BadInputError("--image-root is the image folder of a manifest's benchmark: pass a manifest, or --id-root "
                            "for the ID lists")
    if name is not None and not re.fullmatch(NAME_RE, name):
        raise BadInputError(f"--name {name!r}: start with a letter or digit, then letters, digits, '_', '-' or '.' "
                            "(one folder name, e.g. imagenet21k)")
    out = Path(out)
    m = _read_manifest(manifest_dir, out, verify) if manifest_dir is not None else None
    grid_m = _grid_view(m)
    grid = grid_m is not None
    if grid and group is not None:
        raise BadInputError(f"--group {group} is for an image list; a grid's cells are grouped by --near-axis and "
                            "--near-below (held out with --val-cells)")
    if m is not None and not grid and (near_axis is not None or near_below is not None):
        raise BadInputError("--near-axis / --near-below group a grid's cells; an image list joins --group near, "
                            "far or val")
    rule = GroupRule(axis=near_axis or "sem", below=near_below, group=group or "near").check(
        grid_m.n_levels if grid_m is not None else None)
    named = name
    name = name or (_default_name(m) if m is not None else None)
    data = check_data_dir(data_dir if data_dir is not None else f"{name}/") if name is not None else ""
    held = held_out(val_cells, grid_m.n_levels) if grid_m is not None else []
    if m is not None and m.kind not in GRID_KINDS and val_cells:
        raise BadInputError("--val-cells needs a grid (splits or syn-is manifest); to use an image list as the OOD "
                            "val split, export it with --group val")
    root = _image_root(m, image_root)
    _check_placement(out, ids, id_root, root)
    with output_lock(out):
        _prepare_out(out)
        ledger = Ledger.read(out)  # an altered ledger is refused before any work
        old = _read_info(out)
        merge_info(old, name or "", None, num_classes=num_classes)  # --num-classes / format refusals before work
        if m is not None and named is None:
            _check_default_name(old, name or "", m)
        gives_val = bool(held) or (m is not None and m.kind not in GRID_KINDS and rule.group == "val")
        if gives_val:
            others = [k for k, v in folder_info(old)["benchmarks"].items() if v.get("val") and k != name]
            if others:
                raise BadInputError(f"an OOD val split comes from {others[0]!r} already (OpenOOD takes one): "
                                    f"re-export {others[0]!r} without it, or leave --val-cells / --group val out")
        id_lists = load_id_lists({s: v for s, v in ids.items() if v is not None},
                                 num_classes=num_classes if num_classes is not None else folder_classes(
                                     folder_info(old)),
                                 id_root=id_root, classes=classes)
        return _export(m, out, name=name, data_root=data_root, data_dir=data, image_root=root,
                       num_classes=num_classes, rule=rule, held=held, old=old, ledger=ledger, id_lists=id_lists)


def _check_default_name(old: dict | None, name: str, m: Manifest) -> None:
    """Refuse to replace, under a default name, the export of another manifest (two folders both named `splits`):
    only an explicit --name replaces another manifest's export."""
    rec = folder_info(old)["benchmarks"].get(name)
    path = (rec or {}).get("manifest", {}).get("path")
    if path and os.path.realpath(path) != os.path.realpath(m.root):
        raise BadInputError(f"--out already holds the export {name!r} of another manifest ({path}): pass --name "
                            f"NAME to export {m.root} beside it (or --name {name} to replace it)")


def _planned_links(ledger: Ledger, old: dict | None, name: str | None, data_dir: str, image_root: str | None,
                   id_lists: IdLists) -> dict[str, dict[str, str]]:
    """The image-root links this export makes (export -> {folder: target}); one-line refusals when another export
    of the folder linked the same folder elsewhere."""
    links: dict[str, dict[str, str]] = {}
    if name is not None and data_dir and image_root is not None:
        rel = data_dir.rstrip("/")
        other = ledger.link_owner(rel, but=[name])
        if other is not None and other[1] != image_root:
            raise BadInputError(f"--data-dir {data_dir}: it links to {other[1]} for the export {other[0]!r}; pass "
                                "another --data-dir for this benchmark's images")
        links[name] = {rel: image_root}
    if id_lists.tables and id_lists.root is not None:
        have = ledger.links.get("@id", {}).get(ID_NAME)
        kept = [s for s in folder_info(old).get("id", {}) if s not in id_lists.tables]
        if have is not None and have != id_lists.root and kept:
            raise BadInputError(f"the ID lists of {'/'.join(kept)} in this folder are relative to {have} (linked as "
                                f"OUT/{ID_NAME}): pass --id-root {have}, or export every ID split again")
        links["@id"] = {ID_NAME: id_lists.root}
    return links


def _export(m: Manifest | None, out: Path, *, name: str | None, data_root: str, data_dir: str,
            image_root: str | None, num_classes: int | None, rule: GroupRule, held: Sequence[str],
            old: dict | None, ledger: Ledger, id_lists: IdLists) -> ExportResult:
    """The export steps under the lock: stream the benchmark and the ID lists into staged files, merge the data
    info (its refusals abort every staged file), record the intent in the ledger, commit, link the image roots,
    forget the old files, write the JSON and the YAML."""
    groups: dict[str, LineFiles] = {}
    exported = None
    id_info = {}
    before = Ledger(ledger.path, {k: list(v) for k, v in ledger.files.items()},
                    {k: dict(v) for k, v in ledger.links.items()})
    try:
        if m is not None:
            assert name is not None  # export_openood names every manifest's export
            groups[name] = files = LineFiles(out)
            grid_m = _grid_view(m)
            exported = (export_grid(grid_m, files, name=name, data_dir=data_dir, rule=rule, val_cells=held)
                        if grid_m is not None else
                        export_list(m, files, name=name, data_dir=data_dir, rule=rule, val_cells=held))
        for split, table in id_lists.tables.items():
            src = id_lists.sources[split]
            groups[f"@id:{split}"] = files = LineFiles(out)
            release_rel, openood_rel = id_list_paths(split)
            files.write(release_rel, table.column("path").combine_chunks())
            labelled = id_lists.labelled(split)
            if labelled:
                files.write(openood_rel, export_lines(table, where=f"--id-{split} {src.source}")[0])
            id_info[split] = {"n": table.num_rows, "source": src.source, "root": id_lists.root,
                              "data_dir": f"{ID_NAME}/", "imglist_path": openood_rel if labelled else None,
                              "release_path": release_rel}
        record = None
        if m is not None and exported is not None:
            assert name is not None  # as above
            release_n = sum(1 for rel in groups[name].files if rel.startswith(RELEASE_DIR + "/"))
            record = benchmark_record(exported.datasets, kind=m.kind, manifest=_manifest_record(m),
                                      n_levels=exported.n_levels, rule=rule, val=exported.val,
                                      release_lists=release_n)
            record["image_root"] = image_root
        n_from = "--num-classes" if num_classes is not None else "ID lists" if id_lists.tables else None
        info = merge_info(old, name or "", record, num_classes=id_lists.num_classes, num_classes_from=n_from,
                          id_lists=id_info, data_root=data_root)
        written = {k: list(g.files) for k, g in groups.items()}
        ledger.check_written(out, list(groups), [rel for fs in written.values() for rel in fs])
        links = _planned_links(ledger, old, name, data_dir, image_root, id_lists)
        ledger.intend(written, links)  # first: a kill from here on leaves files the ledger names
        for g in groups.values():
            g.commit()
    except BaseException:
        for g in groups.values():
            g.abort()
        raise
    made = {k: {rel: t for rel, t in v.items()
                if make_link(out, rel, t, recorded=before.link_owner(rel) is not None)} for k, v in links.items()}
    ledger.settle(out, before, written, made)
    info["ready"] = _ready(out, info, {f for fs in ledger.files.values() for f in fs})
    info["usage"] = USAGE
    atomic_write_bytes(out / EXPORT_INFO, (json.dumps(info, indent=2) + "\n").encode())
    atomic_write_bytes(out / EXPORT_YAML, yaml.safe_dump(dataset_config(info), sort_keys=False).encode())
    r = _result(out, name, exported, groups, info)
    r.links = {rel: t for v in made.values() for rel, t in v.items()}
    return r


def _ready(out: Path, info: dict, present: set[str]) -> dict[str, list[str]]:
    """What OpenOOD's Evaluator and the release's datasets.py still lack in ``out``: the lists
    (``missing_for_openood`` / ``missing_for_release``), then every image folder that is missing or does not hold
    its lists' images."""
    id_hint = "pass --id-root DIR with the ID lists"
    openood, release = [], []
    for v in info["id"].values():
        if v.get("imglist_path"):
            openood.append((v["data_dir"], v["imglist_path"], id_hint, False))
        release.append((f"{ID_NAME}/", v["release_path"], id_hint, True))
    for bench, rec in info["benchmarks"].items():
        hint = f"re-export {bench} with --image-root DIR"
        for d in [*rec["datasets"], *([rec["val"]] if rec.get("val") else [])]:
            if d.get("group", "val") in ("near", "far", "val") and d.get("imglist_path"):
                openood.append((d["data_dir"], d["imglist_path"], hint, False))
                if bench in RELEASE_GRIDS:
                    release.append((f"{bench}/", d["imglist_path"], hint, False))
    return {"openood": missing_for_openood(info) + unresolved(out, openood),
            "release": missing_for_release(present) + unresolved(out, release)}


def _result(out: Path, name: str | None, exported: Exported | None, groups: Mapping[str, LineFiles],
            info: dict) -> ExportResult:
    r = ExportResult(out=out, name=name, ready=info["ready"], num_classes=info["num_classes"],
                     empty_groups=list(info.get("empty_groups", [])))
    r.id_lists = {k.split(":", 1)[1]: info["id"][k.split(":", 1)[1]]["n"] for k in groups if k.startswith("@id:")}
    if exported is not None:
        assert name is not None  # an exported manifest is named
        ds = exported.datasets
        r.imglists = {d["dataset"]: d["imglist_path"] for d in ds if d["imglist_path"]}
        r.registered = [d["dataset"] for d in ds if d["group"] in ("near", "far")]
        r.groups = {d["dataset"]: d["group"] for d in ds}
        r.rows, r.skipped = exported.stream.rows, exported.stream.skipped
        r.release_lists = sorted(rel for rel in groups[name].files if rel.startswith(RELEASE_DIR + "/"))
        r.val = exported.val
    return r


USAGE = ("OpenOOD v1.5: from openood.evaluation_api import Evaluator, datasets; "
         "datasets.DATA_INFO['imagenet'] = json.load(open('openood_data_info.json'))['data_info']; "
         "datasets.benchmarks_dict['imagenet'] = []; Evaluator(net, id_name='imagenet', data_root=<this folder>, ...). "
         "Images: <this folder>/<data_dir of each dataset>/ (imagenet1k/ for the ID lists), linked by the export "
         "where it knows the image folder; 'ready' names any still to link. "
         "The IS-OOD release: its datasets.py with data_root=<this folder>.")
