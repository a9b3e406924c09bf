"""Job arrays without Ray (Slurm ``--array``): ``--num-shards N --shard-index i`` and ``isood merge``.

Task i of N does every unit k with ``k % N == i`` and writes a *part*: a manifest of kind ``<kind>-part`` with
the unit files it made (at the paths a single run gives them) and what the merge needs. ``isood merge PART...
--out DIR`` checks that the parts are the N parts of one run (same configuration, every index once, every
unit once, every file hash verified) and writes the manifest a single run writes, through the same code:
the data files and their hashes are identical to those of a single run.

Units (chosen so that a unit is never split, hence computed exactly as a single run computes it):

* ``isood extract``: feature shard k (files ``k*shard_size .. (k+1)*shard_size`` of the sorted list);
* ``isood generate-syn``: pipeline batch b (planned images ``b*batch_size .. (b+1)*batch_size``; the prompt
  planning is cheap and deterministic, so every task repeats it and generates only its batches).

Round robin (k mod N) rather than contiguous blocks: shard sizes are equal, so each task gets the same share
whatever N is, and a resumed or re-submitted task only touches its own units.

    sbatch --array=0-7 --wrap 'isood extract --images ROOT --clip C --out parts/$SLURM_ARRAY_TASK_ID \\
                               --num-shards 8 --shard-index $SLURM_ARRAY_TASK_ID'
    isood merge parts/* --out features
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path
from typing import Sequence

from isood.errors import IsoodError

PART_SUFFIX = "-part"
#: config keys allowed to differ between the tasks of one array (machine-dependent, not content)
PER_TASK_KEYS = frozenset({"part", "workers", "device"})


def check_shard_args(num_shards: int, shard_index: int) -> None:
    """One-line errors for impossible ``--num-shards`` / ``--shard-index`` values."""
    if int(num_shards) < 1:
        raise IsoodError(f"--num-shards must be >= 1, got {num_shards}")
    if not 0 <= int(shard_index) < int(num_shards):
        raise IsoodError(
            f"--shard-index must be in 0..{int(num_shards) - 1}, got {shard_index} "
            "(0-based: sbatch --array=0-N-1 with --shard-index $SLURM_ARRAY_TASK_ID)"
        )


def selected_units(n_units: int, num_shards: int, shard_index: int) -> list[int]:
    """The units of task ``shard_index`` of ``num_shards``: every k in 0..n_units-1 with k % num_shards == i."""
    return list(range(int(shard_index), int(n_units), int(num_shards)))


def part_info(num_shards: int, shard_index: int, n_units: int, unit: str) -> dict:
    """The ``part`` entry of a part manifest's config."""
    return {"index": int(shard_index), "count": int(num_shards), "units": int(n_units), "unit": unit}


def link_or_copy(src: str | os.PathLike, dst: str | os.PathLike) -> None:
    """Put ``src`` at ``dst`` atomically: a hard link where possible (same file system, no copy), else a copy."""
    src, dst = Path(src), Path(dst)
    dst.parent.mkdir(parents=True, exist_ok=True)
    tmp = dst.with_name(f".~{dst.name}.{os.getpid()}.tmp")
    tmp.unlink(missing_ok=True)
    try:
        try:
            os.link(src, tmp)
        except OSError:
            shutil.copyfile(src, tmp)
        os.replace(tmp, dst)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def read_parts(dirs: Sequence[str | os.PathLike]) -> tuple[list, str, dict]:
    """Read and check the part manifests of one job array: ``(parts sorted by index, final kind, config)``.

    Checks: every directory is a verified part manifest (every file hash), one kind, one part count N, every
    index 0..N-1 exactly once, and the same configuration apart from :data:`PER_TASK_KEYS`.
    """
    import manifests

    if not dirs:
        raise IsoodError("isood merge needs the part directories written with --num-shards/--shard-index")
    parts = []
    for d in dirs:
        try:
            m = manifests.read(d)
        except IsoodError as e:
            raise IsoodError(f"{d}: not a finished part ({e}); rerun that array task") from None
        if not m.kind.endswith(PART_SUFFIX) or "part" not in (m.meta.get("command") or {}).get("config", {}):
            raise IsoodError(f"{d}: a {m.kind!r} manifest, not a part; pass directories written with --num-shards N --shard-index i")
        report = manifests.verify(d)
        if not report.ok:
            raise IsoodError(f"{d}: part fails verification ({'; '.join(report.lines()[:3])}); rerun that array task")
        parts.append(m)
    kinds = sorted({m.kind for m in parts})
    if len(kinds) > 1:
        raise IsoodError(f"parts of different kinds ({', '.join(kinds)}); merge the parts of one run")
    configs = [m.meta["command"]["config"] for m in parts]
    counts = sorted({c["part"]["count"] for c in configs})
    if len(counts) > 1:
        raise IsoodError(f"parts of arrays of different sizes (--num-shards {', '.join(map(str, counts))}); merge the parts of one run")
    count = counts[0]
    seen: dict[int, Path] = {}
    for m, c in zip(parts, configs):
        i = int(c["part"]["index"])
        if i in seen:
            raise IsoodError(f"part {i} given twice ({seen[i]} and {m.root}); pass each part once")
        seen[i] = m.root
    missing = sorted(set(range(count)) - set(seen))
    if missing:
        raise IsoodError(f"parts {missing[:10]} of {count} are missing; run those array tasks (--shard-index) first")
    base = {k: v for k, v in configs[0].items() if k not in PER_TASK_KEYS}
    for m, c in zip(parts, configs):
        other = {k: v for k, v in c.items() if k not in PER_TASK_KEYS}
        if other != base:
            diff = sorted(k for k in set(base) | set(other) if base.get(k) != other.get(k))
            raise IsoodError(f"{m.root} comes from another run ({', '.join(diff[:5])} differ); merge the parts of one run")
    if len({c["part"]["units"] for c in configs}) > 1:
        raise IsoodError("parts disagree on the number of units; merge the parts of one run")
    order = sorted(range(len(parts)), key=lambda j: int(configs[j]["part"]["index"]))
    parts = [parts[j] for j in order]
    return parts, kinds[0][: -len(PART_SUFFIX)], dict(parts[0].meta["command"]["config"])


def merge_parts(dirs: Sequence[str | os.PathLike], out: str | os.PathLike, *, argv: list[str] | None = None):
    """Combine the parts of one job array into the manifest a single run writes in ``out`` (see the module
    docstring). Returns the manifest. ``out`` may not be one of the parts."""
    import manifests

    parts, kind, config = read_parts(dirs)
    out = Path(out)
    for m in parts:
        if out.resolve() == Path(m.root).resolve():
            raise IsoodError(f"--out {out} is one of the parts; pass a new directory")
    other = manifests.existing_kind(out)
    if other and other != kind:
        raise IsoodError(f"--out {out} holds a {other!r} manifest, not {kind!r}; pass another directory")
    if kind == "features":
        from isood.features import merge_feature_parts

        merge = merge_feature_parts
    elif kind == "syn-is":
        from generation.syn import merge_syn_parts

        merge = merge_syn_parts
    else:
        raise IsoodError(f"isood merge does not know parts of kind {kind!r}")
    out.mkdir(parents=True, exist_ok=True)
    manifests.park(out)  # unfinished until the merged manifest lands (the merge unparks just before writing)
    return merge(parts, out, config, argv=argv)
