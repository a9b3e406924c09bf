"""The pure steps of `isood build-splits` (arrays and frames in, arrays and frames out; no files): clean the
features, filter the test rows, measure the shift, bin it into the grid. Each returns the rows it drops as rows
of the manifest's ``dropped`` table (set, path, wnid, reason)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Iterable, Sequence

import numpy as np
import pandas as pd

from isood.defaults import QUANTILE_CLIP
from isood.errors import BadInputError
from isood.grid import assign_levels, cell_names, cell_table, edges_table
from isood.laid import LAID
from isood.shift import prepare_features, shift_distances

__all__ = ["DROPPED_COLUMNS", "Grid", "empty_dropped", "dropped_rows", "rejected_rows", "clean_features",
           "filter_test_rows", "measure_shift", "bin_shifts"]

#: Columns of the ``dropped`` table.
DROPPED_COLUMNS = ("set", "path", "wnid", "reason")
Warn = Callable[[str], None]


def empty_dropped() -> pd.DataFrame:
    """A ``dropped`` table without rows."""
    return pd.DataFrame({c: pd.Series(dtype=str) for c in DROPPED_COLUMNS})


def dropped_rows(set_name: str, index: pd.DataFrame, reason: str | Sequence[str]) -> pd.DataFrame:
    """Rows of the ``dropped`` table for the images of ``index`` (path, wnid) of one set, with ``reason``."""
    return pd.DataFrame({"set": set_name, "path": index["path"].astype(str).to_numpy(),
                         "wnid": index["wnid"].astype(str).to_numpy(), "reason": reason})


def rejected_rows(set_name: str, rejected: pd.DataFrame | None) -> pd.DataFrame | None:
    """Rows of the ``dropped`` table for the unreadable images an extraction rejected (path, wnid, error)."""
    if rejected is None or not len(rejected):
        return None
    return dropped_rows(set_name, rejected, ("unreadable: " + rejected["error"].astype(str)).to_numpy())


def clean_features(features: np.ndarray, index: pd.DataFrame, set_name: str, *,
                   warn: Warn | None = None) -> tuple[np.ndarray, pd.DataFrame, pd.DataFrame | None]:
    """Drop rows with NaN/inf (or all zero) and L2-normalise the rest (``isood.shift.prepare_features``).

    Returns (clean features, their index, ``dropped`` rows or None); each problem is reported to ``warn``.
    """
    x, mask = prepare_features(features, f"--{set_name} features", warn=warn or False)
    dropped = dropped_rows(set_name, index.loc[mask], "non-finite or zero feature") if mask.any() else None
    return x[~mask], index.loc[~mask].reset_index(drop=True), dropped


def filter_test_rows(index: pd.DataFrame, *, kept_wnids: Iterable[str] | None = None,
                     id_wnids: Iterable[str] | None = None) -> tuple[np.ndarray, pd.DataFrame | None]:
    """Which test images to keep: those whose wnid the class filter keeps (``kept_wnids``; None = no filter)
    and, with ``id_wnids``, that are not of an ID class. Returns (keep mask, ``dropped`` rows or None)."""
    keep = np.ones(len(index), dtype=bool)
    parts = []
    if kept_wnids is not None:
        out = ~index["wnid"].isin(set(kept_wnids)).to_numpy()
        if out.any():
            parts.append(dropped_rows("test", index.loc[out], "class filter: not kept"))
        keep &= ~out
    if id_wnids is not None:
        is_id = keep & index["wnid"].isin(set(id_wnids) - {""}).to_numpy()
        if is_id.any():
            parts.append(dropped_rows("test", index.loc[is_id], "ID class"))
        keep &= ~is_id
    return keep, (pd.concat(parts, ignore_index=True) if parts else None)


def measure_shift(x_test: np.ndarray, x_id: np.ndarray, laid: LAID, *, backend: str = "auto",
                  device: str | None = None) -> tuple[np.ndarray, np.ndarray]:
    """(D_sem, D_cov) of every test row against the ID rows through ``laid`` (``device`` 'auto'/'' = default)."""
    device = None if device in (None, "", "auto") else device
    return shift_distances(x_test, x_id, laid, backend=backend, device=device)


@dataclass(frozen=True, eq=False)
class Grid:
    """The binned test images: ``images`` (path, wnid, d_sem, d_cov, sem_level, cov_level, cell), ``cells``
    (every cell with its count and N/A flag) and ``edges`` (axis, level, lower, upper)."""

    images: pd.DataFrame
    cells: pd.DataFrame
    edges: pd.DataFrame


def bin_shifts(index: pd.DataFrame, d_sem: np.ndarray, d_cov: np.ndarray, *, n_levels: int,
               na_threshold: int, clip: Sequence[float] = QUANTILE_CLIP) -> Grid:
    """Bin each axis into ``n_levels`` equal-width levels over its clipped range and count the cells."""
    if not (len(index) == len(d_sem) == len(d_cov)):
        raise BadInputError(f"bin_shifts: {len(index)} images but {len(d_sem)}/{len(d_cov)} shift values")
    sem_levels, sem_edges = assign_levels(d_sem, n_levels, clip=clip)
    cov_levels, cov_edges = assign_levels(d_cov, n_levels, clip=clip)
    images = pd.DataFrame({
        "path": index["path"].astype(str), "wnid": index["wnid"].astype(str),
        "d_sem": np.asarray(d_sem).astype(np.float32), "d_cov": np.asarray(d_cov).astype(np.float32),
        "sem_level": sem_levels.astype(np.int64), "cov_level": cov_levels.astype(np.int64),
    })
    images["cell"] = cell_names(images["cov_level"], images["sem_level"])
    cells = cell_table(cov_levels, sem_levels, n_levels, na_threshold)
    return Grid(images, cells, edges_table(sem_edges, cov_edges))
