"""The official IS-OOD release's own rules, against a re-implementation of its evaluation
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
import yaml
from typer.testing import CliRunner

import manifests
from isood.cli import app
from isood.core.errors import BadInputError
from isood.stages.interop import EXPORT_INFO, EXPORT_YAML, export_openood, import_imagenet_ood, import_isood_lists

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
    assert rows.num_rows == 11 and {rows.features["cell"].int2str(c) for c in rows["cell"]} == {"cov_5_sem_0"}
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
    ood = info["data_info"]["ood"]
    registered = ood["near"]["datasets"] + ood["far"]["datasets"]
    expected = {f"imagenet21k_{c}": v for c, v in expected.items()}  # one dataset per pooled cell, named per benchmark
    assert sorted(set(registered)) == sorted(expected) == sorted(r.registered)
    for group in ("near", "far"):
        for ds in ood[group]["datasets"]:
            entry = ood[group][ds]
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


# ------------------------------------------------------------------------------------------ 5. one data root
# Copies of the two loaders' rules, written from their code (nothing imported from either):
# - the release's datasets.py, get_id_ood_dataloader_level_split(data_root): its BaseDataset takes the whole line
#   (strip('\n')) as the image path under one data_dir: ID lists imglist/imagenet1k/{train,val,test}_imagenet.txt
#   under data_root/imagenet1k; the imagenet21k cells pool imglist/imagenet21k/{train,val}/<cell>.txt under
#   data_root/imagenet21k; the SynIS cells imglist/SynIS/<cell>.txt under data_root/SynIS; a cell with fewer than
#   10 images has no loader;
# - OpenOOD v1.5's evaluation_api: get_id_ood_dataloader(id_name, data_root) builds an ImglistDataset for every
#   DATA_INFO[id_name]['id'] split, every 'csid' dataset, the 'ood' 'val' entry and every dataset of the 'near' and
#   'far' groups, each os.path.join(data_root, imglist_path / data_dir); ImglistDataset splits a line at its first
#   space (a line without one fails), refuses a path starting with '/', reads the rest with ast.literal_eval (an
#   int label) and indexes a soft label of num_classes with a label >= 0; getitem opens the file
#   os.path.join(data_dir, image_name) and reads its bytes; Evaluator.hyperparam_search (APS mode) reads
#   dataloader_dict['id']['val'] and ['ood']['val'], eval_ood averages each of near and far (empty fails) and
#   reports every dataset of each group under its name (a dataset in both groups would be reported twice).
def release_data(data_root):
    """The release's loader on ``data_root``: {'id': split -> files, 'ood' / 'SynIS': cell -> files or None}."""
    data = {"id": {}, "ood": {}, "SynIS": {}}
    for split in ("train", "val", "test"):
        with open(os.path.join(data_root, "./imglist/imagenet1k/{}_imagenet.txt".format(split))) as f:
            data["id"][split] = [os.path.join(data_root, "imagenet1k", ln.strip("\n")) for ln in f.readlines()]
    data["ood"] = release_loader(data_root, data_dir=os.path.join(data_root, "imagenet21k"))
    for cell in CELLS:
        with open(os.path.join(data_root, "./imglist/SynIS/{}.txt".format(cell))) as f:
            items = [os.path.join(data_root, "SynIS", ln.strip("\n")) for ln in f.readlines()]
        data["SynIS"][cell] = None if len(items) < DATASET_NUM_TH else items
    return data


def openood_data(data_root, info):
    """OpenOOD's loaders on ``data_root`` for the DATA_INFO entry ``info``: {'id': {split: items}, 'csid': ...,
    'ood': {'val': items, 'near': {name: items}, 'far': ...}} with items = [(file, label)]."""
    import ast

    def dataset(entry):
        data_dir = os.path.join(data_root, entry["data_dir"])
        items = []
        with open(os.path.join(data_root, entry["imglist_path"])) as f:
            for line in f.readlines():
                tokens = line.strip("\n").split(" ", 1)
                image_name, extra = tokens[0], tokens[1]
                if data_dir != "" and image_name.startswith("/"):
                    raise RuntimeError('image_name starts with "/"')
                path = os.path.join(data_dir, image_name)
                with open(path, "rb") as image:  # getitem reads every image it lists
                    image.read()
                label = int(ast.literal_eval(extra))
                if label >= 0:
                    assert label < info["num_classes"], line  # soft_label[label] = 1
                items.append((path, label))
        return items

    near, far = info["ood"]["near"], info["ood"]["far"]
    assert not set(near["datasets"]) & set(far["datasets"])  # one dataset, one group: never reported twice
    assert not ({near[n]["imglist_path"] for n in near["datasets"]} & {far[n]["imglist_path"] for n in far["datasets"]})

    out = {"id": {s: dataset(e) for s, e in info["id"].items()},
           "csid": {n: dataset(info["csid"][n]) for n in info["csid"]["datasets"]}, "ood": {}}
    for split, cfg in info["ood"].items():
        out["ood"][split] = dataset(cfg) if split == "val" else {n: dataset(cfg[n]) for n in cfg["datasets"]}
    assert out["id"]["val"] is not None and out["ood"]["val"] is not None  # hyperparam_search (APS mode)
    assert out["id"]["test"] and out["ood"]["near"] and out["ood"]["far"]  # eval_ood
    return out


