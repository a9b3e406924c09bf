"""The options of `isood show`, one description each (``isood.core.optspec``)."""

from __future__ import annotations

from dataclasses import dataclass

from isood.core.defaults import MOSAIC_PER_CELL as DEFAULT_PER_CELL
from isood.core.defaults import MOSAIC_SIZE as DEFAULT_SIZE
from isood.core.optspec import REQUIRED, option
from isood.core.shared_options import seed_option, verify_option

__all__ = ["ShowOptions"]


@dataclass(frozen=True, kw_only=True)
class ShowOptions:
    """`isood show` (``show`` takes the same values)."""

    manifest: str = option(REQUIRED, kind="path", argument=True, metavar="MANIFEST",
                           help="A grid manifest: isood build-splits, isood generate-syn or isood import isood-lists "
                                "--out.")
    out: str = option(REQUIRED, kind="path", metavar="DIR",
                      help="Output folder for mosaic.png and mosaic.pdf (new, empty, or an earlier isood show --out).")
    cells: str = option("all", metavar="CELLS",
                        help="The cells to fill: 'all', or cell names separated by commas (cov_0_sem_0,cov_7_sem_7); "
                             "the others are drawn empty.")
    per_cell: int = option(DEFAULT_PER_CELL, least=1, help="Images sampled per cell.")
    size: int = option(DEFAULT_SIZE, least=8, most=4096, metavar="PX", help="Thumbnail side in pixels.")
    seed: int = seed_option("Seed of the sampling: one seed, one figure.")
    image_root: str | None = option(None, kind="path", metavar="DIR",
                                    help="The folder the manifest's image paths are relative to (default: a splits "
                                         "manifest's test_root, a Syn-IS manifest's own folder; required for an "
                                         "import).")
    verify: str = verify_option()
