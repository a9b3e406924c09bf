"""The merged data info of an OpenOOD export folder (``isood.stages.interop.openood_info``, pure):
groups, the merge of several benchmarks, OpenOOD's DATA_INFO shape and what each tool still lacks."""

import pytest

from isood.core.errors import BadInputError
from isood.stages.interop import (GroupRule, assign_groups, data_info_entry, dataset_config, merge_info,
                                  missing_for_openood, missing_for_release, release_loader_files)
from isood.stages.interop.openood_info import INFO_FORMAT, benchmark_record, folder_classes, folder_info


def _cells(name, cells, *, na=(), data_dir="d/"):
    """Dataset records of grid cells ``(cov, sem)`` of benchmark ``name``."""
    return [{"dataset": f"{name}_cov_{c}_sem_{s}", "source": "", "cell": f"cov_{c}_sem_{s}", "cov_level": c,
             "sem_level": s, "n": 12, "na": (c, s) in na, "data_dir": data_dir,
             "imglist_path": f"benchmark_imglist/{name}/test_cov_{c}_sem_{s}.txt"} for c, s in cells]


def _record(name, cells, rule=GroupRule(), *, val=None, val_cells=(), kind="splits", n_levels=8, **kw):
    ds = assign_groups(_cells(name, cells, **kw), n_levels, rule, val_cells)
    return benchmark_record(ds, kind=kind, manifest={"kind": kind}, n_levels=n_levels, rule=rule, val=val,
                            release_lists=0)


def _groups(records):
    return {d["dataset"]: d["group"] for d in records}


def test_groups_by_level_axis_and_boundary():
    cells = [(0, 1), (6, 2), (1, 4), (5, 7)]
    got = _groups(assign_groups(_cells("b", cells, na=[(5, 7)]), 8, GroupRule(), ["cov_6_sem_2"]))
    assert got == {"b_cov_0_sem_1": "near", "b_cov_6_sem_2": "val", "b_cov_1_sem_4": "far", "b_cov_5_sem_7": "na"}
    by_cov = _groups(assign_groups(_cells("b", cells), 8, GroupRule(axis="cov", below=2)))
    assert by_cov == {"b_cov_0_sem_1": "near", "b_cov_6_sem_2": "far", "b_cov_1_sem_4": "near",
                      "b_cov_5_sem_7": "far"}
    odd = _groups(assign_groups(_cells("b", [(0, 1), (0, 2)]), 3, GroupRule()))  # ceil(3/2) = 2: levels 0, 1 near
    assert odd == {"b_cov_0_sem_1": "near", "b_cov_0_sem_2": "far"}
    listed = [{"dataset": "l", "sem_level": None, "na": False}]
    assert assign_groups(listed, None, GroupRule(group="far"))[0]["group"] == "far"


@pytest.mark.parametrize("rule, n, option", [
    (GroupRule(axis="semantic"), 8, "--near-axis 'semantic'"), (GroupRule(group="test"), 8, "--group 'test'"),
    (GroupRule(below=8), 8, "--near-below 8: pass 1..7"), (GroupRule(below=0), 8, "--near-below 0")])
def test_rule_out_of_range_is_one_line(rule, n, option):
    with pytest.raises(BadInputError, match=f"^{option}"):
        rule.check(n)


