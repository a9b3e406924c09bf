"""The bad-input matrix, rows "manifests": every command that reads a manifest, given a broken one, through the CLI.

Breakages (each applied to a copy of a manifest written by the real writer of its kind):

| row            | what is wrong                                        | guard                                            |
|----------------|------------------------------------------------------|--------------------------------------------------|
| dotdot         | a table path ``../data/<t>.parquet`` in manifest.json | ``manifests.paths.check_relative`` ('..' part), via ``store._validate`` |
| absolute       | a table path ``/tmp/elsewhere/<t>.parquet``          | ``manifests.paths.check_relative`` (absolute), via ``store._validate`` |
| future_major   | ``schema.version`` ``2.0``                           | ``manifests.store._validate`` (major version)     |
| truncated      | the main table's Parquet file cut in half            | ``manifests.store.read`` (footer read per table); verify: sha256 ``changed`` |
| missing_file   | the main table's Parquet file deleted                | ``manifests.store.read`` (footer read per table); verify: ``missing`` |
| missing_entry  | the main table gone from manifest.json and disk      | ``manifests.schema.check_schema`` (required table); verify: ``verify`` schema check |
| wrong_kind     | a manifest of another kind (class-filter as --splits) | ``manifests.schema.expect_kind``                  |

Expected (README "Errors"): exit status 2, one line on stderr naming the manifest and the offending value (path,
version, table, kind), no traceback, nothing written (no ``--out``, the input untouched). ``isood verify``
exits 1 naming the files when files do not match manifest.json (truncated, missing, a required table absent),
and 2 with one line when manifest.json itself cannot be trusted (unsafe path, future schema).
"""

from __future__ import annotations

import hashlib
import json
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import numpy as np
import pandas as pd
import pytest
from typer.testing import CliRunner

from isood.cli import app

# ------------------------------------------------------------------------------------------------ the world
ID_WNIDS = ["n01440764", "n01443537"]  # tench, goldfish (ImageNet-1K)
OOD_WNIDS = ["n02084071", "n04399382"]  # dog (a hypernym of 1K classes), teddy bear


def _planted_images() -> pd.DataFrame:
    """path, wnid, shifts, levels and cells of 24 planted test images on a 2 x 2 grid."""
    from isood.science.grid import cell_name

    rows = []
    for c in range(2):
        for s in range(2):
            for i in range(6):
                w = (ID_WNIDS if s == 0 else OOD_WNIDS)[i % 2]
                rows.append({"path": f"{w}/{w}_c{c}s{s}_{i}.png", "wnid": w, "d_sem": 0.25 + 0.5 * s + 0.01 * i,
                             "d_cov": 0.25 + 0.5 * c + 0.01 * i, "sem_level": s, "cov_level": c,
                             "cell": cell_name(c, s)})
    return pd.DataFrame(rows)


def _write_splits(root: Path) -> None:
    from isood.science.grid import cell_table, edges_table
    from isood.stages.splits import write_splits

    images = _planted_images()
    write_splits(root, images=images, cells=cell_table(images["cov_level"], images["sem_level"], 2, 5),
                 edges=edges_table([0.0, 0.5, 1.0], [0.0, 0.5, 1.0]), argv=["isood", "build-splits"],
                 config={"n_levels": 2, "na_threshold": 5, "test_root": str(root.parent / "test")})


def _write_syn(root: Path) -> None:
    from isood.stages.syn import write_syn_manifest
    from isood.stages.syn.steps import rejected_rows
    from isood.science.grid import edges_table
    from isood.core.files import sha256_bytes

    images = _planted_images().head(10)
    n = len(images)
    prompts = pd.DataFrame({"prompt_id": [f"p{i:03d}" for i in range(n)], "style": "watercolor",
                            "wnid": images["wnid"], "label": [f"thing {i}" for i in range(n)],
                            "prompt": [f"a watercolor of thing {i}" for i in range(n)], "negative_prompt": "",
                            **{c: images[c] for c in ("d_sem", "d_cov", "sem_level", "cov_level", "cell")},
                            "selected": True})
    blobs = {f"images/watercolor/p{i:03d}_0.png": f"PNG-{i}".encode() for i in range(n)}
    for rel, data in blobs.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_bytes(data)
    table = prompts.drop(columns="selected").assign(path=list(blobs), image_index=0, seed=np.arange(n),
                                                    sha256=[sha256_bytes(b) for b in blobs.values()])
    write_syn_manifest(root, images=table, prompts=prompts, edges=edges_table([0.0, 0.5, 1.0], [0.0, 0.5, 1.0]),
                       rejected=rejected_rows(prompts.iloc[:0], "prompt"),
                       config={"n_levels": 2, "na_threshold": 5}, argv=["isood", "generate-syn"])


