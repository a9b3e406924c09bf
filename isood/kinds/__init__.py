"""The manifest kinds isood writes, as contracts: their tables (a schema each), the fields other stages may
read, a typed view per kind and the layout of their dataset cards.

Stages exchange data only through manifests read with ``manifests.read(path, kind=...)``, which checks the kind
and every table's schema against the spec registered here and returns the typed view (``SplitsView.edges``,
``.test_root``, ``.clip``...). A stage never reads another stage's ``command.config``: the views do, in one place.
The specs live here, one module below the stages, so that a stage can read another's output without importing
that stage; each spec names the command that writes it.

One module per kind family registers its kinds when imported (importing this package imports them all; it is
the ``isood.manifest_kinds`` entry point ``manifests`` loads): ``features`` (``isood extract``), ``grid`` (splits
and Syn-IS, with the grid's card in ``grid_card``), ``wordnet`` (class filter, audit), ``evaluation`` (image lists,
evaluations); ``cards`` holds the cards' licence texts.
"""

from __future__ import annotations

from pathlib import Path

from isood.kinds.features import FEATURES, FEATURES_PART, FeaturesView
from isood.kinds.grid import (
    CELLS_COLUMNS,
    EDGES_COLUMNS,
    GRID_KINDS,
    IMAGES_COLUMNS,
    LAID_FILE,
    SPLITS,
    SYN_IS,
    SYN_IS_PART,
    SYN_IS_PROMPTS,
    GridView,
    SplitsView,
    SynView,
)
from isood.kinds.wordnet import AUDIT, CLASS_FILTER, AuditView, ClassFilterView
from isood.kinds.evaluation import EVALUATION, IMAGE_LIST, EvaluationView, ImageListView
from manifests.store import read as read_manifest

__all__ = [
    "FEATURES", "FEATURES_PART", "SPLITS", "SYN_IS", "SYN_IS_PROMPTS", "SYN_IS_PART", "CLASS_FILTER", "AUDIT",
    "IMAGE_LIST", "EVALUATION", "GRID_KINDS", "FeaturesView", "GridView", "SplitsView", "SynView", "ClassFilterView",
    "AuditView", "ImageListView", "EvaluationView", "IMAGES_COLUMNS", "CELLS_COLUMNS", "EDGES_COLUMNS",
    "LAID_FILE",
]


def read(root: str | Path, kind: str | tuple[str, ...] | None = None, *, verify: str | None = None):
    """``isood.read``: ``manifests.read`` with isood's kinds registered (importing this module registers them), so a
    typed view comes back whether or not the distribution's install metadata (its entry point) is there."""
    return read_manifest(root, kind, verify=verify)
