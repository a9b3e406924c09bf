"""Syn-IS prompts: labels x styles -> prompts with stable ids, binned by their shift to the ID images.

IS-OOD's synthetic set puts covariate shifts ImageNet-21K lacks (styles) on its labels. A prompt is a style
template applied to a label; its shift is measured like an image's (IS-OOD, Sec. Syn-IS): the prompt's CLIP
text feature goes through LAID and D_sem / D_cov are the nearest cosine distances to the ID image features
(:func:`isood.features.shift.shift_distances`). Prompts are binned with the grid's levels (on edges
given, else their own: ``isood.stages.syn.edges`` chooses) and ``K`` prompts are sampled per cell; each
sampled prompt expands to ``M`` planned images with their own seeds and paths.

Every function here is pure (tables in, tables out). Labels come from :func:`isood.features.labels.load_labels`.
"""

from __future__ import annotations

import hashlib
import re
from typing import Sequence

import numpy as np
import pandas as pd

from generation.styles import Style
from isood.core.defaults import N_LEVELS
from isood.core.errors import BadInputError
from isood.science.grid import assign_levels, bin_with_edges, cell_names

__all__ = ["PROMPT_COLUMNS", "prompt_id", "build_prompts", "apply_blocklist", "bin_prompts", "sample_per_cell",
           "image_seed", "style_slug", "expand_images"]

PROMPT_COLUMNS = ["prompt_id", "style", "wnid", "label", "prompt", "negative_prompt"]


# --------------------------------------------------------------------------------------------- prompts
def prompt_id(style: str, wnid: str, label: str) -> str:
    """Stable 16-hex id of (style name, wnid or, without one, label)."""
    key = wnid if wnid else f"label:{label}"
    return hashlib.sha256(f"{style}\x1f{key}".encode()).hexdigest()[:16]


def build_prompts(labels: pd.DataFrame, styles: Sequence[Style]) -> pd.DataFrame:
    """Every style x label: PROMPT_COLUMNS, ordered style-major (styles in order, then labels in order)."""
    if labels is None or len(labels) == 0:
        raise BadInputError("the label set is empty; pass --labels 21k, a class-filter manifest, or a file of wnids/labels")
    if not styles:
        raise BadInputError("no styles; pass --styles sdxl or a style file")
    rows = []
    for st in styles:
        for wnid, label in zip(labels["wnid"], labels["label"]):
            p, neg = st.apply(label)
            rows.append((prompt_id(st.name, wnid, label), st.name, wnid, label, p, neg))
    df = pd.DataFrame.from_records(rows, columns=PROMPT_COLUMNS)
    return df.drop_duplicates("prompt_id").reset_index(drop=True)


def apply_blocklist(prompts: pd.DataFrame, blocklist) -> tuple[pd.DataFrame, pd.DataFrame]:
    """Split prompts into (kept, rejected); rejected rows get ``reason`` = 'blocklist: <term>'."""
    hits = [blocklist.match(p) for p in prompts["prompt"]]
    mask = np.array([h is not None for h in hits], dtype=bool)
    rejected = prompts.loc[mask].copy()
    rejected["reason"] = [f"blocklist: {h}" for h in hits if h is not None]
    return prompts.loc[~mask].reset_index(drop=True), rejected.reset_index(drop=True)


# --------------------------------------------------------------------------------------------- binning
def _levels(values: np.ndarray, n_levels: int, edges, axis: str) -> tuple[np.ndarray, np.ndarray]:
    if edges is None:
        return assign_levels(values, n_levels)
    edges = np.asarray(edges, dtype=np.float64)
    if len(edges) - 1 != n_levels:
        raise BadInputError(f"bin_prompts: n_levels={n_levels} does not match {len(edges)} {axis} edges; pass "
                            "n_levels=len(edges)-1")
    return bin_with_edges(values, edges), edges


