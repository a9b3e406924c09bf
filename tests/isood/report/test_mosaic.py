"""`isood show`: the mosaic of a grid manifest (``isood.report.mosaic``, ``isood.stages.show``)."""

from __future__ import annotations

import io

import numpy as np
import pandas as pd
import pytest
from matplotlib.colors import to_rgb
from PIL import Image
from typer.testing import CliRunner

import manifests
from isood.cli import app
from isood.core.errors import BadInputError
from isood.report.mosaic import grid_mosaic, sample_cells, grid_of
from isood.report.plots import NA_COLOR
from isood.science.grid import cell_name, cell_table, edges_table
from isood.stages.show import show
from isood.stages.splits import write_splits

N, PER_CELL, SIZE = 3, 4, 16
COUNTS = {(c, s): 5 for c in range(N) for s in range(N)}
COUNTS[(0, 2)] = 1   # below the N/A threshold (2)
COUNTS[(2, 0)] = 0   # empty: N/A too


def colour(c: int, s: int, i: int) -> tuple[int, int, int]:
    """A distinct solid colour per image: red and green say the cell, blue the image."""
    return 30 + 90 * c, 30 + 90 * s, 250 - 20 * i


def grid_world(tmp_path):
    """A 3x3 splits manifest (written by build-splits' writer) over solid-colour images, one colour per image."""
    root = tmp_path / "images"
    rows = []
    for (c, s), n in COUNTS.items():
        for i in range(n):
            rel = f"{cell_name(c, s)}/img_{i}.png"
            (root / rel).parent.mkdir(parents=True, exist_ok=True)
            Image.new("RGB", (24, 32), colour(c, s, i)).save(root / rel)
            rows.append({"path": rel, "wnid": "", "d_sem": 0.1 * s, "d_cov": 0.1 * c, "sem_level": s,
                         "cov_level": c, "cell": cell_name(c, s)})
    images = pd.DataFrame(rows)
    edges = edges_table(np.linspace(0.0, 0.3, N + 1), np.linspace(0.0, 0.3, N + 1))
    write_splits(tmp_path / "splits", images=images, edges=edges,
                 cells=cell_table(images["cov_level"], images["sem_level"], N, 2),
                 config={"test_root": str(root), "na_threshold": 2})
    return tmp_path / "splits", root


def panel(png: np.ndarray, fig, c: int, s: int) -> np.ndarray:
    """The pixels of cell (c, s)'s panel, found from the axes (data units: the cell's centre is (s, c), its
    panel spans +-0.5), inset by a few pixels so the gaps between panels are left out."""
    ax = fig.axes[0]
    (x0, y0), (x1, y1) = ax.transData.transform([(s - 0.5, c - 0.5), (s + 0.5, c + 0.5)])
    height = png.shape[0]
    top, bottom = int(round(height - y1)) + 4, int(round(height - y0)) - 4
    return png[top:bottom, int(round(x0)) + 4:int(round(x1)) - 4, :3]


def colours_in(region: np.ndarray) -> set[tuple[int, int, int]]:
    return {tuple(int(v) for v in px) for px in region.reshape(-1, 3)}


def test_each_panel_holds_the_images_of_its_cell_and_na_cells_are_marked(tmp_path):
    splits, root = grid_world(tmp_path)
    r = CliRunner().invoke(app, ["show", str(splits), "--out", str(tmp_path / "mosaic"), "--per-cell", str(PER_CELL),
                                 "--size", str(SIZE), "--seed", "3"])
    assert r.exit_code == 0, r.output
    png = np.asarray(Image.open(tmp_path / "mosaic" / "mosaic.png").convert("RGB"))
    assert (tmp_path / "mosaic" / "mosaic.pdf").read_bytes().startswith(b"%PDF")
    view = manifests.read(splits, kind="splits")
    fig = grid_mosaic(view, root, per_cell=PER_CELL, size=SIZE, seed=3)  # same figure: its axes give the panels
    assert fig.canvas.get_width_height() == (png.shape[1], png.shape[0])
    grey = tuple(int(round(v * 255)) for v in to_rgb(NA_COLOR))
    for (c, s), n in COUNTS.items():
        seen = colours_in(panel(png, fig, c, s))
        if n < 2:  # N/A: a grey panel with its label, no image
            assert grey in seen and not any(col in seen for col in (colour(c, s, i) for i in range(5)))
            region = panel(png, fig, c, s)
            assert (region.sum(axis=2) < 3 * 150).any(), "the N/A label is drawn"
            continue
        theirs = {colour(c, s, i) for i in range(n)}
        shown = seen & {colour(cc, ss, i) for cc in range(N) for ss in range(N) for i in range(5)}
        assert shown <= theirs, f"cell {(c, s)} shows images of another cell"
        assert len(shown) == min(PER_CELL, n)  # k distinct images of that cell


