"""L4: the ``isood evaluate`` stage: a classifier + OOD detectors scored per shift cell of a splits (and Syn-IS)
manifest, as small named steps.

0. ``options.check_options``: every option checked before anything is read or loaded (one line each).
1. ``load_grids``: read and verify the grid manifests (``--splits``, kind ``splits``; ``--syn``, kind ``syn-is``)
   through ``manifests.read(path, kind=...)``; a manifest failing verification is refused, naming its problems.
2. Data (``image_sets`` / ``precomputed_sets``). ``--id-train`` / ``--id-test`` are image folders with one wnid
   sub-folder per class (or file lists, ``isood.images.list_images``), or precomputed-outputs folders
   (``outputs``; then ``--test-root`` too). The test images are the manifest's ``images.path`` rows, relative to
   ``--test-root`` (default: ``SplitsView.test_root``); Syn-IS paths are relative to the Syn-IS manifest folder.
   A per-subset import is one dataset per subset (``splits/<subset>``, ``assemble.grid_parts``). The model's
   class list and the labels: ``classes``. The model (``--model``) is checked on one ID training image before
   any pass (``ModelAdapter.check_outputs``).
3. ``score_with_model``: one forward pass per batch (``scoring.run_detectors``; outputs cached on disk under
   ``--cache-dir``, default ``$ISOOD_CACHE_DIR/outputs``, keyed by the images' content: ``data_identity``, the
   decoding mode ``--decode`` and the precision ``--precision``: ``capture.ImageList``, ``capture.extract_outputs``),
   detectors fitted on ``--id-train`` (which is also scored: DER's threshold); their parameters checked against
   the data's sizes first (``scoring.preflight``). Every unreadable image of the run is named in one error.
4. ``assemble.evaluate_sets``: every metric per cell, level curves, Table 1, per-detector means. N/A is one
   rule for every set, ``isood.grid.is_na`` with ``--na-threshold`` (default ``isood.defaults.NA_THRESHOLD``)
   on the images the evaluation has in the cell; a manifest's stored ``na`` flags are not read.
5. ``--leak-audit``: an ``audit`` of the splits manifest's classes (``isood wordnet audit SPLITS``); every
   metric is reported per cell twice, on all images and on the leak-free ones (images whose class verdict is
   not in ``--leak-rules``, default id, hypernym, hyponym): dataset ``splits-leak-free``, ``images`` column
   ``all`` | ``leak_free``, the ``leak_effect`` and ``leak_ranking`` tables, difference heatmaps and a report
   section on where the leaks change the detectors' ranking (``assemble.evaluate_with_leaks``,
   ``levels.leak_effect`` / ``leak_ranking``). Nothing is scored twice. The leak-free rows equal an evaluation
   of the `isood splits clean` output (same N/A rule, same counts). Rules that flag every image of a dataset are
   refused before any pass (nothing would be left to evaluate leak-free).
6. ``--sanity-random-model``: the same detectors on a randomly initialised copy of the model.
7. ``write.write_evaluation``: one ``evaluation`` manifest with plots (``--plot-metrics``, default AUROC and
   FPR@95; ``all``) and the report; ``manifest.json`` last.
"""

from __future__ import annotations

import os
import time
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any, Mapping

import numpy as np
import pandas as pd

import manifests
from isood.content import content_listing
from isood.defaults import DEFAULT_DETECTORS, DEFAULT_VERIFY, OOD_LABEL, cache_dir
from isood.errors import BadInputError, ManifestError
from isood.images import ImageSource, list_images
from isood.kinds import AUDIT, EVALUATION, SPLITS, SYN_IS, AuditView, GridView
from isood.devices import resolve_device
from wordnet_tools.rules import leak_mask, parse_rules

from .assemble import (ID_TEST, ID_TRAIN, EvalSet, check_files, evaluate_with_leaks, grid_parts,
                       precomputed_rows, sanity_table, scores_table)
from .capture import ImageList, check_precision, default_transform, probe_input
from .cells import CellEvaluation
from .classes import class_list, labels_for, outputs_labels, read_class_file, wnids_of
from .classifiers import adapter_from_option
from .detectors import Detector, parse_detectors
from .models import ModelAdapter, model_classes, randomized_copy, wrap_model
from .options import EvaluateOptions, check_options, plot_metrics
from .outputs import is_outputs_dir, load_outputs
from .scoring import DetectorScores, check_requirements, run_detectors, score_precomputed
from .write import write_evaluation

