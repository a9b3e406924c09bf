"""Resumable sharded extraction on any ``BatchEngine``, and the ``features`` manifest."""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Mapping, Sequence

import pandas as pd

from isood.features.clip import ClipEncoder, ClipEncodeWorker, load_clip, parse_clip_spec
from isood.core.content import content_hashes
from isood.core.errors import IsoodError
from isood.features.decoding import REFERENCE_DECODE, check_decode_mode
from isood.features.listing import ImageSource, list_images
from isood.kinds import FEATURES
from isood.core.optconfig import absolute_spec
from isood.core.engine import BatchEngine, LocalEngine
from isood.core.optspec import check_described
from isood.core.shared_options import batch_size_option, decode_processes_option, shard_size_option
from isood.core.workers import WorkerSpec, resolve_workers
from isood.features.featurestore.shards import (
    SHARD_NAME, ShardAssembler, image_batches, index_tables, key_head, remove_stale_shards, shard_bounds,
    shard_count, shard_dim, shard_files, shard_key, shard_stat_cache, stored_key, write_shard,
)
from isood.core.defaults import DEFAULT_BATCH_SIZE, DEFAULT_SHARD_SIZE  # re-exported; their home is isood.core.defaults
from manifests.card import write_with_card
from manifests.output import writing
from manifests.store import Manifest, input_record, read, write_manifest

__all__ = [
    "DEFAULT_BATCH_SIZE", "DEFAULT_SHARD_SIZE", "ExtractResult", "ShardRun",
    "check_sizes", "extract_shards", "write_features_manifest", "extract_features",
]

@dataclass
class ExtractResult:
    """What an extraction did: the manifest, images encoded / rejected, shards written now / reused."""

    manifest: Manifest
    n_images: int
    n_rejected: int
    shards_written: list[int]
    shards_reused: list[int]
    embed_dim: int | None


@dataclass
class ShardRun:
    """The shards an extraction made complete in ``out``: ``rows`` (shard -> its rows table), their ``keys``,
    which were ``written`` now, the feature dimension, and the manifest ``config`` / ``inputs`` of the run."""

    out: Path
    shards: list[int]
    n_shards: int
    keys: dict[int, str]
    rows: dict[int, pd.DataFrame]
    written: list[int]
    embed_dim: int | None
    config: dict = field(default_factory=dict)
    inputs: list = field(default_factory=list)

    def result(self, manifest: Manifest) -> ExtractResult:
        n_ok = sum(int((self.rows[k]["row"] >= 0).sum()) for k in self.shards)
        n_bad = sum(int((self.rows[k]["row"] < 0).sum()) for k in self.shards)
        reused = sorted(set(self.rows) - set(self.written))
        return ExtractResult(manifest, n_ok, n_bad, sorted(self.written), reused, self.embed_dim)


def check_sizes(*, batch_size: int, shard_size: int, decode_processes: int | None = None) -> None:
    """The sizes of the Python API checked against the options' one description (``batch_size_option``,
    ``shard_size_option``, ``decode_processes_option``; ``isood.core.optspec.check_described``): one line naming the flag
    (None: the default)."""
    check_described("batch_size", batch_size_option(), batch_size)
    check_described("shard_size", shard_size_option(), shard_size)
    check_described("decode_processes", decode_processes_option(), decode_processes)


@dataclass
class _Model:
    """The model as the run needs it: the encoder when loaded here, else the name the engine's workers load."""

    spec: str
    identity: str
    encoder: ClipEncoder | None
    device: str


def _model(clip: str | ClipEncoder, engine: BatchEngine, device: str | None) -> _Model:
    """In-process engine: the loaded encoder (loaded once, here). Other engines: the driver never loads the model
    (the workers do); its name is validated and its identity computed without the weights."""
    if engine.name == "local":
        encoder = clip if isinstance(clip, ClipEncoder) else load_clip(clip, device)
        return _Model(encoder.spec, encoder.identity, encoder, str(encoder.device))
    spec = clip.spec if isinstance(clip, ClipEncoder) else str(clip).strip()
    return _Model(spec, parse_clip_spec(spec).identity, None, engine.device_name(device))


