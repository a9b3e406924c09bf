"""The stage `isood splits clean`: a splits manifest + an audit of its classes -> a leak-free splits manifest.

IS-OOD keeps ImageNet-1K classes, their hypernyms and hyponyms in its cells; ImageNet-OOD's point is that such
images are not OOD. This stage removes them from any splits manifest (a build-splits output or an import of a
release) and keeps everything else: the same cells and edges, the images whose class is not a leak (the
audit's class verdicts, ``wordnet_tools.rules.leak_mask``: rules ``id``, ``hypernym``, ``hyponym`` unless
``rules`` says otherwise), the counts recomputed (``isood.science.grid.cell_table``) with N/A = N/A before or now
below the threshold (the manifest's own, ``SplitsView.na_threshold``; an explicit ``na_threshold`` overrides it,
then N/A = a missing list or below it, and the config records both), the per-cell list files filtered line by line (whatever their layout), the removed images
added to the ``dropped`` table with reason ``leak:<rule>``, the input's config and LAID weights, and provenance
to both inputs.

Steps: ``load_inputs`` -> pure steps per row group of the images table (``leaking_rows``, ``count_cells``,
``leak_dropped``) and per batch of list files (``filter_lists``), then ``recount_cells`` -> write (the splits
kind's tables and files through ``manifests``: the images table streamed with ``manifests.card_stream``, as an
import of a release writes it, and the ``dropped`` table streamed beside it, so a release-size manifest never
sits in memory whole; what is held is one row group, the removed paths and one batch of list files).
"""

from __future__ import annotations

import os
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Mapping, Sequence

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc

import manifests
from isood.core.defaults import DEFAULT_VERIFY
from isood.core.optspec import check_field
from isood.stages.clean.options import CleanOptions
from isood.science.grid import cell_table, is_na
from isood.kinds import AUDIT, LAID_FILE, SPLITS, AuditView, SplitsView
from manifests.card_stream import WHOLE_TABLE_ROWS, MainTableStream, finish_stream
from manifests.stream import ParquetStream, StagedFile
from wordnet_tools.rules import LEAK_RULES, leak_mask, parse_rules

__all__ = ["CleanResult", "load_inputs", "cell_keys", "leaking_rows", "count_cells", "recount_cells",
           "leak_dropped", "filter_list", "filter_lists", "clean_splits", "DROPPED_SCHEMA"]

DROPPED_SCHEMA = pa.schema([("set", pa.string()), ("path", pa.string()), ("wnid", pa.string()),
                            ("reason", pa.string())])
_CARRIED = (LAID_FILE, "laid.json")  # small files of the input that stay valid for the cleaned manifest
#: List files are filtered in batches of about this many characters: the removed paths are hashed once per batch.
LIST_BATCH_CHARS = 64 << 20


@dataclass(frozen=True)
class CleanResult:
    """What `isood splits clean` did: the cleaned manifest, images kept / removed (and per rule), N/A cells
    before and after."""

    manifest: SplitsView
    kept: int
    removed: int
    removed_by_rule: dict[str, int]
    na_before: int
    na_after: int




def load_inputs(splits: str | os.PathLike, audit: str | os.PathLike, *,
                verify: str = DEFAULT_VERIFY) -> tuple[SplitsView, AuditView]:
    """The typed views of the splits manifest and of the audit (kinds and schemas checked, files verified)."""
    view, aud = manifests.read(splits, kind=SPLITS, verify=verify), manifests.read(audit, kind=AUDIT, verify=verify)
    assert isinstance(view, SplitsView) and isinstance(aud, AuditView)  # read(kind=...) returns the kind's view
    return view, aud


def _arrow(images: pa.Table | pd.DataFrame) -> pa.Table:
    return images if isinstance(images, pa.Table) else pa.Table.from_pandas(images, preserve_index=False)


def cell_keys(cells: pd.DataFrame, image_columns: Sequence[str]) -> list[str]:
    """The columns a cells table is keyed by besides the levels, when the images have them too (an import
    deciding N/A per subset has a ``source`` per cells row)."""
    return [c for c in ("source", "subset") if c in cells.columns and c in image_columns]


