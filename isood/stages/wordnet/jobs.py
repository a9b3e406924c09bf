"""The stage of the WordNet commands' jobs: load the class lists (or the audited manifest) -> apply the pure rules
(``class_filter``, ``audit``) -> write a `class-filter` / `audit` manifest. They return data (manifests,
DataFrames); the terminal tables are drawn by the CLI (``isood.cli.wordnet``).

The excluded subtrees are ``--exclude`` when given, else the ``--preset``'s (``wordnet_tools.rules.PRESETS``:
``imagenet-ood-paper`` = organism.n.01, the default; ``imagenet-ood-release`` = animal.n.01)."""

from __future__ import annotations

import os
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, replace
from pathlib import Path
from typing import NamedTuple, Sequence

import pandas as pd
import pyarrow as pa

import manifests
from isood.core.defaults import DEFAULT_VERIFY
from isood.core.errors import BadInputError
from isood.kinds import AUDIT, CLASS_FILTER
from isood.core.files import sha256_bytes
from isood.core.textio import read_lines
from manifests.card_stream import WHOLE_TABLE_ROWS
from manifests.schema import kind_spec
from manifests.stream import ParquetStream
from wordnet_tools.audit import IMAGE_COLUMNS, ImageAuditor, audit_classes, count_wnids, parse_class_list
from wordnet_tools.class_filter import filter_classes, summarise
from wordnet_tools.errors import ClassListError
from wordnet_tools.hierarchy import Hierarchy, load_hierarchy
from wordnet_tools.loader import find_wordnet_source
from wordnet_tools.rules import resolve_exclude
from wordnet_tools.synsets import imagenet_names, load_synset_list

__all__ = ["AuditResult", "ManifestAudit", "run_filter", "run_audit", "write_audit", "read_list_file",
           "open_audited_table", "audit_manifest", "rule_counts"]


@dataclass(frozen=True)
class AuditResult:
    """What `isood wordnet audit` found: one row per listed class (``audit.audit_classes``), the counts per rule
    (``class_filter.summarise``), the number of list entries, and the manifest when one was written; for an
    audited manifest the per-cell / per-level tables. ``images`` is None for a manifest: its per-image table
    is streamed into the written manifest (``AuditView.optional("images")``), never held in memory."""

    table: pd.DataFrame
    counts: pd.DataFrame
    entries: int
    manifest: manifests.Manifest | None = None
    images: pa.Table | None = None
    cells: pd.DataFrame | None = None
    levels: pd.DataFrame | None = None

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


def _write(out: str | os.PathLike, kind: str, tables: dict[str, pd.DataFrame | pa.Table], counts: pd.DataFrame,
           config: dict, inputs: list[dict], argv: list[str] | None,
           table_files: dict[str, str] | None = None) -> manifests.Manifest:
    return manifests.write_with_card(out, kind=kind, tables={**tables, "summary": counts}, table_files=table_files,
                                     config=config, inputs=inputs, summary={"rules": rule_counts(counts)}, argv=argv)


def write_audit(out: str | os.PathLike, *, classes: pd.DataFrame,
                images: pa.Table | pd.DataFrame | ParquetStream | None = None, cells: pd.DataFrame | None = None,
                levels: pd.DataFrame | None = None, config: dict, inputs: Sequence[dict] = (),
                argv: list[str] | None = None) -> manifests.Manifest:
    """The write step of `isood wordnet audit`: an `audit` manifest of the class table (``audit.audit_classes``)
    with its per-rule counts, plus the per-image / per-cell / per-level tables when given. ``images`` may be a
    table or a ``ParquetStream`` already written into ``out`` piece by piece (committed here)."""
    tables = {k: v for k, v in (("images", images), ("cells", cells), ("levels", levels)) if v is not None}
    table_files = {}
    if isinstance(images, ParquetStream):
        del tables["images"]
        images.commit()
        table_files["images"] = images.path.relative_to(Path(out)).as_posix()
    return _write(out, AUDIT, {"classes": classes, **tables}, summarise(classes), config, list(inputs), argv,
                  table_files)


