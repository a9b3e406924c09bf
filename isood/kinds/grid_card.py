"""The dataset card of a shift grid (splits, Syn-IS): one `datasets` config per cell (the measured cells with
their rows, N/A and empty ones without), the counts per cell as a covariate x semantic table with the N/A rule
that decided them, and the grid's edges (``CardSpec`` callbacks, ``manifests.schema``)."""

from __future__ import annotations

from typing import Any, Mapping

import pandas as pd

from isood.core.defaults import NA_THRESHOLD
from manifests.card import markdown_table

__all__ = ["GRID_CARD", "grid_configs", "grid_cells", "grid_sections"]


def grid_configs(tables: Mapping[str, Any], meta: Mapping[str, Any]) -> set | None:
    """The cells that get a `datasets` config: the measured (non-N/A) cells of the ``cells`` table, else the
    cells of the main table with at least the N/A threshold of images. With a ``source`` column a cell is
    measured per source: ``(source, cell)`` pairs (``manifests.card_layout`` gives that cell's config that split
    only)."""
    cells = tables.get("cells")
    if cells is not None and {"cell", "na"} <= set(cells.columns):
        usable = cells[~cells["na"].astype(bool)]
        keys = zip(usable["source"].fillna("").astype(str) if "source" in usable.columns else [""] * len(usable),
                   usable["cell"].astype(str))
        return {(s, c) if s else c for s, c in keys}
    images = tables.get("images")
    if images is None or "cell" not in images.columns:
        return set()
    threshold = int(((meta.get("command") or {}).get("config") or {}).get("na_threshold", NA_THRESHOLD))
    ok = images[(images["sem_level"] >= 0) & (images["cov_level"] >= 0)] if "sem_level" in images.columns else images
    src = ok["source"].fillna("").astype(str) if "source" in ok.columns else pd.Series("", index=ok.index)
    counts = pd.Series(1, index=ok.index).groupby([src, ok["cell"].astype(str)]).sum()
    return {(s, c) if s else c for (s, c), n in counts.items() if n >= threshold}


def grid_cells(tables: Mapping[str, Any], meta: Mapping[str, Any]) -> list[str] | None:
    """Every cell of the ``cells`` table (N/A and empty ones too): each gets a `datasets` config, without rows
    where ``grid_configs`` gives it none, so the configs are the cells a user may ask for."""
    cells = tables.get("cells")
    return None if cells is None or "cell" not in cells.columns else sorted(set(cells["cell"].astype(str)))


def grid_sections(meta: Mapping[str, Any], tables: Mapping[str, Any]) -> list[tuple[str, str]]:
    out = []
    cells = tables.get("cells")
    if cells is not None and {"cov_level", "sem_level", "n", "na"} <= set(cells.columns):
        out.append(("Counts per cell", _na_rule_text(meta) + _grid_markdown(cells)))
    edges = tables.get("edges")
    if edges is not None:
        out.append(("Grid edges", "The level boundaries of each shift axis (table `edges`).\n\n"
                    + markdown_table(edges)))
    return out


def _na_rule_text(meta: Mapping[str, Any]) -> str:
    """How an import decided N/A (``--na-rule``), and its missing lists ('' for other manifests)."""
    config = (meta.get("command") or {}).get("config") or {}
    rule, subsets = config.get("na_rule"), [s or "." for s in config.get("subsets") or []]
    if rule is None:
        return ""
    text = ("N/A rule `pooled`: a cell is the pool of its lists across the subsets (" + ", ".join(subsets) + ") and "
            f"is N/A when the pooled count is below {config.get('na_threshold', NA_THRESHOLD)}, as the release's "
            "evaluation code decides. " if rule == "pooled" else
            "N/A rule `per-subset`: each subset folder's cells are counted and decided on their own (one split per "
            "subset). ")
    missing = ((meta.get("summary") or {}).get("missing_lists") or {})
    if any(missing.values()):
        text += ("Lists missing from the release (imported with `--allow-missing`, flagged `missing` in the "
                 "`cells` table): " + "; ".join(f"{s or '.'}: {', '.join(c)}" for s, c in sorted(missing.items()))
                 + ". ")
    return text + "\n\n"


def _grid_markdown(cells: pd.DataFrame) -> str:
    """Rows: covariate level; columns: semantic level; N/A cells with their count in brackets."""
    usable = int((~cells["na"].astype(bool)).sum())
    text = ["Rows: covariate level; columns: semantic level (0-based; cell `cov_{c}_sem_{s}`). Every cell has a "
            "config; an N/A cell (fewer images than the N/A threshold; its count is shown in brackets) and an "
            "empty one hold no rows there (see Configs). "
            f"{usable} cells usable, {len(cells) - usable} N/A.\n"]
    sources = sorted(cells["source"].fillna("").astype(str).unique()) if "source" in cells.columns else [""]
    for source in sources:
        part = cells if source == "" and "source" not in cells.columns else cells[cells["source"].fillna("") == source]
        n = 1 + int(max(part["cov_level"].max(), part["sem_level"].max()))
        grid = {(int(r.cov_level), int(r.sem_level)): r for r in part.itertuples(index=False)}
        if source:
            text.append(f"**{source}**\n")
        text.append("| cov \\ sem | " + " | ".join(str(s) for s in range(n)) + " |")
        text.append("|---|" + "---|" * n)
        for c in range(n):
            row = []
            for s in range(n):
                rec = grid.get((c, s))
                text_n = "–" if rec is None else (f"N/A ({int(rec.n)})" if rec.na else str(int(rec.n)))
                row.append(f"missing, {text_n}" if rec is not None and bool(getattr(rec, "missing", False)) else text_n)
            text.append(f"| {c} | " + " | ".join(row) + " |")
        text.append("")
    return "\n".join(text)


# ``reads``: the tables the card callbacks read besides the main one; the others (a splits' ``dropped``) are never
# loaded to draw a card.
GRID_CARD: dict[str, Any] = dict(main="images", split="test", split_by="source", config_by="cell",
                                 allowed_configs=grid_configs, config_values=grid_cells, sections=grid_sections,
                                 reads=("cells", "edges"))