def leaking_rows(images: pa.Table | pd.DataFrame, class_rules: Mapping[str, str], *,
                 rules: Sequence[str] = LEAK_RULES, where: str = "the audit") -> np.ndarray:
    """Boolean (N,): the images whose class's verdict is one of ``rules`` (one lookup per class)."""
    return leak_mask(images["wnid"], class_rules, rules=rules, where=where)


def count_cells(images: pa.Table | pd.DataFrame, *, keys: Sequence[str], n_levels: int) -> Counter:
    """Images per ``(*keys, cov_level, sem_level)`` (``isood.science.grid.cell_table`` of each key group)."""
    t = _arrow(images)
    cov = pc.fill_null(t["cov_level"], -1).to_numpy().astype(np.int64)
    sem = pc.fill_null(t["sem_level"], -1).to_numpy().astype(np.int64)
    if keys:
        frame = pd.DataFrame({k: t[k].to_pandas().fillna("").astype(str) for k in keys})
        groups = [(k if isinstance(k, tuple) else (k,), np.asarray(idx))
                  for k, idx in frame.groupby(list(keys), sort=False).indices.items()]
    else:
        groups = [((), np.arange(len(cov)))]
    out: Counter = Counter()
    for key, rows in groups:
        table = cell_table(cov[rows], sem[rows], n_levels)
        out.update({(*key, int(c), int(s)): int(n) for c, s, n in
                    zip(table["cov_level"], table["sem_level"], table["n"]) if n})
    return out


def recount_cells(cells: pd.DataFrame, counts: Mapping[tuple, int], *, keys: Sequence[str],
                  na_threshold: int, keep_marked: bool = True) -> pd.DataFrame:
    """``cells`` with ``n`` from ``counts`` (``count_cells``) and ``na`` = marked N/A before (``keep_marked``;
    else only a cell whose list is ``missing``) or fewer than ``na_threshold`` images now; every other column and
    every row kept."""
    out = cells.copy()
    key_cols = [out[k].fillna("").astype(str) for k in keys] + [out["cov_level"], out["sem_level"]]
    out["n"] = np.array([int(counts.get(tuple(k), 0)) for k in zip(*key_cols)], dtype=np.int64)
    marked = out["na"] if keep_marked else out["missing"] if "missing" in out.columns else pd.Series(False, out.index)
    out["na"] = marked.fillna(False).astype(bool).to_numpy() | is_na(out["n"].to_numpy(), na_threshold)
    return out


def leak_dropped(images: pa.Table | pd.DataFrame, leaking: np.ndarray, class_rules: Mapping[str, str]) -> pa.Table:
    """The removed images as ``dropped`` rows: set 'test', path, wnid, reason ``leak:<rule>``."""
    gone = _arrow(images).filter(pa.array(np.asarray(leaking, dtype=bool)))
    wnid = pc.fill_null(gone["wnid"].cast(pa.string()), "").to_pylist()
    return pa.table({"set": pa.array(["test"] * len(wnid), pa.string()), "path": gone["path"].cast(pa.string()),
                     "wnid": pa.array(wnid, pa.string()),
                     "reason": pa.array([f"leak:{class_rules[w]}" for w in wnid], pa.string())}, schema=DROPPED_SCHEMA)


def filter_list(text: str, removed: pa.Array) -> str:
    """A list file's text without the lines whose path (first field) is in ``removed``; other lines (blank ones
    included) kept as they are (``filter_lists`` of one file)."""
    return filter_lists([text], removed)[0]


