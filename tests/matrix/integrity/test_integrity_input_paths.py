"""One input-path policy for every reader of lists and folders (``isood.core.inputs``): entries relative and inside
their root, no control character (NUL, newline), symlinked folders followed only inside the root (and said),
hidden folders never subsets. Rows:

* `import isood-lists` skipped a symlinked subset folder, took a hidden `.real_val` as a subset, and read a list
  symlinked to a system file outside the folder;
* a newline in an image file name reached the `lists/*.txt` of a manifest (one more line than images) and
  `verify` said OK; NUL bytes in imported paths passed;
* `evaluate --id-test` lists could name `../` and absolute files while the importers refuse such paths.

Every input is made here with the stages' own writers.
"""

from __future__ import annotations

import os
import warnings
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from PIL import Image

import manifests
from isood.core.errors import BadInputError, IsoodWarning

W = "n01440764"


def _png(path: Path, value: int = 90) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    Image.fromarray(np.full((8, 8, 3), value, np.uint8)).save(path)


def _release(root: Path) -> None:
    """A 1 x 1 release: train/ holds one list of 4 images, the hidden .real_val/ one of 4 others, and val is a
    symlink to .real_val (a subset folder linked inside the release)."""
    (root / "train").mkdir(parents=True)
    (root / ".real_val").mkdir()
    (root / "train" / "cov_0_sem_0.txt").write_text("".join(f"./train/{W}/{W}_{i}.JPEG\n" for i in range(4)))
    (root / ".real_val" / "cov_0_sem_0.txt").write_text("".join(f"./val/{W}/{W}_{i}.JPEG\n" for i in range(4)))
    os.symlink(".real_val", root / "val")


# ============================================================================ import isood-lists: folders
def test_a_symlinked_subset_inside_the_release_is_followed_and_said_a_hidden_one_is_no_subset(cli, tmp_path):
    _release(tmp_path / "rel")
    r = cli.invoke(["import", "isood-lists", tmp_path / "rel", "--out", tmp_path / "out", "--levels", "1",
                    "--na-threshold", "1"])
    assert r.exit_code == 0, r.output
    images = manifests.read(tmp_path / "out", kind="splits").images
    assert len(images) == 8
    assert sorted(set(images["subset"])) == ["train", "val"]
    assert "val" in r.stderr and "followed" in r.stderr  # said, in one warning line
    assert len([ln for ln in r.stderr.splitlines() if "followed" in ln]) == 1


def test_a_list_linked_outside_the_release_is_refused_in_one_line(cli, tmp_path):
    (tmp_path / "rel" / "train").mkdir(parents=True)
    outside = tmp_path / "system.txt"
    outside.write_text(f"{W}/secret.JPEG\n")
    os.symlink(outside, tmp_path / "rel" / "train" / "cov_0_sem_0.txt")
    r = cli.invoke(["import", "isood-lists", tmp_path / "rel", "--out", tmp_path / "out", "--levels", "1"])
    line = cli.one_line_error(r)
    assert "cov_0_sem_0.txt" in line and "outside" in line
    assert not (tmp_path / "out").exists()


def test_a_subset_folder_linked_outside_the_release_is_refused(tmp_path):
    from isood.stages.interop.release import find_cell_lists

    (tmp_path / "elsewhere").mkdir()
    (tmp_path / "elsewhere" / "cov_0_sem_0.txt").write_text(f"{W}/a.JPEG\n")
    (tmp_path / "rel").mkdir()
    os.symlink(tmp_path / "elsewhere", tmp_path / "rel" / "val")
    with pytest.raises(BadInputError, match="outside"):
        find_cell_lists(tmp_path / "rel", n_levels=1)


def test_a_link_to_a_subset_read_anyway_is_read_once(tmp_path):
    from isood.stages.interop.release import find_cell_lists

    (tmp_path / "rel" / "train").mkdir(parents=True)
    (tmp_path / "rel" / "train" / "cov_0_sem_0.txt").write_text(f"{W}/a.JPEG\n")
    os.symlink("train", tmp_path / "rel" / "copy")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        found, _ = find_cell_lists(tmp_path / "rel", n_levels=1)
    assert [cl.subset for cl in found] == ["train"]
    assert any("read once" in str(w.message) and issubclass(w.category, IsoodWarning) for w in caught)


