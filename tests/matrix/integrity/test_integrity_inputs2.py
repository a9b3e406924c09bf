"""Commands that wrote into their inputs, empty job-array parts, `isood card`'s own job, and the tracebacks and
rough edges of evaluate / generate-syn / build-splits: each row is one line and exit 2 before the expensive work
(or, for the broken ones, now works), checked against the stages' own writers and readers.
"""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from PIL import Image

import manifests
from isood.core.errors import BadInputError

W = "n01440764"


def _png(path: Path, value: int = 90) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    Image.fromarray(np.full((8, 8, 3), value, np.uint8)).save(path)


def _splits(root: Path, test_root: Path, n: int = 2) -> Path:
    """A 1 x 1 splits manifest of ``n`` images under ``test_root`` (the stage's writer, with its card)."""
    from isood.science.grid import cell_table, edges_table
    from isood.stages.splits import write_splits

    for i in range(n):
        _png(test_root / W / f"{i}.png", 40 * i)
    images = pd.DataFrame([{"path": f"{W}/{i}.png", "wnid": W, "d_sem": 0.1, "d_cov": 0.1, "sem_level": 0,
                            "cov_level": 0, "cell": "cov_0_sem_0"} for i in range(n)])
    write_splits(root, images=images, cells=cell_table(images["cov_level"], images["sem_level"], 1, 1),
                 edges=edges_table([0.0, 1.0], [0.0, 1.0]), argv=["test"],
                 config={"test_root": str(test_root), "n_levels": 1, "na_threshold": 1})
    return root


def _files(folder: Path) -> set[str]:
    return {p.relative_to(folder).as_posix() for p in folder.rglob("*")}


# ============================================================================ commands that write into inputs
@pytest.mark.parametrize("where", ["inside", "same"])
@pytest.mark.parametrize("dry", [True, False])
def test_publish_out_inside_its_manifest_is_refused_and_the_manifest_stays_whole(where, dry, cli, tmp_path):
    m = _splits(tmp_path / "m", tmp_path / "test")
    before = _files(m)
    out = m / "sub" if where == "inside" else m
    line = cli.one_line_error(cli.invoke(["publish", m, "--repo-id", "user/name", *(["--dry-run"] if dry else []),
                                          "--out", out]))
    assert "--out" in line and "manifest" in line
    assert _files(m) == before and manifests.verify(m).ok
    assert not any(p.name.startswith(".~") for p in tmp_path.iterdir())  # no lock file left beside it either


def test_evaluate_out_inside_the_test_root_a_manifest_names_is_refused_before_work(cli, tmp_path):
    m = _splits(tmp_path / "m", tmp_path / "test")
    _png(tmp_path / "ids" / W / "a.png")
    before = _files(tmp_path / "test")
    line = cli.one_line_error(cli.invoke(["evaluate", "--splits", m, "--id-test", tmp_path / "ids", "--model",
                                          "test_resnet", "--detectors", "msp", "--out", tmp_path / "test" / "ev",
                                          "--cache-dir", tmp_path / "cache"]))
    assert "--out" in line and str(tmp_path / "test") in line
    assert _files(tmp_path / "test") == before and not (tmp_path / "cache").exists()


# ============================================================================ empty job-array parts
@pytest.fixture(scope="module")
def tiny_sdxl(tmp_path_factory):
    import torch

    from isood.dev.tiny_models import build_tiny_sdxl

    torch.set_num_threads(1)
    folder = tmp_path_factory.mktemp("tiny_sdxl")
    build_tiny_sdxl().save_pretrained(folder)
    return f"local-dir:{folder}"


def _syn(syn_inputs_factory, tiny_clip_spec, tiny_sdxl, tmp_path, out, **kw):
    from isood.stages.syn import SynOptions, run_generate_syn

    inputs = syn_inputs_factory(tmp_path / "inputs") if not (tmp_path / "inputs").exists() else \
        {"labels": tmp_path / "inputs" / "labels.txt", "laid": tmp_path / "inputs" / "laid.safetensors",
         "id_features": tmp_path / "inputs" / "id"}
    opts = SynOptions(out=str(out), styles="sdxl:photographic,anime", labels=str(inputs["labels"]),
                      clip=tiny_clip_spec, laid=str(inputs["laid"]), id_features=str(inputs["id_features"]),
                      per_cell=1, images_per_prompt=1, pipeline=tiny_sdxl, size=64, steps=1, batch_size=64, seed=0,
                      device="cpu", levels=2, na_threshold=1, progress=False, **kw)
    return run_generate_syn(opts)


