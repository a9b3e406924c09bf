"""The `isood build-splits` job: load -> clean/filter -> LAID -> measure -> bin -> write (see the package); the test
side is streamed (``stream``)."""

from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Callable, Mapping

import numpy as np
import pandas as pd

import manifests
from isood.features.clip import ClipEncoder
from isood.core.errors import BadInputError
from isood.features.listing import list_images
from isood.features.featurestore.loading import READ_ROWS
from isood.kinds import LAID_FILE, SPLITS, SplitsView
from isood.core.engine import BatchEngine
from isood.core.progress import progress_bar
from isood.features.shift import ShiftSearch, ShiftStream
from isood.stages.splits.options import SplitsOptions, splits_config, validate
from isood.stages.splits.load import (FeatureSet, Inputs, check_feature_sets, check_sources, extract_set,
                                      extracted_files, input_paths, load_encoder, load_inputs, load_precomputed,
                                      train_laid)
from isood.stages.splits.steps import (ann_summary, bin_shifts, clean_features, drop_rows, empty_dropped,
                                       filter_test_rows, rejected_rows, shift_stream)
from isood.stages.splits.stream import StreamedTest, check_test_rows, streamed_test
from isood.stages.splits.write import write_splits

__all__ = ["BuildResult", "build_splits"]

Warn = Callable[[str], None]


@dataclass
class BuildResult:
    """What ``build_splits`` wrote: the manifest, test / ID images used, dropped rows, the cells, warnings."""

    manifest: SplitsView
    n_test: int
    n_id: int
    n_dropped: int
    cells: pd.DataFrame
    warnings: list[str]


def _precomputed_sets(cfg: SplitsOptions, inputs: Inputs, note: Warn) -> dict[str, FeatureSet]:
    """The precomputed sides (verified), checked against --clip and --laid before anything heavy runs."""
    sets = {name: load_precomputed(name, getattr(cfg, name), verify=cfg.verify)
            for name in ("id", "test") if inputs.precomputed[name]}
    check_feature_sets(sets, clip=cfg.clip, clip_identity=inputs.clip_identity,
                       laid_dim=inputs.laid.dim if inputs.laid else None)
    trained_with = inputs.laid.config.get("clip_identity") if inputs.laid is not None else None
    if inputs.clip_identity and trained_with not in (None, inputs.clip_identity):
        note(f"--laid was trained with {trained_with}, not {inputs.clip_identity}")
    return sets


def _extract_missing(cfg: SplitsOptions, sets: dict[str, FeatureSet], encoder: ClipEncoder | None, out: Path, *,
                     note: Warn, argv: list[str] | None, engine: BatchEngine | None) -> dict[str, FeatureSet]:
    """List both image sources (an empty one fails before anything is extracted), extract them into the work
    folder ``out`` (``features-id/``, ``features-test/``), check."""
    sources = {name: list_images(getattr(cfg, name)) for name in ("id", "test") if name not in sets}
    for name, images in sources.items():
        assert encoder is not None, "a set to extract needs the CLIP (load_inputs: need_clip)"
        sets[name] = extract_set(name, getattr(cfg, name), encoder, out / f"features-{name}", cfg, note=note,
                                 argv=argv, engine=engine, images=images)
    check_feature_sets(sets, clip=cfg.clip, clip_dim=encoder.embed_dim if encoder is not None else None)
    return sets


def _rows_bar(bar, description: str, total: int) -> Callable[[int], None]:
    task = bar.add_task(description, total=total)
    return lambda n: bar.advance(task, n)


def _clean_and_filter(cfg: SplitsOptions, sets: Mapping[str, FeatureSet], inputs: Inputs,
                      note: Warn) -> tuple[np.ndarray, StreamedTest, pd.DataFrame]:
    """(x_id, the test rows to measure, dropped table) after the clean and filter steps: the ID features are
    read and cleaned in memory, the test features checked block by block (only their index stays in memory);
    one-line errors when a side ends up empty."""
    ids, test = sets["id"], sets["test"]
    x_id, idx_id, bad_id = clean_features(ids.reader.read(), ids.index, "id", warn=note)
    with progress_bar(cfg.progress and len(test) > READ_ROWS, transient=True) as bar:  # one block: no bar
        check = check_test_rows(test.reader, on_rows=_rows_bar(bar, f"checking {len(test)} test features",
                                                               len(test)))
    for message in check.messages("--test features"):
        note(message)
    idx_test, bad_test = drop_rows(test.index, check.dropped, "test")
    parts = [rejected_rows("id", ids.rejected), bad_id, rejected_rows("test", test.rejected), bad_test]
    if len(x_id) == 0:
        raise BadInputError(f"--id {cfg.id}: no usable ID features (empty set, or every row NaN/inf); pass at least "
                            "one ID image")
    keep, filtered = filter_test_rows(idx_test, kept_wnids=inputs.kept_wnids,
                                      id_wnids=set(idx_id["wnid"]) if cfg.exclude_id_classes else None)
    parts.append(filtered)
    rows = streamed_test(test.reader, check, idx_test, keep)
    if len(rows) == 0:
        raise BadInputError("no test images left (empty --test set, or all removed by --class-filter / "
                            "--exclude-id-classes)")
    parts = [p for p in parts if p is not None]
    dropped = pd.concat(parts, ignore_index=True) if parts else empty_dropped()
    return x_id, rows, dropped