def run_filter(candidates: str = "21k", id_classes: str = "1k", *, out: str | os.PathLike,
               exclude: Sequence[str] | None = None, preset: str | None = None, sisters_only: bool = False,
               argv: list[str] | None = None) -> manifests.Manifest:
    """`isood wordnet filter`: the ImageNet-OOD class filter of ``candidates`` against ``id_classes`` (synset list
    specs, ``synsets.load_synset_list``) written as a `class-filter` manifest (tables ``classes``, ``summary``).
    ``exclude`` (explicit subtree roots) wins over ``preset`` (default ``imagenet-ood-paper``)."""
    roots = resolve_exclude(exclude, preset)
    with manifests.writing(out, CLASS_FILTER, inputs=_path_inputs(candidates, id_classes)) as o:
        cand = load_synset_list(candidates)
        ids = load_synset_list(id_classes)
        table = filter_classes(cand, ids, load_hierarchy(), exclude=roots, sisters_only=sisters_only,
                               fallback_names=imagenet_names())
        config = {"candidates": _recorded(candidates), "id": _recorded(id_classes), "exclude": roots,
                  "preset": preset if exclude is None else None, "sisters_only": sisters_only}
        inputs = [_list_input("candidates", candidates, cand), _list_input("id", id_classes, ids), _wordnet_input()]
        _write(o.work, CLASS_FILTER, {"classes": table}, summarise(table), config, inputs, argv)
    return manifests.read(o.final, kind=CLASS_FILTER)


def _recorded(spec: str | os.PathLike) -> str:
    """A class-list spec as a manifest records it: a file or folder absolute (never relative to the working
    directory), a name (``1k``, ``21k``...) as is."""
    return os.path.abspath(spec) if spec and Path(str(spec)).exists() else str(spec)


def _path_inputs(*specs: str | os.PathLike) -> list[str]:
    """The class-list specs that name files or folders (not ``1k`` / ``21k``...): an --out may not be one."""
    return [str(s) for s in specs if s and Path(str(s)).exists()]


def read_list_file(path: str | os.PathLike) -> list[tuple[int, str]]:
    """(line, wnid) entries of a class or image list file; errors name the file and line."""
    path = Path(path)
    if not path.is_file():
        raise ClassListError(f"{path}: no such list file (pass a text file of wnids or image paths, or a manifest "
                             "folder with a wnid column)")
    return parse_class_list(read_lines(path, error=ClassListError), str(path))


def open_audited_table(path: str | os.PathLike, *,
                       verify: str = DEFAULT_VERIFY) -> tuple[manifests.Manifest, str, list[str]]:
    """The manifest at ``path`` (its files verified, ``verify``), its main table (the kind's card ``main``, else
    ``images``), which must have a ``wnid`` column (any kind: splits, image-list, an import, features), and the
    columns of it the audit carries (``IMAGE_COLUMNS``). Of the table only the footer is read here: a release's
    main table has ~12M rows."""
    m = manifests.read(path, verify=verify)
    spec = kind_spec(m.kind)
    main = spec.card.main if spec is not None and spec.card is not None and spec.card.main else "images"
    if main not in m.tables:
        raise BadInputError(f"{path}: a {m.kind!r} manifest without a {main!r} table; pass a manifest with a "
                            "wnid column (splits, image-list, an import) or a list file")
    names = m.schema(main).names
    if "wnid" not in names:
        raise BadInputError(f"{path}: table {main!r} of the {m.kind!r} manifest has no wnid column; pass a "
                            "manifest with one (splits, image-list, an import) or a list file")
    return m, main, [c for c in IMAGE_COLUMNS if c in names]


def _pieces(m: manifests.Manifest, main: str, columns: Sequence[str]) -> Iterator[pa.Table]:
    """The audited table one row group at a time (``columns`` only); a table without row groups as one piece."""
    empty = True
    for piece in m.batches(main, columns):
        empty = False
        yield piece
    if empty:
        yield m.table(main).select(list(columns))


class ManifestAudit(NamedTuple):
    """``audit_manifest``: the class table, the per-cell / per-level tables (None when the table has no cells /
    levels), the rows audited and the staged per-image table (None without ``out``)."""

    classes: pd.DataFrame
    cells: pd.DataFrame | None
    levels: pd.DataFrame | None
    entries: int
    images: ParquetStream | None


