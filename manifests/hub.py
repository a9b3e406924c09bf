"""Publish a verified manifest directory to the Hugging Face Hub as a dataset repository.

`publish(root, repo_id)`:

1. refuses a manifest that fails `manifests.verify` (naming every missing / extra / changed file) or that has no
   dataset card (README.md: run `isood card DIR`);
2. `HfApi.create_repo(repo_type="dataset", exist_ok=True, private=...)`;
3. uploads exactly the files manifest.json lists, plus manifest.json itself (`allow_patterns` = those paths,
   glob-escaped), but the feature shards (`manifests.card.is_feature_file`: build-splits' `features-id/` and
   `features-test/` sub-manifests, ~24 GB of test features at IS-OOD's size, and any `.npy` array) unless
   `include_features=True` (`--include-features`; a feature set, whose shards are its content, is refused
   without it; the dataset card says which files are feature shards, and the plan lists what it leaves out); a
   manifest holding its images (Syn-IS) is uploaded from a folder built for it (``manifests.hub_images``: its
   images also embedded in Parquet, the card's configs pointing there), in
   one commit whose message holds the dataset version. Leaving files out uploads a manifest.json that lists only
   what is uploaded (``published_manifest``: a downloaded copy verifies; a ``published`` record names what was
   left out and the full content hash), after the data, in its own commit. Folders above `LARGE_UPLOAD_BYTES` or `LARGE_UPLOAD_FILES`
   go in resumable batches (`upload_large_folder` where the installed huggingface_hub has it; newer releases
   batch inside `upload_folder`), and then manifest.json lands last in its own commit carrying the version, so
   the tagged revision is always complete;
4. `create_tag` with the dataset version (`v1.2.0`, or `tag=`) on that commit.

The token comes from huggingface_hub's usual sources (the `HF_TOKEN` variable or the `hf auth login` file), or,
with `token_from_env=True`, from `HF_TOKEN` only. It is handed to `HfApi` and nowhere else: it is never printed,
written or put into an error; exceptions from the Hub are re-raised as one-line `PublishError`s with every known
token string and anything shaped like one replaced by `***`, and without the original exception attached.

`api` is injectable (any object with the four `HfApi` methods used), so tests run at the API boundary offline.
A dry run (`dry_run=True`) lists the files and sizes that would be uploaded and touches no network; with `out=`
it also copies exactly those files there (a folder that verifies and loads like the original).
"""

from __future__ import annotations

import glob
import inspect
import json
import os
import re
import shutil
import tempfile
import weakref
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

from isood.core.errors import IsoodError
from isood.core.errors import one_line
from isood.core.files import TMP_PREFIX
from isood.core.inputs import is_inside
from manifests.card import CARD_FILE, is_feature_file
from manifests.hub_images import EMBEDDED_DIR, owns_images, stage_upload
from manifests.store import MANIFEST_FILE, read
from manifests.verify import content_hash, verify

LARGE_UPLOAD_BYTES = 2 * 1024**3  # 2 GiB: above this a single-commit upload is fragile; use resumable batches
LARGE_UPLOAD_FILES = 1_000  # the Hub advises against very large single commits; Syn-IS image sets exceed this
_TOKEN_RE = re.compile(r"hf_[A-Za-z0-9]{8,}")
_TOKEN_ENV = ("HF_TOKEN", "HUGGING_FACE_HUB_TOKEN")


class PublishError(IsoodError):
    """Publishing failed (bad repo id, verification, or a Hub error with any token scrubbed)."""


@dataclass
class PublishPlan:
    """What a publish uploads: every file (relative path, bytes), the commit message and the tag."""

    root: Path
    repo_id: str
    kind: str
    dataset_version: str
    files: list[tuple[str, int]]
    commit_message: str
    commit_description: str
    tag: str
    large: bool
    private: bool = False
    left_out: list[tuple[str, int]] = field(default_factory=list)  # feature shards not uploaded (path, bytes)
    manifest_bytes: bytes | None = None  # the manifest.json uploaded instead of the folder's (left-out files)
    staged: Any = None  # a folder built for the upload (``hub_images.stage_upload``): its finalizer removes it

    def close(self) -> None:
        """Remove the folder built for the upload, if any (also done when the plan is garbage-collected)."""
        if self.staged is not None:
            self.staged()

    @property
    def total_bytes(self) -> int:
        return sum(size for _, size in self.files)

    def lines(self) -> list[str]:
        width = max((len(f"{size:,}") for _, size in self.files), default=1)
        out = [f"{size:>{width},}  {path}" for path, size in self.files]
        out.append(f"{len(self.files)} files, {self.total_bytes:,} bytes -> dataset {self.repo_id} "
                   f"({'private' if self.private else 'public'}), tag {self.tag}"
                   + (", resumable batched upload" if self.large else ", one commit"))
        embedded = [path for path, _ in self.files if path.startswith(EMBEDDED_DIR + "/")]
        if embedded:
            out.append(f"images embedded in {len(embedded)} Parquet files under {EMBEDDED_DIR}/ (the card's configs "
                       "point there: the Hub's viewer and datasets show the images)")
        if self.left_out:
            out.append(self.left_out_line())
        return out

    def left_out_line(self) -> str:
        """What the plan leaves out, in one line ('' when nothing)."""
        if not self.left_out:
            return ""
        folders = sorted({p.split("/")[0] + "/" if "/" in p else p for p, _ in self.left_out})
        return (f"left out: {len(self.left_out)} feature files, {sum(s for _, s in self.left_out):,} bytes "
                f"({', '.join(folders[:4])}{', ...' if len(folders) > 4 else ''}); pass --include-features to "
                "upload them")


