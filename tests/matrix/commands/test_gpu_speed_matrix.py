"""GPU speed, checked on the CPU: what keeps a GPU busy must not change what is written.

| row | code | test |
|---|---|---|
| prompt text features for binning cached by content | ``isood.stages.syn.load.measure_prompts`` (``encode_texts`` with the text-feature cache) | ``test_rerun_does_not_encode_the_prompts_again`` |
| PNG encode / hash / safety check / write on a thread pool while the next batch generates | ``generation.sdxl.GeneratorWorker.stream`` | ``test_pipelined_writes_*`` |
| each unique prompt of a batch encoded once, embeddings passed to the pipeline | ``generation.sdxl.SDXLGenerator`` (``encode_prompt``) | ``test_prompt_embeddings_*`` |
| ``bench/gpu_suite.py --cpu-smoke`` runs every bench at tiny sizes | ``bench/gpu_suite.py`` | ``test_gpu_suite_cpu_smoke`` |
"""
from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

import manifests
from isood.stages.syn import SynOptions, run_generate_syn

STYLES = "sdxl:photographic,anime,pixel-art"


@pytest.fixture(scope="module")
def syn_inputs(tmp_path_factory, syn_inputs_factory):
    """ID features (tiny-CLIP text features of photos of 4 classes), a labels file and a LAID file."""
    return syn_inputs_factory(tmp_path_factory.mktemp("gpu_speed_inputs"))


def syn_options(syn_inputs, out, clip, **kw):
    base = dict(out=out, styles=STYLES, labels=str(syn_inputs["labels"]), clip=clip, laid=str(syn_inputs["laid"]),
                id_features=str(syn_inputs["id_features"]), per_cell=1, images_per_prompt=2, size=64, steps=1,
                batch_size=3, seed=0, device="cpu", levels=4, na_threshold=2, progress=False)
    base.update(kw)
    return SynOptions(**base)


# ------------------------------------------------------------------------------------------- text-feature cache
def test_rerun_does_not_encode_the_prompts_again(syn_inputs, tiny_clip_spec, isood_cache, tmp_path, monkeypatch):
    """A rerun with the same CLIP and prompts reads the prompts' CLIP text features from the cache (the text
    encoder is not called) and bins every prompt as the first run did; another CLIP (other weights) misses."""
    import isood.stages.syn.load as load

    calls = []
    real = load.load_clip

    def counting(spec, **kw):
        enc = real(spec, **kw)
        encode = enc.model.encode_text

        def counted(tokens, *a, **k):
            calls.append(len(tokens))
            return encode(tokens, *a, **k)

        enc.model.encode_text = counted
        return enc

    monkeypatch.setattr(load, "load_clip", counting)
    out = tmp_path / "syn"
    first = run_generate_syn(syn_options(syn_inputs, out, tiny_clip_spec, prompts_only=True))
    n_prompts = len(manifests.read(out).frame("prompts"))
    assert sum(calls) == n_prompts > 0  # every prompt encoded once by the first run
    calls.clear()
    again = run_generate_syn(syn_options(syn_inputs, tmp_path / "syn2", tiny_clip_spec, prompts_only=True))
    assert calls == []  # nothing encoded: the features came from the cache
    a, b = first.manifest.frame("prompts"), again.manifest.frame("prompts")
    cols = ["prompt_id", "prompt", "sem_level", "cov_level", "cell", "selected"]
    pd.testing.assert_frame_equal(a[cols], b[cols])
    np.testing.assert_allclose(a[["d_sem", "d_cov"]].to_numpy(), b[["d_sem", "d_cov"]].to_numpy(), atol=1e-6)
    assert any(isood_cache.rglob("text-*.npy"))


# ------------------------------------------------------------------------------------------- pipelined writes
def image_plan(n_labels=5, per_prompt=2, seed=0):
    from generation.prompts import build_prompts, expand_images
    from generation.styles import load_styles

    labels = pd.DataFrame({"wnid": [""] * n_labels,
                           "label": ["violin", "teapot", "red fox", "volcano", "sailboat"][:n_labels]})
    return expand_images(build_prompts(labels, load_styles("sdxl:anime")), per_prompt, seed=seed)


@pytest.fixture(scope="module")
def tiny_sdxl(tmp_path_factory):
    """The tiny SDXL pipeline (``isood.dev.tiny_models``), saved and loaded as ``local-dir:`` on the CPU."""
    import torch

    from generation.pipeline import load_pipeline
    from isood.dev.tiny_models import build_tiny_sdxl

    torch.set_num_threads(1)
    folder = tmp_path_factory.mktemp("tiny_sdxl")
    build_tiny_sdxl().save_pretrained(folder)
    spec = f"local-dir:{folder}"
    return spec, load_pipeline(spec, device="cpu")


