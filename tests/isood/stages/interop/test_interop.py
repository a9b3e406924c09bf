import json
import re

import pandas as pd
import pytest
import yaml
from typer.testing import CliRunner

import manifests
from isood.cli import app
from isood.stages.interop import (
    EXPORT_INFO,
    EXPORT_YAML,
    ListFormatError,
    export_openood,
    import_imagenet_ood,
    import_isood_lists,
    import_openood_imglist,
    parse_list,
)

def test_import_isood_lists_per_subset_reads_levels_subsets_and_cells(tmp_path, worlds, load):
    m = import_isood_lists(worlds.write_release(tmp_path / "rel"), tmp_path / "m", na_rule="per-subset",
                           allow_missing=True)
    assert m.kind == "splits" and manifests.verify(m.root).ok
    images = m.frame("images")
    assert len(images) == sum(sum(c.values()) for c in worlds.RELEASE.values())
    assert images["d_sem"].isna().all() and images["d_cov"].isna().all()
    assert (images["subset"] == images["source"]).all()  # per-subset: each subset folder is its own split
    val = images[images["subset"] == "in21k-val"]
    assert sorted(set(zip(val["cov_level"], val["sem_level"]))) == [(2, 5), (4, 4)]
    assert (val[val["cov_level"] == 2]["wnid"] == "n09100025").all()
    assert images[images["subset"] == "syn-is"]["wnid"].isna().all()
    assert (images["label"] == -1).all()
    cells = m.frame("cells").set_index(["source", "cell"])
    assert len(cells) == 3 * 64
    assert cells.loc[("in21k-train", "cov_2_sem_5"), "n"] == 11 and not cells.loc[("in21k-train", "cov_2_sem_5"), "na"]
    assert cells.loc[("in21k-train", "cov_7_sem_1"), "na"] and cells.loc[("in21k-val", "cov_0_sem_0"), "n"] == 0
    assert cells.loc[("in21k-val", "cov_0_sem_0"), "missing"] and not cells.loc[("in21k-val", "cov_2_sem_5"), "missing"]
    assert m.meta["summary"]["ignored_files"] == ["README.txt"]
    assert m.meta["command"]["config"]["na_rule"] == "per-subset"
    assert (m.root / "lists/in21k-val/cov_2_sem_5.txt").read_text().count("\n") == 10
    # datasets: one split per subset; a cell N/A in every subset has a config without rows
    cell = load(m.root, "cov_2_sem_5")
    assert sorted(cell) == ["in21k_train", "in21k_val"]
    assert cell["in21k_val"].num_rows == 10 and cell["in21k_train"].num_rows == 11
    assert load(m.root, "cov_1_sem_6")["syn_is"].num_rows == 14
    with pytest.raises(ValueError, match="corresponds to no data"):
        load(m.root, "cov_7_sem_1")


def test_per_subset_round_trip_through_the_export_is_identical(tmp_path, worlds):
    first = import_isood_lists(worlds.write_release(tmp_path / "rel"), tmp_path / "m1", na_rule="per-subset",
                               allow_missing=True)
    out = tmp_path / "openood"
    r = export_openood(first.root, out)
    assert r.rows == len(first.frame("images")) and r.skipped == 0
    second = import_isood_lists(out / "imglist" / "rel", tmp_path / "m2", na_rule="per-subset", allow_missing=True)
    for t in ("images", "cells", "edges"):
        pd.testing.assert_frame_equal(first.frame(t), second.frame(t))
    assert first.meta["content_sha256"] == second.meta["content_sha256"]
    out2 = tmp_path / "openood2"
    export_openood(second.root, out2, name="rel")
    for f in out.rglob("*.txt"):
        assert f.read_bytes() == (out2 / f.relative_to(out)).read_bytes()


