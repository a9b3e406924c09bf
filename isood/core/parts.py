"""Job arrays (``--num-shards N --shard-index i``): which units task i makes, and the ``part`` entry its part
manifest records (``manifests.parts`` reads the parts; each stage merges its own).
"""

from __future__ import annotations

from isood.core.errors import BadInputError

__all__ = ["PART_SUFFIX", "PER_TASK_KEYS", "check_shard_args", "selected_units", "part_info"]


#: A job-array task writes a manifest of kind ``<kind>-part``.
PART_SUFFIX = "-part"

#: Config keys allowed to differ between the tasks of one array (machine-dependent, not content).
PER_TASK_KEYS = frozenset({"part", "workers", "device"})


def check_shard_args(num_shards: int, shard_index: int) -> None:
    """A one-line error for a ``--shard-index`` outside ``--num-shards`` (each one's own bound is its description's,
    ``isood.core.shared_options.JobArrayFields``, checked before)."""
    if not 0 <= int(shard_index) < int(num_shards):
        raise BadInputError(
            f"--shard-index must be in 0..{int(num_shards) - 1}, got {shard_index} "
            "(0-based: sbatch --array=0-N-1 with --shard-index $SLURM_ARRAY_TASK_ID)")


def selected_units(n_units: int, num_shards: int, shard_index: int) -> list[int]:
    """The units of task ``shard_index`` of ``num_shards``: every k in 0..n_units-1 with k % num_shards == i
    (round robin: equal shares whatever N is, and a resubmitted task touches only its own units)."""
    return list(range(int(shard_index), int(n_units), int(num_shards)))


def part_info(num_shards: int, shard_index: int, n_units: int, unit: str) -> dict:
    """The ``part`` entry of a part manifest's config."""
    return {"index": int(shard_index), "count": int(num_shards), "units": int(n_units), "unit": unit}
