"""The SDXL generator over a tiny real diffusers pipeline: determinism, resume, rejections, loading errors,
the one fingerprint builder, and the engine worker."""

from __future__ import annotations

import hashlib
import io
import time
from dataclasses import replace

import numpy as np
import pandas as pd
import pytest
from PIL import Image

from generation.outputs import STATE_FILE, is_valid_image, prune_images
from generation.prompts import build_prompts, expand_images
from generation.fingerprint import expected_fingerprint, plan_fingerprint
from generation.pipeline import GeneratorSettings, load_pipeline
from generation.sdxl import GeneratorWorker, SDXLGenerator, generate_images, plan_batches
from generation.styles import load_styles
from isood.core.errors import BadInputError, MissingWeightsError
from isood.core.engine import LocalEngine

SIZE = 64


class Stop(Exception):
    pass


def plan(n_labels=3, per_prompt=2, seed=0):
    labels = pd.DataFrame({"wnid": [""] * n_labels, "label": ["violin", "teapot", "red fox", "volcano"][:n_labels]})
    return expand_images(build_prompts(labels, load_styles("sdxl:anime")), per_prompt, seed=seed)


def run(p, root, gen, batch_size=3, **kw):
    settings = replace(gen.settings, batch_size=batch_size)
    return generate_images(p, root, settings=settings, generator=gen, progress=False, **kw)


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
    assert set(a) == set(b)
    for rel in a:  # batches of 3 and 2: the same image up to float rounding (a pixel may land one level off)
        pa, pb = (np.asarray(Image.open(io.BytesIO(x)), dtype=np.int16) for x in (a[rel], b[rel]))
        assert np.abs(pa - pb).max() <= 1 and (pa == pb).mean() > 0.99, rel
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


@pytest.mark.parametrize("threads", [0, 2])
def test_kill_and_resume_matches_uninterrupted_run(gen, tmp_path, threads):
    """Interrupted after the 4th image (``on_image`` hears of them in plan order): in line (0 threads) exactly
    those 4 are on disk; with the write pool a few more may be (the next batch's, written while it ran), each
    complete and the full run's bytes. The resumed run regenerates the slices with a missing image, whole."""
    p = plan(n_labels=4)  # 8 images, batches of 3
    run(p, tmp_path / "full", gen)
    full = files(tmp_path / "full", p)
    seen = []

    def stop_after_4(row):
        seen.append(row["path"])
        if len(seen) == 4:
            raise Stop

    with pytest.raises(Stop):
        run(p, tmp_path / "killed", gen, on_image=stop_after_4, write_threads=threads)
    present = [rel for rel in p["path"] if (tmp_path / "killed" / rel).exists()]
    assert seen == list(p["path"][:4]) and set(seen) <= set(present)
    if threads == 0:
        assert present == seen
    assert all((tmp_path / "killed" / rel).read_bytes() == full[rel] for rel in present)
    stale = sum(any(rel not in present for rel in p["path"][s:s + 3]) for s in range(0, len(p), 3))
    calls = gen.pipe.calls
    res = run(p, tmp_path / "killed", gen, write_threads=threads)
    assert res.generated == len(p) - len(present) and res.skipped == len(present)
    assert gen.pipe.calls - calls == stale  # the slices with a missing image, regenerated whole
    assert files(tmp_path / "killed", p) == full


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


def test_expected_fingerprint_is_the_loaded_generators(tiny_pipeline_spec):
    """The fingerprint read from model_index.json (before any worker starts) equals the loaded pipeline's."""
    settings = GeneratorSettings(pipeline=tiny_pipeline_spec, size=SIZE, steps=1, batch_size=3, device="cpu")
    loaded = SDXLGenerator.load(settings)
    assert expected_fingerprint(settings, "cpu") == loaded.fingerprint
    assert loaded.fingerprint["pipeline_class"] == "StableDiffusionXLPipeline"
    assert loaded.fingerprint["dtype"] == "float32" and expected_fingerprint(settings, "cuda")["dtype"] == "float16"
    assert plan_fingerprint(settings) == loaded.fingerprint  # no generator: the expected one on the local device


def test_hub_pipeline_config_offline_is_one_clear_line():
    with pytest.raises(MissingWeightsError) as e:
        expected_fingerprint(GeneratorSettings(pipeline="stabilityai/sdxl-turbo"), "cpu")
    assert "--pipeline local-dir:PATH" in str(e.value) and "\n" not in str(e.value)


def test_plan_batches_are_fixed_slices_without_done_ones():
    rows = [{"path": f"p{i}", "prompt": f"x{i}", "negative_prompt": "", "seed": i} for i in range(7)]
    batches = plan_batches(rows, {"p0", "p1", "p2", "p4"}, 3)
    assert [list(b["path"]) for b in batches] == [["p3", "p4", "p5"], ["p6"]]
    assert [list(b["done"]) for b in batches] == [[False, True, False], [False]]
    assert batches[0]["seed"].dtype == np.int64 and list(batches[0]["seed"]) == [3, 4, 5]
    assert list(batches[0]["prompt"]) == ["x3", "x4", "x5"] and set(batches[0]) == {"path", "prompt", "negative_prompt", "seed", "done"}
    assert plan_batches(rows, {r["path"] for r in rows}, 3) == []


