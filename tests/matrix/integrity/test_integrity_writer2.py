"""The safe writer owns exactly what it wrote; readers and verify see one version.

| row        | finding                                                                  | guard                                   |
|------------|--------------------------------------------------------------------------|-----------------------------------------|
| dot-tilde  | a user's ``.~backup/`` or ``.~lock.*#`` in ``--out`` deleted on the swap   | ``manifests.ownership`` (recorded own files), ``check_output`` |
| symlink    | ``M/data -> ../SHARED/data``: a rewrite deletes ``SHARED/data/*``          | ``ownership.escaping_links`` refusal, ``unlink_inside`` |
| nested     | a user's ``webapp/manifest.json`` under ``--out`` deleted                  | ``ownership.foreign_paths``             |
| edited     | a hand-edited listed output replaced with no copy kept                   | ``swap.discard_version`` (hash check), warning naming the kept folder |
| inode      | a reader identifies the folder by inode, which file systems reuse        | version marker, ``Manifest.check_unchanged`` |
| verify     | ``verify`` during a rewrite says a healthy manifest is corrupt           | ``verify`` retries, else "being rewritten" |
| fast       | ``--verify fast`` misses an in-place edit with its mtime restored         | stat cache holds ctime, device, inode; full forgets |
| mount      | a mount-point ``--out`` fails the swap after all the work                | ``output._check_place``, EBUSY at the swap |
| cache-dir  | ``--cache-dir`` inside ``--out`` moved away every run                      | ``writing(scratch=...)``                |
| cwd        | ``--out .`` leaves the shell in a deleted folder                          | ``output._check_place``                 |
| staging    | refusals name ``.~X.isood-new``; a refused API write leaves it behind     | ``output.writing`` (``public_path``, cleanup) |
| nested-json| a deeply nested ``manifest.json`` raises RecursionError                  | ``meta.load_meta``                      |
| tempfile   | the unreadable-images list has a predictable name in the shared temp dir | ``scoring._unreadable_list`` (mkstemp)  |
| race       | reader / verify loops against rewrites: no mixed read, no false corrupt   | all of the above                        |
| datasets   | ``load_dataset`` serves the first version from its cache after a rewrite  | ``card._front_matter`` (``dataset_info``) |

Each row was checked to fail with its guard removed.
"""

from __future__ import annotations

import errno
import importlib
import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import pandas as pd
import pytest

import manifests
from isood.core.errors import BadInputError, ManifestError

LIST_A = "n02084071/a.JPEG\nn04399382/b.JPEG\nn01440764/e.JPEG\n"
LIST_B = "".join(f"n02084071/x{i}.JPEG\n" for i in range(7))


def _import(cli, tmp_path: Path, text: str, out: Path, name: str = "ood.txt"):
    lst = tmp_path / name
    lst.write_text(text)
    return cli.invoke(["import", "imagenet-ood", lst, "--out", out])


def _api_import(tmp_path: Path, text: str, out: Path, name: str = "api.txt"):
    from isood.stages.interop.imports import import_imagenet_ood

    lst = tmp_path / name
    lst.write_text(text)
    return import_imagenet_ood(lst, out)


def _left_beside(out: Path) -> list[str]:
    return sorted(p.name for p in out.parent.iterdir() if p.name.startswith(".~") and p.name.endswith(".isood-new"))


def _kept(out: Path) -> list[Path]:
    return sorted(out.parent.glob(f"{out.name}.isood-old-*"))


# ------------------------------------------------------------------------------------------------ dot-tilde
@pytest.mark.parametrize("existing", [False, True], ids=["empty-out", "manifest-out"])
def test_a_users_dot_tilde_folder_is_refused_by_name_and_never_deleted(cli, tmp_path, existing):
    out = tmp_path / "f"
    if existing:
        assert _import(cli, tmp_path, LIST_A, out).exit_code == 0
    (out / ".~backup").mkdir(parents=True)
    (out / ".~backup" / "thesis.tex").write_text("my thesis")
    line = cli.one_line_error(_import(cli, tmp_path, LIST_B, out, "b.txt"))
    assert ".~backup/thesis.tex" in line and str(out) in line and ".isood-new" not in line, line
    assert (out / ".~backup" / "thesis.tex").read_text() == "my thesis"


