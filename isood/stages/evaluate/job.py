"""The ``isood evaluate`` stage: a classifier + OOD detectors scored on an ID test set and any number of OOD
sets (per shift cell of every grid, per set OpenOOD-style), as small named steps; ``evaluate`` runs the same steps
in memory and returns pandas frames (the Python API, ``isood.evaluate``).

0. ``options.check_options``: every option checked before anything is read or loaded (one line each).
1. ``load_ood_inputs``: read and verify every OOD set's manifest through ``manifests.read(path, kind=...)``:
   ``--splits`` (kind ``splits``, dataset ``splits``), ``--syn`` (kind ``syn-is``, dataset ``syn-is``) and every
   ``--ood [GROUP:]NAME=MANIFEST`` (a ``splits`` grid: a build or an import of the release's or any cell lists; a
   ``syn-is`` grid; an ``image-list``: ``import imagenet-ood`` / ``openood-imglist``); a manifest of another kind
   (an unknown set kind) or failing verification is refused, naming it. Each set's images are relative to its
   root: ``--ood-root NAME=DIR``, else ``--test-root`` (``--splits``), a splits manifest's ``test_root``, a
   Syn-IS manifest's own folder; an image list records none (``--ood-root`` is required).
2. Data (``image_sets`` / ``precomputed_sets``). ``--id-train`` (optional: without it nothing is fitted and
   DER is not computed) / ``--id-test`` are image folders with one wnid sub-folder per class, or file lists
   (``isood.features.listing.list_images``; ``--id-test-root``: the folder the list's entries are relative to, e.g. the
   release's flat ``test_imagenet.txt``), or precomputed-outputs folders (``outputs``; then ``--test-root`` too,
   and ``--splits`` is the only OOD set). ID test labels: the wnids of its paths, else ``--id-test-labels``
   (``classes.label_file``), else none (OOD metrics only; no accuracy, no correctness metrics). A per-subset
   import is one dataset per subset (``<name>/<subset>``, ``assemble.grid_parts``). The model's class list and
   the labels: ``classes``. Each dataset's transform: ``--preprocess`` (``preprocess``). The model
   (``--model``; ``clip:SPEC`` a CLIP zero-shot classifier, ``clip_zero_shot``) is checked on one ID image
   before any pass (``ModelAdapter.check_outputs``).
3. ``score_with_model``: one forward pass per batch (``scoring.run_detectors``; outputs cached on disk under
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
   refused before any pass (nothing would be left to evaluate leak-free).
6. ``--sanity-random-model``: the same detectors on a randomly initialised copy of the model.
7. ``write.write_evaluation``: one ``evaluation`` manifest (``set_metrics`` besides the per-cell tables; with
   ``--table-convention release`` also ``results/<detector>.csv`` in the release's format) with plots
   (``--plot-metrics``, default AUROC and FPR@95; ``all``) and the report; ``manifest.json`` last. The config
   records every set (manifest, kind, group, root) and each dataset's transform.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass, field, fields, replace
from pathlib import Path
from typing import Any, Mapping

import numpy as np
import pandas as pd

import manifests
from isood.core.content import content_listing
from isood.core.defaults import DEFAULT_DETECTORS, DEFAULT_VERIFY, OOD_LABEL, cache_dir
from isood.core.devices import resolve_device
from isood.core.errors import BadInputError, IsoodError, ManifestError
from isood.features.listing import ImageSource, list_images
from isood.kinds import AUDIT, EVALUATION, GRID_KINDS, IMAGE_LIST, SPLITS, SYN_IS, AuditView
from isood.core.optconfig import recorded
from wordnet_tools.rules import leak_mask, parse_rules

from .assemble import (ID_TEST, ID_TRAIN, EvalSet, check_files, evaluate_with_leaks, grid_parts,
                       na_text, na_thresholds, precomputed_rows, sanity_table, scores_table, set_metrics)
from isood.classifiers.image_list import ImageList, default_transform, probe_input
from isood.classifiers.capture import check_precision
from isood.classifiers.output_cache import labels_digest
from isood.science.cells import CellEvaluation
from isood.classifiers.classes import (class_list, imagenet_1k, label_file, labels_for, labels_from_file, outputs_labels,
                      read_class_file, wnids_of)
from isood.classifiers.named import adapter_from_option
from isood.science.conventions import release_results_files
from isood.science.detectors import Detector, parse_detectors
from isood.classifiers.models import ModelAdapter, model_classes, randomized_copy, wrap_model
from isood.report.mosaic import grid_mosaics
from .options import (SPLITS_SET, EvaluateOptions, OodSpec, check_options, check_paths, named_values, ood_sets,
                      plot_metrics, preprocess_presets, resolved)
from .outputs import is_outputs_dir, load_outputs
from isood.classifiers.preprocess import dataset_preset, describe, preset_transform
from isood.classifiers.scoring import DetectorScores, check_requirements, preflight, run_detectors, score_precomputed
from .write import write_evaluation

__all__ = ["DEFAULT_DETECTORS", "EvaluateOptions", "EvaluateResult", "Evaluation", "OodInput", "load_grid",
           "load_ood_inputs", "input_kind", "load_leak_audit", "leak_masks", "precomputed_sets", "output_cache_dir",
           "data_identity", "id_test_labels", "image_sets", "score_with_model", "run_config", "run_meta",
           "run_inputs", "run_evaluate", "evaluate", "EVALUABLE_KINDS"]

#: The manifest kinds an OOD set may be (``--ood``): grids and image lists.
EVALUABLE_KINDS = (SPLITS, SYN_IS, IMAGE_LIST)
_FLAG_KINDS = {"--splits": SPLITS, "--syn": SYN_IS}


@dataclass
class EvaluateResult:
    manifest: manifests.Manifest
    evaluation: CellEvaluation
    sanity: pd.DataFrame | None
    seconds: float
    notes: list[str] = field(default_factory=list)
    set_metrics: pd.DataFrame | None = None


@dataclass
class OodInput:
    """One OOD set: its ``spec`` (name, manifest path, group, flag), the manifest's typed ``view``, its ``kind``
    and ``root`` (the folder its image paths are relative to; None when unknown)."""

    spec: OodSpec
    view: Any
    kind: str
    root: Path | None


# ================================================================================================ inputs
def load_grid(path: str | Path, kind, flag: str, *, verify: str = DEFAULT_VERIFY):
    """The typed view of a manifest of ``kind`` (a kind or several), refused when it fails verification
    (``verify``: 'fast' or 'full') or is of another kind (the error names ``flag``)."""
    try:
        return manifests.read(path, kind=kind, verify=verify)
    except ManifestError as e:
        raise type(e)(f"{flag}: {e}") from None


def load_ood_inputs(opts: EvaluateOptions) -> dict[str, OodInput]:
    """Every OOD set of the run (``options.ood_sets``), its manifest read and verified (``--splits``: a splits
    manifest, ``--syn``: a Syn-IS one, ``--ood``: any of ``EVALUABLE_KINDS``) and its image root: ``--ood-root
    NAME=DIR``, else ``--test-root`` (for ``--splits``), a splits manifest's ``test_root``, a Syn-IS manifest's
    folder; None for an image list without ``--ood-root``."""
    specs = ood_sets(opts)
    roots = named_values(opts.ood_root, "--ood-root", known={s.name for s in specs})
    out = {}
    for spec in specs:
        view = load_grid(spec.path, _FLAG_KINDS.get(spec.flag, EVALUABLE_KINDS), spec.flag, verify=opts.verify)
        root = roots.get(spec.name)
        if root is None and view.kind == SPLITS:
            root = opts.test_root if spec.name == SPLITS_SET and opts.test_root else view.test_root
        elif root is None and view.kind == SYN_IS:
            root = str(view.root)
        out[spec.name] = OodInput(spec, view, view.kind, Path(root) if root else None)
    return out


def _check_roots(inputs: Mapping[str, OodInput]) -> None:
    """Every OOD set has an image root (before the model loads)."""
    for name, inp in inputs.items():
        if inp.root is not None:
            continue
        if name == SPLITS_SET and inp.spec.flag == "--splits":
            raise BadInputError(f"--splits {inp.view.root} records no test_root: pass --test-root (the folder its "
                                "image paths are relative to)")
        what = "an image-list manifest records no image folder" if inp.kind == IMAGE_LIST else \
            f"{inp.view.root} records no test_root"
        raise BadInputError(f"{inp.spec.flag}: {what}: pass --ood-root {name}=DIR (the folder its image paths are "
                            "relative to)")


def input_kind(opts: EvaluateOptions, test_root: str | None) -> str:
    """'outputs' when ``--id-train``, ``--id-test`` and the test root are all precomputed-outputs folders,
    'images' when none is; anything else is an error."""
    precomputed = [is_outputs_dir(p) for p in (opts.id_train, opts.id_test, test_root)]
    if any(precomputed) and not all(precomputed):
        raise BadInputError("--id-train, --id-test and --test-root must all be image folders or all precomputed "
                            "outputs folders (index.parquet + logits.npy)")
    if all(precomputed) and (opts.sanity_random_model or opts.syn):
        raise BadInputError("--sanity-random-model and --syn need a model and images: pass image folders and --model")
    if all(precomputed) and (opts.ood or opts.splits is None):
        raise BadInputError("--ood needs a model and images: precomputed outputs evaluate --splits only; pass image "
                            "folders and --model")
    return "outputs" if all(precomputed) else "images"


def load_leak_audit(opts: EvaluateOptions) -> AuditView | None:
    """The ``--leak-audit`` manifest (kind ``audit``), or None; ``--leak-rules`` is checked here too."""
    if opts.leak_audit is None:
        return None
    parse_rules(opts.leak_rules, option="--leak-rules")
    try:
        view = manifests.read(opts.leak_audit, kind=AUDIT, verify=opts.verify)
    except ManifestError as e:
        raise type(e)(f"--leak-audit: {e}") from None
    assert isinstance(view, AuditView)  # read(kind=AUDIT) returns the kind's registered view
    return view


def leak_masks(audit: AuditView | None, sets: Mapping[str, EvalSet], rules: str) -> dict[str, np.ndarray] | None:
    """The leaking images of every dataset of the splits manifest (aligned with its rows), from the audit's class
    verdicts; a class the audit has no verdict for is a one-line error naming it, and so are rules that flag
    every image of a dataset (its leak-free copy would hold nothing: pass fewer --leak-rules)."""
    if audit is None:
        return None
    parsed = parse_rules(rules, option="--leak-rules")
    masks = {}
    for name, s in sets.items():
        if s.grid != SPLITS_SET:
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
def precomputed_sets(opts: EvaluateOptions, test_root: str, splits):
    """The datasets from precomputed-outputs folders: ``(sets, outputs, classes or None, n_classes)`` with
    ``outputs`` the ``ForwardOutputs`` of every dataset (the ID training set under ``ID_TRAIN``), to score with
    ``scoring.score_precomputed``."""
    assert opts.id_train is not None, "input_kind: precomputed outputs need --id-train"
    tr_out, tr_idx = load_outputs(opts.id_train)
    n_model = tr_out.captured("logits").shape[1]  # load_outputs: an outputs folder has logits.npy
    listed = read_class_file(opts.classes) if opts.classes else None
    classes = (class_list(wnids_of(tr_idx), n_model, listed=listed, model_name="precomputed outputs")
               if "wnid" in tr_idx.columns or listed else None)
    tr_out.labels = outputs_labels(tr_idx, classes, strict=True, what="--id-train")
    assert opts.id_test is not None, "check_options: --id-test is required"
    te_out, te_idx = load_outputs(opts.id_test)
    n_test = te_out.captured("logits").shape[1]
    if n_test != n_model:
        raise BadInputError(f"class-count mismatch: --id-test logits have {n_test} classes, "
                            f"--id-train {n_model}")
    te_out.labels = outputs_labels(te_idx, classes, strict=True, what="--id-test")
    t_out, t_idx = load_outputs(test_root)
    sets = {ID_TEST: EvalSet(ID_TEST, te_out.labels, paths=te_idx["path"].astype(str).tolist())}
    outputs = {ID_TRAIN: tr_out, ID_TEST: te_out}
    for name, (images, cells) in grid_parts(SPLITS_SET, splits.images, splits.cells, where=str(splits.root)).items():
        sub = t_out.subset(precomputed_rows(t_idx, images["path"], where=f"--test-root {test_root}"))
        sub.labels = (labels_for(wnids_of(images), classes, strict=False, what="test") if classes is not None
                      else np.full(len(images), OOD_LABEL, np.int64))
        sets[name] = EvalSet(name, sub.labels, images=images, cells=cells, grid=SPLITS_SET, source=SPLITS_SET,
                             na_threshold=splits.na_threshold)
        outputs[name] = sub
    return sets, outputs, classes, n_model


def output_cache_dir(opts: EvaluateOptions) -> str | None:
    """The model-output cache folder: ``--cache-dir``, default ``$ISOOD_CACHE_DIR/outputs``; '' for no cache."""
    if opts.cache_dir == "":
        return None
    return opts.cache_dir if opts.cache_dir is not None else str(cache_dir("outputs"))


def data_identity(files: list[Path], names: list[str], opts: EvaluateOptions) -> str:
    """The content identity of a list of image files (``isood.core.content.content_listing``: names + content hashes,
    through a stat cache in the output cache folder, so unchanged files are not read again): an image overwritten
    in place, even by one of the same size, is another dataset for the output cache."""
    return content_listing(files, names, cache_folder=output_cache_dir(opts))


def _labels(wnids: list[str], classes: list[str] | None) -> np.ndarray:
    """Class indices of OOD images by their wnids (``OOD_LABEL`` for other classes, or for all without a class
    list)."""
    if classes is None:
        return np.full(len(wnids), OOD_LABEL, np.int64)
    return labels_for(wnids, classes, strict=False, what="test")


def preset_kind(inp: OodInput) -> str:
    """What the ``release`` preset reads of a set: 'syn-is' for a Syn-IS manifest and for an import of the
    release's Syn-IS lists (a splits manifest whose release folder is ``SynIS``), else its manifest kind."""
    if inp.kind == SPLITS and str(inp.view.release_name or "").lower().replace("-", "").replace("_", "") == "synis":
        return SYN_IS
    return inp.kind


