"""A mosaic of a shift grid: k sampled thumbnails per cell (matplotlib, Agg; ``Figure``, never pyplot).

How a researcher checks a benchmark by eye (the IS-OOD paper's first figure and its Syn-IS figure): semantic
level on the x axis (0 left), covariate level on the y axis (0 at the bottom), each cell a panel of up to
``per_cell`` thumbnails of ``size`` x ``size`` pixels (centre-cropped, ``PIL.ImageOps.fit``) laid out row by row.
An N/A cell (the manifest's ``cells`` table: fewer images than its N/A threshold; with a ``source`` column, N/A in
every source) is a grey panel labelled ``N/A (n=..)`` and shows no image; a cell left out by ``cells`` is a pale
empty panel. The axes are labelled by level and, when the manifest's ``edges`` are finite, by each level's
distance interval (``[lower, upper)``).

- ``sample_cells``: the paths each cell shows, drawn without replacement by ``numpy.random.default_rng((seed,
  cov, sem))`` from the cell's rows sorted by path: one seed gives one figure, and a cell shows the same images
  whichever other cells are drawn.
- ``mosaic_figure``: the figure from the thumbnails (pure: arrays in, a ``Figure`` out). The canvas is shown at
  one figure pixel per image pixel at ``DPI`` (no resampling); the cell (cov, sem) is centred on the data point
  (sem, cov) of the figure's axes and spans +-0.5 around it.
- ``grid_mosaic``: both, for a grid manifest's typed view (``isood.kinds.GridView``) and the folder its image
  paths are relative to; ``mosaic_files``: its PNG and PDF bytes (``MOSAIC_PNG``, ``MOSAIC_PDF``; identical
  input, identical bytes); ``grid_mosaics``: the small mosaics of an evaluation's grids (``mosaic_name``), which
  ``report.render_html`` shows per dataset.
"""

from __future__ import annotations

import math
import os
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Mapping, Sequence

import numpy as np
import pandas as pd
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.colors import to_rgb
from matplotlib.figure import Figure

from isood.core.defaults import MOSAIC_PDF, MOSAIC_PER_CELL, MOSAIC_PNG, MOSAIC_SIZE
from isood.core.errors import BadInputError, IsoodError
from isood.science.grid import cell_name
from isood.kinds import SPLITS, SYN_IS

from .plots import DPI, NA_COLOR, figure_bytes

__all__ = ["MOSAIC_PNG", "MOSAIC_PDF", "DEFAULT_PER_CELL", "DEFAULT_SIZE", "MosaicGrid", "grid_of", "parse_cells",
           "sample_cells", "read_thumbnail", "mosaic_figure", "grid_mosaic", "mosaic_files",
           "missing_images", "mosaic_name", "grid_mosaics", "image_root_of", "card_mosaic", "REPORT_PER_CELL", "REPORT_SIZE"]

DEFAULT_PER_CELL, DEFAULT_SIZE = MOSAIC_PER_CELL, MOSAIC_SIZE
REPORT_PER_CELL, REPORT_SIZE = 2, 48  # the report's and the dataset card's mosaics: small
_PAD = 4  # pixels between panels
_MARGIN = {"left": 150, "right": 20, "bottom": 90, "top": 40}
_MIN_WIDTH = 560  # pixels: room for the title  # pixels around the canvas (labels, title)
_EMPTY_COLOR = "#f4f4f4"
_AXIS_TITLE = {"sem": "semantic shift level", "cov": "covariate shift level"}


@dataclass
class MosaicGrid:
    """What a mosaic draws: levels per axis, each cell's image count and N/A flag, the edges per axis (``n + 1``
    values, or None), and the sampled paths per cell."""

    n_levels: int
    counts: dict[tuple[int, int], int]  # (cov, sem) -> images
    na: set[tuple[int, int]]
    edges: dict[str, np.ndarray | None] = field(default_factory=dict)
    paths: dict[tuple[int, int], list[str]] = field(default_factory=dict)