__all__ = ["DEFAULT_DETECTORS", "EvaluateOptions", "EvaluateResult", "load_grid", "load_grids", "input_kind",
           "load_leak_audit", "leak_masks", "precomputed_sets", "output_cache_dir", "data_identity", "image_sets",
           "score_with_model", "run_config", "run_meta", "run_inputs", "run_evaluate"]

_FLAGS = {"splits": "--splits", SYN_IS: "--syn"}


@dataclass
class EvaluateResult:
    manifest: manifests.Manifest
    evaluation: CellEvaluation
    sanity: pd.DataFrame | None
    seconds: float
    notes: list[str] = field(default_factory=list)


# ================================================================================================ inputs
def load_grid(path: str | Path, kind: str, flag: str, *, verify: str = DEFAULT_VERIFY) -> GridView:
    """The typed view of a grid manifest, refused when it fails verification (``verify``: 'fast' or 'full') or
    is of another kind."""
    try:
        return manifests.read(path, kind=kind, verify=verify)
    except ManifestError as e:
        raise type(e)(f"{flag}: {e}") from None


def load_grids(opts: EvaluateOptions) -> dict[str, GridView]:
    """``{'splits': SplitsView, 'syn-is': SynView}`` (Syn-IS only with ``--syn``)."""
    grids = {"splits": load_grid(opts.splits, SPLITS, "--splits", verify=opts.verify)}
    if opts.syn:
        grids[SYN_IS] = load_grid(opts.syn, SYN_IS, "--syn", verify=opts.verify)
    return grids


def input_kind(opts: EvaluateOptions, test_root: str | None) -> str:
    """'outputs' when ``--id-train``, ``--id-test`` and the test root are all precomputed-outputs folders,
    'images' when none is; anything else is an error."""
    precomputed = [is_outputs_dir(p) for p in (opts.id_train, opts.id_test, test_root)]
    if any(precomputed) and not all(precomputed):
        raise BadInputError("--id-train, --id-test and --test-root must all be image folders or all precomputed "
                            "outputs folders (index.parquet + logits.npy)")
    if all(precomputed) and (opts.sanity_random_model or opts.syn):
        raise BadInputError("--sanity-random-model and --syn need a model and images: pass image folders and --model")
    return "outputs" if all(precomputed) else "images"


def load_leak_audit(opts: EvaluateOptions) -> AuditView | None:
    """The ``--leak-audit`` manifest (kind ``audit``), or None; ``--leak-rules`` is checked here too."""
    if opts.leak_audit is None:
        return None
    parse_rules(opts.leak_rules, option="--leak-rules")
    try:
        return manifests.read(opts.leak_audit, kind=AUDIT, verify=opts.verify)
    except ManifestError as e:
        raise type(e)(f"--leak-audit: {e}") from None


def leak_masks(audit: AuditView | None, sets: Mapping[str, EvalSet], rules: str) -> dict[str, np.ndarray] | None:
    """The leaking images of every dataset of the splits manifest (aligned with its rows), from the audit's class
    verdicts; a class the audit has no verdict for is a one-line error naming it, and so are rules that flag
    every image of a dataset (its leak-free copy would hold nothing: pass fewer --leak-rules)."""
    if audit is None:
        return None
    parsed = parse_rules(rules, option="--leak-rules")
    masks = {}
    for name, s in sets.items():
        if s.grid != "splits":
            continue
        mask = leak_mask(wnids_of(s.images), audit.class_rules(), rules=parsed, where=f"--leak-audit {audit.root}")
        if mask.size and mask.all():
            verdicts = ", ".join(sorted(v for v in set(audit.class_rules().values()) if v))
            raise BadInputError(f"--leak-rules {','.join(parsed)} flag all {mask.size} images of {name} as leaks: "
                                f"nothing is left to evaluate leak-free; pass fewer rules (among {verdicts}) or "
                                "drop --leak-audit")
        masks[name] = mask
    return masks