def audit_manifest(m: manifests.Manifest, main: str, columns: Sequence[str], id_wnids: Sequence[str],
                   hierarchy: Hierarchy, *, exclude: Sequence[str], fallback_names: dict[str, str] | None = None,
                   out: str | os.PathLike | None = None, where: str = "table") -> ManifestAudit:
    """``audit.audit_images`` of a manifest's main table, streamed in two passes over its row groups: the wnids
    (entries per class -> the class verdicts, ``audit_classes``), then the rows (``audit.ImageAuditor``), whose
    audited rows go into ``out``'s per-image table (staged; ``write_audit`` commits it). Memory: one row group
    and the (cell, class) counts, whatever the number of rows."""
    counts: Counter = Counter()
    for piece in _pieces(m, main, ["wnid"]):
        count_wnids(piece["wnid"], counts)
    classes = audit_classes(counts, id_wnids, hierarchy, exclude=exclude, fallback_names=fallback_names)
    auditor, stream = ImageAuditor(classes, columns), None
    try:
        for piece in _pieces(m, main, columns):
            rows = auditor.add(piece, where)
            if out is not None:
                if stream is None:
                    stream = ParquetStream(Path(out) / "data" / "images.parquet", rows.schema,
                                           row_group_rows=WHOLE_TABLE_ROWS)
                stream.write(rows)
        return ManifestAudit(classes, auditor.cells(), auditor.levels(), int(sum(counts.values())), stream)
    except BaseException:
        if stream is not None:
            stream.abort()
        raise


def _is_manifest(source: str | os.PathLike) -> bool:
    return (Path(source) / manifests.MANIFEST_FILE).is_file()


def run_audit(source: str | os.PathLike, id_classes: str = "1k", *, exclude: Sequence[str] | None = None,
              preset: str | None = None, out: str | os.PathLike | None = None,
              argv: list[str] | None = None, verify: str = DEFAULT_VERIFY) -> AuditResult:
    """`isood wordnet audit`: every class of a list file or of a manifest's main table (``wnid`` column) with
    the rule it breaks (if any), its conflict and its entry count; for a manifest also the per-image ``rule``
    and, for a graded one, the per-cell and per-level tables. Written as an `audit` manifest when ``out`` is
    given (``manifests.writing``); an audited manifest is verified first (``verify``)."""
    roots = resolve_exclude(exclude, preset)
    listed = None if _is_manifest(source) else read_list_file(source)  # a bad list fails before WordNet loads
    if out is None:
        return _audit(source, listed, id_classes, roots, exclude=exclude, preset=preset, out=None, argv=argv,
                      verify=verify)
    with manifests.writing(out, AUDIT, inputs=_path_inputs(source, id_classes)) as o:
        result = _audit(source, listed, id_classes, roots, exclude=exclude, preset=preset, out=o.work, argv=argv,
                        verify=verify)
    return replace(result, manifest=manifests.read(o.final, kind=AUDIT))


def _audit(source: str | os.PathLike, listed: list | None, id_classes: str, roots: list[str], *,
           exclude: Sequence[str] | None, preset: str | None, out: Path | None, argv: list[str] | None,
           verify: str) -> AuditResult:
    """The audit steps (``run_audit``; ``listed``: the entries of a list file, None for a manifest), writing into
    the work folder ``out`` when given."""
    ids = load_synset_list(id_classes)
    h, names = load_hierarchy(), imagenet_names()
    config = {"list": os.path.abspath(source), "id": _recorded(id_classes), "exclude": roots,
              "preset": preset if exclude is None else None}
    extra: dict = {}
    if listed is None:  # a manifest (``run_audit``)
        m, main, columns = open_audited_table(source, verify=verify)
        a = audit_manifest(m, main, columns, ids, h, exclude=roots, fallback_names=names, out=out,
                           where=str(source))
        table, entries = a.classes, a.entries
        extra = {k: v for k, v in (("images", a.images), ("cells", a.cells), ("levels", a.levels)) if v is not None}
        config["source_kind"] = m.kind
        source_input = manifests.input_record("source", source, sha256=m.content_sha256)
    else:
        table, entries = audit_classes(listed, ids, h, exclude=roots, fallback_names=names), len(listed)
        config["source_kind"] = "list"
        source_input = manifests.input_record("list", source)
    counts = summarise(table)
    manifest = None
    if out is not None:
        inputs = [source_input, _list_input("id", id_classes, ids), _wordnet_input()]
        try:
            manifest = write_audit(out, classes=table, **extra, config=config, inputs=inputs, argv=argv)
        finally:
            if isinstance(extra.get("images"), ParquetStream) and not extra["images"].staged.done:
                extra["images"].abort()
    return AuditResult(table=table, counts=counts, entries=entries, manifest=manifest, cells=extra.get("cells"),
                       levels=extra.get("levels"))