def grid_of(images: pd.DataFrame, cells: pd.DataFrame | None, n_levels: int,
            edges: Mapping[str, np.ndarray | None] | None = None) -> MosaicGrid:
    """Counts and N/A cells of a grid: from ``cells`` (``cov_level``, ``sem_level``, ``n``, ``na``; summed over
    its ``source`` rows, N/A when N/A in every source), else from the ``images`` rows (no cell N/A)."""
    counts: dict[tuple[int, int], int] = {}
    na: set[tuple[int, int]] = set()
    if cells is not None and {"cov_level", "sem_level", "n", "na"} <= set(cells.columns):
        for (c, s), g in cells.groupby(["cov_level", "sem_level"]):
            counts[(int(c), int(s))] = int(g["n"].sum())
            if bool(g["na"].astype(bool).all()):
                na.add((int(c), int(s)))
    else:
        ok = images[(images["cov_level"] >= 0) & (images["sem_level"] >= 0)]
        for (c, s), n in ok.groupby(["cov_level", "sem_level"]).size().items():
            counts[(int(c), int(s))] = int(n)
    return MosaicGrid(n_levels=int(n_levels), counts=counts, na=na, edges=dict(edges or {}))


def parse_cells(text: str | Sequence[str] | None, n_levels: int) -> list[tuple[int, int]] | None:
    """``--cells``: None or 'all' (every cell), else cell names (``cov_{c}_sem_{s}``, comma-separated) as
    (cov, sem) pairs; a name outside the grid is one line naming the valid form."""
    if text is None:
        return None
    names = [t.strip() for t in (text.split(",") if isinstance(text, str) else text) if t.strip()]
    if names == ["all"]:
        return None
    valid = {cell_name(c, s): (c, s) for c in range(n_levels) for s in range(n_levels)}
    out = []
    for name in names:
        if name not in valid:
            raise BadInputError(f"--cells {name!r} is not a cell of this {n_levels}x{n_levels} grid: pass 'all' or "
                                f"names like {cell_name(0, 0)},{cell_name(n_levels - 1, n_levels - 1)}")
        out.append(valid[name])
    if not out:
        raise BadInputError("--cells names no cell: pass 'all' or cell names like cov_0_sem_0")
    return out


def sample_cells(images: pd.DataFrame, grid: MosaicGrid, *, per_cell: int, seed: int,
                 cells: Sequence[tuple[int, int]] | None = None) -> dict[tuple[int, int], list[str]]:
    """Up to ``per_cell`` paths of each wanted cell that is not N/A (module docstring: one rng per cell)."""
    wanted = [(c, s) for c in range(grid.n_levels) for s in range(grid.n_levels)] if cells is None else list(cells)
    groups = {(int(c), int(s)): g for (c, s), g in images.groupby(["cov_level", "sem_level"])}
    out: dict[tuple[int, int], list[str]] = {}
    for key in wanted:
        rows = groups.get(key)
        if key in grid.na or rows is None or rows.empty:
            continue
        paths = sorted(rows["path"].astype(str))
        rng = np.random.default_rng((int(seed), key[0], key[1]))
        pick = rng.choice(len(paths), size=min(per_cell, len(paths)), replace=False)
        out[key] = [paths[i] for i in pick]
    return out


def missing_images(root: str | os.PathLike, paths: Sequence[str]) -> list[str]:
    """The paths that are not files under ``root``."""
    return [p for p in paths if not (Path(root) / p).is_file()]


def read_thumbnail(path: str | os.PathLike, size: int) -> np.ndarray:
    """A ``size`` x ``size`` RGB thumbnail (uint8), centre-cropped to a square (``ImageOps.fit``); an unreadable
    file is one line naming it."""
    from PIL import ImageOps

    from isood.features.decoding import read_rgb

    try:
        im = read_rgb(path)
    except (OSError, ValueError) as e:
        raise BadInputError(f"cannot read image {path}: {e}; fix or remove it, or pass another --seed") from None
    return np.asarray(ImageOps.fit(im, (size, size)), dtype=np.uint8)