def test_export_writes_openood_imglists_and_configs(tmp_path, worlds):
    m = import_isood_lists(worlds.write_release(tmp_path / "rel"), tmp_path / "m", na_rule="per-subset",
                           allow_missing=True)
    out = tmp_path / "openood"
    r = export_openood(m.root, out, data_dir="images/", name="isood")
    lines = (out / "benchmark_imglist/isood/in21k-val/test_cov_2_sem_5.txt").read_text().splitlines()
    assert len(lines) == 10 and lines[0] == "n09100025/n09100025_0.JPEG -1"
    # every non-empty (subset, cell) has a list; only non-N/A ones are registered for OpenOOD
    assert len(r.imglists) == 6
    assert sorted(r.registered) == ["isood_in21k_train_cov_0_sem_0", "isood_in21k_train_cov_2_sem_5",
                                    "isood_in21k_val_cov_2_sem_5", "isood_syn_is_cov_1_sem_6"]
    info = json.loads((out / EXPORT_INFO).read_text())
    near, far = info["data_info"]["ood"]["near"], info["data_info"]["ood"]["far"]
    assert near["datasets"] == ["isood_in21k_train_cov_0_sem_0"]  # semantic level < 4 of 8
    assert sorted(far["datasets"]) == ["isood_in21k_train_cov_2_sem_5", "isood_in21k_val_cov_2_sem_5",
                                       "isood_syn_is_cov_1_sem_6"]
    entry = far["isood_in21k_val_cov_2_sem_5"]
    assert entry == {"data_dir": "images/",  # one image root: the listed paths are relative to it
                     "imglist_path": "benchmark_imglist/isood/in21k-val/test_cov_2_sem_5.txt"}
    assert (out / entry["imglist_path"]).is_file()
    cfg = yaml.safe_load((out / EXPORT_YAML).read_text())["ood_dataset"]
    assert cfg["dataset_class"] == "ImglistDataset" and cfg["split_names"] == ["nearood", "farood"]
    assert cfg["farood"]["isood_syn_is_cov_1_sem_6"]["imglist_pth"] == (
        "./data/benchmark_imglist/isood/syn-is/test_cov_1_sem_6.txt")
    # OpenOOD's ImglistDataset parsing: split at the first space, int label
    for f in (out / "benchmark_imglist").rglob("*.txt"):
        for line in f.read_text().splitlines():
            name, extra = line.split(" ", 1)
            assert not name.startswith("/") and int(extra) == -1
    # the release-format lists: bare paths (OOD label -1), every listed cell of each subset, none the release lacked
    assert (out / "imglist/isood/in21k-val/cov_2_sem_5.txt").read_text() == (
        "".join(f"n09100025/n09100025_{i}.JPEG\n" for i in range(10)))
    assert sorted(p.name for p in (out / "imglist/isood/in21k-val").iterdir()) == ["cov_2_sem_5.txt", "cov_4_sem_4.txt"]


def test_export_of_a_pipeline_splits_manifest_skips_rows_without_level(tmp_path, worlds):
    m = worlds.write_splits(tmp_path / "s")
    r = export_openood(m.root, tmp_path / "o")
    assert r.skipped == worlds.NO_LEVEL_ROWS
    assert sorted(r.registered) == ["s_cov_0_sem_0", "s_cov_2_sem_5", "s_cov_7_sem_7"]  # named after its folder
    assert len(r.imglists) == len(worlds.PLANTED_CELLS)
    text = (tmp_path / "o/benchmark_imglist/s/test_cov_2_sem_5.txt").read_text()
    assert text.count("\n") == 12 and "n09000025/n09000025_0.JPEG -1\n" in text


