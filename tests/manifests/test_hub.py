import secrets
import traceback
from pathlib import Path
from types import SimpleNamespace

import pytest
from huggingface_hub.utils import filter_repo_objects
from typer.testing import CliRunner

import manifests
from isood.cli import app
from manifests import hub


class FakeApi:
    """Records every HfApi call with its arguments; can raise on a chosen method."""

    def __init__(self, fail_on=None, error=None, large=False):
        self.calls = []
        self.fail_on, self.error = fail_on, error
        self.commits = 0
        if large:
            self.upload_large_folder = self._upload_large_folder

    def _record(self, name, args, kwargs):
        self.calls.append((name, args, kwargs))
        if name == self.fail_on:
            raise self.error

    def _commit(self):
        self.commits += 1
        oid = f"{self.commits:040x}"
        return SimpleNamespace(oid=oid, commit_url=f"https://hub.example/commit/{oid}")

    def create_repo(self, *args, **kwargs):
        self._record("create_repo", args, kwargs)
        return "https://hub.example/datasets/" + args[0]

    def upload_folder(self, **kwargs):
        self._record("upload_folder", (), kwargs)
        return self._commit()

    def _upload_large_folder(self, **kwargs):
        self._record("upload_large_folder", (), kwargs)
        cache = Path(kwargs["folder_path"]) / ".cache" / "huggingface" / "upload"
        cache.mkdir(parents=True)  # what the real one leaves behind for resuming
        (cache / "x.metadata").write_text("state")

    def upload_file(self, **kwargs):
        self._record("upload_file", (), kwargs)
        return self._commit()

    def create_tag(self, repo_id, *, tag, tag_message=None, revision=None, repo_type=None, exist_ok=False):
        self._record("create_tag", (repo_id,), dict(tag=tag, tag_message=tag_message, revision=revision,
                                                    repo_type=repo_type, exist_ok=exist_ok))


def _names(api):
    return [c[0] for c in api.calls]


def _selected(root, patterns):
    """What huggingface_hub itself uploads from `root` given these allow_patterns."""
    present = sorted(p.relative_to(root).as_posix() for p in Path(root).rglob("*") if p.is_file())
    return sorted(filter_repo_objects(present, allow_patterns=patterns))


def _expected_files(root):
    m = manifests.read(root)
    return sorted([r["path"] for r in m.meta["files"]] + ["manifest.json"])


def test_publish_calls_create_repo_upload_and_tag_with_the_version(tmp_path, worlds):
    m = worlds.write_splits(tmp_path / "s")
    api = FakeApi()
    result = hub.publish(m.root, "alice/isood-splits", private=True, api=api, echo=lambda s: None)
    assert _names(api) == ["create_repo", "upload_folder", "create_tag"]
    _, args, kw = api.calls[0]
    assert args == ("alice/isood-splits",) and kw == {"repo_type": "dataset", "exist_ok": True, "private": True}
    _, _, up = api.calls[1]
    assert up["repo_id"] == "alice/isood-splits" and up["repo_type"] == "dataset"
    assert up["folder_path"] == str(m.root)
    assert "v1.0.0" in up["commit_message"] and m.meta["content_sha256"] in up["commit_description"]
    assert _selected(m.root, up["allow_patterns"]) == _expected_files(m.root)
    _, args, tag = api.calls[2]
    assert args == ("alice/isood-splits",)
    assert tag["tag"] == "v1.0.0" and tag["revision"] == result.commit_oid and tag["repo_type"] == "dataset"
    assert tag["exist_ok"] is True


def test_revision_overrides_the_tag_and_bumped_version_is_used(tmp_path, worlds):
    root = tmp_path / "s"
    worlds.write_splits(root)
    worlds.write_splits(root, cells={**worlds.PLANTED_CELLS, (1, 1): 30})
    api = FakeApi()
    hub.publish(root, "alice/x", api=api, echo=lambda s: None)
    assert api.calls[-1][2]["tag"] == "v1.1.0" and "v1.1.0" in api.calls[1][2]["commit_message"]
    assert api.calls[0][2]["private"] is False
    api = FakeApi()
    hub.publish(root, "alice/x", tag="paper-camera-ready", api=api, echo=lambda s: None)
    assert api.calls[-1][2]["tag"] == "paper-camera-ready"