def test_an_editors_lock_file_made_during_the_run_is_kept_and_named(cli, tmp_path, monkeypatch):
    import manifests.output as output

    out = tmp_path / "f"
    assert _import(cli, tmp_path, LIST_A, out).exit_code == 0
    meta = json.loads((out / "manifest.json").read_text())
    marker = meta["writer"]["own"]
    assert marker == [f".~isood-{meta['writer']['version']}.version"] and len(meta["writer"]["version"]) == 32
    prepare = output._prepare

    def prepare_then_lock(final, kinds, state):  # LibreOffice opens table.tex while the stage runs
        (final / ".~lock.table.tex#").write_text("lock")
        return prepare(final, kinds, state)

    monkeypatch.setattr(output, "_prepare", prepare_then_lock)
    r = _import(cli, tmp_path, LIST_B, out, "b.txt")
    assert r.exit_code == 0, r.output
    kept = _kept(out)
    assert len(kept) == 1 and (kept[0] / ".~lock.table.tex#").read_text() == "lock"
    assert str(kept[0]) in " ".join(r.stderr.split()) and ".~lock.table.tex#" in r.stderr, r.stderr
    assert len(manifests.read(out).frame("images")) == 7 and manifests.verify(out).ok


# ------------------------------------------------------------------------------------------------ symlink
def test_a_symlinked_subfolder_leading_out_is_refused_and_its_target_kept(cli, tmp_path):
    m, shared = tmp_path / "M", tmp_path / "SHARED"
    assert _import(cli, tmp_path, LIST_A, m).exit_code == 0
    shared.mkdir()
    os.rename(m / "data", shared / "data")
    os.symlink("../SHARED/data", m / "data")
    before = (shared / "data" / "images.parquet").read_bytes()
    line = cli.one_line_error(_import(cli, tmp_path, LIST_B, m, "b.txt"))
    assert "data" in line and "symbolic link" in line and str(m) in line, line
    assert (shared / "data" / "images.parquet").read_bytes() == before and not _left_beside(m)


def test_a_link_made_during_the_run_is_never_deleted_through(cli, tmp_path, monkeypatch):
    """The second guard: a link that appears after the check (while the stage runs) is not followed when the
    old version is discarded: what it points at stays, the link is kept and named."""
    import manifests.output as output

    m, shared = tmp_path / "M", tmp_path / "SHARED"
    assert _import(cli, tmp_path, LIST_A, m).exit_code == 0
    prepare = output._prepare

    def prepare_then_link(final, kinds, state):
        work = prepare(final, kinds, state)
        shared.mkdir()
        os.rename(final / "data", shared / "data")
        os.symlink("../SHARED/data", final / "data")
        return work

    monkeypatch.setattr(output, "_prepare", prepare_then_link)
    r = _import(cli, tmp_path, LIST_B, m, "b.txt")
    assert (shared / "data" / "images.parquet").is_file(), r.output
    assert r.exit_code == 0 and len(manifests.read(m).frame("images")) == 7


# ------------------------------------------------------------------------------------------------ nested
def test_a_users_manifest_json_in_a_subfolder_is_refused_by_name(cli, tmp_path):
    out = tmp_path / "f"
    assert _import(cli, tmp_path, LIST_A, out).exit_code == 0
    (out / "webapp").mkdir()
    (out / "webapp" / "manifest.json").write_text('{"name": "my app"}')
    line = cli.one_line_error(_import(cli, tmp_path, LIST_B, out, "b.txt"))
    assert "webapp/manifest.json" in line, line
    assert json.loads((out / "webapp" / "manifest.json").read_text()) == {"name": "my app"}