class FakeImages:
    """A generator returning solid images whose colour is the seed (mod 256); rejects prompts with 'bad'."""

    fingerprint = {"generator": "fake"}

    def __init__(self):
        self.calls = []

    def __call__(self, prompts, negative_prompts, seeds):
        from PIL import Image

        self.calls.append(list(seeds))
        return [(Image.new("RGB", (8, 8), (int(s) % 256, 0, 0)), "flagged" if "bad" in p else None)
                for p, s in zip(prompts, seeds)]


def test_worker_writes_one_slice_and_reports_each_row(tmp_path):
    fake, written = FakeImages(), []
    worker = GeneratorWorker(str(tmp_path), GeneratorSettings(size=8), fake.fingerprint, None, fake, written.append)
    batch = {"path": np.array(["images/a.png", "images/b.png", "images/c.png"], dtype=object),
             "prompt": np.array(["good", "bad", "good too"], dtype=object),
             "negative_prompt": np.array(["", "", ""], dtype=object), "seed": np.array([1, 2, 3]),
             "done": np.array([False, False, True])}
    out = worker(batch)
    assert fake.calls == [[1, 2, 3]]  # the whole slice in one call, done rows included
    assert list(out["written"]) == [True, True, False] and list(out["rejected"]) == ["", "flagged", ""]
    data = (tmp_path / "images/a.png").read_bytes()
    assert out["sha256"][0] == hashlib.sha256(data).hexdigest() and out["sha256"][1] == out["sha256"][2] == ""
    assert not (tmp_path / "images/b.png").exists() and not (tmp_path / "images/c.png").exists()
    assert (tmp_path / "images/.~b.png.rejected").read_text() == "flagged"
    assert [r["path"] for r in written] == ["images/a.png"]


def test_worker_loads_the_pipeline_and_checks_its_fingerprint(tiny_pipeline_spec, tmp_path):
    settings = GeneratorSettings(pipeline=tiny_pipeline_spec, size=SIZE, steps=1, batch_size=3, device="cpu")
    worker = GeneratorWorker(str(tmp_path), settings, expected_fingerprint(settings, "cpu"))
    assert isinstance(worker.generator, SDXLGenerator)
    with pytest.raises(BadInputError, match="is not the expected"):
        GeneratorWorker(str(tmp_path), settings, {**expected_fingerprint(settings, "cpu"), "steps": 2})


class NamedEngine(LocalEngine):
    """A local engine under another name (as a cluster engine would present itself)."""

    def __init__(self):
        super().__init__(name="cluster")


def test_custom_generator_runs_only_locally(tmp_path):
    fake = FakeImages()
    with pytest.raises(BadInputError, match="only with the local engine"):
        generate_images(plan(), tmp_path, settings=GeneratorSettings(size=8), generator=fake, engine=NamedEngine(),
                        progress=False)
    assert fake.calls == []


def test_engine_gets_one_call_per_slice(tmp_path):
    """generate_images hands the engine the worker class and the fixed slices; results come back per slice."""
    fake, seen = FakeImages(), []

    class Recording(LocalEngine):
        def map(self, worker, args, batches, **kw):
            batches = list(batches)
            seen.append((worker, [len(b["path"]) for b in batches], kw["total"]))
            return super().map(worker, args, batches, **kw)

    res = generate_images(plan(n_labels=4), tmp_path, settings=GeneratorSettings(size=8, batch_size=3),
                          generator=fake, engine=Recording(), progress=False)
    assert seen == [(GeneratorWorker, [3, 3, 2], 8)] and res.batches == 3 and res.generated == 8
    assert len(fake.calls) == 3


def _cuda() -> bool:
    import torch

    return torch.cuda.is_available()


@pytest.mark.gpu
@pytest.mark.skipif(not _cuda(), reason="needs a CUDA GPU")
def test_cuda_generation_is_fp16_and_matches_its_expected_fingerprint(tiny_pipeline_spec, tmp_path):
    settings = GeneratorSettings(pipeline=tiny_pipeline_spec, size=SIZE, steps=1, batch_size=3, device="cuda")
    loaded = SDXLGenerator.load(settings)
    assert loaded.fingerprint == expected_fingerprint(settings, "cuda") and loaded.fingerprint["dtype"] == "float16"
    p = plan()
    res = generate_images(p, tmp_path, settings=settings, progress=False)  # the worker loads the pipeline itself
    assert res.generated == len(p) and all(is_valid_image(tmp_path / rel, SIZE) for rel in p["path"])
