"""Dataset cards: a README.md whose YAML `configs:` make any manifest directory loadable with `datasets`.

`datasets.load_dataset(DIR)` (or `load_dataset("user/name")` once published) loads the `all` config;
`load_dataset(DIR, "cov_2_sem_5")` loads one grid cell. The configs point at Parquet files only, so loading needs
no code and works offline:

- every kind: `all` = the main table (`images` for splits / syn-is / image lists, `classes` for a class filter,
  else the only or first table); every other table also gets a config named after it (`cells`, `edges`, ...).
- splits / syn-is: one config per non-N/A cell `cov_{c}_sem_{s}` (0-based), backed by a per-cell Parquet file
  `data/configs/<cell>/<split>.parquet` (a copy of the cell's rows of the main table; the files are small:
  paths and shift values).
- a main table with a `decision` column (class filter, audit): one config per decision (`keep` -> `kept`,
  `drop` -> `dropped`).

Splits inside a config: `test` for splits / syn-is / image lists (benchmark data), `train` for other kinds
(`datasets`' name for a plain table). When the main table has a `source` column with named sources (e.g. an
imported IS-OOD release with in21k-train / in21k-val / syn-is), each source is its own split
(`in21k_train`, ...) in `all` and in every cell config, so sources are never mixed by accident.

`write_with_card` wraps `manifests.write_manifest`: it adds the per-config Parquet files and the README.md, and
registers both in manifest.json (the card is excluded from the content hash, the per-config files are not: they
are part of what users load).
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable, Mapping

import pandas as pd
import pyarrow as pa
import yaml

from isood.errors import ManifestError
from manifests.store import (
    MANIFEST_FILE,
    Manifest,
    atomic_write_bytes,
    parquet_bytes,
    read,
    sha256_bytes,
    write_manifest,
)

CARD_FILE = "README.md"
CONFIGS_DIR = "data/configs"  # derived per-config Parquet files live here (regenerated on every write)
CELL_KINDS = frozenset({"splits", "syn-is"})
TEST_KINDS = CELL_KINDS | {"image-list"}
MAIN_TABLE = {"splits": "images", "syn-is": "images", "image-list": "images", "class-filter": "classes",
              "audit": "classes", "evaluation": "cell_metrics", "features": "index"}
NA_THRESHOLD = 10  # a cell with fewer images is N/A (ARCHITECTURE.md), used when there is no `cells` table
_CELL_RE = re.compile(r"^cov_(\d+)_sem_(\d+)$")
_SPLIT_RE = re.compile(r"^\w+(\.\w+)*$")  # what `datasets` accepts as a split name
_DECISION_CONFIG = {"keep": "kept", "drop": "dropped"}


def cell_name(cov_level: int, sem_level: int) -> str:
    return f"cov_{int(cov_level)}_sem_{int(sem_level)}"


def split_name(source: str | None, default: str) -> str:
    """A `datasets` split name for a source folder ('in21k-val' -> 'in21k_val'; '' -> `default`)."""
    if source is None or source == "":
        return default
    name = re.sub(r"\W+", "_", str(source)).strip("_")
    if not name:
        raise ManifestError(f"source {source!r} gives an empty split name; rename it with letters or digits")
    if name[0].isdigit():
        name = f"s_{name}"
    return name


def _frame(table: pd.DataFrame | pa.Table) -> pd.DataFrame:
    return table.to_pandas() if isinstance(table, pa.Table) else table


def main_table(kind: str, names: Iterable[str]) -> str | None:
    names = sorted(names)
    if not names:
        return None
    preferred = MAIN_TABLE.get(kind)
    if preferred in names:
        return preferred
    for guess in ("images", "classes", "rows"):
        if guess in names:
            return guess
    return names[0]


@dataclass
class ConfigLayout:
    """The `datasets` configs of a manifest: config -> split -> relative Parquet path, plus the derived files."""

    configs: dict[str, dict[str, str]] = field(default_factory=dict)
    files: dict[str, pd.DataFrame] = field(default_factory=dict)  # derived path -> rows to write
    cells: list[dict] = field(default_factory=list)  # grid cells (source, cell, cov, sem, n, na)
    main: str | None = None


def _sources(df: pd.DataFrame) -> list[str]:
    if "source" not in df.columns:
        return [""]
    values = df["source"].fillna("").astype(str)
    return sorted(values.unique()) or [""]


def _cells(tables: Mapping[str, pd.DataFrame], main: pd.DataFrame, na_threshold: int) -> list[dict]:
    """Cell rows: from the `cells` table when there is one (its `na` flags), else counted from the main table."""
    out: list[dict] = []
    cells = tables.get("cells")
    if cells is not None and {"cov_level", "sem_level"} <= set(cells.columns):
        for rec in cells.to_dict("records"):
            n = int(rec["n"]) if "n" in rec and pd.notna(rec["n"]) else None
            na = bool(rec["na"]) if "na" in rec and pd.notna(rec["na"]) else (n is None or n < na_threshold)
            src = rec.get("source")
            out.append({
                "source": "" if src is None or (isinstance(src, float) and pd.isna(src)) else str(src),
                "cell": cell_name(rec["cov_level"], rec["sem_level"]),
                "cov_level": int(rec["cov_level"]), "sem_level": int(rec["sem_level"]), "n": n, "na": na,
            })
        return out
    if not {"cov_level", "sem_level"} <= set(main.columns):
        return out
    keyed = main.dropna(subset=["cov_level", "sem_level"])
    keyed = keyed[(keyed["cov_level"] >= 0) & (keyed["sem_level"] >= 0)]  # level -1: no shift value, no cell
    src = keyed["source"].fillna("").astype(str) if "source" in keyed.columns else pd.Series("", index=keyed.index)
    counts = keyed.groupby([src, keyed["cov_level"].astype(int), keyed["sem_level"].astype(int)]).size()
    for (s, c, l), n in sorted(counts.items()):
        out.append({"source": s, "cell": cell_name(c, l), "cov_level": c, "sem_level": l, "n": int(n),
                    "na": int(n) < na_threshold})
    return out


def config_layout(kind: str, tables: Mapping[str, pd.DataFrame | pa.Table], na_threshold: int = NA_THRESHOLD) -> ConfigLayout:
    """Which configs a manifest of `kind` with these tables gets, and the derived Parquet files behind them."""
    tables = {name: _frame(t) for name, t in tables.items()}
    layout = ConfigLayout(main=main_table(kind, tables))
    if layout.main is None:
        return layout
    main = tables[layout.main]
    default_split = "test" if kind in TEST_KINDS else "train"
    sources = _sources(main)
    splits = {s: split_name(s, default_split) for s in sources}
    if len(set(splits.values())) != len(splits):
        raise ManifestError(f"sources {sources} give clashing split names {sorted(splits.values())}; rename them")
    src_col = main["source"].fillna("").astype(str) if "source" in main.columns else None

    def put(config: str, split: str, rows: pd.DataFrame) -> None:
        rel = f"{CONFIGS_DIR}/{config}/{split}.parquet"
        layout.files[rel] = rows.reset_index(drop=True)
        layout.configs.setdefault(config, {})[split] = rel

    if len(sources) == 1:  # one split: the main table itself, no copy
        layout.configs["all"] = {splits[sources[0]]: f"data/{layout.main}.parquet"}
    else:
        for s in sources:
            put("all", splits[s], main[src_col == s])

    if kind in CELL_KINDS and {"cov_level", "sem_level"} <= set(main.columns):
        layout.cells = _cells(tables, main, na_threshold)
        levels = main[["cov_level", "sem_level"]]
        has = levels.notna().all(axis=1)
        cov = levels["cov_level"].where(has, -1).astype(int)
        sem = levels["sem_level"].where(has, -1).astype(int)
        has &= (cov >= 0) & (sem >= 0)
        for rec in sorted(layout.cells, key=lambda r: (r["cov_level"], r["sem_level"], r["source"])):
            if rec["na"]:
                continue
            mask = has & (cov == rec["cov_level"]) & (sem == rec["sem_level"])
            targets = sources if rec["source"] == "" else [rec["source"]]
            for s in targets:
                m = mask if src_col is None else mask & (src_col == s)
                if s not in splits or not m.any():
                    continue
                put(rec["cell"], splits[s], main[m])

    if "decision" in main.columns:
        for value in sorted(main["decision"].dropna().astype(str).unique()):
            name = _DECISION_CONFIG.get(value, re.sub(r"\W+", "_", value).strip("_"))
            if not name or name in layout.configs:
                continue
            rows = main[main["decision"].astype(str) == value]
            for s in sources:
                part = rows if src_col is None else rows[src_col[rows.index] == s]
                if len(part):
                    put(name, splits[s], part)

    for name in sorted(tables):
        if name != layout.main and name not in layout.configs and _SPLIT_RE.match(name):
            layout.configs[name] = {"train": f"data/{name}.parquet"}
    return layout


# ----------------------------------------------------------------------------------------------------- the card
def _yaml_configs(configs: Mapping[str, Mapping[str, str]]) -> list[dict]:
    order = ["all"] + sorted(c for c in configs if _CELL_RE.match(c)) + sorted(
        c for c in configs if c != "all" and not _CELL_RE.match(c)
    )
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


def _md_table(df: pd.DataFrame, max_rows: int = 40) -> str:
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


def _grid_md(cells: list[dict], n_levels: int | None) -> str:
    out = []
    for source in sorted({c["source"] for c in cells}):
        part = [c for c in cells if c["source"] == source]
        n = n_levels or 1 + max(max(c["cov_level"], c["sem_level"]) for c in part)
        grid = {(c["cov_level"], c["sem_level"]): c for c in part}
        if source:
            out.append(f"**{source}**\n")
        out.append("| cov \\ sem | " + " | ".join(str(s) for s in range(n)) + " |")
        out.append("|---|" + "---|" * n)
        for c in range(n):
            row = []
            for s in range(n):
                rec = grid.get((c, s))
                if rec is None:
                    row.append("–")
                elif rec["n"] is None:
                    row.append("N/A" if rec["na"] else "?")
                else:
                    row.append(f"N/A ({rec['n']})" if rec["na"] else str(rec["n"]))
            out.append(f"| {c} | " + " | ".join(row) + " |")
        out.append("")
    return "\n".join(out)


_DESCRIPTION = {
    "splits": "OOD test images graded by semantic (D_sem) and covariate (D_cov) shift from the in-distribution "
    "set and binned into a grid of shift levels (IS-OOD, \"A Sorites Paradox\").",
    "syn-is": "Syn-IS: images generated from style x label prompts, graded by the prompts' semantic and covariate "
    "shift and binned into a grid of shift levels.",
    "class-filter": "The ImageNet-OOD class filter: every candidate class with its decision, the rule that "
    "dropped it and the in-distribution class it conflicts with.",
    "audit": "An audit of an OOD class or image list for WordNet hierarchy leaks into the in-distribution classes.",
    "features": "Image features and their index.",
    "image-list": "An OOD image list (relative image paths).",
}


def _licence(kind: str, meta: Mapping[str, Any]) -> str:
    config = (meta.get("command") or {}).get("config") or {}
    if kind == "syn-is":
        pipeline = config.get("pipeline") or "stabilityai/sdxl-turbo"
        return (
            f"The Syn-IS images under `images/` were generated with `{pipeline}` and may be redistributed within "
            "the terms of that model's licence (for SDXL-Turbo: the Stability AI licence); check it before any "
            "commercial use. Prompts use ImageNet-21K labels (WordNet, Princeton licence). No ImageNet image is "
            "included; `d_sem` / `d_cov` were measured against in-distribution ImageNet features.\n"
        )
    return (
        "ImageNet images are never redistributed: this dataset holds relative image paths, WordNet ids and shift "
        "values only. Obtain ImageNet-1K / ImageNet-21K from https://image-net.org under its terms of access and "
        "resolve `path` against the root of your own copy. WordNet is under the Princeton WordNet licence. "
        "The metadata in this repository is released by its publisher under the licence stated in the front "
        "matter.\n"
    )


def dataset_card(manifest_meta: Mapping[str, Any], tables: Mapping[str, pd.DataFrame | pa.Table],
                 *, title: str | None = None, na_threshold: int = NA_THRESHOLD) -> str:
    """README.md text for a manifest: YAML front matter (`configs:` for `datasets`) plus provenance, grid edges,
    counts per cell, changelog and licence notes. Configs whose files are not in `manifest_meta["files"]` are left
    out, so the card never points at a file the manifest lacks."""
    kind = manifest_meta["kind"]
    tables = {name: _frame(t) for name, t in tables.items()}
    layout = config_layout(kind, tables, na_threshold)
    listed = {rec["path"] for rec in manifest_meta.get("files", [])}
    configs = {
        name: splits for name, splits in layout.configs.items()
        if not listed or all(p in listed for p in splits.values())
    }
    n_rows = len(tables[layout.main]) if layout.main else 0
    version = manifest_meta.get("dataset_version", "?")
    title = title or f"isood {kind} manifest"
    front: dict[str, Any] = {
        "pretty_name": title,
        "license": "other",
        "tags": ["out-of-distribution-detection", "isood", kind],
        "task_categories": ["image-classification"],
        "size_categories": [_size_category(n_rows)],
        "configs": _yaml_configs(configs),
    }
    parts = ["---\n" + yaml.safe_dump(front, sort_keys=False, allow_unicode=True) + "---\n"]
    parts.append(f"# {title} (v{version})\n\n{_DESCRIPTION.get(kind, f'An isood {kind} manifest.')}\n")

    cell_configs = [c for c in configs if _CELL_RE.match(c)]
    example_cell = cell_configs[0] if cell_configs else None
    load = ["```python", "from datasets import load_dataset", "",
            'ds = load_dataset("USER/NAME")  # or a local copy of this directory: load_dataset("path/to/dir")']
    if example_cell:
        load.append(f'cell = load_dataset("USER/NAME", "{example_cell}")  # one grid cell')
    load.append("```")
    parts.append("## Loading\n\n" + "\n".join(load) + "\n")
    cfg_lines = [f"- `{name}`: " + ", ".join(f"split `{s}` ({p})" for s, p in sorted(sp.items()))
                 for name, sp in ((c["config_name"], configs[c["config_name"]]) for c in _yaml_configs(configs))]
    parts.append(f"## Configs ({len(configs)})\n\n" + "\n".join(cfg_lines) + "\n")

    if layout.cells:
        config = (manifest_meta.get("command") or {}).get("config") or {}
        n_levels = next((config[k] for k in ("n_levels", "levels") if isinstance(config.get(k), int)), None)
        na = sum(1 for c in layout.cells if c["na"])
        parts.append(
            "## Counts per cell\n\nRows: covariate level; columns: semantic level (0-based; cell "
            "`cov_{c}_sem_{s}`). N/A cells (fewer images than the N/A threshold) get no config; their count is "
            f"shown in brackets. {len(layout.cells) - na} cells usable, {na} N/A.\n\n"
            + _grid_md(layout.cells, n_levels)
        )
    if "edges" in tables:
        parts.append("## Grid edges\n\nThe level boundaries of each shift axis (table `edges`).\n\n"
                     + _md_table(tables["edges"]))

    prov = [f"- kind: `{kind}`, dataset version **{version}**, schema "
            f"`{manifest_meta.get('schema', {}).get('name')}` {manifest_meta.get('schema', {}).get('version')}",
            f"- written by isood {manifest_meta.get('package', {}).get('version', '?')} on "
            f"{manifest_meta.get('created', '?')}",
            f"- content sha256: `{manifest_meta.get('content_sha256', '?')}`"]
    command = manifest_meta.get("command") or {}
    if command.get("argv"):
        prov.append("- command: `" + " ".join(str(a) for a in command["argv"]) + "`")
    if command.get("config"):
        prov.append("- config:\n\n```json\n" + json.dumps(command["config"], indent=2, sort_keys=True) + "\n```")
    parts.append("## Provenance\n\n" + "\n".join(prov) + "\n")
    inputs = manifest_meta.get("inputs") or []
    if inputs:
        parts.append("### Inputs\n\n" + _md_table(pd.DataFrame(
            [{"name": i.get("name"), "source": i.get("source", ""), "sha256": i.get("sha256", "")} for i in inputs]
        )))
    files = [r for r in manifest_meta.get("files", []) if r["path"] != CARD_FILE]
    if files:
        shown = [r for r in files if not r["path"].startswith(CONFIGS_DIR + "/")]
        parts.append(
            f"### Files\n\n{len(files)} files, every sha256 in `{MANIFEST_FILE}` (`isood verify DIR` rechecks "
            f"them; the per-config copies under `{CONFIGS_DIR}/` are listed there too).\n\n"
            + _md_table(pd.DataFrame([{"path": r["path"], "bytes": r["bytes"], "sha256": r["sha256"]} for r in shown]))
        )
    changelog = manifest_meta.get("changelog") or []
    if changelog:
        parts.append("## Changelog\n\n" + "\n".join(
            f"- {c.get('version')} ({c.get('date')}): {c.get('note', '')}" for c in reversed(changelog)) + "\n")
    parts.append("## Licence\n\n" + _licence(kind, manifest_meta))
    return "\n".join(parts)


# ---------------------------------------------------------------------------------------------------- writing
def write_with_card(
    root: str | Path,
    *,
    kind: str,
    tables: Mapping[str, pd.DataFrame | pa.Table],
    config: Mapping[str, Any],
    inputs: Iterable[dict] = (),
    files: Mapping[str, bytes | str] | None = None,
    existing_files: Iterable[str] = (),
    summary: Mapping[str, Any] | None = None,
    note: str = "",
    argv: list[str] | None = None,
    title: str | None = None,
    na_threshold: int = NA_THRESHOLD,
) -> Manifest:
    """`manifests.write_manifest` plus the per-config Parquet files and the README.md dataset card.

    Same arguments as `write_manifest` (the dataset version and changelog logic is its own). `files` and
    `existing_files` may not use README.md or data/configs/ (both are written here).
    """
    root = Path(root)
    files = dict(files or {})
    existing_files = list(existing_files)
    for rel in list(files) + existing_files:
        if rel == CARD_FILE or rel.startswith(CONFIGS_DIR + "/"):
            raise ManifestError(f"{rel!r} is written by the dataset card writer; do not pass it in files")
    layout = config_layout(kind, tables, na_threshold)
    derived = {rel: parquet_bytes(df) for rel, df in sorted(layout.files.items())}
    manifest = write_manifest(
        root, kind=kind, tables=tables, config=config, inputs=inputs, files={**files, **derived},
        existing_files=existing_files, summary=summary, note=note, argv=argv,
    )
    _prune_empty_dirs(root / CONFIGS_DIR)
    return _attach_card(manifest, dataset_card(manifest.meta, tables, title=title, na_threshold=na_threshold))


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
    """Write README.md and register it in manifest.json (excluded from the content hash, so the version stays)."""
    data = card.encode()
    atomic_write_bytes(manifest.root / CARD_FILE, data)
    meta = dict(manifest.meta)
    files = [r for r in meta["files"] if r["path"] != CARD_FILE]
    files.append({"path": CARD_FILE, "sha256": sha256_bytes(data), "bytes": len(data)})
    meta["files"] = sorted(files, key=lambda r: r["path"])
    atomic_write_bytes(manifest.root / MANIFEST_FILE, (json.dumps(meta, indent=2, sort_keys=False) + "\n").encode())
    return Manifest(root=manifest.root, meta=meta)


def add_card(root: str | Path, note: str = "dataset card and per-config Parquet files") -> Manifest:
    """Give an existing manifest (written without a card, or by an older isood) its card and config files.

    Rewrites it through `write_with_card` with its own tables, config and other files; the dataset version is
    bumped (with `note` in the changelog) only if the per-config files are new or changed.
    """
    m = read(root)
    table_paths = {rec["path"] for rec in m.meta["tables"].values()}
    tables = {name: m.table(name) for name in m.tables}
    others = [
        r["path"] for r in m.meta["files"]
        if r["path"] not in table_paths and r["path"] != CARD_FILE and not r["path"].startswith(CONFIGS_DIR + "/")
    ]
    command = m.meta.get("command") or {}
    return write_with_card(
        m.root, kind=m.kind, tables=tables, config=command.get("config") or {}, inputs=m.meta.get("inputs", []),
        existing_files=others, summary=m.meta.get("summary") or {}, note=note, argv=command.get("argv") or [],
    )
