"""The stage of `isood compare RUN...`: a leaderboard across evaluation runs (``options``: its options; ``stage``:
load every run's ``evaluation`` manifest, rank, write leaderboard.csv and leaderboard.md)."""

from isood.stages.compare.options import CompareOptions
from isood.stages.compare.stage import LEADERBOARD_CSV, LEADERBOARD_MD, MARKER, CompareResult, compare_runs

__all__ = ["CompareOptions", "CompareResult", "LEADERBOARD_CSV", "LEADERBOARD_MD", "MARKER", "compare_runs"]
