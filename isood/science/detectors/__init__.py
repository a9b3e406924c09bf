"""Post-hoc OOD detectors: a common contract (``Detector``), one module per method, and a registry.

Every score is HIGHER = MORE in-distribution. ``get_detector(name, **params)`` builds one by name;
``available_detectors()`` lists the names; ``@register_detector(name)`` adds a user's ``Detector`` subclass;
``parse_detectors('msp,knn:k=10')`` reads the CLI's ``--detectors``. Pure: numpy in, numpy out; no torch is
imported here (an import-linter contract says so). Detectors that need torch run their torch part in isood.classifiers:
ODIN's input perturbation (``isood.classifiers.perturbation``), the model's pooling and last block (callables on
arrays that the model adapter puts into ``ForwardOutputs``), and pytorch-ood's detectors
(``isood.classifiers.pytorch_ood``: ``pytorch-ood:Name``, ``from_pytorch_ood(detector)``).
"""

from .base import (CAPTURE_KINDS, KINDS, Detector, DetectorInputError, ForwardOutputs, TemperatureDetector,
                   energy, global_average_pool, softmax)
from .registry import (UnknownDetectorError, available_detectors, detector_class, detector_parameters, get_detector,
                       parse_detectors, register_detector, register_namespace)

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
from .ash import ASH, ash_shape  # noqa: E402
from .rankfeat import RankFeat, remove_rank1  # noqa: E402
from .gradnorm import GradNorm  # noqa: E402
from .klm import KLMatching  # noqa: E402
from .mcm import GLMCM, MCM, local_max_softmax  # noqa: E402

BUILTIN_DETECTORS = tuple(available_detectors())
"""The 15 built-in detector names (sorted)."""
POST_HOC_DETECTORS = tuple(n for n in BUILTIN_DETECTORS
                           if not {"input", "local_logits"} & set(detector_class(n).requires))
"""The built-in detectors that score any classifier's captured outputs (all but ODIN, which perturbs the input,
and GL-MCM, which needs a CLIP model's local similarities)."""

__all__ = [
    "CAPTURE_KINDS", "KINDS", "BUILTIN_DETECTORS", "POST_HOC_DETECTORS", "Detector", "TemperatureDetector",
    "DetectorInputError", "ForwardOutputs", "UnknownDetectorError", "available_detectors", "detector_class",
    "detector_parameters",
    "get_detector", "parse_detectors", "register_detector", "register_namespace", "energy", "global_average_pool",
    "softmax", "MSP", "MaxLogit", "Energy", "ODIN", "MDS", "KNN", "ViM", "ReAct", "DICE", "ASH", "RankFeat",
    "GradNorm", "KLMatching", "MCM", "GLMCM", "local_max_softmax", "ash_shape", "remove_rank1", "default_vim_dim",
]
