"""The pure steps of the interop stage, on lines, arrays and frames (no files but where a step reads one)."""

import random
import re
from pathlib import Path

import pandas as pd
import pyarrow as pa
import pytest

from isood.core.errors import BadInputError
from isood.stages.interop import (
    CellList,
    ListEntry,
    ListFormatError,
    cell_datasets,
    cell_of_list,
    check_subsets,
    export_lines,
    image_list_table,
    list_order,
    missing_lists,
    na_flags,
    parse_lines,
    release_cells,
    release_edges,
    release_list_names,
)
from isood.stages.interop.lines import OddLines, WnidLookup, parse_line_array, path_hashes
from isood.stages.interop.openood import cell_keys
from wordnet_tools.wnids import wnid_from_path


def _cl(subset, cov, sem):
    rel = "/".join(x for x in (subset, f"cov_{cov}_sem_{sem}.txt") if x)
    return CellList(subset, cov, sem, rel, Path("/nowhere") / rel)


def test_parse_lines_by_label_mode():
    lines = [b"# header", b"", b"a/1.jpg", "b/2.jpg 7", b"  c/3.jpg   -1  "]
    assert parse_lines(lines, labels="optional", name="l") == [
        ListEntry("a/1.jpg", -1, 3), ListEntry("b/2.jpg", 7, 4), ListEntry("c/3.jpg", -1, 5)]
    assert parse_lines(["x/1.jpg 3"], labels="required") == [("x/1.jpg", 3, 1)]
    assert parse_lines(["x\\1.jpg"], labels="none") == [("x/1.jpg", -1, 1)]  # Windows separators normalised
    assert parse_lines(["./x/1.jpg"], labels="none", verbatim=True) == [("./x/1.jpg", -1, 1)]  # kept as listed
    for lines, labels, bad_line in ((["a.jpg", "b.jpg 1"], "none", 2), (["a.jpg 1", "b.jpg"], "required", 2),
                                    (["a.jpg x"], "optional", 1), (["a.jpg 1 2"], "optional", 1),
                                    (["ok.jpg", "../up.jpg"], "optional", 2), (["/abs.jpg"], "none", 1),
                                    ([b"ok.jpg", b"\xff.jpg"], "none", 2), (["a.jpg 99999999999999999999"], "optional", 1)):
        with pytest.raises(ListFormatError, match=rf"^l:{bad_line}: "):
            parse_lines(lines, labels=labels, name="l")
    with pytest.raises(BadInputError, match="labels='sometimes'"):
        parse_lines([], labels="sometimes")


def _random_line(rng):
    atoms = ["a", "n01234567", "n0123456", "x.jpg", "n07654321_12.JPEG", "..", ".", "./", "/", "\\", " ", "\t",
             "#", "c:", "7", "-3", "+4", "é", "\x1c", "  ", "_"]
    return "".join(rng.choice(atoms) for _ in range(rng.randint(0, 6)))


def test_parse_line_array_matches_the_exact_parser_or_hands_over():
    """The vectorised parse gives parse_lines(verbatim)'s entries, or raises OddLines where parse_lines would
    raise or reads a line differently (the caller then uses parse_lines itself)."""
    rng = random.Random(0)
    agreed = handed_over = 0
    for _ in range(400):
        lines = [_random_line(rng) for _ in range(rng.randint(1, 4))]
        try:
            expected = [(e.path, e.label) for e in parse_lines(lines, labels="optional", verbatim=True)]
        except ListFormatError:
            expected = None
        try:
            got = parse_line_array(pa.array(lines, pa.string()))
        except OddLines:
            handed_over += 1
            continue
        assert expected is not None, lines  # never accepts what the exact parser refuses
        assert list(zip(got["path"].to_pylist(), got["label"].to_pylist())) == expected, lines
        agreed += 1
    assert agreed > 50 and handed_over > 50
    plain = pa.array(["./imagenet21k_val/n00007846/n00007846_105689.JPEG", "# c", "  a/b.jpg 3 ", "c.jpg\t-1"])
    got = parse_line_array(plain)
    assert got["path"].to_pylist() == ["./imagenet21k_val/n00007846/n00007846_105689.JPEG", "a/b.jpg", "c.jpg"]
    assert got["label"].to_pylist() == [-1, 3, -1]


