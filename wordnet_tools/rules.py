"""The names of the class-filter rules, the filter presets and the leak rules, and the per-image side of an
audit: class verdicts mapped onto images and counted per cell and per level. No WordNet is needed here (the
verdicts come from ``class_filter.ClassRules`` or from an ``audit`` manifest), so the evaluation and the
``splits clean`` stage use it without loading nltk.

Presets of ``isood wordnet filter`` / ``audit`` (``--preset``; an explicit ``--exclude`` wins):

======================  ==================  ==========================================================================
preset                  excluded subtree    reproduces
======================  ==================  ==========================================================================
imagenet-ood-paper      ``organism.n.01``   the rule of the ImageNet-OOD paper (Yang et al.): no organism at all (the
                                            default, as before presets existed)
imagenet-ood-release    ``animal.n.01``     the published ImageNet-OOD class list: it keeps people and plants and has
                                            no class under ``animal.n.01``
======================  ==================  ==========================================================================

Leak rules (``LEAK_RULES``): an OOD image *leaks* in-distribution semantics when its class is an ID class, a
hypernym or a hyponym of one (ImageNet-OOD's point: such images are not OOD). ``excluded_subtree`` and
``unknown`` are verdicts too, but not leaks by default; ``isood splits clean --rules`` / ``isood evaluate
--leak-rules`` choose other sets.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import NamedTuple

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc

from isood.core.defaults import WORDNET_EXCLUDE
from isood.core.errors import BadInputError

__all__ = ["RULES", "KEPT", "AUDIT_RULES", "LEAK_RULES", "Preset", "PRESETS", "DEFAULT_PRESET", "resolve_exclude",
           "parse_rules", "class_rule_map", "leak_mask", "rule_codes", "rule_table", "cell_rule_table",
           "level_rule_table", "RuleTally"]

#: Rules in precedence order (the first that applies is reported); a kept class has rule ''.
RULES: tuple[str, ...] = ("unknown", "id", "hypernym", "hyponym", "excluded_subtree", "not_sister")
#: The name of rule '' (a kept class) in table columns.
KEPT = "kept"
#: The verdicts an audit can give (audits never apply the sister step), kept first: the column order of the
#: per-cell and per-level tables.
AUDIT_RULES: tuple[str, ...] = (KEPT, "id", "hypernym", "hyponym", "excluded_subtree", "unknown")
#: Rules whose images leak in-distribution semantics into an OOD set (module docstring).
LEAK_RULES: tuple[str, ...] = ("id", "hypernym", "hyponym")


class Preset(NamedTuple):
    """A named filter setting: the excluded subtree roots and what it reproduces."""

    exclude: tuple[str, ...]
    reproduces: str


PRESETS: dict[str, Preset] = {
    "imagenet-ood-paper": Preset(tuple(WORDNET_EXCLUDE), "the ImageNet-OOD paper's rule: drop every organism "
                                 "(organism.n.01 subtree)"),
    "imagenet-ood-release": Preset(("animal.n.01",), "the published ImageNet-OOD class list: keeps people and "
                                   "plants, no class under animal.n.01"),
}
DEFAULT_PRESET = "imagenet-ood-paper"


def resolve_exclude(exclude: Iterable[str] | None = None, preset: str | None = None) -> list[str]:
    """The excluded subtree roots: ``exclude`` when given (explicit wins; '' entries dropped, so ``['']`` means
    none), else the preset's (default ``imagenet-ood-paper``: ``organism.n.01``)."""
    if preset is not None and preset not in PRESETS:
        raise BadInputError(f"unknown preset {preset!r}: pass one of {', '.join(PRESETS)}")
    if exclude is not None:
        if isinstance(exclude, str):
            exclude = [exclude]
        return [e for e in exclude if e]
    return list(PRESETS[preset or DEFAULT_PRESET].exclude)