def _layout(per_cell: int) -> tuple[int, int]:
    cols = max(1, math.ceil(math.sqrt(per_cell)))
    return cols, max(1, math.ceil(per_cell / cols))


def _panel_pixels(per_cell: int, size: int) -> tuple[int, int]:
    cols, rows = _layout(per_cell)
    return cols * size + _PAD, rows * size + _PAD


def _level_labels(n: int, edges: np.ndarray | None) -> list[str]:
    if edges is None or len(edges) != n + 1 or not np.isfinite(edges).all():
        return [str(i) for i in range(n)]
    return [f"{i}\n[{edges[i]:.3g}, {edges[i + 1]:.3g})" for i in range(n)]


def mosaic_figure(grid: MosaicGrid, thumbs: Mapping[tuple[int, int], Sequence[np.ndarray]], *, per_cell: int,
                  size: int, cells: Sequence[tuple[int, int]] | None = None, title: str = "") -> Figure:
    """The mosaic (module docstring) of ``thumbs`` ((cov, sem) -> up to ``per_cell`` arrays of size x size x 3)."""
    n = grid.n_levels
    pw, ph = _panel_pixels(per_cell, size)
    cols, _ = _layout(per_cell)
    canvas = np.full((n * ph, n * pw, 3), 255, dtype=np.uint8)
    wanted = None if cells is None else set(cells)
    grey = (np.array(to_rgb(NA_COLOR)) * 255).round().astype(np.uint8)
    pale = (np.array(to_rgb(_EMPTY_COLOR)) * 255).round().astype(np.uint8)
    half = _PAD // 2
    for c in range(n):
        for s in range(n):
            top, left = (n - 1 - c) * ph + half, s * pw + half
            region = canvas[top:top + ph - _PAD, left:left + pw - _PAD]
            if (c, s) in grid.na:
                region[:] = grey
                continue
            if wanted is not None and (c, s) not in wanted or not thumbs.get((c, s)):
                region[:] = pale
                continue
            for i, t in enumerate(list(thumbs[(c, s)])[:per_cell]):
                r, q = divmod(i, cols)
                region[r * size:(r + 1) * size, q * size:(q + 1) * size] = t[:size, :size, :3]
    natural = n * pw + _MARGIN["left"] + _MARGIN["right"]
    width, height = max(natural, _MIN_WIDTH), n * ph + _MARGIN["bottom"] + _MARGIN["top"]
    left = _MARGIN["left"] + (width - natural) // 2
    fig = Figure(figsize=(width / DPI, height / DPI), dpi=DPI)
    FigureCanvasAgg(fig)
    ax = fig.add_axes((left / width, _MARGIN["bottom"] / height, n * pw / width, n * ph / height))
    ax.imshow(canvas, extent=(-0.5, n - 0.5, -0.5, n - 0.5), origin="upper", interpolation="nearest",
              aspect="auto")
    fontsize = 9 if n <= 8 else max(5, int(72 / n))
    for (c, s) in sorted(grid.na):
        ax.text(s, c, f"N/A\n(n={grid.counts.get((c, s), 0)})", ha="center", va="center", fontsize=fontsize,
                color="#444444")
    ax.set_xticks(range(n), _level_labels(n, grid.edges.get("sem")), fontsize=max(5, fontsize - 1))
    ax.set_yticks(range(n), _level_labels(n, grid.edges.get("cov")), fontsize=max(5, fontsize - 1))
    ax.set_xlabel(_AXIS_TITLE["sem"])
    ax.set_ylabel(_AXIS_TITLE["cov"])
    ax.tick_params(length=0)
    for spine in ax.spines.values():
        spine.set_visible(False)
    if title:
        ax.set_title(title, fontsize=10)
    return fig