@dataclass
class PublishResult:
    plan: PublishPlan
    commit_oid: str | None = None
    commit_url: str | None = None
    calls: list[str] = field(default_factory=list)


def _known_tokens(extra: str | None = None) -> list[str]:
    found: list[str | None] = [extra] if extra else []
    found += [os.environ.get(name) for name in _TOKEN_ENV]
    try:
        from huggingface_hub import get_token

        found.append(get_token())
    except Exception:
        pass
    return sorted({t for t in found if t and len(t) >= 4}, key=len, reverse=True)


def scrub(text: str, tokens: list[str]) -> str:
    """`text` with every given token, and anything shaped like a Hugging Face token, replaced by ***."""
    for t in tokens:
        text = text.replace(t, "***")
    return _TOKEN_RE.sub("***", text)


def make_api(token: str | None = None) -> Any:
    """The real client; `token=None` lets huggingface_hub find it (HF_TOKEN or the login file)."""
    from huggingface_hub import HfApi

    return HfApi(token=token)


def plan(root: str | os.PathLike, repo_id: str, *, private: bool = False, tag: str | None = None,
         include_features: bool = False) -> PublishPlan:
    """Check the manifest and the repo id and say what would be uploaded (no network): every listed file but the
    feature shards (unless ``include_features``), and manifest.json."""
    root = Path(root)
    _check_repo_id(repo_id)
    report = verify(root)
    # huggingface_hub's own resume cache of an interrupted batched upload: ignored by the Hub, tolerated here
    report.extra = [x for x in report.extra if not x.startswith(".cache/huggingface/")]
    if not report.ok:
        problems = report.lines()
        raise PublishError(
            f"{root}: refusing to publish a manifest that fails verification ({len(problems)} problem(s): "
            + "; ".join(problems[:10]) + ("; ..." if len(problems) > 10 else "")
            + "); fix the directory or rewrite the manifest, then run `isood verify`"
        )
    m = read(root)
    listed = {rec["path"]: rec for rec in m.meta["files"]}
    if CARD_FILE not in listed:
        raise PublishError(f"{root}: no dataset card ({CARD_FILE}); run `isood card {root}` first so the Hub and "
                           "`datasets` see its configs")
    files = sorted((p, int(rec.get("bytes", m.path(p).stat().st_size))) for p, rec in listed.items())
    left_out = [] if include_features else [(p, s) for p, s in files if is_feature_file(p)]
    if any("/" not in p for p, _ in left_out):  # shards at the top: a feature set (isood extract), not a grid
        raise PublishError(f"{root} is a {m.kind!r} manifest whose feature shards are its content "
                           f"({len(left_out)} files, {sum(s for _, s in left_out):,} bytes); pass --include-features "
                           "to publish them")
    dropped = {p for p, _ in left_out}
    files = [(p, s) for p, s in files if p not in dropped]
    manifest_bytes = published_manifest(m.meta, left_out) if left_out else None
    upload_root = root
    if owns_images(m):  # Syn-IS: the images embedded in Parquet, in a folder built for the upload
        upload_root = Path(tempfile.mkdtemp(prefix=f"{TMP_PREFIX}publish-", dir=root.parent))
        try:
            files = stage_upload(m, files, upload_root, manifest_bytes=manifest_bytes)
        except BaseException:
            shutil.rmtree(upload_root, ignore_errors=True)
            raise
        manifest_bytes = None
    else:
        files.append((MANIFEST_FILE, len(manifest_bytes) if manifest_bytes else (root / MANIFEST_FILE).stat().st_size))
    version = m.dataset_version
    note = (m.meta.get("changelog") or [{}])[-1].get("note", "")
    large = sum(s for _, s in files) > LARGE_UPLOAD_BYTES or len(files) > LARGE_UPLOAD_FILES
    p = PublishPlan(
        root=upload_root, repo_id=repo_id, kind=m.kind, dataset_version=version, files=files,
        commit_message=f"isood {m.kind} manifest v{version}",
        commit_description=f"dataset version {version}; content sha256 {m.meta.get('content_sha256', '?')}"
        + (f"; {note}" if note else ""),
        tag=tag or f"v{version}", large=large, private=private, left_out=left_out, manifest_bytes=manifest_bytes,
    )
    if upload_root != root:  # the staged folder goes when the plan does
        p.staged = weakref.finalize(p, shutil.rmtree, upload_root, ignore_errors=True)
    return p


