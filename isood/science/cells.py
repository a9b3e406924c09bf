"""Per-cell evaluation of OOD scores on a shift grid, the "bring your own scores" API.

A user with one score per image (HIGHER = MORE in-distribution, OpenOOD's convention) evaluates a detector per
grid cell without any model::

    import manifests
    from isood.evaluation import evaluate_scores

    splits = manifests.read("splits/", kind="splits")        # a typed view: .images, .cells, .na_threshold
    result = evaluate_scores(
        {"msp": msp_id, "energy": energy_id},                 # ID test scores (N_id,)
        {"msp": msp_ood, "energy": energy_ood},               # one score per row of splits.images
        splits.images, splits=splits,                         # the grid and its N/A cells come from the manifest
        id_correct=pred_id == y_id,                           # optional: DER / AUROC_M / ADR
    )
    result.per_cell        # one row per (detector, cell): n, na, auroc, fpr95, ... (N/A cells: NaN, na=True)
    result.levels          # per-level curves: mean over the level's non-N/A cells, both axes, every metric
    result.summary         # Table 1 (IS-OOD): Pearson correlation and |slope| of the level curve per axis

Without a manifest, pass ``cells=`` (a cells table: cell, cov_level, sem_level, n, na) or ``na_cells=`` (names of
cells to mark N/A), or neither (the grid is the cells that have images). Each cell is compared against the whole
ID test set. One N/A rule decides every set (``isood.science.grid.is_na``): a cell with fewer than ``na_threshold``
images (default: the manifest's, else 10) among the images evaluated is N/A; so is a cell named in ``na_cells``.
The ``na`` column a manifest stores recorded the threshold of the run that wrote it and is not consulted (an
evaluation at another threshold, or of a subset of the images, recounts). An N/A cell is kept in ``per_cell``
with ``na=True`` and NaN metrics, and never enters a level mean.

The metric columns are the names of ``metrics.METRICS`` (``auroc``, ``fpr95``, ``fpr95_id``, ``aupr_in``,
``aupr_out``, ``autc``, ``aufpr``, ``aufnr``; with ``id_correct`` also ``auroc_m``, ``adr``; with the ID
training scores and flags also ``der95``, ``der99``). Pure functions: no file I/O.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Iterable, Mapping, Protocol, Sequence

import numpy as np
import pandas as pd
import sklearn

from isood.core.defaults import NA_THRESHOLD
from isood.core.errors import BadInputError
from isood.science.grid import cell_name, is_na, parse_cell_name

from . import metrics as M
from .ood_metrics import check_flags, check_scores, der_threshold
from .conventions import check_convention, table1
from .levels import all_level_curves, axis_name, detector_means, metric_columns, one_dataset

__all__ = [
    "EmptyCellError", "GridLike", "CellEvaluation", "KEY_COLUMNS", "parse_cell_name", "image_levels",
    "cell_grid", "evaluate_cells", "evaluate_scores", "metric_set", "metric_values", "der_thresholds",
]

KEY_COLUMNS = ("detector", "dataset", "cell", "cov_level", "sem_level", "n", "n_id", "na")


class EmptyCellError(BadInputError):
    """A cell the grid says is measured (not N/A) got no score at all, or fewer than it lists."""


class GridLike(Protocol):
    """What ``evaluate_scores(splits=...)`` reads from a grid manifest view (``isood.kinds.SplitsView`` /
    ``SynView``): its ``images`` and ``cells`` tables and its N/A threshold."""

    @property
    def images(self) -> pd.DataFrame: ...

    @property
    def cells(self) -> pd.DataFrame: ...

    @property
    def na_threshold(self) -> int: ...


# ---------------------------------------------------------------------------------------------- inputs
def image_levels(images, n: int) -> pd.DataFrame:
    """Per-image (cov_level, sem_level) as an int frame; -1 = the image is in no cell. ``images``: a table with
    ``cov_level`` and ``sem_level`` (or ``cell``) columns, or a sequence of cell names."""
    if isinstance(images, pd.DataFrame):
        if {"cov_level", "sem_level"} <= set(images.columns):
            lv = images[["cov_level", "sem_level"]]
            ok = lv.notna().all(axis=1)
            cov = lv["cov_level"].where(ok, -1).astype(np.int64).to_numpy().copy()
            sem = lv["sem_level"].where(ok, -1).astype(np.int64).to_numpy().copy()
        elif "cell" in images.columns:
            return image_levels(images["cell"].tolist(), n)
        else:
            raise BadInputError("the images table needs columns cov_level and sem_level (or cell): pass the "
                                "manifest's `images` table")
    else:
        parsed = [parse_cell_name(name) for name in images]
        cov = np.array([-1 if p is None else p[0] for p in parsed], np.int64)
        sem = np.array([-1 if p is None else p[1] for p in parsed], np.int64)
    if len(cov) != n:
        raise BadInputError(f"images has {len(cov)} entries but ood_scores has {n}: pass one cell per OOD image")
    bad = (cov < 0) | (sem < 0)
    cov[bad], sem[bad] = -1, -1
    return pd.DataFrame({"cov_level": cov, "sem_level": sem})


def _table_rows(cells: pd.DataFrame, counts: pd.Series, marked: set[str], na_threshold: int) -> list[dict]:
    """Grid rows from a cells table: its cells and listed ``n`` (``expected_n``); N/A from the observed counts
    (``isood.science.grid.is_na``) or ``marked``."""
    if not {"cov_level", "sem_level"} <= set(cells.columns):
        if "cell" not in cells.columns:
            raise BadInputError("the cells table needs columns cov_level, sem_level (or cell) and na: pass the "
                                "manifest's `cells` table")
        lv = image_levels(cells["cell"].tolist(), len(cells))
        cells = cells.assign(cov_level=lv["cov_level"].to_numpy(), sem_level=lv["sem_level"].to_numpy())
    if "source" in cells.columns and cells["source"].fillna("").astype(str).nunique() > 1:
        raise BadInputError("the cells table has several sources: evaluate one source at a time (select its rows "
                            "of `images` and `cells`)")
    rows = []
    for rec in cells.drop_duplicates(["cov_level", "sem_level"]).to_dict("records"):
        c, s = int(rec["cov_level"]), int(rec["sem_level"])
        if c < 0 or s < 0:
            continue
        n_obs = int(counts.get((c, s), 0))
        flag = cell_name(c, s) in marked
        expected = int(rec["n"]) if "n" in rec and pd.notna(rec.get("n")) else np.nan
        rows.append({"cov_level": c, "sem_level": s, "n": n_obs, "na": flag or bool(is_na(n_obs, na_threshold)),
                     "marked_na": flag, "expected_n": expected})
    listed = {(r["cov_level"], r["sem_level"]) for r in rows}
    stray = [cell_name(c, s) for (c, s) in counts.index if (c, s) not in listed]
    if stray:
        raise BadInputError(f"images in cells the cells table does not list: {', '.join(sorted(stray)[:5])}: "
                            "pass the cells table of the same manifest")
    return rows


def cell_grid(levels: pd.DataFrame, *, cells: pd.DataFrame | None = None, na_cells: Iterable[str] | None = None,
              na_threshold: int = NA_THRESHOLD) -> pd.DataFrame:
    """The grid's cells: cell, cov_level, sem_level, n (images observed), na, marked_na, expected_n.

    ``levels``: per-image levels (``image_levels``). With a ``cells`` table its cells form the grid and its ``n``
    is the count each cell must have (its stored ``na`` flags are not read); without one the grid is the cells
    that have images. N/A is the one rule ``isood.science.grid.is_na`` on the observed counts: fewer than
    ``na_threshold`` images; ``na_cells`` (``marked_na``) marks more cells N/A.
    """
    counts = levels[levels["cov_level"] >= 0].groupby(["cov_level", "sem_level"]).size()
    marked = {str(x) for x in (na_cells or ())}
    if cells is not None:
        rows = _table_rows(cells, counts, marked, na_threshold)
    else:
        rows = [{"cov_level": int(c), "sem_level": int(s), "n": int(k),
                 "na": cell_name(c, s) in marked or bool(is_na(int(k), na_threshold)),
                 "marked_na": cell_name(c, s) in marked, "expected_n": np.nan}
                for (c, s), k in counts.items()]
    grid = pd.DataFrame(rows, columns=["cov_level", "sem_level", "n", "na", "marked_na", "expected_n"])
    grid.insert(0, "cell", [cell_name(c, s) for c, s in zip(grid["cov_level"], grid["sem_level"])])
    return grid.sort_values(["cov_level", "sem_level"]).reset_index(drop=True)


def _check_grid(grid: pd.DataFrame, detector: str, dataset: str) -> None:
    """Refuse a cell without scores although the cells table lists images (or with scores missing: fewer than
    it lists), unless the caller marked it N/A (``na_cells``)."""
    for rec in grid.itertuples():
        listed = 0 if np.isnan(rec.expected_n) else int(rec.expected_n)
        if rec.n == 0 and not rec.marked_na and (listed > 0 or not rec.na):
            raise EmptyCellError(f"detector '{detector}', {dataset} cell {rec.cell}: no image has a score "
                                 f"(the grid lists {listed} images): score its images")
        if not np.isnan(rec.expected_n) and rec.n != rec.expected_n and not rec.marked_na:
            raise EmptyCellError(f"detector '{detector}', {dataset} cell {rec.cell}: {rec.n} scores for the "
                                 f"{int(rec.expected_n)} images the manifest lists: score every image of the cell")


def _opt_flags(x, n: int, name: str) -> np.ndarray | None:
    return None if x is None else check_flags(x, n, name)


def metric_set(correctness: bool, der: bool) -> tuple[str, ...]:
    """The metric columns of an evaluation, in the order of the published tables: the scores-only metrics, then
    (with correctness flags) the correctness ones, then (with DER thresholds) DER."""
    return (M.metric_names(M.SCORES) + (M.metric_names(M.CORRECTNESS) if correctness else ())
            + (M.metric_names(M.TRAINING) if der else ()))


def metric_values(inputs: M.CellInputs, names: Sequence[str]) -> dict[str, float]:
    """Every metric of ``names`` on one ID-vs-OOD comparison (a cell, or a whole set: ``sets.evaluate_set``)."""
    return {n: M.METRICS[n].function(inputs) for n in names}


def der_thresholds(train_scores, train_correct, id_correct) -> dict[float, float] | None:
    """DER's thresholds (accept rate -> gamma) from the ID training scores, or None without them."""
    if train_scores is None and train_correct is None:
        return None
    if train_scores is None or train_correct is None or id_correct is None:
        raise BadInputError("DER needs train_scores, train_correct and id_correct together: pass all three")
    return {rate: der_threshold(train_scores, train_correct, rate) for rate in M.DER_RATES.values()}


