"""Fit detectors on the ID training outputs and score datasets: from a model (``run_detectors``: one forward
pass per batch serves every post-hoc detector; ReAct, DICE, ASH and RankFeat re-compute the head from the
captured tensors; only ODIN re-runs forward + backward on the input) or from precomputed outputs
(``score_precomputed``).

Both paths share one requirements check (``check_requirements``), one check of the hyper-parameters against
the data's sizes before any pass (``preflight``: the number of ID training images and the feature dimension,
the width of the fc layer), one fitting step
(``fit_detectors``) and one scoring step (``score_dataset``). An unreadable image does not stop a model run at
once: every dataset is read and one ``UnreadableImagesError`` names all of them.
"""

from __future__ import annotations

import hashlib
import os
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterable, Mapping

import numpy as np
import pandas as pd
import torch

from isood.core.devices import DEFAULT_PRECISION
from isood.core.errors import BadInputError
from isood.core.files import atomic_write_bytes

from .capture import extract_outputs
from .image_list import Unreadable, UnreadableImagesError, scan_unreadable
from isood.science.detectors import CAPTURE_KINDS, Detector, ForwardOutputs, parse_detectors
from .adapter import ModelAdapter

__all__ = ["TRAIN_NAME", "DetectorScores", "resolve_detectors", "check_requirements", "preflight", "fit_detectors",
           "score_dataset", "run_detectors", "score_precomputed"]

TRAIN_NAME = "id_train"


@dataclass
class DetectorScores:
    """Scores per detector and dataset, plus what the metrics need from the classifier.

    ``scores[detector][dataset]`` (N,) higher = more ID; ``predictions[dataset]`` argmax of the logits;
    ``labels[dataset]`` the data's labels or None; the ID training set appears under ``train_name`` when it
    was scored (DER needs its scores and correctness). ``paths[dataset]`` (when known: ``isood evaluate`` sets
    them) name each row's image, so that ``to_frame`` keys scores by image path instead of row order.
    """

    scores: dict[str, dict[str, np.ndarray]] = field(default_factory=dict)
    predictions: dict[str, np.ndarray] = field(default_factory=dict)
    labels: dict[str, np.ndarray | None] = field(default_factory=dict)
    train_name: str = TRAIN_NAME
    paths: dict[str, list[str]] = field(default_factory=dict)

    @property
    def datasets(self) -> list[str]:
        """The scored datasets, in the order they were scored."""
        return list(self.predictions)

    def to_frame(self, dataset: str | None = None) -> pd.DataFrame:
        """The scores as one table indexed by ``(dataset, path)``: ``label`` (``<NA>`` for a set without labels),
        ``prediction`` and one column per detector (higher = more ID). ``path`` is the image's path as its set
        lists it (``paths``; the row number as text when unknown). ``dataset``: only that one."""
        names = self.datasets if dataset is None else [dataset]
        unknown = [n for n in names if n not in self.predictions]
        if unknown:
            raise BadInputError(f"no scores for dataset {unknown[0]!r}: have {', '.join(self.datasets)}")
        frames = []
        for ds in names:
            n = len(self.predictions[ds])
            paths = self.paths.get(ds)
            if paths is not None and len(paths) != n:
                raise BadInputError(f"dataset {ds!r} has {len(paths)} paths for {n} scored images")
            labels = self.labels.get(ds)
            frames.append(pd.DataFrame({
                "dataset": ds, "path": [str(p) for p in paths] if paths is not None else [str(i) for i in range(n)],
                "label": pd.array(labels if labels is not None else [pd.NA] * n, dtype="Int64"),
                "prediction": self.predictions[ds],
                **{det: per_ds[ds] for det, per_ds in self.scores.items() if ds in per_ds}}))
        return pd.concat(frames, ignore_index=True).set_index(["dataset", "path"])

    def correct(self, dataset: str) -> np.ndarray:
        """Boolean: prediction == label (raises when the dataset has no labels)."""
        y = self.labels.get(dataset)
        if y is None:
            raise BadInputError(f"dataset '{dataset}' has no labels: correctness (DER, AUROC_M) needs them")
        return self.predictions[dataset] == y

    def has_labels(self, dataset: str) -> bool:
        return self.labels.get(dataset) is not None


def resolve_detectors(detectors) -> dict[str, Detector]:
    """``detectors`` (a ``--detectors`` spec such as ``'msp,knn:k=10'``, a Detector, a sequence of either, or a
    dict name -> Detector) as a dict."""
    if isinstance(detectors, (str, Detector)):
        detectors = [detectors]
    if isinstance(detectors, Mapping):
        out = dict(detectors)
    else:
        out = {}
        for d in detectors:
            out.update(parse_detectors(d) if isinstance(d, str) else {d.name: d})
    if not out:
        raise BadInputError("no detector given: pass names such as 'msp', 'energy'")
    return out