def published_manifest(meta: dict, left_out: list[tuple[str, int]]) -> bytes:
    """The manifest.json of a publish that leaves files out: the same manifest listing only what is uploaded (so
    a downloaded copy passes ``isood verify``), its ``content_sha256`` that of those files, and a ``published``
    record of what was left out and of the full manifest's content hash (version and changelog unchanged)."""
    dropped = {p for p, _ in left_out}
    out = dict(meta)
    out["files"] = [r for r in meta["files"] if r["path"] not in dropped]
    out["content_sha256"] = content_hash(out["files"])
    out["published"] = {"left_out_files": len(left_out), "left_out_bytes": int(sum(s for _, s in left_out)),
                        "left_out_folders": sorted({p.split("/")[0] for p, _ in left_out if "/" in p}),
                        "full_content_sha256": meta.get("content_sha256")}
    return (json.dumps(out, indent=2, sort_keys=False) + "\n").encode()


def _check_repo_id(repo_id: str) -> None:
    if not isinstance(repo_id, str) or repo_id.count("/") != 1:
        raise PublishError(f"--repo-id must be USER/NAME (one slash), got {repo_id!r}")
    try:
        from huggingface_hub.utils import validate_repo_id

        validate_repo_id(repo_id)
    except ImportError:  # pragma: no cover - huggingface_hub is a dependency
        pass
    except Exception as e:
        raise PublishError(f"--repo-id {repo_id!r} is not a valid Hub repository id: {one_line(e)}") from None


def _patterns(paths: list[str]) -> list[str]:
    """allow_patterns that match exactly these paths (fnmatch special characters escaped)."""
    return [glob.escape(p) for p in paths]


def check_publish_out(root: str | os.PathLike, out: str | os.PathLike) -> None:
    """Refuse an ``--out`` (the dry-run copy, or the folder of ``publish.json``) that is the manifest folder,
    inside it or holds it (links resolved): writing there would leave the manifest failing `isood verify`."""
    real_root, real_out = os.path.realpath(root), os.path.realpath(out)
    where = ("is" if real_out == real_root else "is inside" if is_inside(real_out, real_root)
             else "holds" if is_inside(real_root, real_out) else "")
    if where:
        raise PublishError(f"--out {out} {where} the manifest {root}: writing there would change it; pass a "
                           "folder outside it")


def copy_plan(p: PublishPlan, out: str | os.PathLike) -> Path:
    """Copy exactly the files of a plan into `out` (must be empty or absent, and outside the manifest): the
    folder that would be uploaded."""
    check_publish_out(p.root, out)
    out = Path(out)
    if out.exists() and any(not q.name.startswith(TMP_PREFIX) for q in out.iterdir()):  # not the --out lock
        raise PublishError(f"--out {out} is not empty; pass a new or empty folder for the dry-run copy")
    for rel, _ in p.files:
        dst = out / rel
        dst.parent.mkdir(parents=True, exist_ok=True)
        if rel == MANIFEST_FILE and p.manifest_bytes is not None:
            dst.write_bytes(p.manifest_bytes)
        else:
            shutil.copy2(p.root / rel, dst)
    return out


def _upload_in_batches(p: PublishPlan, api: Any, call: Callable[..., Any], echo: Callable[[str], None]) -> Any:
    """A large folder: the data files in resumable batches, then manifest.json in its own last commit (whose
    info is returned), so the tagged revision is always complete."""
    data = [path for path, _ in p.files if path != MANIFEST_FILE]
    if hasattr(api, "upload_large_folder"):
        echo(f"uploading {len(data)} files ({p.total_bytes:,} bytes) with upload_large_folder (resumable)")
        call("upload_large_folder", api.upload_large_folder, repo_id=p.repo_id, repo_type="dataset",
             folder_path=str(p.root), allow_patterns=_patterns(data))
    else:
        echo(f"uploading {len(data)} files ({p.total_bytes:,} bytes) with upload_folder (batched commits)")
        call("upload_folder", api.upload_folder, repo_id=p.repo_id, repo_type="dataset", folder_path=str(p.root),
             allow_patterns=_patterns(data), commit_message=f"{p.commit_message} (data)",
             commit_description=p.commit_description)
    # the upload is done: drop upload_large_folder's resume cache, else `isood verify` reports extra files
    shutil.rmtree(p.root / ".cache" / "huggingface", ignore_errors=True)
    try:
        (p.root / ".cache").rmdir()
    except OSError:
        pass
    echo(f"committing {MANIFEST_FILE} last: {p.commit_message}")
    return call("upload_file", api.upload_file, repo_id=p.repo_id, repo_type="dataset",
                path_or_fileobj=p.manifest_bytes if p.manifest_bytes is not None else str(p.root / MANIFEST_FILE),
                path_in_repo=MANIFEST_FILE, commit_message=p.commit_message,
                commit_description=p.commit_description)


