"""The options of `isood splits clean`, one description each (``isood.core.optspec``)."""

from __future__ import annotations

from dataclasses import dataclass

from isood.core.optspec import REQUIRED, option
from isood.core.shared_options import na_threshold_option, out_option, verify_option
from wordnet_tools.rules import LEAK_RULES

__all__ = ["CleanOptions"]


@dataclass(frozen=True, kw_only=True)
class CleanOptions:
    """`isood splits clean` (one description per option: ``isood.core.optspec``)."""

    splits: str = option(REQUIRED, kind="path", argument=True, metavar="SPLITS",
                         help="A splits manifest (isood build-splits or isood import isood-lists).")
    audit: str = option(REQUIRED, kind="path", metavar="AUDIT",
                        help="An audit of its classes (isood wordnet audit SPLITS --out AUDIT).")
    out: str = out_option("Output directory (the leak-free splits manifest).")
    rules: str = option(",".join(LEAK_RULES), metavar="RULES", commas=True,
                        help="Audit verdicts to remove, comma-separated (among unknown, id, hypernym, hyponym, "
                             "excluded_subtree).")
    verify: str = verify_option()
    na_threshold: int | None = na_threshold_option(
        "A cell with fewer images left is N/A. Default: the splits manifest's own threshold (N/A = N/A before or "
        "below it now); a value here overrides it (N/A = a missing list or below it) and the output records both.",
        from_manifest=True)
