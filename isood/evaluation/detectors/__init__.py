"""Post-hoc OOD detectors: a common interface (``Detector``), one module per method, and a registry.

Every score is HIGHER = MORE in-distribution. ``get_detector(name, **kwargs)`` builds one by name;
``available_detectors()`` lists the names; ``register_detector(name)`` adds a user's ``Detector`` subclass.
"""

from .base import (CAPTURE_KINDS, KINDS, Detector, DetectorInputError, ForwardOutputs, energy,
                   global_average_pool, softmax)
from .registry import UnknownDetectorError, available_detectors, get_detector, register_detector

# importing the modules registers the built-in detectors
from .msp import MSP  # noqa: E402
from .maxlogit import MaxLogit  # noqa: E402
from .energy import Energy  # noqa: E402
from .odin import ODIN  # noqa: E402
from .mds import MDS  # noqa: E402
from .knn import KNN  # noqa: E402
from .vim import ViM, default_vim_dim  # noqa: E402
from .react import ReAct  # noqa: E402
from .dice import DICE  # noqa: E402
from .ash import ASHB, ash_b  # noqa: E402
from .rankfeat import RankFeat, remove_rank1  # noqa: E402
from .gradnorm import GradNorm  # noqa: E402
from .klm import KLMatching  # noqa: E402

POST_HOC_DETECTORS = ("msp", "maxlogit", "energy", "mds", "knn", "vim", "react", "dice", "ash", "rankfeat",
                      "gradnorm", "klm")
"""The 12 built-in detectors that score captured outputs (all but ODIN)."""

__all__ = [
    "CAPTURE_KINDS", "KINDS", "POST_HOC_DETECTORS", "Detector", "DetectorInputError", "ForwardOutputs",
    "UnknownDetectorError", "available_detectors", "get_detector", "register_detector", "energy",
    "global_average_pool", "softmax", "MSP", "MaxLogit", "Energy", "ODIN", "MDS", "KNN", "ViM", "ReAct", "DICE",
    "ASHB", "RankFeat", "GradNorm", "KLMatching", "ash_b", "remove_rank1", "default_vim_dim",
]