def test_merge_keeps_every_benchmark_and_replaces_one():
    grid = _record("imagenet21k", [(0, 1), (3, 6)])
    syn = _record("SynIS", [(2, 2), (4, 7)], kind="syn-is")
    listed = benchmark_record(assign_groups([{"dataset": "imagenet_ood", "sem_level": None, "na": False, "cell": None,
                                              "data_dir": "imagenet_ood/", "imglist_path": "b/io/test_io.txt"}],
                                            None, GroupRule(group="near")),
                              kind="image-list", manifest={}, n_levels=None, rule=GroupRule(), val=None,
                              release_lists=0)
    info = merge_info(None, "imagenet21k", grid, num_classes=1000)
    info = merge_info(info, "SynIS", syn, num_classes=1000)
    info = merge_info(info, "imagenet_ood", listed, num_classes=1000)
    assert list(info["benchmarks"]) == ["SynIS", "imagenet21k", "imagenet_ood"]
    ood = info["data_info"]["ood"]
    assert ood["near"]["datasets"] == ["SynIS_cov_2_sem_2", "imagenet21k_cov_0_sem_1", "imagenet_ood"]
    assert ood["far"]["datasets"] == ["SynIS_cov_4_sem_7", "imagenet21k_cov_3_sem_6"]
    assert ood["near"]["imagenet_ood"] == {"data_dir": "imagenet_ood/", "imglist_path": "b/io/test_io.txt"}
    # a re-export of one benchmark replaces its record only
    again = merge_info(info, "SynIS", _record("SynIS", [(1, 1)], kind="syn-is"), num_classes=1000)
    assert again["benchmarks"]["imagenet21k"] == info["benchmarks"]["imagenet21k"]
    assert again["data_info"]["ood"]["far"]["datasets"] == ["imagenet21k_cov_3_sem_6"]
    assert "SynIS_cov_4_sem_7" not in again["data_info"]["ood"]["far"]
    # ID lists given later join; the benchmarks stay
    ids = {"test": {"data_dir": "imagenet1k/", "imglist_path": "benchmark_imglist/imagenet1k/test_imagenet1k.txt"}}
    with_id = merge_info(again, "", None, num_classes=1000, id_lists=ids)
    assert with_id["benchmarks"] == again["benchmarks"] and with_id["data_info"]["id"] == ids


def test_data_info_has_openood_shape_and_keeps_an_empty_group_empty():
    val = {"dataset": "g_val", "data_dir": "g/", "imglist_path": "benchmark_imglist/g/val_g.txt", "n": 12}
    info = merge_info(None, "g", _record("g", [(0, 1), (0, 2)], val=val), num_classes=10)
    d = info["data_info"]
    assert d == data_info_entry(info)  # rebuilt from the records
    assert set(d) == {"num_classes", "id", "csid", "ood"} and d["csid"] == {"datasets": []}
    assert d["ood"]["val"] == {"data_dir": "g/", "imglist_path": "benchmark_imglist/g/val_g.txt"}
    # only near cells: far is empty (a dataset is never in both groups), recorded and named in what OpenOOD lacks
    assert d["ood"]["near"]["datasets"] == ["g_cov_0_sem_1", "g_cov_0_sem_2"]
    assert d["ood"]["far"] == {"datasets": []}
    assert info["empty_groups"] == ["far"]
    assert any(line.startswith("a far-OOD dataset: the far group is empty") for line in missing_for_openood(info))
    cfg = dataset_config(info, data_root="/data/")
    assert "dataset" not in cfg  # no ID lists yet
    assert cfg["ood_dataset"]["split_names"] == ["val", "nearood", "farood"]
    assert cfg["ood_dataset"]["val"] == {"data_dir": "/data/g/", "imglist_pth": "/data/benchmark_imglist/g/val_g.txt"}


@pytest.mark.parametrize("second, message", [
    (dict(val={"dataset": "b_val", "data_dir": "", "imglist_path": "v"}), "OOD val split comes from 'a'"),
    (dict(num_classes=10), "--num-classes 10 differs from the 1000"),
])
def test_merge_refusals(second, message):
    first = merge_info(None, "a", _record("a", [(0, 0)], val={"dataset": "a_val", "data_dir": "", "imglist_path": "v"}),
                       num_classes=1000)
    n = second.pop("num_classes", 1000)
    with pytest.raises(BadInputError, match=message):
        merge_info(first, "b", _record("b", [(0, 0)], **second), num_classes=n)


