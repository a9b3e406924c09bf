"""Loading feature sets: an ``isood extract`` manifest, or a folder with ``features.npy`` + ``index.parquet``.

:func:`open_features` opens a set without reading its rows: a :class:`FeatureReader` holds the index and reads
a range of rows at a time from the memory-mapped ``.npy`` files (mapped for the read and unmapped after it, so
the pages read do not stay in the process's resident memory). :func:`load_features` reads them all at once.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator, Mapping

import numpy as np
import pandas as pd

from isood.core.errors import BadInputError
from isood.features.featurestore.shards import SHARD_NAME
from isood.kinds import FEATURES, FeaturesView
from isood.core.errors import one_line
from manifests.store import MANIFEST_FILE, read
from wordnet_tools.wnids import wnid_from_path

__all__ = ["is_feature_dir", "load_features", "open_features", "FeatureReader", "READ_ROWS", "clean_index"]

#: Rows per read when a feature set is read block by block (:meth:`FeatureReader.blocks`): 128 MB at 512-d.
READ_ROWS = 65_536


def is_feature_dir(path: str | os.PathLike) -> bool:
    """True for a manifest directory, a folder with features.npy + index.parquet, or such a .npy file. Any manifest
    counts (``load_features`` then refuses one of another kind, or a broken one, in one line naming it): a
    manifest folder holds no images to extract, and reading it as one gave a misleading error."""
    p = Path(path)
    if p.is_file():
        return p.suffix == ".npy"
    return (p / "features.npy").is_file() or (p / MANIFEST_FILE).is_file()


def _map_2d(f: Path) -> np.ndarray:
    """The 2-D numeric array of a .npy file, memory-mapped (read-only; nothing is read but the header)."""
    try:
        a = np.load(f, mmap_mode="r", allow_pickle=False)
    except Exception as e:
        raise BadInputError(f"{f}: not a readable .npy array ({one_line(e, 120)})") from None
    if a.ndim != 2 or not np.issubdtype(a.dtype, np.number):
        raise BadInputError(f"{f}: features must be a 2-D numeric array (rows x dimension), got shape {a.shape} "
                            f"{a.dtype}")
    return a


def clean_index(index: pd.DataFrame, where: Path | str) -> pd.DataFrame:
    """An index with a string ``path`` column and a ``wnid`` column (derived from the paths when absent:
    ``wnid_from_path(path) or ''``)."""
    if "path" not in index.columns:
        raise BadInputError(f"{where}: the index has no 'path' column (columns: {', '.join(map(str, index.columns))})")
    index = index.reset_index(drop=True).copy()
    index["path"] = index["path"].astype(str)
    if "wnid" not in index.columns:
        index["wnid"] = [wnid_from_path(p) or "" for p in index["path"]]
    index["wnid"] = index["wnid"].fillna("").astype(str)
    return index


def _check_shards(index: pd.DataFrame, shapes: Mapping[int, tuple[int, ...]], where: Path | str) -> int:
    """The one feature dimension of the shards (``shapes``: shard -> array shape), checked against the index:
    one dimension, one index entry per shard row."""
    dims = {shape[1] for shape in shapes.values()}
    if len(dims) != 1:
        raise BadInputError(f"{where}: shards have different feature dimensions {sorted(dims)}")
    for s, shape in shapes.items():
        rows = index.loc[index["shard"] == s, "row"].to_numpy()
        if len(rows) != shape[0] or rows.min() < 0 or rows.max() >= shape[0]:
            raise BadInputError(f"{where}: index lists {len(rows)} rows for shard {s} but it holds {shape[0]}")
    return dims.pop()


@dataclass(frozen=True, eq=False)
class FeatureReader:
    """A feature set opened for reading a range of rows at a time: ``index`` (path, wnid, ...; row i of the set
    is index row i), ``dim``, and the ``.npy`` files the rows live in (``files``: shard -> path; with ``shard``
    / ``row`` (per index row: its shard and row in it); without them one file, row i = index row i). An
    in-memory set (:meth:`from_array`) keeps its array instead."""

    index: pd.DataFrame
    dim: int
    files: Mapping[int, Path]
    shard: np.ndarray | None = None
    row: np.ndarray | None = None
    array: np.ndarray | None = None

    @classmethod
    def from_array(cls, features: np.ndarray, index: pd.DataFrame) -> FeatureReader:
        """A reader over features already in memory (tests, callers holding arrays)."""
        x = np.asarray(features)
        return cls(index, int(x.shape[1]), {}, array=x)

    def __len__(self) -> int:
        return len(self.index)

    def read(self, start: int = 0, stop: int | None = None) -> np.ndarray:
        """Rows ``[start, stop)`` as float32 (n, dim), read from the mapped files (which are unmapped after)."""
        stop = len(self) if stop is None else min(int(stop), len(self))
        start = max(0, min(int(start), stop))
        if self.array is not None:
            return np.asarray(self.array[start:stop], dtype=np.float32)
        if self.shard is None:
            mapped = _map_2d(self.files[0])
            out = np.array(mapped[start:stop], dtype=np.float32)
            del mapped
            return out
        assert self.row is not None, "a sharded reader has both shard and row"
        out = np.empty((stop - start, self.dim), np.float32)
        sh, rw = self.shard[start:stop], self.row[start:stop]
        for s in np.unique(sh):
            sel = sh == s
            mapped = _map_2d(self.files[int(s)])
            out[sel] = mapped[rw[sel]]
            del mapped
        return out

    def blocks(self, rows: int | None = None) -> Iterator[tuple[int, np.ndarray]]:
        """``(start, rows [start, start + rows))`` over the whole set, ``rows`` (default :data:`READ_ROWS`) at
        a time."""
        step = max(1, int(rows or READ_ROWS))
        for start in range(0, len(self), step):
            yield start, self.read(start, start + step)


def _open_manifest(p: Path, verify: str | None) -> FeatureReader:
    view = read(p, kind=FEATURES, verify=verify)
    assert isinstance(view, FeaturesView)  # read(kind=FEATURES) returns the kind's registered view
    index = view.index
    if not len(index):
        return FeatureReader(clean_index(index, p), int(view.embed_dim or 0), {}, np.empty(0, np.int64),
                             np.empty(0, np.int64))
    files, shapes = {}, {}
    for s in sorted(int(s) for s in index["shard"].unique()):
        f = p / SHARD_NAME.format(s)
        if not f.is_file():
            raise BadInputError(f"{p}: shard {f.name} is missing; rerun `isood extract` into this directory")
        files[s], shapes[s] = f, _map_2d(f).shape
    dim = _check_shards(index, shapes, p)
    shard, row = index["shard"].to_numpy(np.int64), index["row"].to_numpy(np.int64)
    return FeatureReader(clean_index(index, p), dim, files, shard, row)


def open_features(path: str | os.PathLike, *, verify: str | None = None) -> FeatureReader:
    """Open an ``isood extract`` manifest, a folder with ``features.npy`` + ``index.parquet``, or a
    ``features.npy`` path with ``index.parquet`` beside it, without reading the features (see
    :class:`FeatureReader`). Validates: 2-D numeric features, one index row per feature row, one dimension
    across shards. ``verify`` ('fast' / 'full'): check a manifest's files against their hashes first (what a
    stage does with the feature sets it is given; a plain folder has no hashes to check)."""
    p = Path(path)
    if p.is_file() and p.suffix == ".npy":
        npy, idx = p, p.with_name("index.parquet")
    elif p.is_dir() and (p / "features.npy").is_file():
        npy, idx = p / "features.npy", p / "index.parquet"
    elif p.is_dir() and (p / MANIFEST_FILE).is_file():
        return _open_manifest(p, verify)
    else:
        raise BadInputError(f"{p}: not a feature set; pass an `isood extract` output directory or a folder with "
                            "features.npy + index.parquet")
    if not idx.is_file():
        raise BadInputError(f"{npy}: no index.parquet beside it (one row per feature row, with a path column)")
    shape = _map_2d(npy).shape
    index = pd.read_parquet(idx)
    if len(index) != shape[0]:
        raise BadInputError(f"{npy}: {shape[0]} feature rows but {idx.name} has {len(index)} rows")
    return FeatureReader(clean_index(index, npy.parent), int(shape[1]), {0: npy})


def load_features(path: str | os.PathLike) -> tuple[np.ndarray, pd.DataFrame]:
    """Features (N, D) float32 and their index (path, wnid, ...) of a feature set (see :func:`open_features`),
    all read into memory."""
    reader = open_features(path)
    return reader.read(), reader.index
