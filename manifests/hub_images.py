"""The upload folder of a manifest whose images are its own files (Syn-IS): Parquet with the images embedded, so
the Hub's viewer and `datasets.load_dataset("USER/NAME")` show pictures, not path strings.

A manifest "owns" its images when every ``path`` of its main table (``CardSpec.main``) is a file it lists; other
grids (splits, imports: paths relative to an image folder the manifest does not hold) upload only their lists.

``stage_upload`` builds, in a folder beside the manifest, exactly what is uploaded: every file of the plan
(hard-linked, or copied across file systems), and for a manifest owning its images:

- ``data/configs/images/<split>/<cell>.parquet``: the main table's rows of each (split, config value) with an
  ``image`` column (``datasets.Image``: the PNG bytes and the file's name) and the Hub's features in the Parquet
  metadata; every row once;
- the card's configs pointed at them: ``all`` at ``data/configs/images/<split>/*.parquet``, each config of
  rows at its file; a config without rows (an N/A cell) stays without rows, with the new columns;
- the per-config copies they replace left out, README.md redrawn (typed `features`: ``image`` an ``Image``) and a
  manifest.json listing those files. All of them are derived files (``manifests.verify``), so the content hash and
  the version stay, and the folder verifies (``isood verify``) like the manifest.
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path
from typing import Any

import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq

from isood.core.files import sha256_bytes, sha256_file
from manifests.card import CARD_FILE, CONFIGS_DIR, dataset_card
from manifests.card_layout import ConfigLayout, card_frames, card_spec, empty_parquet_bytes, split_name
from manifests.card_info import IMAGE_COLUMN
from manifests.store import MANIFEST_FILE, Manifest

__all__ = ["EMBEDDED_DIR", "owns_images", "stage_upload"]

EMBEDDED_DIR = f"{CONFIGS_DIR}/images"
_BATCH = 256


def owns_images(m: Manifest) -> bool:
    """Whether every image path of the manifest's main table is a file the manifest lists (module docstring)."""
    main = card_spec(m.kind, dict.fromkeys(m.tables)).main
    rec = (m.meta.get("tables") or {}).get(main or "")
    if rec is None or "path" not in pq.read_schema(m.root / rec["path"]).names:
        return False
    listed = {r["path"] for r in m.meta["files"]}
    parquet = pq.ParquetFile(m.root / rec["path"])
    if not parquet.num_row_groups:
        return False
    first = parquet.read_row_group(0, columns=["path"]).column("path")
    if not len(first) or first[0].as_py() not in listed:  # a splits manifest of 12M rows is decided here
        return False
    paths = pq.read_table(m.root / rec["path"], columns=["path"]).column("path").to_pylist()
    return all(p in listed for p in paths)


def _place(src: Path, dst: Path) -> None:
    dst.parent.mkdir(parents=True, exist_ok=True)
    try:
        os.link(src, dst)
    except OSError:  # another file system, or links not allowed: a copy
        shutil.copy2(src, dst)


def _features(schema: pa.Schema):
    import datasets

    features = datasets.Features.from_arrow_schema(schema.remove_metadata())
    features[IMAGE_COLUMN] = datasets.Image()
    return features


def _write_embedded(rows: pd.DataFrame, root: Path, dst: Path, features) -> None:
    """``rows`` with their image files' bytes in an ``image`` column, written in row groups of ``_BATCH``."""
    dst.parent.mkdir(parents=True, exist_ok=True)
    schema = features.arrow_schema
    with pq.ParquetWriter(dst, schema) as writer:
        for lo in range(0, len(rows), _BATCH):
            part = rows.iloc[lo:lo + _BATCH].reset_index(drop=True)
            images = [{"bytes": (root / p).read_bytes(), "path": Path(p).name} for p in part["path"]]
            table = pa.Table.from_pandas(part.assign(**{IMAGE_COLUMN: images}), preserve_index=False)
            writer.write_table(table.select(schema.names).cast(schema))


def _configs_of(root: Path) -> tuple[dict[str, dict[str, str]], str | None]:
    """The card's configs as written (config -> split -> path) and its title."""
    from huggingface_hub import DatasetCard

    data = DatasetCard.load(root / CARD_FILE).data.to_dict()
    configs = {c["config_name"]: {f["split"]: f["path"] for f in c.get("data_files", [])}
               for c in data.get("configs", [])}
    return configs, data.get("pretty_name")