def _set_transform(name: str, kind: str, presets: tuple[str, dict[str, str]], model: ModelAdapter):
    default, chosen = presets
    preset = dataset_preset(chosen.get(name, default), kind)
    return preset, preset_transform(preset, model)


def _grid_sets(inp: OodInput, classes: list[str] | None, opts: EvaluateOptions, presets,
               model: ModelAdapter) -> dict[str, EvalSet]:
    """A grid manifest's images (files under its root, which must exist) as datasets to score (one per subset
    of a per-subset import: ``grid_parts``)."""
    name, view = inp.spec.name, inp.view
    flag = inp.spec.flag
    hint = "--test-root" if flag == "--splits" else f"--ood-root {name}=DIR"
    preset, transform = _set_transform(name, preset_kind(inp), presets, model)
    out = {}
    for ds, (images, cells) in grid_parts(name, view.images, view.cells, where=str(view.root)).items():
        files = [inp.root / p for p in images["path"].astype(str)]
        check_files(files, f"{flag} {view.root}", hint)
        data_id = f"manifest:{view.content_sha256}:{data_identity(files, [str(f) for f in files], opts)}"
        out[ds] = EvalSet(ds, _labels(wnids_of(images), classes), data_id=data_id, files=files, images=images,
                          cells=cells, grid=name, source=name, group=inp.spec.group, preset=preset,
                          transform=transform, na_threshold=view.na_threshold)
    return out