# ================================================================================================ data
def precomputed_sets(opts: EvaluateOptions, test_root: str, splits: GridView):
    """The datasets from precomputed-outputs folders: ``(sets, outputs, classes or None, n_classes)`` with
    ``outputs`` the ``ForwardOutputs`` of every dataset (the ID training set under ``ID_TRAIN``), to score with
    ``scoring.score_precomputed``."""
    tr_out, tr_idx = load_outputs(opts.id_train)
    n_model = tr_out.logits.shape[1]
    listed = read_class_file(opts.classes) if opts.classes else None
    classes = (class_list(wnids_of(tr_idx), n_model, listed=listed, model_name="precomputed outputs")
               if "wnid" in tr_idx.columns or listed else None)
    tr_out.labels = outputs_labels(tr_idx, classes, strict=True, what="--id-train")
    te_out, te_idx = load_outputs(opts.id_test)
    if te_out.logits.shape[1] != n_model:
        raise BadInputError(f"class-count mismatch: --id-test logits have {te_out.logits.shape[1]} classes, "
                            f"--id-train {n_model}")
    te_out.labels = outputs_labels(te_idx, classes, strict=True, what="--id-test")
    t_out, t_idx = load_outputs(test_root)
    sets = {ID_TEST: EvalSet(ID_TEST, te_out.labels, paths=te_idx["path"].astype(str).tolist())}
    outputs = {ID_TRAIN: tr_out, ID_TEST: te_out}
    for name, (images, cells) in grid_parts("splits", splits.images, splits.cells, where=str(splits.root)).items():
        sub = t_out.subset(precomputed_rows(t_idx, images["path"], where=f"--test-root {test_root}"))
        sub.labels = (labels_for(wnids_of(images), classes, strict=False, what="test") if classes is not None
                      else np.full(len(images), OOD_LABEL, np.int64))
        sets[name] = EvalSet(name, sub.labels, images=images, cells=cells, grid="splits")
        outputs[name] = sub
    return sets, outputs, classes, n_model


def output_cache_dir(opts: EvaluateOptions) -> str:
    """The model-output cache folder: ``--cache-dir``, default ``$ISOOD_CACHE_DIR/outputs``."""
    return opts.cache_dir if opts.cache_dir is not None else str(cache_dir("outputs"))


def data_identity(files: list[Path], names: list[str], opts: EvaluateOptions) -> str:
    """The content identity of a list of image files (``isood.content.content_listing``: names + content hashes,
    through a stat cache in the output cache folder, so unchanged files are not read again): an image overwritten
    in place, even by one of the same size, is another dataset for the output cache."""
    return content_listing(files, names, cache_folder=output_cache_dir(opts))


def _grid_sets(name: str, view: GridView, root: Path, classes: list[str], opts: EvaluateOptions) -> dict[str, EvalSet]:
    """A grid manifest's images (files under ``root``, which must exist) as datasets to score (one per subset
    of a per-subset import: ``assemble.grid_parts``)."""
    flag = _FLAGS.get(name, name)
    out = {}
    for ds, (images, cells) in grid_parts(name, view.images, view.cells, where=str(view.root)).items():
        files = [root / p for p in images["path"].astype(str)]
        check_files(files, f"{flag} {view.root}")
        labels = labels_for(wnids_of(images), classes, strict=False, what=ds)
        data_id = f"manifest:{view.content_sha256}:{data_identity(files, [str(f) for f in files], opts)}"
        out[ds] = EvalSet(ds, labels, data_id=data_id, files=files, images=images, cells=cells, grid=name)
    return out


def image_sets(opts: EvaluateOptions, grids: Mapping[str, GridView], test_root: str | None, adapter: ModelAdapter,
               *, src_train: ImageSource, src_test: ImageSource) -> tuple[dict[str, EvalSet], list[str]]:
    """The datasets from image folders (``--id-train``, ``--id-test`` as listed, the grids' images) with their
    labels in the model's class order, each keyed by content (``data_identity``; the ID sets by their relative
    paths, so the identity recorded as their input hash is machine independent): ``(sets, classes)``."""
    listed = read_class_file(opts.classes) if opts.classes else None
    classes = class_list(src_train.table["wnid"].tolist(), model_classes(adapter), listed=listed,
                         model_name=adapter.name)
    ids = {name: "images:" + data_identity(list(src.files), src.table["path"].tolist(), opts)
           for name, src in ((ID_TRAIN, src_train), (ID_TEST, src_test))}
    sets = {
        ID_TRAIN: EvalSet(ID_TRAIN, labels_for(src_train.table["wnid"].tolist(), classes, strict=True,
                                               what="--id-train"),
                          data_id=ids[ID_TRAIN], files=list(src_train.files)),
        ID_TEST: EvalSet(ID_TEST, labels_for(src_test.table["wnid"].tolist(), classes, strict=True, what="--id-test"),
                         data_id=ids[ID_TEST], files=list(src_test.files),
                         paths=src_test.table["path"].tolist()),
    }
    for name, view in grids.items():
        if name == "splits" and test_root is None:
            raise BadInputError(f"--splits {view.root} records no test_root: pass --test-root (the folder its image "
                                "paths are relative to)")
        root = Path(test_root) if name == "splits" else Path(view.root)
        sets.update(_grid_sets(name, view, root, classes, opts))
    return sets, classes


