"""The feature store: sharded, resumable CLIP image-feature sets (``features`` manifests) and their loading.

An extraction directory (``isood extract``) is a manifest of kind ``features``::

    features-00000.npy             float32 (n_ok, D) L2-normalised image features of shard 0
    features-00000.rows.parquet    the shard's files: path, wnid, row (-1 when rejected), error
    .~features-00000.stats.parquet the stat cache of its files (run-time bookkeeping, never hashed)
    ...
    data/index.parquet             path (relative to the source root), wnid, shard, row
    data/rejected.parquet          path, wnid, error (unreadable or corrupt images)
    manifest.json                  written last

Shard k holds files ``[k * shard_size, (k + 1) * shard_size)`` of the sorted file list; a shard's ``.npy`` is
renamed into place after its ``.rows.parquet`` (which carries a key of the model identity, the decoding mode
(``isood.features.decoding.DECODE_MODES``) and the member files by path and content hash), so a shard exists only when
complete, and a rerun skips complete shards whose files kept their content (reading only files whose stat
changed: ``isood.core.content``) and redoes an interrupted or stale one.
Extraction runs on any ``isood.core.engine.BatchEngine`` (this process, or Ray actors): every engine encodes the
same batches with ``isood.features.clip.ClipEncodeWorker`` and writes the shards through the same code, so the files
match a single local run. Job arrays (``isood.stages.extract``) write a subset of the shards into a part.
"""

from isood.features.featurestore.extraction import (
    DEFAULT_BATCH_SIZE, DEFAULT_SHARD_SIZE, ExtractResult, ShardRun, check_sizes,
    extract_features, extract_shards, write_features_manifest,
)
from isood.features.featurestore.loading import clean_index, is_feature_dir, load_features
from isood.features.featurestore.shards import (
    SHARD_NAME, SHARD_ROWS_NAME, SHARD_STATS_NAME, CompletedShard, ShardAssembler, complete_shard, image_batches,
    index_tables, key_head, read_shard_rows, remove_stale_shards, shard_bounds, shard_count, shard_dim,
    shard_files, shard_key, shard_stat_cache, stored_key, write_shard,
)

__all__ = [
    "DEFAULT_BATCH_SIZE", "DEFAULT_SHARD_SIZE", "ExtractResult", "ShardRun", "check_sizes",
    "extract_features", "extract_shards", "write_features_manifest", "clean_index",
    "is_feature_dir", "load_features", "SHARD_NAME", "SHARD_ROWS_NAME", "SHARD_STATS_NAME", "CompletedShard",
    "ShardAssembler", "complete_shard", "image_batches", "index_tables", "key_head", "read_shard_rows",
    "remove_stale_shards", "shard_bounds", "shard_count", "shard_dim", "shard_files", "shard_key",
    "shard_stat_cache", "stored_key", "write_shard",
]
