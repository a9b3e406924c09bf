"""The ImageNet-OOD class filter: which candidate classes are semantically clean OOD for an ID class set.

Rules (Yang et al., ImageNet-OOD), checked in this order; a class gets the FIRST rule that applies:

=================  ====================================================================  ==================
rule               a candidate is dropped when it ...                                     conflict
=================  ====================================================================  ==================
unknown            is not a WordNet 3.0 noun synset (no other rule can be checked)        (none)
id                 is an ID class                                                         itself, 0 hops
hypernym           is an ancestor of an ID class (e.g. ``dog`` above ``beagle``)          nearest ID below
hyponym            is a descendant of an ID class (e.g. a beagle breed under ``beagle``)  nearest ID above
excluded_subtree   is an excluded root or under one (default ``organism.n.01``, a preset)  nearest excl. root
not_sister         (only with ``sisters_only``) shares no direct hypernym with an ID class (none)
=================  ====================================================================  ==================

"Nearest" counts hypernym hops along the directed path; ties go to the smallest wnid, so the result is
deterministic. Kept classes have rule ''. ``sisters_only`` is the ImageNet-OOD candidate step: keep only
classes that share a direct hypernym (or instance hypernym) with some ID class.

The audit (``wordnet_tools.audit``) applies the same rules through ``ClassRules.check``. Named exclusions
(``--preset imagenet-ood-paper`` = ``organism.n.01``, ``imagenet-ood-release`` = ``animal.n.01``) and the rule
names live in ``wordnet_tools.rules`` (no WordNet needed there).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass

import pandas as pd

from isood.core.defaults import WORDNET_EXCLUDE
from wordnet_tools.errors import ClassListError
from wordnet_tools.hierarchy import Hierarchy
from wordnet_tools.rules import RULES

__all__ = ["RULES", "DEFAULT_EXCLUDE", "COLUMNS", "Verdict", "ClassRules", "filter_classes", "summarise"]

#: The default exclusion: that of the ``imagenet-ood-paper`` preset (``wordnet_tools.rules.PRESETS``).
DEFAULT_EXCLUDE: tuple[str, ...] = WORDNET_EXCLUDE
COLUMNS: tuple[str, ...] = ("wnid", "name", "decision", "rule", "conflict_wnid", "conflict_name", "conflict_hops")


@dataclass(frozen=True)
class Verdict:
    """Outcome for one class: ``rule`` '' means kept; ``conflict`` is (hops, wnid) or None."""

    rule: str
    conflict: tuple[int, str] | None = None

    @property
    def keep(self) -> bool:
        return self.rule == ""


class ClassRules:
    """The filter rules for one ID set, exclusion list and mode, precomputed once.

    Precomputes the ancestors of the ID classes (hypernym rule: one dict lookup per candidate), the ID classes'
    direct hypernyms (sister rule) and the excluded roots; per candidate it then needs only its own ancestors.
    """

    def __init__(
        self,
        id_wnids: Iterable[str],
        hierarchy: Hierarchy,
        *,
        exclude: Iterable[str] = DEFAULT_EXCLUDE,
        sisters_only: bool = False,
    ):
        self.hierarchy = hierarchy
        self.id_set = frozenset(id_wnids)
        if not self.id_set:
            raise ClassListError("the ID class list is empty; pass e.g. the 1k list")
        for w in sorted(self.id_set):
            hierarchy.synset(w)  # an ID class WordNet does not know is an input error: raise it here
        if isinstance(exclude, str):
            exclude = (exclude,)
        self.exclude_roots = frozenset(hierarchy.resolve(r) for r in exclude)
        self.sisters_only = bool(sisters_only)
        self._below = hierarchy.nearest_descendants(self.id_set)
        self._id_parents = frozenset(p for w in self.id_set for p in hierarchy.parents(w)) if sisters_only else None

    def check(self, wnid: str) -> Verdict:
        """The first rule (in ``RULES`` order) that ``wnid`` breaks, with its conflict; Verdict('') if none."""
        h = self.hierarchy
        if not h.is_known(wnid):
            return Verdict("unknown")
        if wnid in self.id_set:
            return Verdict("id", (0, wnid))
        if wnid in self._below:
            return Verdict("hypernym", self._below[wnid])
        up = h.ancestor_hops(wnid)
        above = [(up[w], w) for w in self.id_set.intersection(up)]
        if above:
            return Verdict("hyponym", min(above))
        roots = [(0, wnid)] if wnid in self.exclude_roots else []
        roots += [(up[r], r) for r in self.exclude_roots.intersection(up)]
        if roots:
            return Verdict("excluded_subtree", min(roots))
        if self._id_parents is not None and self._id_parents.isdisjoint(h.parents(wnid)):  # sisters_only
            return Verdict("not_sister")
        return Verdict("")

    def table(self, wnids: Iterable[str], fallback_names: Mapping[str, str] | None = None) -> pd.DataFrame:
        """One row per distinct wnid (sorted): COLUMNS, built from ``check``."""
        h = self.hierarchy
        fallback = fallback_names or {}

        def name(w: str) -> str:
            return h.name(w) if h.is_known(w) else fallback.get(w, "")

        rows = []
        for w in sorted(set(wnids)):
            v = self.check(w)
            hops, cw = v.conflict if v.conflict is not None else (None, "")
            rows.append((w, name(w), "keep" if v.keep else "drop", v.rule, cw, name(cw) if cw else "", hops))
        df = pd.DataFrame.from_records(rows, columns=list(COLUMNS))
        df["conflict_hops"] = df["conflict_hops"].astype("Int64")
        return df


def filter_classes(
    candidates: Iterable[str],
    id_wnids: Iterable[str],
    hierarchy: Hierarchy,
    *,
    exclude: Iterable[str] = DEFAULT_EXCLUDE,
    sisters_only: bool = False,
    fallback_names: Mapping[str, str] | None = None,
) -> pd.DataFrame:
    """Apply the ImageNet-OOD rules to ``candidates`` (e.g. the 21k list) against ``id_wnids`` (e.g. 1k).

    ``exclude``: subtree roots to drop (wnids or synset names; may be empty). ``sisters_only``: also drop
    candidates that are not sisters of an ID class. ``fallback_names``: wnid -> name for classes WordNet lacks
    (e.g. ``synsets.imagenet_names()``). Returns one row per distinct candidate sorted by wnid, with columns
    wnid, name, decision ('keep'|'drop'), rule ('' when kept, else one of RULES), conflict_wnid, conflict_name,
    conflict_hops (see the module docstring for the rules, their precedence and the conflict chosen).
    """
    rules = ClassRules(id_wnids, hierarchy, exclude=exclude, sisters_only=sisters_only)
    return rules.table(candidates, fallback_names)


def summarise(df: pd.DataFrame) -> pd.DataFrame:
    """Counts per rule of a filter or audit table: columns decision, rule, classes (+ entries for an audit).

    One row for the kept classes (rule '') and one per rule in ``RULES`` order, zeros included.
    """
    rows = []
    for rule in ("",) + RULES:
        part = df[df["rule"] == rule]
        row = {"decision": "keep" if rule == "" else "drop", "rule": rule, "classes": int(len(part))}
        if "entries" in df.columns:
            row["entries"] = int(part["entries"].sum())
        rows.append(row)
    return pd.DataFrame(rows)