# ------------------------------------------------------------------------------------------------ edited
def test_an_edited_output_is_kept_beside_the_new_version_and_named(cli, tmp_path):
    out = tmp_path / "f"
    assert _import(cli, tmp_path, LIST_A, out).exit_code == 0
    with open(out / "README.md", "a") as f:  # edited in place, as an editor may
        f.write("\nmy notes\n")
    r = _import(cli, tmp_path, LIST_B, out, "b.txt")
    assert r.exit_code == 0, r.output
    kept = _kept(out)
    assert len(kept) == 1 and (kept[0] / "README.md").read_text().endswith("my notes\n")
    said = " ".join(r.stderr.split())
    assert "README.md" in said and str(kept[0]) in said and "edited" in said, said
    assert "my notes" not in (out / "README.md").read_text() and manifests.verify(out).ok


def test_an_unedited_rewrite_keeps_nothing(cli, tmp_path):
    out = tmp_path / "f"
    assert _import(cli, tmp_path, LIST_A, out).exit_code == 0
    r = _import(cli, tmp_path, LIST_B, out, "b.txt")
    assert r.exit_code == 0 and "warning" not in r.stderr and not _kept(out), r.output
    meta = json.loads((out / "manifest.json").read_text())
    assert meta["dataset_version"] == "1.1.0" and [c["version"] for c in meta["changelog"]] == ["1.0.0", "1.1.0"]
    assert [p.name for p in out.glob(".~isood-*.version")] == [f".~isood-{meta['writer']['version']}.version"]


# ------------------------------------------------------------------------------------------------ inode
def test_a_reader_is_not_fooled_by_a_reused_inode(tmp_path, monkeypatch):
    """ext4 gives a folder made after two rewrites the inode of the first one: simulated by making every folder
    look the same; the version marker still tells the versions apart."""
    import manifests.store as store

    out = tmp_path / "m"
    _api_import(tmp_path, LIST_A, out)
    monkeypatch.setattr(store, "_folder_identity", lambda root: (1, 1))
    old = manifests.read(out, kind="image-list")
    _api_import(tmp_path, LIST_B, out, "b.txt")
    _api_import(tmp_path, LIST_B + "n02084071/y.JPEG\n", out, "c.txt")
    with pytest.raises(ManifestError, match="replaced by a new version"):
        old.frame("images")
    new = manifests.read(out, kind="image-list")
    assert len(new.frame("images")) == new.meta["tables"]["images"]["rows"] == 8


# ------------------------------------------------------------------------------------------------ verify
def test_verify_during_a_swap_checks_the_new_version_instead_of_calling_it_corrupt(tmp_path, monkeypatch):
    verify_mod = importlib.import_module("manifests.verify")

    out = tmp_path / "m"
    _api_import(tmp_path, LIST_A, out)
    real = verify_mod.sha256_file
    swaps = []

    def hash_while_rewritten(path, *a, **k):
        if not swaps:  # the writer swaps a new version in while verify hashes the old one
            swaps.append(1)
            _api_import(tmp_path, LIST_B, out, "b.txt")
        return real(path, *a, **k)

    monkeypatch.setattr(verify_mod, "sha256_file", hash_while_rewritten)
    report = manifests.verify(out)
    assert swaps and report.ok, report.lines()
    assert report.meta is not None and report.meta["tables"]["images"]["rows"] == 7


def test_verify_that_never_sees_a_stable_version_says_being_rewritten(cli, tmp_path, monkeypatch):
    verify_mod = importlib.import_module("manifests.verify")

    out = tmp_path / "m"
    _api_import(tmp_path, LIST_A, out)
    real, n = verify_mod.sha256_file, []

    def always_rewritten(path, *a, **k):
        n.append(1)
        _api_import(tmp_path, LIST_A if len(n) % 2 else LIST_B, out, f"l{len(n)}.txt")
        return real(path, *a, **k)

    monkeypatch.setattr(verify_mod, "sha256_file", always_rewritten)
    r = cli.invoke(["verify", out])
    assert r.exit_code == 1 and "being rewritten" in r.output, r.output
    assert "changed:" not in r.output and "missing:" not in r.output and "FAILED" not in r.output