def _list_set(inp: OodInput, classes: list[str] | None, opts: EvaluateOptions, presets,
              model: ModelAdapter) -> EvalSet:
    """An image-list manifest's images (files under its root) as one dataset to score."""
    name, view = inp.spec.name, inp.view
    paths = view.images["path"].astype(str).tolist()
    files = [inp.root / p for p in paths]
    check_files(files, f"{inp.spec.flag} {view.root}", f"--ood-root {name}=DIR")
    preset, transform = _set_transform(name, inp.kind, presets, model)
    data_id = f"manifest:{view.content_sha256}:{data_identity(files, [str(f) for f in files], opts)}"
    return EvalSet(name, _labels(wnids_of(view.images), classes), data_id=data_id, files=files, paths=paths,
                   source=name, group=inp.spec.group, preset=preset, transform=transform)


def model_class_list(opts: EvaluateOptions, src_train: ImageSource | None, n_model: int | None,
                     model_name: str) -> list[str] | None:
    """The model's class wnids in logit order (``classes.class_list``), from ``--classes``, the ``--id-train``
    wnids or, without either, the ImageNet-1K order for a 1000-class model; None when unknown (no labels by
    wnid then)."""
    listed = read_class_file(opts.classes) if opts.classes else None
    if src_train is not None:
        return class_list(src_train.table["wnid"].tolist(), n_model, listed=listed, model_name=model_name)
    if listed is not None:
        if n_model is not None and len(listed) != n_model:
            raise BadInputError(f"class-count mismatch: --classes lists {len(listed)} classes but model "
                                f"'{model_name}' has {n_model} outputs: list one wnid per model output")
        return listed
    return imagenet_1k() if n_model == 1000 else None


