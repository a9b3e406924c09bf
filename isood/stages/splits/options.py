"""The options of `isood build-splits`, one description each (``isood.core.optspec``): defaults < TOML file
(``--config build.toml``) < command line.

Keys of the TOML file are the long option names, with - or _ (optionally under a ``[build-splits]`` table);
relative paths in it (and ``local-dir:PATH`` CLIPs, and a ``labels`` file that exists there) are relative to the
TOML file (``isood.core.optconfig.from_config``).
"""

from __future__ import annotations

import os
from dataclasses import dataclass, fields, replace
from typing import Any, Mapping

from isood.features.ann import BACKENDS
from isood.core.defaults import LAID_TRIPLETS, QUANTILE_CLIP
from isood.core.errors import BadInputError
from isood.core.optconfig import from_config, merge_values, recorded
from isood.core.optspec import check, option
from isood.core.shared_options import (batch_size_option, decode_processes_option, device_option, levels_option,
                                       na_threshold_option, seed_option, shard_size_option, verify_option)

__all__ = ["SplitsOptions", "load_splits_options", "validate", "parse_quantile", "read_toml", "splits_config",
           "PATH_KEYS"]

#: Options holding paths (absolute in the manifest's config: explicit roots, never the working directory).
PATH_KEYS = ("id", "test", "laid", "class_filter", "out")
_SETS = "image folder / file list, or a feature set (isood extract output, or features.npy + index.parquet)"


@dataclass(frozen=True, kw_only=True)
class SplitsOptions:
    """Options of `isood build-splits`, one description each (flag = field name with - for _)."""

    id: str | None = option(None, kind="path", required=True, metavar="SET", help=f"ID set: {_SETS}.")
    test: str | None = option(None, kind="path", required=True, metavar="SET",
                              help="Test images (same forms as --id).")
    out: str | None = option(None, kind="path", required=True, metavar="DIR",
                             help="Output directory (splits manifest).")
    clip: str | None = option(None, metavar="MODEL:PRETRAINED",
                              help="CLIP encoder (MODEL:PRETRAINED, local-dir:PATH, hf-hub:...); needed to extract "
                                   "images or train LAID.")
    laid: str | None = option(None, kind="path", metavar="FILE",
                              help="A trained LAID W (.safetensors); default: train it on label x template texts.")
    labels: str = option("21k", metavar="LABELS", maybe_path=True,
                         help="LAID labels: 21k, 1k, 21k-p, ..., a class-filter manifest, or a file (wnids or "
                              "labels).")
    class_filter: str | None = option(None, kind="path", metavar="DIR",
                                      help="Keep only test images whose wnid this class-filter manifest keeps.")
    exclude_id_classes: bool = option(False, secondary="--keep-id-classes", help="Drop test images of ID wnids.")
    levels: int = levels_option("Levels per axis.")
    na_threshold: int = na_threshold_option()
    clip_quantile: Any = option(QUANTILE_CLIP, kind="str", objects=True, metavar="LO,HI",
                                help="Quantiles bounding the level range: LO,HI or LO (then HI = 1 - LO).")
    triplets: int = option(LAID_TRIPLETS, least=1, help="LAID training triplets.")
    laid_steps: int | None = option(None, least=1, help="LAID optimisation steps (default: isood.science.laid's).")
    seed: int = seed_option("Seed of triplet sampling and LAID training.")
    backend: str = option("auto", choices=BACKENDS, metavar="BACKEND",
                          help="Nearest-neighbour backend: auto (exact; approximate IVF with --ann-recall), torch, "
                               "faiss-flat, faiss-ivf (nprobe 32).")
    ann_recall: float | None = option(None, least=0.0, least_open=True, most=1.0, metavar="RECALL",
                                      help="Search approximately, tuned to this recall@1 (e.g. 0.99) on a "
                                           "sample of the test images against exact search; the achieved recall "
                                           "and level agreement go into the manifest. Default: exact.")
    ann_levels: float | None = option(None, least=0.0, least_open=True, most=1.0, metavar="SHARE",
                                      help="Search approximately, keeping this share of the images' levels "
                                           "(e.g. 0.999, > 0): IVF answers plus an exact search of every image "
                                           "an edge is within reach of; the held-out level agreement and its "
                                           "lower bound go into the manifest. Default: exact.")
    batch_size: int = batch_size_option("Images per batch when extracting.")
    decode_processes: int | None = decode_processes_option("when extracting")
    shard_size: int = shard_size_option("Images per feature shard when extracting.")
    device: str | None = device_option()
    cache_dir: str | None = option(None, metavar="DIR", path=True,
                                   help="Text-feature cache (default $ISOOD_CACHE_DIR/text-features).")
    verify: str = verify_option()
    progress: bool = option(True, cli=False, help="Progress bars.")


