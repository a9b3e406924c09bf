"""The figure of a dataset card (``manifests`` draws cards through a callback): the grid mosaic of
``isood.report.mosaic``, imported when a card is drawn, so the stages that pass it (and the CLI that imports
them) load no matplotlib until then."""

from __future__ import annotations

import os

__all__ = ["card_mosaic"]


def card_mosaic(root: str | os.PathLike) -> bytes | None:
    """``isood.report.mosaic.card_mosaic``: the PNG of a grid manifest's mosaic, or None without images."""
    from isood.report.mosaic import card_mosaic as draw  # matplotlib: only when a card is drawn

    return draw(root)
