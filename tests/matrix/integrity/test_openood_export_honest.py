"""`isood export openood` is honest about what OpenOOD and the release will read, and owns only what it wrote.
Each test is a guard (named in its docstring) against a case that went wrong: near and far sharing datasets,
image folders never linked, a hard-coded number of classes, the release's flat ID list refused, a ledger
followed outside the folder, a second `splits` export replacing the first, an --out inside an input, an export
killed between its lists and its ledger, misleading messages."""

from __future__ import annotations

import errno
import json
import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pandas as pd
import pytest

from isood.science.grid import cell_table, edges_table

INFO = "openood_data_info.json"
LEDGER = ".~isood-export.json"


def _splits(root: Path, images: Path, cells: dict[tuple[int, int], int], *, test_root: bool = True) -> Path:
    """A 2 x 2 splits manifest written by build-splits' own writer, its images touched under ``images`` (recorded
    as its test_root unless ``test_root`` is False)."""
    from isood.stages.splits import write_splits

    rows = [(f"n0{c}{s}00000/n0{c}{s}00000_{i}.JPEG", c, s) for (c, s), n in cells.items() for i in range(n)]
    for path, _, _ in rows:
        (images / path).parent.mkdir(parents=True, exist_ok=True)
        (images / path).write_bytes(b"img")
    frame = pd.DataFrame({"path": [r[0] for r in rows], "wnid": [r[0][:9] for r in rows],
                          "d_sem": [0.1 * r[2] for r in rows], "d_cov": [0.1 * r[1] for r in rows],
                          "sem_level": [r[2] for r in rows], "cov_level": [r[1] for r in rows],
                          "cell": [f"cov_{r[1]}_sem_{r[2]}" for r in rows]})
    config = {"n_levels": 2, "na_threshold": 10, **({"test_root": str(images)} if test_root else {})}
    write_splits(root, images=frame, cells=cell_table(frame["cov_level"], frame["sem_level"], 2, 10),
                 edges=edges_table([0.0, 0.1, 0.2], [0.0, 0.1, 0.2]), config=config, card=False)
    return root


@pytest.fixture(scope="module")
def grid(tmp_path_factory) -> tuple[Path, Path]:
    """(manifest, its image folder): cells cov_0_sem_1 and cov_1_sem_0 usable (12 images), cov_0_sem_0 N/A."""
    base = tmp_path_factory.mktemp("grid")
    (base / "images").mkdir()
    return _splits(base / "splits", base / "images", {(0, 0): 3, (0, 1): 12, (1, 0): 12}), base / "images"


@pytest.fixture(scope="module")
def id_set(tmp_path_factory) -> Path:
    """ImageNet-style ID images of 4 classes: train/<wnid>/ folders and the release's flat test list."""
    base = tmp_path_factory.mktemp("id")
    for k, w in enumerate(("n01440764", "n01443537", "n01484850", "n01491361")):
        for i in range(2):
            (base / "in1k/train" / w).mkdir(parents=True, exist_ok=True)
            (base / "in1k/train" / w / f"{w}_{i}.JPEG").write_bytes(b"img")
    (base / "in1k/val").mkdir()
    for i in range(1, 4):
        (base / f"in1k/val/ILSVRC2012_val_{i:08d}.JPEG").write_bytes(b"img")
    (base / "test_imagenet.txt").write_text("".join(f"val/ILSVRC2012_val_{i:08d}.JPEG\n" for i in range(1, 4)))
    return base


def _info(out: Path) -> dict:
    return json.loads((out / INFO).read_text())


def test_near_and_far_never_share_a_dataset(grid, cli, tmp_path):
    """Guard: openood_info._groups / empty_groups. Every usable cell left registered is near (sem level 0): the
    far group is empty, said in one line and recorded, and no dataset is listed under both groups."""
    m, _ = grid
    out = tmp_path / "o"
    r = cli.invoke(["export", "openood", m, "--out", out, "--val-cells", "cov_0_sem_1"])
    assert r.exit_code == 0, r.output
    info = _info(out)
    ood = info["data_info"]["ood"]
    assert ood["near"]["datasets"] == ["splits_cov_1_sem_0"] and ood["far"] == {"datasets": []}
    assert info["empty_groups"] == ["far"]
    assert "the far-OOD group is empty" in r.stdout
    assert any("far-OOD dataset" in line for line in info["ready"]["openood"])


