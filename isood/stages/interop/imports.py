"""Imports of OOD image lists from other tools (parse the list file -> build the table (pure) -> write the
manifest with its dataset card): ImageNet-OOD lists and OpenOOD imglists; the line parser the IS-OOD release
import (``isood.stages.interop.release``) falls back on. See ``isood.stages.interop`` for the formats."""

from __future__ import annotations

import os
from typing import Iterable, NamedTuple, Sequence

import numpy as np
import pandas as pd

from isood.core.defaults import OOD_LABEL
from isood.core.errors import BadInputError
from isood.kinds import IMAGE_LIST
from isood.core.textio import decode_text, read_lines
from manifests import Manifest, input_record, read, write_with_card, writing
from isood.core.inputs import entry_problem
from manifests.paths import check_relative
from wordnet_tools.wnids import wnid_from_path

__all__ = ["ListFormatError", "ListEntry", "parse_lines", "parse_list", "image_list_table", "import_imagenet_ood",
           "import_openood_imglist"]

_EXPECTED = {"none": "one relative image path", "optional": "'<path>' or '<path> <integer label>'",
             "required": "'<path> <integer label>' (OpenOOD imglist)"}


class ListFormatError(BadInputError):
    """A malformed line in an image list (the message names file and line)."""


class ListEntry(NamedTuple):
    """One entry of a list file: the image path (relative), its label (OOD_LABEL when the line has none) and
    the line number."""

    path: str
    label: int
    line: int


# -------------------------------------------------------------------------------------------------- parsing
def _parse_line(text: str, *, labels: str, where: str, verbatim: bool = False) -> tuple[str, int]:
    tokens = text.split()
    label = OOD_LABEL
    ok = len(tokens) == 1 and labels != "required" or len(tokens) == 2 and labels != "none"
    if ok and len(tokens) == 2:
        try:
            label = int(tokens[1])
        except ValueError:
            ok = False
    if not ok:
        raise ListFormatError(f"{where}: expected {_EXPECTED[labels]} per line, got {text[:120]!r}")
    if not -2**63 <= label < 2**63:
        raise ListFormatError(f"{where}: label {tokens[1]!r} is out of range (64-bit integers)")
    problem = entry_problem(tokens[0])  # the input-path policy (isood.core.inputs)
    if problem is not None:
        raise ListFormatError(f"{where}: image path {tokens[0]!r} {problem}; use paths relative to the dataset "
                              "root, without control characters")
    return (tokens[0] if verbatim else check_relative(tokens[0])), label


def parse_lines(lines: Iterable[bytes | str], *, labels: str = "optional", name: str = "list",
                verbatim: bool = False) -> list[ListEntry]:
    """Entries of the lines of a list file (pure); blank lines and `#` comments are skipped; a line given as
    bytes is decoded by ``isood.core.textio.decode_text`` (UTF-8).

    labels: "none" (one path per line, ImageNet-OOD), "optional" (`path` or `path label`, IS-OOD lists),
    "required" (`path label`, OpenOOD imglists). A missing label is OOD_LABEL. Paths must be relative, without
    `..` and without whitespace (OpenOOD splits a line at its first space); they are normalised (`./a` -> `a`,
    `\\` -> `/`) unless `verbatim` (then kept as listed). Errors name `name:line`.
    """
    if labels not in _EXPECTED:
        raise BadInputError(f"labels={labels!r}; pass one of {', '.join(_EXPECTED)}")
    out: list[ListEntry] = []
    for no, raw in enumerate(lines, start=1):
        line = raw if isinstance(raw, str) else decode_text(raw, name, line=no, error=ListFormatError)
        text = line.strip()
        if text and not text.startswith("#"):
            out.append(ListEntry(*_parse_line(text, labels=labels, where=f"{name}:{no}", verbatim=verbatim), no))
    return out


def parse_list(path: str | os.PathLike, *, labels: str = "optional", name: str | None = None,
               verbatim: bool = False) -> list[ListEntry]:
    """`parse_lines` of a list file read by ``isood.core.textio`` (UTF-8, a byte-order mark dropped; errors name
    `name`, default the path)."""
    name = name or str(path)
    return parse_lines(read_lines(path, name=name, error=ListFormatError), labels=labels, name=name,
                       verbatim=verbatim)


# --------------------------------------------------------------------------------------------- image lists
def _images_frame(rows: list[dict], columns: Sequence[str]) -> pd.DataFrame:
    df = pd.DataFrame(rows, columns=list(columns))
    for c in df.columns:
        df[c] = df[c].astype({"label": np.int64}.get(c, object))
    return df


def image_list_table(entries: Sequence[ListEntry], *, name: str) -> pd.DataFrame:
    """The `images` table (path, wnid, label) of an image list (pure); an empty list or a path listed twice is
    an error naming `name` (and the line)."""
    if not entries:
        raise BadInputError(f"{name}: the list has no entries")
    seen: dict[str, int] = {}
    for path, _, no in entries:
        if path in seen:
            raise ListFormatError(f"{name}:{no}: {path!r} is already listed at line {seen[path]}")
        seen[path] = no
    rows = [{"path": p, "wnid": wnid_from_path(p), "label": lab} for p, lab, _ in entries]
    return _images_frame(rows, ["path", "wnid", "label"])


def _import_one_list(file: str | os.PathLike, out: str | os.PathLike, *, fmt: str, labels: str,
                     argv: list[str] | None) -> Manifest:
    with writing(out, IMAGE_LIST, inputs=[file]) as o:
        images = image_list_table(parse_list(file, labels=labels), name=str(file))
        write_with_card(
            o.work, kind=IMAGE_LIST, tables={"images": images},
            config={"import": fmt, "source_file": os.path.abspath(file)}, inputs=[input_record(fmt, file)],
            summary={"images": len(images), "labels": sorted(int(x) for x in images["label"].unique())[:20]},
            note=f"imported from {fmt} list", argv=argv, title=f"OOD image list (imported {fmt})",
        )
    return read(o.final, kind=IMAGE_LIST)


def import_imagenet_ood(file: str | os.PathLike, out: str | os.PathLike, *, argv: list[str] | None = None) -> Manifest:
    """ImageNet-OOD list (one relative image path per line) -> `image-list` manifest with label -1."""
    return _import_one_list(file, out, fmt="imagenet-ood", labels="none", argv=argv)


def import_openood_imglist(file: str | os.PathLike, out: str | os.PathLike, *,
                           argv: list[str] | None = None) -> Manifest:
    """OpenOOD imglist (`path label` per line) -> `image-list` manifest keeping the labels."""
    return _import_one_list(file, out, fmt="openood-imglist", labels="required", argv=argv)