def id_test_labels(opts: EvaluateOptions, src_test: ImageSource, classes: list[str] | None,
                   n_model: int | None) -> np.ndarray | None:
    """The ID test labels: from ``--id-test-labels`` when given (``classes.labels_from_file``), else from the
    wnids of the paths (every image must name an ID class), else None when no path names a class (OOD metrics
    only). One-line errors when labels do not match the model."""
    if opts.id_test_labels is not None:
        return labels_from_file(src_test.table["path"].tolist(), label_file(opts.id_test_labels), classes, n_model)
    wnids = src_test.table["wnid"].tolist()
    if not any(wnids):
        return None
    if classes is None:
        raise BadInputError("--id-test names classes (wnid folders) but the model's class list is unknown: pass "
                            "--classes (its wnids in logit order) or --id-train")
    return labels_for(wnids, classes, strict=True, what="--id-test")


def image_sets(opts: EvaluateOptions, inputs: Mapping[str, OodInput], adapter: ModelAdapter, *,
               src_train: ImageSource | None, src_test: ImageSource) -> tuple[dict[str, EvalSet], list[str] | None]:
    """The datasets from image files (``--id-train``, ``--id-test`` as listed, every OOD set's images) with their
    labels in the model's class order and their transform, each keyed by content (``data_identity``; the ID sets
    by their relative paths, so the identity recorded as their input hash is machine independent):
    ``(sets, classes)``."""
    n_model = model_classes(adapter)
    classes = model_class_list(opts, src_train, n_model, adapter.name)
    presets = preprocess_presets(opts, {*inputs, ID_TRAIN, ID_TEST})
    sets = {}
    for name, src in ((ID_TRAIN, src_train), (ID_TEST, src_test)):
        if src is None:
            continue
        if name == ID_TRAIN:
            assert classes is not None, "model_class_list: --id-train gives the class list"
            labels, labelled = labels_for(src.table["wnid"].tolist(), classes, strict=True, what="--id-train"), True
        else:
            got = id_test_labels(opts, src, classes, n_model or (len(classes) if classes else None))
            labels, labelled = (got, True) if got is not None else (np.full(len(src.files), OOD_LABEL, np.int64),
                                                                    False)
        preset, transform = _set_transform(name, "id", presets, adapter)
        paths = src.table["path"].tolist()
        sets[name] = EvalSet(name, labels, data_id="images:" + data_identity(list(src.files), paths, opts),
                             files=list(src.files), paths=paths, labelled=labelled, preset=preset, transform=transform)
    for inp in inputs.values():
        if inp.kind == IMAGE_LIST:
            sets[inp.spec.name] = _list_set(inp, classes, opts, presets, adapter)
        else:
            sets.update(_grid_sets(inp, classes, opts, presets, adapter))
    return sets, classes


