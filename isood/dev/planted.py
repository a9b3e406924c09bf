"""The demo's evaluation: OOD detectors on the planted world, scored per measured cell of its splits manifest.

A linear classifier (multinomial logistic regression, scikit-learn's L-BFGS, copied into a ``torch.nn.Linear``)
is trained on a held-out part of the planted ID features and labels (``isood.science.simulate.PlantedWorld``); the rest
of the ID features is the ID test set. The classifier is wrapped as a features -> fc model (``models.wrap_model(backbone=nn.Identity(),
fc=linear)``), and the detectors run through the same one-pass scoring and per-cell evaluation as
``isood evaluate``. The test images are the rows of the splits manifest (``planted/test/{i:06d}.png`` is row ``i``
of ``world.test_features``); a test image of an ID label keeps its class (covariate shift only), other labels are
semantic OOD.

Ground truth to check against: the planted semantic level is an angle between an OOD label and its ID parent,
so a confidence score such as MSP should separate ID from a cell better as the semantic level grows
(``PlantedEvaluation.planted_auroc``: AUROC per planted level; the manifest's level curves use measured levels).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pandas as pd

import manifests
from isood.core.defaults import NA_THRESHOLD, OOD_LABEL
from isood.core.errors import BadInputError
from isood.kinds import SPLITS, GridView
from isood.core.devices import thread_limit
from isood.science.simulate import PlantedWorld

from isood.science import ood_metrics as M
from isood.stages.evaluate.assemble import ID_TEST, ID_TRAIN, EvalSet, evaluate_sets, scores_table
from isood.science.cells import CellEvaluation
from isood.science.detectors import parse_detectors
from isood.classifiers.models import wrap_model
from isood.classifiers.scoring import DetectorScores, run_detectors
from isood.stages.evaluate.write import write_evaluation

__all__ = ["PLANTED_DETECTORS", "DEMO_PLOT_METRICS", "PlantedEvaluation", "train_linear_classifier", "evaluate_planted",
           "planted_table"]

PLANTED_DETECTORS = ("msp", "maxlogit", "energy", "react", "knn", "mds", "vim")
DEMO_PLOT_METRICS = ("auroc", "fpr95", "autc", "auroc_m", "der95")
"""Metrics drawn by the demo (heatmaps per detector + level curves); every metric is in the tables and CSVs."""
_PATH_RE = re.compile(r"planted/test/(\d+)\.\w+$")


@dataclass
class PlantedEvaluation:
    evaluation: CellEvaluation
    manifest: manifests.Manifest
    accuracy: dict[str, float]
    planted_auroc: pd.DataFrame  # detector x planted semantic level: AUROC of ID test vs the level's test images
    extra: dict = field(default_factory=dict)

    def msp_by_level(self) -> pd.DataFrame:
        """MSP's AUROC per semantic level: measured (mean over the level's measured cells) and planted."""
        measured = self.evaluation.curve("msp", "auroc", "sem", dataset="splits")
        planted = self.planted_auroc.loc["msp"].to_numpy() if "msp" in self.planted_auroc.index else None
        df = pd.DataFrame({"level": np.arange(len(measured)), "measured": measured})
        if planted is not None and len(planted) == len(measured):
            df["planted"] = planted
        return df


def train_linear_classifier(x: np.ndarray, y: np.ndarray, n_classes: int, *, C: float = 1.0, max_iter: int = 300,
                            seed: int = 0):
    """Multinomial logistic regression (``sklearn.linear_model.LogisticRegression``, L-BFGS, L2 strength ``1/C``)
    copied into a ``torch.nn.Linear(D, n_classes)`` (deterministic: L-BFGS is). Classes absent from ``y`` get
    a zero weight row and a very low bias, so the layer has exactly ``n_classes`` outputs."""
    import torch
    from sklearn.linear_model import LogisticRegression
    from torch import nn

    x = np.asarray(x, np.float64)
    y = np.asarray(y, np.int64)
    clf = LogisticRegression(C=C, max_iter=int(max_iter), random_state=seed).fit(x, y)
    w = np.zeros((int(n_classes), x.shape[1]))
    b = np.full(int(n_classes), -1e4)
    w[clf.classes_] = clf.coef_
    b[clf.classes_] = clf.intercept_
    lin = nn.Linear(x.shape[1], int(n_classes))
    with torch.no_grad():
        lin.weight.copy_(torch.as_tensor(w, dtype=torch.float32))
        lin.bias.copy_(torch.as_tensor(b, dtype=torch.float32))
    return lin.eval()


def _test_rows(images: pd.DataFrame, n_test: int) -> np.ndarray:
    rows = np.empty(len(images), np.int64)
    for k, p in enumerate(images["path"].astype(str)):
        m = _PATH_RE.search(p)
        if not m:
            raise BadInputError(f"splits image path {p!r} is not planted/test/NNNNNN.png: pass the demo's splits "
                                "manifest")
        rows[k] = int(m.group(1))
    if rows.size and (rows.min() < 0 or rows.max() >= n_test):
        raise BadInputError(f"splits manifest refers to planted test row {rows.max()} but the world has {n_test}: "
                            "pass the world the manifest was built from (same seed)")
    return rows


def _splits_view(splits_manifest) -> GridView:
    """A splits manifest given as a path, a ``manifests.Manifest`` or already a typed view."""
    if isinstance(splits_manifest, GridView):
        return splits_manifest
    root = splits_manifest.root if isinstance(splits_manifest, manifests.Manifest) else Path(splits_manifest)
    view = manifests.read(root, kind=SPLITS)
    assert isinstance(view, GridView)  # read(kind=SPLITS) returns the kind's registered view, a SplitsView
    return view


def _planted_data(world: PlantedWorld, images: pd.DataFrame, *, seed: int, id_test_fraction: float):
    """The ID train / test split of the planted ID features and the test rows of the manifest's images:
    ``{name: (features, labels, row indices)}`` for id_train, id_test and splits (OOD labels -> OOD_LABEL)."""
    rng = np.random.default_rng(seed)
    n_id = len(world.id_features)
    perm = rng.permutation(n_id)
    n_te = int(round(id_test_fraction * n_id))
    te_idx, tr_idx = np.sort(perm[:n_te]), np.sort(perm[n_te:])
    n_classes = int(world.config.get("n_id_labels", int(world.id_labels.max()) + 1))
    rows = _test_rows(images, len(world.test_features))
    y_ood = np.where(world.test_labels[rows] < n_classes, world.test_labels[rows], OOD_LABEL).astype(np.int64)
    return n_classes, {
        ID_TRAIN: (world.id_features[tr_idx], world.id_labels[tr_idx].astype(np.int64), tr_idx),
        ID_TEST: (world.id_features[te_idx], world.id_labels[te_idx].astype(np.int64), te_idx),
        "splits": (world.test_features[rows], y_ood, rows),
    }


def _planted_scores(data, n_classes: int, dets, *, C: float, seed: int) -> DetectorScores:
    """Train the linear classifier on the ID training part and score every detector on all three sets."""
    import torch
    from torch import nn
    from torch.utils.data import TensorDataset

    x_tr, y_tr, _ = data[ID_TRAIN]
    lin = train_linear_classifier(x_tr, y_tr, n_classes, C=C, seed=seed)
    adapter = wrap_model(backbone=nn.Identity(), fc=lin, name="planted-linear")

    def ds(name):
        x, y, _ = data[name]
        return TensorDataset(torch.as_tensor(np.asarray(x, np.float32)), torch.as_tensor(y))

    with thread_limit(1):
        return run_detectors(adapter, dets, {ID_TEST: ds(ID_TEST), "splits": ds("splits")}, id_train=ds(ID_TRAIN),
                             score_train=True, batch_size=4096)


def _planted_auroc(world: PlantedWorld, scores: DetectorScores, rows: np.ndarray, dets) -> pd.DataFrame:
    """Detector x planted semantic level: AUROC of the ID test set vs the level's test images."""
    sem_planted = world.test_semantic_level[rows]
    return pd.DataFrame(
        {int(lv): {d: M.auroc(scores.scores[d][ID_TEST], scores.scores[d]["splits"][sem_planted == lv]) for d in dets}
         for lv in range(world.n_levels) if np.any(sem_planted == lv)})