def test_two_benchmarks_cannot_register_one_dataset_name():
    first = merge_info(None, "a_b", _record("a_b", [(0, 0)]), num_classes=1)
    clash = _record("a", [(0, 0)])
    clash["datasets"][0]["dataset"] = "a_b_cov_0_sem_0"
    with pytest.raises(BadInputError, match="'a_b_cov_0_sem_0' of benchmark 'a'"):
        merge_info(first, "a", clash, num_classes=1)


def test_a_folder_info_of_another_format_is_refused_with_one_line():
    """One format is read: a JSON without it (e.g. the pre-release one-benchmark layout) is refused, naming --out."""
    first = merge_info(None, "a", _record("a", [(0, 0)]), num_classes=1)
    assert first["format"] == INFO_FORMAT and folder_info(first) == first and folder_info(None) == {"benchmarks": {}}
    one_benchmark = {"format": "isood openood export 1", "name": "isood", "num_classes": 1000, "datasets": []}
    for old in (one_benchmark, {**first, "format": None}, {"benchmarks": {}}):
        with pytest.raises(BadInputError, match="not an isood export's; pass a new --out") as info:
            merge_info(old, "other", None, num_classes=1000)
        assert "\n" not in str(info.value)


def test_what_each_loader_still_lacks():
    files = release_loader_files()
    assert len(files) == 3 + 2 * 64 + 64 and files[0] == "imglist/imagenet1k/train_imagenet.txt"
    assert "imglist/imagenet21k/val/cov_7_sem_7.txt" in files and "imglist/SynIS/cov_0_sem_0.txt" in files
    assert missing_for_release(files) == []
    lacks = missing_for_release([f for f in files if not f.startswith("imglist/SynIS/")] [1:])
    assert lacks[0].startswith("imglist/imagenet1k/train_imagenet.txt (pass --id-train")
    assert lacks[1].startswith("imglist/SynIS/ (64 of 64 cell lists missing: export the Syn-IS manifest with "
                               "--name SynIS")
    info = merge_info(None, "a", _record("a", [(0, 0), (0, 6)]), num_classes=1000)
    lacks = missing_for_openood(info)
    assert lacks[0].startswith("ID train/val/test lists") and "OOD val split" in lacks[1]
    ids = {s: {"data_dir": "imagenet1k/", "imglist_path": s} for s in ("train", "val", "test")}
    val = {"dataset": "v", "data_dir": "", "imglist_path": "v"}
    ready = merge_info(None, "a", _record("a", [(0, 0), (0, 6)], val=val), num_classes=1000, id_lists=ids)
    assert missing_for_openood(ready) == []


def test_num_classes_follows_the_id_classes():
    """The folder's num_classes: unknown (None) until ID lists or --num-classes give it; then fixed: another
    number of ID classes is refused."""
    grid = _record("a", [(0, 0), (0, 6)])
    unknown = merge_info(None, "a", grid, num_classes=None, num_classes_from=None)
    assert unknown["num_classes"] is None and folder_classes(unknown) is None
    ids = {"train": {"data_dir": "imagenet1k/", "imglist_path": "t"}}
    four = merge_info(unknown, "", None, num_classes=4, num_classes_from="ID lists", id_lists=ids)
    assert (four["num_classes"], four["num_classes_from"], folder_classes(four)) == (4, "ID lists", 4)
    assert merge_info(four, "b", _record("b", [(1, 1)]), num_classes=None, num_classes_from=None)["num_classes"] == 4
    with pytest.raises(BadInputError, match="the 10 ID classes of these ID lists differs from the 4"):
        merge_info(four, "", None, num_classes=10, num_classes_from="ID lists", id_lists=ids)
    with pytest.raises(BadInputError, match="--num-classes 10 differs from the 4"):
        merge_info(four, "", None, num_classes=10)
    given = merge_info(unknown, "", None, num_classes=1000)  # --num-classes on a folder of OOD exports only
    assert (given["num_classes"], given["num_classes_from"], folder_classes(given)) == (1000, "--num-classes", 1000)