def _model(opts: EvaluateOptions, adapter, detectors: Mapping[str, Detector], *, n_id_classes: int | None,
           src_train: ImageSource | None = None) -> ModelAdapter:
    """The classifier (``adapter`` given by a Python caller, else ``--model``), checked against the detectors
    before any forward pass. A CLIP zero-shot model (``--model clip:SPEC``) gets its classes from ``--classes``
    or the ``--id-train`` wnids."""
    if adapter is not None:
        model = wrap_model(adapter)
    elif opts.model is not None and opts.model.startswith("clip:"):
        from isood.classifiers.clip_zero_shot import clip_zero_shot

        classes = model_class_list(opts, src_train, None, opts.model)
        if classes is None:
            raise BadInputError(f"--model {opts.model}: a CLIP zero-shot classifier needs its classes: pass --classes "
                                "FILE (one wnid, optionally followed by its name, per line) or --id-train")
        model = clip_zero_shot(opts.model[len("clip:"):], classes,
                               names=_class_names(opts.classes) if opts.classes else None,
                               device=resolve_device(opts.device))
    else:
        model = adapter_from_option(opts.model, checkpoint=opts.checkpoint, num_classes=opts.num_classes,
                                    n_id_classes=n_id_classes)
    check_requirements(detectors, model.provides, source=f"model '{model.name}'",
                       hint="drop the detector or use a model that has them")
    zero_shot = [n for n, d in detectors.items() if d.zero_shot]
    if zero_shot and not model.zero_shot:
        raise BadInputError(f"detector '{zero_shot[0]}' needs a CLIP zero-shot classifier, not model '{model.name}' "
                            "(it would give MSP's numbers): pass --model clip:SPEC or drop it")
    return model