def _model(opts: EvaluateOptions, adapter, detectors: Mapping[str, Detector], *, n_id_classes: int) -> ModelAdapter:
    """The classifier (``adapter`` given by a Python caller, else ``--model``), checked against the detectors
    before any forward pass."""
    if adapter is not None:
        model = wrap_model(adapter)
    else:
        model = adapter_from_option(opts.model, checkpoint=opts.checkpoint, num_classes=opts.num_classes,
                                    n_id_classes=n_id_classes)
    check_requirements(detectors, model.provides, source=f"model '{model.name}'",
                       hint="drop the detector or use a model that has them")
    return model


def _check_model_outputs(model: ModelAdapter, detectors: Mapping[str, Detector], train: EvalSet,
                         device: str | None) -> None:
    """The model run once on one ID training image (preprocessed as the pass will, on the run's device): a model
    that fails or does not return (N, classes) logits (and what the detectors need) is a one-line error before
    any pass."""
    x = probe_input(ImageList(train.files, train.labels, model.transform or default_transform()))
    if x is not None:
        model.to(resolve_device(device))
        kinds = set().union(*(d.requires for d in detectors.values()))
        model.check_outputs(x.to(model.device), kinds)


def score_with_model(adapter: ModelAdapter, detectors: Mapping[str, Detector], sets: Mapping[str, EvalSet],
                     opts: EvaluateOptions) -> DetectorScores:
    """Fit on the ID training images and score the others, one forward pass per batch, outputs cached; images
    decoded as ``--decode`` says, the model run in ``--precision``."""
    transform = adapter.transform or default_transform()
    data = {name: ImageList(s.files, s.labels, transform, decode=opts.decode) for name, s in sets.items()}
    return run_detectors(
        adapter, detectors, {k: v for k, v in data.items() if k != ID_TRAIN}, id_train=data[ID_TRAIN],
        score_train=opts.der, batch_size=opts.batch_size, device=resolve_device(opts.device),
        num_workers=opts.workers, progress=opts.progress,
        cache_dir=output_cache_dir(opts),
        data_ids={k: s.data_id for k, s in sets.items()}, preprocess_id=repr(transform), precision=opts.precision)


# ================================================================================================ record
def run_config(opts: EvaluateOptions, *, test_root: str | None, model_name: str, n_classes: int | None,
               detectors: Mapping[str, Detector]) -> dict[str, Any]:
    """The manifest's config: the options (without ``progress``), the test root used, the model and the
    detectors' parameters."""
    config = {k: v for k, v in asdict(opts).items() if k != "progress"}
    config.update(test_root=os.path.abspath(test_root) if test_root else None, model_name=model_name,
                  n_classes=int(n_classes) if n_classes else None,
                  detector_params={n: d.params() for n, d in detectors.items()})
    return config


def run_meta(opts: EvaluateOptions, *, model_name: str, detectors: Mapping[str, Detector], n_id_classes: int | None,
             datasets: list[str], scores: DetectorScores,
             leaking: Mapping[str, np.ndarray] | None = None) -> dict[str, Any]:
    """The run details shown in the report: model, detectors, manifests, classes, N/A threshold, accuracies and,
    with a leak audit, the leaking images per dataset."""
    meta = {"model": model_name, "detectors": ", ".join(detectors), "splits": opts.splits,
            **({"syn-is": opts.syn} if opts.syn else {}), "ID classes": n_id_classes,
            "N/A threshold": f"{opts.na_threshold} images, counted on the images of each set evaluated"}
    for ds in datasets:
        if scores.has_labels(ds):
            meta[f"accuracy on {ds}"] = round(float(np.mean(scores.correct(ds))), 4)
    if leaking:
        meta["leak audit"] = f"{opts.leak_audit} (rules: {opts.leak_rules})"
        for ds, mask in leaking.items():
            meta[f"leaking images in {ds}"] = f"{int(mask.sum())} of {mask.size}"
    return meta


def run_inputs(opts: EvaluateOptions, grids: Mapping[str, GridView], sets: Mapping[str, EvalSet],
               audit: AuditView | None = None) -> list[dict]:
    """Provenance: the grid manifests (their content hash), the leak audit, the ID sets (the hash of their
    relative paths and content hashes) and the checkpoint."""
    inputs = [manifests.input_record(f"{ds}_manifest", g.root, sha256=g.content_sha256) for ds, g in grids.items()]
    if audit is not None:
        inputs.append(manifests.input_record("leak_audit", audit.root, sha256=audit.content_sha256))
    for name, src in ((ID_TRAIN, opts.id_train), (ID_TEST, opts.id_test)):
        known = sets[name].data_id.split(":", 1)[-1] if name in sets and sets[name].data_id else None
        inputs.append(manifests.input_record(name, src, sha256=known))
    if opts.checkpoint:
        inputs.append(manifests.input_record("checkpoint", opts.checkpoint))
    return inputs


