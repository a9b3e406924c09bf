"""Class labels (the semantic part of LAID's training texts, and the labels of Syn-IS prompts) from the
sources users name with ``--labels``.

A source is one of: a named ImageNet list (``21k`` default, ``1k``, ``21k-p``, ``21k-p-w21``, ``12k``,
``21k-goog``; names = first lemma of timm's ``imagenet_synset_to_lemma.txt``), a class-filter (or audit)
manifest directory (its kept classes, ``isood wordnet filter --out``), a dataset root (its wnid subfolders), or
a text file with one entry per line: a wnid (named from timm's lemma file), ``wnid<TAB or space>label``, or a
free-text label (wnid ``''``). Blank lines and ``#`` comments are skipped.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Iterable, Mapping

import numpy as np
import pandas as pd

import manifests
from isood.core.defaults import DEFAULT_VERIFY
from isood.core.errors import BadInputError
from isood.kinds import AUDIT, CLASS_FILTER, ClassFilterView
from isood.core.textio import read_lines
from wordnet_tools.synsets import NAMED_LISTS, imagenet_names, load_synset_list
from wordnet_tools.wnids import is_wnid

__all__ = ["Labels", "LabelError", "load_labels", "labels_from_lines", "labels_from_manifest", "DEFAULT_LABELS"]

#: The default label source: ImageNet-21K (the IS-OOD recipe).
DEFAULT_LABELS = "21k"


class LabelError(BadInputError):
    """A label source is empty, unreadable or names a class without a name."""


@dataclass(frozen=True, eq=False)
class Labels:
    """Labels as a table ``frame`` (columns wnid, label; wnid ``''`` for a free-text label; one row per wnid,
    or per label without one, in source order) and a ``description`` of the source (recorded with LAID)."""

    frame: pd.DataFrame
    description: str

    @property
    def texts(self) -> list[str]:
        """The distinct label strings, in order (LAID's training labels)."""
        return list(dict.fromkeys(str(x) for x in self.frame["label"]))

    def __len__(self) -> int:
        return len(self.frame)


def _labels_frame(rows: Iterable[tuple[str, str]], source: str) -> pd.DataFrame:
    """(wnid, label) rows without empty labels, deduplicated by wnid (by label where there is no wnid)."""
    df = pd.DataFrame(list(rows), columns=["wnid", "label"], dtype=object)
    df["wnid"] = df["wnid"].fillna("").astype(str)
    df["label"] = df["label"].fillna("").astype(str).str.strip()
    df = df[df["label"] != ""]
    key = np.where(df["wnid"] != "", df["wnid"], "label:" + df["label"])
    df = df.loc[~pd.Series(key, index=df.index).duplicated()].reset_index(drop=True)
    if df.empty:
        raise LabelError(f"no labels in {source}; pass --labels 21k, a class-filter manifest, or a file of "
                         "wnids/labels")
    return df


def _first_lemma(lemmas: str) -> str:
    return lemmas.split(",")[0].strip()


def labels_from_lines(lines: Iterable[str], source: str, names: Mapping[str, str] | None = None) -> pd.DataFrame:
    """Parse label lines (module docstring) into a (wnid, label) table. A wnid is named from ``names``
    (default: timm's lemma file), else from the label written after it; a wnid with neither is an error."""
    rows = []
    for line_no, raw in enumerate(lines, start=1):
        text = raw.split("#", 1)[0].strip()
        if not text:
            continue
        first, _, rest = text.partition("\t") if "\t" in text else text.partition(" ")
        first, rest = first.strip(), rest.strip()
        if is_wnid(first):
            names = imagenet_names() if names is None else names
            label = names.get(first) or (_first_lemma(rest) if rest else "")
            if not label:
                raise LabelError(f"{source}:{line_no}: wnid {first} has no known name; write 'wnid<TAB>label' on "
                                 "that line")
            rows.append((first, label))
        else:
            rows.append(("", text))
    return _labels_frame(rows, source)


def labels_from_manifest(root: str | Path, *, verify: str | None = DEFAULT_VERIFY) -> pd.DataFrame:
    """The kept classes of a class-filter (or audit) manifest as a (wnid, label) table, sorted by wnid; a class
    without a name in the manifest is named from timm's lemma file."""
    view = manifests.read(root, kind=(CLASS_FILTER, AUDIT), verify=verify)
    assert isinstance(view, ClassFilterView)  # both kinds' registered views are ClassFilterViews
    wnids, own = view.kept()
    names = imagenet_names()
    rows = [(w, own.get(w) or names.get(w, "")) for w in wnids]
    missing = [w for w, label in rows if not label]
    if missing:
        raise LabelError(f"{root}: {len(missing)} kept classes have no name (e.g. {missing[0]}); pass a labels file "
                         "instead")
    return _labels_frame(rows, f"{root} (kept classes)")


def _read_lines(path: Path) -> list[str]:
    return read_lines(path, what="labels file", error=LabelError)


def load_labels(spec: str | Path | None = DEFAULT_LABELS, *, verify: str | None = DEFAULT_VERIFY) -> Labels:
    """Labels from a source (module docstring); ``None`` or ``''`` means the default ``21k``. A class-filter or
    audit manifest is verified first (``verify``: 'fast' or 'full')."""
    spec = DEFAULT_LABELS if spec is None or str(spec).strip() == "" else spec
    if isinstance(spec, str) and spec in NAMED_LISTS:
        wnids = load_synset_list(spec)
        names = imagenet_names()
        frame = _labels_frame(((w, names.get(w, "")) for w in wnids), f"--labels {spec}")
        return Labels(frame, f"{spec} ({len(wnids)} wnids, timm lemmas)")
    path = Path(spec).expanduser()
    if path.is_dir() and (path / manifests.MANIFEST_FILE).is_file():
        frame = labels_from_manifest(path, verify=verify)
        return Labels(frame, f"class filter {path} ({len(frame)} kept classes)")
    if path.is_dir():
        wnids = load_synset_list(path)
        names = imagenet_names()
        unnamed = [w for w in wnids if not names.get(w)]
        if unnamed:  # never dropped silently: a class of the dataset would be missing from the labels
            raise LabelError(f"--labels {path}: {len(unnamed)} wnid folder(s) have no known name (e.g. {unnamed[0]}); "
                             "pass a labels file with 'wnid<TAB>label' lines instead")
        return Labels(_labels_frame(((w, names[w]) for w in wnids), str(path)),
                      f"dataset root {path} ({len(wnids)} wnids)")
    if path.is_file():
        frame = labels_from_lines(_read_lines(path), str(path))
        return Labels(frame, f"file {path} ({frame['label'].nunique()} labels)")
    raise LabelError(f"unknown --labels {str(spec)!r}: pass one of {', '.join(NAMED_LISTS)}, a class-filter manifest "
                     "directory, a dataset root, or a file with one wnid or label per line")