def _class_names(path: str) -> dict[str, str]:
    """``wnid -> name`` of the lines of a ``--classes`` file that give a name after the wnid."""
    from isood.core.textio import read_lines

    out = {}
    for line in read_lines(path, what="--classes"):
        parts = line.strip().split(maxsplit=1)
        if len(parts) == 2 and not line.startswith("#"):
            out[parts[0]] = parts[1].strip()
    return out


def _check_model_outputs(model: ModelAdapter, detectors: Mapping[str, Detector], sets: Mapping[str, EvalSet],
                         device: str | None) -> dict[str, tuple[int, ...]]:
    """The model run once on one ID image (the training set's, else the test set's; preprocessed as the pass will,
    on the run's device): a model that fails or does not return (N, classes) logits (and what the detectors
    need) is a one-line error before any pass. Returns the shapes of what it returned (none without an image)."""
    first = sets.get(ID_TRAIN) or sets[ID_TEST]
    assert first.files is not None, "image_sets: every set of a model run has image files"
    x = probe_input(ImageList(first.files, first.labels, first.transform or model.transform or default_transform()))
    if x is not None:
        model.to(resolve_device(device))
        kinds = set().union(*(d.requires for d in detectors.values()))
        return model.check_outputs(x.to(model.device), kinds)
    return {}


def score_with_model(adapter: ModelAdapter, detectors: Mapping[str, Detector], sets: Mapping[str, EvalSet],
                     opts: EvaluateOptions) -> DetectorScores:
    """Fit on the ID training images (when given) and score the others, one forward pass per batch, outputs
    cached (keyed by each dataset's content, transform and labels: ``--classes`` and ``--id-test-labels`` change
    them); each dataset through its own transform, images decoded
    as ``--decode`` says, the model run in ``--precision``."""
    fallback = adapter.transform or default_transform()
    data = {}
    for name, s in sets.items():
        assert s.files is not None, "image_sets: every set of a model run has image files"
        data[name] = ImageList(s.files, s.labels, s.transform or fallback, decode=opts.decode)
    scores = run_detectors(
        adapter, detectors, {k: v for k, v in data.items() if k != ID_TRAIN}, id_train=data.get(ID_TRAIN),
        score_train=opts.der and ID_TRAIN in data, batch_size=opts.batch_size, device=resolve_device(opts.device),
        num_workers=opts.workers.decode_processes, progress=opts.progress,
        cache_dir=output_cache_dir(opts),
        data_ids={k: f"{s.data_id}|{s.transform or fallback!r}|labels={labels_digest(s.labels)}"
                  for k, s in sets.items()}, precision=opts.precision)
    return scores


def _finish_scores(scores: DetectorScores, sets: Mapping[str, EvalSet]) -> DetectorScores:
    """Labels of unlabelled sets set to None (no correctness), and every dataset's image paths."""
    for name, s in sets.items():
        if not s.labelled and name in scores.labels:
            scores.labels[name] = None
        if name in scores.predictions:
            scores.paths[name] = (s.images["path"].astype(str).tolist() if s.images is not None else
                                  list(s.paths) if s.paths is not None else [str(f) for f in s.files or []])
    return scores


# ================================================================================================ record
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


# ================================================================================================ the job
@dataclass
class _Computed:
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