def bin_prompts(prompts: pd.DataFrame, d_sem, d_cov, *, n_levels: int = N_LEVELS, sem_edges=None,
                cov_edges=None) -> tuple[pd.DataFrame, np.ndarray, np.ndarray]:
    """Attach d_sem, d_cov, sem_level, cov_level and cell to the prompts (``isood.science.grid``'s levels).

    With edges (from the image splits) the prompts are binned into the same intervals
    (``isood.science.grid.bin_with_edges``); without, the edges are equal-width over the prompts' own clipped range
    (``isood.science.grid.assign_levels``). Returns ``(table, sem_edges, cov_edges)``.
    """
    d_sem = np.asarray(d_sem, dtype=np.float64)
    d_cov = np.asarray(d_cov, dtype=np.float64)
    if not (len(d_sem) == len(d_cov) == len(prompts)):
        raise BadInputError(f"bin_prompts: {len(prompts)} prompts but {len(d_sem)}/{len(d_cov)} distances")
    sem_levels, sem_edges = _levels(d_sem, n_levels, sem_edges, "sem")
    cov_levels, cov_edges = _levels(d_cov, n_levels, cov_edges, "cov")
    out = prompts.copy()
    out["d_sem"] = d_sem
    out["d_cov"] = d_cov
    out["sem_level"] = np.asarray(sem_levels, dtype=np.int64)
    out["cov_level"] = np.asarray(cov_levels, dtype=np.int64)
    out["cell"] = cell_names(out["cov_level"], out["sem_level"])
    return out, np.asarray(sem_edges, dtype=np.float64), np.asarray(cov_edges, dtype=np.float64)


def sample_per_cell(binned: pd.DataFrame, k: int, *, seed: int = 0) -> pd.DataFrame:
    """Up to ``k`` prompts per cell, drawn without replacement by a generator seeded from (seed, cell).

    Independent of the input row order (rows are sorted by prompt id first) and of the other cells' contents.
    Returned sorted by (cov_level, sem_level, prompt_id).
    """
    if k < 1:
        raise BadInputError(f"--per-cell must be >= 1, got {k}")
    ordered = binned.sort_values("prompt_id", kind="stable")
    picks = []
    for (c, s), group in ordered.groupby(["cov_level", "sem_level"], sort=True):
        if len(group) <= k:
            picks.append(group)
            continue
        rng = np.random.default_rng(np.random.SeedSequence([int(seed), int(c), int(s)]))
        idx = np.sort(rng.choice(len(group), size=k, replace=False))
        picks.append(group.iloc[idx])
    if not picks:
        return binned.iloc[0:0].copy()
    out = pd.concat(picks)
    return out.sort_values(["cov_level", "sem_level", "prompt_id"], kind="stable").reset_index(drop=True)


# --------------------------------------------------------------------------------------------- images
def image_seed(global_seed: int, pid: str, index: int) -> int:
    """Seed of one image: 63 bits of SHA-256 over (global seed, prompt id, image index)."""
    digest = hashlib.sha256(f"{int(global_seed)}\x1f{pid}\x1f{int(index)}".encode()).digest()
    return int.from_bytes(digest[:8], "big") >> 1


def style_slug(name: str) -> str:
    """A style name as a folder name (letters, digits, ``._-``)."""
    return re.sub(r"[^A-Za-z0-9._-]+", "-", name).strip("-.") or "style"


def expand_images(prompts: pd.DataFrame, images_per_prompt: int, *, seed: int = 0) -> pd.DataFrame:
    """One row per image to generate: the prompt's columns + image_index, seed, path (images/<style>/<id>_<i>.png)."""
    if images_per_prompt < 1:
        raise BadInputError(f"--images-per-prompt must be >= 1, got {images_per_prompt}")
    reps = prompts.loc[prompts.index.repeat(images_per_prompt)].reset_index(drop=True)
    reps["image_index"] = np.tile(np.arange(images_per_prompt, dtype=np.int64), len(prompts))
    reps["seed"] = [image_seed(seed, p, i) for p, i in zip(reps["prompt_id"], reps["image_index"])]
    reps["seed"] = reps["seed"].astype(np.int64)
    reps["path"] = [
        f"images/{style_slug(st)}/{p}_{i}.png" for st, p, i in zip(reps["style"], reps["prompt_id"], reps["image_index"])
    ]
    return reps