def parse_rules(rules: str | Iterable[str], *, option: str = "--rules") -> tuple[str, ...]:
    """Rule names from ``'id,hypernym'`` or a sequence; each must be one of ``RULES`` (``kept`` is refused:
    kept classes never leak). Order of ``RULES``, no duplicates."""
    names = [r.strip() for r in (rules.split(",") if isinstance(rules, str) else rules) if r and r.strip()]
    if not names:
        raise BadInputError(f"{option} is empty: pass rule names such as {','.join(LEAK_RULES)}")
    bad = [r for r in names if r not in RULES]
    if bad:
        raise BadInputError(f"{option}: unknown rule {bad[0]!r}; pass among {', '.join(RULES)}")
    return tuple(r for r in RULES if r in names)


def class_rule_map(classes: pd.DataFrame) -> dict[str, str]:
    """wnid -> rule ('' when kept) of a filter or audit ``classes`` table."""
    return dict(zip(classes["wnid"].fillna("").astype(str), classes["rule"].fillna("").astype(str)))


def _codes(wnids) -> tuple[np.ndarray, np.ndarray]:
    """(unique wnids, code of each entry) with missing wnids as ''; an Arrow column is dictionary-encoded
    without a Python object per row."""
    if isinstance(wnids, (pa.Array, pa.ChunkedArray)):
        enc = pc.fill_null(wnids.cast(pa.string()), "")
        enc = (enc.combine_chunks() if isinstance(enc, pa.ChunkedArray) else enc).dictionary_encode()
        uniques = np.asarray([str(w) for w in enc.dictionary.to_pylist()], dtype=object)
        return uniques, enc.indices.to_numpy(zero_copy_only=False).astype(np.int64)
    values = pd.Series(wnids, dtype=object).fillna("").astype(str)
    codes, uniques = pd.factorize(values, sort=True)
    return np.asarray(uniques, dtype=object), codes.astype(np.int64)


def leak_mask(wnids, class_rules: Mapping[str, str], *, rules: Sequence[str] = LEAK_RULES,
              where: str = "the audit") -> np.ndarray:
    """Boolean (N,): the entries whose class's verdict is one of ``rules``. Worked out once per class, then
    mapped. A class without a verdict is a one-line error naming it (``where``: the audit it came from)."""
    uniques, codes = _codes(wnids)
    missing = [w for w in uniques if w not in class_rules]
    if missing:
        shown = ", ".join(repr(w) for w in missing[:3]) + (f" (+{len(missing) - 3} more)" if len(missing) > 3 else "")
        raise BadInputError(f"{where} has no verdict for class {shown}: audit this manifest (isood wordnet audit "
                            "MANIFEST --out AUDIT) and pass that audit")
    leaking = np.array([class_rules[w] in set(rules) for w in uniques], dtype=bool)
    return leaking[codes] if len(codes) else np.zeros(0, dtype=bool)


def rule_codes(rules: Iterable[str]) -> np.ndarray:
    """Index of each rule in ``AUDIT_RULES`` ('' -> kept); a rule outside them is an error."""
    index = {r: i for i, r in enumerate(AUDIT_RULES)}
    try:
        return np.array([index[r or KEPT] for r in rules], dtype=np.int64)
    except KeyError as e:
        raise BadInputError(f"rule {e.args[0]!r} is not an audit verdict ({', '.join(AUDIT_RULES)})") from None