def test_image_roots_are_linked_and_ready_follows_them(grid, id_set, cli, tmp_path):
    """Guard: export_folder.make_link / unresolved. The splits manifest's test_root and the ID folders' parent are
    linked as OUT/<name> and OUT/imagenet1k (as --id-root's help says), every listed image opens through them; a
    list export whose images are not linked is not ready, and the line names the folder to link."""
    m, images = grid
    out = tmp_path / "o"
    r = cli.invoke(["export", "openood", m, "--out", out, "--id-train", id_set / "in1k/train"])
    assert r.exit_code == 0, r.output
    assert os.readlink(out / "splits") == str(images) and os.readlink(out / "imagenet1k") == str(id_set / "in1k")
    info = _info(out)
    for entry in [*info["data_info"]["id"].values(), *(info["data_info"]["ood"]["near"][n] for n in
                                                        info["data_info"]["ood"]["near"]["datasets"])]:
        for line in (out / entry["imglist_path"]).read_text().splitlines():
            assert (out / entry["data_dir"] / line.split(" ", 1)[0]).read_bytes() == b"img"
    assert not any(line.startswith(("splits/", "imagenet1k/")) for line in info["ready"]["openood"])
    # a re-export with another image folder moves the export's own link
    moved = tmp_path / "moved"
    shutil.copytree(images, moved)
    assert cli.invoke(["export", "openood", m, "--out", out, "--image-root", moved]).exit_code == 0
    assert os.readlink(out / "splits") == str(moved)
    assert json.loads((out / LEDGER).read_text())["links"]["splits"] == {"splits": str(moved)}
    # an image list records no folder: ready names the one to link, nothing is linked
    (tmp_path / "ood.txt").write_text("x/a.JPEG\n")
    assert cli.invoke(["import", "imagenet-ood", tmp_path / "ood.txt", "--out", tmp_path / "ood"]).exit_code == 0
    r = cli.invoke(["export", "openood", tmp_path / "ood", "--out", out, "--group", "far"])
    assert r.exit_code == 0, r.output
    assert not (out / "ood").exists()
    assert any(line.startswith("ood/ (the image folder of benchmark_imglist/ood/test_ood.txt")
               for line in _info(out)["ready"]["openood"])
    assert "OpenOOD Evaluator: still lacks" in r.stdout and "--image-root" in r.stdout


def test_a_link_never_replaces_a_users_folder(grid, cli, tmp_path):
    """Guard: export_folder.make_link (never delete what isood did not write)."""
    m, _ = grid
    out = tmp_path / "o"
    (out / "splits").mkdir(parents=True)
    (out / "splits/notes.txt").write_text("mine\n")
    (out / INFO).write_text(json.dumps({"format": "isood openood export 2", "benchmarks": {}, "id": {}}))
    r = cli.invoke(["export", "openood", m, "--out", out])
    assert r.exit_code == 0, r.output
    assert not (out / "splits").is_symlink() and (out / "splits/notes.txt").read_text() == "mine\n"
    assert any("holds no such file" in line for line in _info(out)["ready"]["openood"])


def test_num_classes_comes_from_the_id_classes(id_set, cli, tmp_path):
    """Guard: id_lists.id_labels (was a hard-coded 1000): four ID class folders give num_classes 4."""
    out = tmp_path / "o"
    r = cli.invoke(["export", "openood", "--out", out, "--id-train", id_set / "in1k/train"])
    assert r.exit_code == 0, r.output
    info = _info(out)
    assert info["num_classes"] == info["data_info"]["num_classes"] == 4
    labels = [int(ln.split()[1]) for ln in (out / info["data_info"]["id"]["train"]["imglist_path"]).read_text()
              .splitlines()]
    assert sorted(set(labels)) == [0, 1, 2, 3]