def grid_mosaic(view, image_root: str | os.PathLike, *, per_cell: int = DEFAULT_PER_CELL, size: int = DEFAULT_SIZE,
                seed: int = 0, cells: str | Sequence[str] | None = None, title: str | None = None) -> Figure:
    """The mosaic of a grid manifest (``view``: ``isood.kinds.GridView``), its images read under ``image_root``;
    an image that is not there is one line naming it and what to pass."""
    images = view.images
    edges: dict[str, np.ndarray | None] = {}
    for axis in ("sem", "cov"):
        try:
            edges[axis] = view.axis_edges(axis)
        except IsoodError:  # an import without distances: levels only
            edges[axis] = None
    grid = grid_of(images, view.cells, view.n_levels, edges)
    wanted = parse_cells(cells, grid.n_levels)
    grid.paths = sample_cells(images, grid, per_cell=per_cell, seed=seed, cells=wanted)
    every = [p for ps in grid.paths.values() for p in ps]
    missing = missing_images(image_root, every)
    if missing:
        raise BadInputError(f"{len(missing)} of the {len(every)} sampled images are not under {image_root} (e.g. "
                            f"{missing[0]}): pass --image-root, the folder the manifest's image paths are relative to")
    thumbs = {k: [read_thumbnail(Path(image_root) / p, size) for p in ps] for k, ps in grid.paths.items()}
    if title is None:
        title = f"{view.kind} {Path(view.root).name}: up to {per_cell} images per cell (seed {seed})"
    return mosaic_figure(grid, thumbs, per_cell=per_cell, size=size, cells=wanted, title=title)


def mosaic_name(dataset: str) -> str:
    """``plots/mosaic_<dataset>.png``: a grid's mosaic in an evaluation (names slugged like ``plots``' names)."""
    return f"plots/mosaic_{re.sub(r'[^A-Za-z0-9.]+', '-', str(dataset)).strip('-').lower() or 'x'}.png"


def grid_mosaics(grids: Mapping[str, tuple[object, str | os.PathLike | None]], *, per_cell: int = REPORT_PER_CELL,
                 size: int = REPORT_SIZE, seed: int = 0) -> dict[str, bytes]:
    """The mosaic PNG of each grid ``name -> (typed view, image root)`` whose sampled images are reachable, by
    ``mosaic_name`` (a grid whose root is unknown or whose images are not there is left out: e.g. an evaluation
    of precomputed outputs)."""
    out = {}
    for name, (view, root) in grids.items():
        if root is None or not Path(root).is_dir():
            continue
        try:
            fig = grid_mosaic(view, root, per_cell=per_cell, size=size, seed=seed,
                              title=f"{name}: up to {per_cell} images per cell (seed {seed})")
        except (IsoodError, OSError):  # an image out of reach or unreadable: no mosaic, the rest goes on
            continue
        out[mosaic_name(name)] = figure_bytes(fig, "png", DPI)
    return out


def image_root_of(view, given: str | os.PathLike | None = None) -> str | None:
    """The folder a grid manifest's image paths are relative to: ``given``, else a splits manifest's
    ``test_root``, a Syn-IS manifest's own folder (None when unknown: an import)."""
    if given is not None:
        return os.fspath(given)
    if view.kind == SYN_IS:
        return str(view.root)
    return view.test_root if view.kind == SPLITS else None


def card_mosaic(root: str | os.PathLike) -> bytes | None:
    """The small mosaic (PNG) of the grid manifest written in ``root`` for its dataset card
    (``manifests.write_with_card(figure=...)``), or None when its images are not reachable."""
    import manifests

    view = manifests.read(root, kind=(SPLITS, SYN_IS))
    images = image_root_of(view)
    if images is None:
        return None
    return grid_mosaics({view.kind: (view, images)}).get(mosaic_name(view.kind))


def mosaic_files(fig: Figure) -> dict[str, bytes]:
    """``{MOSAIC_PNG: ..., MOSAIC_PDF: ...}`` at ``DPI``."""
    return {MOSAIC_PNG: figure_bytes(fig, "png", DPI), MOSAIC_PDF: figure_bytes(fig, "pdf", DPI)}
