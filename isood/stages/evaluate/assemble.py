"""The datasets ``isood evaluate`` scores and what is assembled from their scores.

An ``EvalSet`` is one dataset to score: the ID training set, the ID test set, or a grid manifest's images
(``splits``, ``syn-is``) with the rows of its ``images`` table and its ``cells`` table. A per-subset import
(``isood import isood-lists --na-rule per-subset``: a ``source`` per cells row) is one grid dataset per subset,
``splits/<subset>`` (``grid_parts``): each subset's cells hold that subset's images only and are decided N/A
on that subset's count, as the import's rule says. From the detectors'
scores (``scoring.DetectorScores``) come the per-cell evaluation of every detector on every grid dataset
(``evaluate_sets``), the per-image ``scores`` table and the trained-vs-random ``sanity`` table. With a leak
mask per grid dataset (``isood evaluate --leak-audit``) each grid dataset is evaluated a second time on its
leak-free images (``leak_free_set`` / ``with_leak_free``; dataset ``<name>-leak-free``, ``images`` column
``all`` | ``leak_free``). Every OOD dataset (a grid's or an image list's, ``kind`` ``grid`` | ``list``) also gets
one per-set row per detector, OpenOOD-style, with the means of its ``near`` / ``far`` group (``set_metrics``,
``sets.set_table``). Pure functions over frames and arrays (``check_files`` only stats files).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Mapping, Sequence

import numpy as np
import pandas as pd

from isood.core.defaults import NA_THRESHOLD, OOD_LABEL
from isood.core.errors import BadInputError
from isood.science.grid import cell_names

from isood.science.cells import KEY_COLUMNS, CellEvaluation, evaluate_cells, metric_set
from isood.science.detectors import Detector
from isood.science.levels import ALL_IMAGES, LEAK_FREE, leak_free_name
from isood.classifiers.scoring import TRAIN_NAME, DetectorScores
from isood.science.sets import evaluate_set, set_table

__all__ = ["ID_TRAIN", "ID_TEST", "EvalSet", "grid_rows", "grid_parts", "check_files", "precomputed_rows",
           "evaluate_sets", "scores_table", "sanity_table", "leak_free_cells", "leak_free_set", "with_leak_free",
           "evaluate_with_leaks", "set_metrics", "empty_per_cell", "na_thresholds",
           "na_text"]

ID_TRAIN, ID_TEST = TRAIN_NAME, "id_test"


@dataclass
class EvalSet:
    """One dataset to score. ``files`` (image paths) or ``outputs`` (precomputed, see ``scoring``) feed it;
    ``labels`` are class indices (``OOD_LABEL`` for semantic OOD); ``data_id`` keys the output cache; a grid
    dataset has its manifest's ``images`` rows (aligned with ``files``), ``cells`` table and ``grid`` (the name of
    the set it comes from: ``splits``, ``syn-is``, an ``--ood`` name); ``paths`` are shown in the scores table for
    the others. ``source`` is the OOD set a dataset belongs to (an image list: itself; a per-subset grid: the grid)
    and ``group`` its OpenOOD group ('near', 'far' or ''); ``labelled`` is False for a set without labels
    (``labels`` then hold ``OOD_LABEL`` and no correctness is computed); ``preset`` / ``transform``: its
    preprocessing (``preprocess``); ``na_threshold``: the N/A threshold its grid manifest records
    (``GridView.na_threshold``; None for other sets)."""

    name: str
    labels: np.ndarray
    data_id: str = ""
    files: list[Path] | None = None
    images: pd.DataFrame | None = None
    cells: pd.DataFrame | None = None
    paths: list[str] | None = None
    grid: str | None = None
    source: str = ""
    group: str = ""
    labelled: bool = True
    preset: str = ""
    transform: Callable | None = None
    na_threshold: int | None = None

    @property
    def is_ood(self) -> bool:
        """A grid's dataset or an image list (not the ID training or test set)."""
        return self.is_grid or bool(self.source)

    @property
    def is_grid(self) -> bool:
        return self.images is not None


def grid_rows(images: pd.DataFrame, cells: pd.DataFrame, *, where: str) -> tuple[pd.DataFrame, pd.DataFrame]:
    """The images of a grid manifest that are in a cell (rows with both levels >= 0), and its cells table; a
    one-line error (prefixed by ``where``) for a manifest mixing sources or with no image in any cell."""
    need = {"path", "cov_level", "sem_level"}
    if not need <= set(images.columns):
        raise BadInputError(f"{where}: images table lacks {', '.join(sorted(need - set(images.columns)))}")
    if "source" in images.columns and images["source"].fillna("").astype(str).nunique() > 1:
        raise BadInputError(f"{where} mixes several sources ({', '.join(images['source'].astype(str).unique())}): "
                            "evaluate one source at a time")
    lv = images[["cov_level", "sem_level"]]
    keep = lv.notna().all(axis=1) & (lv["cov_level"].fillna(-1) >= 0) & (lv["sem_level"].fillna(-1) >= 0)
    images = images[keep].reset_index(drop=True)
    if images.empty:
        raise BadInputError(f"{where}: no image has a grid cell: nothing to evaluate")
    return images, cells