# ------------------------------------------------------------------------------------------ per cell
def evaluate_cells(id_scores, ood_scores, images, *, detector: str = "scores", dataset: str = "test",
                   id_correct=None, ood_correct=None, train_scores=None, train_correct=None,
                   cells: pd.DataFrame | None = None, na_cells: Iterable[str] | None = None,
                   na_threshold: int = NA_THRESHOLD) -> pd.DataFrame:
    """Every metric of one detector's scores, per grid cell (IS-OOD: the ID test set vs each cell's images).

    ``id_scores`` (N_id,) and ``ood_scores`` (N,) are per-image scores, higher = more ID. ``images`` gives each
    OOD image's cell: the manifest's ``images`` table (rows without levels are in no cell) or cell names.
    ``cells`` / ``na_cells`` / ``na_threshold``: see ``cell_grid``. Correctness (optional; "the classifier got
    this image right"): ``id_correct`` (N_id,) enables the correctness metrics (``ood_correct`` (N,) marks OOD
    images whose label the model gets right, default all wrong); with ``train_scores`` and ``train_correct`` of
    the ID *training* images also the DER metrics.

    Returns one row per grid cell: ``KEY_COLUMNS`` and the metric columns (NaN for N/A cells). A measured cell
    without any score raises ``EmptyCellError``.
    """
    id_s = check_scores(id_scores, "id_scores")
    ood_s = np.asarray(ood_scores, dtype=np.float64).ravel()
    levels = image_levels(images, ood_s.size)
    in_cell = levels["cov_level"].to_numpy() >= 0
    if ood_s.size and not np.all(np.isfinite(ood_s[in_cell])):
        bad = int(np.sum(~np.isfinite(ood_s[in_cell])))
        raise BadInputError(f"ood_scores of detector '{detector}' has {bad} non-finite value(s): fix those images")
    id_c = _opt_flags(id_correct, id_s.size, "id_correct")
    ood_c = _opt_flags(ood_correct, ood_s.size, "ood_correct")
    if ood_c is not None and id_c is None:
        raise BadInputError("ood_correct needs id_correct too: pass both (or neither)")
    thresholds = der_thresholds(train_scores, train_correct, id_c)
    grid = cell_grid(levels, cells=cells, na_cells=na_cells, na_threshold=na_threshold)
    _check_grid(grid, detector, dataset)
    names = metric_set(id_c is not None, bool(thresholds))
    cov_all, sem_all = levels["cov_level"].to_numpy(), levels["sem_level"].to_numpy()
    rows = []
    # inputs were validated above (finite, aligned): skip sklearn's per-call re-validation (~4x faster per cell)
    with sklearn.config_context(assume_finite=True, skip_parameter_validation=True):
        for rec in grid.itertuples():
            row = {"detector": detector, "dataset": dataset, "cell": rec.cell, "cov_level": rec.cov_level,
                   "sem_level": rec.sem_level, "n": rec.n, "n_id": int(id_s.size), "na": bool(rec.na)}
            values = dict.fromkeys(names, np.nan)
            if not rec.na:
                sel = (cov_all == rec.cov_level) & (sem_all == rec.sem_level)
                values = metric_values(M.CellInputs(id_s, ood_s[sel], id_c, None if ood_c is None else ood_c[sel],
                                                    thresholds), names)
            rows.append({**row, **values})
    return pd.DataFrame(rows, columns=list(KEY_COLUMNS) + list(names))