# ------------------------------------------------------------------------------------------------ fast
def test_fast_verify_sees_an_in_place_edit_with_its_mtime_restored(cli, tmp_path, monkeypatch):
    verify_mod = importlib.import_module("manifests.verify")

    monkeypatch.setenv("ISOOD_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setattr(verify_mod, "FAST_HASH_BYTES", 0)  # every file goes through the stat cache
    out = tmp_path / "m"
    _api_import(tmp_path, LIST_A, out)
    card = out / "README.md"
    assert manifests.verify(out, mode="fast").ok  # remembered
    time.sleep(0.05)
    st = card.stat()
    data = bytearray(card.read_bytes())
    data[-2] = ord("X") if data[-2] != ord("X") else ord("Y")
    with open(card, "r+b") as f:  # the same size, the same inode
        f.write(bytes(data))
    os.utime(card, ns=(st.st_atime_ns, st.st_mtime_ns))
    assert card.stat().st_mtime_ns == st.st_mtime_ns and card.stat().st_ino == st.st_ino
    assert manifests.verify(out, mode="fast").changed == ["README.md"]
    assert manifests.verify(out, mode="full").changed == ["README.md"]
    assert manifests.verify(out, mode="fast").changed == ["README.md"]  # a full finding is never forgotten


def test_a_full_finding_is_dropped_from_the_stat_cache(tmp_path, monkeypatch):
    verify_mod = importlib.import_module("manifests.verify")

    monkeypatch.setenv("ISOOD_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setattr(verify_mod, "FAST_HASH_BYTES", 0)
    out = tmp_path / "m"
    _api_import(tmp_path, LIST_A, out)
    assert manifests.verify(out, mode="fast").ok
    assert "README.md" in verify_mod._StatCache(out).data
    rec = next(r for r in json.loads((out / "manifest.json").read_text())["files"] if r["path"] == "README.md")
    monkeypatch.setattr(verify_mod, "sha256_file", lambda p, *a, **k: "0" * 64 if Path(p).name == "README.md"
                        else rec["sha256"])  # full hashing finds the card changed (the stat is untouched)
    assert "README.md" in manifests.verify(out, mode="full").changed
    assert "README.md" not in verify_mod._StatCache(out).data


# ------------------------------------------------------------------------------------------------ placement
def test_a_mount_point_out_is_refused_before_any_work(cli, tmp_path, monkeypatch):
    import isood.stages.interop.imports as imports

    out = tmp_path / "volume"
    out.mkdir()
    real = os.path.ismount
    monkeypatch.setattr(os.path, "ismount", lambda p: os.fspath(p) == str(out) or real(p))
    monkeypatch.setattr(imports, "parse_list", lambda *a, **k: pytest.fail("work began"))
    line = cli.one_line_error(_import(cli, tmp_path, LIST_A, out))
    assert "mount point" in line and str(out) in line and ".isood-new" not in line, line
    assert not _left_beside(out) and not any(out.iterdir())


def test_a_swap_refused_by_the_system_is_one_line_naming_out(cli, tmp_path, monkeypatch):
    import manifests.output as output

    out = tmp_path / "f"
    assert _import(cli, tmp_path, LIST_A, out).exit_code == 0

    def busy(a, b):
        raise OSError(errno.EBUSY, os.strerror(errno.EBUSY), str(b))

    monkeypatch.setattr(output, "exchange" if hasattr(output, "exchange") else "_exchange", busy)
    line = cli.one_line_error(_import(cli, tmp_path, LIST_B, out, "b.txt"))
    assert str(out) in line and "inside it" in line and ".isood-new" not in line, line
    assert len(manifests.read(out).frame("images")) == 3


@pytest.mark.parametrize("command", ["evaluate", "build-splits"])
def test_a_cache_dir_inside_out_is_refused(cli, tmp_path, command):
    from PIL import Image

    out = tmp_path / "o"
    out.mkdir()
    for d in ("id", "test"):
        (tmp_path / d / "n02084071").mkdir(parents=True)
        Image.new("RGB", (8, 8)).save(tmp_path / d / "n02084071" / "a.png")
    args = (["evaluate", "--splits", tmp_path / "s", "--id-test", tmp_path / "v", "--id-train", tmp_path / "t",
             "--model", "resnet18"] if command == "evaluate" else
            ["build-splits", "--id", tmp_path / "id", "--test", tmp_path / "test", "--clip",
             f"local-dir:{tmp_path}"])
    line = cli.one_line_error(cli.invoke([*args, "--out", out, "--cache-dir", out / "cache"]))
    assert "--cache-dir" in line and "inside --out" in line, line
    assert not any(out.iterdir()) and not _kept(out)


def test_out_equal_to_the_working_directory_is_refused(cli, tmp_path, monkeypatch):
    out = tmp_path / "f"
    assert _import(cli, tmp_path, LIST_A, out).exit_code == 0
    monkeypatch.chdir(out)
    line = cli.one_line_error(cli.invoke(["import", "imagenet-ood", tmp_path / "ood.txt", "--out", "."]))
    assert "working directory" in line, line
    assert Path(os.getcwd()).samefile(out) and (out / "manifest.json").is_file()


# ------------------------------------------------------------------------------------------------ staging
def test_a_refusal_inside_an_api_write_names_out_and_leaves_nothing(tmp_path):
    from isood.kinds import IMAGE_LIST

    out = tmp_path / "m"
    _api_import(tmp_path, LIST_A, out)
    bad = pd.DataFrame({"path": ["/etc/passwd"], "wnid": ["n02084071"], "label": [-1]})
    with pytest.raises(BadInputError) as e:
        with manifests.writing(out, IMAGE_LIST) as o:
            (o.work / "partial.txt").write_text("half done")
            manifests.write_manifest(o.work, kind=IMAGE_LIST, tables={"images": bad}, config={})
    assert ".isood-new" not in str(e.value) and str(out) in str(e.value), e.value
    assert not _left_beside(out) and len(manifests.read(out).frame("images")) == 3


def test_a_deeply_nested_manifest_json_is_one_line(cli, tmp_path):
    out = tmp_path / "m"
    out.mkdir()
    (out / "manifest.json").write_text("[" * 100000 + "]" * 100000)
    line = cli.one_line_error(cli.invoke(["verify", out]))
    assert "not an isood manifest" in line, line


def test_the_unreadable_images_list_has_a_private_unpredictable_name(tmp_path):
    from isood.classifiers.image_list import Unreadable
    from isood.classifiers.scoring import _unreadable_list

    found = [Unreadable(f"/data/x{i}.png", "OSError") for i in range(5)]
    a, b = _unreadable_list(found, None), _unreadable_list(found, None)
    try:
        assert a != b and Path(a).read_text() == Path(b).read_text()
        assert Path(a).stat().st_mode & 0o077 == 0
    finally:
        Path(a).unlink(missing_ok=True)
        Path(b).unlink(missing_ok=True)


# ------------------------------------------------------------------------------------------------ race
_WRITER = """
import sys, time
from pathlib import Path
from isood.stages.interop.imports import import_imagenet_ood
out, a, b, seconds = Path(sys.argv[1]), sys.argv[2], sys.argv[3], float(sys.argv[4])
end, n = time.monotonic() + seconds, 0
while time.monotonic() < end:
    import_imagenet_ood(a if n % 2 else b, out)
    n += 1
print(n)
"""


def test_readers_and_verify_against_rewrites_never_mix_and_never_say_corrupt(tmp_path):
    out = tmp_path / "m"
    _api_import(tmp_path, LIST_A, out)
    (tmp_path / "a.txt").write_text(LIST_A)
    (tmp_path / "b.txt").write_text(LIST_B)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path), "HF_HUB_OFFLINE": "1"}
    writer = subprocess.Popen([sys.executable, "-c", _WRITER, str(out), str(tmp_path / "a.txt"),
                               str(tmp_path / "b.txt"), "4"], env=env, stdout=subprocess.PIPE, text=True)
    problems: list[str] = []
    counts = {"read": 0, "retry": 0, "verify": 0, "rewriting": 0}
    stop = threading.Event()

    def reader() -> None:
        while not stop.is_set():
            try:
                m = manifests.read(out, kind="image-list")
                rows = len(m.frame("images"))
            except ManifestError as e:
                if "replaced by a new version" in str(e) or "being rewritten" in str(e):
                    counts["retry"] += 1
                    continue
                problems.append(f"read: {e}")
                continue
            except Exception as e:
                problems.append(f"read raised {type(e).__name__}: {e}")
                continue
            counts["read"] += 1
            if rows != m.meta["tables"]["images"]["rows"]:
                problems.append(f"mixed: {rows} rows under a manifest recording {m.meta['tables']['images']['rows']}")

    def verifier() -> None:
        while not stop.is_set():
            try:
                report = manifests.verify(out, mode="fast")
            except Exception as e:  # a healthy manifest being rewritten is never an error
                problems.append(f"verify raised {type(e).__name__}: {e}")
                continue
            counts["verify"] += 1
            rewriting = bool(getattr(report, "rewriting", False))
            counts["rewriting"] += rewriting
            if not report.ok and not rewriting:
                problems.append("verify: " + "; ".join(report.lines()))

    threads = [threading.Thread(target=reader), threading.Thread(target=verifier)]
    for t in threads:
        t.start()
    try:
        rewrites = int(writer.communicate(timeout=120)[0].strip() or 0)
    finally:
        stop.set()
        for t in threads:
            t.join(timeout=60)
        if writer.poll() is None:
            writer.kill()
    assert writer.returncode == 0
    assert rewrites >= 3 and counts["read"] + counts["retry"] > 0 and counts["verify"] > 0, (rewrites, counts)
    print("race:", rewrites, "rewrites,", counts)
    assert not problems, (problems[:5], counts)
    assert manifests.verify(out).ok


