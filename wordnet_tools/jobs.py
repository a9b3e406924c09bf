"""The WordNet commands' jobs: load inputs, apply the pure rules, write manifests, build on-screen tables."""

from __future__ import annotations

from pathlib import Path
from typing import Sequence

import pandas as pd
from rich.table import Table

import manifests
from wordnet_tools.audit import audit_classes, parse_class_list
from wordnet_tools.class_filter import filter_classes, summarise
from wordnet_tools.errors import ClassListError
from wordnet_tools.hierarchy import Hierarchy
from wordnet_tools.loader import find_wordnet_source, load_wordnet
from wordnet_tools.synsets import imagenet_names, load_synset_list


def _list_input(name: str, spec: str, wnids: Sequence[str]) -> dict:
    """Provenance of a class list: its spec and the sha256 of its sorted wnids (whatever its source form)."""
    rec = manifests.input_record(name, sha256=manifests.store.sha256_bytes("\n".join(sorted(wnids)).encode()))
    rec["source"] = str(spec)
    rec["count"] = len(wnids)
    return rec


def _wordnet_input() -> dict:
    src = find_wordnet_source()
    return {"name": "wordnet", "source": f"{src.kind}:{src.path}", "version": "3.0"}


def run_filter(
    candidates: str, id_classes: str, exclude: Sequence[str], sisters_only: bool, out: str | Path
) -> manifests.Manifest:
    """`isood wordnet filter`: the ImageNet-OOD class filter written as a `class-filter` manifest."""
    cand = load_synset_list(candidates)
    ids = load_synset_list(id_classes)
    hierarchy = Hierarchy(load_wordnet())
    table = filter_classes(cand, ids, hierarchy, exclude=exclude, sisters_only=sisters_only, fallback_names=imagenet_names())
    counts = summarise(table)
    config = {"candidates": candidates, "id": id_classes, "exclude": list(exclude), "sisters_only": sisters_only}
    return _write(out, "class-filter", {"classes": table, "summary": counts}, config,
                  [_list_input("candidates", candidates, cand), _list_input("id", id_classes, ids), _wordnet_input()],
                  counts)


def read_list_file(path: str | Path) -> list[tuple[int, str]]:
    """(line, wnid) entries of a class or image list file; errors name the file and line."""
    path = Path(path)
    if not path.is_file():
        raise ClassListError(f"{path}: no such list file (pass a text file of wnids or image paths)")
    with path.open(encoding="utf-8", errors="replace") as f:
        return parse_class_list(f, str(path))


def run_audit(
    list_file: str | Path, id_classes: str, exclude: Sequence[str], out: str | Path | None
) -> tuple[Table, Table]:
    """`isood wordnet audit`: every class of the list that breaks a rule, with reason, conflict and entry count."""
    entries = read_list_file(list_file)
    ids = load_synset_list(id_classes)
    hierarchy = Hierarchy(load_wordnet())
    table = audit_classes(entries, ids, hierarchy, exclude=exclude, fallback_names=imagenet_names())
    counts = summarise(table)
    if out is not None:
        config = {"list": str(list_file), "id": id_classes, "exclude": list(exclude)}
        inputs = [manifests.input_record("list", list_file), _list_input("id", id_classes, ids), _wordnet_input()]
        m = _write(out, "audit", {"classes": table, "summary": counts}, config, inputs, counts)
        summary_title = f"Audit of {list_file} ({len(entries)} entries, manifest {m.root})"
    else:
        summary_title = f"Audit of {list_file} ({len(entries)} entries)"
    return leak_table(table), counts_table(counts, summary_title)


def _write(out, kind, tables, config, inputs, counts: pd.DataFrame) -> manifests.Manifest:
    summary = {"rules": {(r or "keep"): int(n) for r, n in zip(counts["rule"], counts["classes"])}}
    return manifests.write_with_card(out, kind=kind, tables=tables, config=config, inputs=inputs, summary=summary)


def counts_table(counts: pd.DataFrame, title: str) -> Table:
    t = Table(title=title)
    for col in counts.columns:
        t.add_column(str(col), justify="right" if col in ("classes", "entries") else "left")
    for row in counts.itertuples(index=False):
        t.add_row(*[str(v) if v != "" else "(kept)" for v in row])
    return t


def leak_table(table: pd.DataFrame, limit: int = 50) -> Table:
    leaks = table[table["decision"] == "drop"]
    t = Table(title=f"Classes breaking a rule: {len(leaks)}" + (f" (first {limit})" if len(leaks) > limit else ""))
    for col in ("wnid", "name", "rule", "conflict_wnid", "conflict_name", "entries"):
        t.add_column(col)
    for row in leaks.head(limit).itertuples(index=False):
        t.add_row(row.wnid, row.name, row.rule, row.conflict_wnid, row.conflict_name, str(getattr(row, "entries", "")))
    return t


def summary_table(manifest: manifests.Manifest, title: str) -> Table:
    counts = manifest.frame("summary")
    n = int(counts["classes"].sum())
    return counts_table(counts, f"{title}: {n} candidates, {manifest.kind} v{manifest.dataset_version}")
