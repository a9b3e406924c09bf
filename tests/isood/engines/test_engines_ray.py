"""The Ray Data engine (isood.engines.ray) against the local engine, on a local 2-CPU Ray started once.

Equality: the ray engine writes the same files as the local one -- same file list, same tables (index,
rejected, shard rows, Syn-IS images/prompts/cells), same manifest content apart from timing and engine fields
(`created`, `argv`, config `engine`/`workers`/`ray`, generation seconds). Features are compared with allclose:
a Ray actor runs the same forward pass on the same batches, but in another process whose BLAS/OpenMP threads
may differ, so the last bits may differ. Images likewise: pixels within 1/255.
"""

from __future__ import annotations

import shutil
import sys
from dataclasses import replace

import numpy as np
import pandas as pd
import pytest
from typer.testing import CliRunner

import manifests
from isood.cli import app
from isood.engines.ray import RayEngine, RayOptions, pack_blocks, require_ray
from isood.core.errors import BadInputError, IsoodError
from isood.features.featurestore import extract_features, load_features
from isood.core.engine import LocalEngine

ENGINE_KEYS = {"engine", "workers", "ray"}  # config fields that name the engine, not the content


@pytest.fixture(scope="module")
def local_ray():
    import ray

    ray.init(num_cpus=2, include_dashboard=False, logging_level="ERROR")
    yield ray
    ray.shutdown()


def _files(meta):
    return {r["path"]: r["sha256"] for r in meta["files"]}


def _same_apart_from_engine(a: dict, b: dict) -> None:
    ca, cb = a["command"]["config"], b["command"]["config"]
    assert ca["engine"] == "local" and cb["engine"] == "ray"
    assert {k: v for k, v in ca.items() if k not in ENGINE_KEYS} == {k: v for k, v in cb.items() if k not in ENGINE_KEYS}
    for key in ("kind", "dataset_version", "tables", "inputs"):
        assert a[key] == b[key], key
    assert set(_files(a)) == set(_files(b))


# ------------------------------------------------------------------------------------------------ options
def test_missing_ray_is_one_line_with_the_install_hint(monkeypatch, tmp_path, tiny_clip_spec, tiny_images):
    monkeypatch.setitem(sys.modules, "ray", None)  # `import ray` now raises ImportError
    with pytest.raises(IsoodError) as e:
        require_ray()
    assert "pip install 'isood[ray]'" in str(e.value) and "\n" not in str(e.value)
    with pytest.raises(IsoodError, match=r"isood\[ray\]"):
        RayEngine(actors=2)
    res = CliRunner().invoke(app, ["extract", "--images", str(tiny_images), "--clip", tiny_clip_spec, "--out",
                                   str(tmp_path / "o"), "--engine", "ray"])
    assert res.exit_code == 2 and "pip install" in res.output and len(res.output.strip().splitlines()) == 1
    assert not (tmp_path / "o").exists()  # refused before touching the output


def test_workers_count_decoders_and_ray_workers_count_actors_with_the_ray_engine():
    """``--workers`` is the decoders of each model worker whatever the engine, ``--ray-workers`` the actors
    (``isood.cli.extract.engine_of``, ``isood.core.workers.resolve_workers``)."""
    from isood.cli.extract import engine_of
    from isood.core.workers import RAY_DECODE_PROCESSES, WorkerSpec, resolve_workers
    from isood.stages.extract import ExtractOptions

    opts = ExtractOptions(images="i", clip="c", out="o", engine="ray", decode_processes=3)
    engine = engine_of(opts, device=None)
    assert engine.actors is None and resolve_workers(opts.decode_processes, engine) == WorkerSpec(3, None)
    engine = engine_of(replace(opts, ray_actors=5), device=None)
    assert engine.actors == 5 and resolve_workers(opts.decode_processes, engine) == WorkerSpec(3, 5)
    assert resolve_workers(None, engine) == WorkerSpec(RAY_DECODE_PROCESSES, 5)  # threads of each actor
    assert "workers" not in engine.as_config()  # the spec is recorded once, in the manifest's workers entry


def test_bad_ray_options_are_refused(tiny_clip_spec, tiny_images, tmp_path):
    with pytest.raises(BadInputError, match="--ray-workers must be an integer >= 1, got 0"):
        RayOptions(actors=0)  # the option's description (EngineFields), also from Python
    with pytest.raises(BadInputError, match="--num-gpus-per-worker must be a finite number >= 0"):
        RayOptions(num_gpus_per_worker=float("nan"))
    with pytest.raises(BadInputError, match="contradicts"):
        RayOptions(num_gpus_per_worker=1).check_device("cpu")
    with pytest.raises(BadInputError, match="pass --device cuda"):
        RayEngine(device="cuda:1")
    with pytest.raises(TypeError):
        RayEngine(RayOptions(), actors=2)
    engine = RayEngine(num_gpus_per_worker=0)
    assert engine.device_name(None) == "cpu" and engine.actors is None
    assert RayEngine().device_name("cuda") == "cuda"
    # nothing asked: the device the cluster gives its actors (this machine's local cluster), not "auto"
    import torch

    assert RayEngine().device_name(None) == ("cuda" if torch.cuda.is_available() else "cpu")
    res = CliRunner().invoke(app, ["extract", "--images", str(tiny_images), "--clip", tiny_clip_spec, "--out",
                                   str(tmp_path / "x"), "--engine", "spark"])
    assert res.exit_code == 2 and "--engine 'spark': unknown value; pass local or ray" in res.output