def _record_stats(out: Path, k: int, source: ImageSource, lo: int, hi: int, hashes: Sequence[str]) -> None:
    """Save the stat cache of shard ``k`` (files ``[lo, hi)`` with their content ``hashes``), so that a rerun
    reads none of its unchanged files."""
    cache = shard_stat_cache(out, k)
    files = source.files[lo:hi]
    stats = source.stats[lo:hi] if source.stats else [None] * len(files)
    for f, st, sha in zip(files, stats, hashes):
        cache.record(f, st, sha, source.seen_ns)
    cache.keep_only(files)
    cache.save()


def _reusable(source: ImageSource, rels: Sequence[str], refused: Sequence[str], model: _Model, out: Path, k: int,
              *, shard_size: int, decode: str) -> tuple[pd.DataFrame, str] | None:
    """``(rows, key)`` of shard ``k`` when ``out`` holds it complete and its key still holds: same model and
    decoding mode (``key_head``, checked without reading a file), same member files with the same content
    (hashes from the shard's stat cache, a file read only when its stat changed). ``rels`` / ``refused``: the
    listing's paths and refusals."""
    found = stored_key(out, k)
    if found is None or not found[1].startswith(key_head(model.identity, decode) + "."):
        return None
    lo, hi = shard_bounds(k, shard_size, len(source.files))
    files = source.files[lo:hi]
    stats = source.stats[lo:hi] if source.stats else [None] * len(files)
    cache = shard_stat_cache(out, k)
    hashes = content_hashes(files, stats, cache=cache, seen_ns=source.seen_ns, skip=[bool(r) for r in refused[lo:hi]])
    cache.keep_only(files)
    cache.save()
    key = shard_key(model.identity, rels[lo:hi], hashes, decode=decode, refused=refused[lo:hi])
    return (found[0], key) if key == found[1] else None


def _encode(source: ImageSource, model: _Model, out: Path, todo: Sequence[int], *, shard_size: int,
            batch_size: int, workers: WorkerSpec, decode: str, engine: BatchEngine, progress: bool,
            on_shard: Callable[[int], None] | None) -> tuple[dict[int, pd.DataFrame], dict[int, str]]:
    """Encode the files of shards ``todo`` on ``engine``; write each shard as soon as it is complete, keyed by
    the content its worker read. Returns (rows, keys) of the written shards."""
    rels = source.table["path"].tolist()
    refused = source.refused if any(source.refused) else None
    batches = image_batches(source.files, rels, todo, shard_size=shard_size, batch_size=batch_size, refused=refused)
    assembler = ShardAssembler(source.table, todo, shard_size=shard_size)
    args = (model.encoder if model.encoder is not None else model.spec, model.device, workers, decode)
    written: dict[int, pd.DataFrame] = {}
    keys: dict[int, str] = {}
    total = sum(len(b["i"]) for b in batches)
    n = len(source.files)
    for result in engine.map(ClipEncodeWorker, args, batches, total=total,
                             description=f"extracting {source.source.name}", progress=progress):
        for shard in assembler.add(result):
            lo, hi = shard_bounds(shard.shard, shard_size, n)
            keys[shard.shard] = shard_key(model.identity, rels[lo:hi], shard.hashes, decode=decode,
                                          refused=refused[lo:hi] if refused is not None else None)
            write_shard(out, shard.shard, keys[shard.shard], shard.rows, shard.features)
            written[shard.shard] = shard.rows
            _record_stats(out, shard.shard, source, lo, hi, shard.hashes)
            if on_shard is not None:
                on_shard(shard.shard)
    if assembler.pending:
        raise IsoodError(f"{out}: shard(s) {assembler.pending} did not receive every image; rerun to resume")
    return written, keys


