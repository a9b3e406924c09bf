"""L4: the options of the imports (`isood import isood-lists / imagenet-ood / openood-imglist`), one description
each (``isood.optspec``)."""

from __future__ import annotations

from dataclasses import dataclass

from isood.defaults import NA_THRESHOLD
from isood.optspec import REQUIRED, levels_option, option, out_option

__all__ = ["ImportListsOptions", "ImportListOptions", "NA_RULES"]

#: How an import of release lists decides N/A (``isood.stages.interop.release``).
NA_RULES = ("pooled", "per-subset")


@dataclass(frozen=True, kw_only=True)
class ImportListsOptions:
    """`isood import isood-lists`."""

    directory: str = option(REQUIRED, kind="path", argument=True, metavar="DIRECTORY",
                            help="A release folder of cov_{c}_sem_{s}.txt lists, e.g. <release>/imagenet21k (one "
                                 "sub-folder per subset: train/, val/) or <release>/SynIS.")
    out: str = out_option()
    levels: int = levels_option("Levels per axis of the grid the lists come from.")
    na_threshold: int = option(NA_THRESHOLD, least=0, help="A cell with fewer images is N/A.")
    na_rule: str = option("pooled", choices=NA_RULES, metavar="RULE",
                          help="pooled: a cell pools its lists across the subsets and is N/A when the pooled count is "
                               "below the threshold (the release's rule); per-subset: each subset folder decided on "
                               "its own.")
    allow_missing: bool = option(False, secondary="--require-all",
                                 help="Import a release lacking some lists: their cells are flagged missing "
                                      "(default: an error naming them).")


@dataclass(frozen=True, kw_only=True)
class ImportListOptions:
    """`isood import imagenet-ood` and `isood import openood-imglist`."""

    list_file: str = option(REQUIRED, kind="path", argument=True, metavar="LIST_FILE",
                            help="The list: one relative image path per line (ImageNet-OOD), or '<path> <label>' "
                                 "per line (OpenOOD imglist).")
    out: str = out_option()
