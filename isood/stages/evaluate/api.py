"""The Python API of ``isood evaluate``: ``evaluate(...)`` runs the stage's steps in memory (``job.compute``) and
returns an ``Evaluation`` of pandas frames, nothing written (``isood.evaluate``); its keyword options are the
command's ``EvaluateOptions`` fields, checked the same way; detectors may be given as spec strings or as detector
objects (``detector_objects``)."""

from __future__ import annotations

import os
from dataclasses import dataclass, fields
from typing import Any, Mapping

import pandas as pd

from isood.classifiers.adapter import ModelAdapter
from isood.classifiers.scoring import DetectorScores
from isood.core.defaults import DEFAULT_DETECTORS
from isood.core.errors import BadInputError
from isood.science.cells import CellEvaluation
from isood.science.detectors import Detector

from .job import compute
from .options import EvaluateOptions, check_options
from .record import run_config

__all__ = ["Evaluation", "detector_objects", "evaluate"]


@dataclass
class Evaluation:
    """An evaluation kept in memory (``evaluate``): pandas frames, nothing written.

    * ``per_cell``: one row per detector, grid dataset and cell: ``detector, dataset, cell, cov_level, sem_level,
      n, n_id, na`` and one column per metric (``isood.science.metrics.METRICS``: fractions, higher-is-better
      except FPR / AUTC / DER; NaN in N/A cells); empty without a grid;
    * ``per_set``: one row per detector and OOD set (``detector, dataset, group, kind, n, n_id`` + metrics), with
      OpenOOD's ``nearood`` / ``farood`` means (``kind`` 'mean') of the sets given a group;
    * ``table1``: per detector, grid dataset, axis ('sem' | 'cov') and metric: ``correlation``, ``sensitivity``,
      ``first``, ``last``, ``n_levels`` (by ``convention``: 'exact' or 'release');
    * ``levels``: the level curves (``detector, dataset, axis, level, metric, value, n_cells``);
    * ``means``: per detector and grid dataset, each metric's mean over the measured cells;
    * ``scores``: the ``DetectorScores`` (``scores.to_frame()``: per image, keyed by ``(dataset, path)``);
    * ``config``: what was evaluated (the options, every OOD set and its root, each dataset's transform).
    """

    per_cell: pd.DataFrame
    per_set: pd.DataFrame
    table1: pd.DataFrame
    levels: pd.DataFrame
    means: pd.DataFrame
    scores: DetectorScores
    cells: CellEvaluation
    config: dict
    convention: str = "exact"

    def scores_frame(self, dataset: str | None = None) -> pd.DataFrame:
        """Per-image scores indexed by ``(dataset, path)`` (``DetectorScores.to_frame``)."""
        return self.scores.to_frame(dataset)


def _pairs(value, what: str) -> tuple[str, ...]:
    """A mapping ``{name: value}`` (or NAME=VALUE strings) as NAME=VALUE strings."""
    if value is None:
        return ()
    if isinstance(value, Mapping):
        return tuple(f"{k}={os.fspath(v) if isinstance(v, os.PathLike) else v}" for k, v in value.items())
    if isinstance(value, (str, os.PathLike)):
        raise BadInputError(f"{what}: pass a dict {{name: value}} (or a list of 'NAME=VALUE' strings)")
    return tuple(str(v) for v in value)


def detector_objects(detectors) -> tuple[str, dict[str, Detector]]:
    """``detectors`` as ``isood.evaluate`` takes them: a spec string (``'msp,knn:k=10'``), a list of names or
    specs, or a list of detector objects (``isood.detectors.KNN(k=50)``), possibly mixed. Returns the one spec the
    options carry and check (an object written as ``Detector.spec()``) and the objects given, by name."""
    if isinstance(detectors, (str, Detector)):
        detectors = [detectors]
    specs, objects = [], {}
    for d in detectors:
        if isinstance(d, Detector):
            if d.name in objects:
                raise BadInputError(f"detectors: two '{d.name}' detectors; list each detector once")
            objects[d.name] = d
            specs.append(d.spec())
        elif isinstance(d, str):
            specs.append(d)
        else:
            raise BadInputError(f"detectors: {d!r} is neither a detector spec nor a detector object; pass e.g. "
                                "'msp,knn:k=10' or [isood.detectors.MSP(), isood.detectors.KNN(k=10)]")
    return ",".join(specs), objects