@pytest.fixture(scope="module")
def world(tmp_path_factory, tiny_images, tiny_clip_spec):
    """One good manifest of every kind a command reads, each written by its real writer, plus the small inputs
    the commands need to get as far as reading it."""
    from isood.features.featurestore import extract_features
    from isood.science.laid import LAID
    from isood.science.simulate import random_orthogonal
    from isood.stages.extract import ExtractOptions, run_extract
    from isood.stages.wordnet.jobs import run_audit, run_filter

    root = tmp_path_factory.mktemp("manifest-rows")
    _write_splits(root / "splits")
    _write_syn(root / "syn")
    (root / "candidates.txt").write_text("n00288000\nn02084071\nn02085620\nn04399382\n")
    run_filter(str(root / "candidates.txt"), "1k", out=root / "class-filter", argv=["isood", "wordnet", "filter"])
    run_audit(root / "splits", "1k", out=root / "audit", argv=["isood", "wordnet", "audit"])
    extract_features(tiny_images, tiny_clip_spec, root / "features", batch_size=8, device="cpu", progress=False,
                     argv=["isood", "extract"])
    for i in range(2):
        run_extract(ExtractOptions(images=tiny_images, clip=tiny_clip_spec, out=root / f"part{i}", batch_size=8,
                                   shard_size=4, device="cpu", num_shards=2, shard_index=i, progress=False),
                    argv=["isood", "extract"])
    LAID(random_orthogonal(32, seed=1)).save(root / "laid.safetensors")
    (root / "labels.txt").write_text("tench\ngoldfish\nteddy bear\n")
    (root / "id-train").mkdir()
    return root


# ------------------------------------------------------------------------------------------------ breakages
def _meta(root: Path) -> dict:
    return json.loads((root / "manifest.json").read_text())


def _save_meta(root: Path, meta: dict) -> None:
    (root / "manifest.json").write_text(json.dumps(meta, indent=2) + "\n")


def _main_table(root: Path) -> str:
    """The table a command cannot do without: the kind's first required table."""
    from manifests.schema import kind_spec

    spec = kind_spec(_meta(root)["kind"])
    return next(name for name, t in spec.tables.items() if not t.optional)


def _repath(root: Path, new: str) -> str:
    meta, table = _meta(root), _main_table(root)
    old = meta["tables"][table]["path"]
    meta["tables"][table]["path"] = new.format(old=old, table=table)
    for rec in meta["files"]:
        if rec["path"] == old:
            rec["path"] = meta["tables"][table]["path"]
    _save_meta(root, meta)
    return meta["tables"][table]["path"]


def dotdot(root: Path) -> str:
    return _repath(root, "../{old}")


def absolute(root: Path) -> str:
    return _repath(root, "/tmp/elsewhere/{table}.parquet")


def future_major(root: Path) -> str:
    meta = _meta(root)
    meta["schema"]["version"] = "2.0"
    _save_meta(root, meta)
    return "2.0"


