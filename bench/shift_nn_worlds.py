"""Two CLIP-like feature generators for the level-agreement benchmark of ``bench/shift_nn.py --levels``, written
here (not in the package) so that the approximate search is measured on data it was never tuned on.

- :func:`clip_world` ("clip"): dim 256 (a LAID half), ~1,000 reference classes with 200 images each (200k rows);
  an image is ``normalise(cone + class centre + style direction + noise)``: a shared cone direction (CLIP's
  embeddings live in a narrow cone), unit class centres, one of 80 shared style directions (the covariate
  factor), isotropic noise. Queries: images of 1,000 other classes (each a mix of a reference class and a fresh
  direction, from near to far) with the shared styles and some new ones, plus new images of reference classes.
- :func:`heavy_world` ("heavy"): another structure the search never saw: dim 384, class sizes from a Zipf law
  (a few classes with thousands of images, most with a handful), anisotropic noise (a power-law spectrum in a
  random basis, different per super-class), a two-level hierarchy (super-classes -> classes), and queries that
  are perturbed reference images, images of held-out classes of known super-classes, and far images of new
  super-classes.

Both return ``(reference, queries)``: float32 unit rows.
"""
from __future__ import annotations

import numpy as np

__all__ = ["WORLDS", "clip_world", "heavy_world"]


def _unit(x: np.ndarray) -> np.ndarray:
    x /= np.linalg.norm(x, axis=1, keepdims=True)
    return x.astype(np.float32, copy=False)


def _blocks(n: int, make, block: int = 50_000) -> np.ndarray:
    return np.concatenate([make(min(block, n - s)) for s in range(0, n, block)]) if n else np.empty((0, 0))


def clip_world(n_ref: int, n_query: int, *, dim: int = 256, n_classes: int = 1_000, n_styles: int = 80,
               seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """The "clip" generator (module docstring)."""
    rng = np.random.default_rng(seed)
    cone = _unit(rng.standard_normal((1, dim)))[0] * 1.2
    centres = _unit(rng.standard_normal((n_classes, dim)))
    styles = _unit(rng.standard_normal((n_styles + n_styles // 4, dim)))
    shared, novel = styles[:n_styles], styles[n_styles:]
    noise, style_w = 0.75, 0.45

    def images(centre: np.ndarray, style: np.ndarray) -> np.ndarray:
        n = len(centre)
        w = style_w * rng.uniform(0.3, 1.5, (n, 1))
        eps = rng.standard_normal((n, dim)) * (noise / np.sqrt(dim))
        return _unit(cone + centre + w * style + eps)

    per = rng.permutation(np.arange(n_ref) % n_classes)  # 200 images per class at 200k rows
    ref = np.concatenate([images(centres[per[s:s + 50_000]], shared[rng.integers(0, n_styles, len(per[s:s + 50_000]))])
                          for s in range(0, n_ref, 50_000)])
    # queries: 1,000 new classes, each a mix of a reference class and a fresh direction (near .. far)
    n_new = n_classes
    base = rng.integers(0, n_classes, n_new)
    mix = rng.uniform(0.0, 1.0, (n_new, 1)) ** 1.5
    fresh = _unit(rng.standard_normal((n_new, dim)))
    new_centres = _unit(mix * centres[base] + np.sqrt(1 - mix ** 2) * fresh)

    def queries(n: int) -> np.ndarray:
        known = rng.random(n) < 0.15  # new images of reference classes
        cls = np.where(known, rng.integers(0, n_classes, n), -1)
        centre = np.where(known[:, None], centres[np.maximum(cls, 0)], new_centres[rng.integers(0, n_new, n)])
        use_novel = rng.random(n) < 0.2
        style = np.where(use_novel[:, None], novel[rng.integers(0, len(novel), n)], shared[rng.integers(0, n_styles, n)])
        return images(centre, style)

    return ref, _blocks(n_query, queries)


def heavy_world(n_ref: int, n_query: int, *, dim: int = 384, n_super: int = 60, n_classes: int = 1_500,
                seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """The "heavy" generator (module docstring)."""
    rng = np.random.default_rng(seed + 1000)
    supers = _unit(rng.standard_normal((n_super, dim)))
    parent = rng.integers(0, n_super, n_classes)
    spread = rng.uniform(0.5, 1.1, (n_classes, 1))
    centres = _unit(supers[parent] + spread * _unit(rng.standard_normal((n_classes, dim))))
    sizes = rng.zipf(1.6, n_classes).astype(np.float64)
    sizes = np.minimum(sizes, 50 * np.median(sizes))
    counts = np.maximum(1, np.floor(sizes / sizes.sum() * n_ref)).astype(int)
    counts[np.argmax(counts)] += n_ref - counts.sum()
    labels = rng.permutation(np.repeat(np.arange(n_classes), counts))
    # anisotropic noise: a power-law spectrum in a random basis per super-class (8 bases, shared)
    bases = [np.linalg.qr(rng.standard_normal((dim, dim)))[0].astype(np.float32) for _ in range(8)]
    scale = (np.arange(1, dim + 1) ** -0.8).astype(np.float32)
    scale *= 0.9 / np.sqrt((scale ** 2).sum())

    def images(centre: np.ndarray, sup: np.ndarray, amp: np.ndarray) -> np.ndarray:
        out = np.empty((len(centre), dim), np.float32)
        for b in range(8):
            m = sup % 8 == b
            if m.any():
                eps = (rng.standard_normal((int(m.sum()), dim)).astype(np.float32) * scale) @ bases[b].T
                out[m] = centre[m] + amp[m] * eps
        return _unit(out)

    ref = np.concatenate([images(centres[labels[s:s + 50_000]], parent[labels[s:s + 50_000]],
                                 rng.uniform(0.7, 1.3, (len(labels[s:s + 50_000]), 1)).astype(np.float32))
                          for s in range(0, n_ref, 50_000)])
    held = _unit(supers[rng.integers(0, n_super, 500)] + rng.uniform(0.5, 1.1, (500, 1))
                 * _unit(rng.standard_normal((500, dim))))
    far = _unit(rng.standard_normal((200, dim)))

    def queries(n: int) -> np.ndarray:
        kind = rng.choice(3, n, p=[0.25, 0.5, 0.25])
        centre = np.empty((n, dim), np.float32)
        sup = rng.integers(0, n_super, n)
        i0 = rng.integers(0, n_ref, n)
        centre[kind == 0] = ref[i0[kind == 0]]
        i1 = rng.integers(0, 500, n)
        centre[kind == 1] = held[i1[kind == 1]]
        centre[kind == 2] = far[rng.integers(0, 200, n)[kind == 2]]
        amp = np.where(kind[:, None] == 0, rng.uniform(0.2, 0.6, (n, 1)), rng.uniform(0.7, 1.4, (n, 1)))
        return images(centre, sup, amp.astype(np.float32))

    return ref, _blocks(n_query, queries)


WORLDS = {"clip": clip_world, "heavy": heavy_world}
