"""Feature shards: names, keys, complete-shard detection, atomic writes, and the pure steps around them (work
batches of a shard, assembling out-of-order batch results into shards, the index tables of a feature set).

Shard k holds files ``[k * shard_size, (k + 1) * shard_size)`` of the sorted file list. Its ``.rows.parquet``
(path, wnid, row (-1 when rejected), error; the shard key in the Parquet metadata) is written before its
``.npy``, so a shard exists only when complete; the key (``shard_key``: model identity + decoding mode + member
files by path and *content* hash) tells a rerun whether the shard is still valid: a file overwritten in place,
even with one of the same size, makes its shard stale. The content hashes of a written shard come from the
bytes its worker decoded; a rerun takes them from the shard's stat cache ``.~features-NNNNN.stats.parquet``
(``isood.core.content.StatCache``: run-time bookkeeping, never hashed) and reads only files whose stat changed.
"""

from __future__ import annotations

import hashlib
import io
import os
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable, Mapping, Sequence

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq

from isood.core.content import StatCache
from isood.core.errors import IsoodError
from isood.features.decoding import REFERENCE_DECODE, check_decode_mode
from isood.core.files import TMP_PREFIX, atomic_write_bytes, remove_temporaries
from manifests.store import parquet_bytes

__all__ = [
    "SHARD_NAME", "SHARD_ROWS_NAME", "SHARD_STATS_NAME", "shard_count", "shard_bounds", "key_head", "shard_key",
    "shard_files", "read_shard_rows", "stored_key", "complete_shard", "write_shard", "shard_stat_cache",
    "remove_stale_shards", "shard_dim", "image_batches", "CompletedShard", "ShardAssembler", "index_tables",
]

SHARD_NAME = "features-{:05d}.npy"
SHARD_ROWS_NAME = "features-{:05d}.rows.parquet"
#: The stat cache of a shard's member files (bookkeeping: machine-dependent, ignored by ``isood verify``).
SHARD_STATS_NAME = TMP_PREFIX + "features-{:05d}.stats.parquet"
_SHARD_RE = re.compile(r"^(?:\.~)?features-(\d{5})(\.npy|\.rows\.parquet|\.stats\.parquet)$")
_KEY_FIELD = b"isood_shard_key"
#: Version of the shard key: 2 keys member files by content (1, by path and size, is recomputed once).
_KEY_VERSION = "isood.shard-key/2"


# ------------------------------------------------------------------------------------------------ pure
def shard_count(n_images: int, shard_size: int) -> int:
    """Shards of ``n_images`` files at ``shard_size`` files per shard."""
    return (int(n_images) + int(shard_size) - 1) // int(shard_size)


def shard_bounds(k: int, shard_size: int, n_images: int) -> tuple[int, int]:
    """Files ``[lo, hi)`` of shard ``k``."""
    return k * shard_size, min(int(n_images), (k + 1) * shard_size)


def key_head(identity: str, decode: str = REFERENCE_DECODE) -> str:
    """The part of every shard key a run shares: the key version, the model identity and the decoding mode
    (``isood.features.decoding.DECODE_MODES``); a stored key with another head is stale without reading any file."""
    tag = f"{_KEY_VERSION}\0{identity}\0decode={check_decode_mode(decode)}"
    return hashlib.sha256(tag.encode()).hexdigest()[:16]


def shard_key(identity: str, paths: Sequence[str], hashes: Sequence[str], *, decode: str = REFERENCE_DECODE,
              refused: Sequence[str] | None = None) -> str:
    """The key of a shard: ``<key_head>.<hash of its member files>``, each file by its path, the SHA-256 of its
    content ('' when it was not read: missing, unreadable, or refused by the listing) and whether the listing
    refused it (``refused`` aligned with ``paths``, '' when read). Deterministic and machine independent:
    relative paths and content only, no stat."""
    h = hashlib.sha256()
    marks = refused if refused is not None else [""] * len(paths)
    for r, sha, why in zip(paths, hashes, marks):
        h.update(f"{r}\t{sha}{chr(9) + 'refused' if why else ''}\n".encode("utf-8", "surrogateescape"))
    return f"{key_head(identity, decode)}.{h.hexdigest()}"


def shard_files(shards: Iterable[int]) -> list[str]:
    """The files of the given shards (every ``.npy``, then every ``.rows.parquet``)."""
    shards = list(shards)
    return [SHARD_NAME.format(k) for k in shards] + [SHARD_ROWS_NAME.format(k) for k in shards]