def grid_parts(name: str, images: pd.DataFrame, cells: pd.DataFrame, *,
               where: str) -> dict[str, tuple[pd.DataFrame, pd.DataFrame]]:
    """The grid datasets of one grid manifest ``name``: ``{dataset: (images, cells)}`` (``grid_rows`` of each).
    One dataset ``name`` for a manifest with one set of cells; one per source, ``<name>/<source>``, for a manifest
    whose cells table has a ``source`` per row (a per-subset import), each with that source's images and cells
    rows (a source without any image in a cell is left out; none at all is an error)."""
    if "source" not in cells.columns or "source" not in images.columns:
        return {name: grid_rows(images, cells, where=where)}
    img_src = images["source"].fillna("").astype(str)
    cell_src = cells["source"].fillna("").astype(str)
    if cell_src.nunique() <= 1:
        return {name: grid_rows(images, cells, where=where)}
    stray = sorted(set(img_src) - set(cell_src))
    if stray:
        raise BadInputError(f"{where}: images of source(s) {', '.join(stray[:5])} have no cells rows: pass a "
                            "manifest whose cells table lists every source")
    parts = {}
    for src in dict.fromkeys(cell_src):
        sub = images[(img_src == src).to_numpy()]
        lv = sub[["cov_level", "sem_level"]]
        if not ((lv["cov_level"].fillna(-1) >= 0) & (lv["sem_level"].fillna(-1) >= 0)).any():
            continue
        parts[f"{name}/{src}"] = grid_rows(sub, cells[(cell_src == src).to_numpy()].reset_index(drop=True),
                                           where=f"{where} (source {src})")
    if not parts:
        raise BadInputError(f"{where}: no image has a grid cell: nothing to evaluate")
    return parts


def check_files(files: Sequence[Path], what: str, hint: str = "--test-root") -> None:
    """A one-line error when any of ``files`` is missing (``hint``: the option naming their folder)."""
    missing = [f for f in files if not f.is_file()]
    if missing:
        raise BadInputError(f"{what}: {len(missing)} of {len(files)} images are missing (first: {missing[0]}): "
                            f"pass the folder they are relative to ({hint})")


def precomputed_rows(index: pd.DataFrame, paths: Sequence[str], *, where: str) -> np.ndarray:
    """Row of each of ``paths`` in a precomputed-outputs ``index`` (its first row for a duplicated path); a
    one-line error naming the first path without outputs."""
    pos = pd.Series(np.arange(len(index)), index=index["path"].astype(str))
    pos = pos[~pos.index.duplicated()]
    rows = pos.reindex([str(p) for p in paths])
    if rows.isna().any():
        miss = rows.index[rows.isna()]
        raise BadInputError(f"{where}: {len(miss)} manifest images have no precomputed outputs (first: {miss[0]}): "
                            "compute outputs for every image of the manifest")
    return rows.to_numpy(dtype=np.int64)


def empty_per_cell(correctness: bool = False, der: bool = False) -> pd.DataFrame:
    """A per-cell table without rows (an evaluation of image lists only), with every column."""
    return pd.DataFrame(columns=[*KEY_COLUMNS, *metric_set(correctness, der)])


def na_thresholds(sets: Mapping[str, EvalSet], na_threshold: int | None) -> dict[str, dict[str, int | None]]:
    """Per grid dataset, the N/A threshold its manifest records (``manifest``) and the one used (``used``):
    ``na_threshold`` when given (an explicit option overrides every manifest), else the manifest's, else
    ``NA_THRESHOLD``."""
    return {ds: {"manifest": s.na_threshold, "used": _used_threshold(s, na_threshold)}
            for ds, s in sets.items() if s.is_grid}


def _used_threshold(s: EvalSet, na_threshold: int | None) -> int:
    """The N/A threshold a grid dataset is evaluated with: ``na_threshold``, else its manifest's, else 10."""
    if na_threshold is not None:
        return int(na_threshold)
    return int(s.na_threshold) if s.na_threshold is not None else NA_THRESHOLD


def na_text(sets: Mapping[str, EvalSet], na_threshold: int | None) -> str:
    """``na_thresholds`` in words (the report's run details)."""
    per, how = na_thresholds(sets, na_threshold), "--na-threshold" if na_threshold is not None else "the manifest's"
    if not per:
        return "no grid dataset"
    return "; ".join(f"{ds}: {t['used']} images ({how}; manifest: {t['manifest']})" for ds, t in per.items()) \
        + ", counted on the images of each set evaluated"


