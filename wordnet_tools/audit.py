"""Audit a class list or an image list against the ImageNet-OOD rules (leaks of ID semantics into an OOD set).

``parse_class_list`` turns lines into wnids with ``wordnet_tools.wnids.wnid_from_path`` (the one rule of isood);
accepted line forms (blank lines and ``#`` comments skipped):

- a wnid: ``n01440764`` (or a path ending in a class folder: ``train/n01440764``)
- an image path whose nearest wnid-named folder is the class: ``n01440764/x.JPEG``, ``a/b/n01440764/x.JPEG``
- an ImageNet file name: ``n01440764_10026.JPEG`` (used when no folder is a wnid)
- any of these followed by whitespace and more fields (OpenOOD imglists: ``path label``)

``audit_classes`` applies the filter's rules (``class_filter.ClassRules``, the same code) to every listed class
and counts the list entries (images) per class and per rule.

``audit_images`` audits the main table of a manifest with a ``wnid`` column (a splits manifest, an import of a
release, an image list): the rules are per class, so each distinct class is checked once and its verdict mapped
onto the images (Arrow dictionary codes, no per-row Python), giving a per-image ``rule`` column and, for a
graded manifest, the images and classes per rule in each cell and each level (``wordnet_tools.rules``). The
same steps take a table too large for memory one row group at a time (``isood wordnet audit`` on a manifest):
``count_wnids`` per piece (the entries per class, hence the verdicts), then ``ImageAuditor.add`` per piece (its
rows with their rule, and running per-cell / per-level counts, ``rules.RuleTally``).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc

from isood.core.errors import BadInputError
from wordnet_tools.class_filter import DEFAULT_EXCLUDE, ClassRules
from wordnet_tools.errors import ClassListError
from wordnet_tools.hierarchy import Hierarchy
from wordnet_tools.rules import RuleTally, class_rule_map, rule_codes
from wordnet_tools.wnids import wnid_from_path

#: Columns of an audited table carried into the per-image audit table (when present), then ``rule``.
IMAGE_COLUMNS: tuple[str, ...] = ("path", "wnid", "cell", "cov_level", "sem_level", "subset", "source")


def parse_class_list(lines: Iterable[str], source_name: str) -> list[tuple[int, str]]:
    """(line number, wnid) for every entry of a class or image list; ClassListError naming
    ``source_name:line`` for a line with no wnid (e.g. ``list.txt:17: no wnid in 'foo bar'``)."""
    out: list[tuple[int, str]] = []
    for line_no, raw in enumerate(lines, start=1):
        text = raw.strip()
        if not text or text.startswith("#"):
            continue
        wnid = wnid_from_path(text)
        if wnid is None and len(text.split()) > 1:
            wnid = wnid_from_path(text.split()[0])  # "path label" lines
        if wnid is None:
            raise ClassListError(
                f"{source_name}:{line_no}: no wnid in {text!r} "
                "(expected a wnid, <wnid>/<file>, .../<wnid>/<file> or <wnid>_<n>.JPEG)"
            )
        out.append((line_no, wnid))
    return out


def audit_classes(
    wnids_with_counts: Mapping[str, int] | Iterable[str] | Iterable[tuple[int, str]],
    id_wnids: Iterable[str],
    hierarchy: Hierarchy,
    *,
    exclude: Iterable[str] = DEFAULT_EXCLUDE,
    fallback_names: Mapping[str, str] | None = None,
) -> pd.DataFrame:
    """Check every listed class against the filter rules (``class_filter.RULES``, same precedence and conflicts).

    ``wnids_with_counts``: wnid -> number of list entries, or the entries themselves (wnids, or the
    ``(line_no, wnid)`` pairs of ``parse_class_list``), which are counted. Returns one row per class, sorted by
    wnid, with the filter's columns plus ``entries``; rule '' (decision 'keep') means clean, any other rule is a
    leak; unknown wnids get rule 'unknown'. Use ``class_filter.summarise`` for counts per rule.
    """
    counts = _count(wnids_with_counts)
    rules = ClassRules(id_wnids, hierarchy, exclude=exclude, sisters_only=False)
    df = rules.table(counts, fallback_names)
    df["entries"] = df["wnid"].map(counts).astype("int64")
    return df


def leaks(df: pd.DataFrame) -> pd.DataFrame:
    """The rows of an audit table that break a rule."""
    return df[df["decision"] == "drop"].reset_index(drop=True)


def _count(entries) -> dict[str, int]:
    if isinstance(entries, Mapping):
        counts = {str(k): int(v) for k, v in entries.items()}
        bad = [k for k, v in counts.items() if v < 0]
        if bad:
            raise BadInputError(f"negative entry count for {bad[0]}; counts must be >= 0")
        return counts
    counter: Counter[str] = Counter()
    for e in entries:
        counter[e[1] if isinstance(e, tuple) else e] += 1
    return dict(counter)


@dataclass(frozen=True)
class ImageAudit:
    """``audit_images``: the class table (``audit_classes``, ``entries`` = images), the per-image table
    (``IMAGE_COLUMNS`` present in the input + ``rule``, '' when kept, in input order) and, for a graded table,
    the per-cell and per-level counts (``wordnet_tools.rules.cell_rule_table`` / ``level_rule_table``)."""

    classes: pd.DataFrame
    images: pa.Table
    cells: pd.DataFrame | None = None
    levels: pd.DataFrame | None = None


def _filled(wnid: pa.Array | pa.ChunkedArray) -> pa.Array | pa.ChunkedArray:
    """A wnid column as strings, missing wnids as '' (class '', rule ``unknown``)."""
    return pc.fill_null(wnid.cast(pa.string()), "")


def count_wnids(wnid: pa.Array | pa.ChunkedArray, counts: Counter | None = None) -> Counter:
    """Entries per class of a wnid column (missing: ''), added to ``counts`` (one piece of a table at a time)."""
    counts = Counter() if counts is None else counts
    for rec in pc.value_counts(_filled(wnid)).to_pylist():
        counts[str(rec["values"])] += int(rec["counts"])
    return counts


class ImageAuditor:
    """The per-image side of an audit, one piece (row group) of the audited table at a time: ``add`` returns the
    piece's rows (``IMAGE_COLUMNS`` it has) with their ``rule`` and counts them per cell and level
    (``wordnet_tools.rules.RuleTally``), so a table of any size is audited in the memory of one piece.

    ``classes``: the verdicts of every class the table holds (``audit_classes``); ``columns``: the table's
    columns (a graded table, with ``cov_level`` and ``sem_level``, gets ``levels``; with ``cell`` too, ``cells``)."""

    def __init__(self, classes: pd.DataFrame, columns: Sequence[str]) -> None:
        rule_of = class_rule_map(classes)
        self.index = {w: i for i, w in enumerate(rule_of)}
        self.rules = pa.array(list(rule_of.values()), pa.string())
        self.columns = [c for c in IMAGE_COLUMNS if c in columns]
        graded = {"cov_level", "sem_level"} <= set(columns)
        self.has_cells = graded and "cell" in columns
        self.tally = RuleTally(rule_codes(rule_of.values())) if graded else None

    def add(self, piece: pa.Table, where: str = "table") -> pa.Table:
        """The piece's audited rows (input order); a class without a verdict is a one-line error."""
        filled = _filled(piece["wnid"])
        enc = (filled.combine_chunks() if isinstance(filled, pa.ChunkedArray) else filled).dictionary_encode()
        try:
            lut = np.array([self.index[str(w)] for w in enc.dictionary.to_pylist()], dtype=np.int64)
        except KeyError as e:
            raise BadInputError(f"{where}: class {e.args[0]!r} was not audited; audit every class of the "
                                "table") from None
        codes = lut[enc.indices.to_numpy(zero_copy_only=False)] if len(lut) else np.zeros(0, np.int64)
        columns = {c: (filled if c == "wnid" else piece[c]) for c in self.columns}
        columns["rule"] = self.rules.take(pa.array(codes, pa.int64()))
        if self.tally is not None:
            self.tally.add(codes, _levels(piece, "cov_level"), _levels(piece, "sem_level"),
                           piece["cell"] if self.has_cells else None)
        return pa.table(columns)

    def cells(self) -> pd.DataFrame | None:
        """The per-cell table of every piece added (None: the table has no cells)."""
        return self.tally.cells() if self.tally is not None and self.has_cells else None

    def levels(self) -> pd.DataFrame | None:
        """The per-level table of every piece added (None: the table has no levels)."""
        return self.tally.levels() if self.tally is not None else None


