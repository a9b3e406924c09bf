"""A manifest as an image dataset: ``isood.load_dataset(MANIFEST)`` -> a ``datasets`` dataset with an
``image`` column (``datasets.Image``) beside the manifest's rows, ready for ``with_transform`` and a torch
``DataLoader``::

    ds = isood.load_dataset("out/splits", split="test")
    ds = ds.with_transform(lambda b: {"x": [to_tensor(im) for im in b["image"]], "cell": b["cell"]})
    loader = torch.utils.data.DataLoader(ds, batch_size=32)

The rows are the config's rows as `datasets.load_dataset(MANIFEST, config)` gives them through the manifest's
dataset card (typed `features`: the grid cell a ``ClassLabel``); each row's ``path`` is resolved against the
images' folder: ``image_root``, else the folder the manifest records (a splits manifest's ``test_root``, a Syn-IS
manifest's own folder, a features manifest's ``image_root``); an import records none (pass ``image_root``).
Every image must be there (one line naming the first missing one); images are decoded when a row is read.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import manifests
from isood.core.defaults import DEFAULT_VERIFY
from isood.core.errors import BadInputError
from isood.kinds import FEATURES, SPLITS, SYN_IS
from manifests.card import CARD_FILE
from manifests.card_info import IMAGE_COLUMN

__all__ = ["load_dataset", "images_root", "IMAGE_COLUMN"]


def images_root(m: manifests.Manifest, image_root: str | os.PathLike | None = None) -> Path | None:
    """The folder a manifest's image paths are relative to (module docstring); None when unknown."""
    if image_root is not None:
        return Path(image_root)
    config = (m.meta.get("command") or {}).get("config") or {}
    if m.kind == SYN_IS:
        return Path(m.root)
    recorded = config.get("test_root") if m.kind == SPLITS else config.get("image_root") if m.kind == FEATURES else None
    return Path(recorded) if recorded else None


def _with_images(ds: Any, root: Path, where: str) -> Any:
    import datasets

    paths = ds["path"]
    missing = next((p for p in paths if not (root / p).is_file()), None)
    if missing is not None:
        raise BadInputError(f"{where}: image {missing} is not under {root}: pass image_root, the folder the "
                            "manifest's image paths are relative to")
    ds = ds.add_column(IMAGE_COLUMN, [str(root / p) for p in paths])
    return ds.cast_column(IMAGE_COLUMN, datasets.Image())


def load_dataset(manifest: str | os.PathLike, image_root: str | os.PathLike | None = None, config: str = "all", *,
                 split: str | None = None, verify: str = DEFAULT_VERIFY, cache_dir: str | None = None):
    """The rows of ``config`` (default ``all``; a grid: a cell name, e.g. ``cov_0_sem_0``) of a manifest with an
    ``image`` column (module docstring): a ``datasets.DatasetDict`` (its splits, e.g. ``test``), or the
    ``datasets.Dataset`` of ``split``. The manifest is verified first (``verify``: 'fast' or 'full')."""
    import datasets

    m = manifests.read(manifest, verify=verify)
    listed = {r["path"] for r in m.meta.get("files", [])}
    if CARD_FILE not in listed:
        raise BadInputError(f"{manifest} has no dataset card: run `isood card {manifest}` first")
    root = images_root(m, image_root)
    if root is None:
        raise BadInputError(f"{manifest} ({m.kind}) records no image folder: pass image_root, the folder its image "
                            "paths are relative to")
    if not root.is_dir():
        raise BadInputError(f"image folder {root} does not exist: pass image_root, the folder the manifest's image "
                            "paths are relative to")
    try:
        loaded = datasets.load_dataset(str(m.root), config, cache_dir=cache_dir)
    except ValueError as e:  # an unknown config: datasets names the ones there are
        raise BadInputError(f"{manifest}: config {config!r}: {' '.join(str(e).split())[:300]}") from None
    if split is not None and split not in loaded:
        raise BadInputError(f"{manifest}: config {config!r} has no split {split!r}; pass one of {', '.join(loaded)}")
    if "path" not in next(iter(loaded.values())).column_names:
        raise BadInputError(f"{manifest}: config {config!r} has no image paths; pass a config of its images table")
    out = datasets.DatasetDict({name: _with_images(d, root, str(manifest)) for name, d in loaded.items()
                                if split is None or name == split})
    return out[split] if split is not None else out