def rule_table(group_codes: np.ndarray, class_codes: np.ndarray, class_rules: np.ndarray,
               groups: pd.DataFrame, *, weights: np.ndarray | None = None) -> pd.DataFrame:
    """Images and classes per rule in each group (pure).

    ``group_codes`` (N,): the row of ``groups`` each image belongs to (-1: none); ``class_codes`` (N,): the
    image's class; ``class_rules`` (classes,): each class's rule code (``rule_codes``). Returns ``groups`` plus
    ``images``, ``classes``, ``leak_images`` (images whose rule is in ``LEAK_RULES``), ``leak_share`` and
    ``images_<rule>`` / ``classes_<rule>`` for every rule of ``AUDIT_RULES``; rows without images are dropped.
    ``weights`` (N,): images each entry stands for (``RuleTally``: one entry per group and class; > 0).
    """
    n_groups, n_rules, n_classes = len(groups), len(AUDIT_RULES), max(len(class_rules), 1)
    ok = group_codes >= 0
    g, c = group_codes[ok], class_codes[ok]
    w = None if weights is None else np.asarray(weights, dtype=np.int64)[ok]
    images = np.bincount(g * n_rules + class_rules[c], weights=w, minlength=n_groups * n_rules)
    images = np.rint(images).astype(np.int64).reshape(n_groups, n_rules)  # exact: counts below 2**53
    pairs = np.unique(g * n_classes + c)
    pg, pc = np.divmod(pairs, n_classes)
    classes = np.bincount(pg * n_rules + class_rules[pc], minlength=n_groups * n_rules).reshape(n_groups, n_rules)
    out = groups.reset_index(drop=True).copy()
    out["images"] = images.sum(axis=1)
    out["classes"] = classes.sum(axis=1)
    leak_cols = [AUDIT_RULES.index(r) for r in LEAK_RULES]
    out["leak_images"] = images[:, leak_cols].sum(axis=1)
    with np.errstate(invalid="ignore", divide="ignore"):
        out["leak_share"] = out["leak_images"] / out["images"].where(out["images"] > 0)
    for i, r in enumerate(AUDIT_RULES):
        out[f"images_{r}"] = images[:, i]
    for i, r in enumerate(AUDIT_RULES):
        out[f"classes_{r}"] = classes[:, i]
    return out[out["images"] > 0].reset_index(drop=True)


