"""Versioned, hashed manifests: the contract between isood's stages (JSON + Parquet, with provenance)."""

from manifests.paths import check_relative, resolve_inside
from manifests.store import (
    MANIFEST_FILE,
    SCHEMA_NAME,
    SCHEMA_VERSION,
    Manifest,
    VerifyReport,
    atomic_write_bytes,
    existing_kind,
    park,
    unpark,
    input_record,
    parquet_bytes,
    read,
    sha256_file,
    verify,
    write_manifest,
)
from manifests.card import add_card, dataset_card, write_with_card

__all__ = [
    "MANIFEST_FILE", "SCHEMA_NAME", "SCHEMA_VERSION", "Manifest", "VerifyReport", "atomic_write_bytes", "existing_kind", "park", "unpark",
    "check_relative", "input_record", "parquet_bytes", "read", "resolve_inside", "sha256_file", "verify",
    "write_manifest", "write_with_card", "dataset_card", "add_card",
]
