"""The WordNet kinds: ``class-filter`` (``isood wordnet filter``: every candidate class with its decision) and
``audit`` (``isood wordnet audit``: the leak verdicts of an OOD class or image list, per class and, for an audited
manifest, per image, cell and level), with their views and their card (one config per decision)."""

from __future__ import annotations

from typing import Any

import pandas as pd

from isood.kinds.cards import imagenet_licence
from manifests.schema import FLOAT, INT, STRING, CardSpec, KindSpec, TableSpec, register_kind
from manifests.store import ManifestView
from wordnet_tools.rules import class_rule_map

__all__ = ["CLASS_FILTER", "AUDIT", "ClassFilterView", "AuditView"]

CLASS_FILTER, AUDIT = "class-filter", "audit"

_CLASSES_COLUMNS = {"wnid": STRING, "name": STRING, "decision": STRING, "rule": STRING, "conflict_wnid": STRING,
                    "conflict_name": STRING, "conflict_hops": INT}
_SUMMARY_COLUMNS = {"decision": STRING, "rule": STRING, "classes": INT}
_AUDIT_COUNTS = {"images": INT, "classes": INT, "leak_images": INT, "leak_share": FLOAT}


class ClassFilterView(ManifestView):
    """``isood wordnet filter`` output."""

    @property
    def classes(self) -> pd.DataFrame:
        return self.frame("classes")

    def kept(self) -> tuple[list[str], dict[str, str]]:
        """Kept wnids (sorted) and their names."""
        df = self.classes
        kept = df[df["decision"] == "keep"]
        names = {str(w): str(n) for w, n in zip(kept["wnid"], kept["name"]) if isinstance(n, str) and n}
        return sorted(kept["wnid"].astype(str)), names


class AuditView(ClassFilterView):
    """``isood wordnet audit`` output: the class verdicts; for an audited manifest also ``images`` (its rows with
    their ``rule``) and, for a graded one, ``cells`` / ``levels`` (images and classes per rule)."""

    def class_rules(self) -> dict[str, str]:
        """wnid -> rule ('' when kept) of every audited class."""
        return class_rule_map(self.classes)

    def optional(self, name: str) -> pd.DataFrame | None:
        """The ``images`` / ``cells`` / ``levels`` table, or None (a list-file audit has none)."""
        return self.frame(name) if name in self.tables else None


# ``reads``: the decision card reads no table besides ``classes`` (an audit's per-image ``images``, a row per image,
# is never loaded to draw a card).
_DECISION_CARD: dict[str, Any] = dict(main="classes", config_by="decision", config_names={"keep": "kept", "drop": "dropped"},
                                      licence=imagenet_licence, reads=())

register_kind(KindSpec(
    CLASS_FILTER, writer="isood wordnet filter", view=ClassFilterView,
    tables={"classes": TableSpec(_CLASSES_COLUMNS), "summary": TableSpec(_SUMMARY_COLUMNS)},
    card=CardSpec(title="isood class-filter manifest", **_DECISION_CARD,
                  description="The ImageNet-OOD class filter: every candidate class with its decision, the rule "
                  "that dropped it and the in-distribution class it conflicts with.")))
register_kind(KindSpec(
    AUDIT, writer="isood wordnet audit", view=AuditView,
    tables={"classes": TableSpec({**_CLASSES_COLUMNS, "entries": INT}),
            "summary": TableSpec({**_SUMMARY_COLUMNS, "entries": INT}),
            "images": TableSpec({"wnid": STRING, "rule": STRING}, optional=True, paths=("path",),
                                doc="the audited manifest's rows (path, cell, levels when present) with their rule"),
            "cells": TableSpec(_AUDIT_COUNTS | {"cell": STRING, "cov_level": INT, "sem_level": INT}, optional=True),
            "levels": TableSpec(_AUDIT_COUNTS | {"axis": STRING, "level": INT}, optional=True)},
    card=CardSpec(title="isood audit manifest", **_DECISION_CARD,
                  description="An audit of an OOD class or image list for WordNet hierarchy leaks into the "
                  "in-distribution classes.")))