def _levels(table: pa.Table, name: str) -> np.ndarray:
    return pc.fill_null(table[name], -1).to_numpy().astype(np.int64)


def audit_images(table: pa.Table | pd.DataFrame, id_wnids: Iterable[str], hierarchy: Hierarchy, *,
                 exclude: Iterable[str] = DEFAULT_EXCLUDE, fallback_names: Mapping[str, str] | None = None,
                 where: str = "table") -> ImageAudit:
    """Audit every row of ``table`` (a manifest's main table with a ``wnid`` column; missing wnids count as
    class '', rule ``unknown``). Each distinct class is checked once (``audit_classes``) and its rule mapped onto
    the rows. With ``cov_level`` / ``sem_level`` (and ``cell``) columns, also the per-level (and per-cell)
    tables of images and classes per rule. A table too large for memory is audited piece by piece the same way
    (``count_wnids`` over its pieces, then ``ImageAuditor``, as ``isood wordnet audit`` does)."""
    t = table if isinstance(table, pa.Table) else pa.Table.from_pandas(table, preserve_index=False)
    check_wnid_column(t.column_names, where)
    classes = audit_classes(count_wnids(t["wnid"]), id_wnids, hierarchy, exclude=exclude,
                            fallback_names=fallback_names)
    auditor = ImageAuditor(classes, t.column_names)
    images = auditor.add(t, where)
    return ImageAudit(classes=classes, images=images, cells=auditor.cells(), levels=auditor.levels())


def check_wnid_column(columns: Sequence[str], where: str) -> None:
    """One-line error unless the audited table has a ``wnid`` column."""
    if "wnid" not in columns:
        raise BadInputError(f"{where} has no wnid column: pass a manifest whose main table has one (splits, "
                            "image-list, an import) or a list file")