# ================================================================================================ the job
def run_evaluate(opts: EvaluateOptions, *, adapter=None, argv: list[str] | None = None) -> EvaluateResult:
    """Run `isood evaluate` (module docstring). ``adapter``: a ``ModelAdapter`` / torch module to use instead of
    ``opts.model`` (Python API: your own classifier)."""
    t0 = time.perf_counter()
    detectors = check_options(opts)
    check_precision(opts.precision, resolve_device(opts.device))  # fp16 needs CUDA: refused before any work
    inputs = [opts.splits, opts.syn, opts.leak_audit, opts.id_train, opts.id_test, opts.test_root, opts.checkpoint]
    with manifests.writing(opts.out, EVALUATION, inputs=[p for p in inputs if p]) as o:
        result = _evaluate(opts, detectors, o.work, adapter=adapter, argv=argv, t0=t0)
    return replace(result, manifest=manifests.read(o.final, kind=EVALUATION))


def _evaluate(opts: EvaluateOptions, detectors: Mapping[str, Detector], out: Path, *, adapter, argv: list[str] | None,
              t0: float) -> EvaluateResult:
    """The evaluation steps (module docstring), written into the work folder ``out``."""
    grids = load_grids(opts)
    audit = load_leak_audit(opts)
    test_root = opts.test_root or grids["splits"].test_root
    model = leaking = None
    if input_kind(opts, test_root) == "outputs":
        sets, outputs, classes, n_model = precomputed_sets(opts, test_root, grids["splits"])
        leaking = leak_masks(audit, sets, opts.leak_rules)
        model_name = opts.model or "precomputed outputs"
        scores = score_precomputed(detectors, outputs[ID_TRAIN], {k: v for k, v in outputs.items() if k != ID_TRAIN},
                                   score_train=opts.der)
    else:
        src_train, src_test = list_images(opts.id_train), list_images(opts.id_test)
        model = _model(opts, adapter, detectors, n_id_classes=len(set(src_train.table["wnid"]) - {""}))
        model_name = model.name
        sets, classes = image_sets(opts, grids, test_root, model, src_train=src_train, src_test=src_test)
        leaking = leak_masks(audit, sets, opts.leak_rules)  # a class without a verdict fails before any forward pass
        n_model = model_classes(model) or len(classes)
        _check_model_outputs(model, detectors, sets[ID_TRAIN], opts.device)
        scores = score_with_model(model, detectors, sets, opts)
    evaluation = evaluate_with_leaks(scores, sets, detectors, leaking=leaking, na_threshold=opts.na_threshold,
                                     der=opts.der)
    sanity = random_per_cell = None
    if opts.sanity_random_model:
        rand = randomized_copy(model, opts.seed)
        r_scores = score_with_model(rand, parse_detectors(opts.detectors), sets, opts)
        random_per_cell = evaluate_with_leaks(r_scores, sets, detectors, leaking=leaking,
                                              na_threshold=opts.na_threshold, der=opts.der).per_cell
        sanity = sanity_table(evaluation.per_cell, random_per_cell)
    meta = run_meta(opts, model_name=model_name, detectors=detectors,
                    n_id_classes=len(classes) if classes is not None else n_model,
                    datasets=[ID_TEST, *(n for n, s in sets.items() if s.is_grid)], scores=scores, leaking=leaking)
    manifest = write_evaluation(
        evaluation, out, inputs=run_inputs(opts, grids, sets, audit),
        scores=scores_table(scores, sets, leaking),
        config=run_config(opts, test_root=test_root, model_name=model_name, n_classes=n_model, detectors=detectors),
        sanity=sanity, random_per_cell=random_per_cell, metrics=plot_metrics(opts), meta=meta,
        title=f"isood evaluation: {model_name}", argv=argv,
        summary={"model": model_name, "detectors": list(detectors), "datasets": evaluation.datasets,
                 "seconds": round(time.perf_counter() - t0, 2),
                 **{k: v for k, v in meta.items() if k.startswith("accuracy")}})
    return EvaluateResult(manifest, evaluation, sanity, time.perf_counter() - t0)
