"""The options of `isood compare`, one description each (``isood.core.optspec``)."""

from __future__ import annotations

from dataclasses import dataclass

from isood.core.optspec import REQUIRED, option
from isood.core.shared_options import verify_option

__all__ = ["CompareOptions"]


@dataclass(frozen=True, kw_only=True)
class CompareOptions:
    """`isood compare` (``compare_runs`` takes the same values)."""

    runs: tuple[str, ...] = option(REQUIRED, kind="list", argument=True, least=1, metavar="RUN...",
                                   help="Evaluation manifests (isood evaluate --out), one or more.")
    out: str = option(REQUIRED, kind="path", metavar="DIR",
                      help="Output folder for leaderboard.csv and leaderboard.md (new, empty, or an earlier isood "
                           "compare --out).")
    names: str | None = option(None, commas=True, help="Comma-separated labels of the runs, in order (default: their folder "
                                          "names).")
    rank_by: str = option("auroc", metavar="METRIC",
                          help="Metric ranking the detectors of each dataset (mean over the measured cells; "
                               "lower-is-better metrics rank ascending).")
    verify: str = verify_option()
