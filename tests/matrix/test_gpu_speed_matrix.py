"""Issue 20 (GPU speed), checked on the CPU: what keeps a GPU busy must not change what is written.

| row | code | test |
|---|---|---|
| prompt text features for binning cached by content | ``generation.syn.load.measure_prompts`` (``encode_texts`` with the text-feature cache) | ``test_rerun_does_not_encode_the_prompts_again`` |
| PNG encode / hash / safety check / write on a thread pool while the next batch generates | ``generation.sdxl.GeneratorWorker.stream`` | ``test_pipelined_writes_*`` |
| each unique prompt of a batch encoded once, embeddings passed to the pipeline | ``generation.sdxl.SDXLGenerator`` (``encode_prompt``) | ``test_prompt_embeddings_*`` |
| ``bench/gpu_suite.py --cpu-smoke`` runs every bench at tiny sizes | ``bench/gpu_suite.py`` | ``test_gpu_suite_cpu_smoke`` |
"""
from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

import manifests
from generation.syn import SynOptions, run_generate_syn

STYLES = "sdxl:photographic,anime,pixel-art"


@pytest.fixture(scope="module")
def syn_inputs(tmp_path_factory, tiny_encoder):
    """ID features (tiny-CLIP text features of photos of 4 classes), a labels file and a LAID file."""
    from isood.clip import encode_texts
    from isood.laid import LAID
    from isood.simulate import random_orthogonal

    root = tmp_path_factory.mktemp("gpu_speed_inputs")
    texts = [f"a photo of a {x}." for x in ("tench", "goldfish", "hen", "ostrich")]
    (root / "id").mkdir()
    np.save(root / "id" / "features.npy", encode_texts(tiny_encoder, texts))
    pd.DataFrame({"path": [f"id/{i}.png" for i in range(len(texts))], "wnid": [""] * len(texts)}).to_parquet(
        root / "id" / "index.parquet")
    LAID(random_orthogonal(tiny_encoder.embed_dim, seed=3)).save(root / "laid.safetensors")
    (root / "labels.txt").write_text("n01440764\nred fox\nsailboat\nvolcano\nteapot\nviolin\n")
    return {"labels": root / "labels.txt", "laid": root / "laid.safetensors", "id_features": root / "id"}


def syn_options(syn_inputs, out, clip, **kw):
    base = dict(out=out, styles=STYLES, labels=str(syn_inputs["labels"]), clip=clip, laid=str(syn_inputs["laid"]),
                id_features=str(syn_inputs["id_features"]), per_cell=1, images_per_prompt=2, size=64, steps=1,
                batch_size=3, seed=0, device="cpu", n_levels=4, na_threshold=2, progress=False)
    base.update(kw)
    return SynOptions(**base)


# ------------------------------------------------------------------------------------------- text-feature cache
def test_rerun_does_not_encode_the_prompts_again(syn_inputs, tiny_clip_spec, isood_cache, tmp_path, monkeypatch):
    """A rerun with the same CLIP and prompts reads the prompts' CLIP text features from the cache (the text
    encoder is not called) and bins every prompt as the first run did; another CLIP (other weights) misses."""
    import generation.syn.load as load

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
