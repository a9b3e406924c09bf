"""The options of `isood wordnet filter` and `isood wordnet audit`, one description each (``isood.core.optspec``).

Light to import (no WordNet, no nltk): the CLI builds the commands from them before anything is loaded.
"""

from __future__ import annotations

from dataclasses import dataclass

from isood.core.optspec import REQUIRED, option
from isood.core.shared_options import out_option, verify_option
from wordnet_tools.rules import PRESETS

__all__ = ["FilterOptions", "AuditOptions", "CLASS_LIST_FORMS"]

#: What a class list option takes (``wordnet_tools.synsets.load_synset_list``).
CLASS_LIST_FORMS = "1k, 21k, 21k-p, 21k-p-w21, 12k, 21k-goog, a file of wnids, or a dataset root"
_PRESET_HELP = ("Named exclusion: " + "; ".join(f"{k} = {', '.join(p.exclude)}" for k, p in PRESETS.items())
                + " (the ImageNet-OOD paper's rule, the default; the published ImageNet-OOD list). --exclude wins.")


@dataclass(frozen=True, kw_only=True)
class FilterOptions:
    """`isood wordnet filter`."""

    candidates: str = option("21k", help=f"Candidate classes: {CLASS_LIST_FORMS}.", metavar="CLASSES",
                             maybe_path=True)
    id_classes: str = option("1k", help="In-distribution classes (same forms as --candidates).", metavar="CLASSES",
                             aliases=("--id",), maybe_path=True)
    exclude: tuple[str, ...] | None = option(None, help="Drop classes under this synset (repeatable; wins over "
                                                       "--preset). Pass --exclude '' for none.", metavar="SYNSET")
    preset: str | None = option(None, help=_PRESET_HELP, choices=tuple(PRESETS), metavar="NAME")
    sisters_only: bool = option(False, help="Keep only sister classes of ID classes (ImageNet-OOD candidate step).",
                                secondary="--all-candidates")
    out: str = out_option()


@dataclass(frozen=True, kw_only=True)
class AuditOptions:
    """`isood wordnet audit`."""

    source: str = option(REQUIRED, kind="path", argument=True, metavar="SOURCE",
                         help="A list of wnids or image paths (<wnid>/<file> or <wnid>_<n>.JPEG), or a manifest "
                              "folder whose main table has a wnid column (splits, image-list, import).")
    id_classes: str = option("1k", help="In-distribution classes (same forms as filter's --candidates).",
                             metavar="CLASSES", aliases=("--id",), maybe_path=True)
    exclude: tuple[str, ...] | None = option(None, help="Excluded subtree (repeatable; wins over --preset; '' for "
                                                       "none).", metavar="SYNSET")
    preset: str | None = option(None, help=_PRESET_HELP, choices=tuple(PRESETS), metavar="NAME")
    out: str | None = out_option("Write the audit as a manifest here (per-image rule, per-cell and per-level tables "
                                 "for a manifest).", required=False)
    verify: str = verify_option()
