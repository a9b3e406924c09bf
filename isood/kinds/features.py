"""The feature kinds (``isood extract``): ``features`` (feature shards and their index) and ``features-part``
(one job-array task's shards), with ``FeaturesView`` and ``ClipProvenance``, the view of any manifest whose
numbers come from one CLIP (features, and the grids measured from them)."""

from __future__ import annotations

from pathlib import Path

import pandas as pd

from isood.kinds.cards import imagenet_licence
from manifests.schema import INT, STRING, CardSpec, KindSpec, TableSpec, register_kind
from manifests.store import ManifestView

__all__ = ["FEATURES", "FEATURES_PART", "ClipProvenance", "FeaturesView"]

FEATURES, FEATURES_PART = "features", "features-part"


class ClipProvenance(ManifestView):
    """A manifest whose numbers come from one CLIP: the ``--clip`` name and the identity of its weights."""

    @property
    def clip(self) -> str | None:
        """The ``--clip`` name (None when unknown, e.g. an import)."""
        return self.field("clip")

    @property
    def clip_identity(self) -> str | None:
        return self.field("clip_identity")


class FeaturesView(ClipProvenance):
    """``isood extract`` output: shards ``features-NNNNN.npy`` + ``index`` (path, wnid, shard, row)."""

    @property
    def index(self) -> pd.DataFrame:
        return self.frame("index")

    @property
    def rejected(self) -> pd.DataFrame:
        return self.frame("rejected") if "rejected" in self.tables else pd.DataFrame(columns=["path", "wnid", "error"])

    @property
    def embed_dim(self) -> int | None:
        v = self.field("embed_dim")
        return None if v is None else int(v)

    @property
    def decode(self) -> str:
        """The decoding mode of the features (``isood.features.decoding.DECODE_MODES``; ``reference`` when the
        manifest records none)."""
        return str(self.field("decode") or "reference")

    @property
    def image_root(self) -> str | None:
        """The folder the index paths are relative to (recorded as ``image_root``; when none is
        recorded: the image folder, or the folder of the file list)."""
        recorded = self.field("image_root")
        if recorded:
            return str(recorded)
        images = self.field("images")
        if not images:
            return None
        return str(Path(images).parent) if self.field("source_kind") == "list" else str(images)


register_kind(KindSpec(
    FEATURES, writer="isood extract", view=FeaturesView,
    tables={"index": TableSpec({"path": STRING, "wnid": STRING, "shard": INT, "row": INT}, paths=("path",)),
            "rejected": TableSpec({"path": STRING, "error": STRING}, optional=True, paths=("path",))},
    fields={"clip": "command.config.clip", "clip_identity": "command.config.clip_identity",
            "embed_dim": "summary.embed_dim", "images": "command.config.images",
            "image_root": "command.config.image_root",
            "source_kind": "command.config.source_kind", "decode": "command.config.decode"},
    card=CardSpec(title="isood features manifest", description="Image features and their index.", main="index",
                  licence=imagenet_licence)))
register_kind(KindSpec(
    FEATURES_PART, writer="isood extract --num-shards N --shard-index i",
    tables={"shards": TableSpec({"shard": INT, "key": STRING, "images": INT, "rejected": INT})},
    fields={"embed_dim": "summary.embed_dim"},
    card=CardSpec(title="isood features part", main="shards", licence=imagenet_licence,
                  description="One task's share of an `isood extract` job array: its feature shards (images "
                  "encoded and rejected per shard); `isood merge` combines the parts into a features manifest.")))
