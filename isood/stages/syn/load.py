"""The load steps of the generate-syn stage: styles, labels, blocklist, the image splits (read through their typed
view), the ID image features, CLIP and LAID; and the measuring step (prompt text features -> D_sem, D_cov)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Sequence

import numpy as np

import manifests
from generation.safety import PromptBlocklist
from generation.styles import Style, load_styles
from isood.stages.syn.options import SynOptions
from isood.features.clip import ClipEncoder, encode_texts, load_clip
from isood.core.errors import BadInputError, ManifestError
from isood.core.defaults import DEFAULT_VERIFY, cache_dir as default_cache_dir
from isood.features.featurestore.loading import open_features
from isood.kinds import SPLITS, SplitsView
from isood.features.labels import Labels, load_labels
from isood.science.laid import LAID
from isood.features.laid_training import train_laid_from_labels
from isood.core.devices import explicit_device
from isood.features.shift import shift_distances

__all__ = ["SynInputs", "LaidChoice", "load_splits", "load_id_features", "load_encoder", "load_laid", "load_inputs",
           "measure_prompts"]


@dataclass(frozen=True, eq=False)
class LaidChoice:
    """The LAID map used, where it came from (``origin``: a path or ``'trained'``; ``source``: the file read,
    None when trained) and its fit time."""

    laid: LAID
    origin: str
    source: str | None = None
    fit_seconds: float | None = None


@dataclass(frozen=True, eq=False)
class SynInputs:
    """Everything the stage loads before the pure steps."""

    styles: Sequence[Style]
    labels: Labels
    blocklist: PromptBlocklist
    splits: SplitsView | None
    id_features: str
    id_feats: np.ndarray
    encoder: ClipEncoder
    clip_spec: str
    laid: LaidChoice


def load_splits(path: str, *, verify: str = DEFAULT_VERIFY) -> SplitsView:
    """The image splits (``isood build-splits``; files verified) whose edges, levels, CLIP, LAID and ID features
    Syn-IS reuses."""
    view = manifests.read(path, kind=SPLITS, verify=verify)
    assert isinstance(view, SplitsView)  # read(kind=SPLITS) returns the kind's registered view
    sem, cov = view.axis_edges("sem"), view.axis_edges("cov")
    if len(sem) != len(cov):
        raise ManifestError(f"--splits {path}: sem and cov have different numbers of levels ({len(sem) - 1} vs "
                            f"{len(cov) - 1}); pass a build-splits output")
    return view


def load_id_features(given: str | None, splits: SplitsView | None, *,
                     verify: str = DEFAULT_VERIFY) -> tuple[str, np.ndarray]:
    """The ID image features (``--id-features``, else those the splits were measured against; a manifest's files
    verified) and their path."""
    path = given or (splits.id_features if splits is not None else None)
    if not path:
        raise BadInputError(
            "generate-syn needs the ID image features to measure each prompt's shift: pass --id-features DIR "
            "(features of the in-distribution images, e.g. ImageNet-1K, extracted with the same --clip), "
            "or --splits of a build-splits run that extracted them")
    feats = open_features(path, verify=verify).read()
    if len(feats) == 0:
        raise BadInputError(f"--id-features {path} holds no features; extract the ID images first")
    return str(path), feats


def load_encoder(spec: str | None, *, device: str | None, embed_dim: int) -> ClipEncoder:
    """The CLIP of the image splits, checked against the ID features' dimension."""
    if not spec:
        raise BadInputError("pass --clip MODEL:PRETRAINED or local-dir:PATH (the CLIP used for the image splits)")
    encoder = load_clip(spec, device=device)
    if encoder.embed_dim != embed_dim:
        raise BadInputError(f"--clip {spec} gives {encoder.embed_dim}-d features but --id-features holds "
                            f"{embed_dim}-d; pass the CLIP the ID features were extracted with")
    return encoder


def load_laid(opts: SynOptions, splits: SplitsView | None, encoder: ClipEncoder, labels: Labels,
              warn: Callable[[str], None]) -> LaidChoice:
    """LAID: ``--laid``, else the splits', else trained here on the labels x CLIP templates (IS-OOD recipe)."""
    source = opts.laid or (str(splits.laid_path) if splits is not None and splits.laid_path else None)
    if not source:
        laid, fit_seconds = train_laid_from_labels(encoder, labels.texts, labels_from=f"--labels {opts.labels}",
                                                   triplets=opts.triplets, seed=opts.seed,
                                                   progress=opts.progress)
        return LaidChoice(laid, "trained", None, fit_seconds)
    laid = LAID.load(source)
    if laid.dim != encoder.embed_dim:
        raise BadInputError(f"--laid W is {laid.dim}x{laid.dim} but the CLIP {encoder.identity} gives "
                            f"{encoder.embed_dim}-d features; pass the LAID fitted for this CLIP")
    trained_with = laid.config.get("clip_identity")
    if trained_with not in (None, encoder.identity):
        warn(f"LAID {source} was trained with {trained_with}, not {encoder.identity}")
    return LaidChoice(laid, str(source), str(source), None)


def load_inputs(opts: SynOptions, *, warn: Callable[[str], None]) -> SynInputs:
    """Load every input of the stage, the cheap ones first (a bad --styles fails before CLIP loads)."""
    styles = load_styles(opts.styles)
    labels = load_labels(opts.labels, verify=opts.verify)
    blocklist = PromptBlocklist.build(opts.blocklist, use_default=opts.default_blocklist)
    splits = load_splits(opts.splits, verify=opts.verify) if opts.splits else None
    id_features, id_feats = load_id_features(opts.id_features, splits, verify=opts.verify)
    clip_spec = opts.clip or (splits.clip if splits is not None else None)
    encoder = load_encoder(clip_spec, device=opts.device, embed_dim=id_feats.shape[1])
    laid = load_laid(opts, splits, encoder, labels, warn)
    return SynInputs(styles=styles, labels=labels, blocklist=blocklist, splits=splits, id_features=id_features,
                     id_feats=id_feats, encoder=encoder, clip_spec=str(clip_spec), laid=laid)


def measure_prompts(inputs: SynInputs, prompts: Sequence[str], *, device: str | None,
                    progress: bool) -> tuple[np.ndarray, np.ndarray]:
    """D_sem, D_cov of each prompt: its CLIP text feature through LAID, nearest cosine distance to the ID
    image features (IS-OOD, Syn-IS). The text features are cached like LAID's (``encode_texts`` under
    ``isood.core.defaults.cache_dir('text-features')``, keyed by the CLIP's identity, which holds the content hash of
    local weights, and the prompts' text), so a rerun with the same CLIP and prompts does not encode them again."""
    feats = encode_texts(inputs.encoder, list(prompts), cache_dir=default_cache_dir("text-features"),
                         progress=progress, description="encoding prompts")
    return shift_distances(feats, inputs.id_feats, inputs.laid.laid,
                           device=explicit_device(device))
