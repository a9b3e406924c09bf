"""Loading feature sets: an ``isood extract`` manifest, or a folder with ``features.npy`` + ``index.parquet``."""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pandas as pd

from isood.errors import BadInputError, IsoodError
from isood.featurestore.shards import SHARD_NAME
from isood.kinds import FEATURES, FeaturesView
from isood.runtime import one_line
from manifests.store import MANIFEST_FILE, read
from wordnet_tools.wnids import wnid_from_path

__all__ = ["is_feature_dir", "load_features", "clean_index", "gather_rows"]


def is_feature_dir(path: str | os.PathLike) -> bool:
    """True for a ``features`` manifest directory, a folder with features.npy + index.parquet, or such a .npy file."""
    p = Path(path)
    if p.is_file():
        return p.suffix == ".npy"
    if (p / "features.npy").is_file():
        return True
    if (p / MANIFEST_FILE).is_file():
        try:
            return read(p).kind == FEATURES
        except IsoodError:
            return False
    return False


def _load_2d(f: Path) -> np.ndarray:
    try:
        a = np.load(f, allow_pickle=False)
    except Exception as e:
        raise BadInputError(f"{f}: not a readable .npy array ({one_line(e, 120)})") from None
    if a.ndim != 2 or not np.issubdtype(a.dtype, np.number):
        raise BadInputError(f"{f}: features must be a 2-D numeric array (rows x dimension), got shape {a.shape} "
                            f"{a.dtype}")
    return np.asarray(a, dtype=np.float32)


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


def gather_rows(index: pd.DataFrame, arrays: dict[int, np.ndarray], where: Path | str) -> np.ndarray:
    """The feature row of each index entry (shard, row) from the shard arrays, checked: one dimension, one
    index entry per shard row."""
    dims = {a.shape[1] for a in arrays.values()}
    if len(dims) != 1:
        raise BadInputError(f"{where}: shards have different feature dimensions {sorted(dims)}")
    for s, a in arrays.items():
        rows = index.loc[index["shard"] == s, "row"].to_numpy()
        if len(rows) != a.shape[0] or rows.min() < 0 or rows.max() >= a.shape[0]:
            raise BadInputError(f"{where}: index lists {len(rows)} rows for shard {s} but it holds {a.shape[0]}")
    feats = np.empty((len(index), dims.pop()), np.float32)
    sh, rw = index["shard"].to_numpy(), index["row"].to_numpy()
    for s, a in arrays.items():
        sel = sh == s
        feats[sel] = a[rw[sel]]
    return feats


def _load_manifest(p: Path) -> tuple[np.ndarray, pd.DataFrame]:
    view: FeaturesView = read(p, kind=FEATURES)
    index = view.index
    if not len(index):
        return np.empty((0, int(view.embed_dim or 0)), np.float32), clean_index(index, p)
    arrays = {}
    for s in sorted(int(s) for s in index["shard"].unique()):
        f = p / SHARD_NAME.format(s)
        if not f.is_file():
            raise BadInputError(f"{p}: shard {f.name} is missing; rerun `isood extract` into this directory")
        arrays[s] = _load_2d(f)
    return gather_rows(index, arrays, p), clean_index(index, p)


def load_features(path: str | os.PathLike) -> tuple[np.ndarray, pd.DataFrame]:
    """Features (N, D) float32 and their index (path, wnid, ...) from an ``isood extract`` manifest, a folder with
    ``features.npy`` + ``index.parquet``, or a ``features.npy`` path with ``index.parquet`` beside it.

    Validates: 2-D numeric features, one index row per feature row, one dimension across shards.
    """
    p = Path(path)
    if p.is_file() and p.suffix == ".npy":
        npy, idx = p, p.with_name("index.parquet")
    elif p.is_dir() and (p / "features.npy").is_file():
        npy, idx = p / "features.npy", p / "index.parquet"
    elif p.is_dir() and (p / MANIFEST_FILE).is_file():
        return _load_manifest(p)
    else:
        raise BadInputError(f"{p}: not a feature set; pass an `isood extract` output directory or a folder with "
                            "features.npy + index.parquet")
    if not idx.is_file():
        raise BadInputError(f"{npy}: no index.parquet beside it (one row per feature row, with a path column)")
    feats = _load_2d(npy)
    index = pd.read_parquet(idx)
    if len(index) != feats.shape[0]:
        raise BadInputError(f"{npy}: {feats.shape[0]} feature rows but {idx.name} has {len(index)} rows")
    return feats, clean_index(index, npy.parent)