def evaluate_planted(world: PlantedWorld, splits_manifest, out, seed: int = 0, *, detectors=PLANTED_DETECTORS,
                     id_test_fraction: float = 0.2, C: float = 1.0, na_threshold: int = NA_THRESHOLD,
                     plot_metrics=DEMO_PLOT_METRICS) -> PlantedEvaluation:
    """Train the linear classifier, score ``detectors`` per measured cell of ``splits_manifest`` (a path, a
    ``manifests.Manifest`` or a ``SplitsView``), write an ``evaluation`` manifest with heatmaps and the report
    into ``out``."""
    m = _splits_view(splits_manifest)
    images, cells = m.images, m.cells
    n_classes, data = _planted_data(world, images, seed=seed, id_test_fraction=id_test_fraction)
    dets = parse_detectors(",".join(detectors))
    scores = _planted_scores(data, n_classes, dets, C=C, seed=seed)
    (_, y_tr, tr_idx), (_, y_te, te_idx), (_, y_ood, rows) = data[ID_TRAIN], data[ID_TEST], data["splits"]
    sets = {
        ID_TRAIN: EvalSet(ID_TRAIN, y_tr, paths=[f"planted/id/{i:06d}.png" for i in tr_idx]),
        ID_TEST: EvalSet(ID_TEST, y_te, paths=[f"planted/id/{i:06d}.png" for i in te_idx]),
        "splits": EvalSet("splits", y_ood, images=images, cells=cells),
    }
    evaluation = evaluate_sets(scores, sets, dets, na_threshold=na_threshold, der=True)
    planted = _planted_auroc(world, scores, rows, dets)
    accuracy = {k: float(np.mean(scores.correct(k))) for k in (ID_TRAIN, ID_TEST)}
    accuracy["splits (ID labels)"] = float(np.mean(scores.correct("splits")[y_ood >= 0]))
    meta = {"model": "planted-linear (nn.Linear on planted features)", "detectors": ", ".join(dets),
            "splits": str(m.root), "ID train / test images": f"{len(tr_idx)} / {len(te_idx)}",
            "classifier": f"logistic regression, C={C}",
            **{f"accuracy on {k}": round(v, 4) for k, v in accuracy.items()}}
    config = {"seed": seed, "detectors": list(dets), "id_test_fraction": id_test_fraction, "C": C,
              "na_threshold": na_threshold, "world": world.config,
              "detector_params": {n: d.resolved_params() for n, d in dets.items()}}
    manifest = write_evaluation(
        evaluation, out, config=config,
        inputs=[manifests.input_record("splits_manifest", m.root, sha256=m.content_sha256)],
        scores=scores_table(scores, sets), metrics=plot_metrics, meta=meta,
        title="isood demo: detectors on the planted world",
        summary={"accuracy": accuracy, "msp_auroc_by_planted_sem_level": planted.loc["msp"].round(4).tolist()
                 if "msp" in planted.index else []},
        argv=["isood", "demo", "--seed", str(seed)])
    return PlantedEvaluation(evaluation, manifest, accuracy, planted)


def planted_table(result: PlantedEvaluation):
    """A compact rich table for the demo: MSP's AUROC per semantic level (measured grid level: mean over the
    level's measured cells; planted level: ID test vs all test images of that planted level)."""
    from rich.table import Table

    df = result.msp_by_level()
    acc = result.accuracy
    t = Table(title=f"Planted world: MSP AUROC per semantic level (linear classifier, ID test accuracy "
                    f"{acc.get('id_test', float('nan')):.3f})")
    t.add_column("semantic level", justify="right")
    t.add_column("measured level (grid)", justify="right")
    if "planted" in df.columns:
        t.add_column("planted level", justify="right")
    for rec in df.itertuples(index=False):
        row = [str(rec.level), f"{rec.measured:.3f}"]
        if "planted" in df.columns:
            row.append(f"{rec.planted:.3f}")
        t.add_row(*row)
    return t

