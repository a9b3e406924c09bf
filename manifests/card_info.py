"""What a dataset card says about its data besides the configs: typed `features` per config, and provenance
without machine paths.

- ``config_features``: the `dataset_info` of the card's YAML, one entry per config with its `features` (the Hub's
  schema, written by ``datasets.Features``): each column's ``Value`` type from the Parquet file behind the config;
  the ``config_by`` column of the main table (e.g. `cell`) a ``ClassLabel`` whose names are the kind's
  ``config_values`` (every cell of the grid) when every row's value is one of them; an ``image`` column (a published
  Syn-IS Parquet with embedded images, ``manifests.hub_images``) an ``Image``. `datasets.load_dataset(DIR)` loads
  each config with these types.
- ``public_text`` / ``public_argv``: the card's command line, config and inputs with every absolute path cut to
  ``<local>/<last component>`` (a card is published; where the author's files lived is not its content, and
  manifest.json keeps the full paths for the tools that need them). The command is named by its program name
  (``isood``), never by the interpreter or virtual environment that ran it.
"""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Any, Iterable, Mapping, Sequence

import pyarrow.compute as pc
import pyarrow.parquet as pq

__all__ = ["LOCAL", "public_text", "public_argv", "config_features", "card_dataset_info", "IMAGE_COLUMN"]

LOCAL = "<local>"
#: The column of embedded images in a published image dataset (``datasets.Image``).
IMAGE_COLUMN = "image"
# an absolute POSIX path (not part of a URL or of a relative path), or a Windows drive path
_ABS = re.compile(r"(?<![\w./~<>-])(?:/(?:[^\s/\"'`,;|)\]]+/)*([^\s/\"'`,;|)\]]+)/?|[A-Za-z]:\\(?:[^\s\\\"'`,;|]+\\)*([^\s\\\"'`,;|]+))")


def public_text(text: str) -> str:
    """``text`` with every absolute path replaced by ``<local>/<its last component>``."""
    return _ABS.sub(lambda m: f"{LOCAL}/{m.group(1) or m.group(2) or ''}", str(text))


def public_argv(argv: Sequence[Any]) -> list[str]:
    """A command line for a card: the program by its name (``/venv/bin/isood`` -> ``isood``), every absolute path
    in the arguments cut (``public_text``)."""
    words = [str(a) for a in argv]
    if not words:
        return []
    return [os.path.basename(words[0]) or words[0], *(public_text(w) for w in words[1:])]


def _features_of(path: Path):
    import datasets  # ~1 s to import: only when a card is drawn

    return datasets.Features.from_arrow_schema(pq.read_schema(path))


def _labels_cover(root: Path, main_path: str | None, column: str, names: Iterable[str]) -> bool:
    """Whether every value of ``column`` in the main table (one column read) is one of ``names``."""
    if main_path is None or not (root / main_path).is_file():
        return False
    values = pc.unique(pq.read_table(root / main_path, columns=[column]).column(column)).to_pylist()
    allowed = set(names)
    return all(v is not None and str(v) in allowed for v in values)


def config_features(root: str | os.PathLike, configs: Mapping[str, Mapping[str, Any]], *,
                    main_configs: Iterable[str], main_path: str | None, class_column: str | None = None,
                    class_names: Sequence[str] | None = None) -> list[dict]:
    """`dataset_info` entries (``config_name`` + `features`, as ``datasets.DatasetInfo`` writes them) of every
    config whose first file is under ``root`` (module docstring). ``main_configs``: the configs of the main table
    (``main_path``), whose ``class_column`` becomes a ``ClassLabel`` of ``class_names``."""
    import datasets

    root = Path(root)
    mains = set(main_configs)
    label = None
    if class_column and class_names and _labels_cover(root, main_path, class_column, class_names):
        label = datasets.ClassLabel(names=list(class_names))
    out = []
    for name in configs:
        files = [p for ps in configs[name].values() for p in ([ps] if isinstance(ps, str) else ps)]
        found = (q for p in files for q in (sorted(root.glob(p)) if "*" in p else [root / p]) if q.is_file())
        first = next(found, None)
        if first is None:
            continue
        features = _features_of(first)
        if label is not None and name in mains and class_column in features:
            features[class_column] = label
        if IMAGE_COLUMN in features and isinstance(features[IMAGE_COLUMN], dict):
            features[IMAGE_COLUMN] = datasets.Image()
        out.append({"config_name": name, **datasets.DatasetInfo(features=features)._to_yaml_dict()})
    return out


def card_dataset_info(root: str | os.PathLike, card: Any, meta: Mapping[str, Any], tables: Mapping[str, Any],
                      layout: Any, configs: Mapping[str, Mapping[str, Any]]) -> list[dict]:
    """``config_features`` of a card (``card``: the kind's ``CardSpec``; ``layout``: its ``ConfigLayout``): the
    ``config_by`` column a ``ClassLabel`` of the kind's ``config_values``."""
    values = card.config_values(tables, meta) if card.config_by and card.config_values else None
    names = [str(v) for v in values] if values else None
    main_path = ((meta.get("tables") or {}).get(layout.main) or {}).get("path") if layout.main else None
    return config_features(root, configs, main_configs=["all", *layout.partitions], main_path=main_path,
                           class_column=layout.config_by or card.config_by, class_names=names)
