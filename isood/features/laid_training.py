"""The IS-OOD LAID recipe on a real CLIP, shared by ``build-splits`` and ``generate-syn``.

Text triplets are sampled from labels x open_clip's 80 CLIP ImageNet templates (:func:`isood.science.laid.
make_text_triplets`), every distinct text is encoded once by the CLIP (cached on disk, keyed by the CLIP identity
and the texts), and W is fitted with :func:`isood.science.laid.fit_laid`. The same labels, triplet count, seed and CLIP
give the same W.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Sequence

import numpy as np

from isood.features.clip import ClipEncoder, encode_texts
from isood.core.defaults import LAID_TRIPLETS, cache_dir as default_cache_dir
from isood.core.errors import BadInputError
from isood.science.laid import DEFAULT_FIT_OPTIONS, LAID, fit_laid, make_text_triplets
from isood.core.progress import progress_bar

__all__ = ["TextTriplets", "sample_triplets", "triplet_features", "train_laid_from_labels", "TEMPLATES_NAME",
           "openai_imagenet_templates"]

#: How the templates are recorded in ``LAID.config['templates']``.
TEMPLATES_NAME = "open_clip.OPENAI_IMAGENET_TEMPLATES (80)"


@dataclass(frozen=True)
class TextTriplets:
    """Rows aligned: ``anchor`` = template_a(label_x), ``semantic`` = template_a(label_y), ``covariate`` =
    template_b(label_x)."""

    anchor: list[str]
    semantic: list[str]
    covariate: list[str]

    @property
    def all_texts(self) -> list[str]:
        """anchor + semantic + covariate, in that order (what ``text_hash`` records)."""
        return self.anchor + self.semantic + self.covariate

    @property
    def distinct(self) -> list[str]:
        """Every distinct text once, in first-seen order (what gets encoded)."""
        return list(dict.fromkeys(self.all_texts))


def openai_imagenet_templates() -> list:
    """open_clip's 80 CLIP zero-shot ImageNet prompt templates (callables ``label -> prompt``)."""
    import open_clip

    return list(open_clip.OPENAI_IMAGENET_TEMPLATES)


def sample_triplets(labels: Sequence[str], *, triplets: int = LAID_TRIPLETS, seed: int = 0,
                    templates: Sequence | None = None) -> TextTriplets:
    """``triplets`` text triplets of the distinct ``labels`` x ``templates`` (default: open_clip's 80)."""
    labels = list(dict.fromkeys(labels))
    if len(labels) < 2:
        raise BadInputError("training LAID needs at least 2 distinct labels; pass more --labels or a trained --laid")
    templates = openai_imagenet_templates() if templates is None else list(templates)
    anchor, semantic, covariate = make_text_triplets(labels, templates, triplets, seed=seed)
    return TextTriplets(anchor, semantic, covariate)


def triplet_features(triplets: TextTriplets, distinct: Sequence[str],
                     features: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The (anchor, semantic, covariate) feature rows, looked up in ``features`` (one row per ``distinct`` text)."""
    if len(distinct) != len(features):
        raise BadInputError(f"triplet_features: {len(distinct)} texts but {len(features)} feature rows")
    pos = {t: i for i, t in enumerate(distinct)}
    anchor, semantic, covariate = (features[[pos[t] for t in part]] for part in (triplets.anchor, triplets.semantic,
                                                                                 triplets.covariate))
    return anchor, semantic, covariate


def _fit_with_progress(A: np.ndarray, S: np.ndarray, C: np.ndarray, texts: list[str], *, seed: int,
                       steps: int | None, progress: bool) -> LAID:
    """``fit_laid`` with a progress bar showing the current total loss."""
    with progress_bar(progress) as bar:
        task = bar.add_task("training LAID", total=steps)

        def callback(step: int, total: int, losses) -> None:
            bar.update(task, total=total, completed=step + 1,
                       description=f"training LAID (loss {losses['total']:.3f})")

        return fit_laid(A, S, C, seed=seed, steps=DEFAULT_FIT_OPTIONS["steps"] if steps is None else steps, texts=texts,
                        callback=callback)


def train_laid_from_labels(encoder: ClipEncoder, labels: Sequence[str], *, labels_from: str,
                           triplets: int = LAID_TRIPLETS, seed: int = 0, steps: int | None = None,
                           cache_dir: str | os.PathLike | None = None,
                           progress: bool = True) -> tuple[LAID, float | None]:
    """Fit LAID on text triplets of ``labels`` encoded by ``encoder`` (module docstring).

    ``labels_from`` describes the label source (recorded in ``LAID.config['labels']``); ``steps`` None keeps
    ``fit_laid``'s default; text features are cached under ``cache_dir`` (default
    ``$ISOOD_CACHE_DIR/text-features``). Returns ``(LAID, fit seconds)``.
    """
    labels = list(dict.fromkeys(labels))
    texts = sample_triplets(labels, triplets=triplets, seed=seed)
    distinct = texts.distinct
    cache = cache_dir if cache_dir else default_cache_dir("text-features")
    features = encode_texts(encoder, distinct, cache_dir=cache, progress=progress, description="encoding LAID texts")
    A, S, C = triplet_features(texts, distinct, np.asarray(features))
    laid = _fit_with_progress(A, S, C, texts.all_texts, seed=seed, steps=steps, progress=progress)
    fit_seconds = laid.fit_seconds
    laid.config.update(clip_identity=encoder.identity, labels=labels_from, n_labels=len(labels),
                       templates=TEMPLATES_NAME)
    return laid, fit_seconds
