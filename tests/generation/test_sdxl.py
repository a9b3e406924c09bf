"""The SDXL generator over a tiny real diffusers pipeline: determinism, resume, rejections, loading errors."""

from __future__ import annotations

import hashlib
import time

import pandas as pd
import pytest

from generation.prompts import build_prompts, expand_images
from generation.sdxl import (
    STATE_FILE,
    generate_images,
    is_valid_image,
    load_pipeline,
    prune_images,
)
from generation.styles import load_styles
from isood.errors import MissingWeightsError

SIZE = 64


class Stop(Exception):
    pass


def plan(n_labels=3, per_prompt=2, seed=0):
    labels = pd.DataFrame({"wnid": [""] * n_labels, "label": ["violin", "teapot", "red fox", "volcano"][:n_labels]})
    return expand_images(build_prompts(labels, load_styles("sdxl:anime")), per_prompt, seed)


def run(p, root, gen, **kw):
    kw.setdefault("batch_size", 3)
    return generate_images(p, root, gen, fingerprint=gen.fingerprint, size=SIZE, progress=False, **kw)


def files(root, p):
    return {rel: (root / rel).read_bytes() for rel in p["path"]}


def test_generates_valid_images_and_hashes(gen, tmp_path):
    p = plan()
    res = run(p, tmp_path, gen)
    assert res.generated == 6 and res.skipped == 0 and gen.pipe.calls == 2 and gen.pipe.batch_sizes == [3, 3]
    for rel, data in files(tmp_path, p).items():
        assert is_valid_image(tmp_path / rel, SIZE) and not is_valid_image(tmp_path / rel, SIZE * 2)
        assert res.sha256[rel] == hashlib.sha256(data).hexdigest()
    assert len(set(res.sha256.values())) == 6  # different seeds / prompts -> different images
    assert (tmp_path / STATE_FILE).is_file()
    assert not list(tmp_path.rglob("*.tmp"))


def test_same_seed_same_bytes_other_seed_differs(gen, tmp_path):
    p = plan()
    run(p, tmp_path / "a", gen)
    run(p, tmp_path / "b", gen, batch_size=2)  # batch size does not change an image (own generator per image)
    a, b = files(tmp_path / "a", p), files(tmp_path / "b", p)
    assert a == b
    q = plan(seed=1)
    run(q, tmp_path / "c", gen)
    c = files(tmp_path / "c", q)
    assert set(c) == set(a) and all(c[k] != a[k] for k in a)


def test_rerun_generates_nothing(gen, tmp_path):
    p = plan()
    run(p, tmp_path, gen)
    before = files(tmp_path, p)
    mtimes = {rel: (tmp_path / rel).stat().st_mtime_ns for rel in p["path"]}
    calls = gen.pipe.calls
    res = run(p, tmp_path, gen)
    assert gen.pipe.calls == calls and res.generated == 0 and res.skipped == 6 and res.batches == 0
    assert files(tmp_path, p) == before
    assert {rel: (tmp_path / rel).stat().st_mtime_ns for rel in p["path"]} == mtimes


def test_kill_and_resume_matches_uninterrupted_run(gen, tmp_path):
    p = plan(n_labels=4)  # 8 images, batches of 3
    run(p, tmp_path / "full", gen)
    seen = []

    def stop_after_4(row):
        seen.append(row["path"])
        if len(seen) == 4:
            raise Stop

    with pytest.raises(Stop):
        run(p, tmp_path / "killed", gen, on_image=stop_after_4)
    present = [rel for rel in p["path"] if (tmp_path / "killed" / rel).exists()]
    assert present == seen == list(p["path"][:4])
    calls = gen.pipe.calls
    res = run(p, tmp_path / "killed", gen)
    assert res.generated == 4 and res.skipped == 4
    assert gen.pipe.calls - calls == 2  # the interrupted batch (regenerated whole) + the last one
    assert files(tmp_path / "killed", p) == files(tmp_path / "full", p)


def test_partial_and_corrupt_files_are_regenerated(gen, tmp_path):
    p = plan()
    run(p, tmp_path, gen)
    good = files(tmp_path, p)
    first, second = p["path"][0], p["path"][4]
    (tmp_path / first).write_bytes(good[first][:40])  # truncated PNG: does not decode
    leftover = (tmp_path / second).with_name(f".~{(tmp_path / second).name}.123.tmp")
    leftover.write_bytes(b"partial")
    res = run(p, tmp_path, gen)
    assert res.generated == 1 and not leftover.exists()
    assert files(tmp_path, p) == good


def test_changed_prompt_or_settings_regenerate(gen, make_generator, tmp_path):
    p = plan()
    run(p, tmp_path, gen)
    changed = p.copy()
    changed.loc[0, "prompt"] = "a different prompt"
    res = run(changed, tmp_path, gen)
    assert res.generated == 1 and res.skipped == 5
    other = make_generator(steps=2)
    res = run(changed, tmp_path, other)
    assert res.generated == 6 and res.skipped == 0


def test_image_checker_rejections_are_recorded_and_remembered(gen, tmp_path):
    p = plan()
    bad = p["path"][1]
    checked = []

    def checker(image, item):
        checked.append(item["path"])
        assert image.size == (SIZE, SIZE)
        return "too red" if item["path"] == bad else None

    res = run(p, tmp_path, gen, image_checker=checker)
    assert res.rejected == {bad: "too red"} and res.generated == 5 and bad not in res.sha256
    assert not (tmp_path / bad).exists() and len(checked) == 6
    calls = gen.pipe.calls
    res = run(p, tmp_path, gen, image_checker=checker)
    assert gen.pipe.calls == calls and res.rejected == {bad: "too red"} and res.generated == 0


def test_prune_removes_images_outside_the_plan(gen, tmp_path):
    p = plan()
    run(p, tmp_path, gen)
    keep = set(p["path"][:2])
    assert prune_images(tmp_path, keep) == 4
    assert sorted(q.relative_to(tmp_path).as_posix() for q in (tmp_path / "images").rglob("*.png")) == sorted(keep)


def test_hub_pipeline_offline_is_one_clear_line():
    t0 = time.perf_counter()
    with pytest.raises(MissingWeightsError) as e:
        load_pipeline("stabilityai/sdxl-turbo", device="cpu")
    msg = str(e.value)
    assert "stabilityai/sdxl-turbo" in msg and "--pipeline local-dir:PATH" in msg and "\n" not in msg
    assert time.perf_counter() - t0 < 20  # HF_HUB_OFFLINE: no retries


def test_local_dir_without_pipeline(tmp_path):
    with pytest.raises(MissingWeightsError, match="has no model_index.json"):
        load_pipeline(f"local-dir:{tmp_path}", device="cpu")


def test_local_dir_with_only_fp16_variant_files_loads_on_cpu(tiny_sdxl_dir, tmp_path):
    import torch
    from diffusers import AutoPipelineForText2Image

    src = AutoPipelineForText2Image.from_pretrained(str(tiny_sdxl_dir), local_files_only=True)
    src.to(torch.float16).save_pretrained(tmp_path / "fp16", variant="fp16")
    names = [q.name for q in (tmp_path / "fp16").rglob("*.safetensors")]
    assert names and all(".fp16." in n for n in names)
    pipe = load_pipeline(f"local-dir:{tmp_path / 'fp16'}", device="cpu")
    assert pipe.unet.dtype == torch.float32
    torch.testing.assert_close(pipe.unet.conv_in.weight, src.unet.conv_in.weight.to(torch.float16).float())
