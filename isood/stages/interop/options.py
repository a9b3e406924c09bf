"""The options of the imports (`isood import isood-lists / imagenet-ood / openood-imglist`), one description
each (``isood.core.optspec``)."""

from __future__ import annotations

from dataclasses import dataclass

from isood.core.optspec import REQUIRED, option
from isood.core.shared_options import levels_option, na_threshold_option, out_option, verify_option

__all__ = ["ImportListsOptions", "ImportListOptions", "ExportOpenoodOptions", "NA_RULES"]

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
    na_threshold: int = na_threshold_option()
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


@dataclass(frozen=True, kw_only=True)
class ExportOpenoodOptions:
    """`isood export openood` (``isood.stages.interop.export_openood`` takes the same names)."""

    manifest_dir: str | None = option(None, kind="path", argument=True, metavar="MANIFEST",
                                      help="A splits, syn-is or image-list manifest (leave out to write ID lists "
                                           "only).")
    out: str = option(REQUIRED, kind="path", metavar="DIR",
                      help="Output folder: new, or an earlier export to add to (each benchmark under its --name; a "
                           "re-export replaces only its own files).")
    name: str | None = option(None, help="Benchmark name: imglist/<name>/ and benchmark_imglist/<name>/ (default: an "
                                         "imported release's folder name, e.g. imagenet21k, else isood; SynIS for the "
                                         "release's Syn-IS layout).")
    data_root: str = option("./data/", flag="--yaml-data-root", metavar="TEXT",
                            help="The data root written into the exported YAML config (where OpenOOD will read "
                                 "it; not read here).")
    data_dir: str | None = option(None, help="Image folder of this benchmark under the data root (default: <name>/, "
                                             "the release's root: imagenet21k/ holds imagenet21k_train/ and "
                                             "imagenet21k_val/); the listed paths are relative to it. Linked to "
                                             "--image-root.")
    image_root: str | None = option(None, kind="path", help="The folder the manifest's image paths are relative to, "
                                                            "linked as <out>/<data dir> (default: a splits manifest's "
                                                            "test_root, a Syn-IS manifest's folder; an imported list "
                                                            "has none: 'ready' then says what to link).")
    num_classes: int | None = option(None, least=1, help="Number of ID classes, OpenOOD's num_classes (default: "
                                                         "the ID classes: --classes, the wnid folders of --id-train, "
                                                         "else the largest label + 1; pass 1000 to label an "
                                                         "ImageNet-1K subset in ImageNet-1K's order).")
    near_axis: str | None = option(None, choices=("sem", "cov"), metavar="AXIS",
                                   help="Grid cells are near-OOD when their level on this axis (sem, the default, or "
                                        "cov) is below --near-below, far-OOD otherwise.")
    near_below: int | None = option(None, least=1, metavar="K",
                                    help="Cells with level < K are near-OOD (default: the lower half of the levels, "
                                         "4 of 8).")
    group: str | None = option(None, choices=("near", "far", "val"), metavar="GROUP",
                               help="OpenOOD group of an image list: near (the default: semantic shift only, e.g. "
                                    "ImageNet-OOD), far (a domain shift too) or val (the OOD val split).")
    val_cells: str | None = option(None, metavar="CELLS", commas=True,
                                   help="Grid cells held out as OpenOOD's OOD val split (comma-separated, e.g. "
                                        "cov_0_sem_7,cov_7_sem_7): not registered for near/far; APS-mode "
                                        "postprocessors tune on them.")
    id_train: str | None = option(None, kind="path", help="ID training images: a folder of wnid sub-folders, or a "
                                                          "list ('path' or 'path label' per line).")
    id_val: str | None = option(None, kind="path", help="ID validation images (APS-mode postprocessors tune on "
                                                        "them).")
    id_test: str | None = option(None, kind="path", help="ID test images.")
    id_root: str | None = option(None, kind="path", help="The folder the ID paths are relative to, linked as "
                                                         "<out>/imagenet1k (default: the parent of the ID folders; "
                                                         "pass it for ID list files).")
    classes: str | None = option(None, kind="path", help="Class list (one wnid per line, in logit order) labelling "
                                                         "ID images by their wnid folder (default: the sorted wnids "
                                                         "of --id-train).")
    verify: str = verify_option()
