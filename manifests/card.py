"""Dataset cards: a README.md whose YAML `configs:` make any manifest directory loadable with `datasets`.

`datasets.load_dataset(DIR)` (or `load_dataset("user/name")` once published) loads the `all` config; the kind's
``CardSpec`` (``manifests.schema``, registered with the kind) says what else there is: the configs and the files
behind them are planned by ``manifests.card_layout``. The card names every config and its splits, shows the
kind's own sections (``sections``, e.g. counts per cell), the provenance, the changelog and the kind's licence
(``licence``). This module knows no particular kind.

`write_with_card` wraps `manifests.write_manifest`: it adds the per-config Parquet files and the README.md, and
registers both in manifest.json (``manifests.card_stream.add_card`` gives an existing manifest its card). Both
are derived from the tables, so both are left out of the content hash (``manifests.verify.content_hash``): a
card added or rewritten never changes the content or the version.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any, Callable, Iterable, Mapping

import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq

from isood.core.errors import ManifestError
from isood.core.files import atomic_write_bytes, sha256_bytes
from manifests.card_info import card_dataset_info, public_argv, public_text
from manifests.card_layout import (ConfigLayout, card_frames, card_spec, config_layout, empty_parquet_bytes,
                                   resolve_empty)
from manifests.meta import CARD_FILE, CONFIGS_DIR, VERSION_RE
from manifests.store import MANIFEST_FILE, Manifest, parquet_bytes, write_manifest

__all__ = ["CARD_FILE", "CONFIGS_DIR", "CARD_FIGURE", "FEATURES_PREFIX", "is_feature_file", "dataset_card",
           "write_with_card", "markdown_table"]

#: Feature shards a manifest may hold (build-splits' ``features-id/`` and ``features-test/`` sub-manifests, any
#: ``.npy`` array): large (~24 GB of test features at IS-OOD's size) and derived, so `isood publish` leaves them
#: out unless asked (``--include-features``), and the card says so.
FEATURES_PREFIX = "features-"
#: A figure of the data shown in the card (a grid's mosaic: ``write_with_card(figure=...)``); derived like the card.
CARD_FIGURE = f"{CONFIGS_DIR}/card.png"


def is_feature_file(path: str) -> bool:
    """Whether a manifest file (relative path) is a feature shard: inside a top-level ``features-*/`` folder, or
    a ``.npy`` array."""
    parts = path.split("/")
    return (len(parts) > 1 and parts[0].startswith(FEATURES_PREFIX)) or parts[-1].endswith(".npy")


def _write_empty(root: Path, meta: Mapping[str, Any], layout: ConfigLayout) -> list[dict]:
    """Write the ``layout.empty`` files (each with the columns of its table as written under ``root``)."""
    paths = {name: rec["path"] for name, rec in (meta.get("tables") or {}).items()}
    records = []
    for rel, table in sorted(layout.empty.items()):
        data = empty_parquet_bytes(pq.read_schema(root / paths[table]))
        atomic_write_bytes(root / rel, data)
        records.append({"path": rel, "sha256": sha256_bytes(data), "bytes": len(data)})
    return records


def _with_files(meta: Mapping[str, Any], records: Iterable[dict]) -> dict:
    """``meta`` with ``records`` (derived files: outside the content hash) in its ``files``, sorted by path."""
    new = {r["path"]: r for r in records}
    out = dict(meta)
    out["files"] = sorted([r for r in meta["files"] if r["path"] not in new] + list(new.values()),
                          key=lambda r: r["path"])
    return out


# ----------------------------------------------------------------------------------------------------- the card
def _yaml_configs(configs: Mapping[str, Mapping[str, str]], partitions: Iterable[str] = ()) -> list[dict]:
    """`configs:` entries: `all` (the default), then the partition configs, then the others, each sorted."""
    parts = set(partitions)
    order = ["all"] + sorted(c for c in configs if c in parts) + sorted(c for c in configs if c != "all" and c not in parts)
    out = []
    for name in order:
        if name not in configs:
            continue
        rec: dict[str, Any] = {"config_name": name}
        if name == "all":
            rec["default"] = True
        rec["data_files"] = [{"split": s, "path": p} for s, p in sorted(configs[name].items())]
        out.append(rec)
    return out


def _size_category(n: int) -> str:
    for limit, label in ((1_000, "n<1K"), (10_000, "1K<n<10K"), (100_000, "10K<n<100K"),
                         (1_000_000, "100K<n<1M"), (10_000_000, "1M<n<10M")):
        if n < limit:
            return label
    return "10M<n<100M"


def markdown_table(df: pd.DataFrame, max_rows: int = 40) -> str:
    """A markdown table of the first ``max_rows`` rows (floats with 4 significant digits)."""
    if df.empty:
        return "_(empty)_\n"
    shown = df.head(max_rows)

    def fmt(v: Any) -> str:
        if isinstance(v, float):
            return "NaN" if pd.isna(v) else f"{v:.4g}"
        return str(v).replace("|", "\\|")

    lines = ["| " + " | ".join(map(str, shown.columns)) + " |", "|" + "---|" * len(shown.columns)]
    lines += ["| " + " | ".join(fmt(v) for v in row) + " |" for row in shown.itertuples(index=False)]
    if len(df) > max_rows:
        lines.append(f"\n_{len(df) - max_rows} more rows in the Parquet file._")
    return "\n".join(lines) + "\n"


def _front_matter(kind: str, title: str, n_rows: int, configs: Mapping[str, Mapping[str, str]],
                  partitions: Iterable[str], meta: Mapping[str, Any], dataset_info: list[dict] | None = None) -> str:
    """The card's YAML front matter, written by huggingface_hub's ``DatasetCardData`` (the Hub's own schema of a
    dataset card: `configs`, `license`, ...), keys in the order below. ``dataset_info``: each config's typed
    `features` (``manifests.card_info.config_features``); every entry also names the dataset version and content
    hash: `datasets` keys its cache of a local folder by it, so a rewritten manifest is not served from the cache
    of its previous version."""
    from huggingface_hub import DatasetCardData  # ~0.3 s to import: only when a card is drawn

    front: dict[str, Any] = {
        "pretty_name": title,
        "license": "other",
        "tags": ["out-of-distribution-detection", "isood", kind],
        "task_categories": ["image-classification"],
        "size_categories": [_size_category(n_rows)],
        "configs": _yaml_configs(configs, partitions),
    }
    version = str(meta.get("dataset_version") or "")
    stamp = ({"version": {"version_str": version},
              "description": f"isood {kind} v{version}, content {meta.get('content_sha256', '')}"}
             if VERSION_RE.match(version) else {})
    if dataset_info:
        front["dataset_info"] = [{**entry, **stamp} for entry in dataset_info]
    elif stamp:
        front["dataset_info"] = {"config_name": "all", **stamp}
    return "---\n" + DatasetCardData(**front).to_yaml(original_order=list(front)) + "\n---\n"


def _loading_sections(layout: ConfigLayout, configs: Mapping[str, Mapping[str, str]]) -> list[str]:
    """`## Loading` (with an example partition config) and `## Configs` (every config and its splits)."""
    example = next((c for c in sorted(layout.partitions) if c in configs and layout.has_rows(c)), None)
    load = ["```python", "from datasets import load_dataset", "",
            'ds = load_dataset("USER/NAME")  # or a local copy of this directory: load_dataset("path/to/dir")']
    if example:
        load.append(f'part = load_dataset("USER/NAME", "{example}")  # the rows of one {layout.config_by}')
    load.append("```")
    cfg_lines = [f"- `{name}`: " + ", ".join(f"split `{s}` ({p}{', no rows' if p in layout.empty else ''})"
                                             for s, p in sorted(sp.items()))
                 for name, sp in ((c["config_name"], configs[c["config_name"]])
                                  for c in _yaml_configs(configs, layout.partitions))]
    empty = [c for c in configs if not layout.has_rows(c)]
    note = ("" if not empty else
            f"\n{len(empty)} config(s) hold no rows (e.g. `{sorted(empty)[0]}`): each split is a Parquet file with "
            "the columns and no rows. `load_dataset(..., streaming=True)` yields no rows; without streaming, "
            "`datasets` refuses a split without rows (`Instruction \"<split>\" corresponds to no data!`).\n")
    return ["## Loading\n\n" + "\n".join(load) + "\n",
            f"## Configs ({len(configs)})\n\n" + "\n".join(cfg_lines) + "\n" + note]


def _provenance_sections(meta: Mapping[str, Any]) -> list[str]:
    """`## Provenance` (kind, version, writer, command and config), `### Inputs`, `### Files`, `## Changelog`."""
    schema = meta.get("schema", {})
    prov = [f"- kind: `{meta['kind']}`, dataset version **{meta.get('dataset_version', '?')}**, schema "
            f"`{schema.get('name')}` {schema.get('version')}",
            f"- written by isood {meta.get('package', {}).get('version', '?')} on {meta.get('created', '?')}",
            f"- content sha256: `{meta.get('content_sha256', '?')}`"]
    command = meta.get("command") or {}
    if command.get("argv"):
        prov.append("- command: `" + " ".join(public_argv(command["argv"])) + "`")
    if command.get("config"):
        prov.append("- config:\n\n```json\n" + public_text(json.dumps(command["config"], indent=2, sort_keys=True))
                    + "\n```")
    parts = ["## Provenance\n\n" + "\n".join(prov) + "\n"]
    inputs = meta.get("inputs") or []
    if inputs:
        parts.append("### Inputs\n\n" + markdown_table(pd.DataFrame(
            [{"name": i.get("name"), "source": public_text(i.get("source", "")), "sha256": i.get("sha256", "")}
             for i in inputs]
        )))
    files = [r for r in meta.get("files", []) if r["path"] != CARD_FILE]
    if files:
        shown = [r for r in files if not r["path"].startswith(CONFIGS_DIR + "/") and not is_feature_file(r["path"])]
        features = [r for r in files if is_feature_file(r["path"])]
        folders = sorted({r["path"].split("/")[0] + "/" if "/" in r["path"] else r["path"] for r in features})
        note = ("" if not features else
                f" {len(features)} of them are feature shards ({sum(int(r['bytes']) for r in features):,} bytes: "
                f"{', '.join(folders[:4])}{', ...' if len(folders) > 4 else ''}), not in the table: `isood publish` "
                "uploads them only with `--include-features`.")
        parts.append(
            f"### Files\n\n{len(files)} files, every sha256 in `{MANIFEST_FILE}` (`isood verify DIR` rechecks "
            f"them; the per-config copies under `{CONFIGS_DIR}/` are listed there too).{note}\n\n"
            + markdown_table(pd.DataFrame([{"path": r["path"], "bytes": r["bytes"], "sha256": r["sha256"]} for r in shown]))
        )
    changelog = meta.get("changelog") or []
    if changelog:
        parts.append("## Changelog\n\n" + "\n".join(
            f"- {c.get('version')} ({c.get('date')}): {c.get('note', '')}" for c in reversed(changelog)) + "\n")
    return parts


def dataset_card(manifest_meta: Mapping[str, Any], tables: Mapping[str, pd.DataFrame | pa.Table],
                 *, title: str | None = None, layout: ConfigLayout | None = None, n_rows: int | None = None,
                 root: str | os.PathLike | None = None) -> str:
    """README.md text for a manifest: YAML front matter (`configs:` for `datasets`), loading example, configs,
    the kind's own sections, provenance, changelog and licence. Configs whose files are not in
    `manifest_meta["files"]` are left out, so the card never points at a file the manifest lacks.

    ``layout`` and ``n_rows`` (rows of the main table): given when the main table was streamed
    (``streamed_layout``) and ``tables`` holds the other tables only. ``root``: the folder holding the config
    files, whose Parquet schemas give each config's typed `features` (``manifests.card_info``); none without it.
    Absolute paths in the provenance are cut (``manifests.card_info.public_text``)."""
    kind = manifest_meta["kind"]
    card = card_spec(kind, tables)
    layout = resolve_empty(layout or config_layout(kind, tables, manifest_meta), manifest_meta)
    tables = card_frames(kind, layout.main, tables)
    listed = {rec["path"] for rec in manifest_meta.get("files", [])}
    configs = {
        name: splits for name, splits in layout.configs.items()
        if not listed or all(p in listed or "*" in p for p in splits.values())
    }
    if n_rows is None:
        n_rows = len(tables[layout.main]) if layout.main else 0
    title = title or card.title
    info = card_dataset_info(root, card, manifest_meta, tables, layout, configs) if root is not None else None
    parts = [_front_matter(kind, title, n_rows, configs, layout.partitions, manifest_meta, info),
             f"# {title} (v{manifest_meta.get('dataset_version', '?')})\n\n{card.description}\n"]
    if CARD_FIGURE in listed:
        parts.append(f"## Sample\n\n![A sample of the images per cell]({CARD_FIGURE})\n\nSampled images of each cell "
                     "(semantic level left to right, covariate level bottom to top; N/A cells grey); "
                     "`isood show DIR` draws more.\n")
    parts += _loading_sections(layout, configs)
    for heading, text in (card.sections(manifest_meta, tables) if card.sections else ()):
        parts.append(f"## {heading}\n\n{text}")
    parts += _provenance_sections(manifest_meta)
    if card.licence is not None:
        parts.append("## Licence\n\n" + card.licence(manifest_meta))
    return "\n".join(parts)


# ---------------------------------------------------------------------------------------------------- writing
def write_with_card(
    root: str | os.PathLike,
    *,
    kind: str,
    tables: Mapping[str, pd.DataFrame | pa.Table],
    config: Mapping[str, Any],
    inputs: Iterable[dict] = (),
    files: Mapping[str, bytes | str] | None = None,
    existing_files: Iterable[str] = (),
    table_files: Mapping[str, str] | None = None,
    layout: ConfigLayout | None = None,
    summary: Mapping[str, Any] | None = None,
    note: str = "",
    argv: list[str] | None = None,
    title: str | None = None,
    figure: Callable[[Path], bytes | None] | None = None,
) -> Manifest:
    """`manifests.write_manifest` plus the per-config Parquet files and the README.md dataset card.

    Same arguments as `write_manifest` (the dataset version and changelog logic is its own). `files` and
    `existing_files` may not use README.md or data/configs/ (both are written here). A main table too large for
    memory comes in `table_files` with its `layout`, whose derived files are already written
    (``manifests.card_stream.write_streamed`` does both). Any other table may come in `table_files` too (e.g.
    streamed in row groups): it gets a config like the in-memory ones, and is read for the card only when the
    kind's ``CardSpec.reads`` names it. The files of the configs without rows (``resolve_empty``) are written
    once the tables are, with their columns. ``figure(root)``: PNG bytes drawn from the manifest written in
    ``root`` (None: none), stored as ``CARD_FIGURE`` and shown in the card (a grid's mosaic, when its images are
    reachable).
    """
    root = Path(root)
    files = dict(files or {})
    existing_files = list(existing_files)
    table_files = dict(table_files or {})
    for rel in list(files) + existing_files:
        if rel == CARD_FILE or rel.startswith(CONFIGS_DIR + "/"):
            raise ManifestError(f"{rel!r} is written by the dataset card writer; do not pass it in files")
    if layout is None and card_spec(kind, {**tables, **table_files}).main in table_files:
        raise ManifestError(f"{kind}: the main table is in table_files: pass its layout "
                            "(manifests.card_stream.write_streamed)")
    n_rows, derived = None, {}
    # only the main table and the tables the kind's card reads are loaded (``card_frames``)
    side = card_frames(kind, layout.main if layout is not None else None, {}, root=root, table_files=table_files)
    if layout is not None:
        if layout.main is None or layout.main not in table_files:
            raise ManifestError(f"{kind}: the layout's main table {layout.main!r} is not in table_files: pass it "
                                "there (manifests.card_stream.write_streamed)")
        n_rows = pq.read_metadata(root / table_files[layout.main]).num_rows
        existing_files += layout.written
    else:
        meta = {"kind": kind, "command": {"config": dict(config)}}
        layout = config_layout(kind, {**tables, **side}, meta, paths=table_files)
        derived = {rel: parquet_bytes(df) for rel, df in sorted(layout.files.items())}
        layout.files = {}
    card_tables = {**card_frames(kind, layout.main, tables), **side}
    manifest = write_manifest(
        root, kind=kind, tables=tables, config=config, inputs=inputs, files={**files, **derived},
        existing_files=existing_files, table_files=table_files, summary=summary, note=note, argv=argv,
    )
    _prune_empty_dirs(root / CONFIGS_DIR)
    meta = _with_files(manifest.meta, _write_empty(root, manifest.meta, resolve_empty(layout, manifest.meta)))
    png = figure(root) if figure is not None else None
    if png:
        atomic_write_bytes(root / CARD_FIGURE, png)
        meta = _with_files(meta, [{"path": CARD_FIGURE, "sha256": sha256_bytes(png), "bytes": len(png)}])
    return _attach_card(Manifest(root=root, meta=meta),
                        dataset_card(meta, card_tables, title=title, layout=layout, n_rows=n_rows, root=root))


def _prune_empty_dirs(top: Path) -> None:
    """Remove folders a rewrite emptied (e.g. the config folder of a cell that became N/A)."""
    if not top.is_dir():
        return
    for d in sorted((p for p in top.rglob("*") if p.is_dir()), key=lambda p: len(p.parts), reverse=True):
        if not any(d.iterdir()):
            d.rmdir()
    if not any(top.iterdir()):
        top.rmdir()


def _attach_card(manifest: Manifest, card: str) -> Manifest:
    """Write README.md and register it (and the rest of ``manifest.meta``) in manifest.json (the card is
    excluded from the content hash, so the version stays)."""
    data = card.encode()
    atomic_write_bytes(manifest.root / CARD_FILE, data)
    meta = _with_files(manifest.meta, [{"path": CARD_FILE, "sha256": sha256_bytes(data), "bytes": len(data)}])
    atomic_write_bytes(manifest.root / MANIFEST_FILE, (json.dumps(meta, indent=2, sort_keys=False) + "\n").encode())
    return Manifest(root=manifest.root, meta=meta)
