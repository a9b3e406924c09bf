"""The ``isood evaluate`` stage: a classifier + OOD detectors scored on an ID test set and any number of OOD
sets (per shift cell of every grid, per set OpenOOD-style), as small named steps; ``api.evaluate`` runs the same
steps in memory and returns pandas frames (the Python API, ``isood.evaluate``). This module runs the steps and
writes the result; each step lives in the module named beside it.

0. ``options.check_options``: every option checked before anything is read or loaded (one line each).
1. ``inputs.load_ood_inputs``: read and verify every OOD set's manifest through ``manifests.read(path, kind=...)``:
   ``--splits`` (kind ``splits``, dataset ``splits``), ``--syn`` (kind ``syn-is``, dataset ``syn-is``) and every
   ``--ood [GROUP:]NAME=MANIFEST`` (a ``splits`` grid: a build or an import of the release's or any cell lists; a
   ``syn-is`` grid; an ``image-list``: ``import imagenet-ood`` / ``openood-imglist``); a manifest of another kind
   (an unknown set kind) or failing verification is refused, naming it. Each set's images are relative to its
   root: ``--ood-root NAME=DIR``, else ``--test-root`` (``--splits``), a splits manifest's ``test_root``, a
   Syn-IS manifest's own folder; an image list records none (``--ood-root`` is required).
2. Data (``datasets.image_sets`` / ``datasets.precomputed_sets``). ``--id-train`` (optional: without it nothing
   is fitted and DER is not computed) / ``--id-test`` are image folders with one wnid sub-folder per class, or
   file lists (``isood.features.listing.list_images``; ``--id-test-root``: the folder the list's entries are
   relative to, e.g. the release's flat ``test_imagenet.txt``), or precomputed-outputs folders (``outputs``; then ``--test-root`` too,
   and ``--splits`` is the only OOD set). ID test labels: the wnids of its paths, else ``--id-test-labels``
   (``classes.label_file``), else none (OOD metrics only; no accuracy, no correctness metrics). A per-subset
   import is one dataset per subset (``<name>/<subset>``, ``assemble.grid_parts``). The model's class list and
   the labels: ``classes``. Each dataset's transform: ``--preprocess`` (``preprocess``). The model
   (``--model``; ``clip:SPEC`` a CLIP zero-shot classifier, ``clip_zero_shot``; ``model.build_model``) is checked
   on one ID image before any pass (``model.check_model_outputs``, ``ModelAdapter.check_outputs``).
3. ``model.score_with_model``: one forward pass per batch (``scoring.run_detectors``; outputs cached on disk under
   ``--cache-dir``, default ``$ISOOD_CACHE_DIR/outputs`` ('' for none), keyed by the images' content
   (``data_identity``), their transform, the decoding mode ``--decode`` and the precision ``--precision``:
   ``capture.ImageList``, ``capture.extract_outputs``), detectors fitted on ``--id-train`` (which is also scored:
   DER's threshold); their parameters checked against the data's sizes first (``scoring.preflight``). Every
   unreadable image of the run is named in one error.
4. ``assemble.evaluate_sets``: every metric per cell of every grid, level curves, Table 1 by
   ``--table-convention`` (``exact``, or ``release``: the IS-OOD release's ``analyze_metrics.py`` rule,
   ``conventions``), per-detector means; ``assemble.set_metrics``: one row per detector and OOD set with the
   ``nearood`` / ``farood`` means of OpenOOD's groups. N/A is one rule, ``isood.science.grid.is_na``, on the images the
   evaluation has in the cell (a manifest's stored ``na`` flags are not read), with each grid manifest's own
   threshold (``GridView.na_threshold``) unless ``--na-threshold`` overrides it; the config and the report record
   both per grid dataset (``assemble.na_thresholds``).
5. ``--leak-audit``: an ``audit`` of the splits manifest's classes (``isood wordnet audit SPLITS``); every
   metric is reported per cell twice, on all images and on the leak-free ones (images whose class verdict is
   not in ``--leak-rules``, default id, hypernym, hyponym): dataset ``splits-leak-free``, ``images`` column
   ``all`` | ``leak_free``, the ``leak_effect`` and ``leak_ranking`` tables, difference heatmaps and a report
   section on where the leaks change the detectors' ranking (``assemble.evaluate_with_leaks``,
   ``levels.leak_effect`` / ``leak_ranking``). Nothing is scored twice. The leak-free rows equal an evaluation
   of the `isood splits clean` output (same N/A rule, same counts). Rules that flag every image of a dataset are
   refused before any pass (nothing would be left to evaluate leak-free; ``inputs.leak_masks``).
6. ``--sanity-random-model``: the same detectors on a randomly initialised copy of the model.
7. ``write.write_evaluation``: one ``evaluation`` manifest (``set_metrics`` besides the per-cell tables; with
   ``--table-convention release`` also ``results/<detector>.csv`` in the release's format) with plots
   (``--plot-metrics``, default AUROC and FPR@95; ``all``) and the report; ``manifest.json`` last. The config
   records every set (manifest, kind, group, root) and each dataset's transform (``record.run_config``).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Mapping

import numpy as np
import pandas as pd

import manifests
from isood.classifiers.capture import check_precision
from isood.classifiers.models import model_classes, randomized_copy
from isood.classifiers.scoring import DetectorScores, preflight, score_precomputed
from isood.core.devices import resolve_device
from isood.core.errors import BadInputError
from isood.features.listing import list_images
from isood.kinds import EVALUATION, GRID_KINDS, SPLITS, AuditView
from isood.report.mosaic import grid_mosaics
from isood.science.cells import CellEvaluation
from isood.science.detectors import Detector, parse_detectors

from .assemble import (ID_TEST, ID_TRAIN, EvalSet, evaluate_with_leaks, na_thresholds, sanity_table, scores_table,
                       set_metrics)
from .datasets import image_sets, output_cache_dir, precomputed_sets
from .inputs import OodInput, check_roots, input_kind, load_leak_audit, leak_masks, load_ood_inputs, paths_read
from .model import build_model, check_model_outputs, finish_scores, score_with_model
from .options import SPLITS_SET, EvaluateOptions, check_options, check_paths, plot_metrics, resolved
from .record import release_files, run_config, run_inputs, run_meta
from .write import write_evaluation

__all__ = ["EvaluateResult", "Computed", "compute", "run_evaluate"]


@dataclass
class EvaluateResult:
    """A written evaluation: its ``manifest`` (read back), the per-cell ``evaluation``, the random-model ``sanity``
    table (or None), the run's ``seconds`` and the per-set metrics."""

    manifest: manifests.Manifest
    evaluation: CellEvaluation
    sanity: pd.DataFrame | None
    seconds: float
    notes: list[str] = field(default_factory=list)
    set_metrics: pd.DataFrame | None = None


