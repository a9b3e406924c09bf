"""A CLIP-like planted world: image and text features in two separate cones (CLIP's modality gap),
ImageNet-like class counts and spread, and style directions for covariate shift, with the planted semantic and
covariate factors known.

:mod:`isood.science.simulate` plants the shift factors on features whose text and image sides nearly coincide; at that
scale a text-to-image distance is as small as an image-to-image one. CLIP's are not: a caption and its own image
have a cosine of about 0.3, while two images (or two captions) of anything are closer to each other than that,
because each modality lives in a narrow cone of its own (Liang et al., "Mind the Gap", 2022). A grid whose edges
come from image-to-image distances then puts every text (a Syn-IS prompt) beyond its top edge. This world has
that geometry, so the tests see it:

- Latent factors, as in :mod:`isood.science.simulate`: ``z = [semantic (D/2) ; covariate (D/2)]`` mixed into features by
  a random orthogonal ``M`` (``feature = z @ M.T``; the ideal LAID map is ``W = M``).
- Semantic: ``n_superclasses`` random centres; each of ``n_id_classes`` ID classes (ImageNet-1K-like: 1,000 by
  default) lies at a random angle in ``id_spread_deg`` from its superclass centre; each of ``n_ood_classes``
  (ImageNet-21K-like: many more) is an ID parent class rotated by a planted angle drawn uniformly in
  ``[0, max_semantic_angle_deg]`` (``class_angle``; 0 for the ID classes).
- Covariate: a photo-like base ``c0`` (style 0); each of ``n_styles`` styles is ``c0`` rotated by a planted angle
  drawn uniformly in ``[0, max_covariate_angle_deg]`` (``style_angle``; 0 for style 0) towards its own direction.
- Modality cones: a text is ``normalise(text_cone * g_text + z @ M.T)`` and an image
  ``normalise(image_cone * g_image + z' @ M.T + noise)`` with ``g_text``, ``g_image`` orthogonal unit axes; the
  class and style vectors are drawn orthogonal to the axes' parts in each half, so content moves across the gap,
  never along it (one constant gap vector, as in CLIP). A text of (class, style) is deterministic (a CLIP encodes
  a string one way); it carries a small per-class nudge of its covariate part and a per-style nudge of its
  semantic part (``text_cross_talk``: a label changes how a style renders). An image of (class, style) adds
  intra-class and style jitter and noise. The defaults give a caption and its own image a cosine of about 0.3,
  two texts about 0.75 and two images about 0.6 (:func:`modality_cosines`); a prompt's nearest distance to the
  ID images then lies beyond nearly every image's.

Planted levels: ``class_level`` / ``style_level`` are the planted angles cut into ``n_levels`` equal-width
intervals over ``[0, max angle]``. Everything here is numpy; the same spec gives the same arrays.
"""
from __future__ import annotations

from dataclasses import asdict, dataclass, field

import numpy as np

from isood.core.errors import BadInputError
from isood.science.simulate import random_orthogonal

__all__ = ["ClipWorldSpec", "ClipWorld", "make_clip_world", "modality_cosines"]


def _unit(x: np.ndarray) -> np.ndarray:
    return x / np.linalg.norm(x, axis=-1, keepdims=True)


def _draw(rng: np.random.Generator, n: int, gap: np.ndarray) -> np.ndarray:
    """``n`` standard normal rows orthogonal to the rows of ``gap`` (orthonormal): content moves across the
    modality gap, never along it (the gap is one constant vector per modality, as in CLIP)."""
    x = rng.standard_normal((n, gap.shape[1]))
    return x - (x @ gap.T) @ gap


def _rotate_towards(base: np.ndarray, angles: np.ndarray, rng: np.random.Generator, gap: np.ndarray) -> np.ndarray:
    """Rotate unit rows of ``base`` by ``angles`` (radians) towards random directions orthogonal to each row
    (and to ``gap``)."""
    u = _draw(rng, base.shape[0], gap)
    u -= np.sum(u * base, axis=1, keepdims=True) * base
    return np.cos(angles)[:, None] * base + np.sin(angles)[:, None] * _unit(u)


