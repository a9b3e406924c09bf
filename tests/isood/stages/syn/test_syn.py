"""End-to-end Syn-IS job (isood.stages.syn + `isood generate-syn`): tiny open_clip + tiny SDXL pipeline, offline."""

from __future__ import annotations

import json

import numpy as np
import pandas as pd
import pytest
from typer.testing import CliRunner

import manifests
from isood.stages.syn import KIND, KIND_PROMPTS, SynOptions, run_generate_syn
from isood.cli import app
from isood.core.errors import IsoodError
from isood.science.grid import axis_edges, cell_table, edges_table
from isood.kinds import SYN_IS_PROMPTS
from isood.stages.splits import write_splits

STYLES = "sdxl:photographic,anime,pixel-art"


def write_splits_manifest(root, *, sem_edges, cov_edges, config):
    """A splits manifest (two images) written by build-splits' own writer."""
    images = pd.DataFrame({"path": ["a/x.png", "b/y.png"], "wnid": ["", ""], "d_sem": [0.0, 0.01],
                           "d_cov": [0.0, 0.1], "sem_level": [0, 1], "cov_level": [0, 1],
                           "cell": ["cov_0_sem_0", "cov_1_sem_1"]})
    n = len(sem_edges) - 1
    return write_splits(root, images=images, cells=cell_table(images["cov_level"], images["sem_level"], n, 1),
                        edges=edges_table(sem_edges, cov_edges), config=config, card=False)


def options(syn_inputs, out, clip, **kw):
    base = dict(out=out, styles=STYLES, labels=str(syn_inputs["labels"]), clip=clip, laid=str(syn_inputs["laid"]),
                id_features=str(syn_inputs["id_features"]), per_cell=1, images_per_prompt=2, size=64, steps=1,
                batch_size=3, seed=0, device="cpu", levels=4, na_threshold=2, progress=False)
    base.update(kw)
    return SynOptions(**base)


class Stop(Exception):
    pass


@pytest.fixture(scope="module")
def full_run(syn_inputs, tiny_clip_spec, make_generator, tiny_pipeline_spec, tmp_path_factory):
    """One uninterrupted run, shared by the read-only checks."""
    out = tmp_path_factory.mktemp("syn_full")
    gen = make_generator()
    res = run_generate_syn(options(syn_inputs, out, tiny_clip_spec, pipeline=tiny_pipeline_spec), generator=gen)
    return out, res, gen