def evaluate_sets(scores: DetectorScores, sets: Mapping[str, EvalSet],
                  detectors: Sequence[str] | Mapping[str, Detector], *, na_threshold: int | None, der: bool,
                  convention: str = "exact") -> CellEvaluation:
    """Every detector on every grid dataset, per cell (``cells.evaluate_cells``): ID test vs each cell, with the
    correctness metrics when the ID test set has labels and DER when ``der`` and the ID training set was scored
    with labels; Table 1 by ``convention`` (``conventions.table1``). A cell is N/A below ``na_thresholds``'s
    ``used`` value of its dataset (``na_threshold``, else the dataset's manifest's). No grid dataset: no rows."""
    parts = []
    used = {ds: _used_threshold(s, na_threshold) for ds, s in sets.items() if s.is_grid}
    id_correct = scores.correct(ID_TEST) if scores.has_labels(ID_TEST) else None
    train_correct = (scores.correct(ID_TRAIN) if der and id_correct is not None and scores.has_labels(ID_TRAIN)
                     else None)  # DER compares with the ID test set's correctness
    for ds, s in sets.items():
        if not s.is_grid:
            continue
        ood_correct = scores.predictions[ds] == s.labels if id_correct is not None else None
        for det in detectors:
            train = scores.scores[det].get(ID_TRAIN) if train_correct is not None else None
            try:
                parts.append(evaluate_cells(
                    scores.scores[det][ID_TEST], scores.scores[det][ds], s.images, detector=det, dataset=ds,
                    id_correct=id_correct, ood_correct=ood_correct, train_scores=train,
                    train_correct=train_correct if train is not None else None, cells=s.cells,
                    na_threshold=used[ds]))
            except BadInputError as e:  # e.g. non-finite scores of a detector, a cells table of another manifest
                if f"'{det}'" in str(e):
                    raise
                raise type(e)(f"detector '{det}' on {ds}: {e}") from None
    per_cell = pd.concat(parts, ignore_index=True) if parts else empty_per_cell(id_correct is not None,
                                                                              train_correct is not None)
    return CellEvaluation(per_cell, convention=convention)


def leak_free_cells(cells: pd.DataFrame, images: pd.DataFrame) -> pd.DataFrame:
    """The cells table of a grid dataset with ``n`` recounted on ``images`` (its leak-free rows); N/A is decided
    from these counts in ``cells.cell_grid`` (the stored ``na`` is never read), exactly as for a manifest cleaned
    by `isood splits clean`."""
    counts = images.groupby(["cov_level", "sem_level"]).size()
    keys = zip(cells["cov_level"].astype(int), cells["sem_level"].astype(int))
    return cells.assign(n=np.array([int(counts.get(k, 0)) for k in keys], dtype=np.int64))


def leak_free_set(s: EvalSet, leaking: np.ndarray) -> EvalSet:
    """The grid dataset ``s`` without its leaking images (``leaking``: (N,) aligned with ``s.images``)."""
    if s.images is None:
        raise BadInputError(f"{s.name} is not a grid dataset: a leak mask selects a grid's images")
    keep = ~np.asarray(leaking, dtype=bool)
    if keep.shape != (len(s.images),):
        raise BadInputError(f"leak mask of {s.name} has {keep.size} entries for {len(s.images)} images")
    images = s.images.loc[keep].reset_index(drop=True)
    return EvalSet(leak_free_name(s.name), s.labels[keep], data_id=s.data_id,
                   files=[f for f, k in zip(s.files, keep) if k] if s.files is not None else None,
                   images=images, cells=leak_free_cells(s.cells, images) if s.cells is not None else None,
                   grid=s.grid, source=s.source, group=s.group, labelled=s.labelled, preset=s.preset,
                   transform=s.transform, na_threshold=s.na_threshold)


def with_leak_free(scores: DetectorScores, sets: Mapping[str, EvalSet],
                   leaking: Mapping[str, np.ndarray]) -> tuple[DetectorScores, dict[str, EvalSet]]:
    """``scores`` and ``sets`` plus, for every dataset in ``leaking``, its leak-free copy (the same scores,
    rows selected): nothing is scored again."""
    sets = dict(sets)
    out = DetectorScores(scores={d: dict(v) for d, v in scores.scores.items()}, predictions=dict(scores.predictions),
                         labels=dict(scores.labels), train_name=scores.train_name)
    for ds, mask in leaking.items():
        free = leak_free_set(sets[ds], mask)
        keep = ~np.asarray(mask, dtype=bool)
        sets[free.name] = free
        for per_ds in out.scores.values():
            per_ds[free.name] = per_ds[ds][keep]
        out.predictions[free.name] = scores.predictions[ds][keep]
        labels = scores.labels.get(ds)
        out.labels[free.name] = None if labels is None else labels[keep]
    return out, sets