@dataclass(frozen=True)
class ClipWorldSpec:
    """The parameters of a CLIP-like world (module docstring), checked on construction. The defaults are
    ImageNet-sized (1,000 ID classes, 10,000 OOD classes, D = 512); tests pass smaller counts."""

    dim: int = 512
    n_levels: int = 8
    n_id_classes: int = 1000
    n_ood_classes: int = 10000
    n_superclasses: int = 100
    n_styles: int = 100
    id_spread_deg: tuple[float, float] = (40.0, 70.0)
    max_semantic_angle_deg: float = 90.0
    max_covariate_angle_deg: float = 90.0
    semantic_weight: float = 1.0
    covariate_weight: float = 0.7
    text_cone: float = 2.0
    image_cone: float = 1.4
    text_cross_talk: float = 0.25
    image_noise: float = 0.35
    intra_class_noise: float = 0.45
    style_jitter: float = 0.25
    seed: int = 0

    def __post_init__(self) -> None:
        if self.dim < 8 or self.dim % 2:
            raise BadInputError(f"make_clip_world: dim must be even and >= 8, got {self.dim}")
        for name in ("n_levels", "n_id_classes", "n_superclasses", "n_styles"):
            if int(getattr(self, name)) < 2:
                raise BadInputError(f"make_clip_world: {name} must be >= 2, got {getattr(self, name)}")
        if self.n_ood_classes < 0:
            raise BadInputError(f"make_clip_world: n_ood_classes must be >= 0, got {self.n_ood_classes}")
        lo, hi = self.id_spread_deg
        if not 0 <= lo <= hi <= 90:
            raise BadInputError(f"make_clip_world: id_spread_deg must be 0 <= lo <= hi <= 90, got {self.id_spread_deg}")

    @property
    def half(self) -> int:
        return self.dim // 2


def _levels(angles: np.ndarray, max_deg: float, n_levels: int) -> np.ndarray:
    """Planted levels: angles cut into ``n_levels`` equal-width intervals over [0, max]."""
    width = np.deg2rad(max_deg) / n_levels
    return np.minimum((angles / width).astype(np.int64), n_levels - 1) if width > 0 else np.zeros_like(angles, int)


