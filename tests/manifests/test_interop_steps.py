"""The pure steps of the interop stage, on lines and frames (no files)."""

from pathlib import Path

import pandas as pd
import pytest

from isood.errors import BadInputError
from isood.stages.interop import (
    CellList,
    ExportPlan,
    ListEntry,
    ListFormatError,
    cell_datasets,
    cell_list_texts,
    cell_of_list,
    data_info,
    image_list_table,
    imglist_lines,
    na_flags,
    near_far,
    ood_dataset_config,
    parse_lines,
    release_cells,
    release_edges,
    release_images,
)
from manifests import Manifest


def _cl(source, cov, sem):
    rel = "/".join(x for x in (source, f"cov_{cov}_sem_{sem}.txt") if x)
    return CellList(source, cov, sem, rel, Path("/nowhere") / rel)


def test_parse_lines_by_label_mode():
    lines = [b"# header", b"", b"a/1.jpg", "b/2.jpg 7", b"  c/3.jpg   -1  "]
    assert parse_lines(lines, labels="optional", name="l") == [
        ListEntry("a/1.jpg", -1, 3), ListEntry("b/2.jpg", 7, 4), ListEntry("c/3.jpg", -1, 5)]
    assert parse_lines(["x/1.jpg 3"], labels="required") == [("x/1.jpg", 3, 1)]
    assert parse_lines(["x\\1.jpg"], labels="none") == [("x/1.jpg", -1, 1)]  # Windows separators normalised
    for lines, labels, bad_line in ((["a.jpg", "b.jpg 1"], "none", 2), (["a.jpg 1", "b.jpg"], "required", 2),
                                    (["a.jpg x"], "optional", 1), (["a.jpg 1 2"], "optional", 1),
                                    (["ok.jpg", "../up.jpg"], "optional", 2), (["/abs.jpg"], "none", 1),
                                    ([b"ok.jpg", b"\xff.jpg"], "none", 2)):
        with pytest.raises(ListFormatError, match=rf"^l:{bad_line}: "):
            parse_lines(lines, labels=labels, name="l")
    with pytest.raises(BadInputError, match="labels='sometimes'"):
        parse_lines([], labels="sometimes")


@pytest.mark.parametrize("rel,expected", [
    ("cov_0_sem_1.txt", ("", 0, 1)),
    ("in21k-val/test_cov_2_sem_5.txt", ("in21k-val", 2, 5)),
    ("a/b/cov_7_sem_7.txt", ("a/b", 7, 7)),
    ("README.txt", None),
    ("cov_1_sem_1.csv", None),
])
def test_cell_of_list(rel, expected):
    assert cell_of_list(rel, n_levels=8) == expected


def test_cell_of_list_outside_the_grid_names_the_levels_to_pass():
    with pytest.raises(BadInputError, match=r"a/cov_8_sem_0.txt: .*--levels 9"):
        cell_of_list("a/cov_8_sem_0.txt", n_levels=8)
    assert cell_of_list("a/cov_8_sem_0.txt", n_levels=9) == ("a", 8, 0)


def test_release_images_levels_wnids_and_duplicates():
    lists = [(_cl("s", 2, 5), [ListEntry("n01440764/x.JPEG", -1, 1), ListEntry("syn/a.png", 3, 2)]),
             (_cl("t", 0, 0), [ListEntry("n01440764/x.JPEG", -1, 1)])]  # same path, other source: fine
    images = release_images(lists)
    assert list(images.columns) == ["path", "wnid", "d_sem", "d_cov", "sem_level", "cov_level", "cell", "source",
                                    "label"]
    assert images["cell"].tolist() == ["cov_2_sem_5", "cov_2_sem_5", "cov_0_sem_0"]
    assert images["wnid"].fillna("-").tolist() == ["n01440764", "-", "n01440764"]  # syn/a.png names no class
    assert images["label"].tolist() == [-1, 3, -1] and images["d_sem"].isna().all()
    dup = [(_cl("s", 0, 0), [ListEntry("a.jpg", -1, 4)]), (_cl("s", 1, 0), [ListEntry("a.jpg", -1, 9)])]
    with pytest.raises(ListFormatError, match=r"^s/cov_1_sem_0.txt:9: 'a.jpg' is already listed at s/cov_0_sem_0.txt:4"):
        release_images(dup)


def test_release_cells_count_per_source():
    lists = [(_cl("a", 1, 2), [ListEntry(f"x{i}", -1, i) for i in range(12)]),
             (_cl("b", 1, 2), [ListEntry(f"x{i}", -1, i) for i in range(3)])]
    cells = release_cells(release_images(lists), ["a", "b"], n_levels=4, na_threshold=10)
    assert len(cells) == 2 * 16 and cells["n"].sum() == 15
    got = cells.set_index(["source", "cell"])
    assert got.loc[("a", "cov_1_sem_2"), "n"] == 12 and not got.loc[("a", "cov_1_sem_2"), "na"]
    assert got.loc[("b", "cov_1_sem_2"), "n"] == 3 and got.loc[("b", "cov_1_sem_2"), "na"]
    assert got.loc[("a", "cov_0_sem_0"), "na"]  # empty cells are N/A too


def test_release_edges_are_unknown_bounds_per_level():
    edges = release_edges(3)
    assert edges["axis"].tolist() == ["sem"] * 3 + ["cov"] * 3 and edges["level"].tolist() == [0, 1, 2] * 2
    assert edges["lower"].isna().all() and edges["upper"].isna().all()


