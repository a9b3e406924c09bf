"""The stage of interop with other OOD tools: IS-OOD release lists, ImageNet-OOD lists, OpenOOD imglists (in and out).

Imports (each: parse the list files -> build the tables (pure) -> write a manifest with its dataset card):

- `import_isood_lists(DIR)`: an IS-OOD release folder (`release`): per-cell path lists named
  `cov_{c}_sem_{s}.txt` (0-based; a prefix such as `test_cov_2_sem_5.txt` is allowed), in one sub-folder per
  subset (`imagenet21k/train/`, `imagenet21k/val/`) or at the top (`SynIS/`): the subset of a list is its
  folder relative to DIR ('' at the top). Lines are `path` or OpenOOD's `path label`; paths are kept exactly as
  listed (the release's `./imagenet21k_train/...`). The release's rule is followed by default
  (`na_rule="pooled"`): a cell is the pool of its lists across the subsets, N/A when the pooled count is below
  the threshold (10), rows ordered cell by cell and subset by subset; `"per-subset"` decides each subset on
  its own. Every subset must hold all n_levels^2 lists (a missing one is an error naming the cells, or with
  `allow_missing` a `missing` flag per cell). Result: kind `splits`, table `images` (path, wnid, d_sem, d_cov,
  sem_level, cov_level, cell, subset, [source for per-subset], label) with d_sem / d_cov NaN, levels from the
  file names, label -1 (OpenOOD's OOD label) where a line has none; `cells` (every cell: n, na, missing,
  missing_in; per subset with `source`/`subset` for per-subset); `edges` with NaN bounds; a copy of every list
  under `lists/<subset>/`. Streamed (``manifests.stream``): 12M rows import in bounded memory.
- `import_imagenet_ood(FILE)`: one relative image path per line -> kind `image-list` (path, wnid, label=-1).
- `import_openood_imglist(FILE)`: OpenOOD's `path label` per line -> kind `image-list` (path, wnid, label).

The wnid of an image path is `wordnet_tools.wnids.wnid_from_path` (None when the path names no class).

Export: `export_openood(MANIFEST, OUT)` reads a splits, syn-is or image-list manifest one row group at a time
and writes into OUT, one OpenOOD data root (and the release's `data_root`) shared by any number of exports, with
NAME the imported release's folder name (`imagenet21k`) or `isood` (`--name`):

- `OUT/imglist/NAME/[<subset>/]cov_{c}_sem_{s}.txt` (grid manifests): the release's own layout and line format
  (paths exactly as imported, `path` alone for OOD label -1), every cell of every subset (empty lists
  included, lists the release lacked left out), so the release's evaluation code (`datasets.py`) reads the
  export unchanged. A grid without subsets exported as `imagenet21k` goes to `train/` with empty `val/` lists
  (the release pools the two); as `SynIS` it stays at the top, as the release reads it;
- `OUT/benchmark_imglist/NAME/[<source>/]test_cov_{c}_sem_{s}.txt`: OpenOOD v1.5 imglists (`path label`),
  one per cell with images but the held-out ones, the pooled cell's subsets one after the other (per source
  for per-subset manifests); an image list gives `test_NAME.txt` (`val_NAME.txt` with `--group val`);
- `OUT/benchmark_imglist/NAME/val_NAME.txt`: the OOD val split of a grid, the images of its held-out cells
  (`--val-cells`), which are then neither registered nor written as test lists (the release-format lists keep
  every cell: the release evaluates them all);
- ID lists (`--id-train / --id-val / --id-test`, ``id_lists``): `OUT/imglist/imagenet1k/<split>_imagenet.txt`
  (the release: the path alone) and `OUT/benchmark_imglist/imagenet1k/<split>_imagenet1k.txt` (OpenOOD:
  `path label`, a class index per line), both relative to `OUT/imagenet1k/`;
- `OUT/openood_data_info.json` (``openood_info``): a record per benchmark (its manifest, its datasets with their
  group, its near/far rule, its val split), the ID lists, `data_info` (OpenOOD's `DATA_INFO[...]` entry built from
  every record: id train/val/test, ood val/near/far, one dataset per usable cell or list, each with its
  `data_dir`, by default `NAME/`: the release's image root of that benchmark) and `ready` (what OpenOOD's
  `Evaluator` and the release's `datasets.py` still lack in OUT, the image folders included). A re-export of
  NAME replaces its record and its own files only (a validated ledger, written first, records what each export
  wrote and linked: ``export_folder``); a second OOD val split, another number of ID classes, a dataset name
  taken by another benchmark or a default NAME taken by another manifest is refused in one line before anything
  is written;
- `OUT/imagenet1k` and `OUT/<data_dir>`: links to the ID root and the benchmark's image folder (`image_root`,
  else a splits manifest's `test_root`, else a Syn-IS manifest's folder), never replacing what isood did not make;
- `OUT/openood_ood_dataset.yml`: the same as OpenOOD `configs/datasets/...` blocks (`dataset:` with the ID
  lists, `ood_dataset:` with val / nearood / farood).

Near / far: a grid cell is near when its semantic level is below K (`--near-axis sem`, `--near-below K`,
default the lower half of the levels), far otherwise; a list joins `--group` (default near); see
``openood_info``.

Round trips are exact: `import_isood_lists(OUT/imglist/NAME)` of an export of an imported release gives the same
tables and the same content hash; likewise for image lists through `import_openood_imglist`. Malformed lines
raise `ListFormatError` naming the file and line number. Modules: `lines` (Arrow line parsing and writing),
`imports` (the exact line parser and the image-list imports), `release` (the IS-OOD release import),
`openood` (the export's lists), `openood_export` (the export command), `export_folder` (the folder's ledger,
image-root links and image checks), `openood_info` (the folder's merged data info, pure) and `id_lists` (the ID
lists);
their public names are re-exported here.
"""