@dataclass(frozen=True, eq=False)
class ClipWorld:
    """A CLIP-like world (module docstring): the planted factors and the two feature generators."""

    spec: ClipWorldSpec
    mixing: np.ndarray          # (D, D) orthogonal M: feature = latent @ M.T; the ideal LAID W
    text_axis: np.ndarray       # (D,) unit axis of the text cone
    image_axis: np.ndarray      # (D,) unit axis of the image cone, orthogonal to text_axis
    classes: np.ndarray         # (n_id + n_ood, D/2) unit semantic vectors, the ID classes first
    class_parent: np.ndarray    # (n_id + n_ood,) the ID class an OOD class derives from (itself for an ID class)
    class_angle: np.ndarray     # (n_id + n_ood,) planted semantic shift (radians; 0 for ID classes)
    styles: np.ndarray          # (n_styles, D/2) unit covariate vectors, style 0 = the photo base
    style_angle: np.ndarray     # (n_styles,) planted covariate shift (radians from the photo base)
    text_style_nudge: np.ndarray  # (n_styles, D/2) semantic nudge of a style's texts
    text_class_nudge: np.ndarray  # (n_id + n_ood, D/2) covariate nudge of a class's texts
    config: dict = field(default_factory=dict)

    @property
    def n_id_classes(self) -> int:
        return self.spec.n_id_classes

    @property
    def id_classes(self) -> np.ndarray:
        return np.arange(self.spec.n_id_classes)

    @property
    def ood_classes(self) -> np.ndarray:
        return np.arange(self.spec.n_id_classes, len(self.classes))

    @property
    def class_level(self) -> np.ndarray:
        """Planted semantic level of every class (0 for the ID classes)."""
        return _levels(self.class_angle, self.spec.max_semantic_angle_deg, self.spec.n_levels)

    @property
    def style_level(self) -> np.ndarray:
        """Planted covariate level of every style (0 for the photo base)."""
        return _levels(self.style_angle, self.spec.max_covariate_angle_deg, self.spec.n_levels)

    @property
    def semantic_basis(self) -> np.ndarray:
        """(D, D/2): the planted semantic subspace (first half of M's columns)."""
        return self.mixing[:, :self.spec.half].copy()

    def _latent(self, sem: np.ndarray, cov: np.ndarray) -> np.ndarray:
        s = self.spec
        return np.concatenate([s.semantic_weight * sem, s.covariate_weight * cov], axis=1) @ self.mixing.T

    def _check(self, classes, styles) -> tuple[np.ndarray, np.ndarray]:
        c = np.asarray(classes, dtype=np.int64).ravel()
        st = np.asarray(styles, dtype=np.int64).ravel()
        if c.shape != st.shape:
            raise BadInputError(f"ClipWorld: {c.size} classes but {st.size} styles; pass one of each per row")
        if c.size and (c.min() < 0 or c.max() >= len(self.classes) or st.min() < 0 or st.max() >= len(self.styles)):
            raise BadInputError(f"ClipWorld: classes must be in 0..{len(self.classes) - 1} and styles in "
                                f"0..{len(self.styles) - 1}")
        return c, st

    def texts(self, classes, styles) -> np.ndarray:
        """Text features (float32, L2-normalised) of the prompts "style s of class c", row by row; deterministic."""
        c, st = self._check(classes, styles)
        s = self.spec
        sem = _unit(self.classes[c] + s.text_cross_talk * self.text_style_nudge[st])
        cov = _unit(self.styles[st] + s.text_cross_talk * self.text_class_nudge[c])
        return _unit(s.text_cone * self.text_axis + self._latent(sem, cov)).astype(np.float32)

    def images(self, classes, styles, *, seed: int = 0) -> np.ndarray:
        """Image features (float32, L2-normalised) of images of class c in style s, row by row (``seed``: their
        intra-class, style and image noise)."""
        c, st = self._check(classes, styles)
        s, rng = self.spec, np.random.default_rng([self.spec.seed, 2, int(seed)])
        sem = _unit(self.classes[c] + rng.standard_normal((c.size, s.half)) * (s.intra_class_noise / np.sqrt(s.half)))
        cov = _unit(self.styles[st] + rng.standard_normal((c.size, s.half)) * (s.style_jitter / np.sqrt(s.half)))
        f = (s.image_cone * self.image_axis + self._latent(sem, cov)
             + rng.standard_normal((c.size, s.dim)) * (s.image_noise / np.sqrt(s.dim)))
        return _unit(f).astype(np.float32)

    def id_images(self, per_class: int = 2, *, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
        """``(features, class)``: ``per_class`` photo-like (style 0) images of every ID class."""
        classes = np.repeat(self.id_classes, int(per_class))
        return self.images(classes, np.zeros_like(classes), seed=seed), classes

    def test_images(self, n: int, *, seed: int = 1, id_share: float = 0.2) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """``(features, class, style)``: ``n`` images, a share ``id_share`` of ID classes and the rest of OOD
        classes (uniformly), each in a uniformly drawn style."""
        rng = np.random.default_rng([self.spec.seed, 3, int(seed)])
        n = int(n)
        n_id = int(round(n * id_share)) if len(self.ood_classes) else n
        classes = np.concatenate([rng.choice(self.id_classes, n_id),
                                  rng.choice(self.ood_classes, n - n_id) if n > n_id else np.empty(0, np.int64)])
        styles = rng.integers(0, len(self.styles), n)
        return self.images(classes, styles, seed=seed), classes, styles


def build_clip_world(spec: ClipWorldSpec) -> ClipWorld:
    """The CLIP-like world of ``spec`` (module docstring)."""
    rng = np.random.default_rng(spec.seed)
    h = spec.half
    M = random_orthogonal(spec.dim, rng)
    # the two cone axes, orthonormal, drawn in latent coordinates (half semantic, half covariate)
    latent_axes = np.linalg.qr(rng.standard_normal((spec.dim, 2)))[0].T
    axes = latent_axes @ M.T
    gap_sem = np.linalg.qr(latent_axes[:, :h].T)[0].T   # content is drawn orthogonal to the gap in each half
    gap_cov = np.linalg.qr(latent_axes[:, h:].T)[0].T
    supers = _unit(_draw(rng, spec.n_superclasses, gap_sem))
    super_of = rng.integers(0, spec.n_superclasses, spec.n_id_classes)
    spread = np.deg2rad(rng.uniform(*spec.id_spread_deg, spec.n_id_classes))
    id_cls = _rotate_towards(supers[super_of], spread, rng, gap_sem)
    parent = np.concatenate([np.arange(spec.n_id_classes), rng.integers(0, spec.n_id_classes, spec.n_ood_classes)])
    angle = np.concatenate([np.zeros(spec.n_id_classes),
                            rng.uniform(0, np.deg2rad(spec.max_semantic_angle_deg), spec.n_ood_classes)])
    ood_cls = _rotate_towards(id_cls[parent[spec.n_id_classes:]], angle[spec.n_id_classes:], rng, gap_sem)
    c0 = _unit(_draw(rng, 1, gap_cov))
    style_angle = np.concatenate([[0.0], rng.uniform(0, np.deg2rad(spec.max_covariate_angle_deg), spec.n_styles - 1)])
    styles = _rotate_towards(np.repeat(c0, spec.n_styles, axis=0), style_angle, rng, gap_cov)
    n_classes = spec.n_id_classes + spec.n_ood_classes
    return ClipWorld(
        spec=spec, mixing=M, text_axis=axes[0], image_axis=axes[1], classes=np.concatenate([id_cls, ood_cls]),
        class_parent=parent, class_angle=angle, styles=styles, style_angle=style_angle,
        text_style_nudge=_unit(_draw(rng, spec.n_styles, gap_sem)),
        text_class_nudge=_unit(_draw(rng, n_classes, gap_cov)), config=asdict(spec))


def make_clip_world(**kw) -> ClipWorld:
    """A CLIP-like world: :class:`ClipWorldSpec`'s fields as keywords (e.g. ``make_clip_world(dim=64,
    n_id_classes=200, n_ood_classes=800, n_styles=40)`` for a test)."""
    return build_clip_world(ClipWorldSpec(**kw))


def modality_cosines(world: ClipWorld, n: int = 400, *, seed: int = 0) -> dict[str, float]:
    """Mean cosines measured on ``n`` random (class, style) pairs: ``caption_image`` (a text and an image of the
    same class and style), ``text_text`` and ``image_image`` (two different random pairs each)."""
    rng = np.random.default_rng([world.spec.seed, 4, int(seed)])
    c = rng.integers(0, len(world.classes), (2, n))
    st = rng.integers(0, len(world.styles), (2, n))
    t0, t1 = world.texts(c[0], st[0]), world.texts(c[1], st[1])
    i0, i1 = world.images(c[0], st[0], seed=seed), world.images(c[1], st[1], seed=seed + 1)
    return {"caption_image": float(np.mean(np.sum(t0 * i0, axis=1))),
            "text_text": float(np.mean(np.sum(t0 * t1, axis=1))),
            "image_image": float(np.mean(np.sum(i0 * i1, axis=1)))}