def check_requirements(detectors: Mapping[str, Detector], available: Iterable[str], *, source: str,
                       hint: str) -> None:
    """One-line error naming the first detector that needs a kind ``source`` (a model, precomputed outputs)
    does not provide, and what it provides; ``hint`` says what to do instead."""
    available = frozenset(available)
    for name, d in detectors.items():
        lack = d.missing(available)
        if lack:
            raise BadInputError(f"detector '{name}' needs {', '.join(sorted(lack))}, which {source} does not "
                                f"expose (it provides {', '.join(sorted(available)) or 'nothing'}): "
                                f"{d.requirement_hint(lack) or hint}")


def preflight(detectors: Mapping[str, Detector], *, n_train: int | None, feature_dim: int | None) -> None:
    """Every detector's ``Detector.preflight``: its hyper-parameters against ``n_train`` ID training images and
    ``feature_dim``-dim features (None: unknown), before anything is fitted."""
    for d in detectors.values():
        d.preflight(n_train=n_train, feature_dim=feature_dim)


def _size(data) -> int | None:
    """The number of images of ``data`` (a Dataset, DataLoader, tensor or array), when it tells."""
    if isinstance(data, torch.utils.data.DataLoader):
        data = data.dataset
    try:
        return int(len(data))
    except TypeError:
        return None


def _unreadable_list(found, cache_dir) -> str:
    """Write the paths of the unreadable images (one per line, with the error) beside the output cache, or else
    in a new private file of the temporary folder (``mkstemp``: an unpredictable name, mode 0600); the file's
    path."""
    text = "".join(f"{u.path}\t{u.error}\n" for u in dict.fromkeys(found)).encode()
    if cache_dir is not None:
        path = Path(cache_dir) / f"unreadable-images-{hashlib.sha256(text).hexdigest()[:12]}.txt"
        atomic_write_bytes(path, text)
        return str(path)
    fd, name = tempfile.mkstemp(prefix="isood-unreadable-images-", suffix=".txt")
    with os.fdopen(fd, "wb") as f:
        f.write(text)
    return name


def _check_train_labels(train: ForwardOutputs, source: str) -> None:
    n_classes = train.captured("logits").shape[1]
    y = train.labels
    if y is not None and len(y) != len(train):
        raise BadInputError(f"{len(y)} training labels for {len(train)} training images")
    if y is not None and len(y) and (y.min() < 0 or y.max() >= n_classes):
        raise BadInputError(f"ID training labels span [{y.min()}, {y.max()}] but {source} has {n_classes} "
                            "classes: use the model trained on these classes")


def fit_detectors(detectors: Mapping[str, Detector], train: ForwardOutputs, *, source: str = "the model") -> None:
    """Fit every detector that needs fitting on the ID training outputs (with their labels)."""
    _check_train_labels(train, source)
    for d in detectors.values():
        if d.needs_fit:
            d.fit(train, train.labels)


def score_dataset(result: DetectorScores, name: str, detectors: Mapping[str, Detector], outputs: ForwardOutputs,
                  input_scores: Mapping[str, np.ndarray] | None = None) -> None:
    """Predictions, labels and every detector's scores of one dataset into ``result`` (input detectors such as
    ODIN take theirs from ``input_scores``)."""
    result.predictions[name] = outputs.captured("logits").argmax(axis=1)
    result.labels[name] = outputs.labels
    for det, d in detectors.items():
        if "input" not in d.requires:
            s = d.score(outputs)
        elif input_scores is not None and det in input_scores:
            s = input_scores[det]
        else:
            raise BadInputError(f"detector '{det}' perturbs the input images: its scores come from the forward "
                                "pass (run_detectors); pass them as input_scores")
        result.scores.setdefault(det, {})[name] = np.asarray(s, dtype=np.float64)


def _union(detectors: Iterable[Detector]) -> set[str]:
    return set().union(*(d.requires for d in detectors)) & set(CAPTURE_KINDS)


