"""The edges Syn-IS bins its prompts with (pure): the prompts' own, the image splits', or the splits' moved across
the text-to-image gap; and the check that the chosen edges spread the prompts over the grid.

A prompt's shift is a CLIP *text*-to-image distance; a splits manifest's edges are image-to-image distances, on
another scale (CLIP's modality gap: a caption and its own image have a cosine of about 0.3, two images of
anything more). On the splits' edges most prompts lie beyond the top edge and fill one cell. The modes
(``--prompt-edges``):

- ``prompts`` (default; the release's Syn-IS fills every cell): ``n_levels`` equal-width levels over the
  prompts' own clipped range, ``isood.science.grid.assign_levels`` with the grid's quantile clip (the splits' when
  given).
- ``splits``: the splits' edges as they are (prompts and images share intervals, whatever the scale).
- ``calibrated``: the splits' edges moved, per axis, by ``offset = median(prompt distances) -
  median(splits images' distances)``; a prompt of distance ``d`` gets the splits level of ``d - offset``. The
  edges recorded are the moved ones, on the prompts' scale, so they bin the recorded ``d_sem`` / ``d_cov``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Sequence

import numpy as np

from isood.core.defaults import QUANTILE_CLIP
from isood.core.errors import BadInputError
from isood.science.grid import bin_with_edges, level_edges

__all__ = ["PROMPT_EDGE_MODES", "PromptEdges", "choose_edges", "spread_warnings", "CROWDED_SHARE"]

#: The ``--prompt-edges`` modes (module docstring), the default first.
PROMPT_EDGE_MODES = ("prompts", "splits", "calibrated")
#: A warning is raised when more than this share of the prompts lies outside the edges, or in one cell.
CROWDED_SHARE = 0.25


@dataclass(frozen=True)
class PromptEdges:
    """The edges used (``sem``, ``cov``: n_levels + 1 each, on the prompts' scale), how they were chosen
    (``mode``, the quantile ``clip`` of the prompts mode, the per-axis ``offset`` of the calibrated one)."""

    mode: str
    sem: np.ndarray
    cov: np.ndarray
    clip: tuple[float, float] | None = None
    offset: dict[str, float] = field(default_factory=dict)

    def as_config(self) -> dict:
        """What the manifest records (JSON)."""
        return {"mode": self.mode, "clip": list(self.clip) if self.clip is not None else None,
                "offset": dict(self.offset), "sem": [float(x) for x in self.sem],
                "cov": [float(x) for x in self.cov]}


def _median(values: np.ndarray, what: str) -> float:
    v = np.asarray(values, dtype=np.float64)
    v = v[np.isfinite(v)]
    if v.size == 0:
        raise BadInputError(f"--prompt-edges calibrated needs measured {what} distances; the --splits manifest "
                            "has none (an import?): pass --prompt-edges prompts")
    return float(np.median(v))


def choose_edges(d_sem, d_cov, *, mode: str, n_levels: int, clip: Sequence[float] = QUANTILE_CLIP,
                 splits_edges: tuple[np.ndarray, np.ndarray] | None = None,
                 splits_distances: tuple[np.ndarray, np.ndarray] | None = None) -> PromptEdges:
    """The edges of ``mode`` (module docstring) for prompts of distances ``d_sem``, ``d_cov``. ``splits_edges``:
    the splits' (sem, cov) edges (modes ``splits`` and ``calibrated``); ``splits_distances``: the splits images'
    (d_sem, d_cov) (mode ``calibrated``)."""
    if mode not in PROMPT_EDGE_MODES:
        raise BadInputError(f"--prompt-edges {mode!r}: pass one of {', '.join(PROMPT_EDGE_MODES)}")
    if mode == "prompts":
        lo, hi = (float(c) for c in clip)
        return PromptEdges(mode, level_edges(d_sem, n_levels, clip=(lo, hi)), level_edges(d_cov, n_levels,
                                                                                        clip=(lo, hi)), (lo, hi))
    if splits_edges is None:
        raise BadInputError(f"--prompt-edges {mode} bins on an image-splits manifest's edges: pass --splits DIR "
                            "(or --prompt-edges prompts)")
    sem, cov = (np.asarray(e, dtype=np.float64) for e in splits_edges)
    if mode == "splits":
        return PromptEdges(mode, sem, cov)
    if splits_distances is None:
        raise BadInputError("--prompt-edges calibrated needs the splits images' distances; pass --splits DIR")
    offset = {"sem": _median(d_sem, "prompt d_sem") - _median(splits_distances[0], "d_sem"),
              "cov": _median(d_cov, "prompt d_cov") - _median(splits_distances[1], "d_cov")}
    return PromptEdges(mode, sem + offset["sem"], cov + offset["cov"], offset=offset)


def spread_warnings(d_sem, d_cov, edges: PromptEdges) -> list[str]:
    """One line for each way the edges fail to spread the prompts: more than ``CROWDED_SHARE`` (a quarter) of
    them outside the edges (on either axis; not in the ``prompts`` mode, whose clipped tails are the rule: they
    fold into the end levels), or in one cell (on a grid of fewer than 8 cells, where a quarter is
    a cell's even share: more than twice that share)."""
    d_sem, d_cov = np.asarray(d_sem, dtype=np.float64), np.asarray(d_cov, dtype=np.float64)
    n = len(d_sem)
    if n == 0:
        return []
    out: list[str] = []
    outside = ((d_sem < edges.sem[0]) | (d_sem > edges.sem[-1]) | (d_cov < edges.cov[0]) | (d_cov > edges.cov[-1]))
    hint = ("" if edges.mode == "prompts" else
            "; prompt distances are text-to-image, on another scale than the splits' (pass --prompt-edges prompts)")
    if edges.mode != "prompts" and outside.mean() > CROWDED_SHARE:  # the prompts' own tails are folded in by rule
        out.append(f"{int(outside.sum())} of {n} prompts ({outside.mean():.0%}) lie outside the {edges.mode} edges "
                   f"(sem {edges.sem[0]:.3g}..{edges.sem[-1]:.3g}, cov {edges.cov[0]:.3g}..{edges.cov[-1]:.3g}; "
                   f"prompts sem {np.nanmin(d_sem):.3g}..{np.nanmax(d_sem):.3g}, cov "
                   f"{np.nanmin(d_cov):.3g}..{np.nanmax(d_cov):.3g}){hint}")
    cells = bin_with_edges(d_cov, edges.cov) * (len(edges.sem) - 1) + bin_with_edges(d_sem, edges.sem)
    values, counts = np.unique(cells, return_counts=True)
    top = int(np.argmax(counts))
    if counts[top] / n > max(CROWDED_SHARE, 2 / (len(edges.sem) - 1) ** 2):  # a small grid: twice a cell's share
        c, s = divmod(int(values[top]), len(edges.sem) - 1)
        out.append(f"{int(counts[top])} of {n} prompts ({counts[top] / n:.0%}) fall in one cell (cov_{c}_sem_{s}) "
                   f"with the {edges.mode} edges{hint}")
    return out
