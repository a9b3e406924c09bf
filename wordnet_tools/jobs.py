"""L4 stage: the WordNet commands' jobs: load the class lists -> apply the pure rules (``class_filter``,
``audit``) -> write a `class-filter` / `audit` manifest. They return data (manifests, DataFrames); the terminal
tables are drawn by the CLI (``isood.cli.wordnet``)."""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

import pandas as pd

import manifests
from isood.kinds import AUDIT, CLASS_FILTER
from isood.runtime import sha256_bytes
from wordnet_tools.audit import audit_classes, parse_class_list
from wordnet_tools.class_filter import DEFAULT_EXCLUDE, filter_classes, summarise
from wordnet_tools.errors import ClassListError
from wordnet_tools.hierarchy import load_hierarchy
from wordnet_tools.loader import find_wordnet_source
from wordnet_tools.synsets import imagenet_names, load_synset_list

__all__ = ["AuditResult", "run_filter", "run_audit", "read_list_file", "rule_counts"]


@dataclass(frozen=True)
class AuditResult:
    """What `isood wordnet audit` found: one row per listed class (``audit.audit_classes``), the counts per rule
    (``class_filter.summarise``), the number of list entries, and the manifest when one was written."""

    table: pd.DataFrame
    counts: pd.DataFrame
    entries: int
    manifest: manifests.Manifest | None = None

    @property
    def leaks(self) -> pd.DataFrame:
        """The classes that break a rule."""
        return self.table[self.table["decision"] == "drop"].reset_index(drop=True)


def _list_input(name: str, spec: str, wnids: Sequence[str]) -> dict:
    """Provenance of a class list: its spec and the sha256 of its sorted wnids (whatever its source form)."""
    rec = manifests.input_record(name, sha256=sha256_bytes("\n".join(sorted(wnids)).encode()))
    rec["source"] = str(spec)
    rec["count"] = len(wnids)
    return rec


def _wordnet_input() -> dict:
    src = find_wordnet_source()
    return {"name": "wordnet", "source": f"{src.kind}:{src.path}", "version": "3.0"}


def rule_counts(counts: pd.DataFrame) -> dict[str, int]:
    """The manifest summary of a `summarise` table: rule ('keep' for the kept classes) -> classes (pure)."""
    return {(r or "keep"): int(n) for r, n in zip(counts["rule"], counts["classes"])}


def _write(out: str | os.PathLike, kind: str, table: pd.DataFrame, counts: pd.DataFrame, config: dict,
           inputs: list[dict], argv: list[str] | None) -> manifests.Manifest:
    return manifests.write_with_card(out, kind=kind, tables={"classes": table, "summary": counts}, config=config,
                                     inputs=inputs, summary={"rules": rule_counts(counts)}, argv=argv)


def run_filter(candidates: str = "21k", id_classes: str = "1k", *, out: str | os.PathLike,
               exclude: Sequence[str] = DEFAULT_EXCLUDE, sisters_only: bool = False,
               argv: list[str] | None = None) -> manifests.Manifest:
    """`isood wordnet filter`: the ImageNet-OOD class filter of ``candidates`` against ``id_classes`` (synset list
    specs, ``synsets.load_synset_list``) written as a `class-filter` manifest (tables ``classes``, ``summary``)."""
    cand = load_synset_list(candidates)
    ids = load_synset_list(id_classes)
    table = filter_classes(cand, ids, load_hierarchy(), exclude=exclude, sisters_only=sisters_only,
                           fallback_names=imagenet_names())
    config = {"candidates": candidates, "id": id_classes, "exclude": list(exclude), "sisters_only": sisters_only}
    inputs = [_list_input("candidates", candidates, cand), _list_input("id", id_classes, ids), _wordnet_input()]
    return _write(out, CLASS_FILTER, table, summarise(table), config, inputs, argv)


def read_list_file(path: str | os.PathLike) -> list[tuple[int, str]]:
    """(line, wnid) entries of a class or image list file; errors name the file and line."""
    path = Path(path)
    if not path.is_file():
        raise ClassListError(f"{path}: no such list file (pass a text file of wnids or image paths)")
    with path.open(encoding="utf-8", errors="replace") as f:
        return parse_class_list(f, str(path))


def run_audit(list_file: str | os.PathLike, id_classes: str = "1k", *, exclude: Sequence[str] = DEFAULT_EXCLUDE,
              out: str | os.PathLike | None = None, argv: list[str] | None = None) -> AuditResult:
    """`isood wordnet audit`: every class of the list with the rule it breaks (if any), its conflict and its
    entry count; written as an `audit` manifest when ``out`` is given."""
    entries = read_list_file(list_file)
    ids = load_synset_list(id_classes)
    table = audit_classes(entries, ids, load_hierarchy(), exclude=exclude, fallback_names=imagenet_names())
    counts = summarise(table)
    manifest = None
    if out is not None:
        config = {"list": str(list_file), "id": id_classes, "exclude": list(exclude)}
        inputs = [manifests.input_record("list", list_file), _list_input("id", id_classes, ids), _wordnet_input()]
        manifest = _write(out, AUDIT, table, counts, config, inputs, argv)
    return AuditResult(table=table, counts=counts, entries=len(entries), manifest=manifest)
