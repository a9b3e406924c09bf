"""Issue 11, items 1-4: the official IS-OOD release's own rules, against a re-implementation of its evaluation
code (`datasets.py`, `get_id_ood_dataloader_level_split`: for every cell, the `train` and `val` lists are read
with one data_dir, concatenated, and the cell is N/A when the pooled count is below DATASET_NUM_TH = 10)."""

import json
import os
import subprocess
import sys
import textwrap

import numpy as np
import pandas as pd
import pyarrow.parquet as pq
import pytest
from typer.testing import CliRunner

import manifests
from isood.cli import app
from isood.errors import BadInputError
from isood.stages.interop import EXPORT_INFO, EXPORT_YAML, export_openood, import_isood_lists

DATASET_NUM_TH = 10
LEVELS = 8
CELLS = [f"cov_{c}_sem_{s}" for c in range(LEVELS) for s in range(LEVELS)]


def release_loader(data_root, *, data_dir="/IN21K_ROOT/", name="imagenet21k", splits=("train", "val")):
    """The release's rule, as its datasets.py reads lists: cell -> the image files of the pooled cell, or None."""
    out = {}
    for cell in CELLS:
        items = []
        for split in splits:
            with open(os.path.join(data_root, "./imglist/{}/{}/{}.txt".format(name, split, cell))) as f:
                items += [os.path.join(data_dir, line.strip("\n")) for line in f.readlines()]
        out[cell] = None if len(items) < DATASET_NUM_TH else items
    return out


def counts_where_rules_differ(seed=0):
    """(train, val) lines per cell: random small counts plus cells where pooling and per-folder N/A disagree."""
    rng = np.random.default_rng(seed)
    counts = {cell: (int(rng.integers(0, 15)), int(rng.integers(0, 8))) for cell in CELLS}
    counts.update({"cov_5_sem_0": (6, 5),   # 11 pooled: the release evaluates it; either folder alone is N/A
                   "cov_0_sem_0": (9, 0),   # 9: N/A both ways
                   "cov_7_sem_7": (0, 12),  # usable in val alone and pooled
                   "cov_2_sem_3": (10, 3),  # usable pooled and in train; N/A in val
                   "cov_4_sem_4": (0, 0)})  # an empty cell
    return counts


def write_release(root, counts, *, name="imagenet21k"):
    """`root/imglist/<name>/{train,val}/<cell>.txt` with the release's path strings; returns the list folder."""
    folder = root / "imglist" / name
    k = 0
    for cell, per_split in counts.items():
        for split, n in zip(("train", "val"), per_split):
            lines = []
            for _ in range(n):
                wnid = f"n{1000000 + k % 37:08d}"
                lines.append(f"./imagenet21k_{split}/{wnid}/{wnid}_{k}.JPEG\n")
                k += 1
            f = folder / split / f"{cell}.txt"
            f.parent.mkdir(parents=True, exist_ok=True)
            f.write_text("".join(lines))
    return folder


@pytest.fixture
def release(tmp_path):
    counts = counts_where_rules_differ()
    return write_release(tmp_path / "release", counts), counts


# ------------------------------------------------------------------------------------------ 1. pooled N/A
def test_cells_are_pooled_across_subsets_as_the_release_decides(tmp_path, release, load):
    folder, counts = release
    expected = release_loader(tmp_path / "release")
    m = import_isood_lists(folder, tmp_path / "m")
    cells = m.frame("cells").set_index("cell")
    assert list(cells.index) == CELLS and "source" not in cells.columns  # one row per cell
    assert {c: bool(cells.loc[c, "na"]) for c in CELLS} == {c: expected[c] is None for c in CELLS}
    assert {c: int(cells.loc[c, "n"]) for c in CELLS} == {c: sum(counts[c]) for c in CELLS}
    assert not cells.loc["cov_5_sem_0", "na"] and cells.loc["cov_0_sem_0", "na"]
    view = manifests.read(m.root, kind="splits")
    assert view.na_rule == "pooled" and view.subsets == ["train", "val"] and view.release_name == "imagenet21k"
    assert "N/A rule `pooled`" in (m.root / "README.md").read_text()
    # the release's pooled cell, rows in its order (train then val), with the subset of each image
    rows = load(m.root, "cov_5_sem_0")["test"]
    listed = [p[len("/IN21K_ROOT/"):] for p in expected["cov_5_sem_0"]]
    assert rows["path"] == listed and rows["subset"] == ["train"] * 6 + ["val"] * 5
    assert rows.num_rows == 11 and set(rows["cell"]) == {"cov_5_sem_0"}
    assert load(m.root, "cov_7_sem_7")["test"].num_rows == 12
    with pytest.raises(ValueError, match="corresponds to no data"):
        load(m.root, "cov_0_sem_0")  # N/A: a config without rows (`datasets` builds no empty split)
    images = m.frame("images")
    assert images["path"].str.startswith("./imagenet21k_").all()  # the release's strings, './' kept
    assert (images["wnid"] == images["path"].str.split("/").str[2]).all()


