"""Audit a class list or an image list against the ImageNet-OOD rules (leaks of ID semantics into an OOD set).

``parse_class_list`` turns lines into wnids with ``wordnet_tools.wnids.wnid_from_path`` (the one rule of isood);
accepted line forms (blank lines and ``#`` comments skipped):

- a wnid: ``n01440764`` (or a path ending in a class folder: ``train/n01440764``)
- an image path whose nearest wnid-named folder is the class: ``n01440764/x.JPEG``, ``a/b/n01440764/x.JPEG``
- an ImageNet file name: ``n01440764_10026.JPEG`` (used when no folder is a wnid)
- any of these followed by whitespace and more fields (OpenOOD imglists: ``path label``)

``audit_classes`` applies the filter's rules (``class_filter.ClassRules``, the same code) to every listed class
and counts the list entries (images) per class and per rule.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Mapping

import pandas as pd

from isood.errors import BadInputError
from wordnet_tools.class_filter import DEFAULT_EXCLUDE, ClassRules
from wordnet_tools.errors import ClassListError
from wordnet_tools.hierarchy import Hierarchy
from wordnet_tools.wnids import wnid_from_path


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