def run_detectors(adapter: ModelAdapter, detectors, datasets: Mapping[str, object], *, id_train=None,
                  train_labels: np.ndarray | None = None, score_train: bool = False, batch_size: int = 64,
                  device: str | torch.device = "cpu", num_workers: int = 0, progress: bool = False,
                  cache_dir: str | os.PathLike | None = None, data_ids: Mapping[str, str] | None = None,
                  preprocess_id: str = "", precision: str = DEFAULT_PRECISION) -> DetectorScores:
    """Fit ``detectors`` on ``id_train`` and score every dataset of ``datasets`` (name -> data).

    ``detectors``: names, ``Detector`` instances, or a dict name -> instance. One forward pass per batch captures
    the union of what they need (plus logits, for predictions); the ID training set is passed only if a detector
    needs fitting (or ``score_train``). ``train_labels`` override the labels the training data yields (MDS needs
    real labels). ``data_ids`` (dataset name -> identity string; the training set under ``'id_train'``) enable
    the on-disk cache in ``cache_dir``. ``precision``: the forward passes' (``capture.extract_outputs``; fp32 by
    default). Before any pass the detectors' hyper-parameters are checked against the data's sizes
    (``preflight``). An unreadable image fails its dataset's pass; the
    other datasets are still read (without the model) and one ``UnreadableImagesError`` names them all (the
    full list written beside ``cache_dir``, else in the temporary folder).
    """
    dets = resolve_detectors(detectors)
    check_requirements(dets, adapter.provides, source=f"model '{adapter.name}'",
                       hint="drop the detector or use a model that has them")
    post = {n: d for n, d in dets.items() if "input" not in d.requires}
    inputs = {n: d for n, d in dets.items() if "input" in d.requires}
    kinds = _union(post.values()) | {"logits"}
    data_ids = dict(data_ids or {})
    common = dict(batch_size=batch_size, device=device, num_workers=num_workers, progress=progress,
                  cache_dir=cache_dir if data_ids else None, preprocess_id=preprocess_id, precision=precision)
    fit_needed = [d for d in post.values() if d.needs_fit]
    if (fit_needed or score_train) and id_train is None:
        names = ", ".join(d.name for d in fit_needed) or "score_train"
        raise BadInputError(f"{names} need the ID training data: pass id_train=")
    w, _ = adapter.fc_params()
    preflight(dets, n_train=_size(id_train) if id_train is not None else None,
              feature_dim=int(w.shape[1]) if w is not None else None)
    result = DetectorScores()
    unreadable: list[Unreadable] = []

    def extract(data, kinds_, **kw):
        if unreadable:  # the run fails: only read the rest, to name every unreadable image at once
            unreadable.extend(scan_unreadable(data, batch_size=batch_size, num_workers=num_workers,
                                              desc=kw["desc"], progress=progress))
            return None
        try:
            return extract_outputs(adapter, data, kinds_, **kw, **common)
        except UnreadableImagesError as e:
            unreadable.extend(e.images)
            return None

    if fit_needed or score_train:
        train_kinds = (_union(fit_needed) | {"logits"}) | (kinds if score_train else set())
        got = extract(id_train, train_kinds, data_id=data_ids.get(TRAIN_NAME),
                      input_detectors=inputs if score_train else {}, desc="ID train")
        if got is not None:
            tr, tr_inputs = got
            if train_labels is not None:
                tr.labels = np.asarray(train_labels)
            fit_detectors(post, tr, source=f"model '{adapter.name}'")
            if score_train:
                score_dataset(result, TRAIN_NAME, dets, tr, tr_inputs)
    for name, data in datasets.items():
        got = extract(data, kinds, data_id=data_ids.get(name), input_detectors=inputs, desc=name)
        if got is not None and not unreadable:
            score_dataset(result, name, dets, *got)
    if unreadable:
        listed = _unreadable_list(unreadable, cache_dir) if len(unreadable) > UnreadableImagesError.SHOWN else None
        raise UnreadableImagesError(unreadable, list_file=listed)
    return result


def score_precomputed(detectors: Mapping[str, Detector], train: ForwardOutputs,
                      datasets: Mapping[str, ForwardOutputs], *, score_train: bool) -> DetectorScores:
    """``DetectorScores`` from precomputed outputs (no model): fit on ``train``, score every dataset (and the
    training set itself with ``score_train``)."""
    check_requirements(detectors, train.available, source="the precomputed outputs",
                       hint="add them to the outputs folders or pass image folders and --model")
    preflight(detectors, n_train=len(train),
              feature_dim=int(train.features.shape[1]) if train.features is not None else None)
    for name, d in detectors.items():
        if "input" in d.requires:
            raise BadInputError(f"detector '{name}' perturbs the input images, which precomputed outputs do not "
                                "hold: drop it or pass image folders and --model")
    fit_detectors(detectors, train, source="the logits")
    result = DetectorScores()
    for name, outs in {**({TRAIN_NAME: train} if score_train else {}), **datasets}.items():
        score_dataset(result, name, detectors, outs)
    return result
