"""ViM: Virtual-logit Matching (Wang et al., CVPR 2022).

Fit on ID training features: origin ``u = -pinv(W) b``; principal subspace of the (uncentred at ``u``) feature
covariance; ``R`` = the eigenvectors NOT in the top-``dim`` principal subspace; ``alpha = mean_train max_c z_c /
mean_train ||(h - u) R||``. Score ``S(x) = logsumexp(z) - alpha ||(h - u) R||`` (energy minus the virtual logit).

``dim`` default (None): the ViM paper's rule, as used by OpenOOD v1.5 for ImageNet: 1000 when the feature has
>= 2048 dims (ResNet-50), 512 when >= 768 (ViT-B), otherwise half the feature dimension.

Difference from OpenOOD v1.5: computed in float64 (symmetric ``eigh``). OpenOOD runs the same steps on float32
features (``np.linalg.eig`` of a float32 covariance), so its eigenvectors near the ``dim`` cut differ slightly;
isood equals OpenOOD's steps run in float64.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from isood.core.errors import DetectorParamError

from .base import Detector, ForwardOutputs
from .registry import register_detector


def default_vim_dim(feature_dim: int) -> int:
    """Principal-subspace dimension of ViM for a feature of ``feature_dim`` dims (see module docstring)."""
    if feature_dim >= 2048:
        return 1000
    if feature_dim >= 768:
        return 512
    return max(1, feature_dim // 2)


@register_detector("vim")
class ViM(Detector):
    """Energy minus an alpha-scaled residual norm outside the principal subspace."""

    requires = frozenset({"features", "fc"})
    needs_fit = True

    def __init__(self, dim: int | None = None) -> None:
        self.dim = None if dim is None else self._param("dim", dim, int, lambda v: v >= 1, ">= 1 (or unset)")

    def principal_dim(self, feature_dim: int) -> int:
        """The principal-subspace dimension for ``feature_dim``-dim features (``dim``, else the default rule); it
        must leave a residual: ``0 < dim < feature_dim``, else a one-line ``DetectorParamError``."""
        dim = default_vim_dim(feature_dim) if self.dim is None else self.dim
        if not 0 < dim < feature_dim:
            raise DetectorParamError(f"vim: dim={dim} must be below the feature dimension {feature_dim} of this "
                                     f"model: pass vim:dim=N with N < {feature_dim}")
        return dim

    def preflight(self, *, n_train: int | None = None, feature_dim: int | None = None) -> None:
        if feature_dim is not None:
            self.principal_dim(feature_dim)

    def resolved_params(self) -> dict[str, Any]:
        """``dim`` as fitted: the default rule's value for the feature size once fitted (None before)."""
        return {"dim": self.dim if self.dim is not None else getattr(self, "dim_", None)}

    def _fit(self, outputs: ForwardOutputs, labels: np.ndarray | None) -> None:
        from sklearn.covariance import EmpiricalCovariance

        w, b = (np.asarray(a, dtype=np.float64) for a in outputs.fc())
        x = np.asarray(outputs.features, dtype=np.float64)
        dim = self.principal_dim(x.shape[1])
        self.dim_ = dim
        self.u_ = -np.linalg.pinv(w) @ b
        cov = EmpiricalCovariance(assume_centered=True, store_precision=False).fit(x - self.u_).covariance_
        eig_vals, eig_vecs = np.linalg.eigh(cov)
        order = np.argsort(-eig_vals, kind="stable")
        self.residual_basis_ = np.ascontiguousarray(eig_vecs[:, order[dim:]])
        vlogit = np.linalg.norm((x - self.u_) @ self.residual_basis_, axis=1)
        max_logit = (x @ w.T + b).max(axis=1)
        self.alpha_ = float(max_logit.mean() / vlogit.mean())

    def _score(self, outputs: ForwardOutputs) -> np.ndarray:
        from scipy.special import logsumexp

        x = np.asarray(outputs.features, dtype=np.float64)
        logits = x @ np.asarray(outputs.fc()[0], np.float64).T + np.asarray(outputs.fc()[1], np.float64)
        vlogit = np.linalg.norm((x - self.u_) @ self.residual_basis_, axis=1) * self.alpha_
        return logsumexp(logits, axis=1) - vlogit