def _run_config(source: ImageSource, model: _Model, engine: BatchEngine, *, embed_dim: int | None,
               shard_size: int, batch_size: int, workers: WorkerSpec, decode: str) -> dict:
    """The manifest config of an extraction. ``decode``: the decoding mode (``isood.features.decoding.DECODE_MODES``).
    ``workers``: the run's ``WorkerSpec``, recorded once (its ``workers`` entry); other engines add their own
    entry (``ray``)."""
    engine_config = engine.as_config() if engine.name != "local" else {}
    config = {"images": os.path.abspath(source.source), "image_root": os.path.abspath(source.root),
              "source_kind": source.kind, "clip": absolute_spec(model.spec),
              "clip_identity": model.identity, "decode": decode, "embed_dim": embed_dim,
              "shard_size": int(shard_size), "batch_size": int(batch_size), "workers": workers.as_config(),
              "device": model.device, "engine": engine.name}
    if source.follow_symlinks:  # recorded only when opted in: the default keeps older manifests' bytes
        config["follow_symlinks"] = True
    if engine_config:
        config[engine.name] = engine_config
    return config


def extract_shards(source: ImageSource, clip: str | ClipEncoder, out: str | os.PathLike, *,
                   shards: Sequence[int] | None = None, batch_size: int = DEFAULT_BATCH_SIZE,
                   decode_processes: int | None = None, shard_size: int = DEFAULT_SHARD_SIZE,
                   device: str | None = None,
                   progress: bool = True, engine: BatchEngine | None = None,
                   on_shard: Callable[[int], None] | None = None, decode: str = REFERENCE_DECODE) -> ShardRun:
    """Make ``shards`` (default: all) of ``source`` complete in ``out``: complete shards (same model, same
    decoding mode, same member files with the same content: ``shards.shard_key``) are kept, the others
    (re)computed on ``engine`` (default: this process). ``decode_processes``: the image decoders of each model
    worker (``isood.core.workers``; None: ``resolve_workers``' default); the features do not depend on it.
    ``decode``: ``isood.features.decoding.REFERENCE_DECODE`` (default), ``FAST_DECODE``
    or ``GPU_DECODE``. ``out`` is a stage's work folder (``manifests.writing``): the caller writes the manifest."""
    check_sizes(batch_size=batch_size, shard_size=shard_size, decode_processes=decode_processes)
    check_decode_mode(decode)
    engine = engine if engine is not None else LocalEngine()
    out = Path(out)
    model = _model(clip, engine, device)
    workers = resolve_workers(decode_processes, engine)
    n = len(source.files)
    n_shards = shard_count(n, shard_size)
    shards = list(range(n_shards)) if shards is None else list(shards)
    out.mkdir(parents=True, exist_ok=True)
    rows: dict[int, pd.DataFrame] = {}
    keys: dict[int, str] = {}
    rels, refused = source.table["path"].tolist(), source.refused or [""] * n
    for k in shards:
        found = _reusable(source, rels, refused, model, out, k, shard_size=shard_size, decode=decode)
        if found is not None:
            rows[k], keys[k] = found
    todo = [k for k in shards if k not in rows]
    written: dict[int, pd.DataFrame] = {}
    if todo:
        for k in todo:  # an old complete-looking shard must not survive beside a new rows file
            (out / SHARD_NAME.format(k)).unlink(missing_ok=True)
        written, new_keys = _encode(source, model, out, todo, shard_size=shard_size, batch_size=batch_size,
                                    workers=workers, decode=decode, engine=engine, progress=progress,
                                    on_shard=on_shard)
        rows.update(written)
        keys.update(new_keys)
    embed_dim = model.encoder.embed_dim if model.encoder is not None else shard_dim(out, shards)
    remove_stale_shards(out, set(shards))
    config = _run_config(source, model, engine, embed_dim=embed_dim, shard_size=shard_size, batch_size=batch_size,
                         workers=workers, decode=decode)
    inputs = [input_record("images", source.source, sha256=source.listing_sha256)]
    return ShardRun(out, shards, n_shards, keys, rows, sorted(written), embed_dim, config, inputs)


