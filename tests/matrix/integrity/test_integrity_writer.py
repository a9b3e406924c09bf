"""The integrity matrix, rows of the safe writer and of verification: nothing lost, nothing silently wrong.

| row   | case                                                                    | guard                                              |
|-------|-------------------------------------------------------------------------|----------------------------------------------------|
| demo  | `demo --out X`: X/class-filter of another kind replaced first; X a manifest | ``isood.dev.demo.check_demo_out`` (every sub-output checked before the first) |
| out   | `--out` equal to (or holding, or inside) an input                         | ``manifests.output.check_output`` (inputs)         |
| meta  | hand-edited ``dataset_version`` / ``changelog`` accepted, then a rewrite crashed after deleting | ``manifests.meta.validate_meta`` (read, verify, writer) |
| crash | a rewrite that fails half way leaves a mix of old and new files           | ``manifests.writing`` (staging sibling, swap last) |
| input | stages use tampered inputs (laid.safetensors, feature shards, an audit table) | ``manifests.read(verify=...)`` in every stage     |
| roots | roots stored relative to the working directory                           | ``stages.splits.config.splits_config``, ``images.list_images`` |
| paths | the Python API writes ``..`` / absolute image paths that pass verify      | ``TableSpec.paths``: ``store._check_path_columns``, ``verify`` |
| read  | a reader gets the old manifest.json with the new tables                  | ``Manifest.check_unchanged`` (version marker) + the swap  |
| verif | verify says OK with bad rows, content hash, table paths, kind            | ``manifests.verify`` (every field)                 |
| det.  | one seed, two content hashes (fit time inside laid.safetensors)          | ``LAID.fit_seconds`` is never saved                |
| empty | a refused import leaves an empty ``data/``                                | ``manifests.writing`` removes a staging folder it wrote nothing into |

Each row was checked to fail with its guard removed. The rows that need every writer command (another kind, foreign
files) are in ``test_faults.py`` beside the lock rows, which use the same command table.
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

import manifests
from isood.core.errors import BadInputError, ManifestError

LIST_A = "n02084071/a.JPEG\nn04399382/b.JPEG\n"
LIST_B = "n02084071/c.JPEG\nn04399382/d.JPEG\nn01440764/e.JPEG\n"


def _files(root: Path) -> dict[str, bytes]:
    return {p.relative_to(root).as_posix(): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


def _import(cli, tmp_path: Path, text: str, out: Path, name: str = "ood.txt"):
    lst = tmp_path / name
    lst.write_text(text)
    return cli.invoke(["import", "imagenet-ood", lst, "--out", out])


def _staging_left(out: Path) -> list[str]:
    return [p.name for p in out.parent.iterdir() if p.name.startswith(".~") and p.name.endswith(".isood-new")]


# ------------------------------------------------------------------------------------------------ hand-edited version fields
@pytest.mark.parametrize("field, value", [("dataset_version", "9"), ("dataset_version", "abc"),
                                          ("changelog", "x")])
def test_a_hand_edited_version_or_changelog_is_refused_and_nothing_is_replaced(cli, tmp_path, field, value):
    out = tmp_path / "m"
    assert _import(cli, tmp_path, LIST_A, out).exit_code == 0
    meta = json.loads((out / "manifest.json").read_text())
    meta[field] = value
    (out / "manifest.json").write_text(json.dumps(meta, indent=2))
    before = _files(out)
    line = cli.one_line_error(cli.invoke(["verify", out]))  # not "OK"
    assert field in line, line
    line = cli.one_line_error(_import(cli, tmp_path, LIST_B, out, "other.txt"))  # a rewrite: refused, no traceback
    assert "cannot read" in line and field in line, line
    assert _files(out) == before and not _staging_left(out)


# ------------------------------------------------------------------------------------------------ verify checks every field
def _splits(root: Path):
    from isood.science.grid import cell_name, cell_table, edges_table
    from isood.stages.splits import write_splits

    rows = [{"path": f"n02084071/x{c}{s}_{i}.JPEG", "wnid": "n02084071", "d_sem": 0.2 + s, "d_cov": 0.2 + c,
             "sem_level": s, "cov_level": c, "cell": cell_name(c, s)} for c in range(2) for s in range(2)
            for i in range(3)]
    images = pd.DataFrame(rows)
    return write_splits(root, images=images, cells=cell_table(images["cov_level"], images["sem_level"], 2, 2),
                        edges=edges_table([0.0, 1.0, 2.0], [0.0, 1.0, 2.0]), argv=["test"],
                        config={"test_root": str(root.parent / "test"), "n_levels": 2, "na_threshold": 2})


def _edit(root: Path, change) -> None:
    meta = json.loads((root / "manifest.json").read_text())
    change(meta)
    (root / "manifest.json").write_text(json.dumps(meta, indent=2))


@pytest.mark.parametrize("edit, exit_code, words", [
    (lambda m: m["tables"]["images"].update(rows=999), 1, "records 999 rows"),
    (lambda m: m.update(content_sha256="0" * 64), 1, "content_sha256"),
    (lambda m: m["tables"]["cells"].update(path="data/edges.parquet"), 2, "same file"),
    (lambda m: m["tables"]["images"].update(path="data"), 2, "do not list"),
    (lambda m: m.update(kind="nosuchkind"), 1, "unknown"),
], ids=["rows", "content_sha256", "table-path-of-another-table", "table-path-a-folder", "unknown-kind"])
def test_verify_checks_every_field(cli, tmp_path, edit, exit_code, words):
    root = tmp_path / "s"
    _splits(root)
    assert cli.invoke(["verify", root]).exit_code == 0
    _edit(root, edit)
    r = cli.invoke(["verify", root])
    assert r.exit_code == exit_code, r.output
    assert words in " ".join(r.output.split()), r.output


# ------------------------------------------------------------------------------------------------ readers and a crash mid-rewrite
def test_a_reader_holding_the_old_version_never_gets_the_new_tables(cli, tmp_path):
    out = tmp_path / "m"
    assert _import(cli, tmp_path, LIST_A, out).exit_code == 0
    old = manifests.read(out, kind="image-list")
    assert _import(cli, tmp_path, LIST_B, out, "b.txt").exit_code == 0
    with pytest.raises(ManifestError, match="replaced by a new version"):
        old.frame("images")  # the old manifest.json with the new table would be a silent mix
    new = manifests.read(out, kind="image-list")
    assert len(new.frame("images")) == new.meta["tables"]["images"]["rows"] == 3


def test_a_rewrite_that_fails_half_way_leaves_the_old_version_whole(cli, tmp_path, monkeypatch):
    import manifests.store as store

    out = tmp_path / "m"
    assert _import(cli, tmp_path, LIST_A, out).exit_code == 0
    before = _files(out)
    calls = []
    put = store._put

    def failing_put(root, rel, data, records):
        calls.append(rel)
        if len(calls) == 1:  # the disk fails on the new version's first table
            raise OSError(28, "No space left on device", str(root / rel))
        return put(root, rel, data, records)

    monkeypatch.setattr(store, "_put", failing_put)
    r = _import(cli, tmp_path, LIST_B, out, "b.txt")
    assert r.exit_code == 2 and len(calls) == 1
    assert _files(out) == before and manifests.verify(out).ok  # the old version, whole
    monkeypatch.setattr(store, "_put", put)
    assert _import(cli, tmp_path, LIST_B, out, "b.txt").exit_code == 0  # the rerun finishes from the staging folder
    assert len(manifests.read(out).frame("images")) == 3 and not _staging_left(out)


def test_a_refused_import_leaves_nothing_behind(cli, tmp_path):
    """A release import refused on its second list (the first already streamed): no --out, no staging folder,
    none of the empty data/ and lists/ folders the streaming had made."""
    release = tmp_path / "release" / "train"
    release.mkdir(parents=True)
    for cell, line in (("cov_0_sem_0", "n02084071/a.JPEG"), ("cov_0_sem_1", "/etc/passwd"),
                       ("cov_1_sem_0", "n02084071/b.JPEG"), ("cov_1_sem_1", "n02084071/c.JPEG")):
        (release / f"{cell}.txt").write_text(line + "\n")
    out = tmp_path / "new" / "m"
    line = cli.one_line_error(cli.invoke(["import", "isood-lists", tmp_path / "release", "--levels", "2", "--out", out]))
    assert "absolute" in line and "cov_0_sem_1" in line
    assert not (tmp_path / "new").exists()


# ------------------------------------------------------------------------------------------------ demo and --out placement
def test_demo_checks_every_output_before_the_first(cli, tmp_path):
    x = tmp_path / "x"
    _splits(x / "class-filter")  # a splits manifest where the demo writes its class filter
    before = _files(x)
    line = cli.one_line_error(cli.invoke(["demo", "--out", x]))
    assert "class-filter" in line and "'splits'" in line
    assert _files(x) == before and sorted(p.name for p in x.iterdir() if not p.name.startswith(".~")) == [
        "class-filter"]
    s = tmp_path / "s"
    _splits(s)
    before = _files(s)
    line = cli.one_line_error(cli.invoke(["demo", "--out", s]))
    assert "is a manifest" in line
    assert _files(s) == before and manifests.verify(s).ok  # no sub-folder added to the manifest


def test_an_out_that_is_or_holds_an_input_is_refused(cli, tmp_path):
    from isood.stages.wordnet.jobs import run_audit

    s = tmp_path / "s"
    _splits(s)
    audit = tmp_path / "audit"
    run_audit(s, "1k", out=audit)
    before = {p: _files(p) for p in (s, audit)}
    for args in (["splits", "clean", s, "--audit", audit, "--out", audit],
                 ["splits", "clean", s, "--audit", audit, "--out", s],
                 ["wordnet", "audit", s, "--out", s],
                 ["import", "imagenet-ood", tmp_path / "l.txt", "--out", tmp_path]):
        (tmp_path / "l.txt").write_text(LIST_A)
        line = cli.one_line_error(cli.invoke(args))
        assert "input" in line, line
    assert {p: _files(p) for p in (s, audit)} == before


# ------------------------------------------------------------------------------------------------ tampered inputs
def _flip(path: Path, offset: int = -5) -> None:
    """Flip one byte (same size: only the content hash can tell)."""
    data = bytearray(path.read_bytes())
    data[offset] ^= 0xFF
    path.write_bytes(bytes(data))


@pytest.fixture(scope="module")
def feature_world(tmp_path_factory, tiny_clip_spec, image_dataset_factory):
    """A features manifest (real extract), a LAID file, a splits manifest built on them (real build-splits)."""
    from isood.features.featurestore import extract_features
    from isood.science.laid import LAID
    from isood.science.simulate import random_orthogonal
    from isood.stages.splits import SplitsOptions, build_splits

    root = tmp_path_factory.mktemp("tampered")
    images = image_dataset_factory(root / "images", classes={"n01440764": 4, "n02084071": 4}, seed=2, corrupt=None)
    extract_features(images, tiny_clip_spec, root / "features", batch_size=8, device="cpu", progress=False)
    LAID(random_orthogonal(32, seed=2)).save(root / "laid.safetensors")
    build_splits(SplitsOptions(id=str(root / "features"), test=str(root / "features"), laid=str(root / "laid.safetensors"),
                             out=str(root / "splits"), levels=2, na_threshold=1, progress=False))
    return root


def _copy(src: Path, dst: Path) -> Path:
    shutil.copytree(src, dst, symlinks=True)
    return dst


def test_every_stage_refuses_a_tampered_input(cli, feature_world, tmp_path, tiny_clip_spec):
    w = feature_world
    feats = _copy(w / "features", tmp_path / "features")
    _flip(next(feats.glob("features-*.npy")))
    splits = _copy(w / "splits", tmp_path / "splits")
    _flip(splits / "laid.safetensors")
    (tmp_path / "labels.txt").write_text("tench\ndog\n")
    syn = ["generate-syn", "--styles", "sdxl:anime", "--labels", tmp_path / "labels.txt", "--clip", tiny_clip_spec,
           "--prompts-only", "--device", "cpu"]
    rows = {
        "generate-syn --splits (laid.safetensors)": syn + ["--splits", splits, "--out", tmp_path / "o1"],
        "generate-syn --id-features (a shard)": syn + ["--laid", w / "laid.safetensors", "--id-features", feats,
                                                      "--out", tmp_path / "o2"],
        "build-splits --id (a shard)": ["build-splits", "--id", feats, "--test", w / "features", "--laid",
                                        w / "laid.safetensors", "--levels", "2", "--out", tmp_path / "o3"],
    }
    for name, args in rows.items():
        line = cli.one_line_error(cli.invoke(args))
        assert "fails verification" in line and "changed" in line, (name, line)
        assert not Path(args[-1]).exists(), name


def test_splits_clean_refuses_an_edited_audit(cli, feature_world, tmp_path):
    from isood.stages.wordnet.jobs import run_audit

    run_audit(feature_world / "splits", "1k", out=tmp_path / "audit")
    classes = tmp_path / "audit" / "data" / "classes.parquet"
    table = pd.read_parquet(classes)
    table["decision"] = "keep"  # an edit that would keep every leaking image
    table.to_parquet(classes)
    line = cli.one_line_error(cli.invoke(["splits", "clean", feature_world / "splits", "--audit", tmp_path / "audit",
                                          "--out", tmp_path / "clean"]))
    assert "fails verification" in line and "classes.parquet" in line
    assert not (tmp_path / "clean").exists()


# ------------------------------------------------------------------------------------------------ explicit roots
def test_roots_are_stored_absolute_whatever_the_working_directory(cli, feature_world, tmp_path, monkeypatch):
    w = tmp_path / "a"
    w.mkdir()
    _copy(feature_world / "features", w / "features")
    shutil.copy(feature_world / "laid.safetensors", w / "laid.safetensors")
    monkeypatch.chdir(w)
    r = cli.invoke(["build-splits", "--id", "features", "--test", "features", "--laid", "laid.safetensors",
                    "--levels", "2", "--na-threshold", "1", "--out", "splits"])
    assert r.exit_code == 0, r.output
    view = manifests.read(w / "splits", kind="splits")
    images_root = str(feature_world / "images")
    assert view.test_root == view.id_root == images_root  # the feature set's own image root, absolute
    assert view.config["id"] == str(w / "features") and view.config["out"] == str(w / "splits")
    b = tmp_path / "b"  # another working directory with same-named folders: the manifest still names a's
    (b / "features").mkdir(parents=True)
    monkeypatch.chdir(b)
    assert manifests.read(w / "splits", kind="splits").id_features == str(w / "features")


# ------------------------------------------------------------------------------------------------ paths outside the root
@pytest.mark.parametrize("bad", ["../outside/x.JPEG", "/abs/x.JPEG", "n0/../../x.JPEG"])
def test_the_python_api_cannot_store_paths_outside_the_root(tmp_path, bad):
    from isood.science.grid import cell_table, edges_table
    from isood.stages.splits import write_splits

    images = pd.DataFrame({"path": ["n02084071/ok.JPEG", bad], "wnid": ["n02084071"] * 2, "d_sem": [0.1, 0.2],
                           "d_cov": [0.1, 0.2], "sem_level": [0, 0], "cov_level": [0, 0],
                           "cell": ["cov_0_sem_0"] * 2})
    with pytest.raises(BadInputError, match="absolute, '..' or control-character paths"):
        write_splits(tmp_path / "s", images=images, cells=cell_table(images["cov_level"], images["sem_level"], 1, 1),
                     edges=edges_table([0.0, 1.0], [0.0, 1.0]), config={}, argv=["test"])
    assert not (tmp_path / "s").exists()


def test_verify_and_every_reader_refuse_a_manifest_with_such_paths(cli, tmp_path):
    """A manifest whose images table was replaced (with consistent hashes) by one holding ``..``: verify names it
    and a stage reading it refuses it."""
    import hashlib

    from manifests.verify import content_hash

    root = tmp_path / "s"
    _splits(root)
    images = pd.read_parquet(root / "data/images.parquet")
    images.loc[0, "path"] = "../../etc/passwd"
    images.to_parquet(root / "data/images.parquet", index=False)
    data = (root / "data/images.parquet").read_bytes()

    def fix(meta):
        for rec in meta["files"]:
            if rec["path"] == "data/images.parquet":
                rec.update(sha256=hashlib.sha256(data).hexdigest(), bytes=len(data))
        meta["content_sha256"] = content_hash(meta["files"])

    _edit(root, fix)
    r = cli.invoke(["verify", root])
    assert r.exit_code == 1 and "../../etc/passwd" in r.output, r.output
    line = cli.one_line_error(cli.invoke(["export", "openood", root, "--out", tmp_path / "o"]))
    assert "fails verification" in line


# ------------------------------------------------------------------------------------------------ determinism
def test_one_seed_gives_one_content_hash(tmp_path):
    from isood.dev.demo import run_planted

    a = run_planted(tmp_path / "a", seed=3, progress=False).result.manifest
    b = run_planted(tmp_path / "b", seed=3, progress=False).result.manifest
    assert (a.root / "laid.safetensors").read_bytes() == (b.root / "laid.safetensors").read_bytes()
    assert a.content_sha256 == b.content_sha256
    data = [{r["path"]: r["sha256"] for r in m.meta["files"] if r["path"] != "README.md"} for m in (a, b)]
    assert data[0] == data[1]  # the card is derived (it quotes each run's --out), outside the content hash
    assert np.isfinite(a.meta["summary"]["laid_orthogonality_error"])


# ------------------------------------------------------------------------------------------------ full disk
def test_a_full_disk_while_streaming_names_the_file(cli, tmp_path):
    """guard: ``isood.core.files.naming`` around the streamed writes (``manifests.stream``: pyarrow and file
    writes raise without a file name) and ``manifests.output.public_path`` in the message"""
    import subprocess

    if os.geteuid() != 0:
        pytest.skip("a full disk is simulated with a tmpfs mount, which needs root")
    disk = tmp_path / "disk"
    disk.mkdir()
    r = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=64k", "tmpfs", str(disk)], capture_output=True, text=True)
    if r.returncode:
        pytest.skip(f"cannot mount a tmpfs here: {r.stderr.strip() or r.returncode}")
    try:
        release = tmp_path / "release" / "train"
        release.mkdir(parents=True)
        for c in range(2):
            for s in range(2):
                (release / f"cov_{c}_sem_{s}.txt").write_text(
                    "".join(f"n02084071/n02084071_{c}{s}{i:05d}.JPEG\n" for i in range(3000)))
        line = cli.one_line_error(cli.invoke(["import", "isood-lists", tmp_path / "release", "--levels", "2",
                                              "--out", disk / "out"]))
        assert os.strerror(28) in line and f"{disk}/out/" in line and ".isood-new" not in line, line
        assert not [p for p in disk.iterdir()]  # nothing half-written left
    finally:
        subprocess.run(["umount", "-l", str(disk)], capture_output=True)


# ------------------------------------------------------------------------------------------------ --verify
def test_verify_full_rehashes_what_fast_trusts_and_a_bad_mode_is_one_line(cli, feature_world, tmp_path):
    """``--verify fast`` trusts a large file whose size, mtime and inode are those it last verified; ``full``
    hashes it again. A mode that is neither is one line, for every command that reads manifests."""
    from manifests import verify
    from manifests.verify import FAST_HASH_BYTES

    feats = _copy(feature_world / "features", tmp_path / "features")
    shard = next(feats.glob("features-*.npy"))
    assert verify(feats, mode="fast").ok
    stat = shard.stat()
    data = bytearray(shard.read_bytes())
    data[-1] ^= 0xFF
    shard.write_bytes(bytes(data))
    os.utime(shard, ns=(stat.st_atime_ns, stat.st_mtime_ns))  # a change that keeps size and mtime
    assert not verify(feats, mode="full").ok
    assert verify(feats, mode="fast").ok is (stat.st_size > FAST_HASH_BYTES)  # small files are always hashed
    for args in (["splits", "clean", feature_world / "splits", "--audit", tmp_path / "a", "--out", tmp_path / "o"],
                 ["export", "openood", feature_world / "splits", "--out", tmp_path / "o"],
                 ["wordnet", "audit", feature_world / "splits", "--out", tmp_path / "o"],
                 ["build-splits", "--id", feats, "--test", feats, "--laid", feature_world / "laid.safetensors",
                  "--out", tmp_path / "o"]):
        line = cli.one_line_error(cli.invoke([*args, "--verify", "sometimes"]))
        assert "--verify 'sometimes'" in line and "fast or full" in line, (args, line)


def test_a_manifest_without_the_writers_record_owns_its_listed_files_only(cli, tmp_path):
    """guard: ``manifests.ownership.owned_paths``: beside a manifest.json without the writer's record (the
    pre-release layout: no record, no version marker) a file named like isood's bookkeeping is the user's, so a
    rewrite refuses with one line naming it and leaves it as it is."""
    root = tmp_path / "s"
    _splits(root)
    marker = root / json.loads((root / "manifest.json").read_text())["writer"]["own"][0]
    marker.unlink()
    _edit(root, lambda m: m.pop("writer"))
    stray = root / ".~file-stats-0123456789abcdef.parquet"
    stray.write_bytes(b"someone's data")
    line = cli.one_line_error(cli.invoke(["card", root]))
    assert "does not list" in line and stray.name in line, line
    assert stray.read_bytes() == b"someone's data"


def test_a_content_hash_that_covers_the_config_files_is_refused_with_one_line(cli, tmp_path):
    """guard: ``manifests.verify`` accepts one content hash, the one that leaves the derived card and config files
    out: a manifest.json whose ``content_sha256`` also covers its ``data/configs/`` files (the rule of the
    pre-release writer) is refused by ``isood verify`` and by ``isood card``, and left as it is."""
    import hashlib

    root = tmp_path / "s"
    _splits(root)

    def with_configs(m):  # the pre-release rule: every listed file but the card
        rows = sorted(f"{r['path']}\t{r['sha256']}" for r in m["files"] if r["path"] != "README.md")
        assert any(r.startswith("data/configs/") for r in rows)  # so the two rules differ
        m.update(content_sha256=hashlib.sha256("\n".join(rows).encode()).hexdigest())

    _edit(root, with_configs)
    before = (root / "manifest.json").read_bytes()
    result = cli.invoke(["verify", root])
    assert result.exit_code == 1 and "content_sha256 is not the hash of the listed files" in result.output
    line = cli.one_line_error(cli.invoke(["card", root]))
    assert "fails verification" in line and "content_sha256" in line
    assert (root / "manifest.json").read_bytes() == before
