"""The pure steps of `isood build-splits` (arrays and frames in, arrays and frames out; no files): clean the
features, filter the test rows, measure the shift, bin it into the grid. Each returns the rows it drops as rows
of the manifest's ``dropped`` table (set, path, wnid, reason)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Iterable, Mapping, Sequence

import numpy as np
import pandas as pd

from isood.core.defaults import N_LEVELS, QUANTILE_CLIP
from isood.core.errors import BadInputError
from isood.features.ann import AnnReport, exact_agreement
from isood.science.grid import assign_levels, axis_edges, cell_names, cell_table, edges_table
from isood.science.laid import LAID
from isood.core.devices import explicit_device
from isood.features.shift import ShiftSearch, ShiftStream, shift_search
from isood.science.shift import prepare_features

__all__ = ["DROPPED_COLUMNS", "Grid", "empty_dropped", "dropped_rows", "rejected_rows", "drop_rows", "clean_features",
           "filter_test_rows", "measure_shift", "shift_stream", "bin_shifts", "ann_summary", "LEVEL_AGREEMENT_TARGET"]

#: Below this held-out level agreement an approximate search is reported in the warnings.
LEVEL_AGREEMENT_TARGET = 0.999

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


def drop_rows(index: pd.DataFrame, dropped: np.ndarray, set_name: str) -> tuple[pd.DataFrame, pd.DataFrame | None]:
    """The index without the rows ``dropped`` marks (non-finite or zero features) and those rows as ``dropped``
    rows (None when there are none)."""
    if not dropped.any():
        return index.reset_index(drop=True), None
    return (index.loc[~dropped].reset_index(drop=True),
            dropped_rows(set_name, index.loc[dropped], "non-finite or zero feature"))


def clean_features(features: np.ndarray, index: pd.DataFrame, set_name: str, *,
                   warn: Warn | None = None) -> tuple[np.ndarray, pd.DataFrame, pd.DataFrame | None]:
    """Drop rows with NaN/inf (or all zero) and L2-normalise the rest (``isood.science.shift.prepare_features``).

    Returns (clean features, their index, ``dropped`` rows or None); each problem is reported to ``warn``.
    """
    x, mask = prepare_features(features, f"--{set_name} features", warn=warn or False)
    index, dropped = drop_rows(index, mask, set_name)
    return (x[~mask] if dropped is not None else x), index, dropped  # nothing dropped: no copy of a large set


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
                  device: str | None = None, ann_recall: float | None = None, seed: int = 0,
                  ann_levels: float | None = None, n_levels: int = N_LEVELS,
                  clip: Sequence[float] = QUANTILE_CLIP) -> ShiftSearch:
    """(D_sem, D_cov, ann reports) of every test row against the ID rows through ``laid`` (``device``
    'auto'/'' = default; ``ann_recall``: approximate search tuned to that recall@1, see ``isood.features.ann``), the
    test rows held in memory."""
    return shift_search(x_test, x_id, laid, backend=backend, device=explicit_device(device), ann_recall=ann_recall,
                        seed=seed, ann_levels=ann_levels, grid_levels=n_levels,
                        grid_clip=(float(clip[0]), float(clip[1])))


def shift_stream(x_id: np.ndarray, laid: LAID, *, n_test: int, backend: str = "auto", device: str | None = None,
                 ann_recall: float | None = None, seed: int = 0, ann_levels: float | None = None,
                 n_levels: int = N_LEVELS, clip: Sequence[float] = QUANTILE_CLIP) -> ShiftStream:
    """The ID side made ready for a test set of ``n_test`` rows streamed chunk by chunk (its LAID halves: the
    ID features can be let go); ``ShiftStream.measure`` gives what :func:`measure_shift` gives for the same
    rows held in memory."""
    return ShiftStream(x_id, laid, n_test=n_test, backend=backend, device=explicit_device(device),
                       ann_recall=ann_recall, seed=seed, ann_levels=ann_levels, grid_levels=n_levels,
                       grid_clip=(float(clip[0]), float(clip[1])))


@dataclass(frozen=True, eq=False)
class Grid:
    """The binned test images: ``images`` (path, wnid, d_sem, d_cov, sem_level, cov_level, cell), ``cells``
    (every cell with its count and N/A flag) and ``edges`` (axis, level, lower, upper)."""

    images: pd.DataFrame
    cells: pd.DataFrame
    edges: pd.DataFrame


def _cell_column(cov: np.ndarray, sem: np.ndarray, n_levels: int) -> np.ndarray:
    """``isood.science.grid.cell_names(cov, sem)`` as an object array, looked up in the table of the n x n names (no
    string built per image: ``cell_names`` of 12M images holds ~5 GB of temporaries)."""
    levels = np.arange(n_levels * n_levels)
    table = np.array(cell_names(levels // n_levels, levels % n_levels), dtype=object)
    inside = (cov >= 0) & (sem >= 0) & (cov < n_levels) & (sem < n_levels)
    out = table[np.where(inside, cov * n_levels + sem, 0)]
    if not inside.all():  # NaN shifts (level -1)
        out[~inside] = cell_names(cov[~inside], sem[~inside])
    return out


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
    images["cell"] = _cell_column(cov_levels.astype(np.int64), sem_levels.astype(np.int64), n_levels)
    cells = cell_table(cov_levels, sem_levels, n_levels, na_threshold)
    return Grid(images, cells, edges_table(sem_edges, cov_edges))


def ann_summary(reports: Mapping[str, AnnReport] | None, edges: pd.DataFrame, *,
                clip: Sequence[float] = QUANTILE_CLIP, seed: int = 0, warn: Warn | None = None) -> dict | None:
    """What a recall-tuned search achieved, for the manifest's summary (``SplitsView.ann``): per axis the chosen
    parameters, recall@1 on the tuning and held-out samples, ``level_agreement``: the estimated share of the
    images whose level equals the level an exact build (exact distances, exact edges) would give them, with its
    ``level_agreement_ci`` (``confidence``), the same at this grid's own ``edges`` (``level_agreement_fixed_edges``:
    the distances' effect alone) and the largest move of an edge (``edge_shift``); ``cell_agreement`` (+ ``_ci``,
    ``_fixed_edges``): both levels (``isood.features.ann.agreement``; ``clip``: the quantiles of the end edges, ``seed``:
    the bootstrap's). ``warn`` hears of a held-out recall significantly (2 standard errors) below the target and
    of a level agreement below :data:`LEVEL_AGREEMENT_TARGET`. With no held-out image (too few images to tune
    on: every image was searched exactly) nothing was checked: ``held_out_check`` False and no interval (the
    ``_ci`` entries are None), never a perfect one."""
    if not reports:
        return None
    first = next(iter(reports.values()))
    if not first.check_queries:
        return {"target_recall": first.target_recall, "target_levels": first.target_levels, "held_out_images": 0,
                "held_out_check": False,
                "cell_agreement_ci": None, "confidence": None,
                "axes": {a: {**r.as_dict(), "recall_heldout": None, "level_agreement_ci": None}
                         for a, r in reports.items()}}
    agree = exact_agreement(reports, {a: axis_edges(edges, a) for a in reports}, clip=clip, seed=seed)
    axes = {}
    for axis, report in reports.items():
        axes[axis] = {**report.as_dict(), "level_agreement": agree.levels[axis],
                      "level_agreement_ci": list(agree.levels_ci[axis]),
                      "level_agreement_fixed_edges": agree.levels_fixed_edges[axis],
                      "edge_shift": agree.edge_shift[axis]}
        n, target = max(report.check_queries, 1), report.target_recall
        low = target is not None and report.recall_check < target - 2 * np.sqrt(target * (1 - target) / n)
        if report.check_queries and low:
            _say(warn, f"approximate search ({axis}): recall@1 {report.recall_check:.4f} on {n} held-out images, "
                       f"below --ann-recall {target:g}")
        if agree.levels[axis] < LEVEL_AGREEMENT_TARGET:
            _say(warn, f"approximate search ({axis}): an estimated {1 - agree.levels[axis]:.2%} of the images "
                       f"(from {n} held-out ones) get another level than an exact build would give them; raise "
                       f"{'--ann-levels' if target is None else '--ann-recall'} or search exactly")
    return {"target_recall": first.target_recall, "target_levels": first.target_levels,
            "held_out_images": int(first.check_queries), "held_out_check": True,
            "cell_agreement": agree.cell, "cell_agreement_ci": list(agree.cell_ci),
            "cell_agreement_fixed_edges": agree.cell_fixed_edges, "confidence": agree.confidence, "axes": axes}


def _say(warn: Warn | None, message: str) -> None:
    if warn is not None:
        warn(message)
