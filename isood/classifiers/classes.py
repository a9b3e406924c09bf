"""What a classifier's logit ``k`` means (its class list) and the class label of each image.

The model's class wnids in logit order (``class_list``), in this order of precedence: ``--classes FILE`` (one
wnid per line); else the sorted wnids of ``--id-train`` when the model has that many classes; else, for a
1000-class model whose ID wnids are all ImageNet-1K classes, the ImageNet-1K order (= sorted ImageNet-1K wnids,
the order of every standard ImageNet model). Anything else is a class-count mismatch (an error naming both
counts). A test image whose wnid is an ID class keeps its class index (the model may still classify a
covariate-shifted image correctly); other test images are semantic OOD (label ``OOD_LABEL``, never correct).

An ID test set whose paths name no class (the IS-OOD release's ``test_imagenet.txt``: ``./val/ILSVRC2012_val_*``)
takes its labels from a ground-truth file (``--id-test-labels``, ``label_file`` / ``labels_from_file``), or has
none: OOD metrics need no label, accuracy and the correctness metrics are then not computed.
"""

from __future__ import annotations

import os
import posixpath
import re
from pathlib import Path
from typing import Mapping, Sequence

import numpy as np
import pandas as pd

from isood.core.defaults import OOD_LABEL
from isood.core.errors import BadInputError
from isood.core.textio import read_lines
from wordnet_tools.synsets import load_synset_list
from wordnet_tools.wnids import is_wnid, wnid_from_path

__all__ = ["imagenet_1k", "read_class_file", "class_list", "labels_for", "wnids_of", "outputs_labels",
           "label_file", "labels_from_file"]


def imagenet_1k() -> list[str]:
    """The ImageNet-1K wnids in the standard (sorted) logit order."""
    return list(load_synset_list("1k"))


def read_class_file(path: str | os.PathLike) -> list[str]:
    """The first word of every non-empty, non-comment line of a ``--classes`` file."""
    p = Path(path)
    if not p.is_file():
        raise BadInputError(f"--classes {p}: file not found; pass a file with one wnid per line")
    return [ln.split()[0] for ln in read_lines(p, what="--classes") if ln.strip() and not ln.startswith("#")]


def class_list(id_wnids: Sequence[str], n_model_classes: int | None, *, listed: Sequence[str] | None = None,
               model_name: str = "model") -> list[str]:
    """The model's class wnids in logit order (see the module docstring), or a one-line error.

    ``id_wnids``: the wnids of the ID training images; ``listed``: the ``--classes`` file's wnids, if given.
    """
    wnids = sorted(set(w for w in id_wnids if w))
    if not wnids:
        raise BadInputError("--id-train has no class folders: pass a folder with one wnid sub-folder per class")
    if listed is not None:
        listed = list(listed)
        if n_model_classes is not None and len(listed) != n_model_classes:
            raise BadInputError(f"class-count mismatch: --classes lists {len(listed)} classes but model "
                                f"'{model_name}' has {n_model_classes} outputs: list one wnid per model output")
        missing = sorted(set(wnids) - set(listed))
        if missing:
            raise BadInputError(f"--id-train classes {', '.join(missing[:5])} are not in --classes: use the model "
                                "trained on the ID classes")
        return listed
    if n_model_classes is None or len(wnids) == n_model_classes:
        return wnids
    if n_model_classes == 1000:
        in1k = imagenet_1k()
        if set(wnids) <= set(in1k):
            return in1k
    shown = ", ".join(wnids[:3]) + (", ..." if len(wnids) > 3 else "")
    raise BadInputError(f"class-count mismatch: model '{model_name}' has {n_model_classes} classes but --id-train "
                        f"has {len(wnids)} class folders ({shown}): pass the model trained on these classes, "
                        "--num-classes with --checkpoint, or --classes FILE listing the model's classes in order")


def labels_for(wnids: Sequence[str], classes: Sequence[str], *, strict: bool, what: str) -> np.ndarray:
    """Class index of each wnid in ``classes``; ``OOD_LABEL`` for the others, or (``strict``) an error naming
    them (``what``: the option the wnids came from)."""
    index = {w: i for i, w in enumerate(classes)}
    if strict:
        missing = sorted(set(wnids) - set(index))
        if "" in missing:
            n = sum(1 for w in wnids if not w)
            raise BadInputError(f"{what}: {n} image(s) have no wnid in their path; put each class in a wnid "
                                "folder (e.g. n01440764/) or pass precomputed outputs with labels")
        if missing:
            raise BadInputError(f"{what}: classes {', '.join(missing[:5])} are not ID classes of the model "
                                "(not in --id-train / --classes): remove them or fix the class list")
    return np.array([index.get(w, OOD_LABEL) for w in wnids], dtype=np.int64)


def wnids_of(table: pd.DataFrame) -> list[str]:
    """The wnid of each row: its ``wnid`` column, else ``wordnet_tools.wnids.wnid_from_path`` of its ``path``
    ('' when the path names no class)."""
    if "wnid" in table.columns:
        return table["wnid"].fillna("").astype(str).tolist()
    return [wnid_from_path(p) or "" for p in table["path"].astype(str)]