def test_pack_blocks_keeps_batches_whole_and_in_order():
    import pickle

    batches = [{"x": list(range(n))} for n in (3, 3, 1, 5, 2)]  # 14 rows, 2 workers -> ~2 rows per block target
    blocks = pack_blocks(batches, actors=2)
    assert [ids for ids, _ in blocks] == [[0], [1], [2, 3], [4]]
    assert [pickle.loads(p) for _, ps in blocks for p in ps] == batches
    assert [ids for ids, _ in pack_blocks(batches, actors=1)] == [[0, 1], [2, 3], [4]]


# ------------------------------------------------------------------------------------------------ generic engine
class SumWorker:
    """A toy worker: each call returns, per row, the row's value + offset and the size of the batch it came in."""

    def __init__(self, offset: int):
        self.offset = offset

    def __call__(self, batch):
        x = np.asarray(batch["x"], dtype=np.int64)
        if (x < 0).any():
            raise BadInputError("negative value in batch; pass non-negative numbers")
        return {"x": x, "y": x + self.offset, "n": np.full(len(x), len(x)),
                "pair": np.stack([x, x], axis=1).astype(np.float32)}


class FailingInit:
    def __init__(self):
        raise IsoodError("no model here; pass --clip local-dir:PATH")

    def __call__(self, batch):  # pragma: no cover
        return batch


def test_ray_engine_maps_any_worker_with_local_batches(local_ray):
    batches = [{"x": np.arange(s, s + n)} for s, n in ((0, 3), (3, 3), (6, 1), (7, 4))]
    local = list(LocalEngine().map(SumWorker, (100,), batches, total=11, description="t", progress=False))
    ray = list(RayEngine(actors=2).map(SumWorker, (100,), batches, total=11, description="t", progress=False))
    assert len(ray) == len(local) == 4  # one result per input batch, never split
    by_first = {int(r["x"][0]): r for r in ray}
    for want in local:
        got = by_first[int(want["x"][0])]
        for key in want:
            np.testing.assert_array_equal(got[key], want[key])
    assert list(RayEngine().map(SumWorker, (0,), [], total=0, description="t", progress=False)) == []


def test_isood_errors_in_ray_workers_come_out_as_one_line(local_ray):
    with pytest.raises(BadInputError) as e:
        list(RayEngine(actors=1).map(SumWorker, (0,), [{"x": [1, -2]}], total=2, description="t", progress=False))
    assert "\n" not in str(e.value) and "non-negative" in str(e.value)
    with pytest.raises(IsoodError) as e:
        list(RayEngine(actors=1).map(FailingInit, (), [{"x": [1]}], total=1, description="t", progress=False))
    assert "\n" not in str(e.value) and "local-dir:PATH" in str(e.value)