_KNOWN = tuple(f.name for f in fields(SplitsOptions))


def parse_quantile(value: Any) -> tuple[float, float]:
    """``0.01`` -> (0.01, 0.99); ``"0.01,0.99"`` or ``[0.01, 0.99]`` -> (0.01, 0.99)."""
    try:
        if isinstance(value, str):
            parts = [float(p) for p in value.replace(" ", "").split(",") if p]
        elif isinstance(value, (list, tuple)):
            parts = [float(p) for p in value]
        else:
            parts = [float(value)]
    except (TypeError, ValueError):
        parts = []
    if len(parts) == 1:
        parts = [parts[0], 1.0 - parts[0]]
    if len(parts) != 2 or not 0.0 <= parts[0] < parts[1] <= 1.0:
        raise BadInputError(f"--clip-quantile {value!r}: pass LO,HI quantiles with 0 <= LO < HI <= 1 (e.g. 0.01,0.99) "
                            "or one LO")
    return (parts[0], parts[1])


def read_toml(config_file: str | os.PathLike) -> dict[str, Any]:
    """The options of a build-splits TOML file (``isood.core.optconfig.from_config``: keys with _, paths resolved
    against its folder, unknown keys refused)."""
    return from_config(SplitsOptions, config_file, "build-splits")


def _check_ann(cfg: SplitsOptions) -> None:
    """--ann-recall / --ann-levels (checked numbers in (0, 1], their description's bound): one of them, asking
    for approximate search (not an exact --backend)."""
    if cfg.ann_recall is not None and cfg.ann_levels is not None:
        raise BadInputError(f"pass either --ann-recall ({cfg.ann_recall}) or --ann-levels ({cfg.ann_levels}), not both")
    for flag, value in (("--ann-recall", cfg.ann_recall), ("--ann-levels", cfg.ann_levels)):
        if value is not None and cfg.backend in ("torch", "faiss-flat"):
            raise BadInputError(f"{flag} {value:g} asks for approximate search but --backend {cfg.backend} is "
                                f"exact; pass --backend auto or faiss-ivf, or drop {flag}")


def validate(cfg: SplitsOptions) -> SplitsOptions:
    """The checked options (one-line errors naming the flag, ``isood.core.optspec.check``), the quantiles
    normalised, paths as strings; ``--id``, ``--test`` and ``--out`` required (command line or ``--config``)."""
    cfg = check(cfg)
    cfg = replace(cfg, clip_quantile=parse_quantile(cfg.clip_quantile))
    _check_ann(cfg)
    for name in ("id", "test", "out"):
        if not getattr(cfg, name):
            raise BadInputError(f"--{name} is required (on the command line or in --config)")
    return cfg


def load_splits_options(config_file: str | os.PathLike | None = None,
                      overrides: Mapping[str, Any] | None = None) -> SplitsOptions:
    """Merge defaults < TOML file < ``overrides`` (the command line: option name with _ -> value, ``None`` =
    not given), validated. An unknown override name is a programming error (``TypeError``)."""
    unknown = set(overrides or {}) - set(_KNOWN)
    if unknown:
        raise TypeError(f"unknown build option {sorted(unknown)[0]}")
    config = read_toml(config_file) if config_file is not None else {}
    return validate(merge_values(SplitsOptions, dict(overrides or {}), config))


def splits_config(cfg: SplitsOptions, *, clip_identity: str | None, id_root: str | None,
                  test_root: str | None) -> dict[str, Any]:
    """The config a splits manifest records: every option (but ``progress`` and ``verify``) plus what the views
    read (``clip_identity``, ``id_root``, ``test_root``). Paths, the ``--labels`` file and the ``--clip`` spec
    (``local-dir:PATH``) are absolute (``isood.core.optconfig.recorded``: explicit roots, so a manifest read from another
    working directory still names the same folders and model)."""
    config = recorded(cfg, skip=("progress", "verify"))  # paths and the --clip spec absolute
    if config.get("cache_dir"):
        config["cache_dir"] = os.path.abspath(config["cache_dir"])
    config.update(clip_identity=clip_identity, id_root=_absolute(id_root), test_root=_absolute(test_root))
    return config


def _absolute(path: str | None) -> str | None:
    return os.path.abspath(path) if path else None
