"""The ``isood extract`` stage, and the merge of its job-array parts (``isood merge``).

Steps: validate the options -> list the images -> pick this task's shards -> extract them on the given engine
(``isood.features.featurestore.extract_shards``) -> write the ``features`` manifest, or for one task of a job array
(``--num-shards N --shard-index i``: shards k with k % N == i) a ``features-part`` manifest of its shards.
``merge_parts`` combines the parts into the manifest a single run writes (same files, same bytes).

    sbatch --array=0-7 --wrap 'isood extract --images ROOT --clip C --out parts/$SLURM_ARRAY_TASK_ID \\
                               --num-shards 8 --shard-index $SLURM_ARRAY_TASK_ID'
    isood merge parts/* --out features

The stage never builds an engine: it takes ``engine: BatchEngine | None`` (None: this process).
"""

from __future__ import annotations

import os
import warnings
from pathlib import Path
from typing import Callable, Mapping, Sequence, cast

import numpy as np
import pandas as pd

from isood.core.errors import BadInputError, IsoodWarning
from isood.features.featurestore import ( SHARD_NAME, SHARD_ROWS_NAME, SHARD_STATS_NAME, ExtractResult, ShardRun,
    extract_shards, read_shard_rows, remove_stale_shards, shard_count, shard_files,
    write_features_manifest,
)
from isood.features.listing import list_images
from isood.kinds import FEATURES, FEATURES_PART
from isood.core.engine import BatchEngine
from isood.core.files import link_or_copy
from isood.core.optspec import check
from isood.core.parts import check_shard_args, part_info, selected_units
from manifests.output import writing
from manifests.card import write_with_card
from isood.stages.extract.options import ExtractOptions
from manifests.store import Manifest, ManifestView, read

__all__ = ["validate", "output_kind", "task_shards", "part_table", "write_part", "run_extract",
           "merged_config", "merge_parts"]




def validate(opts: ExtractOptions) -> ExtractOptions:
    """The checked options (``isood.core.optspec.check``: every bound, one line naming the flag) and the job-array
    arguments."""
    opts = check(opts)
    check_shard_args(opts.num_shards, opts.shard_index)
    return opts


def output_kind(opts: ExtractOptions) -> str:
    """``features`` for a single run, ``features-part`` for one task of a job array."""
    return FEATURES if int(opts.num_shards) == 1 else FEATURES_PART


def task_shards(n_images: int, opts: ExtractOptions) -> list[int]:
    """The feature shards this task makes: all of them in a single run, every k with k % N == i in task i of N."""
    return selected_units(shard_count(n_images, opts.shard_size), opts.num_shards, opts.shard_index)


def part_table(shard_rows: Mapping[int, pd.DataFrame], keys: Mapping[int, str], shards: Sequence[int]) -> pd.DataFrame:
    """The ``shards`` table of a part: shard, key, images encoded, images rejected."""
    return pd.DataFrame({
        "shard": np.array(list(shards), dtype=np.int32),
        "key": pd.Series([keys[k] for k in shards], dtype=object),  # an empty part: no float column
        "images": np.array([int((shard_rows[k]["row"] >= 0).sum()) for k in shards], dtype=np.int64),
        "rejected": np.array([int((shard_rows[k]["row"] < 0).sum()) for k in shards], dtype=np.int64),
    })


def write_part(run: ShardRun, opts: ExtractOptions, *, argv: list[str] | None = None) -> Manifest:
    """The ``features-part`` manifest of task ``opts.shard_index``: its shards and their keys."""
    shards = part_table(run.rows, run.keys, run.shards)
    config = {**run.config, "part": part_info(opts.num_shards, opts.shard_index, run.n_shards, "feature shard")}
    summary = {"images": int(shards["images"].sum()), "rejected": int(shards["rejected"].sum()),
               "embed_dim": run.embed_dim, "shards": len(run.shards), "shards_total": run.n_shards}
    return write_with_card(run.out, kind=FEATURES_PART, tables={"shards": shards}, config=config, inputs=run.inputs,
                           existing_files=shard_files(run.shards), summary=summary, argv=argv,
                           note=f"part {opts.shard_index} of {opts.num_shards}: {len(run.shards)} of "
                                f"{run.n_shards} feature shards")


