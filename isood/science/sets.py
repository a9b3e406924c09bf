"""Per-set results, OpenOOD-style: every metric of one detector on the ID test set vs one whole OOD set, and the
group means OpenOOD reports (pure, arrays in, frames out).

OpenOOD v1.5 (``Evaluator.eval_ood``) compares the ID test set with each OOD dataset of a group (``near``,
``far``) and adds one row per group, ``nearood`` / ``farood``: the unweighted mean of each metric over the
group's datasets. ``set_table`` lays rows out the same way (per detector: the near sets, ``nearood``, the far
sets, ``farood``, then the sets in no group), with isood's metric columns (fractions, not percent) and the set's
kind: ``grid`` (every image of a grid dataset that is in a cell, one set), ``list`` (an image list) or ``mean``.
Correctness metrics (AUROC_M, ADR) need the ID test set's labels, DER also the ID training scores, as per cell.
"""

from __future__ import annotations

from typing import Iterable, Mapping

import numpy as np
import pandas as pd

from isood.core.defaults import OOD_GROUPS
from isood.core.errors import BadInputError

from . import metrics as M
from .ood_metrics import check_flags, check_scores
from .cells import der_thresholds, metric_set, metric_values
from .levels import metric_columns

__all__ = ["SET_KEY_COLUMNS", "GROUPS", "GROUP_ROWS", "evaluate_set", "group_means", "set_table"]

SET_KEY_COLUMNS = ("detector", "dataset", "group", "kind", "n", "n_id")
#: The OpenOOD groups an OOD set may belong to, and the name of their mean row.
GROUPS = tuple(OOD_GROUPS)
GROUP_ROWS: Mapping[str, str] = OOD_GROUPS


def evaluate_set(id_scores, ood_scores, *, detector: str = "scores", dataset: str = "ood", group: str = "",
                 kind: str = "list", id_correct=None, ood_correct=None, train_scores=None,
                 train_correct=None) -> dict:
    """One row: ``SET_KEY_COLUMNS`` and every metric of ``ood_scores`` (one OOD set) against ``id_scores`` (the
    ID test set), higher = more ID. ``id_correct`` enables the correctness metrics (``ood_correct`` marks OOD
    images the model classifies right, default none), ``train_scores`` + ``train_correct`` DER (as
    ``cells.evaluate_cells``)."""
    if group and group not in GROUPS:
        raise BadInputError(f"set {dataset}: unknown group {group!r}; pass one of {', '.join(GROUPS)} (or none)")
    id_s = check_scores(id_scores, "id_scores")
    ood_s = check_scores(ood_scores, f"scores of detector '{detector}' on {dataset}")
    id_c = None if id_correct is None else check_flags(id_correct, id_s.size, "id_correct")
    ood_c = None if ood_correct is None else check_flags(ood_correct, ood_s.size, "ood_correct")
    if ood_c is not None and id_c is None:
        raise BadInputError("ood_correct needs id_correct too: pass both (or neither)")
    thresholds = der_thresholds(train_scores, train_correct, id_c)
    names = metric_set(id_c is not None, bool(thresholds))
    row = {"detector": detector, "dataset": dataset, "group": group, "kind": kind, "n": int(ood_s.size),
           "n_id": int(id_s.size)}
    return {**row, **metric_values(M.CellInputs(id_s, ood_s, id_c, ood_c, thresholds), names)}


def group_means(rows: pd.DataFrame) -> pd.DataFrame:
    """Per detector and group (``GROUPS``) with at least one set: the mean of every metric over the group's sets
    (OpenOOD's ``nearood`` / ``farood`` rows; ``n`` = the images of the group's sets)."""
    metrics = metric_columns(rows)
    out = []
    grouped = rows[rows["group"].isin(GROUPS) & (rows["kind"] != "mean")]
    for (det, group), g in grouped.groupby(["detector", "group"], sort=False):
        out.append({"detector": det, "dataset": GROUP_ROWS[group], "group": group, "kind": "mean",
                    "n": int(g["n"].sum()), "n_id": int(g["n_id"].iloc[0]),
                    **{m: float(g[m].mean()) for m in metrics}})
    return pd.DataFrame(out, columns=[*SET_KEY_COLUMNS, *metrics])


def set_table(rows: Iterable[Mapping]) -> pd.DataFrame:
    """The per-set table of ``evaluate_set`` rows: per detector (in the order first seen) the near sets and
    ``nearood``, the far sets and ``farood``, then the sets in no group; columns ``SET_KEY_COLUMNS`` and the
    metrics present."""
    frame = pd.DataFrame(list(rows))
    if frame.empty:
        return pd.DataFrame(columns=list(SET_KEY_COLUMNS))
    metrics = [m for m in M.METRICS if m in frame.columns]
    frame = frame[[*SET_KEY_COLUMNS, *metrics]]
    means = group_means(frame)
    parts = []
    for det in dict.fromkeys(frame["detector"]):
        mine, mean = frame[frame["detector"] == det], means[means["detector"] == det]
        for group in GROUPS:
            parts += [mine[mine["group"] == group], mean[mean["group"] == group]]
        parts.append(mine[~mine["group"].isin(GROUPS)])
    parts = [p for p in parts if len(p)]
    out = pd.concat(parts, ignore_index=True)
    out["n"] = out["n"].astype(np.int64)
    out["n_id"] = out["n_id"].astype(np.int64)
    return out

