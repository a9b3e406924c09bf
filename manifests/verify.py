"""Verification: recompute every hash of a manifest directory and name what is missing, extra or changed, and
whether it lists every table its kind requires (a table dropped from manifest.json together with its file leaves
every hash intact, yet every reader would refuse the manifest). Columns are not checked here: verify is about
integrity, and a manifest written by an older writer (tests/manifests/fixtures/v1_splits) must keep verifying."""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path

from isood.runtime import TMP_PREFIX, sha256_file
from manifests.schema import kind_spec
from manifests.store import MANIFEST_FILE, read

__all__ = ["VerifyReport", "verify"]


@dataclass
class VerifyReport:
    root: Path
    missing: list[str]
    extra: list[str]
    changed: list[str]
    invalid: list[str] = field(default_factory=list)  # required tables of the kind absent from manifest.json

    @property
    def ok(self) -> bool:
        return not (self.missing or self.extra or self.changed or self.invalid)

    def lines(self) -> list[str]:
        return (
            [f"missing: {p}" for p in self.missing]
            + [f"extra: {p}" for p in self.extra]
            + [f"changed: {p}" for p in self.changed]
            + [f"schema: {p}" for p in self.invalid]
        )


def verify(root: str | os.PathLike) -> VerifyReport:
    """Recompute every file hash; name each missing, extra (present but unlisted) and changed file."""
    m = read(root)
    listed = {rec["path"]: rec for rec in m.meta["files"]}
    missing, changed = [], []
    for rel, rec in sorted(listed.items()):
        p = m.path(rel)
        if not p.is_file():
            missing.append(rel)
        elif p.stat().st_size != rec.get("bytes", p.stat().st_size) or sha256_file(p) != rec["sha256"]:
            changed.append(rel)
    present = {
        q.relative_to(m.root).as_posix()
        for q in m.root.rglob("*")
        if q.is_file() and q.name != MANIFEST_FILE
    }
    extra = sorted(p for p in present - set(listed) if not Path(p).name.startswith(TMP_PREFIX))
    spec = kind_spec(m.kind)
    invalid = [] if spec is None else [
        f"{m.kind} manifest lists no table {name!r}; rebuild it with {spec.writer}"
        for name, table in spec.tables.items() if not table.optional and name not in m.tables]
    return VerifyReport(root=m.root, missing=missing, extra=extra, changed=changed, invalid=invalid)