def folder_bytes(root):
    return {p.relative_to(root).as_posix(): p.read_bytes() for p in sorted((root / "images").rglob("*")) if p.is_file()}


def test_pipelined_writes_are_byte_identical_to_in_line(tiny_sdxl, tmp_path):
    """The tiny SDXL pipeline, 10 images in batches of 3, a checker rejecting two prompts' images: written on 3
    threads while the next batch generates, the PNGs, the rejection markers and the hashes are those of the
    in-line writes; the checker ran on the pool's threads (not the generating one)."""
    import threading

    from generation.pipeline import GeneratorSettings
    from generation.sdxl import SDXLGenerator, generate_images

    spec, pipe = tiny_sdxl
    gen = SDXLGenerator(pipe, GeneratorSettings(pipeline=spec, size=64, steps=1, batch_size=3, device="cpu"))
    p = image_plan()
    threads = {}

    def checker(image, row):
        threads.setdefault(row["path"], set()).add(threading.current_thread().name)
        return "no foxes" if "fox" in row["prompt"] or "volcano" in row["prompt"] else None

    results = {}
    for n in (0, 3):
        threads.clear()
        results[n] = generate_images(p, tmp_path / str(n), settings=gen.settings, generator=gen,
                                     image_checker=checker, progress=False, write_threads=n)
        names = set().union(*threads.values())
        assert len(threads) == len(p)
        assert (names == {threading.current_thread().name}) if n == 0 else all(t.startswith("isood-png") for t in names)
    a, b = folder_bytes(tmp_path / "0"), folder_bytes(tmp_path / "3")
    assert a == b and sum(k.endswith(".rejected") for k in a) == 4 and sum(k.endswith(".png") for k in a) == 6
    assert results[0].sha256 == results[3].sha256 and results[0].rejected == results[3].rejected
    assert results[3].generated == 6 and results[3].batches == 4


class SlowWrites:
    """A generator of solid images that records when each call starts; with ``checker`` (which sleeps) it
    shows which batches were written when the next generation began."""

    fingerprint = {"generator": "slow-writes"}

    def __init__(self):
        import threading

        self.lock = threading.Lock()
        self.starts: list[set] = []  # per call: the paths whose write (check) had finished by then
        self.finished: set = set()

    def __call__(self, prompts, negatives, seeds):
        from PIL import Image

        with self.lock:
            self.starts.append(set(self.finished))
        return [(Image.new("RGB", (8, 8), (int(s) % 256, 0, 0)), None) for s in seeds]

    def checker(self, image, row):
        import time

        time.sleep(0.05)
        if "teapot" in row["prompt"] and row["image_index"] == 1:
            raise RuntimeError("checker broke")
        with self.lock:
            self.finished.add(row["path"])
        return None


def test_pipelined_writes_overlap_generation_and_hold_at_most_two_batches(tmp_path):
    """Batch k generates while batch k-1 is written (its writes are not all done when k starts), and never
    before batch k-2 is written whole (at most 2 batches in flight)."""
    from generation.pipeline import GeneratorSettings
    from generation.sdxl import IN_FLIGHT, generate_images

    fake = SlowWrites()
    p = image_plan(n_labels=5, per_prompt=2)
    p = p[~p["prompt"].str.contains("teapot")].reset_index(drop=True)  # 8 images: no failure here
    generate_images(p, tmp_path, settings=GeneratorSettings(size=8, batch_size=2), generator=fake,
                    image_checker=fake.checker, progress=False, write_threads=2)
    batches = [set(p["path"][s:s + 2]) for s in range(0, len(p), 2)]
    assert IN_FLIGHT == 2 and len(fake.starts) == len(batches) == 4
    for k in range(1, len(batches)):
        assert not batches[k - 1] <= fake.starts[k]  # batch k-1 still being written when k generates
        if k >= 2:
            assert batches[k - 2] <= fake.starts[k]  # batch k-2 written whole before k generates


def test_pipelined_checker_failure_is_one_line_and_stops_generating(tmp_path):
    """A checker failing on an image written by the pool: the run stops with the one-line error naming the
    checker and the image, after at most one more batch generated; a rerun with a working checker resumes."""
    from generation.pipeline import GeneratorSettings
    from generation.sdxl import generate_images
    from isood.core.errors import IsoodError

    fake = SlowWrites()
    p = image_plan(n_labels=5, per_prompt=2)  # teapot is the 2nd prompt: batch 1 of 5 (batches of 2)
    bad = p.index[(p["prompt"].str.contains("teapot")) & (p["image_index"] == 1)][0]
    with pytest.raises(IsoodError) as e:
        generate_images(p, tmp_path, settings=GeneratorSettings(size=8, batch_size=2), generator=fake,
                        image_checker=fake.checker, progress=False, write_threads=2)
    msg = str(e.value)
    assert "\n" not in msg and "the safety checker checker failed on" in msg and p["path"][bad] in msg
    assert "checker broke" in msg and "pass another --safety-checker" in msg
    assert len(fake.starts) <= bad // 2 + 2 < 5  # the failing batch and at most one more generated
    res = generate_images(p, tmp_path, settings=GeneratorSettings(size=8, batch_size=2), generator=fake,
                          progress=False, write_threads=2)
    assert res.generated + res.skipped == len(p) and res.skipped >= bad


