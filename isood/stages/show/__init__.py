"""The stage of `isood show MANIFEST`: a mosaic of a grid manifest (``options``: its options; ``stage``: read and
verify the manifest, draw k seeded thumbnails per cell, write PNG + PDF)."""

from isood.stages.show.options import ShowOptions
from isood.stages.show.stage import ShowResult, show

__all__ = ["ShowOptions", "ShowResult", "show"]