def filter_lists(texts: Sequence[str], removed: pa.Array) -> list[str]:
    """``filter_list`` of several list files' texts at once, in Arrow (no Python object per line): the set of
    ``removed`` paths is hashed once per call, so pass many files (``LIST_BATCH_CHARS``) at a time."""
    if not len(removed) or not any(texts):
        return list(texts)
    kind = pa.string() if sum(len(t) for t in texts) < (1 << 30) else pa.large_string()  # string: faster is_in
    lines = pc.split_pattern(pa.array(texts, kind), "\n")
    flat = lines.flatten()
    first = pc.utf8_trim_whitespace(flat)
    if pc.any(pc.match_substring_regex(first, r"\s")).as_py():  # `path label` lines: the path
        first = pc.replace_substring_regex(first, r"\s.*", "")
    keep = pc.invert(pc.fill_null(pc.is_in(first, value_set=removed.cast(kind)), False))
    offsets, out = lines.offsets.to_numpy(), []
    for lo, hi in zip(offsets[:-1], offsets[1:]):  # each file's kept lines, joined back
        kept = flat.slice(lo, hi - lo).filter(keep.slice(lo, hi - lo))
        one = (pa.ListArray if kind == pa.string() else pa.LargeListArray).from_arrays([0, len(kept)], kept)
        out.append(pc.binary_join(one, pa.scalar("\n", kind))[0].as_py())
    return out


# ------------------------------------------------------------------------------------------------ the job
def _list_rels(view: SplitsView) -> list[str]:
    return [r["path"] for r in view.meta.get("files", []) if r["path"].startswith("lists/")]


def _carried_files(view: SplitsView) -> dict[str, bytes]:
    listed = {r["path"] for r in view.meta.get("files", [])}
    return {rel: view.path(rel).read_bytes() for rel in _CARRIED if rel in listed}


@dataclass
class _Pass:
    """The one pass over the images table: the kept images (staged, with their config copies), the ``dropped``
    table (staged: the input's rows, then the removed images), kept images per cell, removed per rule, and the
    removed paths (for the list files)."""

    images: MainTableStream
    dropped: ParquetStream
    counts: Counter = field(default_factory=Counter)
    by_rule: Counter = field(default_factory=Counter)
    removed: list[pa.Array] = field(default_factory=list)

    def abort(self) -> None:
        self.images.abort()
        if not self.dropped.staged.done:
            self.dropped.abort()


def _stream_images(view: SplitsView, out: Path, class_rules: Mapping[str, str], rules: Sequence[str],
                   keys: Sequence[str], where: str) -> _Pass:
    """The kept rows into a staged images table and the removed ones into a staged dropped table, row group by
    row group (memory: one row group and the removed paths, whatever the size of the table)."""
    run = _Pass(MainTableStream(out, SPLITS, view.schema("images"), plain_columns=["path"]),
                ParquetStream(out / "data" / "dropped.parquet", DROPPED_SCHEMA, row_group_rows=WHOLE_TABLE_ROWS))
    try:
        if "dropped" in view.tables:
            for piece in view.batches("dropped", DROPPED_SCHEMA.names):
                run.dropped.write(piece)
        for piece in view.batches("images"):
            leaking = leaking_rows(piece, class_rules, rules=rules, where=where)
            kept = piece.filter(pa.array(~leaking))
            run.images.write(kept)
            run.counts.update(count_cells(kept, keys=keys, n_levels=view.n_levels))
            gone = leak_dropped(piece, leaking, class_rules)
            run.dropped.write(gone)
            run.by_rule.update({r["values"].removeprefix("leak:"): r["counts"]
                                for r in pc.value_counts(gone["reason"]).to_pylist()})
            run.removed.append(gone["path"].combine_chunks())
    except BaseException:
        run.abort()
        raise
    return run


def _stage_lists(view: SplitsView, out: Path, removed: pa.Array) -> list[StagedFile]:
    """Filtered copies of the list files, staged; files are read and filtered ``LIST_BATCH_CHARS`` at a time."""
    copies: list[StagedFile] = []
    batch: list[tuple[str, str]] = []

    def flush() -> None:
        for (rel, _), text in zip(batch, filter_lists([t for _, t in batch], removed)):
            copies.append(StagedFile(out / rel))
            copies[-1].write(text.encode())
            copies[-1].close()
        batch.clear()

    try:
        for rel in _list_rels(view):
            batch.append((rel, view.path(rel).read_text(encoding="utf-8")))
            if sum(len(t) for _, t in batch) >= LIST_BATCH_CHARS:
                flush()
        flush()
    except BaseException:
        for c in copies:
            c.abort()
        raise
    return copies