def outputs_labels(index: pd.DataFrame, classes: Sequence[str] | None, *, strict: bool, what: str) -> np.ndarray:
    """Labels of a precomputed-outputs index: its ``label`` column (when there is no class list to map wnids
    with), else its wnids mapped by ``labels_for``."""
    if "label" in index.columns and ("wnid" not in index.columns or classes is None):
        return index["label"].fillna(OOD_LABEL).astype(np.int64).to_numpy()
    if classes is None:
        raise BadInputError(f"{what}: index.parquet needs a 'label' column (or wnids plus --classes)")
    return labels_for(wnids_of(index), classes, strict=strict, what=what)


def _key(path: str) -> str:
    """A path as a label file's key: ``/`` separators, normalised, without a leading ``./``."""
    return posixpath.normpath(str(path).replace("\\", "/")).lstrip("/")


def _is_label(token: str) -> bool:
    return is_wnid(token) or re.fullmatch(r"-?\d+", token) is not None


def label_file(path: str | Path, *, what: str = "--id-test-labels") -> dict[str, str]:
    """The ``image -> label`` entries of a ground-truth file: one ``<image> <label>`` per line, separated by
    whitespace or a comma (further fields ignored, so OpenOOD imglists and ImageNet's ``LOC_val_solution.csv``
    read as they are); ``<image>`` a path or file name (with or without extension), ``<label>`` a wnid or a
    class index in the model's logit order. Blank lines, ``#`` comments and a header line (a first line whose
    label is neither) are skipped; anything else malformed, or an image listed twice with two labels, is a
    one-line error naming the line."""
    out: dict[str, str] = {}
    first = True
    for no, line in enumerate(read_lines(path, what=what), start=1):
        text = line.strip()
        if not text or text.startswith("#"):
            continue
        tokens = [t for t in re.split(r"[,\s]+", text) if t]
        header, first = first, False
        if len(tokens) < 2 or not _is_label(tokens[1]):
            if header and len(tokens) >= 2:
                continue
            raise BadInputError(f"{what} {path}:{no}: expected '<image> <label>' (label: a wnid or a class index), "
                                f"got {text[:80]!r}")
        key = _key(tokens[0])
        if out.get(key, tokens[1]) != tokens[1]:
            raise BadInputError(f"{what} {path}:{no}: {tokens[0]} is labelled {out[key]} earlier and {tokens[1]} "
                                "here: give each image one label")
        out[key] = tokens[1]
    if not out:
        raise BadInputError(f"{what} {path} lists no label: write one '<image> <label>' line per image")
    return out


def _lookup(entries: Mapping[str, str]) -> list[dict[str, str]]:
    """Indexes of a label file by key, by file name and by file stem (names that are ambiguous left out)."""
    by_name: dict[str, str | None] = {}
    by_stem: dict[str, str | None] = {}
    for key, label in entries.items():
        name = posixpath.basename(key)
        stem = posixpath.splitext(name)[0]
        for index, k in ((by_name, name), (by_stem, stem)):
            index[k] = label if k not in index or index[k] == label else None
    return [dict(entries), {k: v for k, v in by_name.items() if v is not None},
            {k: v for k, v in by_stem.items() if v is not None}]


def labels_from_file(paths: Sequence[str], entries: Mapping[str, str], classes: Sequence[str] | None,
                     n_classes: int | None, *, what: str = "--id-test-labels") -> np.ndarray:
    """The class index of each image of ``paths`` (relative paths) from a ground-truth file's ``entries``
    (``label_file``): matched by path, else file name, else file stem. A wnid label is mapped through
    ``classes`` (the model's class list), an index checked against ``n_classes``. One-line errors: an image
    without a label, a wnid that is no class of the model, an index outside the model's classes."""
    indexes = _lookup(entries)
    tokens: list[str | None] = []
    for p in paths:
        key = _key(p)
        name = posixpath.basename(key)
        found = next((ix[k] for ix, k in zip(indexes, (key, name, posixpath.splitext(name)[0])) if k in ix), None)
        tokens.append(found)
    missing = [p for p, t in zip(paths, tokens) if t is None]
    if missing:
        raise BadInputError(f"{what} has no label for {len(missing)} of {len(paths)} --id-test images (first: "
                            f"{missing[0]}): list every image (path, file name or stem, then its label)")
    labels = [t for t in tokens if t is not None]  # one per path (none is missing)
    index = {w: i for i, w in enumerate(classes)} if classes is not None else None
    out = np.empty(len(labels), dtype=np.int64)
    for i, t in enumerate(labels):
        if is_wnid(t):
            if index is None:
                raise BadInputError(f"{what} labels images by wnid ({t}) but the model's class list is unknown: "
                                    "pass --classes (its wnids in logit order) or --id-train")
            if t not in index:
                raise BadInputError(f"{what}: label {t} of {paths[i]} is not a class of the model (not in "
                                    "--classes / --id-train): the labels do not match the model")
            out[i] = index[t]
        else:
            v = int(t)
            if n_classes is not None and not 0 <= v < n_classes:
                raise BadInputError(f"{what}: label {v} of {paths[i]} is outside the model's {n_classes} classes "
                                    f"(0..{n_classes - 1}): the labels do not match the model")
            out[i] = v
    return out