def test_image_list_round_trips(tmp_path):
    f = tmp_path / "imagenet_ood.txt"
    f.write_text("n01234567/n01234567_1.JPEG\nfoo/n07654321_9.JPEG\n\nbar/x.jpg\n")
    a = import_imagenet_ood(f, tmp_path / "a")
    imgs = a.frame("images")
    assert imgs["path"].tolist() == ["n01234567/n01234567_1.JPEG", "foo/n07654321_9.JPEG", "bar/x.jpg"]
    assert imgs["wnid"].tolist()[:2] == ["n01234567", "n07654321"] and pd.isna(imgs["wnid"][2])
    assert (imgs["label"] == -1).all()
    export_openood(a.root, tmp_path / "ea")
    exported = tmp_path / "ea/benchmark_imglist/a/test_a.txt"
    assert exported.read_text().splitlines()[1] == "foo/n07654321_9.JPEG -1"
    b = import_openood_imglist(exported, tmp_path / "b")
    pd.testing.assert_frame_equal(a.frame("images"), b.frame("images"))
    assert a.meta["content_sha256"] == b.meta["content_sha256"]

    g = tmp_path / "imglist.txt"
    g.write_text("imagenet_1k/val/ILSVRC2012_val_00000001.JPEG 65\nimagenet_1k/val/ILSVRC2012_val_00000002.JPEG 970\n")
    c = import_openood_imglist(g, tmp_path / "c")
    assert c.frame("images")["label"].tolist() == [65, 970]
    export_openood(c.root, tmp_path / "ec", name="val")
    out_file = tmp_path / "ec/benchmark_imglist/val/test_val.txt"
    assert out_file.read_text() == g.read_text()
    d = import_openood_imglist(out_file, tmp_path / "d")
    pd.testing.assert_frame_equal(c.frame("images"), d.frame("images"))


@pytest.mark.parametrize("fmt,content,line,what", [
    ("isood", "a/1.jpg\na/2.jpg 3 4\n", 2, "expected '<path>' or '<path> <integer label>'"),
    ("isood", "a/1.jpg\n\n/abs/2.jpg\n", 3, "absolute"),
    ("isood", "a/../../x.jpg\n", 1, "'..'"),
    ("openood", "a/1.jpg 1\na/2.jpg\n", 2, "'<path> <integer label>'"),
    ("openood", "a/1.jpg 1\na/2.jpg cat\n", 2, "'<path> <integer label>'"),
    ("imagenet-ood", "a/1.jpg\n# comment\na/2.jpg -1\n", 3, "one relative image path"),
])
def test_malformed_lines_name_file_and_line(tmp_path, fmt, content, line, what):
    if fmt == "isood":
        f = tmp_path / "rel/in21k-val/cov_0_sem_1.txt"
        f.parent.mkdir(parents=True)
        f.write_text(content)
        run = lambda: import_isood_lists(tmp_path / "rel", tmp_path / "m", allow_missing=True)  # noqa: E731
        name = "in21k-val/cov_0_sem_1.txt"
        cli = ["import", "isood-lists", str(tmp_path / "rel"), "--out", str(tmp_path / "m"), "--allow-missing"]
    else:
        f = tmp_path / "list.txt"
        f.write_text(content)
        run = {"openood": lambda: import_openood_imglist(f, tmp_path / "m"),
               "imagenet-ood": lambda: import_imagenet_ood(f, tmp_path / "m")}[fmt]
        name = str(f)
        cli = ["import", {"openood": "openood-imglist", "imagenet-ood": "imagenet-ood"}[fmt], str(f),
               "--out", str(tmp_path / "m")]
    with pytest.raises(ListFormatError) as info:
        run()
    assert str(info.value).startswith(f"{name}:{line}: ") and what in str(info.value)
    result = CliRunner().invoke(app, cli)
    assert result.exit_code == 2 and f"{name}:{line}:" in result.output
    assert "Traceback" not in result.output
    assert not (tmp_path / "m" / "manifest.json").exists()