def clean_splits(splits: str | os.PathLike, audit: str | os.PathLike, *, out: str | os.PathLike,
                 rules: str | Sequence[str] = LEAK_RULES, argv: list[str] | None = None,
                 verify: str = DEFAULT_VERIFY, na_threshold: int | None = None) -> CleanResult:
    """`isood splits clean` (module docstring); ``verify``: how the two inputs are checked ('fast' or 'full');
    ``na_threshold``: None for the manifest's own."""
    rules = parse_rules(rules)
    check_field(CleanOptions, "na_threshold", na_threshold)
    with manifests.writing(out, SPLITS, inputs=[splits, audit]) as o:
        view, aud = load_inputs(splits, audit, verify=verify)
        kept, n_removed, by_rule, summary = _clean(view, aud, o.work, rules, argv=argv, na_threshold=na_threshold)
    cleaned = manifests.read(o.final, kind=SPLITS)
    assert isinstance(cleaned, SplitsView)  # read(kind=...) returns the kind's registered view
    return CleanResult(cleaned, kept, n_removed, by_rule, summary["cells_na_before"],
                       summary["cells_na"])


def _clean(view: SplitsView, aud: AuditView, out: Path, rules: tuple[str, ...], *,
           argv: list[str] | None, na_threshold: int | None = None) -> tuple[int, int, dict[str, int], dict]:
    """The clean steps in the work folder ``out``: leaking rows streamed out, lists filtered, cells recounted,
    the manifest written; returns (kept, removed, removed per rule, summary)."""
    class_rules = aud.class_rules()
    keys = cell_keys(view.cells, view.schema("images").names)
    for piece in view.batches("images", ["wnid"]):  # a class without a verdict fails before anything is written
        leaking_rows(piece, class_rules, rules=rules, where=f"--audit {aud.root}")
    run = _stream_images(view, out, class_rules, rules, keys, where=f"--audit {aud.root}")
    try:
        removed = pa.chunked_array(run.removed, pa.string()).combine_chunks()
        run.removed.clear()
        copies = _stage_lists(view, out, removed)
    except BaseException:
        run.abort()
        raise
    del removed
    used = view.na_threshold if na_threshold is None else int(na_threshold)
    cells = recount_cells(view.cells, run.counts, keys=keys, na_threshold=used, keep_marked=na_threshold is None)
    by_rule = {str(r): int(n) for r, n in sorted(run.by_rule.items(), key=lambda kv: (-kv[1], kv[0]))}
    kept, n_removed = int(sum(run.counts.values())), int(sum(by_rule.values()))
    summary = {"images": kept, "removed": n_removed, "removed_by_rule": by_rule, "cells_na": int(cells["na"].sum()),
               "cells_na_before": int(view.cells["na"].astype(bool).sum()),
               "na_threshold": {"manifest": view.na_threshold, "used": used}}
    tables = {"cells": cells, "edges": view.edges}
    config = {**view.config, "na_threshold": used,
              "clean": {"splits": os.path.abspath(view.root), "audit": os.path.abspath(aud.root), "rules": list(rules),
                        "na_threshold": {"manifest": view.na_threshold, "used": used}}}
    for c in copies:
        c.commit()
    run.dropped.commit()
    layout, table_files = finish_stream(run.images, tables=tables, config=config,
                                        table_files={"dropped": "data/dropped.parquet"})
    manifests.write_with_card(
        out, kind=SPLITS, tables=tables, table_files=table_files, layout=layout, config=config,
        existing_files=[c.path.relative_to(out).as_posix() for c in copies], files=_carried_files(view),
        inputs=[manifests.input_record("splits", view.root, sha256=view.content_sha256),
                manifests.input_record("audit", aud.root, sha256=aud.content_sha256)],
        summary=summary, note=f"leak-free copy of {view.root.name} ({', '.join(rules)} removed)", argv=argv,
        title="IS-OOD splits (leak-free)")
    return kept, n_removed, by_rule, summary