# ------------------------------------------------------------------------------------------------ datasets
def test_load_dataset_after_a_rewrite_gives_the_new_version(tmp_path):
    """``datasets`` caches a local folder by its card: the card names the version and content hash, so the same
    cache folder does not serve the previous version (``manifests.card._front_matter``)."""
    import datasets

    out = tmp_path / "m"
    _api_import(tmp_path, LIST_A, out)
    first = datasets.load_dataset(str(out), cache_dir=str(tmp_path / "hf"))
    _api_import(tmp_path, LIST_B, out, "b.txt")
    second = datasets.load_dataset(str(out), cache_dir=str(tmp_path / "hf"))
    assert [len(first["test"]), len(second["test"])] == [3, 7]
    assert sorted(second["test"]["path"]) == sorted(LIST_B.split())


def test_a_copy_without_its_version_marker_reads_and_verifies(tmp_path):
    """An upload or a ``cp`` of the listed files leaves the marker behind: the copy is still one version."""
    import shutil

    out, copy = tmp_path / "m", tmp_path / "copy"
    _api_import(tmp_path, LIST_A, out)
    for rel in [r["path"] for r in json.loads((out / "manifest.json").read_text())["files"]] + ["manifest.json"]:
        (copy / rel).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(out / rel, copy / rel)
    assert manifests.verify(copy).ok and len(manifests.read(copy, kind="image-list").frame("images")) == 3