def _tag_kwargs(p: PublishPlan, api: Any, commit_oid: str | None) -> dict[str, Any]:
    kwargs: dict[str, Any] = dict(tag=p.tag, tag_message=p.commit_message, repo_type="dataset")
    if commit_oid:
        kwargs["revision"] = commit_oid
    try:
        if "exist_ok" in inspect.signature(api.create_tag).parameters:
            kwargs["exist_ok"] = True  # republishing identical content keeps its tag
    except (TypeError, ValueError):
        pass
    return kwargs


def publish(
    root: str | os.PathLike,
    repo_id: str,
    *,
    private: bool = False,
    tag: str | None = None,
    dry_run: bool = False,
    token: str | None = None,
    token_from_env: bool = False,
    api: Any = None,
    echo: Callable[[str], None] = print,
    include_features: bool = False,
) -> PublishPlan | PublishResult:
    """Publish a verified manifest directory (see the module docstring). Returns the plan on a dry run."""
    p = plan(root, repo_id, private=private, tag=tag, include_features=include_features)
    if dry_run:
        return p
    try:
        return _upload(p, repo_id, private=private, token=token, token_from_env=token_from_env, api=api, echo=echo)
    finally:
        p.close()


def _upload(p: PublishPlan, repo_id: str, *, private: bool, token: str | None, token_from_env: bool, api: Any,
            echo: Callable[[str], None]) -> PublishResult:
    if token_from_env:
        token = os.environ.get("HF_TOKEN")
        if not token:
            raise PublishError("--token-from-env: the HF_TOKEN environment variable is not set")
    secrets = _known_tokens(token)
    result = PublishResult(plan=p)

    def call(what: str, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        result.calls.append(what)
        try:
            return fn(*args, **kwargs)
        except Exception as e:  # scrub: the message may echo headers or URLs carrying the token
            msg = one_line(scrub(f"{type(e).__name__}: {e}", secrets), limit=300)  # scrub before cutting
            raise PublishError(f"publishing {p.root} to {repo_id} failed at {what}: {msg}") from None

    if api is None:
        api = call("connecting", make_api, token)
    echo(f"creating dataset repo {repo_id} ({'private' if private else 'public'}, exist_ok)")
    call("create_repo", api.create_repo, repo_id, repo_type="dataset", exist_ok=True, private=private)
    if p.left_out:
        echo(p.left_out_line())
    paths = [path for path, _ in p.files]
    if p.large:
        info = _upload_in_batches(p, api, call, echo)
    elif p.manifest_bytes is None:
        echo(f"uploading {len(paths)} files ({p.total_bytes:,} bytes) in one commit: {p.commit_message}")
        info = call("upload_folder", api.upload_folder, repo_id=repo_id, repo_type="dataset", folder_path=str(p.root),
                    allow_patterns=_patterns(paths), commit_message=p.commit_message,
                    commit_description=p.commit_description)
    else:  # the data, then the manifest.json that lists only what was uploaded, last
        data = [path for path in paths if path != MANIFEST_FILE]
        echo(f"uploading {len(data)} files ({p.total_bytes:,} bytes): {p.commit_message} (data)")
        call("upload_folder", api.upload_folder, repo_id=repo_id, repo_type="dataset", folder_path=str(p.root),
             allow_patterns=_patterns(data), commit_message=f"{p.commit_message} (data)",
             commit_description=p.commit_description)
        echo(f"committing {MANIFEST_FILE} last: {p.commit_message}")
        info = call("upload_file", api.upload_file, repo_id=repo_id, repo_type="dataset",
                    path_or_fileobj=p.manifest_bytes, path_in_repo=MANIFEST_FILE, commit_message=p.commit_message,
                    commit_description=p.commit_description)
    result.commit_oid = getattr(info, "oid", None)
    result.commit_url = getattr(info, "commit_url", None)
    echo(f"tagging {p.tag}")
    call("create_tag", api.create_tag, repo_id, **_tag_kwargs(p, api, result.commit_oid))
    if result.commit_url:
        echo(f"published {repo_id} {p.tag}: {scrub(str(result.commit_url), secrets)}")
    else:
        echo(f"published {repo_id} {p.tag}")
    return result