def test_release_problems_are_named(tmp_path):
    rel = tmp_path / "rel"
    (rel / "a").mkdir(parents=True)
    (rel / "a/cov_8_sem_0.txt").write_text("x/1.jpg\n")
    with pytest.raises(Exception, match=r"a/cov_8_sem_0.txt: cell cov_8_sem_0 is outside the 8x8 grid; pass --levels 9"):
        import_isood_lists(rel, tmp_path / "m", allow_missing=True)
    m = import_isood_lists(rel, tmp_path / "m9", n_levels=9, allow_missing=True)
    assert len(m.frame("cells")) == 81
    (rel / "a/cov_8_sem_0.txt").unlink()
    (rel / "a/cov_0_sem_0.txt").write_text("x/1.jpg\nx/2.jpg\n")
    (rel / "a/cov_1_sem_0.txt").write_text("x/3.jpg\n./x/1.jpg\n")  # the same image, listed with './'
    with pytest.raises(ListFormatError, match=r"a/cov_1_sem_0.txt:2: './x/1.jpg' is already listed at a/cov_0_sem_0.txt:1"):
        import_isood_lists(rel, tmp_path / "m2", allow_missing=True)
    (rel / "b").mkdir()
    (rel / "b/cov_1_sem_0.txt").write_text("x/1.jpg\n")  # another subset may list it
    (rel / "a/cov_1_sem_0.txt").write_text("x/3.jpg\n")
    assert len(import_isood_lists(rel, tmp_path / "m2", allow_missing=True).frame("images")) == 4
    with pytest.raises(Exception, match="no cov_"):
        import_isood_lists(tmp_path / "m9" / "data", tmp_path / "m3")
    (rel / "c").mkdir()
    (rel / "c/cov_0_sem_0.txt").write_text("")
    with pytest.raises(Exception, match=r"--na-rule 'sometimes'"):
        import_isood_lists(rel, tmp_path / "m4", allow_missing=True, na_rule="sometimes")
    (rel / "cov_0_sem_0.txt").write_text("")  # lists at the top and in sub-folders: two benchmarks
    with pytest.raises(Exception, match=r"not side by side.*--na-rule per-subset"):
        import_isood_lists(rel, tmp_path / "m4", allow_missing=True)


def test_cli_import_and_export(tmp_path, worlds):
    rel = worlds.write_release(tmp_path / "rel")
    runner = CliRunner()
    res = runner.invoke(app, ["import", "isood-lists", str(rel), "--out", str(tmp_path / "m"), "--na-rule",
                              "per-subset", "--allow-missing"])
    assert res.exit_code == 0, res.output
    m = manifests.read(tmp_path / "m", kind="splits")
    assert m.dataset_version == "1.0.0" and len(m.images) == 52 and "52" in res.stdout.split()
    assert m.na_rule == "per-subset" and m.subsets == ["in21k-train", "in21k-val", "syn-is"]
    res = runner.invoke(app, ["export", "openood", str(tmp_path / "m"), "--out", str(tmp_path / "o")])
    assert res.exit_code == 0, res.output
    info = json.loads((tmp_path / "o" / EXPORT_INFO).read_text())
    datasets = info["benchmarks"]["rel"]["datasets"]
    assert len(datasets) == 6 and sum(not d["na"] for d in datasets) == 4
    assert [int(n) for n in re.findall(r"\d+", res.stdout)[:4]] == [6, 4, 2, 52]  # imglists, registered, N/A, rows
    assert list(info["benchmarks"]) == ["rel"] and (tmp_path / "o/imglist/rel/in21k-val/cov_2_sem_5.txt").is_file()
    # re-export into the same folder replaces the earlier export; a foreign non-empty folder is refused
    assert runner.invoke(app, ["export", "openood", str(tmp_path / "m"), "--out", str(tmp_path / "o")]).exit_code == 0
    (tmp_path / "busy").mkdir()
    (tmp_path / "busy/file").write_text("x")
    res = runner.invoke(app, ["export", "openood", str(tmp_path / "m"), "--out", str(tmp_path / "busy")])
    assert res.exit_code == 2 and "busy" in res.output and not (tmp_path / "busy" / EXPORT_INFO).exists()


def test_parse_list_reads_crlf_and_names_bad_bytes(tmp_path):
    f = tmp_path / "l.txt"
    f.write_bytes(b"a.jpg 3\r\nb.jpg\r\n")
    assert parse_list(f) == [("a.jpg", 3, 1), ("b.jpg", -1, 2)]
    f.write_bytes(b"a.jpg\n\xff\xfe.jpg\n")
    with pytest.raises(ListFormatError, match=r"l.txt:2: not UTF-8"):
        parse_list(f)