def test_per_subset_rule_decides_each_folder(tmp_path, release):
    folder, counts = release
    m = import_isood_lists(folder, tmp_path / "m", na_rule="per-subset")
    cells = m.frame("cells").set_index(["source", "cell"])
    assert len(cells) == 2 * 64
    for cell in CELLS:
        for i, split in enumerate(("train", "val")):
            assert cells.loc[(split, cell), "n"] == counts[cell][i]
            assert bool(cells.loc[(split, cell), "na"]) == (counts[cell][i] < DATASET_NUM_TH)
    assert cells.loc[("train", "cov_5_sem_0"), "na"] and cells.loc[("val", "cov_5_sem_0"), "na"]
    assert m.meta["command"]["config"]["na_rule"] == "per-subset"


# ------------------------------------------------------------------------------------------ 2. missing lists
def test_a_missing_list_is_an_error_naming_the_cell(tmp_path, release):
    folder, _ = release
    (folder / "val/cov_7_sem_0.txt").unlink()
    with pytest.raises(BadInputError, match=r"val: 1 of 64 lists missing \(cov_7_sem_0\).*--allow-missing"):
        import_isood_lists(folder, tmp_path / "m")
    assert not (tmp_path / "m" / "manifest.json").exists()
    res = CliRunner().invoke(app, ["import", "isood-lists", str(folder), "--out", str(tmp_path / "m")])
    assert res.exit_code == 2 and "cov_7_sem_0" in res.output and "Traceback" not in res.output
    one = tmp_path / "one"
    (one / "train").mkdir(parents=True)
    (folder / "train/cov_3_sem_3.txt").rename(one / "train/cov_3_sem_3.txt")
    with pytest.raises(BadInputError, match=r"train: 63 of 64 lists missing"):
        import_isood_lists(one, tmp_path / "m")


def test_allow_missing_flags_cells_distinct_from_empty_ones(tmp_path, release):
    folder, counts = release
    (folder / "val/cov_7_sem_0.txt").unlink()
    res = CliRunner().invoke(app, ["import", "isood-lists", str(folder), "--out", str(tmp_path / "m"),
                                   "--allow-missing"])
    assert res.exit_code == 0, res.output
    assert "cov_7_sem_0" in res.stdout  # the summary names the missing list
    m = manifests.read(tmp_path / "m", kind="splits")
    cells = m.cells.set_index("cell")
    assert cells.loc["cov_7_sem_0", "missing"] and cells.loc["cov_7_sem_0", "missing_in"] == "val"
    assert cells.loc["cov_7_sem_0", "n"] == counts["cov_7_sem_0"][0]  # what train lists
    assert not cells.loc["cov_4_sem_4", "missing"] and cells.loc["cov_4_sem_4", "n"] == 0  # empty, not missing
    assert int(cells["missing"].sum()) == 1
    assert m.meta["summary"]["missing_lists"] == {"val": ["cov_7_sem_0"]}
    assert "missing" in (tmp_path / "m/README.md").read_text()
    # the export leaves the missing list out, so a re-import records it again
    out = tmp_path / "o"
    export_openood(m.root, out)
    assert not (out / "imglist/imagenet21k/val/cov_7_sem_0.txt").exists()
    assert (out / "imglist/imagenet21k/val/cov_4_sem_4.txt").read_text() == ""
    again = import_isood_lists(out / "imglist/imagenet21k", tmp_path / "m2", allow_missing=True)
    assert again.content_sha256 == m.content_sha256