def test_same_seed_same_figure_and_seed_changes_the_sample(tmp_path):
    splits, root = grid_world(tmp_path)
    show(splits, tmp_path / "a", seed=1, per_cell=2, size=SIZE)
    show(splits, tmp_path / "b", seed=1, per_cell=2, size=SIZE)
    show(splits, tmp_path / "c", seed=2, per_cell=2, size=SIZE)
    for name in ("mosaic.png", "mosaic.pdf"):
        assert (tmp_path / "a" / name).read_bytes() == (tmp_path / "b" / name).read_bytes()
    assert (tmp_path / "a" / "mosaic.png").read_bytes() != (tmp_path / "c" / "mosaic.png").read_bytes()
    # a cell shows the same images whichever other cells are drawn
    view = manifests.read(splits, kind="splits")
    grid = grid_of(view.images, view.cells, N)
    every = sample_cells(view.images, grid, per_cell=2, seed=1)
    one = sample_cells(view.images, grid, per_cell=2, seed=1, cells=[(1, 1)])
    assert one == {(1, 1): every[(1, 1)]}


def test_cells_option_fills_only_those_cells(tmp_path):
    splits, root = grid_world(tmp_path)
    show(splits, tmp_path / "m", cells="cov_1_sem_1", per_cell=PER_CELL, size=SIZE)
    png = np.asarray(Image.open(tmp_path / "m" / "mosaic.png").convert("RGB"))
    fig = grid_mosaic(manifests.read(splits, kind="splits"), root, cells="cov_1_sem_1", per_cell=PER_CELL, size=SIZE)
    assert colours_in(panel(png, fig, 1, 1)) & {colour(1, 1, i) for i in range(5)}
    assert not colours_in(panel(png, fig, 0, 0)) & {colour(0, 0, i) for i in range(5)}


def test_refusals_name_what_to_pass(tmp_path):
    splits, root = grid_world(tmp_path)
    with pytest.raises(BadInputError, match="--cells"):
        show(splits, tmp_path / "m", cells="cov_9_sem_0")
    with pytest.raises(BadInputError, match="inside the manifest"):
        show(splits, splits / "mosaic")
    (tmp_path / "busy").mkdir()
    (tmp_path / "busy" / "notes.txt").write_text("mine")
    with pytest.raises(BadInputError, match="holds other files"):
        show(splits, tmp_path / "busy")
    with pytest.raises(BadInputError, match="--image-root"):
        show(splits, tmp_path / "m", image_root=tmp_path / "nowhere")
    r = CliRunner().invoke(app, ["show", str(splits), "--out", str(tmp_path / "m"), "--per-cell", "0"])
    assert r.exit_code == 2 and "--per-cell" in r.output


def test_an_import_without_image_folder_or_distances_needs_image_root(tmp_path):
    """An imported release records no image folder and no distances: --image-root is required, the axes name
    the levels only."""
    from isood.stages.interop.release import release_edges

    splits, root = grid_world(tmp_path)
    view = manifests.read(splits, kind="splits")
    write_splits(tmp_path / "import", images=view.images, cells=view.cells, edges=release_edges(N),
                 config={"na_threshold": 2})
    with pytest.raises(BadInputError, match="--image-root"):
        show(tmp_path / "import", tmp_path / "m")
    show(tmp_path / "import", tmp_path / "m", image_root=root, per_cell=PER_CELL, size=SIZE)
    fig = grid_mosaic(manifests.read(tmp_path / "import", kind="splits"), root, per_cell=PER_CELL, size=SIZE)
    assert [t.get_text() for t in fig.axes[0].get_xticklabels()] == ["0", "1", "2"]
    png = np.asarray(Image.open(tmp_path / "m" / "mosaic.png").convert("RGB"))
    assert colours_in(panel(png, fig, 2, 2)) & {colour(2, 2, i) for i in range(5)}
    labelled = grid_mosaic(view, root, per_cell=PER_CELL, size=SIZE)  # with distances: "level\n[lower, upper)"
    assert [t.get_text() for t in labelled.axes[0].get_xticklabels()][1] == "1\n[0.1, 0.2)"