# ------------------------------------------------------------------------------------------- prompt embeddings
class CountingEncoder:
    """Wraps a text encoder's forward: counts the sequences it encodes."""

    def __init__(self, module):
        self.rows, self.forward = 0, module.forward

        def counted(input_ids, *a, **k):
            self.rows += len(input_ids)
            return self.forward(input_ids, *a, **k)

        module.forward = counted


@pytest.mark.parametrize("guidance", [0.0, 2.0])
def test_prompt_embeddings_once_per_unique_prompt_same_images(tiny_sdxl, guidance):
    """A batch of 5 images of 2 prompts (one with another negative prompt): the text encoders see each unique
    prompt once (and, guided, each unique (prompt, negative) pair's negative once) instead of 5 (10) strings,
    and the images are those of passing the strings, within one grey level (float rounding in another batch)."""
    from generation.pipeline import GeneratorSettings
    from generation.sdxl import SDXLGenerator

    spec, pipe = tiny_sdxl
    settings = GeneratorSettings(pipeline=spec, size=64, steps=1, batch_size=5, device="cpu",
                                 guidance_scale=guidance)
    prompts = ["a violin, anime", "a violin, anime", "a teapot, clay", "a violin, anime", "a teapot, clay"]
    negatives = ["blurry", "blurry", "", "blurry", "ugly"]
    seeds = [1, 2, 3, 4, 5]
    images = {}
    for embeds in (True, False):
        one, two = CountingEncoder(pipe.text_encoder), CountingEncoder(pipe.text_encoder_2)
        try:
            gen = SDXLGenerator(pipe, settings, prompt_embeds=embeds)
            images[embeds] = [np.asarray(im, dtype=np.int16) for im, _ in gen(prompts, negatives, seeds)]
        finally:
            del pipe.text_encoder.forward, pipe.text_encoder_2.forward
        unique = 3 if guidance > 1 else 2  # guided: (teapot, '') and (teapot, 'ugly') differ
        expect = (unique * (2 if guidance > 1 else 1)) if embeds else len(prompts) * (2 if guidance > 1 else 1)
        assert one.rows == two.rows == expect
        assert gen.encoded == (unique if embeds else 0)
    for a, b in zip(images[True], images[False]):
        assert np.abs(a - b).max() <= 1 and np.mean(a != b) < 0.01
    # each row gets its own prompt's embeddings: those of encoding that row's strings alone (the tiny model's
    # 1-step images barely depend on the prompt, so the images above cannot show it)
    import torch

    text = SDXLGenerator(pipe, settings).text_inputs(prompts, negatives)
    for j, (p, n) in enumerate(zip(prompts, negatives)):
        with torch.no_grad():
            alone = pipe.encode_prompt(prompt=[p], device="cpu", num_images_per_prompt=1,
                                       do_classifier_free_guidance=guidance > 1,
                                       negative_prompt=[n] if guidance > 1 else None)
        names = ["prompt_embeds", "negative_prompt_embeds", "pooled_prompt_embeds", "negative_pooled_prompt_embeds"]
        for name, ref in zip(names, alone):
            if name in text:
                torch.testing.assert_close(text[name][j:j + 1], ref, atol=1e-5, rtol=1e-5)
    assert not torch.allclose(text["prompt_embeds"][0], text["prompt_embeds"][2], atol=1e-3)
    assert set(text) == ({"prompt_embeds", "pooled_prompt_embeds"} | ({"negative_prompt_embeds",
                         "negative_pooled_prompt_embeds"} if guidance > 1 else set()))