def run_extract(opts: ExtractOptions, *, engine: BatchEngine | None = None, argv: list[str] | None = None,
                on_shard: Callable[[int], None] | None = None) -> ExtractResult:
    """``isood extract``: validate, list, extract this task's shards on ``engine``, write the manifest."""
    opts = validate(opts)
    source = list_images(opts.images, follow_symlinks=opts.follow_symlinks)
    kind = output_kind(opts)
    with writing(opts.out, kind, inputs=[source.source]) as o:
        run = extract_shards(source, opts.clip, o.work, shards=task_shards(len(source.files), opts),
                             batch_size=opts.batch_size, decode_processes=opts.decode_processes,
                             shard_size=opts.shard_size,
                             device=opts.device, progress=opts.progress, engine=engine, on_shard=on_shard,
                             decode=opts.decode)
        if kind == FEATURES:
            write_features_manifest(o.work, run.rows, run.config, run.inputs, argv=argv)
        else:
            write_part(run, opts, argv=argv)
    result = run.result(read(o.final, kind=kind))
    if kind == FEATURES and result.n_images == 0:  # a manifest nothing can use: said, not silent
        warnings.warn(f"{o.final} holds 0 images: all {result.n_rejected} were rejected (its `rejected` table says "
                      "why); fix or replace them before building splits from it", IsoodWarning, stacklevel=2)
    return result


# ------------------------------------------------------------------------------------------------ merge
def merged_config(config: Mapping, embed_dims: Sequence[int | None]) -> dict:
    """The single run's config from the parts' shared config: no ``part`` entry, the parts' one feature
    dimension (parts without shards know none)."""
    dims = {int(d) for d in embed_dims if d is not None}
    if len(dims) > 1:
        raise BadInputError(f"parts hold features of different dimensions {sorted(dims)}; merge parts of one run")
    out = {k: v for k, v in config.items() if k != "part"}
    out["embed_dim"] = dims.pop() if dims else config.get("embed_dim")
    return out


def _take_part(view, out: Path, rows: dict[int, pd.DataFrame]) -> None:
    """Link (or copy) the shards of one part (and their stat caches) into ``out`` and read their rows, checking
    their keys."""
    table = view.frame("shards")
    for k, key in zip(table["shard"].astype(int), table["key"]):
        if k in rows:
            raise BadInputError(f"feature shard {k} is in two parts ({view.root} and another); merge parts of one run")
        for name in (SHARD_ROWS_NAME.format(k), SHARD_NAME.format(k)):
            link_or_copy(view.path(name), out / name)
        stats = view.root / SHARD_STATS_NAME.format(k)  # bookkeeping: a rerun of the merged set reads no file
        if stats.is_file():
            link_or_copy(stats, out / stats.name)
        rows[k], stored = read_shard_rows(out / SHARD_ROWS_NAME.format(k))
        if stored != key:
            raise BadInputError(f"{view.root}: shard {k} does not match its part manifest; rerun that part")


def merge_parts(parts: Sequence[Manifest], out: str | os.PathLike, config: Mapping, *,
                argv: list[str] | None = None) -> Manifest:
    """Combine the ``features-part`` manifests of one job array (checked by ``manifests.parts.read_parts``) into
    the ``features`` manifest a single run writes in ``out``: shard files hard-linked (copied across file
    systems), the index built as a single run builds it."""
    views = [cast(ManifestView, read(m.root, kind=FEATURES_PART)) for m in parts]  # read(kind=...): a view
    n_shards = int(config["part"]["units"])
    merged = merged_config(config, [v.field("embed_dim") for v in views])
    with writing(out, FEATURES, inputs=[m.root for m in parts]) as o:
        rows: dict[int, pd.DataFrame] = {}
        for view in views:
            _take_part(view, o.work, rows)
        missing = sorted(set(range(n_shards)) - set(rows))
        if missing:
            raise BadInputError(f"feature shards {missing[:10]} are in no part; run the missing array tasks first")
        remove_stale_shards(o.work, set(range(n_shards)))
        write_features_manifest(o.work, rows, merged, parts[0].meta.get("inputs", []), argv=argv)
    return read(o.final, kind=FEATURES)
