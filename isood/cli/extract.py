"""`isood extract` (CLIP features into resumable shards, on this process or Ray) and `isood merge` (the parts
of a job array -> the manifest a single run writes; each kind's merge belongs to the stage that writes it)."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Callable, Sequence

from isood.stages.syn import merge_parts as merge_syn_parts
from isood.cli._app import app, out_console
from isood.engines.ray import RayEngine, RayOptions
from isood.core.errors import BadInputError, IsoodError
from isood.kinds import FEATURES, SYN_IS
from isood.core.engine import BatchEngine, LocalEngine
from isood.stages.extract import ExtractOptions, merge_parts as merge_feature_parts, run_extract, validate
from isood.cli.options import command
from isood.core.shared_options import EngineFields
from isood.stages.publish.options import MergeOptions
from manifests.parts import read_parts
from manifests.store import Manifest
from manifests.verify import verify

__all__ = ["extract", "merge", "engine_of", "merge_dirs", "MERGES"]

#: The merge of each kind a job array's parts combine into (the stage that writes the kind owns it).
MERGES: dict[str, Callable[..., Manifest]] = {FEATURES: merge_feature_parts, SYN_IS: merge_syn_parts}


def engine_of(opts: EngineFields, *, device: str | None) -> BatchEngine:
    """The engine of ``--engine`` (one of ``isood.core.defaults.ENGINES``, checked by ``isood.core.optspec``): ``local``
    (this process) or ``ray`` (Ray Data actors, ``isood.engines.ray``: ``--ray-workers`` of them)."""
    if opts.engine == "local":
        return LocalEngine()
    options = RayOptions(address=opts.ray_address, actors=opts.ray_actors, num_gpus_per_worker=opts.num_gpus_per_worker)
    return RayEngine(options, device=device)


@command(app, "extract", ExtractOptions,
         help="Extract L2-normalised CLIP image features into resumable shards (unreadable images are listed, not "
              "fatal).")
def extract(opts: ExtractOptions) -> None:
    opts = validate(opts)
    eng = engine_of(opts, device=opts.device)
    r = run_extract(opts, engine=eng)
    part = f" (part {opts.shard_index} of {opts.num_shards}: merge with `isood merge`)" if opts.num_shards > 1 else ""
    out_console.print(
        f"{r.n_images} images -> {r.embed_dim}-d features, {r.n_rejected} rejected; "
        f"shards written {len(r.shards_written)}, reused {len(r.shards_reused)}; manifest: {opts.out}{part}",
        highlight=False,
    )


def merge_dirs(dirs: Sequence[str | os.PathLike], out: str | os.PathLike, *,
               argv: list[str] | None = None) -> Manifest:
    """``isood merge``: check the parts (``manifests.parts.read_parts``), merge them with their kind's merge into
    ``out``, verify every hash of the result."""
    parts, kind, config = read_parts(dirs)
    out = Path(out)
    merge = MERGES.get(kind)
    if merge is None:
        raise BadInputError(f"isood merge does not know parts of kind {kind!r} (knows: {', '.join(sorted(MERGES))})")
    manifest = merge(parts, out, config, argv=argv)
    report = verify(out)
    if not report.ok:
        raise IsoodError(f"merged manifest {out} fails verification: {'; '.join(report.lines()[:3])}")
    return manifest


@command(app, "merge", MergeOptions, config=False,
         help="Combine the parts of a job array (`isood extract` / `isood generate-syn` with --num-shards) into one "
              "verified manifest.")
def merge(opts: MergeOptions) -> None:
    m = merge_dirs(opts.parts, opts.out)
    out_console.print(f"merged {len(opts.parts)} parts -> {opts.out} ({m.kind} v{m.dataset_version}, "
                      f"{len(m.meta['files'])} files verified)", highlight=False, soft_wrap=True)
