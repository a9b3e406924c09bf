"""The options of `isood build-splits`: defaults < TOML file (``--config build.toml``) < command line.

Keys of the TOML file are the long option names, with - or _ (optionally under a ``[build-splits]`` table);
relative paths in it are relative to the TOML file.
"""

from __future__ import annotations

import os
import tomllib
from dataclasses import asdict, dataclass, fields, replace
from pathlib import Path
from typing import Any, Mapping

from isood.ann import BACKENDS
from isood.defaults import DEFAULT_VERIFY, LAID_TRIPLETS, NA_THRESHOLD, N_LEVELS, QUANTILE_CLIP
from isood.errors import BadInputError
from isood.grid import check_levels
from isood.defaults import check_seed
from isood.textio import read_text
from manifests.verify import check_verify_mode

__all__ = ["BuildConfig", "load_build_config", "parse_quantile", "read_toml", "splits_config", "PATH_KEYS"]

#: Options holding paths (resolved against the TOML file's folder when they come from it).
PATH_KEYS = ("id", "test", "laid", "class_filter", "out")
_POSITIVE = ("na_threshold", "triplets", "batch_size", "shard_size")
_AT_LEAST = {"laid_steps": 1, "workers": 0}


@dataclass(frozen=True)
class BuildConfig:
    """Options of `isood build-splits` (CLI flag = field name with - for _)."""

    id: str | None = None
    test: str | None = None
    out: str | None = None
    clip: str | None = None
    laid: str | None = None
    labels: str = "21k"
    class_filter: str | None = None
    exclude_id_classes: bool = False
    levels: int = N_LEVELS
    na_threshold: int = NA_THRESHOLD
    clip_quantile: tuple[float, float] = QUANTILE_CLIP
    triplets: int = LAID_TRIPLETS
    laid_steps: int | None = None
    seed: int = 0
    backend: str = "auto"
    ann_recall: float | None = None
    batch_size: int = 64
    workers: int | None = None
    shard_size: int = 10_000
    device: str | None = None
    cache_dir: str | None = None
    verify: str = DEFAULT_VERIFY
    progress: bool = True


_KNOWN = tuple(f.name for f in fields(BuildConfig))


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


def _resolve(key: str, value: Any, base: Path) -> Any:
    """A TOML value with its relative paths made relative to the TOML file's folder ``base``."""
    if key in PATH_KEYS and isinstance(value, str):
        return str(base / Path(value).expanduser())
    if key == "clip" and isinstance(value, str) and value.startswith("local-dir:"):
        return "local-dir:" + str(base / Path(value[len("local-dir:"):]).expanduser())
    if key == "labels" and isinstance(value, str) and (base / value).exists():
        return str(base / value)
    return value


def read_toml(config_file: str | os.PathLike) -> dict[str, Any]:
    """The options of a TOML file (keys with _), paths resolved against its folder; unknown keys refused."""
    path = Path(config_file)
    try:
        data = tomllib.loads(read_text(path, what="--config"))
    except tomllib.TOMLDecodeError as e:
        raise BadInputError(f"--config {path}: invalid TOML ({' '.join(str(e).split())})") from None
    if set(data) in ({"build-splits"}, {"build_splits"}):
        data = next(iter(data.values()))
    values = {}
    for key, value in data.items():
        k = key.replace("-", "_")
        if k not in _KNOWN:
            raise BadInputError(f"--config {path}: unknown key {key!r}; known: {', '.join(sorted(_KNOWN))}")
        values[k] = _resolve(k, value, path.parent)
    return values


def _check_ann(cfg: BuildConfig) -> None:
    """--ann-recall is a number in (0, 1] and asks for approximate search (not an exact --backend)."""
    r = cfg.ann_recall
    if r is None:
        return
    try:
        value = float(r)
    except (TypeError, ValueError):
        value = float("nan")
    if isinstance(r, bool) or not 0.0 < value <= 1.0:
        raise BadInputError(f"--ann-recall must be a number in (0, 1] (e.g. 0.99), got {r!r}")
    if cfg.backend in ("torch", "faiss-flat"):
        raise BadInputError(f"--ann-recall {value:g} asks for approximate search but --backend {cfg.backend} is exact; "
                            "pass --backend auto or faiss-ivf, or drop --ann-recall")


def _check(cfg: BuildConfig) -> BuildConfig:
    """Validate the merged options (one-line errors) and normalise paths to strings."""
    cfg = replace(cfg, clip_quantile=parse_quantile(cfg.clip_quantile))
    check_levels(cfg.levels)
    for name in _POSITIVE:
        v = getattr(cfg, name)
        if not isinstance(v, int) or isinstance(v, bool) or v < (0 if name == "na_threshold" else 1):
            raise BadInputError(f"--{name.replace('_', '-')} must be a positive integer, got {v!r}")
    for name, least in _AT_LEAST.items():  # optional counts
        v = getattr(cfg, name)
        if v is not None and (not isinstance(v, int) or isinstance(v, bool) or v < least):
            raise BadInputError(f"--{name.replace('_', '-')} must be an integer >= {least}, got {v!r}")
    if cfg.seed is not None:
        check_seed(cfg.seed)
    if cfg.backend not in BACKENDS:
        raise BadInputError(f"--backend {cfg.backend!r} is unknown; pass one of {', '.join(BACKENDS)}")
    _check_ann(cfg)
    for name in ("id", "test", "out"):
        if not getattr(cfg, name):
            raise BadInputError(f"--{name} is required (on the command line or in --config)")
    check_verify_mode(cfg.verify)
    paths: dict[str, Any] = {name: str(getattr(cfg, name)) for name in PATH_KEYS + ("cache_dir",) if getattr(cfg, name) is not None}
    return replace(cfg, **paths)


def load_build_config(config_file: str | os.PathLike | None = None,
                      overrides: Mapping[str, Any] | None = None) -> BuildConfig:
    """Merge defaults < TOML file < ``overrides`` (the command line: option name with _ -> value, ``None`` =
    not given). An unknown override name is a programming error (``TypeError``)."""
    values: dict[str, Any] = read_toml(config_file) if config_file is not None else {}
    for k, v in (overrides or {}).items():
        if k not in _KNOWN:
            raise TypeError(f"unknown build option {k}")
        if v is not None:
            values[k] = v
    return _check(BuildConfig(**values))


def splits_config(cfg: BuildConfig, *, clip_identity: str | None, id_root: str | None,
                  test_root: str | None) -> dict[str, Any]:
    """The config a splits manifest records: every option (but ``progress`` and ``verify``) plus what the views
    read (``clip_identity``, ``id_root``, ``test_root``). Paths are absolute (explicit roots: a manifest read
    from another working directory still names the same folders)."""
    config = {k: v for k, v in asdict(cfg).items() if k not in ("progress", "verify")}
    for key in PATH_KEYS + ("cache_dir",):
        if config.get(key):
            config[key] = os.path.abspath(config[key])
    config.update(clip_identity=clip_identity, id_root=_absolute(id_root), test_root=_absolute(test_root))
    return config


def _absolute(path: str | None) -> str | None:
    return os.path.abspath(path) if path else None