def _measure(cfg: SplitsOptions, stream: ShiftStream, test: StreamedTest, n_id: int) -> ShiftSearch:
    """The shift of every test row, streamed through ``stream`` (the ID side: its LAID halves)."""
    with progress_bar(cfg.progress, transient=True) as bar:
        on_rows = _rows_bar(bar, f"measuring shift of {len(test)} test images against {n_id} ID images", len(test))
        return stream.measure(test.chunks, on_rows=on_rows)


def build_splits(cfg: SplitsOptions, *, warn: Warn | None = None, argv: list[str] | None = None,
                 engine: BatchEngine | None = None) -> BuildResult:
    """Run `isood build-splits` with ``cfg`` (module docstring): load -> clean/filter -> LAID -> measure -> bin ->
    write. Warnings go to ``warn`` (and into the manifest's summary); ``engine`` runs any extraction. The test
    features are streamed (``stream``): memory grows with the test set by its index and two distances per image.
    ``cfg`` is validated first (``config.validate``: one line naming the flag, before any work)."""
    cfg = validate(cfg)
    assert cfg.out is not None, "validate: --out is required"
    check_sources(cfg)
    with manifests.writing(cfg.out, SPLITS, inputs=input_paths(cfg),
                           scratch={"--cache-dir": cfg.cache_dir}) as o:
        result = _build(cfg, o.work, warn=warn, argv=argv, engine=engine)
    view = manifests.read(o.final, kind=SPLITS)
    assert isinstance(view, SplitsView)  # read(kind=...) returns the kind's registered view
    return replace(result, manifest=view)


def _build(cfg: SplitsOptions, out: Path, *, warn: Warn | None, argv: list[str] | None,
           engine: BatchEngine | None) -> BuildResult:
    """The build-splits steps in the work folder ``out`` (``manifests.writing``)."""
    notes: list[str] = []

    def note(message: str) -> None:
        notes.append(message)
        if warn is not None:
            warn(message)

    inputs = load_inputs(cfg)
    sets = _precomputed_sets(cfg, inputs, note)
    encoder = load_encoder(cfg, inputs)
    sets = _extract_missing(cfg, sets, encoder, out, note=note, argv=argv, engine=engine)
    x_id, test, dropped = _clean_and_filter(cfg, sets, inputs, note)
    n_id = len(x_id)
    laid, fit_seconds = train_laid(cfg, inputs, encoder, dim=x_id.shape[1])
    stream = shift_stream(x_id, laid, n_test=len(test), backend=cfg.backend, device=cfg.device,
                          ann_recall=cfg.ann_recall, seed=cfg.seed, ann_levels=cfg.ann_levels,
                          n_levels=cfg.levels, clip=cfg.clip_quantile)
    del x_id  # the ID side is its LAID halves from here on
    found = _measure(cfg, stream, test, n_id)
    grid = bin_shifts(test.index, found.d_sem, found.d_cov, n_levels=cfg.levels, na_threshold=cfg.na_threshold,
                      clip=cfg.clip_quantile)
    ann = ann_summary(found.ann, grid.edges, clip=cfg.clip_quantile, seed=cfg.seed, warn=note)
    ids, test_set = sets["id"], sets["test"]
    summary: dict[str, Any] = {
        "test_images": int(len(grid.images)), "id_images": int(n_id), "dropped": int(len(dropped)),
        "cells": int(len(grid.cells)), "cells_na": int(grid.cells["na"].sum()),
        "laid_orthogonality_error": laid.orthogonality_error, "laid_fit_seconds": fit_seconds, "warnings": notes,
    }
    if ann is not None:
        summary["ann"] = ann
    view = write_splits(
        out, images=grid.images, cells=grid.cells, edges=grid.edges, dropped=dropped,
        config=splits_config(cfg, clip_identity=inputs.clip_identity or ids.identity, id_root=ids.root,
                             test_root=test_set.root),
        inputs=[ids.input, test_set.input, *inputs.records], files=laid.files(LAID_FILE),
        existing_files=extracted_files(out, sets.values()), summary=summary,
        note=f"{len(grid.images)} test images in {cfg.levels}x{cfg.levels} cells", argv=argv)
    return BuildResult(view, len(grid.images), n_id, len(dropped), grid.cells, notes)
