"""MDS: Mahalanobis distance to class-conditional Gaussians with a shared covariance (Lee et al., NeurIPS 2018;
the OpenOOD v1.5 variant: penultimate features, no input pre-processing, no feature ensemble).

Fit on ID training features with their REAL class labels: ``mu_c`` = class means,
``Sigma = 1/N sum_i (h_i - mu_{y_i})(h_i - mu_{y_i})^T``; score
``S(x) = max_c -(h - mu_c)^T Sigma^+ (h - mu_c)``. In float64: equal to OpenOOD's steps run in float64 (OpenOOD
inverts the covariance in float32).
"""

from __future__ import annotations

import numpy as np

from .base import Detector, DetectorInputError, ForwardOutputs
from .registry import register_detector


@register_detector("mds", aliases=("mahalanobis",))
class MDS(Detector):
    """Class means + shared (tied) covariance from labelled ID training features."""

    requires = frozenset({"features"})
    needs_fit = True
    needs_labels = True

    def _fit(self, outputs: ForwardOutputs, labels: np.ndarray | None) -> None:
        from sklearn.covariance import EmpiricalCovariance

        if labels is None:
            labels = outputs.labels
        if labels is None:
            raise DetectorInputError(
                "detector 'mds' needs the real class labels of the ID training images: pass labels")
        y = np.asarray(labels).ravel()
        x = np.asarray(outputs.features, dtype=np.float64)
        if y.shape[0] != x.shape[0]:
            raise DetectorInputError(f"mds: {y.shape[0]} labels for {x.shape[0]} training images: pass one per image")
        self.classes_ = np.unique(y)
        self.means_ = np.stack([x[y == c].mean(axis=0) for c in self.classes_])
        centered = x - self.means_[np.searchsorted(self.classes_, y)]
        self.precision_ = EmpiricalCovariance(assume_centered=True).fit(centered).precision_

    def _score(self, outputs: ForwardOutputs) -> np.ndarray:
        x = np.asarray(outputs.features, dtype=np.float64)
        # (x - mu)^T P (x - mu) = x^T P x - 2 x^T P mu + mu^T P mu, for all classes at once
        xp = x @ self.precision_
        quad_x = np.einsum("nd,nd->n", xp, x)
        quad_mu = np.einsum("cd,cd->c", self.means_ @ self.precision_, self.means_)
        d = quad_x[:, None] - 2.0 * xp @ self.means_.T + quad_mu[None, :]
        return -d.min(axis=1)