# ============================================================================ control characters
def test_a_newline_in_an_image_name_is_recorded_escaped_and_refused(tmp_path):
    from isood.features.listing import list_images

    for name in ("a.png", "b\nc.png"):
        _png(tmp_path / "imgs" / W / name)
    src = list_images(tmp_path / "imgs")
    paths = src.table["path"].tolist()
    assert len(paths) == 2 and not any("\n" in p for p in paths)
    refused = dict(zip(paths, src.refused))
    bad = next(p for p in paths if "b" in p)
    assert "newline" in refused[bad] and refused[f"{W}/a.png"] == ""


def test_the_writer_refuses_and_verify_flags_a_path_with_a_newline(tmp_path, monkeypatch):
    """A splits table whose path holds a newline would write one list line too many: the writer refuses it;
    a manifest written without that check (an earlier version, simulated) fails `verify`."""
    import manifests.store as store
    from isood.science.grid import cell_table, edges_table
    from isood.stages.splits import write_splits

    rows = [{"path": p, "wnid": W, "d_sem": 0.1, "d_cov": 0.1, "sem_level": 0, "cov_level": 0,
             "cell": "cov_0_sem_0"} for p in (f"{W}/a.png", f"{W}/b\nc.png")]
    images = pd.DataFrame(rows)
    kw = dict(images=images, cells=cell_table(images["cov_level"], images["sem_level"], 1, 1),
              edges=edges_table([0.0, 1.0], [0.0, 1.0]), argv=["test"],
              config={"test_root": str(tmp_path), "n_levels": 1, "na_threshold": 1})
    with pytest.raises(BadInputError, match="control-character"):
        write_splits(tmp_path / "s", **kw)
    monkeypatch.setattr(store, "_check_path_columns", lambda *a, **k: None)
    write_splits(tmp_path / "old", **kw)
    report = manifests.verify(tmp_path / "old")
    assert not report.ok and any("control-character" in p for p in report.invalid), report


@pytest.mark.parametrize("command", ["imagenet-ood", "openood-imglist"])
def test_a_nul_byte_in_an_imported_path_is_refused(command, cli, tmp_path):
    listed = tmp_path / "l.txt"
    label = " 0" if command == "openood-imglist" else ""
    listed.write_bytes(f"{W}/a.JPEG{label}\n{W}/b\x00c.JPEG{label}\n".encode())
    line = cli.one_line_error(cli.invoke(["import", command, listed, "--out", tmp_path / "out"]))
    assert "NUL" in line and ":2" in line


# ============================================================================ evaluate's --id-test lists
@pytest.mark.parametrize("entry", ["../outside.png", "ABSOLUTE"])
def test_an_id_test_list_naming_a_file_outside_its_root_is_refused(entry, tmp_path):
    """As the importers' lists: entries relative to the list's root and inside it. Refused before the model
    loads (the Python API raises the CLI's one-line error)."""
    import isood
    from isood.science.grid import cell_table, edges_table
    from isood.stages.splits import write_splits

    _png(tmp_path / "outside.png")
    _png(tmp_path / "test" / W / "t.png")
    _png(tmp_path / "ids" / W / "x.png")
    entry = str(tmp_path / "outside.png") if entry == "ABSOLUTE" else entry
    (tmp_path / "ids" / "list.txt").write_text(f"{W}/x.png\n{entry}\n")
    images = pd.DataFrame([{"path": f"{W}/t.png", "wnid": W, "d_sem": 0.1, "d_cov": 0.1, "sem_level": 0,
                            "cov_level": 0, "cell": "cov_0_sem_0"}])
    write_splits(tmp_path / "splits", images=images, cells=cell_table(images["cov_level"], images["sem_level"], 1, 1),
                 edges=edges_table([0.0, 1.0], [0.0, 1.0]), argv=["test"],
                 config={"test_root": str(tmp_path / "test"), "n_levels": 1, "na_threshold": 1})
    with pytest.raises(BadInputError, match="line 2") as e:
        isood.evaluate("no-such-model-is-loaded", id_test=tmp_path / "ids" / "list.txt", splits=tmp_path / "splits",
                       detectors="msp")
    assert "\n" not in str(e.value)


def test_the_policy_in_one_place():
    """The rule itself (``isood.core.inputs``), against hand-checked cases."""
    from isood.core.inputs import entry_problem

    ok = ["a.png", "./a/b.png", "n01/x y.png"]
    bad = {"/etc/passwd": "absolute", "C:/x.png": "absolute", "a/../../b": "..", "a\nb": "newline",
           "a\x00b": "NUL", "a\tb": "tab", "": "empty"}
    assert all(entry_problem(p) is None for p in ok)
    for p, why in bad.items():
        assert why in (entry_problem(p) or ""), p
