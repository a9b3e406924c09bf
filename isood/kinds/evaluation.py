"""The evaluation kinds: ``image-list`` (an imported OOD image list: ``isood import imagenet-ood`` /
``openood-imglist``) and ``evaluation`` (``isood evaluate``: metrics per cell, level curves, Table 1, per-set
rows and the optional leak and bootstrap tables), with their views."""

from __future__ import annotations

from typing import Any, Mapping

import pandas as pd

from isood.kinds.cards import imagenet_licence
from manifests.schema import BOOL, FLOAT, INT, STRING, CardSpec, KindSpec, TableSpec, register_kind
from manifests.store import ManifestView

__all__ = ["IMAGE_LIST", "EVALUATION", "ImageListView", "EvaluationView"]

IMAGE_LIST = "image-list"
EVALUATION = "evaluation"


class ImageListView(ManifestView):
    """``isood import imagenet-ood`` / ``openood-imglist`` output."""

    @property
    def images(self) -> pd.DataFrame:
        return self.frame("images")


class EvaluationView(ManifestView):
    """``isood evaluate`` output."""

    @property
    def cell_metrics(self) -> pd.DataFrame:
        return self.frame("cell_metrics")

    @property
    def model(self) -> str:
        """The model evaluated ('' for a run that does not record it)."""
        return str((self.meta.get("summary") or {}).get("model") or self.config.get("model_name")
                   or self.config.get("model") or "")

    @property
    def detector_params(self) -> dict[str, dict[str, Any]]:
        """Each detector's hyper-parameters as the run used them (``Detector.params()``; {} when the run records
        none)."""
        params = self.config.get("detector_params") or {}
        return {str(n): dict(p) for n, p in params.items() if isinstance(p, Mapping)}

    @property
    def input_hashes(self) -> dict[str, str]:
        """Each recorded input's content hash by input name (``<dataset>_manifest``, ``id_test``, ...)."""
        return {str(i.get("name")): str(i.get("sha256", "")) for i in self.meta.get("inputs", [])
                if isinstance(i, Mapping)}

    def optional(self, name: str) -> pd.DataFrame | None:
        """A table the run may lack (``table1_intervals``, ``scores``, ...), or None."""
        return self.frame(name) if name in self.tables else None

    @property
    def set_metrics(self) -> pd.DataFrame | None:
        """One row per detector and OOD set, with OpenOOD's ``nearood`` / ``farood`` means (None for an evaluation
        without the table)."""
        return self.frame("set_metrics") if "set_metrics" in self.tables else None


register_kind(KindSpec(
    IMAGE_LIST, writer="isood import imagenet-ood / openood-imglist", view=ImageListView,
    tables={"images": TableSpec({"path": STRING, "wnid": STRING, "label": INT}, paths=("path",))},
    card=CardSpec(title="OOD image list", description="An OOD image list (relative image paths).", main="images",
                  split="test", licence=imagenet_licence)))
register_kind(KindSpec(
    EVALUATION, writer="isood evaluate", view=EvaluationView,
    tables={"cell_metrics": TableSpec({"detector": STRING, "dataset": STRING, "cell": STRING, "cov_level": INT,
                                       "sem_level": INT, "n": INT, "na": BOOL}),
            "level_curves": TableSpec({"detector": STRING, "dataset": STRING, "axis": STRING, "level": INT,
                                       "metric": STRING, "value": FLOAT}),
            "table1": TableSpec({"detector": STRING, "dataset": STRING, "axis": STRING, "metric": STRING,
                                 "correlation": FLOAT, "sensitivity": FLOAT}),
            "detector_means": TableSpec({"detector": STRING, "dataset": STRING}),
            "set_metrics": TableSpec({"detector": STRING, "dataset": STRING, "group": STRING, "kind": STRING,
                                      "n": INT, "n_id": INT}, optional=True,
                                     doc="one row per detector and OOD set (ID test vs the whole set), with the "
                                     "nearood / farood group means (OpenOOD's rows)"),
            "leak_effect": TableSpec({"detector": STRING, "dataset": STRING, "cell": STRING, "metric": STRING,
                                      "all": FLOAT, "leak_free": FLOAT, "diff": FLOAT}, optional=True,
                                     doc="isood evaluate --leak-audit: per cell, all images vs leak-free"),
            "leak_ranking": TableSpec({"dataset": STRING, "scope": STRING, "key": STRING, "metric": STRING,
                                       "kendall_tau": FLOAT, "changed": BOOL}, optional=True,
                                      doc="isood evaluate --leak-audit: detector order with and without leaks"),
            "cell_intervals": TableSpec({"detector": STRING, "dataset": STRING, "cell": STRING, "metric": STRING,
                                         "value": FLOAT, "low": FLOAT, "high": FLOAT, "n_boot": INT}, optional=True,
                                        doc="bootstrap 95% interval of each measured cell's AUROC and FPR@95"),
            "table1_intervals": TableSpec({"detector": STRING, "dataset": STRING, "axis": STRING, "metric": STRING,
                                           "correlation": FLOAT, "correlation_low": FLOAT,
                                           "correlation_high": FLOAT, "sensitivity": FLOAT,
                                           "sensitivity_low": FLOAT, "sensitivity_high": FLOAT, "n_boot": INT},
                                          optional=True, doc="bootstrap 95% intervals of Table 1")},
    card=CardSpec(title="isood evaluation", main="cell_metrics", licence=imagenet_licence,
                  description="OOD detectors scored per cell of a shift grid and per OOD set: every metric per "
                  "cell, level curves, Table 1 (correlation and sensitivity per axis), per-set rows.")))