# ------------------------------------------------------------------------------------------ all at once
@dataclass
class CellEvaluation:
    """Per-cell metrics and what is derived from them (``evaluate_scores``; stack several with ``concat``).

    ``summary`` is Table 1 by ``convention``: ``'exact'`` (default, ``levels.summary_table``) or ``'release'``
    (the IS-OOD release's ``analyze_metrics.py`` rule, ``conventions.release_summary``); ``levels`` and ``means``
    are always exact."""

    per_cell: pd.DataFrame
    levels: pd.DataFrame | None = field(default=None)
    summary: pd.DataFrame | None = field(default=None)
    means: pd.DataFrame | None = field(default=None)
    convention: str = "exact"

    def __post_init__(self) -> None:
        check_convention(self.convention)
        if self.levels is None:
            self.levels = all_level_curves(self.per_cell)
        if self.summary is None:
            self.summary = table1(self.per_cell, self.convention)
        if self.means is None:
            self.means = detector_means(self.per_cell)

    @property
    def detectors(self) -> list[str]:
        return list(dict.fromkeys(self.per_cell["detector"]))

    @property
    def datasets(self) -> list[str]:
        return list(dict.fromkeys(self.per_cell["dataset"]))

    @property
    def metrics(self) -> list[str]:
        return metric_columns(self.per_cell)

    def curve(self, detector: str, metric: str = "auroc", axis: str = "sem", dataset: str | None = None) -> np.ndarray:
        """One level curve as an array (level order), e.g. ``result.curve('msp', 'auroc', 'sem')``."""
        ax = axis_name(axis)
        levels = self.levels
        assert levels is not None  # filled by __post_init__
        c = levels[(levels["detector"] == detector) & (levels["metric"] == metric) & (levels["axis"] == ax)]
        c = one_dataset(c, dataset)
        if c.empty:
            raise BadInputError(f"no curve for detector {detector!r}, metric {metric!r}: have "
                                f"{', '.join(self.detectors)}")
        return c.sort_values("level")["value"].to_numpy()

    @staticmethod
    def concat(parts: Iterable["CellEvaluation"]) -> "CellEvaluation":
        parts = list(parts)
        if not parts:
            raise BadInputError("nothing to concatenate: pass at least one CellEvaluation")
        return CellEvaluation(pd.concat([p.per_cell for p in parts], ignore_index=True),
                              convention=parts[0].convention)


