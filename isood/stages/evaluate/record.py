"""What an ``isood evaluate`` run records beside its results: the manifest's config (``run_config``: the options,
every OOD set and its root, each dataset's transform and N/A threshold), the run details the report shows
(``run_meta``), the provenance of its inputs (``run_inputs``) and, under the release's Table 1 convention, the
release's ``results/<detector>.csv`` files (``release_files``)."""

from __future__ import annotations

import os
from typing import Any, Mapping

import numpy as np

import manifests
from isood.classifiers.preprocess import describe
from isood.classifiers.scoring import DetectorScores
from isood.core.optconfig import recorded
from isood.kinds import AuditView
from isood.science.cells import CellEvaluation
from isood.science.conventions import release_results_files
from isood.science.detectors import Detector

from .assemble import ID_TEST, ID_TRAIN, EvalSet, na_text, na_thresholds
from .inputs import OodInput
from .options import EvaluateOptions

__all__ = ["run_config", "run_meta", "run_inputs", "release_files"]


def run_config(opts: EvaluateOptions, *, test_root: str | None, model_name: str, n_classes: int | None,
               detectors: Mapping[str, Detector], inputs: Mapping[str, OodInput] | None = None,
               sets: Mapping[str, EvalSet] | None = None) -> dict[str, Any]:
    """The manifest's config: the options (without ``progress``), the test root used, the model, the detectors'
    parameters, every OOD set (``ood_sets``: name, absolute manifest path, kind, group and the absolute root its
    image paths are relative to), each dataset's transform (``preprocess``: preset and ``repr``) and each grid
    dataset's N/A threshold, its manifest's and the one used (``na_thresholds``)."""
    config = recorded(opts, skip=("progress",))  # paths and model specs absolute (explicit roots)
    if config.get("cache_dir"):
        config["cache_dir"] = os.path.abspath(config["cache_dir"])
    config.update(test_root=os.path.abspath(test_root) if test_root else None, model_name=model_name,
                  n_classes=int(n_classes) if n_classes else None,
                  detector_params={n: d.resolved_params() for n, d in detectors.items()})
    if opts.id_test_root:
        config["id_test_root"] = os.path.abspath(opts.id_test_root)
    if inputs is not None:
        config["ood_sets"] = [{"name": n, "manifest": os.path.abspath(i.spec.path), "kind": i.kind,
                               "group": i.spec.group, "root": os.path.abspath(i.root) if i.root else None}
                              for n, i in inputs.items()]
    if sets is not None:
        config["na_thresholds"] = na_thresholds(sets, opts.na_threshold)
        config["preprocess"] = describe({n: (s.preset, s.transform) for n, s in sets.items() if s.preset})
    return config


def run_meta(opts: EvaluateOptions, *, model_name: str, detectors: Mapping[str, Detector], n_id_classes: int | None,
             datasets: list[str], scores: DetectorScores,
             leaking: Mapping[str, np.ndarray] | None = None,
             sets: Mapping[str, EvalSet] | None = None) -> dict[str, Any]:
    """The run details shown in the report: model, detectors, OOD sets, classes, N/A threshold, Table 1's
    convention, the preprocessing, accuracies and, with a leak audit, the leaking images per dataset."""
    meta: dict[str, Any] = {"model": model_name, "detectors": ", ".join(
        f"{n} ({', '.join(f'{k}={v!r}' for k, v in sorted(d.resolved_params().items()))})" if d.params() else n
        for n, d in detectors.items())}
    if opts.splits:
        meta["splits"] = opts.splits
    if opts.syn:
        meta["syn-is"] = opts.syn
    for text in opts.ood:
        name, _, path = str(text).partition("=")
        meta[f"OOD set {name}"] = path
    meta.update({"ID classes": n_id_classes, "N/A threshold": na_text(sets or {}, opts.na_threshold),
                 "Table 1 convention": opts.table_convention})
    if sets is not None:
        used = {s.preset for s in sets.values() if s.preset}
        meta["preprocessing"] = ", ".join(f"{n}: {s.preset}" for n, s in sets.items() if s.preset) \
            if len(used) > 1 else next(iter(used), "model")
    for ds in datasets:
        if scores.has_labels(ds):
            meta[f"accuracy on {ds}"] = round(float(np.mean(scores.correct(ds))), 4)
    if not scores.has_labels(ID_TEST):
        meta["ID test labels"] = "none (pass --id-test-labels): OOD metrics only, no accuracy or correctness metrics"
    if leaking:
        meta["leak audit"] = f"{opts.leak_audit} (rules: {opts.leak_rules})"
        for ds, mask in leaking.items():
            meta[f"leaking images in {ds}"] = f"{int(mask.sum())} of {mask.size}"
    return meta


def run_inputs(opts: EvaluateOptions, inputs: Mapping[str, Any], sets: Mapping[str, EvalSet],
               audit: AuditView | None = None) -> list[dict]:
    """Provenance: the OOD sets' manifests (their content hash), the leak audit, the ID sets (the hash of their
    relative paths and content hashes), the ID test labels and the checkpoint."""
    records = []
    for name, inp in inputs.items():
        view = inp.view if isinstance(inp, OodInput) else inp
        records.append(manifests.input_record(f"{name}_manifest", view.root, sha256=view.content_sha256))
    if audit is not None:
        records.append(manifests.input_record("leak_audit", audit.root, sha256=audit.content_sha256))
    for name, src in ((ID_TRAIN, opts.id_train), (ID_TEST, opts.id_test)):
        if src is None:
            continue
        known = sets[name].data_id.split(":", 1)[-1] if name in sets and sets[name].data_id else None
        records.append(manifests.input_record(name, src, sha256=known))
    for name, path in (("id_test_labels", opts.id_test_labels), ("checkpoint", opts.checkpoint)):
        if path:
            records.append(manifests.input_record(name, path))
    return records


def release_files(evaluation: CellEvaluation, sets: Mapping[str, EvalSet]) -> dict[str, str]:
    """``results/<detector>.csv`` in the IS-OOD release's format (``conventions.release_results_files``): the grid
    datasets in the run's order when they are the release's two 8 x 8 grids, else none and one warning line."""
    grids = [n for n, s in sets.items() if s.is_grid]
    return release_results_files(evaluation.per_cell, grids, evaluation.detectors)