@pytest.mark.parametrize("large_api", [True, False])
def test_large_folders_upload_in_batches_and_commit_manifest_last(tmp_path, worlds, monkeypatch, large_api):
    monkeypatch.setattr(hub, "LARGE_UPLOAD_FILES", 3)
    m = worlds.write_splits(tmp_path / "splits")
    api = FakeApi(large=large_api)
    result = hub.publish(m.root, "alice/splits", api=api, echo=lambda s: None)
    first = "upload_large_folder" if large_api else "upload_folder"
    assert _names(api) == ["create_repo", first, "upload_file", "create_tag"]
    data_patterns = api.calls[1][2]["allow_patterns"]
    assert _selected(m.root, data_patterns) == [p for p in _expected_files(m.root) if p != "manifest.json"]
    last = api.calls[2][2]
    assert last["path_in_repo"] == "manifest.json" and "v1.0.0" in last["commit_message"]
    assert api.calls[3][2]["revision"] == result.commit_oid
    assert manifests.verify(m.root).ok  # the resume cache was cleaned up


def test_failing_verification_refuses_before_any_call(tmp_path, worlds):
    m = worlds.write_splits(tmp_path / "s")
    p = m.root / "data/images.parquet"
    data = bytearray(p.read_bytes())
    data[100] ^= 0xFF
    p.write_bytes(bytes(data))
    (m.root / "lists/stray.txt").write_text("x")
    api = FakeApi()
    with pytest.raises(hub.PublishError, match=r"changed: data/images.parquet.*extra: lists/stray.txt|"
                                               r"extra: lists/stray.txt.*changed: data/images.parquet"):
        hub.publish(m.root, "alice/x", api=api, echo=lambda s: None)
    assert api.calls == []
    result = CliRunner().invoke(app, ["publish", str(m.root), "--repo-id", "alice/x", "--dry-run"])
    assert result.exit_code == 2 and "changed: data/images.parquet" in result.output


def test_manifest_without_card_and_bad_repo_id_are_refused(tmp_path, worlds):
    m = worlds.write_splits(tmp_path / "plain", card=False)
    with pytest.raises(hub.PublishError, match="isood card"):
        hub.publish(m.root, "alice/x", api=FakeApi(), echo=lambda s: None)
    good = worlds.write_splits(tmp_path / "s")
    for bad in ("no-slash", "a/b/c", "alice/bad name"):
        with pytest.raises(hub.PublishError, match="repo"):
            hub.publish(good.root, bad, api=FakeApi(), echo=lambda s: None)


def test_dry_run_lists_exactly_the_manifest_files_and_touches_no_network(tmp_path, worlds, monkeypatch):
    m = worlds.write_splits(tmp_path / "splits")

    def no_network(*a, **k):
        raise AssertionError("dry run must not build an HfApi")

    monkeypatch.setattr(hub, "make_api", no_network)
    p = hub.publish(m.root, "alice/splits", dry_run=True, echo=lambda s: None)
    expected = {r["path"]: r["bytes"] for r in m.meta["files"]}
    expected["manifest.json"] = (m.root / "manifest.json").stat().st_size
    assert dict(p.files) == expected
    assert all((m.root / f).stat().st_size == b for f, b in p.files)

    out = tmp_path / "staged"
    result = CliRunner().invoke(app, ["publish", str(m.root), "--repo-id", "alice/splits", "--dry-run", "--out",
                                      str(out)])
    assert result.exit_code == 0, result.output
    listed = [line.split()[-1] for line in result.stdout.splitlines() if line.strip() and "->" not in line
              and not line.startswith("dry run")]
    assert sorted(listed) == sorted(expected)
    assert f"{len(expected)} files, {sum(expected.values()):,} bytes" in result.stdout
    staged = sorted(q.relative_to(out).as_posix() for q in out.rglob("*") if q.is_file())
    assert staged == sorted(expected)
    assert manifests.verify(out).ok