def test_generate_syn_empty_part_writes_and_merges(syn_inputs_factory, tiny_clip_spec, tiny_sdxl, tmp_path):
    """One pipeline batch over two tasks: task 1 generates nothing; its part is written and the merge equals the
    single run (content hash)."""
    from isood.stages.syn import KIND, merge_parts
    from manifests.parts import read_parts

    single = _syn(syn_inputs_factory, tiny_clip_spec, tiny_sdxl, tmp_path, tmp_path / "single").manifest
    for i in (0, 1):
        _syn(syn_inputs_factory, tiny_clip_spec, tiny_sdxl, tmp_path, tmp_path / f"p{i}", num_shards=2, shard_index=i)
    empty = manifests.read(tmp_path / "p1")
    assert len(empty.frame("images")) == 0 and manifests.verify(empty.root).ok
    parts, kind, config = read_parts([tmp_path / "p1", tmp_path / "p0"])
    assert kind == KIND
    merged = merge_parts(parts, tmp_path / "merged", config)
    assert merged.meta["content_sha256"] == single.meta["content_sha256"]


def test_extract_empty_part_writes_and_merges(cli, tiny_images, tiny_clip_spec, tmp_path):
    base = ["extract", "--images", tiny_images, "--clip", tiny_clip_spec, "--device", "cpu", "--workers", "0",
            "--shard-size", "100000"]
    for i in (0, 1):
        r = cli.invoke([*base, "--out", tmp_path / f"p{i}", "--num-shards", "2", "--shard-index", str(i)])
        assert r.exit_code == 0, r.output
    assert manifests.read(tmp_path / "p1").meta["summary"]["shards"] == 0
    r = cli.invoke(["merge", tmp_path / "p1", tmp_path / "p0", "--out", tmp_path / "m"])
    assert r.exit_code == 0, r.output
    assert manifests.verify(tmp_path / "m").ok


def test_every_stage_that_takes_num_shards_has_an_empty_part_row():
    from isood.cli.options import COMMANDS
    from isood.core.shared_options import JobArrayFields

    sharded = {" ".join(w) for w, cls in COMMANDS if issubclass(cls, JobArrayFields)}
    rows = {"generate-syn": test_generate_syn_empty_part_writes_and_merges,
            "extract": test_extract_empty_part_writes_and_merges}
    assert sharded == set(rows)


# ============================================================================ isood card: its own job
@pytest.mark.parametrize("lost", ["README.md", "configs"])
def test_card_rebuilds_a_missing_card_or_config_file(lost, cli, tmp_path):
    m = _splits(tmp_path / "m", tmp_path / "test")
    listed = {r["path"]: r["sha256"] for r in manifests.read(m).meta["files"]}
    configs = [p for p in listed if p.startswith("data/configs/")]
    assert configs
    gone = ["README.md"] if lost == "README.md" else configs
    for p in gone:
        (m / p).unlink()
    assert not manifests.verify(m).ok
    r = cli.invoke(["card", m])
    assert r.exit_code == 0, r.output
    assert manifests.verify(m).ok
    after = {r["path"]: r["sha256"] for r in manifests.read(m).meta["files"]}
    assert set(after) == set(listed) and (m / "README.md").is_file()
    # the tables and config copies byte for byte (the card may note the rewrite in its changelog)
    kept = {p: h for p, h in listed.items() if p != "README.md"}
    assert {p: h for p, h in after.items() if p != "README.md"} == kept


def test_card_still_refuses_a_manifest_whose_data_changed(cli, tmp_path):
    m = _splits(tmp_path / "m", tmp_path / "test")
    (m / "README.md").unlink()
    with open(m / "data" / "images.parquet", "ab") as f:
        f.write(b"x")
    assert "images.parquet" in cli.one_line_error(cli.invoke(["card", m]))


# ============================================================================ tracebacks -> one line
@pytest.mark.parametrize("args, kw, words", [
    ((), {"id_test": None, "splits": "x"}, "id_test"),
    ((5,), {"id_test": "x", "splits": "y", "detectors": "msp"}, "model=5"),
])
def test_evaluate_api_bad_arguments_are_one_line(args, kw, words):
    import isood

    with pytest.raises(BadInputError, match=words) as e:
        isood.evaluate(*args, **kw)
    assert "\n" not in str(e.value)