def test_the_releases_flat_id_list_exports_as_it_is(id_set, cli, tmp_path):
    """Guard: id_lists.id_labels (was "no class label and no wnid"): the release's flat test_imagenet.txt goes to
    the release's list byte for byte; OpenOOD gets no list it would read as OOD, and ready says why."""
    out = tmp_path / "o"
    r = cli.invoke(["export", "openood", "--out", out, "--id-train", id_set / "in1k/train",
                    "--id-test", id_set / "test_imagenet.txt"])
    assert r.exit_code == 0, r.output
    assert (out / "imglist/imagenet1k/test_imagenet.txt").read_bytes() == (id_set / "test_imagenet.txt").read_bytes()
    assert not (out / "benchmark_imglist/imagenet1k/test_imagenet1k.txt").exists()
    info = _info(out)
    assert "test" not in info["data_info"]["id"] and info["id"]["test"]["n"] == 3
    assert any(line.startswith("class labels for the ID test images") for line in info["ready"]["openood"])
    # the release reads it through the linked ID root (the train folders' parent)
    for line in (out / "imglist/imagenet1k/test_imagenet.txt").read_text().splitlines():
        assert (out / "imagenet1k" / line).is_file()


@pytest.mark.parametrize("entry", ["../victim.txt", "{abs}", "benchmark_imglist/other/x.txt",
                                   "benchmark_imglist/splits/../../../victim.txt"])
def test_an_altered_ledger_is_refused(entry, grid, cli, tmp_path):
    """Guard: export_folder.Ledger.read (the ledger was trusted: a re-export unlinked whatever it listed)."""
    m, _ = grid
    out = tmp_path / "o"
    assert cli.invoke(["export", "openood", m, "--out", out]).exit_code == 0
    victim = tmp_path / "victim.txt"
    victim.write_text("keep me\n")
    ledger = json.loads((out / LEDGER).read_text())
    ledger["files"]["splits"].append(entry.replace("{abs}", str(victim)))
    (out / LEDGER).write_text(json.dumps(ledger))
    line = cli.one_line_error(cli.invoke(["export", "openood", m, "--out", out]))
    assert "ledger was altered" in line and "--out" in line, line
    assert victim.read_text() == "keep me\n"


def test_a_ledger_without_this_format_is_refused_and_nothing_is_removed(grid, cli, tmp_path):
    """Guard: export_folder.Ledger.read reads one ledger format: a ledger that maps each export to its files
    without naming the format (the pre-release layout) is refused with one line, and the files it lists stay."""
    m, _ = grid
    out = tmp_path / "o"
    assert cli.invoke(["export", "openood", m, "--out", out]).exit_code == 0
    ledger = json.loads((out / LEDGER).read_text())
    (out / LEDGER).write_text(json.dumps(ledger["files"]))
    before = sorted(p.relative_to(out).as_posix() for p in out.rglob("*"))
    line = cli.one_line_error(cli.invoke(["export", "openood", m, "--out", out, "--name", "again"]))
    assert "is not a ledger an isood export writes" in line and "--out" in line, line
    assert sorted(p.relative_to(out).as_posix() for p in out.rglob("*")) == before


def test_a_second_splits_folder_does_not_replace_the_first(grid, cli, tmp_path):
    """Guard: openood_export._check_default_name (a second manifest named `splits` silently replaced the first)."""
    m, _ = grid
    other = _splits(tmp_path / "b/splits", tmp_path / "b", {(1, 1): 11}, test_root=False)
    out = tmp_path / "o"
    assert cli.invoke(["export", "openood", m, "--out", out]).exit_code == 0
    before = {p: p.read_bytes() for p in out.rglob("*") if p.is_file()}
    line = cli.one_line_error(cli.invoke(["export", "openood", other, "--out", out]))
    assert "--name" in line and "splits" in line, line
    assert {p: p.read_bytes() for p in out.rglob("*") if p.is_file()} == before
    assert cli.invoke(["export", "openood", other, "--out", out, "--name", "splits_b"]).exit_code == 0
    assert sorted(_info(out)["benchmarks"]) == ["splits", "splits_b"]


