"""The datasets an ``isood evaluate`` run scores (``assemble.EvalSet``), built from its inputs: from image files
(``image_sets``: the ID training and test sets as listed, every OOD set's images under its root; labels in the
model's class order, each dataset's transform by ``--preprocess``, each keyed by content for the output cache:
``data_identity``) or from precomputed-outputs folders (``precomputed_sets``)."""

from __future__ import annotations

from pathlib import Path
from typing import Mapping

import numpy as np

from isood.classifiers.classes import (class_list, imagenet_1k, label_file, labels_for, labels_from_file,
                                       outputs_labels, read_class_file, wnids_of)
from isood.classifiers.adapter import ModelAdapter
from isood.classifiers.models import model_classes
from isood.classifiers.preprocess import dataset_preset, preset_transform
from isood.core.content import content_listing
from isood.core.defaults import OOD_LABEL, cache_dir
from isood.core.errors import BadInputError
from isood.features.listing import ImageSource
from isood.kinds import IMAGE_LIST, SPLITS, SYN_IS

from .assemble import ID_TEST, ID_TRAIN, EvalSet, check_files, grid_parts, precomputed_rows
from .inputs import OodInput
from .options import SPLITS_SET, EvaluateOptions, preprocess_presets
from .outputs import load_outputs

__all__ = ["precomputed_sets", "output_cache_dir", "data_identity", "preset_kind", "model_class_list",
           "id_test_labels", "image_sets"]


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