def test_cell_list_texts_per_source_and_cell():
    lists = [(_cl("", 0, 1), [ListEntry("a.jpg", -1, 1), ListEntry("b.jpg", -1, 2)]),
             (_cl("in21k-val", 0, 1), [ListEntry("c.jpg", -1, 1)])]
    assert cell_list_texts(release_images(lists)) == {"lists/cov_0_sem_1.txt": "a.jpg\nb.jpg\n",
                                                      "lists/in21k-val/cov_0_sem_1.txt": "c.jpg\n"}


def test_image_list_table():
    t = image_list_table([ListEntry("n01440764/a.JPEG", 5, 1), ListEntry("b/x.jpg", -1, 2)], name="f")
    assert t.fillna("-").to_dict("list") == {"path": ["n01440764/a.JPEG", "b/x.jpg"], "wnid": ["n01440764", "-"],
                                             "label": [5, -1]}
    with pytest.raises(ListFormatError, match=r"^f:7: 'a' is already listed at line 2"):
        image_list_table([ListEntry("a", -1, 2), ListEntry("a", -1, 7)], name="f")
    with pytest.raises(BadInputError, match="^f: "):
        image_list_table([], name="f")


def test_imglist_lines():
    images = pd.DataFrame({"path": ["a/1.jpg", "b/2.jpg"]})
    assert imglist_lines(images, where="m").tolist() == ["a/1.jpg -1\n", "b/2.jpg -1\n"]
    labelled = images.assign(label=pd.array([3, None], dtype="Int64"))
    assert imglist_lines(labelled, where="m").tolist() == ["a/1.jpg 3\n", "b/2.jpg -1\n"]
    with pytest.raises(BadInputError, match="'a b.jpg'"):
        imglist_lines(pd.DataFrame({"path": ["a b.jpg"]}), where="m")


def test_na_flags_with_and_without_source():
    cells = pd.DataFrame({"cell": ["cov_0_sem_0", "cov_0_sem_1"], "na": [True, False]})
    assert na_flags(cells) == {("", "cov_0_sem_0"): True, ("", "cov_0_sem_1"): False}
    assert na_flags(cells.assign(source=["a", None])) == {("a", "cov_0_sem_0"): True, ("", "cov_0_sem_1"): False}


def _grid_images():
    # 12 images in cov_0_sem_1 (source a), 4 in cov_3_sem_3 (source a), 2 without a level
    return pd.DataFrame({"path": [f"p{i}" for i in range(18)],
                         "cov_level": [0] * 12 + [3] * 4 + [-1, 2], "sem_level": [1] * 12 + [3] * 4 + [0, -1],
                         "source": ["a"] * 18})


def test_cell_datasets_groups_by_source_and_cell_and_skips_rows_without_level():
    images = _grid_images()
    lines = imglist_lines(images, where="m")
    plan = cell_datasets(images, lines, {}, base="benchmark_imglist/x", data_dir="img/", na_threshold=10)
    assert plan.skipped == 2 and plan.n_levels == 4  # highest level seen + 1
    assert [d["dataset"] for d in plan.datasets] == ["a_cov_0_sem_1", "a_cov_3_sem_3"]
    assert [d["na"] for d in plan.datasets] == [False, True]  # no cells table: counts vs the threshold
    assert plan.datasets[0]["data_dir"] == "img/a/" and plan.datasets[0]["n"] == 12
    text = plan.files["benchmark_imglist/x/a/test_cov_0_sem_1.txt"]
    assert text == "".join(f"p{i} -1\n" for i in range(12))
    flagged = cell_datasets(images, lines, {("a", "cov_0_sem_1"): True, ("", "cov_3_sem_3"): False},
                            base="b", data_dir="", na_threshold=10)
    assert [d["na"] for d in flagged.datasets] == [True, False]  # the cells table decides


def test_near_far_split_by_semantic_level():
    ds = [{"dataset": n, "sem_level": s, "na": na} for n, s, na in
          (("low", 1, False), ("high", 5, False), ("mid", 4, False), ("gone", 0, True))]
    near, far = near_far(ds, 8)
    assert [d["dataset"] for d in near] == ["low"] and [d["dataset"] for d in far] == ["high", "mid"]
    near, far = near_far(ds[:1], 8)  # no far cell: both groups get every usable dataset
    assert near == far == ds[:1]
    single = [{"dataset": "all", "sem_level": None, "na": False}]
    assert near_far(single, 1) == (single, single)


def test_data_info_and_ood_dataset_config():
    plan = ExportPlan(files={}, datasets=[
        {"dataset": "cov_0_sem_1", "sem_level": 1, "na": False, "data_dir": "img/", "imglist_path": "bl/x/t1.txt"},
        {"dataset": "cov_0_sem_6", "sem_level": 6, "na": False, "data_dir": "img/", "imglist_path": "bl/x/t6.txt"},
    ], n_levels=8)
    m = Manifest(root=Path("/m"), meta={"kind": "splits", "dataset_version": "1.2.0", "content_sha256": "ab"})
    info = data_info(plan, name="x", num_classes=10, manifest=m)
    assert info["ood"]["near"] == {"datasets": ["cov_0_sem_1"],
                                   "cov_0_sem_1": {"data_dir": "img/", "imglist_path": "bl/x/t1.txt"}}
    assert info["ood"]["far"]["datasets"] == ["cov_0_sem_6"] and info["num_classes"] == 10
    assert info["manifest"] == {"path": "/m", "kind": "splits", "dataset_version": "1.2.0", "content_sha256": "ab"}
    cfg = ood_dataset_config(plan, name="x", num_classes=10, data_root="./data/")["ood_dataset"]
    assert cfg["name"] == "x_ood" and cfg["split_names"] == ["nearood", "farood"]
    assert cfg["farood"]["cov_0_sem_6"] == {"data_dir": "./data/img/", "imglist_pth": "./data/bl/x/t6.txt"}
    assert cfg["nearood"]["datasets"] == ["cov_0_sem_1"]
