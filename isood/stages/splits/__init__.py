"""The stage `isood build-splits`: ID + test features -> LAID -> (D_sem, D_cov) per test image -> n x n grid ->
``splits`` manifest.

Steps (IS-OOD): features of the ID set (e.g. ImageNet-1K train) and of the test images come from one CLIP
model (``--id`` / ``--test`` are image sources, extracted on the fly into ``OUT/features-id`` /
``OUT/features-test``, or precomputed feature sets); LAID is loaded (``--laid``) or trained on text triplets of
labels x open_clip's 80 ImageNet templates encoded by the same CLIP (``isood.features.laid_training``); each test image
gets D_sem = min_ID d(x_sem, id_sem) and D_cov likewise (``isood.features.shift``); both are binned into ``levels``
equal-width levels (``isood.science.grid``), giving cells ``cov_{c}_sem_{s}``. The search is exact unless
``--ann-recall R`` asks for an approximate one tuned to recall@1 R; what it achieved (held-out recall@1, the
share of images whose level and cell equal an exact build's with a 95% interval, the edge shift, parameters) goes
into the summary as ``ann`` (:func:`ann_summary`, ``SplitsView.ann``, ``isood.features.ann.agreement``).

The stage is small named steps: load (config, inputs, feature sets) -> pure steps (:func:`clean_features`,
:func:`filter_test_rows`, :func:`measure_shift`, :func:`bin_shifts`) -> write (:func:`write_splits`). The test
side is streamed (``stream``): the test features are read block by block from their memory-mapped files (a
check pass, then the search pass; with ``--ann-recall`` a pass that gathers the tuning sample in between),
cleaned and filtered per block, and searched against the ID side's LAID halves (:func:`shift_stream`); what stays
in memory per test image is its index row (path, wnid), two flags and its two distances. The result is the
bytes of the steps above run on the whole test set in memory. The output is a manifest of kind ``splits``
(``isood.kinds.SPLITS``)::

    data/images.parquet    path, wnid, d_sem, d_cov, sem_level, cov_level, cell   (one row per test image)
    data/cells.parquet     cell, cov_level, sem_level, n, na
    data/edges.parquet     axis ('sem'|'cov'), level, lower, upper
    data/dropped.parquet   set ('id'|'test'), path, wnid, reason   (NaN rows, filtered classes, unreadable)
    laid.safetensors       W (+ loss history); laid.json its config (text-set hash, options)
    lists/cov_{c}_sem_{s}.txt  test image paths of each cell, one per line (relative to the test root)
    features-id/, features-test/   the extracted features, when --id / --test were image sources
    manifest.json          written last

Modules: ``options`` (:class:`SplitsOptions`, :func:`load_splits_options`), ``load`` (load steps), ``steps`` (pure
steps), ``stream`` (the streamed test side), ``write`` (:func:`write_splits`), ``job`` (:func:`build_splits`).
"""

from __future__ import annotations

from isood.stages.splits.options import SplitsOptions, load_splits_options, parse_quantile, splits_config, validate
from isood.stages.splits.job import BuildResult, build_splits
from isood.stages.splits.load import FeatureSet
from isood.stages.splits.steps import (DROPPED_COLUMNS, LEVEL_AGREEMENT_TARGET, Grid, ann_summary, bin_shifts,
                                       clean_features, drop_rows, dropped_rows, filter_test_rows, measure_shift,
                                       rejected_rows, shift_stream)
from isood.stages.splits.stream import StreamedTest, check_test_rows, streamed_test
from isood.stages.splits.write import cell_lists, write_splits

__all__ = [
    "SplitsOptions", "load_splits_options", "validate", "parse_quantile", "splits_config", "FeatureSet", "Grid",
    "BuildResult", "DROPPED_COLUMNS", "build_splits", "clean_features", "drop_rows", "dropped_rows", "rejected_rows",
    "filter_test_rows", "measure_shift", "shift_stream", "bin_shifts", "ann_summary", "LEVEL_AGREEMENT_TARGET",
    "cell_lists", "write_splits", "StreamedTest", "check_test_rows", "streamed_test",
]