# ------------------------------------------------------------------------------------------ 3. export layout
def test_export_is_read_unchanged_by_the_release_loader_and_registers_pooled_cells(tmp_path, release):
    folder, _ = release
    m = import_isood_lists(folder, tmp_path / "m")
    out = tmp_path / "export"
    r = export_openood(m.root, out, data_dir="images/in21k/")
    assert release_loader(out) == release_loader(tmp_path / "release")  # same cells, same path strings, same N/A
    for split in ("train", "val"):
        for cell in CELLS:
            assert ((out / f"imglist/imagenet21k/{split}/{cell}.txt").read_bytes()
                    == (folder / f"{split}/{cell}.txt").read_bytes())
    expected = {c: v for c, v in release_loader(tmp_path / "release", data_dir="").items() if v is not None}
    info = json.loads((out / EXPORT_INFO).read_text())
    registered = info["ood"]["near"]["datasets"] + info["ood"]["far"]["datasets"]
    assert sorted(set(registered)) == sorted(expected) == sorted(r.registered)  # one dataset per pooled cell
    for group in ("near", "far"):
        for ds in info["ood"][group]["datasets"]:
            entry = info["ood"][group][ds]
            assert entry["data_dir"] == "images/in21k/"  # one image root for both subsets
            with open(out / entry["imglist_path"]) as f:  # OpenOOD's ImglistDataset: split at the first space
                names = [line.strip("\n").split(" ", 1)[0] for line in f.readlines()]
            assert names == expected[ds]
    yml = (out / EXPORT_YAML).read_text()
    assert "train_" not in yml and "val_" not in yml


def test_round_trip_through_the_export_is_exact(tmp_path, release):
    folder, _ = release
    first = import_isood_lists(folder, tmp_path / "m1")
    export_openood(first.root, tmp_path / "o")
    second = import_isood_lists(tmp_path / "o/imglist/imagenet21k", tmp_path / "m2")
    for t in ("images", "cells", "edges"):
        pd.testing.assert_frame_equal(first.frame(t), second.frame(t))
    assert first.content_sha256 == second.content_sha256
    again = import_isood_lists(folder, tmp_path / "m1")  # an identical re-import keeps the version
    assert again.dataset_version == "1.0.0" and again.content_sha256 == first.content_sha256
    assert manifests.verify(again.root).ok


# ------------------------------------------------------------------------------------------ 4. streaming
_PEAK = textwrap.dedent("""
    import sys
    from isood.stages.interop import import_isood_lists
    import_isood_lists(sys.argv[1], sys.argv[2], row_group_rows=20_000)
    for line in open("/proc/self/status"):
        if line.startswith("VmHWM:"):
            print(int(line.split()[1]) * 1024)
""")


def _peak_import(folder, out):
    res = subprocess.run([sys.executable, "-c", _PEAK, str(folder), str(out)], capture_output=True, text=True,
                         env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert res.returncode == 0, res.stderr[-2000:]
    return int(res.stdout.split()[-1])


@pytest.mark.skipif(not os.path.exists("/proc/self/status"), reason="peak RSS from /proc (Linux)")
def test_import_memory_does_not_grow_with_the_rows(tmp_path):
    """Peak memory of an import grows by far less than a row's worth of Python objects per row: 10x the rows in
    equal-size lists costs < 100 bytes per extra row (the in-memory import needed ~1.3 KB per row)."""
    small, large = 40_000, 400_000
    peaks = {}
    for n in (small, large):
        per = n // 128
        folder = write_release(tmp_path / f"r{n}", {c: (per, per) for c in CELLS})
        peaks[n] = _peak_import(folder, tmp_path / f"m{n}")
        groups = pq.ParquetFile(tmp_path / f"m{n}/data/images.parquet").metadata
        assert max(groups.row_group(i).num_rows for i in range(groups.num_row_groups)) <= 20_000
    slope = (peaks[large] - peaks[small]) / (large - small)
    assert slope < 100, f"{slope:.0f} bytes per row ({peaks})"