def test_wnid_lookup_is_wnid_from_path():
    rng = random.Random(1)
    parts = ["n01440764", "n0144076", "n01440764_3.JPEG", "x", "n02084071_x", "a.jpg", "n09999999", "", "sub"]
    paths = ["/".join(rng.choice(parts) for _ in range(rng.randint(1, 4))) or "x" for _ in range(500)]
    paths += ["a\\n01440764\\x.jpg", "./imagenet21k_train/n00005787/n00005787_12538.JPEG", "n01440764/",
              "n01440764_", "n0144076412"]
    lookup = WnidLookup()
    assert lookup(pa.array(paths)).to_pylist() == [wnid_from_path(p) for p in paths]
    again = lookup(pa.array(paths[::-1]))  # answers remembered across calls stay right
    assert again.to_pylist() == [wnid_from_path(p) for p in paths[::-1]]


def test_path_hashes_equal_for_equal_paths_ignoring_a_leading_dot_slash():
    a = path_hashes(pa.array(["./x/1.jpg", "./x/2.jpg", "./././x/3.jpg"]))
    b = path_hashes(pa.array(["x/1.jpg", "x/2.jpg", "x/3.jpg", "y/1.jpg"]))
    assert list(a) == list(b[:3]) and len(set(b)) == 4


@pytest.mark.parametrize("rel,expected", [
    ("cov_0_sem_1.txt", ("", 0, 1)),
    ("val/test_cov_2_sem_5.txt", ("val", 2, 5)),
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


def test_missing_lists_per_subset():
    found = [_cl(s, c, l) for s in ("train", "val") for c in range(2) for l in range(2)]
    assert missing_lists(found, n_levels=2) == {}
    found = [cl for cl in found if (cl.subset, cl.cov, cl.sem) != ("val", 1, 0)]
    assert missing_lists(found, n_levels=2) == {"val": [(1, 0)]}
    assert missing_lists(found[:1], n_levels=2) == {"train": [(0, 1), (1, 0), (1, 1)]}


def test_check_subsets_pools_only_side_by_side_folders():
    check_subsets(["train", "val"], "pooled")
    check_subsets(["imagenet21k/train", "imagenet21k/val"], "pooled")
    check_subsets([""], "pooled")
    for subsets in (["SynIS", "imagenet21k/train"], ["", "train"]):
        with pytest.raises(BadInputError, match="side by side"):
            check_subsets(subsets, "pooled")
        check_subsets(subsets, "per-subset")
    with pytest.raises(BadInputError, match="--na-rule 'both'"):
        check_subsets(["a"], "both")


def test_list_order_pooled_is_cell_then_subset():
    found = [_cl(s, c, l) for s in ("train", "val") for c, l in ((0, 1), (0, 0))]
    assert [(cl.cov, cl.sem, cl.subset) for cl in list_order(found, na_rule="pooled")] == [
        (0, 0, "train"), (0, 0, "val"), (0, 1, "train"), (0, 1, "val")]
    assert [(cl.subset, cl.cov, cl.sem) for cl in list_order(found, na_rule="per-subset")] == [
        ("train", 0, 0), ("train", 0, 1), ("val", 0, 0), ("val", 0, 1)]


def test_release_cells_pooled_and_per_subset():
    counts = {("train", 1, 2): 6, ("val", 1, 2): 5, ("train", 0, 0): 12, ("val", 3, 3): 3}
    pooled = release_cells(counts, ["train", "val"], n_levels=4, na_threshold=10, na_rule="pooled",
                           missing={"val": [(0, 0)]})
    assert len(pooled) == 16 and "source" not in pooled.columns
    got = pooled.set_index("cell")
    assert got.loc["cov_1_sem_2", "n"] == 11 and not got.loc["cov_1_sem_2", "na"]  # 6 + 5 >= 10: usable
    assert got.loc["cov_3_sem_3", "na"] and got.loc["cov_2_sem_2", "na"]  # 3 and 0
    assert got.loc["cov_0_sem_0", "missing"] and got.loc["cov_0_sem_0", "missing_in"] == "val"
    assert got.loc["cov_0_sem_0", "n"] == 12 and not got.loc["cov_0_sem_0", "na"]
    assert not got.loc["cov_2_sem_2", "missing"]  # empty is not missing
    per = release_cells(counts, ["train", "val"], n_levels=4, na_threshold=10, na_rule="per-subset",
                        missing={"val": [(0, 0)]}).set_index(["source", "cell"])
    assert len(per) == 32 and per.loc[("train", "cov_1_sem_2"), "na"] and per.loc[("val", "cov_1_sem_2"), "na"]
    assert per.loc[("val", "cov_0_sem_0"), "missing"] and not per.loc[("train", "cov_0_sem_0"), "missing"]


def test_release_edges_are_unknown_bounds_per_level():
    edges = release_edges(3)
    assert edges["axis"].tolist() == ["sem"] * 3 + ["cov"] * 3 and edges["level"].tolist() == [0, 1, 2] * 2
    assert edges["lower"].isna().all() and edges["upper"].isna().all()


def test_image_list_table():
    t = image_list_table([ListEntry("n01440764/a.JPEG", 5, 1), ListEntry("b/x.jpg", -1, 2)], name="f")
    assert t.fillna("-").to_dict("list") == {"path": ["n01440764/a.JPEG", "b/x.jpg"], "wnid": ["n01440764", "-"],
                                             "label": [5, -1]}
    with pytest.raises(ListFormatError, match=r"^f:7: 'a' is already listed at line 2"):
        image_list_table([ListEntry("a", -1, 2), ListEntry("a", -1, 7)], name="f")
    with pytest.raises(BadInputError, match="^f: "):
        image_list_table([], name="f")


def test_export_lines():
    batch = pa.table({"path": ["./a/1.jpg", "b/2.jpg"]})
    openood, release = export_lines(batch, where="m")
    assert openood.to_pylist() == ["./a/1.jpg -1", "b/2.jpg -1"] and release.to_pylist() == ["./a/1.jpg", "b/2.jpg"]
    labelled = batch.append_column("label", pa.array([3, None], pa.int64()))
    openood, release = export_lines(labelled, where="m")
    assert openood.to_pylist() == ["./a/1.jpg 3", "b/2.jpg -1"] and release.to_pylist() == ["./a/1.jpg 3", "b/2.jpg"]
    for bad in ("a b.jpg", "a\tb.jpg", "a\u00a0b.jpg"):
        with pytest.raises(BadInputError, match=re.escape(repr(bad))):
            export_lines(pa.table({"path": ["ok.jpg", bad]}), where="m")  # the message names the path
    assert export_lines(pa.table({"path": ["é.jpg"]}), where="m")[1].to_pylist() == ["é.jpg"]


def test_cell_keys_group_rows_by_column_and_cell():
    batch = pa.table({"cov_level": [0, 2, 0, 2], "sem_level": [1, 5, 1, 5], "subset": ["t", "t", "v", None]})
    codes, keys = cell_keys(batch, "subset", 8)
    assert [keys[int(c)] for c in codes] == [("t", 0, 1), ("t", 2, 5), ("v", 0, 1), ("", 2, 5)]
    codes, keys = cell_keys(batch, None, 8)
    assert [keys[int(c)] for c in codes] == [("", 0, 1), ("", 2, 5), ("", 0, 1), ("", 2, 5)]


def test_na_flags_with_and_without_source():
    cells = pd.DataFrame({"cell": ["cov_0_sem_0", "cov_0_sem_1"], "na": [True, False]})
    assert na_flags(cells) == {("", "cov_0_sem_0"): True, ("", "cov_0_sem_1"): False}
    assert na_flags(cells.assign(source=["a", None])) == {("a", "cov_0_sem_0"): True, ("", "cov_0_sem_1"): False}


def test_cell_datasets_one_root_and_na_from_the_cells_table():
    counts = {("", 0, 1): 12, ("", 3, 3): 4}
    ds = cell_datasets(counts, {}, base="benchmark_imglist/x", data_dir="img/", na_threshold=10)
    assert [d["dataset"] for d in ds] == ["cov_0_sem_1", "cov_3_sem_3"] and [d["na"] for d in ds] == [False, True]
    assert {d["data_dir"] for d in ds} == {"img/"} and ds[0]["imglist_path"] == "benchmark_imglist/x/test_cov_0_sem_1.txt"
    flagged = cell_datasets(counts, {("", "cov_0_sem_1"): True, ("", "cov_3_sem_3"): False}, base="b", data_dir="")
    assert [d["na"] for d in flagged] == [True, False]  # the cells table decides
    per = cell_datasets({("val", 0, 1): 3}, {("val", "cov_0_sem_1"): False}, base="b", data_dir="d/")
    assert per[0]["dataset"] == "val_cov_0_sem_1" and per[0]["data_dir"] == "d/" and not per[0]["na"]


def test_release_list_names_every_cell_but_the_missing():
    names = release_list_names(["train", "val"], 2, base="imglist/r", missing={"val": ["cov_1_sem_0"]})
    assert len(names) == 7 and "imglist/r/val/cov_1_sem_0.txt" not in names
    assert names[0] == "imglist/r/train/cov_0_sem_0.txt"
    assert release_list_names([""], 1, base="imglist/s") == ["imglist/s/cov_0_sem_0.txt"]
