"""The options many commands share, described once (``isood.core.optspec.option``): ``--verify``, ``--seed``,
``--levels``, ``--out``, ``--na-threshold``, ``--batch-size``, ``--shard-size``, ``--workers``, ``--device``, and the engine and
job-array fields (``EngineFields``, ``JobArrayFields``)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from isood.core.defaults import (DEFAULT_BATCH_SIZE, DEFAULT_SHARD_SIZE, DEFAULT_VERIFY, ENGINES, LEVELS_NOTE, MAX_LEVELS, N_LEVELS,
                                 NA_THRESHOLD, SEED_MAX, VERIFY_HELP, VERIFY_MODES)
from isood.core.optspec import REQUIRED, check_described, option
from isood.core.workers import MAX_DECODE_PROCESSES

__all__ = ["verify_option", "seed_option", "check_seed", "out_option", "levels_option", "na_threshold_option", "batch_size_option",
           "shard_size_option", "decode_processes_option", "device_option", "EngineFields", "JobArrayFields"]


def verify_option() -> Any:
    """``--verify fast|full`` of every command that reads manifests."""
    return option(DEFAULT_VERIFY, help=VERIFY_HELP, choices=VERIFY_MODES, metavar="MODE")


def seed_option(help: str = "Seed.") -> Any:
    """``--seed``: one bound for every command (``isood.core.defaults.SEED_MAX``)."""
    return option(0, help=help, least=0, most=SEED_MAX,
                  why="2**31 - 1: faiss and numpy's legacy generator take 31/32-bit seeds")


def check_seed(seed: Any) -> int:
    """``seed`` checked against ``seed_option`` (for the Python API's ``seed=`` arguments), as an ``int``."""
    return check_described("seed", seed_option(), seed)


def levels_option(help: str = "Levels per axis of the grid.") -> Any:
    """``--levels``: one bound for every command (``isood.core.defaults.MAX_LEVELS``; ``isood.science.grid.check_levels``)."""
    return option(N_LEVELS, help=help, least=1, most=MAX_LEVELS, why=LEVELS_NOTE)


def out_option(help: str = "Output manifest directory.", *, required: bool = True) -> Any:
    """``--out``: the folder a command writes (``manifests.writing``)."""
    return option(REQUIRED if required else None, help=help, kind="path", metavar="DIR")


def na_threshold_option(help: str = "A cell with fewer images is N/A.", *, from_manifest: bool = False) -> Any:
    """``--na-threshold``: one bound for every command (a cell needs an image to be measured). A command that
    writes a grid defaults to ``NA_THRESHOLD``; one that reads a grid manifest (``from_manifest``) defaults to
    None: the manifest's own threshold (``GridView.na_threshold``), which an explicit value overrides."""
    return option(None if from_manifest else NA_THRESHOLD, help=help, least=1,
                  why=f"a cell needs images to be measured; IS-OOD uses {NA_THRESHOLD}")


def batch_size_option(help: str = "Images per batch.", default: int = DEFAULT_BATCH_SIZE) -> Any:
    """``--batch-size``: images per forward pass."""
    return option(default, help=help, least=1)


def shard_size_option(help: str = "Images per feature shard (the unit of resuming).") -> Any:
    """``--shard-size``: images per feature shard, in every command that extracts."""
    return option(DEFAULT_SHARD_SIZE, help=help, least=1)


def decode_processes_option(help: str = "") -> Any:
    """``--workers`` (the field ``decode_processes``): the image decoders of each model worker, in every command
    that reads images (``isood.core.workers``; None: the one default rule, ``resolve_workers``)."""
    text = ("Image-decoding processes per model worker, running ahead of the model (0: decode in the model's "
            "process; default: CPUs - 1, at most 32)" + (f"; {help}" if help else "") + ".")
    return option(None, flag="--workers", help=text, least=0, most=MAX_DECODE_PROCESSES)


def device_option(help: str = "") -> Any:
    """``--device``: where the model runs."""
    return option(None, metavar="DEVICE", help="cpu, cuda or cuda:N (default: cuda when available)"
                                               + (f"; {help}" if help else "") + ".")


@dataclass(frozen=True, kw_only=True)
class EngineFields:
    """The engine options of the commands that run on Ray too (extract, build-splits, generate-syn)."""

    engine: str = option("local", choices=ENGINES, metavar="ENGINE",
                         help="local (this process) or ray (Ray Data actors; pip install 'isood[ray]').")
    ray_address: str | None = option(None, metavar="ADDRESS",
                                     help="Ray cluster to join (auto, HOST:PORT, ray://HOST:10001; default: "
                                          "$RAY_ADDRESS, else a local one).")
    ray_actors: int | None = option(None, least=1, flag="--ray-workers", metavar="N",
                                    help="Ray engine: model actors (default: one per GPU, else per CPU).")
    num_gpus_per_worker: float | None = option(None, least=0, help="GPUs per Ray actor (default: 1 when the "
                                                                   "cluster has GPUs, else 0).")


@dataclass(frozen=True, kw_only=True)
class JobArrayFields:
    """A job array's task (``isood.core.parts``): the units split over ``num_shards`` tasks, this one ``shard_index``."""

    num_shards: int = option(1, least=1, help="Job arrays: split the work over this many tasks (merge with "
                                              "`isood merge`).")
    shard_index: int = option(0, least=0, help="Job arrays: this task's index, 0..num-shards-1 (e.g. "
                                               "$SLURM_ARRAY_TASK_ID).")
