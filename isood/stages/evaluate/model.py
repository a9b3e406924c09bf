"""The classifier of an ``isood evaluate`` run and its forward passes: the model built (a Python caller's, a
``--model`` name, or a CLIP zero-shot classifier) and checked against the detectors, run once on one ID image
before any pass, then every dataset scored by the detectors in one pass per batch (outputs cached by content)."""

from __future__ import annotations

from typing import Mapping

from isood.classifiers.image_list import ImageList, default_transform, probe_input
from isood.classifiers.output_cache import labels_digest
from isood.classifiers.adapter import ModelAdapter
from isood.classifiers.models import wrap_model
from isood.classifiers.named import adapter_from_option
from isood.classifiers.scoring import DetectorScores, check_requirements, run_detectors
from isood.core.devices import resolve_device
from isood.core.errors import BadInputError
from isood.core.textio import read_lines
from isood.features.listing import ImageSource
from isood.science.detectors import Detector

from .assemble import ID_TEST, ID_TRAIN, EvalSet
from .datasets import model_class_list, output_cache_dir
from .options import EvaluateOptions

__all__ = ["build_model", "check_model_outputs", "score_with_model", "finish_scores"]


def build_model(opts: EvaluateOptions, adapter, detectors: Mapping[str, Detector], *, n_id_classes: int | None,
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
    out = {}
    for line in read_lines(path, what="--classes"):
        parts = line.strip().split(maxsplit=1)
        if len(parts) == 2 and not line.startswith("#"):
            out[parts[0]] = parts[1].strip()
    return out


def check_model_outputs(model: ModelAdapter, detectors: Mapping[str, Detector], sets: Mapping[str, EvalSet],
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


def finish_scores(scores: DetectorScores, sets: Mapping[str, EvalSet]) -> DetectorScores:
    """Labels of unlabelled sets set to None (no correctness), and every dataset's image paths."""
    for name, s in sets.items():
        if not s.labelled and name in scores.labels:
            scores.labels[name] = None
        if name in scores.predictions:
            scores.paths[name] = (s.images["path"].astype(str).tolist() if s.images is not None else
                                  list(s.paths) if s.paths is not None else [str(f) for f in s.files or []])
    return scores