def test_manifest_lists_and_verifies_every_image(full_run):
    out, res, gen = full_run
    m = manifests.read(out)
    assert m.kind == KIND and manifests.verify(out).ok
    images = m.frame("images")
    listed = {r["path"]: r["sha256"] for r in m.meta["files"]}
    on_disk = sorted(p.relative_to(out).as_posix() for p in (out / "images").rglob("*.png"))
    assert sorted(images["path"]) == on_disk and len(on_disk) == res.summary["images"] > 0
    assert all(listed[p] == h == manifests.sha256_file(out / p) for p, h in zip(images["path"], images["sha256"]))
    assert gen.pipe.calls == -(-len(images) // 3)
    # each prompt has images_per_prompt images with distinct seeds; its rows carry the prompt's shift and levels
    assert (images.groupby("prompt_id").size() == 2).all() and images["seed"].is_unique
    prompts = m.frame("prompts").set_index("prompt_id")
    for col in ("d_sem", "d_cov", "sem_level", "cov_level", "prompt", "negative_prompt", "style", "label"):
        assert (images[col].to_numpy() == prompts.loc[images["prompt_id"], col].to_numpy()).all(), col
    assert prompts["selected"].sum() == images["prompt_id"].nunique()
    # per-cell lists and the cell table agree with the rows
    cells = m.frame("cells").set_index("cell")
    counts = images.groupby("cell").size()
    assert (cells.loc[counts.index, "n"] == counts).all() and cells["n"].sum() == len(images)
    assert (cells["na"] == (cells["n"] < 2)).all()
    for cell, group in images.groupby("cell"):
        assert (out / "lists" / f"{cell}.txt").read_text().split() == list(group["path"])
    cfg = m.meta["command"]["config"]
    assert cfg["generator"]["settings"]["size"] == 64 and cfg["generator"]["fingerprint"]["steps"] == 1
    assert cfg["clip"].startswith("local-dir:") and cfg["style_names"] == ["photographic", "anime", "pixel-art"]


def test_tampered_image_fails_verify(full_run, tmp_path):
    import shutil

    out, _, _ = full_run
    copy = tmp_path / "copy"
    shutil.copytree(out, copy)
    victim = manifests.read(copy).frame("images")["path"][0]
    (copy / victim).write_bytes((copy / victim).read_bytes() + b"x")
    assert manifests.verify(copy).changed == [victim]


def test_rerun_generates_nothing_and_keeps_version(syn_inputs, tiny_clip_spec, tiny_pipeline_spec, full_run, gen,
                                                   tmp_path):
    import shutil

    out, _, _ = full_run
    copy = tmp_path / "copy"
    shutil.copytree(out, copy)
    before = manifests.read(copy)
    res = run_generate_syn(options(syn_inputs, copy, tiny_clip_spec, pipeline=tiny_pipeline_spec), generator=gen)
    assert gen.pipe.calls == 0 and res.summary["generated"] == 0 and res.summary["skipped"] == before.meta["summary"]["images"]
    after = manifests.read(copy)
    assert after.dataset_version == before.dataset_version and after.meta["content_sha256"] == before.meta["content_sha256"]
    assert manifests.verify(copy).ok


def test_kill_and_resume_gives_the_uninterrupted_files(syn_inputs, tiny_clip_spec, tiny_pipeline_spec, full_run, gen,
                                                       tmp_path):
    out_full, _, _ = full_run
    out = tmp_path / "killed"
    opts = options(syn_inputs, out, tiny_clip_spec, pipeline=tiny_pipeline_spec)
    count = []

    def stop_after_5(row):
        count.append(row["path"])
        if len(count) == 5:
            raise Stop

    with pytest.raises(Stop):
        run_generate_syn(opts, generator=gen, on_image=stop_after_5)
    assert not out.exists()  # an interrupted run is visibly unfinished: its work waits in the staging folder
    # the 5 images heard of, and maybe a few the write pool finished while the next batch generated
    written = list((tmp_path / ".~killed.isood-new" / "images").rglob("*.png"))
    assert {(tmp_path / ".~killed.isood-new" / p) for p in count} <= set(written) and len(written) >= 5
    run_generate_syn(opts, generator=gen)
    assert manifests.verify(out).ok
    full = manifests.read(out_full).frame("images")
    resumed = manifests.read(out).frame("images")
    pd.testing.assert_frame_equal(full, resumed)
    for rel in full["path"]:
        assert (out / rel).read_bytes() == (out_full / rel).read_bytes()


def test_prompts_only_cells_follow_the_binning(syn_inputs, tiny_clip_spec, tmp_path):
    out = tmp_path / "prompts"
    res = run_generate_syn(options(syn_inputs, out, tiny_clip_spec, prompts_only=True, per_cell=2, levels=3))
    m = manifests.read(out, kind=SYN_IS_PROMPTS)
    assert m.kind == KIND_PROMPTS and manifests.verify(out).ok and not (out / "images").exists()
    prompts = m.frame("prompts")
    assert len(prompts) == 3 * 12
    for axis in ("sem", "cov"):
        e = m.axis_edges(axis)
        d, lev = prompts[f"d_{axis}"].to_numpy(), prompts[f"{axis}_level"].to_numpy()
        assert len(e) == 4 and set(lev) <= {0, 1, 2}
        inner = (d >= e[0]) & (d < e[-1])
        assert np.all(e[lev[inner]] <= d[inner]) and np.all(d[inner] < e[lev[inner] + 1])
    assert (prompts["cell"] == "cov_" + prompts["cov_level"].astype(str) + "_sem_" + prompts["sem_level"].astype(str)).all()
    avail = prompts.groupby("cell").size()
    sel = prompts[prompts["selected"]].groupby("cell").size()
    assert (sel == np.minimum(avail, 2)).all() and set(sel.index) == set(avail.index)
    plan = m.frame("images")
    assert len(plan) == 2 * len(prompts[prompts["selected"]]) and (plan["sha256"] == "").all()
    cells = m.frame("cells").set_index("cell")
    assert (cells.loc[avail.index, "prompts_available"] == avail).all() and (cells["prompts_sampled"] <= 2).all()
    assert res.summary["prompts_sampled"] == int(sel.sum())


def test_prompt_identical_to_an_id_text_has_zero_shift(syn_inputs, tiny_clip_spec, tmp_path):
    styles = tmp_path / "styles.json"
    styles.write_text(json.dumps([{"name": "id-phrasing", "prompt": "a photo of a {prompt}.", "negative_prompt": ""},
                                  {"name": "clay", "prompt": "a clay sculpture of {prompt}", "negative_prompt": ""}]))
    labels = tmp_path / "labels.txt"
    labels.write_text("tench\nviolin\n")
    run_generate_syn(options(syn_inputs, tmp_path / "o", tiny_clip_spec, prompts_only=True, styles=str(styles),
                             labels=str(labels)))
    p = manifests.read(tmp_path / "o").frame("prompts").set_index("prompt")
    assert p.loc["a photo of a tench.", "d_sem"] < 1e-5 and p.loc["a photo of a tench.", "d_cov"] < 1e-5
    assert p.loc["a clay sculpture of violin", "d_sem"] > 1e-3


def test_splits_edges_are_reused_and_laid_is_trained_when_absent(syn_inputs, tiny_clip_spec, isood_cache, tmp_path):
    sem_e = [0.0, 0.01, 0.02, 0.03, 0.04, 0.05]
    cov_e = [0.0, 0.1, 0.2, 0.3, 0.4, 0.5]
    write_splits_manifest(tmp_path / "splits", sem_edges=sem_e, cov_edges=cov_e,
                          config={"clip": tiny_clip_spec, "id": str(syn_inputs["id_features"])})
    out = tmp_path / "o"
    opts = options(syn_inputs, out, None, prompts_only=True, laid=None, splits=str(tmp_path / "splits"),
                   triplets=200, id_features=None, prompt_edges="splits")  # CLIP, ID features: build-splits'
    run_generate_syn(opts)
    m = manifests.read(out)
    got = m.frame("edges")
    np.testing.assert_allclose(axis_edges(got, "sem"), sem_e)
    np.testing.assert_allclose(axis_edges(got, "cov"), cov_e)
    p = m.frame("prompts")
    assert set(p["sem_level"]) <= set(range(5)) and (p.loc[p["d_sem"] >= 0.05, "sem_level"] == 4).all()
    cfg = m.meta["command"]["config"]
    assert cfg["laid"] == "trained" and cfg["clip"] == tiny_clip_spec and cfg["n_levels"] == 5
    assert cfg["id_features"] == str(syn_inputs["id_features"]) and cfg["edges_from"] == "splits"
    assert cfg["laid_config"]["n_triplets"] == 200 and (out / "laid.safetensors").is_file()
    run_generate_syn(opts)  # retrained to the same W: same files, same dataset version
    again = manifests.read(out)
    assert again.dataset_version == m.dataset_version == "1.0.0" and manifests.verify(out).ok


def test_blocklisted_prompts_are_recorded(syn_inputs, tiny_clip_spec, tmp_path):
    labels = tmp_path / "labels.txt"
    labels.write_text("violin\nnude\nteapot\n")
    extra = tmp_path / "block.txt"
    extra.write_text("teapot\n")
    run_generate_syn(options(syn_inputs, tmp_path / "o", tiny_clip_spec, prompts_only=True, labels=str(labels),
                             blocklist=str(extra), styles="sdxl:anime"))
    m = manifests.read(tmp_path / "o")
    rej = m.frame("rejected")
    assert sorted(zip(rej["label"], rej["reason"], rej["stage"])) == [
        ("nude", "blocklist: nude", "prompt"), ("teapot", "blocklist: teapot", "prompt")]
    assert list(m.frame("prompts")["label"]) == ["violin"]


def test_image_checker_rejection_in_the_manifest(syn_inputs, tiny_clip_spec, tiny_pipeline_spec, gen, tmp_path):
    def reject_pixel_art(image, item):
        return "no pixel art today" if item["style"] == "pixel-art" else None

    res = run_generate_syn(options(syn_inputs, tmp_path / "o", tiny_clip_spec, pipeline=tiny_pipeline_spec,
                                   per_cell=1, images_per_prompt=1), generator=gen, image_checker=reject_pixel_art)
    m = manifests.read(tmp_path / "o")
    rej = m.frame("rejected")
    images = m.frame("images")
    assert (images["style"] != "pixel-art").all() and manifests.verify(tmp_path / "o").ok
    img_rej = rej[rej["stage"] == "image"]
    assert len(img_rej) == res.summary["rejected"] and (img_rej["reason"] == "no pixel art today").all()
    assert len(img_rej) + len(images) == res.summary["images_planned"]


def test_refuses_to_overwrite_other_manifests(syn_inputs, tiny_clip_spec, full_run, tmp_path):
    write_splits_manifest(tmp_path / "splits", sem_edges=[0, 0.5, 1], cov_edges=[0, 0.5, 1], config={})
    with pytest.raises(IsoodError, match="holds a 'splits' manifest"):
        run_generate_syn(options(syn_inputs, tmp_path / "splits", tiny_clip_spec, prompts_only=True))
    assert manifests.verify(tmp_path / "splits").ok
    out, _, _ = full_run
    with pytest.raises(IsoodError, match="holds a 'syn-is' manifest, not 'syn-is-prompts'"):
        run_generate_syn(options(syn_inputs, out, tiny_clip_spec, prompts_only=True))
    assert manifests.verify(out).ok


def test_missing_id_features_says_what_is_needed(syn_inputs, tiny_clip_spec, tmp_path):
    with pytest.raises(IsoodError) as e:
        run_generate_syn(options(syn_inputs, tmp_path / "o", tiny_clip_spec, id_features=None))
    assert "--id-features" in str(e.value) and "\n" not in str(e.value)


def test_cli_prompts_only_and_one_line_errors(syn_inputs, tiny_clip_spec, tmp_path):
    runner = CliRunner()
    base = ["generate-syn", "--labels", str(syn_inputs["labels"]), "--clip", tiny_clip_spec,
            "--laid", str(syn_inputs["laid"]), "--id-features", str(syn_inputs["id_features"]), "--per-cell", "1",
            "--device", "cpu"]
    r = runner.invoke(app, base + ["--styles", "sdxl:anime,clay", "--prompts-only", "--out", str(tmp_path / "p")])
    assert r.exit_code == 0, r.output
    assert manifests.read(tmp_path / "p").kind == KIND_PROMPTS
    r = runner.invoke(app, base + ["--styles", "sdxl:anim", "--out", str(tmp_path / "q")])
    assert r.exit_code == 2 and "unknown style 'anim'" in r.output and "anime" in r.output
    r = runner.invoke(app, base + ["--styles", "sdxl:anime", "--engine", "spark", "--out", str(tmp_path / "e")])
    assert r.exit_code == 2 and "'spark'" in r.output and not (tmp_path / "e").exists()
    r = runner.invoke(app, base + ["--styles", "sdxl:anime", "--size", "64", "--pipeline", "stabilityai/sdxl-turbo",
                                   "--out", str(tmp_path / "r")])
    assert r.exit_code == 2 and "--pipeline local-dir:PATH" in r.output and "Traceback" not in r.output


def test_cli_generates_with_local_dir_pipeline(syn_inputs, tiny_clip_spec, tiny_pipeline_spec, tmp_path):
    r = CliRunner().invoke(app, [
        "generate-syn", "--styles", "sdxl:anime", "--labels", str(syn_inputs["labels"]), "--clip", tiny_clip_spec,
        "--laid", str(syn_inputs["laid"]), "--id-features", str(syn_inputs["id_features"]), "--per-cell", "1",
        "--pipeline", tiny_pipeline_spec, "--size", "64", "--steps", "1", "--device", "cpu", "--out", str(tmp_path / "s"),
    ])
    assert r.exit_code == 0, r.output
    r2 = CliRunner().invoke(app, ["verify", str(tmp_path / "s")])
    assert r2.exit_code == 0 and manifests.read(tmp_path / "s").kind == KIND
    images = manifests.read(tmp_path / "s").frame("images")
    assert len(images) > 0 and all((tmp_path / "s" / p).is_file() for p in images["path"])


def test_engine_and_warnings_are_recorded(syn_inputs, tiny_clip_spec, tmp_path):
    """The engine the CLI passes is named in the config; a LAID of another CLIP is a warning, kept in the summary."""
    from isood.science.laid import LAID
    from isood.core.engine import LocalEngine

    class Cluster(LocalEngine):
        def __init__(self):
            super().__init__(name="cluster")

        def as_config(self):
            return {"engine": "cluster", "workers": 3}

    other = tmp_path / "laid.safetensors"
    laid = LAID.load(syn_inputs["laid"])
    LAID(laid.W, config={"clip_identity": "another-clip"}).save(other)
    warnings = []
    res = run_generate_syn(options(syn_inputs, tmp_path / "o", tiny_clip_spec, prompts_only=True, laid=str(other)),
                           engine=Cluster(), warn=warnings.append)
    cfg = manifests.read(tmp_path / "o").meta["command"]["config"]
    assert cfg["engine"] == "cluster" and cfg["cluster"] == {"engine": "cluster", "workers": 3}
    assert len(warnings) == 1 and "another-clip" in warnings[0] and res.summary["warnings"] == warnings


def test_summary_grid_has_one_row_per_covariate_level(full_run):
    from isood.cli.syn import cells_grid, summary_table

    _, res, _ = full_run
    grid = cells_grid(res.cells)
    n = int(res.cells["cov_level"].max()) + 1
    assert len(grid.columns) == n + 1 and grid.row_count == n
    cells = res.cells.set_index(["cov_level", "sem_level"])
    for s in range(n):
        shown = list(grid.columns[s + 1].cells)
        expected = [f"{cells.loc[(c, s), 'n']}" + ("*" if cells.loc[(c, s), "na"] else "") for c in range(n)]
        assert shown == expected
    assert summary_table(res) is not None


def test_summary_reads_as_labelled_values(full_run):
    """The printed summary says where LAID came from and 'none' for no warnings; no None, [] or nan reaches it."""
    from rich.console import Console

    from isood.cli.syn import summary_rows, summary_table

    _, res, _ = full_run
    assert res.summary["laid_from"] == "--laid"  # options() passes --laid
    rows = dict(summary_rows(res.summary))
    assert rows["LAID"] == "read from --laid" and rows["warnings"] == "none"
    assert rows["images generated"] == str(res.summary["generated"])
    console = Console(width=200, record=True)
    console.print(summary_table(res))
    text = console.export_text()
    for raw in ("None", "[]", "nan", "laid_fit_seconds"):
        assert raw not in text
    rows = dict(summary_rows({"laid_fit_seconds": None, "laid_from": "splits", "warnings": ["w1", "w2"],
                              "images_per_second": float("nan"), "generated": 0}))
    assert rows["LAID"] == "reused from the splits manifest" and rows["warnings"] == "w1; w2"
    assert rows["images per second"] == "not measured"
    assert dict(summary_rows({"laid_fit_seconds": 2.04, "warnings": []}))["LAID"] == "trained here in 2.0 s"