def truncated(root: Path) -> str:
    table = _main_table(root)
    f = root / _meta(root)["tables"][table]["path"]
    data = f.read_bytes()
    f.write_bytes(data[: len(data) // 2])
    return table


def missing_file(root: Path) -> str:
    table = _main_table(root)
    (root / _meta(root)["tables"][table]["path"]).unlink()
    return table


def missing_entry(root: Path) -> str:
    meta, table = _meta(root), _main_table(root)
    rel = meta["tables"].pop(table)["path"]
    meta["files"] = [r for r in meta["files"] if r["path"] != rel]
    _save_meta(root, meta)
    (root / rel).unlink()
    return table


BREAKAGES: dict[str, Callable[[Path], str]] = {
    f.__name__: f for f in (dotdot, absolute, future_major, truncated, missing_file, missing_entry)}
WRONG_KIND = "wrong_kind"


# ------------------------------------------------------------------------------------------------ commands
@dataclass(frozen=True)
class Reader:
    """A command reading a manifest of ``kind``; ``wrong``: the manifest given instead for the wrong-kind row
    (None: the command takes any kind); ``args(world, bad, out)``: its command line."""

    kind_dir: str
    wrong: str | None
    args: Callable[[Path, Path, Path], list[str]]
    file_exit: int = 2  # exit status for files not matching manifest.json (verify: 1)


def _evaluate(w: Path, *extra: str) -> list[str]:
    return ["evaluate", "--id-test", str(w / "id-train"), "--id-train", str(w / "id-train"), *extra]


READERS: dict[str, Reader] = {
    "evaluate --splits": Reader("splits", "class-filter", lambda w, b, o: _evaluate(w, "--splits", str(b), "--out", str(o))),
    "evaluate --syn": Reader("syn", "splits", lambda w, b, o: _evaluate(
        w, "--splits", str(w / "splits"), "--syn", str(b), "--out", str(o))),
    "evaluate --leak-audit": Reader("audit", "splits", lambda w, b, o: _evaluate(
        w, "--splits", str(w / "splits"), "--leak-audit", str(b), "--out", str(o))),
    "generate-syn --splits": Reader("splits", "class-filter", lambda w, b, o: [
        "generate-syn", "--labels", str(w / "labels.txt"), "--splits", str(b), "--prompts-only", "--out", str(o)]),
    "generate-syn --labels": Reader("class-filter", "splits", lambda w, b, o: [
        "generate-syn", "--labels", str(b), "--id-features", str(w / "features"), "--prompts-only", "--out", str(o)]),
    "build-splits --class-filter": Reader("class-filter", "splits", lambda w, b, o: [
        "build-splits", "--id", str(w / "features"), "--test", str(w / "features"), "--laid",
        str(w / "laid.safetensors"), "--class-filter", str(b), "--out", str(o)]),
    "build-splits --id": Reader("features", "splits", lambda w, b, o: [
        "build-splits", "--id", str(b), "--test", str(w / "features"), "--laid", str(w / "laid.safetensors"),
        "--out", str(o)]),
    "build-splits --labels": Reader("class-filter", "splits", lambda w, b, o: [
        "build-splits", "--id", str(w / "features"), "--test", str(w / "features"), "--clip", "ViT-B-32:openai",
        "--labels", str(b), "--out", str(o)]),
    "export openood": Reader("splits", "class-filter", lambda w, b, o: ["export", "openood", str(b), "--out", str(o)]),
    "splits clean SPLITS": Reader("splits", "class-filter", lambda w, b, o: [
        "splits", "clean", str(b), "--audit", str(w / "audit"), "--out", str(o)]),
    "splits clean --audit": Reader("audit", "splits", lambda w, b, o: [
        "splits", "clean", str(w / "splits"), "--audit", str(b), "--out", str(o)]),
    "merge": Reader("part0", "features", lambda w, b, o: ["merge", str(b), str(w / "part1"), "--out", str(o)]),
    "publish --dry-run": Reader("splits", None, lambda w, b, o: [
        "publish", str(b), "--repo-id", "someone/isood-test", "--dry-run", "--out", str(o)]),
    "card": Reader("features", None, lambda w, b, o: ["card", str(b)]),
    "wordnet audit": Reader("splits", None, lambda w, b, o: ["wordnet", "audit", str(b), "--out", str(o)]),
    "verify": Reader("splits", None, lambda w, b, o: ["verify", str(b)], file_exit=1),
}

CASES = [pytest.param(cmd, brk, id=f"{cmd}-{brk}") for cmd, r in READERS.items()
         for brk in [*BREAKAGES, *([WRONG_KIND] if r.wrong else [])]]


def _tree(root: Path) -> dict[str, str]:
    return {p.relative_to(root).as_posix(): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(root.rglob("*")) if p.is_file()}


def _invoke(args: list[str]):
    import torch

    torch.set_num_threads(1)
    return CliRunner().invoke(app, args)


@pytest.mark.parametrize("command, breakage", CASES)
def test_a_broken_manifest_is_refused_in_one_line(world, tmp_path, command, breakage):
    reader = READERS[command]
    bad = tmp_path / "given"
    if breakage == WRONG_KIND:
        shutil.copytree(world / reader.wrong, bad)
        token = json.loads((bad / "manifest.json").read_text())["kind"]
    else:
        shutil.copytree(world / reader.kind_dir, bad)
        token = BREAKAGES[breakage](bad)
    before = _tree(bad)
    out = tmp_path / "out"
    r = _invoke(reader.args(world, bad, out))

    assert "Traceback" not in r.output and (r.exception is None or isinstance(r.exception, SystemExit)), r.output
    file_level = breakage in ("truncated", "missing_file", "missing_entry")
    expected = reader.file_exit if file_level else 2
    assert r.exit_code == expected, r.output
    if expected == 2:  # one line on stderr naming the manifest and the offending value
        lines = [ln for ln in r.stderr.splitlines() if ln.strip()]
        assert len(lines) == 1, r.stderr
        line = " ".join(lines[0].split())
        assert str(bad) in line and token in line, line
    else:  # verify: one line per problem on stdout, naming the file (or the table the kind requires)
        prefix = {"truncated": "changed: ", "missing_file": "missing: ", "missing_entry": "schema: "}[breakage]
        problems = [ln for ln in r.stdout.splitlines() if ln.startswith(prefix)]
        assert len(problems) == 1 and token in problems[0], r.stdout
        assert f"FAILED {bad}" in r.stdout, r.stdout
    assert not out.exists()
    assert _tree(bad) == before  # the input is left as it was
