"""Job-array parts (``--num-shards N --shard-index i``): read and check the part manifests of one run.

Task i of N writes a manifest of kind ``<kind>-part`` holding the unit files it made at the paths a single run
gives them, and a ``part`` entry in its config (``isood.core.parts.part_info``). ``read_parts`` checks that the
given directories are the N parts of one run: every part verifies (every file hash), one kind, one N, every index
0..N-1 exactly once, the same configuration apart from ``isood.core.parts.PER_TASK_KEYS``. Merging the parts into the
kind's manifest is the job of the stage that writes that kind; the CLI maps the kind to its merge.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Sequence

from isood.core.errors import BadInputError, IsoodError
from isood.core.parts import PART_SUFFIX, PER_TASK_KEYS
from manifests.store import Manifest, read
from manifests.verify import verify

__all__ = ["read_parts"]


def _read_part(d: str | os.PathLike) -> Manifest:
    try:
        m = read(d)
    except IsoodError as e:
        raise BadInputError(f"{d}: not a finished part ({e}); rerun that array task") from None
    if not m.kind.endswith(PART_SUFFIX) or "part" not in m.config:
        raise BadInputError(f"{d}: a {m.kind!r} manifest, not a part; pass directories written with "
                            "--num-shards N --shard-index i")
    report = verify(d)
    if not report.ok:
        raise BadInputError(f"{d}: part fails verification ({'; '.join(report.lines()[:3])}); rerun that array task")
    return m


def _check_indices(parts: Sequence[Manifest]) -> None:
    counts = sorted({int(m.config["part"]["count"]) for m in parts})
    if len(counts) > 1:
        raise BadInputError(f"parts of arrays of different sizes (--num-shards {', '.join(map(str, counts))}); "
                            "merge the parts of one run")
    seen: dict[int, Path] = {}
    for m in parts:
        i = int(m.config["part"]["index"])
        if i in seen:
            raise BadInputError(f"part {i} given twice ({seen[i]} and {m.root}); pass each part once")
        seen[i] = m.root
    missing = sorted(set(range(counts[0])) - set(seen))
    if missing:
        raise BadInputError(f"parts {missing[:10]} of {counts[0]} are missing; run those array tasks "
                            "(--shard-index) first")


def _check_same_run(parts: Sequence[Manifest]) -> None:
    base = {k: v for k, v in parts[0].config.items() if k not in PER_TASK_KEYS}
    for m in parts[1:]:
        other = {k: v for k, v in m.config.items() if k not in PER_TASK_KEYS}
        if other != base:
            diff = sorted(k for k in set(base) | set(other) if base.get(k) != other.get(k))
            raise BadInputError(f"{m.root} comes from another run ({', '.join(diff[:5])} differ); merge the parts "
                                "of one run")
    if len({int(m.config["part"]["units"]) for m in parts}) > 1:
        raise BadInputError("parts disagree on the number of units; merge the parts of one run")


def read_parts(dirs: Sequence[str | os.PathLike]) -> tuple[list[Manifest], str, dict]:
    """The part manifests of one job array, checked (module docstring): ``(parts sorted by index, the kind
    they merge into, the shared config)``."""
    if not dirs:
        raise BadInputError("isood merge needs the part directories written with --num-shards/--shard-index")
    parts = [_read_part(d) for d in dirs]
    kinds = sorted({m.kind for m in parts})
    if len(kinds) > 1:
        raise BadInputError(f"parts of different kinds ({', '.join(kinds)}); merge the parts of one run")
    _check_indices(parts)
    _check_same_run(parts)
    parts = sorted(parts, key=lambda m: int(m.config["part"]["index"]))
    return parts, kinds[0][: -len(PART_SUFFIX)], dict(parts[0].config)