# ------------------------------------------------------------------------------------------------ extraction
def test_extract_ray_equals_local(local_ray, tiny_clip_spec, image_dataset_factory, tmp_path):
    classes = {"n01440764": 6, "n01443537": 5, "n02084071": 4}
    images = image_dataset_factory(tmp_path / "img", classes=classes, seed=1, corrupt="n02084071/n02084071_bad.JPEG")
    kw = dict(batch_size=3, shard_size=4, device="cpu", progress=False)  # 16 files: 4 shards, one corrupt file
    local = extract_features(images, tiny_clip_spec, tmp_path / "local", decode_processes=0, **kw)
    engine = RayEngine(actors=2, device="cpu")
    ray = extract_features(images, tiny_clip_spec, tmp_path / "ray", decode_processes=2, engine=engine, **kw)

    assert (ray.n_images, ray.n_rejected, ray.embed_dim) == (local.n_images, local.n_rejected, local.embed_dim) == (15, 1, 32)
    assert ray.shards_written == [0, 1, 2, 3] and manifests.verify(tmp_path / "ray").ok
    fl, il = load_features(tmp_path / "local")
    fr, ir = load_features(tmp_path / "ray")
    pd.testing.assert_frame_equal(il, ir)
    np.testing.assert_allclose(fr, fl, rtol=0, atol=1e-5)
    assert np.allclose(np.linalg.norm(fr, axis=1), 1.0, atol=1e-5)

    ml, mr = manifests.read(tmp_path / "local", kind="features"), manifests.read(tmp_path / "ray", kind="features")
    _same_apart_from_engine(ml.meta, mr.meta)
    hl, hr = _files(ml.meta), _files(mr.meta)
    # tables and rows: same bytes (the card quotes each run's own command line and engine)
    assert {p for p in hl if hl[p] != hr[p]} <= {p for p in hl if p.endswith(".npy")} | {"README.md"}
    pd.testing.assert_frame_equal(ml.rejected, mr.rejected)
    assert mr.rejected["path"].tolist() == ["n02084071/n02084071_bad.JPEG"]
    assert mr.config["workers"] == {"decode_processes": 2, "ray_actors": 2} and "workers" not in mr.config["ray"]
    assert ml.config["workers"] == {"decode_processes": 0, "ray_actors": None} and mr.meta["summary"] == ml.meta["summary"]

    # a rerun finds every shard complete: nothing is recomputed (no Ray pipeline runs) and the content is kept
    again = extract_features(images, tiny_clip_spec, tmp_path / "ray", engine=engine, **kw)
    assert again.shards_written == [] and again.shards_reused == [0, 1, 2, 3]
    assert manifests.read(tmp_path / "ray").meta["content_sha256"] == mr.meta["content_sha256"]
    res = CliRunner().invoke(app, ["extract", "--images", str(images), "--clip", tiny_clip_spec, "--out", str(tmp_path / "ray"),
                                   "--engine", "ray", "--ray-workers", "2", "--batch-size", "3", "--shard-size", "4",
                                   "--device", "cpu"])
    assert res.exit_code == 0, res.output
    assert "15 images -> 32-d features, 1 rejected; shards written 0, reused 4" in res.output


# ------------------------------------------------------------------------------------------------ generation
@pytest.fixture(scope="module")
def syn_setup(tmp_path_factory, tiny_encoder):
    """A tiny SDXL pipeline folder, ID features (tiny-CLIP texts), a labels file and a LAID file."""
    import torch

    from isood.features.clip import encode_texts
    from isood.science.laid import LAID
    from isood.science.simulate import random_orthogonal
    from isood.dev.tiny_models import build_tiny_sdxl

    torch.set_num_threads(1)
    root = tmp_path_factory.mktemp("syn_ray")
    build_tiny_sdxl().save_pretrained(root / "sdxl")
    texts = [f"a photo of a {x}." for x in ("tench", "goldfish", "hen", "ostrich")]
    (root / "id").mkdir()
    np.save(root / "id" / "features.npy", encode_texts(tiny_encoder, texts))
    pd.DataFrame({"path": [f"id/{i}.png" for i in range(len(texts))]}).to_parquet(root / "id" / "index.parquet")
    (root / "labels.txt").write_text("n01440764\nn02084071\nred fox\nviolin\nteapot\n")
    LAID(random_orthogonal(tiny_encoder.embed_dim, seed=3)).save(root / "laid.safetensors")
    return root


def test_generate_syn_ray_equals_local(local_ray, syn_setup, tiny_clip_spec, tmp_path):
    from PIL import Image

    from isood.stages.syn import SynOptions, run_generate_syn

    def opts(out):
        return SynOptions(out=out, styles="sdxl:photographic,anime", labels=str(syn_setup / "labels.txt"),
                          clip=tiny_clip_spec, laid=str(syn_setup / "laid.safetensors"), id_features=str(syn_setup / "id"),
                          per_cell=1, images_per_prompt=2, pipeline=f"local-dir:{syn_setup / 'sdxl'}", size=64,
                          batch_size=3, seed=0, device="cpu", levels=3, na_threshold=2, progress=False)

    local = run_generate_syn(opts(tmp_path / "local"))
    ray = run_generate_syn(opts(tmp_path / "ray"), engine=RayEngine(actors=1, device="cpu"))
    assert manifests.verify(tmp_path / "ray").ok
    ml, mr = manifests.read(tmp_path / "local"), manifests.read(tmp_path / "ray")
    _same_apart_from_engine(ml.meta, mr.meta)
    n = ml.meta["summary"]["images"]
    assert n >= 4 and mr.meta["summary"]["images"] == n and ray.summary["generated"] == n
    assert ray.summary["batches"] == local.summary["batches"] == -(-n // 3)  # one pipeline call per plan slice
    for name in ("prompts", "cells", "edges", "rejected"):
        pd.testing.assert_frame_equal(ml.frame(name), mr.frame(name))
    il, ir = ml.frame("images"), mr.frame("images")
    pd.testing.assert_frame_equal(il.drop(columns="sha256"), ir.drop(columns="sha256"))
    for rel in il["path"]:
        a = np.asarray(Image.open(tmp_path / "local" / rel), dtype=np.int16)
        b = np.asarray(Image.open(tmp_path / "ray" / rel), dtype=np.int16)
        assert a.shape == b.shape == (64, 64, 3) and np.abs(a - b).max() <= 1, rel
    shutil.rmtree(tmp_path / "local")