def image_batches(files: Sequence[str | os.PathLike], names: Sequence[str], shards: Iterable[int], *,
                  shard_size: int, batch_size: int, refused: Sequence[str] | None = None) -> list[dict[str, Any]]:
    """The work batches of the given shards, for an engine: ``{'i': file ids, 'path': files, 'name': relative
    paths}``, plus ``'refused'`` (why each file is not read, '' when it is) when ``refused`` is given; a batch
    never straddles two shards (each shard starts a new batch), so every engine and every job-array split
    encodes the same batches."""
    n = len(files)
    out = []
    for k in shards:
        lo, hi = shard_bounds(k, shard_size, n)
        for s in range(lo, hi, max(1, int(batch_size))):
            e = min(hi, s + int(batch_size))
            batch = {"i": np.arange(s, e, dtype=np.int64), "path": [str(files[j]) for j in range(s, e)],
                     "name": [str(names[j]) for j in range(s, e)]}
            if refused is not None:
                batch["refused"] = [str(refused[j]) for j in range(s, e)]
            out.append(batch)
    return out


@dataclass
class CompletedShard:
    """A shard whose every file has come back: ``rows`` (path, wnid, row, error) in file order, the
    ``features`` (n_ok, D) of its readable files, in file order, and the ``hashes`` of its files' content (file
    order; '' where a file was not read)."""

    shard: int
    rows: pd.DataFrame
    features: np.ndarray
    hashes: list[str] = field(default_factory=list)


class ShardAssembler:
    """Collects batch results ``{'i', 'feature' (n, D), 'ok', 'error'}`` (and ``'sha256'``: the content hash of
    each file, '' when not read) arriving in any order (a Ray engine
    returns them as they complete) and hands back each shard as soon as every one of its files is in.

    ``table``: the (path, wnid) rows of all files; ``shards``: the shards expected.
    """

    def __init__(self, table: pd.DataFrame, shards: Iterable[int], *, shard_size: int):
        self.paths = table["path"].astype(str).tolist()
        self.wnids = table["wnid"].astype(str).tolist()
        self.shard_size = int(shard_size)
        self._parts: dict[int, list[tuple[np.ndarray, ...]]] = {}
        self._left: dict[int, int] = {}
        for k in shards:
            lo, hi = shard_bounds(k, self.shard_size, len(self.paths))
            self._parts[k], self._left[k] = [], hi - lo

    @property
    def pending(self) -> list[int]:
        """Shards still missing some files."""
        return sorted(self._parts)

    def add(self, result: Mapping[str, Any]) -> list[CompletedShard]:
        """Take one batch result; return the shards it completed."""
        ids = np.asarray(result["i"], dtype=np.int64)
        feats = np.asarray(result["feature"], dtype=np.float32).reshape(len(ids), -1)
        ok = np.asarray(result["ok"], dtype=bool)
        errors = np.array([str(e) for e in result["error"]], dtype=object)
        hashes = np.array([str(h) for h in result.get("sha256", [""] * len(ids))], dtype=object)
        done = []
        shard_of = ids // self.shard_size
        for k in dict.fromkeys(shard_of.tolist()):
            if k not in self._parts:
                raise IsoodError(f"a worker returned images of shard {k}, which was not requested; rerun to resume")
            sel = shard_of == k
            self._parts[k].append((ids[sel], feats[sel], ok[sel], errors[sel], hashes[sel]))
            self._left[k] -= int(sel.sum())
            if self._left[k] <= 0:
                done.append(self._finish(k))
        return done

    def _finish(self, k: int) -> CompletedShard:
        parts = self._parts.pop(k)
        del self._left[k]
        ids = np.concatenate([p[0] for p in parts])
        order = np.argsort(ids, kind="stable")
        lo, hi = shard_bounds(k, self.shard_size, len(self.paths))
        if not np.array_equal(ids[order], np.arange(lo, hi)):
            raise IsoodError(f"shard {k} came back with duplicate or foreign images; rerun to resume")
        feats = np.concatenate([p[1] for p in parts])[order]
        ok = np.concatenate([p[2] for p in parts])[order]
        errors = np.concatenate([p[3] for p in parts])[order]
        hashes = np.concatenate([p[4] for p in parts])[order]
        rows = pd.DataFrame({
            "path": self.paths[lo:hi],
            "wnid": self.wnids[lo:hi],
            "row": np.where(ok, np.cumsum(ok) - 1, -1).astype(np.int64),
            "error": [("" if good else str(e)) for good, e in zip(ok, errors)],
        })
        return CompletedShard(k, rows, np.ascontiguousarray(feats[ok], dtype=np.float32),
                              [str(h) for h in hashes])


