"""The stage of `isood show MANIFEST`, a mosaic of a grid manifest (read and verified -> k seeded thumbnails per
cell, ``isood.report.mosaic`` -> ``mosaic.png`` and ``mosaic.pdf`` in ``--out``).

Any grid: a splits manifest (``isood build-splits``, or ``isood import isood-lists``) or a Syn-IS one (``isood
generate-syn``). The images are read under ``--image-root``, else the folder the manifest records: a splits
manifest's ``test_root``, a Syn-IS manifest's own folder; an import records none (``--image-root`` is required).

The output is not a manifest: the figure is derived from a manifest that is already versioned and hashed, and
costs seconds to redraw. ``--out`` is written under its lock (``isood.core.files.output_lock``), each file by rename;
it must be new, empty or an earlier ``isood show`` output (only ``mosaic.png`` and ``mosaic.pdf`` in it), and is
never a manifest or inside the one shown.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

import manifests
from isood.core.defaults import DEFAULT_VERIFY, MOSAIC_PDF, MOSAIC_PNG
from isood.core.defaults import MOSAIC_PER_CELL as DEFAULT_PER_CELL
from isood.core.defaults import MOSAIC_SIZE as DEFAULT_SIZE
from isood.core.errors import BadInputError, ManifestError
from isood.core.files import TMP_PREFIX, atomic_write_bytes, output_lock
from isood.kinds import SPLITS, SYN_IS
from isood.core.optspec import REQUIRED, option
from isood.core.shared_options import seed_option, verify_option
from manifests.paths import is_inside

__all__ = ["ShowOptions", "ShowResult", "show"]

_OUTPUTS = (MOSAIC_PNG, MOSAIC_PDF)


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


@dataclass
class ShowResult:
    out: Path
    files: list[Path]
    kind: str
    image_root: str


def _check_out(out: Path, manifest: Path) -> None:
    """Refuse an ``--out`` that is a manifest, inside the one shown, or holds anything but an earlier mosaic."""
    if is_inside(os.path.realpath(out), os.path.realpath(manifest)):
        raise BadInputError(f"--out {out} is inside the manifest {manifest}; pass a folder outside it")
    if out.exists() and not out.is_dir():
        raise BadInputError(f"--out {out} is a file; pass a folder")
    if out.is_dir():
        if (out / "manifest.json").exists():
            raise BadInputError(f"--out {out} is a manifest; pass a new folder for the mosaic")
        others = sorted(p.name for p in out.iterdir() if not p.name.startswith(TMP_PREFIX) and p.name not in _OUTPUTS)
        if others:
            raise BadInputError(f"--out {out} holds other files ({', '.join(others[:3])}); pass a new or empty folder, "
                                "or an earlier `isood show --out`")


def show(manifest: str | os.PathLike, out: str | os.PathLike, *, cells: str = "all", per_cell: int = DEFAULT_PER_CELL,
         size: int = DEFAULT_SIZE, seed: int = 0, image_root: str | os.PathLike | None = None,
         verify: str = DEFAULT_VERIFY) -> ShowResult:
    """Draw the mosaic of a grid manifest into ``out`` (module docstring); every refusal comes before anything is
    written."""
    # the figure code pulls in matplotlib: loaded when the stage runs, not when the CLI reads its options
    from isood.report.mosaic import grid_mosaic, image_root_of, mosaic_files

    manifest, out = Path(manifest), Path(out)
    _check_out(out, manifest)
    try:
        view = manifests.read(manifest, kind=(SPLITS, SYN_IS), verify=verify)
    except ManifestError as e:
        raise type(e)(f"MANIFEST: {e}") from None
    root = image_root_of(view, image_root)
    if root is None:
        raise BadInputError(f"{manifest} records no image folder (an import): pass --image-root, the folder its image "
                            "paths are relative to")
    if not Path(root).is_dir():
        raise BadInputError(f"image folder {root} does not exist: pass --image-root, the folder the manifest's image "
                            "paths are relative to")
    files = mosaic_files(grid_mosaic(view, root, per_cell=per_cell, size=size, seed=seed, cells=cells))
    with output_lock(out):
        _check_out(out, manifest)
        for name, data in files.items():
            atomic_write_bytes(out / name, data)
    return ShowResult(out, [out / n for n in files], view.kind, str(root))
