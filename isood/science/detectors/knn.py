"""KNN (Sun et al., "Out-of-distribution detection with deep nearest neighbors", ICML 2022):
``S(x) = -|| z - z_(k) ||_2`` with ``z = h / ||h||`` and ``z_(k)`` the k-th nearest L2-normalised ID training
feature. Exact search with faiss ``IndexFlatL2``; ``k = 50`` (OpenOOD v1.5 default; the paper uses 1000 on the
full ImageNet training set).

Difference from OpenOOD v1.5 (exact, by a monotone transform): its ``KNNPostprocessor`` returns minus the SQUARED
distance (faiss' ``IndexFlatL2`` distances, not square-rooted; its normaliser also adds 1e-10 to every entry, which
shifts both vectors alike and leaves the distances unchanged). Same ranking, so AUROC, FPR@95, AUPR, AUROC_M and
DER are identical; AUTC (scale-dependent) differs."""

from __future__ import annotations

import numpy as np

from isood.core.errors import DetectorParamError

from .base import Detector, ForwardOutputs
from .registry import register_detector


def _normalise(x: np.ndarray) -> np.ndarray:
    """Rows divided by max(norm, 1e-12), float32 C-contiguous (faiss' input)."""
    x = np.asarray(x, dtype=np.float32)
    n = np.linalg.norm(x, axis=1, keepdims=True)
    return np.ascontiguousarray(x / np.maximum(n, 1e-12), dtype=np.float32)


@register_detector("knn")
class KNN(Detector):
    """Distance to the k-th nearest normalised training feature (negated)."""

    requires = frozenset({"features"})
    needs_fit = True

    def __init__(self, k: int = 50) -> None:
        self.k = self._param("k", k, int, lambda v: v >= 1, ">= 1")

    def preflight(self, *, n_train: int | None = None, feature_dim: int | None = None) -> None:
        """The k-th neighbour must exist: ``k <= n_train``."""
        if n_train is not None and n_train < self.k:
            raise DetectorParamError(f"knn: k={self.k} but only {n_train} ID training images: pass knn:k=N with "
                                     f"N <= {n_train}, or more ID training images")

    def _fit(self, outputs: ForwardOutputs, labels: np.ndarray | None) -> None:
        import faiss

        bank = _normalise(outputs.captured("features"))
        self.preflight(n_train=bank.shape[0])
        self.index_ = faiss.IndexFlatL2(bank.shape[1])
        self.index_.add(bank)

    def _score(self, outputs: ForwardOutputs) -> np.ndarray:
        dist2, _ = self.index_.search(_normalise(outputs.captured("features")), self.k)
        return -np.sqrt(np.maximum(dist2[:, -1].astype(np.float64), 0.0))