@dataclass
class Computed:
    """What an evaluation computed, before anything is written."""

    evaluation: CellEvaluation
    per_set: pd.DataFrame
    scores: DetectorScores
    sets: dict[str, EvalSet]
    inputs: dict[str, OodInput]
    audit: AuditView | None
    leaking: dict[str, np.ndarray] | None
    sanity: pd.DataFrame | None
    random_per_cell: pd.DataFrame | None
    model_name: str
    classes: list[str] | None
    n_model: int | None
    test_root: str | None


def compute(opts: EvaluateOptions, detectors: Mapping[str, Detector], *, adapter) -> Computed:
    """The evaluation steps 1-6 (module docstring), in memory."""
    check_paths(opts)
    inputs = load_ood_inputs(opts)
    audit = load_leak_audit(opts)
    splits = inputs.get(SPLITS_SET)
    test_root = opts.test_root or (splits.view.test_root if splits is not None and splits.kind == SPLITS else None)
    model = leaking = None
    if input_kind(opts, test_root) == "outputs":
        assert test_root is not None and splits is not None, "input_kind: precomputed outputs evaluate --splits"
        sets, outputs, classes, n_model = precomputed_sets(opts, test_root, splits.view)
        leaking = leak_masks(audit, sets, opts.leak_rules)
        model_name = opts.model or "precomputed outputs"
        scores = score_precomputed(detectors, outputs[ID_TRAIN], {k: v for k, v in outputs.items() if k != ID_TRAIN},
                                   score_train=opts.der)
    else:
        check_roots(inputs)
        src_train = list_images(opts.id_train, strict=True) if opts.id_train is not None else None
        assert opts.id_test is not None, "check_options: --id-test is required"
        src_test = list_images(opts.id_test, base=opts.id_test_root, strict=True)
        n_train = len(set(src_train.table["wnid"]) - {""}) if src_train is not None else None
        n_images = len(src_train.table) if src_train is not None else None
        preflight(detectors, n_train=n_images, feature_dim=None)  # from the file listing: before any model is built
        model = build_model(opts, adapter, detectors, n_id_classes=n_train, src_train=src_train)
        w, _ = model.fc_params()  # the feature size, from the model's weights: before any image is decoded
        preflight(detectors, n_train=n_images, feature_dim=int(w.shape[1]) if w is not None else None)
        model_name = model.name
        sets, classes = image_sets(opts, inputs, model, src_train=src_train, src_test=src_test)
        leaking = leak_masks(audit, sets, opts.leak_rules)  # a class without a verdict fails before any forward pass
        n_model = model_classes(model) or (len(classes) if classes else None)
        shapes = check_model_outputs(model, detectors, sets, opts.device)
        if "features" in shapes and w is None:  # a model without an fc layer: the feature size from the probe
            preflight(detectors, n_train=n_images, feature_dim=int(shapes["features"][1]))
        scores = score_with_model(model, detectors, sets, opts)
    scores = finish_scores(scores, sets)
    evaluation = evaluate_with_leaks(scores, sets, detectors, leaking=leaking, na_threshold=opts.na_threshold,
                                     der=opts.der, convention=opts.table_convention)
    per_set = set_metrics(scores, sets, detectors, der=opts.der)
    sanity = random_per_cell = None
    if opts.sanity_random_model:
        assert model is not None, "input_kind: --sanity-random-model needs a model and images"
        rand = randomized_copy(model, opts.seed)
        r_scores = finish_scores(score_with_model(rand, parse_detectors(opts.detectors), sets, opts), sets)
        random_per_cell = evaluate_with_leaks(r_scores, sets, detectors, leaking=leaking,
                                              na_threshold=opts.na_threshold, der=opts.der).per_cell
        sanity = sanity_table(evaluation.per_cell, random_per_cell)
    return Computed(evaluation, per_set, scores, sets, inputs, audit, leaking, sanity, random_per_cell, model_name,
                     classes, n_model, test_root)


