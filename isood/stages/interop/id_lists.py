"""The in-distribution lists of an OpenOOD export (``isood export openood --id-train / --id-val / --id-test``):
read each source -> label every image (pure) -> the two list files of each split.

A source is either
- an image folder with one wnid sub-folder per class (``isood.features.listing.list_images``; ImageNet's ``train/``, or a
  ``val/`` sorted into class folders): the paths are written relative to the ID image root, by default the
  folder's parent (``--id-root``), so ``/data/in1k/train`` and ``/data/in1k/val`` give ``train/n01440764/...`` and
  ``val/n01440764/...``, both under one root; or
- a list file (``isood.stages.interop.imports.parse_list``): ``path`` or OpenOOD's ``path label`` per line, paths
  kept exactly as listed (relative to the root the user links).

Labels (OpenOOD's ID lists need one per line, a class index in ``[0, num_classes)``): a list's own label, else
the class index of the path's wnid in the class list of ``isood.classifiers.classes.class_list`` (``--classes``
FILE, else the sorted wnids of the ID training images, the ImageNet-1K order for ``--num-classes 1000``). A
line with neither is an error naming the file and line, but for a list with neither on any line (the release's
own flat ``test_imagenet.txt``): it is written for the release as it is, and OpenOOD's list of that split is not
written (OpenOOD takes a label of -1 as OOD). The number of ID classes (OpenOOD's ``num_classes``) is
``--num-classes`` when given, else the class list's length, else one more than the largest label.

Each split is written twice, both read from the ID image root ``<data root>/imagenet1k/`` (the release's
``IN1K_ROOT``): ``imglist/imagenet1k/<split>_imagenet.txt`` (the release's ``datasets.py``: the path alone, the
whole line is the path) and ``benchmark_imglist/imagenet1k/<split>_imagenet1k.txt`` (OpenOOD's ``ImglistDataset``:
``path label``). ``--id-root`` (default: the folders' parent) is linked as ``<data root>/imagenet1k``.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Mapping, Sequence

import numpy as np
import pyarrow as pa

from isood.core.defaults import OOD_LABEL
from isood.core.errors import BadInputError
from isood.classifiers.classes import class_list, labels_for, read_class_file
from isood.features.listing import list_images
from isood.stages.interop.imports import parse_list
from isood.stages.interop.openood_info import ID_NAME, ID_SPLITS
from wordnet_tools.wnids import wnid_from_path

__all__ = ["IdSource", "IdLists", "read_id_source", "id_labels", "id_list_paths", "load_id_lists"]


@dataclass
class IdSource:
    """One split's images as read: ``paths`` as they go into the lists, ``labels`` (``OOD_LABEL`` where the
    source gave none), ``wnids`` ('' where the path names no class), ``lines`` (the list file's line numbers;
    empty for a folder), ``source`` (what the user passed) and ``root`` (the folder the paths are relative to;
    None for a list file: as listed)."""

    split: str
    paths: list[str]
    labels: np.ndarray
    wnids: list[str]
    lines: list[int]
    source: str
    root: str | None


def id_list_paths(split: str) -> tuple[str, str]:
    """(the release's list, OpenOOD's list) of ``split``, relative to the export folder."""
    return f"imglist/{ID_NAME}/{split}_imagenet.txt", f"benchmark_imglist/{ID_NAME}/{split}_{ID_NAME}.txt"


def read_id_source(split: str, src: str | os.PathLike, *, id_root: str | os.PathLike | None = None) -> IdSource:
    """The images of one ``--id-<split>`` source (module docstring); one-line errors for a missing source, an
    empty one, or a folder outside ``id_root``."""
    option = f"--id-{split}"
    p = Path(os.path.abspath(Path(src).expanduser()))
    if p.is_dir():
        listed = list_images(p)
        root = Path(os.path.abspath(id_root)) if id_root is not None else p.parent
        try:
            prefix = p.relative_to(root).as_posix()
        except ValueError:
            raise BadInputError(f"{option} {p} is not inside --id-root {root}; pass a folder under it") from None
        rel = listed.table["path"].astype(str).tolist()
        paths = [f"{prefix}/{r}" if prefix not in ("", ".") else r for r in rel]
        wnids = listed.table["wnid"].fillna("").astype(str).tolist()
        return IdSource(split, paths, np.full(len(paths), OOD_LABEL, np.int64), wnids, [], str(src), str(root))
    if p.is_file():
        entries = parse_list(p, labels="optional", name=f"{option} {p}", verbatim=True)
        if not entries:
            raise BadInputError(f"{option} {p} lists no image; pass a list with one image per line")
        paths = [e.path for e in entries]
        return IdSource(split, paths, np.array([e.label for e in entries], np.int64),
                        [wnid_from_path(x) or "" for x in paths], [e.line for e in entries], str(src), None)
    raise BadInputError(f"{option} {src} does not exist; pass an image folder with wnid sub-folders or a list file "
                        "('path' or 'path label' per line)")


def _unlabelled(src: IdSource) -> bool:
    """Whether a split has neither a class label nor a wnid on any line (the release's flat
    ``test_imagenet.txt``): it is written for the release only."""
    return bool(len(src.labels)) and bool((src.labels == OOD_LABEL).all()) and not any(src.wnids)


def id_labels(sources: Mapping[str, IdSource], *, num_classes: int | None,
              classes: Sequence[str] | None = None) -> tuple[dict[str, np.ndarray | None], int | None]:
    """Every image's class index, per split (pure), and the number of ID classes: a list's own label, else its
    wnid's index in the class list (module docstring). A split without any label or wnid (``_unlabelled``) gets
    None (no classes to give it) unless ``classes`` is given, which then fails on its first line. The number of
    classes is ``num_classes`` when given, else the length of the class list, else one more than the largest
    label (None when no split is labelled). One-line errors name the source and line."""
    blank = {s for s, src in sources.items() if _unlabelled(src) and classes is None}
    need = {s: src for s, src in sources.items() if (src.labels == OOD_LABEL).any() and s not in blank}
    order = None
    if need:
        base = sources.get("train") or next(iter(sources.values()))
        wnids = [w for s in ([base] if "train" in sources else sources.values()) for w in s.wnids if w]
        if not wnids and classes is None:
            first = next(iter(need.values()))
            i = int(np.flatnonzero(first.labels == OOD_LABEL)[0])  # the first line without a label
            where = f"{first.source}:{first.lines[i]}" if first.lines else first.source
            raise BadInputError(f"--id-{first.split} {where}: no class label and no wnid in the path; pass an OpenOOD "
                                "imglist ('path label'), class folders, or --classes FILE")
        order = class_list(wnids or list(classes or []), num_classes, listed=classes, model_name="--num-classes")
    elif classes is not None:
        order = list(classes)
    out: dict[str, np.ndarray | None] = {}
    for split, src in sources.items():
        if split in blank:
            out[split] = None
            continue
        labels = src.labels.copy()
        missing = labels == OOD_LABEL
        if missing.any():
            no_wnid = [i for i in np.flatnonzero(missing) if not src.wnids[i]]
            if no_wnid:
                i = int(no_wnid[0])
                where = f"{src.source}:{src.lines[i]}" if src.lines else f"{src.source} ({src.paths[i]})"
                raise BadInputError(f"--id-{split} {where}: no class label and no wnid in the path; pass an OpenOOD "
                                    "imglist ('path label') or class folders")
            assert order is not None  # set above: this split has images without a label (``need``)
            labels[missing] = labels_for([src.wnids[i] for i in np.flatnonzero(missing)], order, strict=True,
                                         what=f"--id-{split} {src.source}")
        out[split] = labels
    labelled = [v for v in out.values() if v is not None and len(v)]
    n = num_classes if num_classes is not None else len(order) if order is not None else \
        int(max(int(v.max()) for v in labelled)) + 1 if labelled else None
    for split, given in out.items():
        if given is None or n is None:
            continue
        bad = np.flatnonzero((given < 0) | (given >= n))
        if bad.size:
            src, i = sources[split], int(bad[0])
            where = f"{src.source}:{src.lines[i]}" if src.lines else src.source
            raise BadInputError(f"--id-{split} {where}: label {int(given[i])} is not a class index in 0.."
                                f"{n - 1}; fix the list or pass --num-classes")
    return out, n


@dataclass
class IdLists:
    """The ID splits of one export: each split's source and table (path, label; label null for a split written
    for the release only: ``id_labels``), the number of ID classes (None: unknown) and the folder the paths are
    relative to (``--id-root``, else the folders' common parent; None when only lists were given)."""

    sources: dict[str, IdSource]
    tables: dict[str, pa.Table]
    num_classes: int | None
    root: str | None

    def labelled(self, split: str) -> bool:
        return self.tables[split].column("label").null_count == 0


def load_id_lists(specs: Mapping[str, str | os.PathLike | None], *, num_classes: int | None,
                  id_root: str | os.PathLike | None = None,
                  classes: str | os.PathLike | None = None) -> IdLists:
    """Read and label the given ID splits (``{split: source or None}``). Folder sources of different splits must
    share one root (the release reads one ID image root)."""
    unknown = sorted(set(specs) - set(ID_SPLITS))
    if unknown:
        raise BadInputError(f"unknown ID split(s) {', '.join(unknown)}: pass {', '.join(ID_SPLITS)}")
    sources = {s: read_id_source(s, src, id_root=id_root) for s, src in specs.items() if src is not None}
    roots = {src.root for src in sources.values() if src.root is not None}
    if len(roots) > 1:
        raise BadInputError(f"the ID folders lie under different roots ({', '.join(sorted(roots))}); the release reads "
                            "one ID image root: pass --id-root with the folder holding them all")
    listed = read_class_file(classes) if classes is not None else None
    labels, n = id_labels(sources, num_classes=num_classes, classes=listed) if sources else ({}, num_classes)
    tables = {s: pa.table({"path": pa.array(src.paths, pa.string()),
                           "label": pa.array(labels[s], pa.int64()) if labels[s] is not None else
                           pa.nulls(len(src.paths), pa.int64())}) for s, src in sources.items()}
    root = os.path.abspath(id_root) if id_root is not None else next(iter(roots), None)
    return IdLists(sources, tables, n, root)
