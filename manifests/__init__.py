"""Versioned, hashed manifests, the contract between isood's stages (JSON + Parquet, with provenance).

``read(path, kind=...)`` returns a kind's typed view after checking its kind and table schemas (``manifests.schema``
holds the ``KindSpec`` registry; the specs themselves are registered by the code that writes each kind).
This package knows nothing about the benchmark domain (cells, levels, detectors).
"""

from isood.core.files import atomic_write_bytes, sha256_bytes, sha256_file
from manifests.card import dataset_card, write_with_card
from manifests.card_stream import add_card
from manifests.output import check_output, writing
from manifests.paths import check_relative, resolve_inside
from manifests.schema import CardSpec, KindSpec, TableSpec, kind_spec, register_kind
from manifests.store import (
    MANIFEST_FILE,
    SCHEMA_NAME,
    SCHEMA_VERSION,
    Manifest,
    ManifestView,
    input_record,
    parquet_bytes,
    read,
    write_manifest,
)
from manifests.verify import VerifyReport, verify

__all__ = [
    "MANIFEST_FILE", "SCHEMA_NAME", "SCHEMA_VERSION", "CardSpec", "KindSpec", "Manifest", "ManifestView",
    "TableSpec", "VerifyReport", "add_card", "atomic_write_bytes", "check_output", "check_relative", "dataset_card",
    "input_record", "kind_spec", "parquet_bytes", "read", "register_kind", "resolve_inside", "sha256_bytes",
    "sha256_file", "verify", "write_manifest", "write_with_card", "writing",
]