def _compute(opts: EvaluateOptions, detectors: Mapping[str, Detector], *, adapter) -> _Computed:
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
        _check_roots(inputs)
        src_train = list_images(opts.id_train, strict=True) if opts.id_train is not None else None
        assert opts.id_test is not None, "check_options: --id-test is required"
        src_test = list_images(opts.id_test, base=opts.id_test_root, strict=True)
        n_train = len(set(src_train.table["wnid"]) - {""}) if src_train is not None else None
        n_images = len(src_train.table) if src_train is not None else None
        preflight(detectors, n_train=n_images, feature_dim=None)  # from the file listing: before any model is built
        model = _model(opts, adapter, detectors, n_id_classes=n_train, src_train=src_train)
        w, _ = model.fc_params()  # the feature size, from the model's weights: before any image is decoded
        preflight(detectors, n_train=n_images, feature_dim=int(w.shape[1]) if w is not None else None)
        model_name = model.name
        sets, classes = image_sets(opts, inputs, model, src_train=src_train, src_test=src_test)
        leaking = leak_masks(audit, sets, opts.leak_rules)  # a class without a verdict fails before any forward pass
        n_model = model_classes(model) or (len(classes) if classes else None)
        shapes = _check_model_outputs(model, detectors, sets, opts.device)
        if "features" in shapes and w is None:  # a model without an fc layer: the feature size from the probe
            preflight(detectors, n_train=n_images, feature_dim=int(shapes["features"][1]))
        scores = score_with_model(model, detectors, sets, opts)
    scores = _finish_scores(scores, sets)
    evaluation = evaluate_with_leaks(scores, sets, detectors, leaking=leaking, na_threshold=opts.na_threshold,
                                     der=opts.der, convention=opts.table_convention)
    per_set = set_metrics(scores, sets, detectors, der=opts.der)
    sanity = random_per_cell = None
    if opts.sanity_random_model:
        assert model is not None, "input_kind: --sanity-random-model needs a model and images"
        rand = randomized_copy(model, opts.seed)
        r_scores = _finish_scores(score_with_model(rand, parse_detectors(opts.detectors), sets, opts), sets)
        random_per_cell = evaluate_with_leaks(r_scores, sets, detectors, leaking=leaking,
                                              na_threshold=opts.na_threshold, der=opts.der).per_cell
        sanity = sanity_table(evaluation.per_cell, random_per_cell)
    return _Computed(evaluation, per_set, scores, sets, inputs, audit, leaking, sanity, random_per_cell, model_name,
                     classes, n_model, test_root)


def _named_roots(manifest: str) -> list[str]:
    """The image roots a manifest's view names (``test_root``, ``id_root``, ``image_root``; [] for a folder that
    is no readable manifest of an evaluable kind, which the run refuses later with its own message)."""
    try:
        view = manifests.read(manifest, kind=EVALUABLE_KINDS)
    except (IsoodError, OSError):
        return []
    roots = (getattr(view, name, None) for name in ("test_root", "id_root", "image_root"))
    return [str(r) for r in roots if r]


def _inputs_of(opts: EvaluateOptions) -> list[str]:
    """Every path the run reads, the roots its manifests name included (the output folder may be none of them,
    nor inside one)."""
    named = [v for _, _, v in (str(t).partition("=") for t in (*opts.ood, *opts.ood_root))]
    manifests_read = [opts.splits, opts.syn, *[v for _, _, v in (str(t).partition("=") for t in opts.ood)]]
    roots = [r for m in manifests_read if m for r in _named_roots(m)]
    paths = [opts.splits, opts.syn, opts.leak_audit, opts.id_train, opts.id_test, opts.test_root, opts.checkpoint,
             opts.id_test_root, opts.id_test_labels, *named, *roots]
    return [p for p in paths if p]


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
    with manifests.writing(opts.out, EVALUATION, inputs=_inputs_of(opts),
                           scratch={"--cache-dir": output_cache_dir(opts)}) as o:
        result = _evaluate(opts, detectors, o.work, adapter=adapter, argv=argv, t0=t0)
    return replace(result, manifest=manifests.read(o.final, kind=EVALUATION))


def _evaluate(opts: EvaluateOptions, detectors: Mapping[str, Detector], out: Path, *, adapter, argv: list[str] | None,
              t0: float) -> EvaluateResult:
    """The evaluation steps (module docstring), written into the work folder ``out``."""
    c = _compute(opts, detectors, adapter=adapter)
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


# ================================================================================================ in memory
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
    c = _compute(opts, dets, adapter=adapter)
    ev = c.evaluation
    return Evaluation(per_cell=ev.per_cell, per_set=c.per_set, table1=ev.summary, levels=ev.levels, means=ev.means,
                      scores=c.scores, cells=ev, convention=ev.convention,
                      config=run_config(opts, test_root=c.test_root, model_name=c.model_name, n_classes=c.n_model,
                                        detectors=dets, inputs=c.inputs, sets=c.sets))