# ------------------------------------------------------------------------------------------- exact search (part 2)
def test_nearest_and_shift_search_use_the_fused_search_on_cuda_via_auto(monkeypatch):
    """With a CUDA device present, ``nearest`` and ``shift_search`` with the default backend ('auto') run the
    fused search (here: its index built on the CPU in place of the GPU) and answer as a float64 brute force:
    every distance within 1e-6 (the target is >= 99.99% of rows) and the same level on every row."""
    import torch

    import isood.features.ann.fused as fused
    from isood.science.grid import assign_levels, bin_with_edges
    from isood.science.laid import LAID
    from isood.features.shift import nearest, shift_search
    from isood.science.simulate import random_orthogonal

    rng = np.random.default_rng(5)
    centres = rng.standard_normal((25, 32))
    unit = lambda x: (x / np.linalg.norm(x, axis=1, keepdims=True)).astype(np.float32)  # noqa: E731
    ref = unit(centres[rng.integers(0, 20, 4000)] + 0.3 * rng.standard_normal((4000, 32)))
    query = unit(np.concatenate([centres[rng.integers(0, 25, 1500)] + 0.3 * rng.standard_normal((1500, 32)),
                                 rng.standard_normal((500, 32))]))  # far queries: many near-ties
    built = []
    real = fused.FusedIndex.__init__

    def on_cpu(self, reference, **kw):
        built.append(kw.get("device"))
        real(self, reference, **{**kw, "device": "cpu", "kernel": "torch"})

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(fused.FusedIndex, "__init__", on_cpu)
    d, i = nearest(query, ref)
    assert len(built) == 1
    best = (query.astype(np.float64) @ ref.astype(np.float64).T).max(axis=1)
    exact_d = 1.0 - best
    assert np.mean(np.abs(d.astype(np.float64) - exact_d) <= 1e-6) == 1.0
    levels, edges = assign_levels(exact_d)
    assert np.array_equal(bin_with_edges(d.astype(np.float64), edges), levels)
    assert np.allclose(np.einsum("ij,ij->i", query.astype(np.float64), ref[i].astype(np.float64)), best, atol=1e-12)

    laid = LAID(random_orthogonal(32, seed=1))
    found = shift_search(query, ref, laid)
    assert len(built) == 3  # one resident index per LAID half
    qs, qc = laid.transform(query)
    rs, rc = laid.transform(ref)
    for q, r, got in ((qs, rs, found.d_sem), (qc, rc, found.d_cov)):
        q, r = unit(q), unit(r)
        want = 1.0 - (q.astype(np.float64) @ r.astype(np.float64).T).max(axis=1)
        assert np.abs(got.astype(np.float64) - np.clip(want, 0, 2)).max() < 2e-6


# ------------------------------------------------------------------------------------------- bench/gpu_suite.py
@pytest.fixture
def gpu_suite(monkeypatch):
    import importlib
    from pathlib import Path

    bench = next(p for p in Path(__file__).resolve().parents if (p / "pyproject.toml").is_file()) / "bench"
    monkeypatch.syspath_prepend(str(bench))
    return importlib.import_module("gpu_suite")


def test_gpu_suite_without_cuda_measures_nothing_and_exits_0(gpu_suite, monkeypatch, capsys):
    import torch

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    called = []
    monkeypatch.setitem(gpu_suite.BENCHES, "shift", (lambda *a: called.append(a), "x"))
    assert gpu_suite.main([]) == 0
    assert capsys.readouterr().out.strip().startswith("no CUDA: nothing measured") and called == []


def test_gpu_suite_cpu_smoke(gpu_suite, monkeypatch, capsys):
    """``--cpu-smoke`` runs the benches at tiny sizes on the CPU (here the search and the generation ones), each
    printing its SUMMARY line with its target, collected at the end; nothing is recorded; a bench that fails is
    one FAILED line, the others still run, exit status 1."""
    import _results
    import gpu_generate
    import shift_nn

    monkeypatch.setitem(shift_nn.GPU_SIZES, "smoke", (5_000, 1_000, 32, 50, 300, 300))
    monkeypatch.setattr(gpu_generate, "SMOKE", (6, 3))
    recorded = []
    monkeypatch.setattr(_results, "record", lambda *a, **k: recorded.append(a))
    assert gpu_suite.main(["--cpu-smoke", "--only", "shift,generate"]) == 0
    out = capsys.readouterr().out
    tail = out.split("== summary")[1]
    shift = [x for x in tail.splitlines() if x.startswith("SUMMARY shift_nn.gpu:")]
    gen = [x for x in tail.splitlines() if x.startswith("SUMMARY gpu_generate:")]
    assert len(shift) == len(gen) == 1 and recorded == []
    assert "same distance within 1e-6 100.0000%" in shift[0] and "target >= 99.99%" in shift[0]
    assert "target >= 90%" in gen[0] and "not judged (smoke)" in gen[0]

    def broken(*a):
        raise RuntimeError("no kernel image\nsecond line")

    monkeypatch.setitem(gpu_suite.BENCHES, "extract", (broken, "x"))
    assert gpu_suite.main(["--cpu-smoke", "--only", "extract,shift"]) == 1
    out = capsys.readouterr().out
    assert "FAILED extract: RuntimeError: no kernel image\n" in out
    assert "SUMMARY shift_nn.gpu:" in out.split("== summary")[1]