def run_evaluate(opts: EvaluateOptions, *, adapter=None, argv: list[str] | None = None) -> EvaluateResult:
    """Run `isood evaluate` (module docstring). ``adapter``: a ``ModelAdapter`` / torch module to use instead of
    ``opts.model`` (Python API: your own classifier)."""
    t0 = time.perf_counter()
    if not resolved(opts):
        raise BadInputError(f"--benchmark {opts.benchmark}: resolve it first (the CLI does; from Python use "
                            "isood.Benchmark.from_name(...).evaluate(...))")
    detectors = check_options(opts)
    check_precision(opts.precision, resolve_device(opts.device))  # fp16 needs CUDA: refused before any work
    assert opts.out is not None, "check_options: --out is required"
    with manifests.writing(opts.out, EVALUATION, inputs=paths_read(opts),
                           scratch={"--cache-dir": output_cache_dir(opts)}) as o:
        result = _evaluate(opts, detectors, o.work, adapter=adapter, argv=argv, t0=t0)
    return replace(result, manifest=manifests.read(o.final, kind=EVALUATION))


def _evaluate(opts: EvaluateOptions, detectors: Mapping[str, Detector], out: Path, *, adapter, argv: list[str] | None,
              t0: float) -> EvaluateResult:
    """The evaluation steps (module docstring), written into the work folder ``out``."""
    c = compute(opts, detectors, adapter=adapter)
    evaluation, scores, sets = c.evaluation, c.scores, c.sets
    meta = run_meta(opts, model_name=c.model_name, detectors=detectors,
                    n_id_classes=len(c.classes) if c.classes is not None else c.n_model,
                    datasets=[ID_TEST, *(n for n, s in sets.items() if s.is_ood)], scores=scores, leaking=c.leaking,
                    sets=sets)
    extra = release_files(evaluation, sets) if opts.table_convention == "release" else {}
    manifest = write_evaluation(
        evaluation, out, inputs=run_inputs(opts, c.inputs, sets, c.audit),
        scores=scores_table(scores, sets, c.leaking),
        config=run_config(opts, test_root=c.test_root, model_name=c.model_name, n_classes=c.n_model,
                          detectors=detectors, inputs=c.inputs, sets=sets),
        sanity=c.sanity, random_per_cell=c.random_per_cell, metrics=plot_metrics(opts), meta=meta,
        title=f"isood evaluation: {c.model_name}", argv=argv, set_metrics=c.per_set, extra_files=extra,
        bootstrap=opts.bootstrap, seed=opts.seed,
        mosaics=grid_mosaics({n: (i.view, i.root) for n, i in c.inputs.items() if i.kind in GRID_KINDS}, seed=opts.seed),
        summary={"model": c.model_name, "detectors": list(detectors), "datasets": evaluation.datasets,
                 "sets": [n for n, s in sets.items() if s.is_ood], "table_convention": opts.table_convention,
                 "na_thresholds": na_thresholds(sets, opts.na_threshold),
                 "seconds": round(time.perf_counter() - t0, 2),
                 **{k: v for k, v in meta.items() if k.startswith("accuracy")}})
    return EvaluateResult(manifest, evaluation, c.sanity, time.perf_counter() - t0, set_metrics=c.per_set)