def write_features_manifest(out: str | os.PathLike, shard_rows: Mapping[int, pd.DataFrame], config: Mapping,
                            inputs: Sequence[dict], *, argv: list[str] | None = None, card: bool = True) -> Manifest:
    """The ``features`` manifest of complete shards 0..n-1 in ``out`` (``shard_rows``: k -> its rows table):
    ``index``, ``rejected``, every shard registered, and its dataset card. Shared by extraction and ``isood
    merge``, so a merged job array and a single run write the same bytes. ``card=False``: no card, for a
    feature set nested in another manifest (build-splits' ``features-id/``), whose files the outer manifest
    hashes as content: a card quotes its writing time."""
    out = Path(out)
    n_shards = len(shard_rows)
    if sorted(shard_rows) != list(range(n_shards)):
        raise IsoodError(f"{out}: shards {sorted(set(range(n_shards)) - set(shard_rows))} are missing")
    index, rejected = index_tables(shard_rows)
    return (write_with_card if card else write_manifest)(
        out, kind=FEATURES, tables={"index": index, "rejected": rejected}, config=config, inputs=inputs,
        existing_files=shard_files(range(n_shards)), note=f"features of {len(index)} images", argv=argv,
        summary={"images": int(len(index)), "rejected": int(len(rejected)), "embed_dim": config.get("embed_dim"),
                 "shards": n_shards})


def extract_features(images: str | os.PathLike | ImageSource, clip: str | ClipEncoder, out: str | os.PathLike, *,
                     batch_size: int = DEFAULT_BATCH_SIZE, decode_processes: int | None = None,
                     shard_size: int = DEFAULT_SHARD_SIZE, device: str | None = None, progress: bool = True,
                     argv: list[str] | None = None, engine: BatchEngine | None = None,
                     on_shard: Callable[[int], None] | None = None, decode: str = REFERENCE_DECODE,
                     follow_symlinks: bool = False, card: bool = True) -> ExtractResult:
    """Extract L2-normalised CLIP image features of ``images`` (dataset root or file list, or one already listed
    by ``isood.features.listing.list_images``) into the ``features`` manifest ``out``.

    Resumable: complete shards (same model, decoding mode, member files and their content) are kept; others are
    (re)computed. A rerun reads only files whose stat (size, mtime, ctime, inode) changed since they were hashed
    (``isood.core.content``); one touched but with the same bytes is kept. ``decode``: ``reference`` (default: PIL +
    the model's own preprocess), ``fast`` or ``gpu`` (``isood.features.batch_decode.image_decoder``; modes never mix in a
    feature set). ``engine``: where the model runs (default ``LocalEngine()``: this process, ``decode_processes``
    decoding processes;
    ``isood.engines.ray.RayEngine``: Ray actors, each holding one model). Every engine writes the same shards
    and manifest. ``on_shard(k)`` is called after shard k is written (tests use it to interrupt a run).
    ``follow_symlinks``: also read files whose links lead outside the image root (default: rejected,
    ``isood.features.listing``). ``card``: write the dataset card (``write_features_manifest``).
    """
    check_sizes(batch_size=batch_size, shard_size=shard_size, decode_processes=decode_processes)
    source = (images if isinstance(images, ImageSource)
              else list_images(images, follow_symlinks=follow_symlinks))
    with writing(out, FEATURES, inputs=[source.source]) as o:
        run = extract_shards(source, clip, o.work, batch_size=batch_size, decode_processes=decode_processes,
                             shard_size=shard_size,
                             device=device, progress=progress, engine=engine, on_shard=on_shard, decode=decode)
        write_features_manifest(o.work, run.rows, run.config, run.inputs, argv=argv, card=card)
    return run.result(read(o.final, kind=FEATURES))