def _light(args: list[str]) -> tuple[int, bool, str, float]:
    """``isood ARGS`` in a fresh interpreter: (exit status, whether torch was imported, stderr, seconds)."""
    code = ("import sys, time\nfrom typer.testing import CliRunner\nfrom isood.cli import app\nt = time.perf_counter()\n"
            f"r = CliRunner().invoke(app, {[str(a) for a in args]!r})\n"
            "print(r.exit_code, 'torch' in sys.modules, round(time.perf_counter() - t, 2))\nprint(r.stderr)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120).stdout
    first, _, err = out.partition("\n")
    rc, torch, seconds = first.split()
    return int(rc), torch == "True", err.strip(), float(seconds)


def test_images_per_prompt_is_bounded_before_any_work(tmp_path):
    rc, torch, err, _ = _light(["generate-syn", "--out", tmp_path / "o", "--images-per-prompt", "1000000"])
    assert rc == 2 and not torch and "--images-per-prompt" in err and "10000" in err and len(err.splitlines()) == 1


def test_a_plan_too_large_for_memory_is_refused_before_any_work(tmp_path):
    from isood.stages.syn import SynOptions
    from isood.stages.syn.options import MAX_PLANNED_IMAGES, check_options

    with pytest.raises(BadInputError, match="--per-cell"):
        check_options(SynOptions(out=str(tmp_path / "o"), per_cell=MAX_PLANNED_IMAGES // 64 + 1,
                                 images_per_prompt=1, levels=8))
    check_options(SynOptions(out=str(tmp_path / "o"), per_cell=MAX_PLANNED_IMAGES // 64, levels=8))


# ============================================================================ rough edges
@pytest.mark.parametrize("extra, flag", [
    (["--classes", "/nonexistent/classes.txt"], "--classes"),
    (["--checkpoint", "/nonexistent/w.safetensors"], "--checkpoint"),
    (["--model", "py:no_such_module_here:build"], "--model"),
    (["--model", "clip:local-dir:/nonexistent/clip"], "--model"),
])
def test_evaluate_refuses_a_missing_file_or_module_before_torch_loads(extra, flag, tmp_path):
    args = ["evaluate", "--splits", tmp_path / "s", "--id-test", tmp_path / "i", "--out", tmp_path / "o",
            "--detectors", "msp", "--model", "test_resnet", *extra]
    rc, torch, err, _ = _light(args)
    assert rc == 2 and not torch and flag in err and len(err.splitlines()) == 1, err


def test_pipeline_local_dir_missing_is_refused_first_without_the_hub(cli, tmp_path):
    from isood.stages.syn import SynOptions
    from isood.stages.syn.options import check_options

    t = time.perf_counter()
    with pytest.raises(BadInputError) as e:
        check_options(SynOptions(out=str(tmp_path / "o"), pipeline="local-dir:/nonexistent/pipe"))
    assert "/nonexistent/pipe" in str(e.value) and "Hub" not in str(e.value).split(";")[0]
    assert time.perf_counter() - t < 1.0
    rc, torch, err, _ = _light(["generate-syn", "--out", tmp_path / "o", "--pipeline", "local-dir:/nonexistent/pipe"])
    assert rc == 2 and not torch and "--pipeline" in err


def test_build_splits_missing_laid_names_laid_not_clip(cli, tmp_path):
    (tmp_path / "id").mkdir()
    (tmp_path / "test").mkdir()
    line = cli.one_line_error(cli.invoke(["build-splits", "--id", tmp_path / "id", "--test", tmp_path / "test",
                                          "--laid", tmp_path / "nonexist.safetensors", "--out", tmp_path / "o"]))
    assert line.startswith("error: --laid") and "--clip is required" not in line


def test_a_weights_only_refusal_says_what_it_is(tmp_path):
    import timm
    import torch

    from isood.classifiers.named import adapter_from_option

    model = timm.create_model("test_resnet", pretrained=False, num_classes=3)
    torch.save({"state_dict": model.state_dict(), "extra": BadInputError("a pickled object")}, tmp_path / "c.pth")
    with pytest.raises(BadInputError) as e:
        adapter_from_option("test_resnet", checkpoint=str(tmp_path / "c.pth"), n_id_classes=3)
    assert "weights_only" in str(e.value) and "--num-classes" not in str(e.value)


def test_ann_recall_help_and_bound_agree(cli, monkeypatch, tmp_path):
    monkeypatch.setenv("COLUMNS", "200")
    help_text = " ".join(cli.invoke(["build-splits", "--help"]).output.split())
    assert "in (0, 1]" in help_text and "in [0, 1]" not in help_text
    (tmp_path / "id").mkdir()
    for value, ok in (("0", False), ("1e-9", True)):
        r = cli.invoke(["build-splits", "--id", tmp_path / "id", "--test", tmp_path / "id", "--out", tmp_path / "o",
                        "--ann-recall", value])
        refused = r.exit_code == 2 and "--ann-recall" in r.stderr
        assert refused != ok, (value, r.stderr)
        if not ok:
            assert "(0, 1]" in r.stderr


def test_py_specs_are_documented_as_trusted_code(cli, monkeypatch):
    monkeypatch.setenv("COLUMNS", "200")
    for words, flag in ((["evaluate"], "--model"), (["generate-syn"], "--safety-checker")):
        text = " ".join(cli.invoke([*words, "--help"]).output.split())
        assert "trusted code" in text, words
    docs = (next(p for p in Path(__file__).resolve().parents if (p / "pyproject.toml").is_file()) / "docs" / "guarantees.md").read_text()
    assert "py:MODULE:FUNCTION" in docs and "trusted code" in docs


def test_a_features_manifest_of_zero_images_is_said(cli, tiny_clip_spec, tmp_path):
    for name in ("a.png", "b.png"):
        (tmp_path / "imgs" / W).mkdir(parents=True, exist_ok=True)
        (tmp_path / "imgs" / W / name).write_bytes(b"")  # 0-byte images: rejected rows
    r = cli.invoke(["extract", "--images", tmp_path / "imgs", "--clip", tiny_clip_spec, "--device", "cpu",
                    "--workers", "0", "--out", tmp_path / "f"])
    assert r.exit_code == 0, r.output
    said = [ln for ln in r.stderr.splitlines() if "0 images" in ln]
    assert len(said) == 1 and "rejected" in said[0]