def cell_rule_table(cells, cov_levels, sem_levels, class_codes: np.ndarray, class_rules: np.ndarray, *,
                    weights: np.ndarray | None = None) -> pd.DataFrame:
    """``rule_table`` per grid cell (cell, cov_level, sem_level), ordered by (cov, sem); ``cells`` are the images'
    cell names (a sequence, array, Series or Arrow array: only one name per cell is read, the first), images
    without levels (-1) are in no cell. ``weights``: as in ``rule_table``."""
    cov = np.asarray(cov_levels, dtype=np.int64)
    sem = np.asarray(sem_levels, dtype=np.int64)
    k = int(max(cov.max(initial=0), sem.max(initial=0))) + 1
    ok = (cov >= 0) & (sem >= 0)
    pair = np.where(ok, cov * k + sem, -1)
    uniq, first, codes = np.unique(pair, return_index=True, return_inverse=True)
    taken = (cells if hasattr(cells, "take") else np.asarray(cells, dtype=object)).take(first)
    names = taken.to_pylist() if hasattr(taken, "to_pylist") else list(taken)
    groups = pd.DataFrame({"cell": [str(x) for x in names], "cov_level": uniq // k, "sem_level": uniq % k})
    codes = np.where(ok, codes.ravel(), -1)
    table = rule_table(codes, class_codes, class_rules, groups, weights=weights)
    return table.sort_values(["cov_level", "sem_level"], kind="stable").reset_index(drop=True)


def level_rule_table(cov_levels, sem_levels, class_codes: np.ndarray, class_rules: np.ndarray, *,
                     weights: np.ndarray | None = None) -> pd.DataFrame:
    """``rule_table`` per level of each axis (axis 'sem' then 'cov', level); classes are counted per level.
    ``weights``: as in ``rule_table``."""
    parts = []
    for axis, levels in (("sem", np.asarray(sem_levels, dtype=np.int64)),
                         ("cov", np.asarray(cov_levels, dtype=np.int64))):
        n = int(levels.max(initial=-1)) + 1
        groups = pd.DataFrame({"axis": axis, "level": np.arange(n, dtype=np.int64)})
        parts.append(rule_table(np.where(levels >= 0, levels, -1), class_codes, class_rules, groups,
                                weights=weights))
    return pd.concat(parts, ignore_index=True)


class RuleTally:
    """``cell_rule_table`` / ``level_rule_table`` of a table read piece by piece (one row group at a time; pure).

    ``add`` counts each piece's images per (cov_level, sem_level, class); the tables are then drawn from those
    counts (``weights``), so memory is bounded by the distinct (cell, class) pairs, not by the rows. Levels
    below 0 (missing) count as -1: in no cell, and in no level of that axis. A cell's name is the one of its
    first image, as ``cell_rule_table`` reads it. ``class_rules``: each class's rule code (``rule_codes``);
    ``merge_rows``: the pieces' counts are merged once they hold this many rows (and twice the merged ones)."""

    def __init__(self, class_rules: np.ndarray, *, merge_rows: int = 1 << 20) -> None:
        self.class_rules = np.asarray(class_rules, dtype=np.int64)
        self.merge_rows = int(merge_rows)
        self.counts = np.zeros((0, 4), dtype=np.int64)  # rows: cov, sem, class, images (merged)
        self.pending: list[np.ndarray] = []
        self.names: dict[tuple[int, int], str] = {}

    def add(self, class_codes: np.ndarray, cov_levels, sem_levels, cells=None) -> None:
        """Count one piece: its images' class codes (indices into ``class_rules``), levels and, for the cell
        table, cell names (a sequence, array or Arrow array)."""
        cov = np.maximum(np.asarray(cov_levels, dtype=np.int64), -1)
        sem = np.maximum(np.asarray(sem_levels, dtype=np.int64), -1)
        self.pending.append(_count_triples(cov, sem, np.asarray(class_codes, dtype=np.int64)))
        if cells is not None:
            self._first_names(cov, sem, cells)
        if sum(len(p) for p in self.pending) > max(self.merge_rows, 2 * len(self.counts)):
            self._merge()

    def _first_names(self, cov: np.ndarray, sem: np.ndarray, cells) -> None:
        ok = np.flatnonzero((cov >= 0) & (sem >= 0))
        k = int(max(cov.max(initial=0), sem.max(initial=0))) + 1
        pairs, first = np.unique(cov[ok] * k + sem[ok], return_index=True)
        new = [(int(p), int(i)) for p, i in zip(pairs, ok[first]) if (int(p) // k, int(p) % k) not in self.names]
        if new:
            taken = (cells if hasattr(cells, "take") else np.asarray(cells, dtype=object)).take([i for _, i in new])
            names = taken.to_pylist() if hasattr(taken, "to_pylist") else list(taken)
            self.names.update({(p // k, p % k): str(x) for (p, _), x in zip(new, names)})

    def _merge(self) -> None:
        self.counts = _count_triples(*np.concatenate([self.counts, *self.pending]).T)
        self.pending = []

    def levels(self) -> pd.DataFrame:
        """``level_rule_table`` of every image added."""
        self._merge()
        cov, sem, cls, n = self.counts.T
        return level_rule_table(cov, sem, cls, self.class_rules, weights=n)

    def cells(self) -> pd.DataFrame:
        """``cell_rule_table`` of every image added (with cell names)."""
        self._merge()
        rows = self.counts[(self.counts[:, 0] >= 0) & (self.counts[:, 1] >= 0)]
        cov, sem, cls, n = rows.T
        names = np.array([self.names[(c, s)] for c, s in zip(cov.tolist(), sem.tolist())], dtype=object)
        return cell_rule_table(names, cov, sem, cls, self.class_rules, weights=n)


def _count_triples(cov: np.ndarray, sem: np.ndarray, classes: np.ndarray,
                   images: np.ndarray | None = None) -> np.ndarray:
    """(cov, sem, class, images) rows, one per distinct (cov, sem, class) (levels >= -1), images summed
    (``images`` None: one per entry); sorted (pure)."""
    if not len(classes):
        return np.zeros((0, 4), dtype=np.int64)
    m, n_classes = int(max(cov.max(), sem.max())) + 2, int(classes.max()) + 1
    if m * m * n_classes >= 1 << 62:
        raise BadInputError(f"levels up to {m - 2} with {n_classes} classes are too many to count; levels are "
                            "small grid indices (pass a graded manifest)")
    key = ((cov + 1) * m + (sem + 1)) * n_classes + classes
    order = np.argsort(key, kind="stable")
    key = key[order]
    starts = np.flatnonzero(np.r_[True, key[1:] != key[:-1]])
    counts = np.add.reduceat(np.ones(len(key), np.int64) if images is None else images[order], starts)
    pair, cls = np.divmod(key[starts], n_classes)
    return np.stack([pair // m - 1, pair % m - 1, cls, counts], axis=1).astype(np.int64)
