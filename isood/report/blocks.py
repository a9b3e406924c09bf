"""The building blocks of the evaluation report's pages: a value as text (N/A for NaN), HTML and markdown tables
of a frame, a bootstrap interval as text, and a PNG embedded as a figure (a base64 ``data:`` URI: the page needs no
other file)."""

from __future__ import annotations

import base64
import html
import math
from typing import Sequence

import numpy as np
import pandas as pd

__all__ = ["fmt_value", "html_table", "markdown_table", "ci_text", "figure"]


def fmt_value(v, digits: int = 3) -> str:
    """A table value as text: floats with ``digits`` decimals (NaN as N/A), booleans as yes / no, None as ''."""
    if v is None:
        return ""
    if isinstance(v, (float, np.floating)):
        return "N/A" if math.isnan(v) else f"{v:.{digits}f}"
    if isinstance(v, (bool, np.bool_)):
        return "yes" if v else "no"
    return str(v)


def html_table(df: pd.DataFrame, digits: int = 3, left: Sequence[str] = ()) -> str:
    """An HTML table of ``df`` (values by ``fmt_value``; the ``left`` columns left-aligned, N/A cells grey)."""
    cols = list(df.columns)
    head = "".join(f'<th class="{"l" if c in left else ""}">{html.escape(str(c))}</th>' for c in cols)
    rows = []
    for rec in df.itertuples(index=False):
        cells = []
        for c, v in zip(cols, rec):
            s = fmt_value(v, digits)
            cls = "l" if c in left else ("na" if s == "N/A" else "")
            cells.append(f'<td class="{cls}">{html.escape(s)}</td>')
        rows.append("<tr>" + "".join(cells) + "</tr>")
    return f"<table><thead><tr>{head}</tr></thead><tbody>{''.join(rows)}</tbody></table>"


def markdown_table(df: pd.DataFrame, digits: int = 3) -> str:
    """A GitHub markdown table of ``df`` (floats with ``digits`` decimals, NaN as N/A)."""
    cols = [str(c) for c in df.columns]
    lines = ["| " + " | ".join(cols) + " |", "|" + "|".join("---" for _ in cols) + "|"]
    for rec in df.itertuples(index=False):
        lines.append("| " + " | ".join(fmt_value(v, digits).replace("|", "\\|") for v in rec) + " |")
    return "\n".join(lines)


def ci_text(low, high, digits: int) -> str:
    """A bootstrap interval as ``[low, high]``; '' when there is none (NaN)."""
    return "" if low is None or not np.isfinite(low) else f"[{low:.{digits}f}, {high:.{digits}f}]"


def _img(png: bytes, alt: str) -> str:
    data = base64.b64encode(png).decode("ascii")
    return f'<img alt="{html.escape(alt)}" src="data:image/png;base64,{data}">'


def figure(png: bytes, caption: str) -> str:
    """A PNG embedded in a ``<figure>`` with its caption (also its alt text)."""
    return f"<figure>{_img(png, caption)}<figcaption>{html.escape(caption)}</figcaption></figure>"