def stage_upload(m: Manifest, files: list[tuple[str, int]], staging: Path, *,
                 manifest_bytes: bytes | None = None) -> list[tuple[str, int]]:
    """Build the upload folder in ``staging`` (module docstring); returns its files (relative path, bytes)."""
    for rel, _ in files:
        if rel != MANIFEST_FILE:
            _place(m.root / rel, staging / rel)
    meta: dict[str, Any] = json.loads(manifest_bytes) if manifest_bytes else dict(m.meta)
    card = card_spec(m.kind, dict.fromkeys(m.tables))
    main = card.main
    assert main is not None, "owns_images: the kind's card names its main table"
    main_rel = meta["tables"][main]["path"]
    df = pq.read_table(m.root / main_rel).to_pandas()
    features = _features(pq.read_schema(m.root / main_rel))
    split_col = card.split_by if card.split_by in df.columns else None
    config_col = card.config_by if card.config_by in df.columns else None
    src = df[split_col].fillna("").astype(str) if split_col else pd.Series("", index=df.index)
    val = df[config_col].fillna("").astype(str) if config_col else pd.Series("", index=df.index)
    embedded: dict[tuple[str, str], str] = {}
    for (s, v), rows in df.groupby([src, val], sort=True):
        split = split_name(s, card.split)
        rel = f"{EMBEDDED_DIR}/{split}/{v or '_'}.parquet"
        _write_embedded(rows, m.root, staging / rel, features)
        embedded[(split, v)] = rel
    old, title = _configs_of(m.root)
    names = {card.config_names.get(v, v): v for _, v in embedded}
    configs: dict[str, dict[str, str]] = {}
    empty: dict[str, str] = {}
    dropped: set[str] = set()
    mains: list[str] = []
    for name, splits in old.items():
        if name == "all":
            configs[name] = {sp: f"{EMBEDDED_DIR}/{sp}/*.parquet" for sp in sorted({sp for sp, _ in embedded})}
            dropped |= {p for p in splits.values() if p.startswith(CONFIGS_DIR + "/")}
        elif name in names or pq.read_schema(m.root / next(iter(splits.values()))).names == \
                pq.read_schema(m.root / main_rel).names:
            configs[name] = {}
            mains.append(name)
            for sp, p in splits.items():
                if (sp, names.get(name, name)) in embedded and pq.read_metadata(m.root / p).num_rows:
                    configs[name][sp] = embedded[(sp, names.get(name, name))]
                    dropped.add(p)
                else:  # a config without rows: the same columns as the others
                    (staging / p).unlink()
                    (staging / p).write_bytes(empty_parquet_bytes(features.arrow_schema))
                    configs[name][sp], empty[p] = p, main
        else:
            configs[name] = dict(splits)
    for p in dropped:
        (staging / p).unlink(missing_ok=True)
    records = {r["path"]: r for r in meta["files"] if r["path"] not in dropped and r["path"] != CARD_FILE}
    for q in sorted(staging.rglob("*.parquet")):
        rel = q.relative_to(staging).as_posix()
        if rel.startswith(CONFIGS_DIR + "/"):
            records[rel] = {"path": rel, "sha256": sha256_file(q), "bytes": q.stat().st_size}
    meta["files"] = sorted(records.values(), key=lambda r: r["path"])
    layout = ConfigLayout(configs=configs, main=main, config_by=card.config_by if config_col else None, empty=empty,
                          partitions=mains)
    tables = card_frames(m.kind, main, {}, root=m.root,
                         table_files={n: r["path"] for n, r in meta["tables"].items()})
    readme = dataset_card(meta, {k: v for k, v in tables.items() if k != main}, title=title, layout=layout,
                          n_rows=len(df), root=staging).encode()
    (staging / CARD_FILE).unlink(missing_ok=True)  # a link to the manifest's own card: never written through
    (staging / CARD_FILE).write_bytes(readme)
    meta["files"] = sorted([*meta["files"], {"path": CARD_FILE, "sha256": sha256_bytes(readme), "bytes": len(readme)}],
                           key=lambda r: r["path"])
    (staging / MANIFEST_FILE).unlink(missing_ok=True)
    (staging / MANIFEST_FILE).write_bytes((json.dumps(meta, indent=2, sort_keys=False) + "\n").encode())
    return sorted((q.relative_to(staging).as_posix(), q.stat().st_size) for q in staging.rglob("*") if q.is_file())