@pytest.mark.parametrize("where", ["id_train", "test_root"])
def test_out_inside_an_input_is_refused_before_any_work(where, grid, id_set, cli, tmp_path):
    """Guard: openood_export._check_placement (an --out inside --id-train or the splits' test_root)."""
    m, images = grid
    if where == "id_train":
        out = id_set / "in1k/train/export"
        args = ["export", "openood", "--out", out, "--id-train", id_set / "in1k/train"]
    else:
        out = images / "export"
        args = ["export", "openood", m, "--out", out]
    line = cli.one_line_error(cli.invoke(args))
    assert f"--out {out} is inside" in line and "pass a folder outside it" in line, line
    assert not out.exists()


_KILL = textwrap.dedent("""
    import os, re, sys
    from isood.stages.interop import export_openood

    def hook(event, args):  # kill -9 at the chosen moment
        if sys.argv[3] == "staging" and event == "open" and re.search(r"\\.txt\\.[0-9a-f]{12}\\.tmp$", str(args[0])):
            hook.opened = getattr(hook, "opened", 0) + 1
            if hook.opened == 3:  # while the lists are being written, before anything is committed
                os._exit(9)
        if sys.argv[3] == "ledger" and event == "os.rename":  # as the ledger is written after the first list
            dst = str(args[1])
            if dst.endswith(".txt") and "/.~" not in dst:
                hook.lists = True
            elif dst.endswith(".~isood-export.json") and getattr(hook, "lists", False):
                os._exit(9)
    sys.addaudithook(hook)
    export_openood(sys.argv[1], sys.argv[2])
""")


@pytest.mark.parametrize("moment", ["staging", "ledger"])
def test_a_killed_export_is_taken_up_by_the_same_command(moment, grid, cli, tmp_path):
    """Guard: export_folder.Ledger.intend (the ledger is written first, as an intent) and holds_only_staging (a
    new folder holding only a killed export's temporaries): an export killed between its lists and its ledger,
    or while writing its lists, is resumed by the same command."""
    m, _ = grid
    out = tmp_path / "o"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    res = subprocess.run([sys.executable, "-c", _KILL, str(m), str(out), moment], env=env, capture_output=True,
                         text=True)
    assert res.returncode == 9, res.stderr[-2000:]
    assert (out / "benchmark_imglist/splits/test_cov_0_sem_1.txt").is_file() == (moment == "ledger")
    r = cli.invoke(["export", "openood", m, "--out", out])  # the same command takes the folder up again
    assert r.exit_code == 0, r.output
    assert sorted(_info(out)["benchmarks"]) == ["splits"]
    assert (out / "benchmark_imglist/splits/test_cov_0_sem_1.txt").read_text().count("\n") == 12
    assert not [p for p in out.rglob("*.tmp")]  # the killed export's temporaries are gone


def test_name_refusal_does_not_list_dot_as_allowed(grid, cli, tmp_path):
    """Guard: openood_export.export_openood (`--name .` was refused by a message listing '.' as allowed)."""
    line = cli.one_line_error(cli.invoke(["export", "openood", grid[0], "--out", tmp_path / "o", "--name", "."]))
    assert "--name '.'" in line and "start with a letter or digit" in line, line


def test_a_full_disk_names_the_list_not_its_temporary(grid, cli, tmp_path, monkeypatch):
    """Guard: openood._named (a full disk while a list's temporary is created named the hidden temporary)."""
    from isood.stages.interop import openood
    from manifests.stream import StagedFile

    class Full(StagedFile):
        def __init__(self, path, **kw):
            tmp = Path(path).with_name(f".~{Path(path).name}.0123456789ab.tmp")
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(tmp))

    monkeypatch.setattr(openood, "StagedFile", Full)
    line = cli.one_line_error(cli.invoke(["export", "openood", grid[0], "--out", tmp_path / "o"]))
    assert "No space left on device" in line and ".~" not in line, line
    assert str(tmp_path / "o" / "benchmark_imglist/splits") in line or str(tmp_path / "o" / "imglist/splits") in line