from __future__ import annotations

from isood.stages.interop.imports import (
    ListEntry,
    ListFormatError,
    image_list_table,
    import_imagenet_ood,
    import_openood_imglist,
    parse_lines,
    parse_list,
)
from isood.stages.interop.id_lists import IdSource, id_labels, id_list_paths, load_id_lists, read_id_source
from isood.stages.interop.export_folder import BENCHMARK_DIR, EXPORT_INFO, EXPORT_LEDGER, RELEASE_DIR
from isood.stages.interop.openood import EXPORT_KINDS, cell_datasets, export_lines, na_flags, release_list_names
from isood.stages.interop.openood_export import EXPORT_YAML, ExportResult, export_openood
from isood.stages.interop.openood_info import (
    GroupRule,
    assign_groups,
    data_info_entry,
    dataset_config,
    merge_info,
    missing_for_openood,
    missing_for_release,
    release_loader_files,
)
from isood.stages.interop.release import (
    LIST_NAME_RE,
    NA_RULES,
    CellList,
    ReleaseLists,
    cell_of_list,
    check_subsets,
    find_cell_lists,
    import_isood_lists,
    list_order,
    missing_lists,
    release_cells,
    release_edges,
    scan_release,
)

__all__ = [
    "LIST_NAME_RE", "NA_RULES", "ListFormatError", "ListEntry", "CellList", "ReleaseLists", "parse_lines",
    "parse_list", "cell_of_list", "find_cell_lists", "missing_lists", "check_subsets", "list_order",
    "scan_release", "release_cells", "release_edges", "import_isood_lists", "image_list_table",
    "import_imagenet_ood", "import_openood_imglist", "EXPORT_INFO", "EXPORT_YAML", "EXPORT_KINDS", "BENCHMARK_DIR",
    "RELEASE_DIR", "EXPORT_LEDGER", "ExportResult", "export_lines", "na_flags", "cell_datasets",
    "release_list_names", "export_openood", "GroupRule", "assign_groups", "merge_info", "data_info_entry",
    "dataset_config", "release_loader_files", "missing_for_release", "missing_for_openood", "IdSource",
    "read_id_source", "id_labels", "id_list_paths", "load_id_lists",
]