def evaluate_with_leaks(scores: DetectorScores, sets: Mapping[str, EvalSet],
                        detectors: Sequence[str] | Mapping[str, Detector], *, leaking: Mapping[str, np.ndarray] | None,
                        na_threshold: int | None, der: bool, convention: str = "exact") -> CellEvaluation:
    """``evaluate_sets``; with ``leaking`` also every masked grid dataset on its leak-free images, the per-cell
    rows tagged ``images`` = ``all`` | ``leak_free``."""
    if not leaking:
        return evaluate_sets(scores, sets, detectors, na_threshold=na_threshold, der=der, convention=convention)
    both_scores, both_sets = with_leak_free(scores, sets, leaking)
    per_cell = evaluate_sets(both_scores, both_sets, detectors, na_threshold=na_threshold, der=der).per_cell
    free = {leak_free_name(ds) for ds in leaking}
    per_cell.insert(2, "images", np.where(per_cell["dataset"].isin(free), LEAK_FREE, ALL_IMAGES))
    return CellEvaluation(per_cell, convention=convention)


def set_metrics(scores: DetectorScores, sets: Mapping[str, EvalSet],
                detectors: Sequence[str] | Mapping[str, Detector], *, der: bool) -> pd.DataFrame:
    """One row per detector and OOD set (``sets.evaluate_set``: the ID test set vs every image of the set; a
    grid's images that are in a cell, each dataset of a per-subset grid on its own) plus the ``nearood`` /
    ``farood`` means of the groups (``sets.set_table``). Correctness metrics when the ID test set has labels,
    DER when ``der`` and the ID training set was scored with labels."""
    id_correct = scores.correct(ID_TEST) if scores.has_labels(ID_TEST) else None
    train_correct = (scores.correct(ID_TRAIN) if der and id_correct is not None and scores.has_labels(ID_TRAIN)
                     else None)  # DER compares with the ID test set's correctness
    rows = []
    for ds, s in sets.items():
        if not s.is_ood:
            continue
        ood_correct = scores.predictions[ds] == s.labels if id_correct is not None else None
        for det in detectors:
            train = scores.scores[det].get(ID_TRAIN) if train_correct is not None else None
            rows.append(evaluate_set(scores.scores[det][ID_TEST], scores.scores[det][ds], detector=det, dataset=ds,
                                     group=s.group, kind="grid" if s.is_grid else "list", id_correct=id_correct,
                                     ood_correct=ood_correct, train_scores=train,
                                     train_correct=train_correct if train is not None else None))
    return set_table(rows)


def scores_table(scores: DetectorScores, sets: Mapping[str, EvalSet],
                 leaking: Mapping[str, np.ndarray] | None = None) -> pd.DataFrame:
    """One row per scored image of the ID test set and the grid datasets (dataset, path, cell, label,
    prediction, correct), one column per detector; with ``leaking`` also a ``leak`` column (True for the images
    a leak audit flags)."""
    frames = []
    for ds, s in sets.items():
        if ds == ID_TRAIN:
            continue
        if s.images is not None:  # a grid dataset (``is_grid``)
            base = pd.DataFrame({"dataset": ds, "path": s.images["path"].astype(str).to_numpy(),
                                 "cell": cell_names(s.images["cov_level"], s.images["sem_level"])})
        else:
            base = pd.DataFrame({"dataset": ds, "path": s.paths, "cell": ""})
        labels = scores.labels.get(ds)
        base["label"] = labels if labels is not None else OOD_LABEL
        base["prediction"] = scores.predictions[ds]
        base["correct"] = base["label"].to_numpy() == base["prediction"].to_numpy()
        for det, per_ds in scores.scores.items():
            base[det] = per_ds[ds]
        if leaking is not None:
            base["leak"] = np.asarray(leaking[ds], bool) if ds in leaking else False
        frames.append(base)
    return pd.concat(frames, ignore_index=True)


def sanity_table(trained: pd.DataFrame, random: pd.DataFrame) -> pd.DataFrame:
    """Per detector and dataset: mean AUROC and AUROC_M over measured cells, trained vs random-init model."""
    rows = []
    for (det, ds), g in trained.groupby(["detector", "dataset"], sort=False):
        r = random[(random["detector"] == det) & (random["dataset"] == ds)]
        g, r = g[~g["na"]], r[~r["na"]]
        rows.append({
            "detector": det, "dataset": ds,
            "auroc": float(g["auroc"].mean()), "auroc_random": float(r["auroc"].mean()),
            "auroc_m": float(g["auroc_m"].mean()) if "auroc_m" in g else np.nan,
            "auroc_m_random": float(r["auroc_m"].mean()) if "auroc_m" in r else np.nan,
        })
    return pd.DataFrame(rows)