def _per_detector(id_scores, ood_scores, train_scores, detector: str):
    """The score arguments of ``evaluate_scores`` as dicts keyed by detector."""
    if isinstance(id_scores, Mapping) != isinstance(ood_scores, Mapping):
        raise BadInputError("pass id_scores and ood_scores both as arrays or both as {detector: array} dicts")
    if not isinstance(id_scores, Mapping):
        id_scores, ood_scores = {detector: id_scores}, {detector: ood_scores}
        if train_scores is not None and not isinstance(train_scores, Mapping):
            train_scores = {detector: train_scores}
    if set(id_scores) != set(ood_scores):
        raise BadInputError(f"id_scores has detectors {sorted(id_scores)} but ood_scores {sorted(ood_scores)}: "
                            "pass the same keys")
    if train_scores is not None and not isinstance(train_scores, Mapping):
        raise BadInputError("with several detectors pass train_scores as {detector: array} too")
    if train_scores is not None and set(id_scores) - set(train_scores):
        missing = sorted(set(id_scores) - set(train_scores))[0]
        raise BadInputError(f"train_scores has no entry for detector '{missing}': pass one per detector")
    return id_scores, ood_scores, train_scores


def evaluate_scores(id_scores, ood_scores, images: pd.DataFrame | Sequence[str] | None = None, *,
                    splits: GridLike | None = None, cells: pd.DataFrame | None = None,
                    na_cells: Iterable[str] | None = None, dataset: str = "test", detector: str = "scores",
                    id_correct=None, ood_correct=None, train_scores=None, train_correct=None,
                    na_threshold: int | None = None) -> CellEvaluation:
    """Evaluate per-image scores per grid cell without any model (see the module docstring for an example).

    ``id_scores`` / ``ood_scores`` (and ``train_scores``) are arrays for one detector (named ``detector``) or
    dicts ``{detector: array}`` with the same keys. The grid: ``splits`` (a grid manifest view: its ``cells``
    table, its N/A threshold and, when ``images`` is None, its ``images``), or ``cells`` (a cells table), and/or
    ``na_cells`` (cell names to mark N/A). ``na_threshold``: default the manifest's, else 10. Correctness flags
    as in ``evaluate_cells``, shared by all detectors. Returns a ``CellEvaluation``.
    """
    if splits is not None and cells is not None:
        raise BadInputError("pass splits= (a grid manifest view) or cells= (a cells table), not both")
    if splits is not None:
        cells = splits.cells
        images = splits.images if images is None else images
        na_threshold = splits.na_threshold if na_threshold is None else na_threshold
    if images is None:
        raise BadInputError("pass images (the manifest's images table or one cell name per OOD image)")
    na_threshold = NA_THRESHOLD if na_threshold is None else int(na_threshold)
    ids, oods, trains = _per_detector(id_scores, ood_scores, train_scores, detector)
    na_cells = list(na_cells or ())
    parts = [evaluate_cells(ids[det], oods[det], images, detector=str(det), dataset=dataset, id_correct=id_correct,
                            ood_correct=ood_correct, train_scores=None if trains is None else trains[det],
                            train_correct=train_correct if trains is not None else None, cells=cells,
                            na_cells=na_cells, na_threshold=na_threshold)
             for det in ids]
    return CellEvaluation(pd.concat(parts, ignore_index=True))
