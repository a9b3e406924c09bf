import json

import pandas as pd
import pytest
from typer.testing import CliRunner

import manifests
from isood.cli import app
from isood.core.errors import ManifestError
from manifests.schema import FLOAT, STRING, KindSpec, TableSpec, register_kind

register_kind(KindSpec("test", writer="tests/manifests/test_store.py",
                       tables={"rows": TableSpec({"path": STRING, "d_sem": FLOAT}, paths=("path",))}))


def _table(n=5, shift=0.0):
    return pd.DataFrame({"path": [f"n0000000{i}/img_{i}.JPEG" for i in range(n)], "d_sem": [i / 10 + shift for i in range(n)]})


def _write(root, **kw):
    args = dict(kind="test", tables={"rows": _table()}, config={"levels": 8}, files={"lists/a.txt": "x\ny\n"})
    args.update(kw)
    return manifests.write_manifest(root, **args)


def test_round_trip_records_hashes_counts_and_config(tmp_path):
    m = _write(tmp_path / "m", inputs=[manifests.input_record("ids", sha256="ab" * 32)])
    again = manifests.read(tmp_path / "m")
    assert again.kind == "test" and again.dataset_version == "1.0.0"
    assert again.meta["tables"]["rows"]["rows"] == 5
    assert again.meta["command"]["config"] == {"levels": 8}
    assert {f["path"] for f in again.meta["files"]} == {"data/rows.parquet", "lists/a.txt"}
    assert again.frame("rows").equals(_table())
    assert manifests.verify(m.root).ok


def test_parquet_is_byte_identical_for_identical_input(tmp_path):
    a = _write(tmp_path / "a")
    b = _write(tmp_path / "b")
    assert (a.root / "data/rows.parquet").read_bytes() == (b.root / "data/rows.parquet").read_bytes()


def test_verify_names_flipped_missing_and_extra_files(tmp_path):
    m = _write(tmp_path / "m")
    p = m.root / "data/rows.parquet"
    data = bytearray(p.read_bytes())
    data[len(data) // 2] ^= 0x01
    p.write_bytes(bytes(data))
    (m.root / "lists/a.txt").unlink()
    (m.root / "lists/intruder.txt").write_text("hello")
    report = manifests.verify(m.root)
    assert report.changed == ["data/rows.parquet"]
    assert report.missing == ["lists/a.txt"]
    assert report.extra == ["lists/intruder.txt"]

    result = CliRunner().invoke(app, ["verify", str(m.root)])
    assert result.exit_code == 1
    assert "changed: data/rows.parquet" in result.output and "missing: lists/a.txt" in result.output
    assert "extra: lists/intruder.txt" in result.output


@pytest.mark.parametrize("bad", ["../escape.txt", "/etc/passwd", "lists/../../x.txt"])
def test_escaping_paths_are_refused_on_write(tmp_path, bad):
    with pytest.raises(ManifestError, match="absolute|escapes"):
        _write(tmp_path / "m", files={bad: "x"})


def test_escaping_paths_are_refused_on_read(tmp_path):
    m = _write(tmp_path / "m")
    meta = json.loads((m.root / "manifest.json").read_text())
    meta["files"][0]["path"] = "../outside.parquet"
    (m.root / "manifest.json").write_text(json.dumps(meta))
    with pytest.raises(ManifestError, match="escapes the manifest root"):
        manifests.read(m.root)


def test_unknown_major_schema_version_is_refused_with_clear_message(tmp_path):
    m = _write(tmp_path / "m")
    meta = json.loads((m.root / "manifest.json").read_text())
    meta["schema"]["version"] = "2.0"
    (m.root / "manifest.json").write_text(json.dumps(meta))
    with pytest.raises(ManifestError, match="schema version '2.0' is not supported"):
        manifests.read(m.root)
    meta["schema"]["version"] = "1.7"  # a newer minor of the same major stays readable
    (m.root / "manifest.json").write_text(json.dumps(meta))
    assert manifests.read(m.root).kind == "test"


def test_dataset_version_bumps_on_content_change_only(tmp_path):
    root = tmp_path / "m"
    _write(root)
    same = _write(root)
    assert same.dataset_version == "1.0.0" and len(same.meta["changelog"]) == 1
    changed = _write(root, tables={"rows": _table(shift=1.0)}, note="shifted")
    assert changed.dataset_version == "1.1.0"
    assert changed.meta["changelog"][-1]["note"] == "shifted"


def test_rewrite_removes_files_the_old_manifest_owned(tmp_path):
    root = tmp_path / "m"
    _write(root, files={"lists/a.txt": "x", "lists/b.txt": "y"})
    m = _write(root, files={"lists/a.txt": "x"})
    assert not (root / "lists/b.txt").exists()
    assert manifests.verify(m.root).ok


def test_interrupted_write_leaves_no_manifest_json(tmp_path, monkeypatch):
    root = tmp_path / "m"
    _write(root)

    def boom(*a, **k):
        raise RuntimeError("killed")

    monkeypatch.setattr(manifests.store, "parquet_bytes", boom)
    with pytest.raises(RuntimeError):
        _write(root)
    with pytest.raises(ManifestError, match="unfinished write"):
        manifests.read(root)


def test_written_files_are_world_readable_like_plain_files(tmp_path):
    m = _write(tmp_path / "m")
    for rel in ("manifest.json", "data/rows.parquet", "lists/a.txt"):
        assert (m.root / rel).stat().st_mode & 0o044 == 0o044, rel