ID_WNIDS = ["n01440764", "n01443537", "n01484850"]


def _touch(root, rels):
    for rel in rels:
        p = root / rel
        p.parent.mkdir(parents=True, exist_ok=True)
        p.touch()


@pytest.fixture
def sources(tmp_path, release):
    """What a user has: the release's imagenet21k lists, its SynIS lists, an ImageNet-OOD list, ImageNet train/ and
    val/ in class folders and a labelled test list, all imported or on disk; the images placed where the user
    links them (``images/<benchmark>/...``), from the sources, not from any export."""
    folder, counts = release
    src = tmp_path / "src"
    syn = src / "SynIS"
    syn.mkdir(parents=True)
    syn_counts = {cell: (i * 7) % 15 for i, cell in enumerate(CELLS)}
    for cell, n in syn_counts.items():
        (syn / f"{cell}.txt").write_text("".join(f"anime/{cell}_{k}.png\n" for k in range(n)))
    (src / "imagenet_ood.txt").write_text("".join(f"n0999{i:04d}/n0999{i:04d}_{i}.JPEG\n" for i in range(12)))
    images = tmp_path / "images"
    for split, n in (("train", 4), ("val", 2)):
        _touch(images / "imagenet1k", [f"{split}/{w}/{w}_{k}.JPEG" for w in ID_WNIDS for k in range(n)])
    test_lines = [f"test/ILSVRC2012_val_{k:08d}.JPEG {k % 3}" for k in range(1, 10)]
    (src / "test_imagenet.txt").write_text("".join(ln + "\n" for ln in test_lines))
    _touch(images / "imagenet1k", [ln.split()[0] for ln in test_lines])
    for split in ("train", "val"):
        _touch(images / "imagenet21k", [ln.strip() for f in (folder / split).glob("*.txt")
                                        for ln in f.read_text().splitlines()])
    _touch(images / "SynIS", [ln for f in syn.glob("*.txt") for ln in f.read_text().splitlines()])
    _touch(images / "imagenet_ood", (src / "imagenet_ood.txt").read_text().splitlines())
    manifests_ = {"imagenet21k": import_isood_lists(folder, tmp_path / "m21k").root,
                  "SynIS": import_isood_lists(syn, tmp_path / "msyn").root,
                  "imagenet_ood": import_imagenet_ood(src / "imagenet_ood.txt", tmp_path / "mood").root}
    return src, images, manifests_, counts, syn_counts


def test_one_data_root_for_every_benchmark_read_unchanged_by_both_loaders(tmp_path, sources):
    src, images, ms, counts, syn_counts = sources
    out = tmp_path / "data"
    r = export_openood(ms["imagenet21k"], out, val_cells="cov_5_sem_0,cov_7_sem_7", id_train=images / "imagenet1k/train",
                       id_val=images / "imagenet1k/val", id_test=src / "test_imagenet.txt",
                       image_root=images / "imagenet21k")
    assert r.ready["release"][0].startswith("imglist/SynIS/")  # the release also opens the SynIS lists
    assert r.num_classes == len(ID_WNIDS)  # from the ID classes
    r = export_openood(ms["SynIS"], out)  # an imported list records no image folder: not ready until linked
    assert [line.split(" ", 1)[0] for line in r.ready["openood"]] == ["SynIS/"] and not (out / "SynIS").exists()
    export_openood(ms["SynIS"], out, image_root=images / "SynIS")
    r = export_openood(ms["imagenet_ood"], out, name="imagenet_ood", image_root=images / "imagenet_ood")
    assert r.ready == {"openood": [], "release": []}
    assert sorted(p.name for p in out.iterdir() if p.is_symlink()) == ["SynIS", "imagenet1k", "imagenet21k",
                                                                        "imagenet_ood"]  # the export's own links
    info = json.loads((out / EXPORT_INFO).read_text())
    assert sorted(info["benchmarks"]) == ["SynIS", "imagenet21k", "imagenet_ood"]

    # the release's loader: every list, every image found, the ID lists bare paths, the cells as the sources say
    rel = release_data(out)
    assert rel["ood"] == release_loader(tmp_path / "release", data_dir=os.path.join(out, "imagenet21k"))
    assert {c: (v is None) for c, v in rel["SynIS"].items()} == {c: n < DATASET_NUM_TH for c, n in syn_counts.items()}
    assert [len(rel["id"][s]) for s in ("train", "val", "test")] == [12, 6, 9]
    files = [f for part in rel.values() for v in part.values() if v for f in v]
    assert files and all(os.path.isfile(f) for f in files)

    # OpenOOD's loaders on the same folder: every file found, ID labels = class index, OOD labels -1
    data = openood_data(out, info["data_info"])
    for split, items in data["id"].items():
        assert [os.path.realpath(f) for f, _ in items] == [os.path.realpath(f) for f in rel["id"][split]]
    train = dict(data["id"]["train"])
    assert {os.path.basename(os.path.dirname(f)): lab for f, lab in train.items()} == {w: i for i, w in
                                                                                     enumerate(ID_WNIDS)}
    assert [lab for _, lab in data["id"]["test"]] == [k % 3 for k in range(1, 10)]
    groups = {**data["ood"]["near"], **data["ood"]["far"]}
    held = {"cov_5_sem_0", "cov_7_sem_7"}
    usable = {f"imagenet21k_{c}" for c, v in rel["ood"].items() if v is not None and c not in held}
    usable |= {f"SynIS_{c}" for c, v in rel["SynIS"].items() if v is not None} | {"imagenet_ood"}
    assert set(groups) == usable
    for name, items in groups.items():
        assert items and all(os.path.isfile(f) and lab == -1 for f, lab in items), name
        if name.startswith("imagenet21k_"):
            assert [f for f, _ in items] == rel["ood"][name[len("imagenet21k_"):]]  # same images, same order
    near = set(data["ood"]["near"])
    assert all((int(n.split("_sem_")[1]) < 4) == (n in near) for n in usable - {"imagenet_ood"})
    assert "imagenet_ood" in near  # an image list joins --group (default near)
    val = [f for f, _ in data["ood"]["val"]]
    assert val == sorted(rel["ood"]["cov_5_sem_0"] + rel["ood"]["cov_7_sem_7"], key=val.index)
    assert sorted(val) == sorted(rel["ood"]["cov_5_sem_0"] + rel["ood"]["cov_7_sem_7"])

    # the older config pipeline: dataset + ood_dataset blocks, APS's 'val' in both
    cfg = yaml.safe_load((out / EXPORT_YAML).read_text())
    assert cfg["dataset"]["split_names"] == ["train", "val", "test"]
    assert cfg["ood_dataset"]["split_names"] == ["val", "nearood", "farood"]
    assert set(cfg["ood_dataset"]["nearood"]["datasets"]) | set(cfg["ood_dataset"]["farood"]["datasets"]) == usable