def test_token_never_reaches_output_files_or_errors(tmp_path, worlds, monkeypatch, capfd):
    token = "hf_" + secrets.token_hex(16)
    monkeypatch.setenv("HF_TOKEN", token)
    m = worlds.write_splits(tmp_path / "s")
    error = RuntimeError(f"401 Client Error for url https://hub.example/api?token={token}\n"
                         f"Authorization: Bearer {token}")
    api = FakeApi(fail_on="upload_folder", error=error)
    seen = {}

    def fake_make_api(tok=None):
        seen["token"] = tok
        return api

    monkeypatch.setattr(hub, "make_api", fake_make_api)
    receipt = tmp_path / "receipt"
    result = CliRunner().invoke(app, ["publish", str(m.root), "--repo-id", "alice/x", "--token-from-env",
                                      "--out", str(receipt)])
    assert seen["token"] == token  # the token was really used ...
    assert result.exit_code == 2
    assert "upload_folder" in result.output and "401 Client Error" in result.output and "***" in result.output
    captured = capfd.readouterr()
    for text in (result.stdout, result.stderr, result.output, captured.out, captured.err):
        assert token not in text  # ... and never shown
    for f in tmp_path.rglob("*"):
        if f.is_file():
            assert token.encode() not in f.read_bytes(), f

    # the exception itself: scrubbed message, no original exception attached, clean traceback
    with pytest.raises(hub.PublishError) as info:
        hub.publish(m.root, "alice/x", token_from_env=True, api=FakeApi("create_tag", error), echo=print)
    e = info.value
    assert token not in str(e) and token not in repr(e)
    assert e.__cause__ is None and e.__suppress_context__
    assert token not in "".join(traceback.format_exception(e))
    assert token not in capfd.readouterr().out


def test_any_configured_token_is_scrubbed_even_without_hf_prefix(tmp_path, worlds, monkeypatch):
    odd = "sekrit-" + secrets.token_hex(8)
    monkeypatch.setenv("HF_TOKEN", odd)
    m = worlds.write_splits(tmp_path / "s")
    with pytest.raises(hub.PublishError) as info:
        hub.publish(m.root, "alice/x", api=FakeApi("create_repo", ValueError(f"bad token {odd}")), echo=print)
    assert odd not in str(info.value) and "bad token ***" in str(info.value)


def test_token_from_env_without_hf_token_is_a_clear_error(tmp_path, worlds, monkeypatch):
    monkeypatch.delenv("HF_TOKEN", raising=False)
    m = worlds.write_splits(tmp_path / "s")
    result = CliRunner().invoke(app, ["publish", str(m.root), "--repo-id", "alice/x", "--token-from-env"])
    assert result.exit_code == 2 and "HF_TOKEN" in result.output and "Traceback" not in result.output


@pytest.mark.parametrize("large", [False, True])
def test_recorded_calls_fit_the_real_hfapi_signatures(tmp_path, worlds, monkeypatch, large):
    """The fake must not hide an API mismatch: bind every recorded call to the installed HfApi's signature."""
    import inspect

    from huggingface_hub import HfApi

    if large:
        monkeypatch.setattr(hub, "LARGE_UPLOAD_FILES", 3)
    m = worlds.write_syn_is(tmp_path / "syn")
    api = FakeApi(large=hasattr(HfApi, "upload_large_folder"))
    hub.publish(m.root, "alice/syn", api=api, echo=lambda s: None)
    assert len(api.calls) == (4 if large else 3)
    for name, args, kwargs in api.calls:
        inspect.signature(getattr(HfApi, name)).bind(None, *args, **kwargs)  # raises TypeError on a mismatch
