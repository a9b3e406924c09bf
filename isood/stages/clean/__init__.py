"""The stage of `isood splits clean`: a splits manifest + an audit of its classes -> a leak-free splits manifest
(``options``: its options; ``stage``: load, the pure steps and the streamed writer)."""

from isood.stages.clean.options import CleanOptions
from isood.stages.clean.stage import CleanResult, clean_splits

__all__ = ["CleanOptions", "CleanResult", "clean_splits"]