def test_a_re_export_replaces_only_its_own_benchmark(tmp_path, sources):
    src, images, ms, *_ = sources
    out = tmp_path / "data"
    for name in ("imagenet21k", "SynIS", "imagenet_ood"):
        export_openood(ms[name], out, name=name)
    before = json.loads((out / EXPORT_INFO).read_text())
    kept = {p: p.read_bytes() for p in out.rglob("*.txt") if "SynIS" not in str(p)}
    export_openood(ms["SynIS"], out, near_axis="cov", near_below=2, val_cells="cov_0_sem_1")
    after = json.loads((out / EXPORT_INFO).read_text())
    assert {k: v for k, v in after["benchmarks"].items() if k != "SynIS"} == {
        k: v for k, v in before["benchmarks"].items() if k != "SynIS"}
    assert after["benchmarks"]["SynIS"]["rule"]["near_axis"] == "cov"
    assert {p: p.read_bytes() for p in out.rglob("*.txt") if "SynIS" not in str(p)} == kept
    assert not (out / "benchmark_imglist/SynIS/test_cov_0_sem_1.txt").exists()  # held out: in val_SynIS.txt
    assert (out / "benchmark_imglist/SynIS/val_SynIS.txt").read_text().count("\n") == 7
    assert (out / "imglist/SynIS/cov_0_sem_1.txt").is_file()  # the release evaluates every cell
    with pytest.raises(BadInputError, match="OOD val split comes from 'SynIS'"):
        export_openood(ms["imagenet21k"], out, val_cells="cov_5_sem_0")
    assert json.loads((out / EXPORT_INFO).read_text()) == after  # refused before anything was written


def test_a_file_no_export_wrote_is_never_overwritten(tmp_path, sources):
    src, images, ms, *_ = sources
    out = tmp_path / "data"
    export_openood(ms["imagenet_ood"], out, name="imagenet_ood")
    mine = out / "benchmark_imglist/SynIS/test_cov_0_sem_1.txt"
    mine.parent.mkdir(parents=True)
    mine.write_text("my notes\n")
    with pytest.raises(BadInputError, match="test_cov_0_sem_1.txt exists and was not written by an isood export"):
        export_openood(ms["SynIS"], out)
    assert mine.read_text() == "my notes\n" and not (out / "imglist/SynIS").exists()
    assert list(json.loads((out / EXPORT_INFO).read_text())["benchmarks"]) == ["imagenet_ood"]


def test_a_pipeline_grid_exported_as_imagenet21k_is_read_by_the_release(tmp_path, worlds):
    m = worlds.write_splits(tmp_path / "s")
    out = tmp_path / "data"
    export_openood(m.root, out, name="imagenet21k")
    images = m.frame("images")
    images = images[images["cov_level"] >= 0]
    got = release_loader(out, data_dir="")  # train/ holds the grid, val/ is empty: the pool is the grid's cell
    for cell in CELLS:
        expected = images.loc[images["cell"] == cell, "path"].tolist()
        assert got[cell] == (None if len(expected) < DATASET_NUM_TH else expected)
    assert (out / "imglist/imagenet21k/val/cov_0_sem_0.txt").read_text() == ""