def index_tables(shard_rows: Mapping[int, pd.DataFrame]) -> tuple[pd.DataFrame, pd.DataFrame]:
    """The ``index`` (path, wnid, shard, row) and ``rejected`` (path, wnid, error) tables of shards 0..n-1."""
    index_parts, rejected_parts = [], []
    for k in range(len(shard_rows)):
        rows = shard_rows[k]
        good = rows[rows["row"] >= 0]
        index_parts.append(pd.DataFrame({"path": good["path"], "wnid": good["wnid"], "shard": np.int32(k),
                                         "row": good["row"].astype(np.int64)}))
        rejected_parts.append(rows.loc[rows["row"] < 0, ["path", "wnid", "error"]])
    if not index_parts:
        return (pd.DataFrame({"path": [], "wnid": [], "shard": np.array([], np.int32), "row": np.array([], np.int64)}),
                pd.DataFrame({"path": [], "wnid": [], "error": []}))
    index = pd.concat(index_parts, ignore_index=True)
    index["shard"] = index["shard"].astype(np.int32)
    return index, pd.concat(rejected_parts, ignore_index=True)


# ------------------------------------------------------------------------------------------------ files
def _npy_bytes(x: np.ndarray) -> bytes:
    buf = io.BytesIO()
    np.save(buf, np.ascontiguousarray(x, dtype=np.float32))
    return buf.getvalue()


def read_shard_rows(path: str | os.PathLike) -> tuple[pd.DataFrame, str]:
    """A shard's rows table and the key stored with it."""
    t = pq.read_table(path)
    return t.to_pandas(), (t.schema.metadata or {}).get(_KEY_FIELD, b"").decode()


def stored_key(out: Path, k: int) -> tuple[pd.DataFrame, str] | None:
    """``(rows, key)`` of shard ``k`` in ``out`` when both its files are there and agree (as many features as
    readable rows), else None (absent, interrupted or unreadable: recomputed)."""
    npy, rows_path = out / SHARD_NAME.format(k), out / SHARD_ROWS_NAME.format(k)
    if not (npy.is_file() and rows_path.is_file()):
        return None
    try:
        rows, stored = read_shard_rows(rows_path)
        n = np.load(npy, mmap_mode="r").shape[0]
    except Exception:  # unreadable: not complete, recomputed
        return None
    if n != int((rows["row"] >= 0).sum()):
        return None
    return rows, stored


def complete_shard(out: Path, k: int, key: str) -> pd.DataFrame | None:
    """The rows of shard ``k`` in ``out`` if it is complete for ``key``, else None."""
    found = stored_key(out, k)
    return found[0] if found is not None and found[1] == key else None


def write_shard(out: Path, k: int, key: str, rows: pd.DataFrame, feats: np.ndarray) -> None:
    """Write shard ``k`` atomically: its rows (with the key) first, its features last (the shard now exists)."""
    table = pa.Table.from_pandas(rows, preserve_index=False)
    table = table.replace_schema_metadata({**(table.schema.metadata or {}), _KEY_FIELD: key.encode()})
    atomic_write_bytes(out / SHARD_ROWS_NAME.format(k), parquet_bytes(table))
    atomic_write_bytes(out / SHARD_NAME.format(k), _npy_bytes(feats))


def shard_stat_cache(out: Path, k: int) -> StatCache:
    """The stat cache of shard ``k``'s member files (``SHARD_STATS_NAME``; empty when there is none)."""
    return StatCache(out / SHARD_STATS_NAME.format(k))


def remove_stale_shards(out: Path, keep: set[int]) -> None:
    """Remove shard files (and their stat caches) not in ``keep`` (beyond the shard count, or another part's)
    and the temporaries a killed write left."""
    for p in out.iterdir():
        m = _SHARD_RE.match(p.name)
        if m and int(m.group(1)) not in keep:
            p.unlink()
    remove_temporaries(out)


def shard_dim(out: Path, shards: Iterable[int]) -> int | None:
    """The feature dimension of the first of ``shards`` in ``out`` (None when there is none)."""
    for k in shards:
        return int(np.load(out / SHARD_NAME.format(k), mmap_mode="r").shape[1])
    return None