def evaluate(model=None, *, id_test, ood=None, roots=None, preprocess=None, detectors=DEFAULT_DETECTORS,
             cache_dir: str | os.PathLike | None = "", progress: bool = False, **options: Any) -> Evaluation:
    """Evaluate detectors on an ID test set and OOD sets in memory: the steps of ``isood evaluate`` without
    writing anything (no manifest, no report; no output cache unless ``cache_dir`` names one). Returns an
    ``Evaluation`` of pandas frames (per cell, per set, Table 1; see its docstring for the layout)::

        import isood
        ev = isood.evaluate("resnet50", id_test="imagenet/val", id_train="imagenet/train",
                            ood={"near:ssb": "imports/ssb", "grid": "splits/"}, roots={"ssb": "/data/ssb"},
                            detectors="msp,energy,knn:k=50")
        ev.per_set, ev.per_cell, ev.table1, ev.scores_frame()

    ``model``: a torch module or ``ModelAdapter`` (your classifier: ``wrap_model``), or a ``--model`` string (timm
    name, ``torchvision/<name>``, ``py:MODULE:FUNCTION``, ``clip:SPEC``). ``ood``: ``{[group:]name: manifest}``
    (a splits, syn-is or image-list manifest; group 'near' / 'far'); ``splits`` / ``syn``: the datasets
    ``splits`` / ``syn-is``. ``roots``: ``{name: folder}`` a set's image root (``--ood-root``). ``detectors``: a
    ``--detectors`` spec such as ``'msp,knn:k=10'`` (every detector's parameter names and defaults:
    ``isood.science.detectors.detector_parameters()``). ``preprocess``: a preset for every dataset or
    ``{name: preset}`` (``isood.classifiers.preprocess.PRESETS``). ``options``: any other option of ``isood evaluate``
    by its ``EvaluateOptions`` field name (``splits``, ``syn``, ``id_train``, ``test_root``, ``id_test_root``,
    ``id_test_labels``, ``classes``, ``table_convention``, ``na_threshold`` (default: each grid manifest's own),
    ``der``, ``batch_size``, ``device``, ``decode_processes``, ``checkpoint``, ``num_classes``, ``verify``, ...), with the
    same defaults and checks; errors are
    the same one-line ``IsoodError``\\s. No output cache unless ``cache_dir`` names one; no progress bars unless
    ``progress``.
    """
    if id_test is None or not isinstance(id_test, (str, os.PathLike)):
        raise BadInputError(f"isood.evaluate: id_test= is required: pass the ID test folder or file list (a path), "
                            f"got {type(id_test).__name__}")
    if not (model is None or isinstance(model, (str, ModelAdapter)) or hasattr(model, "forward")):
        raise BadInputError(f"isood.evaluate: model={model!r} ({type(model).__name__}); pass a --model string, a "
                            "torch module or an isood.evaluation.ModelAdapter")
    adapter, model_name = (None, model) if model is None or isinstance(model, str) else (model, None)
    detectors, objects = detector_objects(detectors)
    presets = (preprocess,) if isinstance(preprocess, str) else _pairs(preprocess, "preprocess")
    known = {f.name for f in fields(EvaluateOptions)} - {"out", "model", "ood", "ood_root", "preprocess", "detectors",
                                                          "id_test", "cache_dir", "progress"}
    unknown = sorted(set(options) - known)
    if unknown:
        raise BadInputError(f"isood.evaluate: unknown option {unknown[0]!r}; pass among {', '.join(sorted(known))}")
    paths = {k: os.fspath(v) if isinstance(v, os.PathLike) else v for k, v in options.items()}
    opts = EvaluateOptions(
        id_test=os.fspath(id_test), model=model_name,
        detectors=detectors if isinstance(detectors, str) else ",".join(detectors),
        cache_dir=os.fspath(cache_dir) if cache_dir is not None else None, progress=progress,
        ood=_pairs(ood, "ood"), ood_root=_pairs(roots, "roots"), preprocess=presets, **paths)
    dets = check_options(opts, need_out=False)
    dets = {name: objects.get(name, d) for name, d in dets.items()}  # objects as given, in the order given
    c = compute(opts, dets, adapter=adapter)
    ev = c.evaluation
    return Evaluation(per_cell=ev.per_cell, per_set=c.per_set, table1=ev.summary, levels=ev.levels, means=ev.means,
                      scores=c.scores, cells=ev, convention=ev.convention,
                      config=run_config(opts, test_root=c.test_root, model_name=c.model_name, n_classes=c.n_model,
                                        detectors=dets, inputs=c.inputs, sets=c.sets))
