"""L4 stage: interop with other OOD tools: IS-OOD release lists, ImageNet-OOD lists, OpenOOD imglists (in and out).

Imports (each: parse the list files -> build the tables (pure) -> write a manifest with its dataset card):

- `import_isood_lists(DIR)`: the IS-OOD release layout, per-cell path lists named `cov_{c}_sem_{s}.txt`
  (0-based; a prefix such as `test_cov_2_sem_5.txt` is allowed), possibly in sub-folders per source
  (`in21k-train/`, `in21k-val/`, `syn-is/`): the source of a list is its folder relative to DIR ('' at the top).
  Lines are `path` or OpenOOD's `path label`. Result: kind `splits`, table `images` (path, wnid, d_sem, d_cov,
  sem_level, cov_level, cell, source, label) with d_sem / d_cov NaN (the release has levels, not values), levels
  from the file names, label -1 (OpenOOD's OOD label) where a line has none; `cells` per source
  (`isood.grid.cell_table` + source); `edges` (`isood.grid.edges_table`) with NaN bounds (unknown); per-cell
  lists `lists/<source>/cov_{c}_sem_{s}.txt`.
- `import_imagenet_ood(FILE)`: one relative image path per line -> kind `image-list` (path, wnid, label=-1).
- `import_openood_imglist(FILE)`: OpenOOD's `path label` per line -> kind `image-list` (path, wnid, label).

The wnid of an image path is `wordnet_tools.wnids.wnid_from_path` (None when the path names no class).

Export: `export_openood(MANIFEST, OUT)` reads a splits, syn-is or image-list manifest and writes OpenOOD v1.5
benchmark imglists (`path label` lines, label -1 for OOD unless the manifest has a `label` column), one per cell
(per source and cell), under `OUT/benchmark_imglist/<name>/[<source>/]test_cov_{c}_sem_{s}.txt`, plus

- `OUT/openood_data_info.json`: an entry shaped like OpenOOD's `evaluation_api.datasets.DATA_INFO[...]["ood"]`
  (`near` / `far` groups of datasets with `data_dir` and `imglist_path` relative to OpenOOD's data root), one
  dataset per non-N/A cell (N/A as the manifest's `cells` table says), so `Evaluator.eval_ood()` reports every
  cell as its own row. OpenOOD averages each group, so cells are grouped by semantic level: near = lower half of
  the levels, far = upper half (a group with no cell gets every cell). N/A cells' lists are written too (round
  trips keep every row) but not registered.
- `OUT/openood_ood_dataset.yml`: the same as an OpenOOD `configs/datasets/...` `ood_dataset:` block.

Round trips are exact: `import_isood_lists(OUT/benchmark_imglist/<name>)` of an export of an imported release
gives the same tables and the same content hash; likewise for image lists through `import_openood_imglist`.
Malformed lines raise `ListFormatError` naming the file and line number. Modules: `imports` (parsing and the
three imports) and `openood` (the export); their public names are re-exported here.
"""

from __future__ import annotations

from isood.stages.interop.imports import (
    LIST_NAME_RE,
    CellList,
    ListEntry,
    ListFormatError,
    Release,
    cell_list_texts,
    cell_of_list,
    find_cell_lists,
    image_list_table,
    import_imagenet_ood,
    import_isood_lists,
    import_openood_imglist,
    parse_lines,
    parse_list,
    read_isood_lists,
    release_cells,
    release_edges,
    release_images,
)
from isood.stages.interop.openood import (
    EXPORT_INFO,
    EXPORT_KINDS,
    EXPORT_YAML,
    ExportPlan,
    ExportResult,
    cell_datasets,
    data_info,
    export_openood,
    imglist_lines,
    na_flags,
    near_far,
    ood_dataset_config,
    plan_export,
    single_dataset,
)

__all__ = [
    "LIST_NAME_RE", "ListFormatError", "ListEntry", "CellList", "Release", "parse_lines", "parse_list",
    "cell_of_list", "find_cell_lists", "release_images", "release_cells", "release_edges", "cell_list_texts",
    "read_isood_lists", "import_isood_lists", "image_list_table", "import_imagenet_ood", "import_openood_imglist",
    "EXPORT_INFO", "EXPORT_YAML", "EXPORT_KINDS", "ExportResult", "ExportPlan", "imglist_lines", "na_flags",
    "cell_datasets", "single_dataset", "near_far", "data_info", "ood_dataset_config", "plan_export",
    "export_openood",
]
