"""Decoding at GPU speed: rows of `isood extract --decode gpu` / `--workers N` and `isood evaluate
--decode gpu` / `--precision`, the real CLI on tiny data made here (the tiny open_clip of tests/conftest.py; a tiny
timm ResNet with random weights saved as a checkpoint). Without a GPU, `--decode gpu` runs its batched
decode_jpeg + tensor steps on CPU tensors, the code path a GPU runs with nvJPEG.

| row                          | input                                                  | guard                                           |
|------------------------------|--------------------------------------------------------|-------------------------------------------------|
| gpu: truncated JPEG          | a JPEG cut in half                                     | isood.features.image_tensors.device_decodes (EOI) -> reference |
| gpu: JPEG bomb header        | header 12000 x 12000                                   | tensor_decodes (MAX_IMAGE_PIXELS) -> check_pixels |
| gpu: corrupt scan            | complete JPEG, a second SOF in its scan data           | ImageDecoder.finish (decoder fails -> reference) |
| gpu: CMYK JPEG               | converted, not rejected                                | device_decodes (4 components) -> to_rgb          |
| workers                      | --workers 0 / 1 / 2 (processes)                        | isood.features.batch_decode.prepared_batches (chunks in order) |
| extract options              | --decode turbo                                         | check_decode_mode, cli.extract                  |
| evaluate options             | --decode fast, --precision fp64, fp16 on the CPU       | options.check_options, capture.check_precision  |
| evaluate gpu: unreadable     | a JPEG with a corrupt scan, --workers 1                | image_list.ImageList.finish -> UnreadableImagesError |
"""

from __future__ import annotations

import hashlib
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from PIL import Image

import manifests

WNID = "n01440764"


def _rgb(seed: int, h: int = 36, w: int = 44) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, 256, (h, w, 3), dtype=np.uint8)


def _dataset(root: Path) -> Path:
    """Two readable JPEGs and a PNG in one wnid folder."""
    (root / WNID).mkdir(parents=True, exist_ok=True)
    for i in range(2):
        Image.fromarray(_rgb(i)).save(root / WNID / f"ok_{i}.jpg", quality=90)
    Image.fromarray(_rgb(2)).save(root / WNID / "ok_2.png")
    return root


def _corrupt_scan(data: bytes) -> bytes:
    """A complete JPEG (header and end marker fine) with a second frame header inside its scan data."""
    sos = data.index(b"\xff\xda")
    return data[:sos + 40] + b"\xff\xc0\x00\x11" + data[sos + 44:]


def _extract(cli, spec, images, out, *extra):
    return cli.invoke(["extract", "--images", images, "--clip", spec, "--out", out, "--device", "cpu",
                       "--workers", "0", *extra])


def _truncated(d: Path, kit) -> str:
    Image.fromarray(_rgb(5, 64, 64)).save(d / "cut.jpg", quality=95)
    data = (d / "cut.jpg").read_bytes()
    (d / "cut.jpg").write_bytes(data[: len(data) // 2])
    return "cut.jpg"


def _bomb(d: Path, kit) -> str:
    (d / "bomb.jpg").write_bytes(kit.jpeg_claiming(12_000, 12_000))
    return "bomb.jpg"


def _scan(d: Path, kit) -> str:
    (d / "scan.jpg").write_bytes(_corrupt_scan((d / "ok_0.jpg").read_bytes()))
    return "scan.jpg"


@pytest.mark.parametrize("make", [_truncated, _bomb, _scan], ids=["truncated", "bomb_header", "corrupt_scan"])
def test_gpu_decode_rejects_the_rows_the_reference_rejects(make, cli, bad_images, tiny_clip_spec, tmp_path):
    root = _dataset(tmp_path / "images")
    bad = f"{WNID}/{make(root / WNID, bad_images)}"
    views = {}
    for mode in ("reference", "gpu"):
        r = _extract(cli, tiny_clip_spec, root, tmp_path / mode, "--decode", mode)
        assert r.exit_code == 0, r.output
        views[mode] = manifests.read(tmp_path / mode, kind="features")
    assert views["gpu"].rejected["path"].tolist() == [bad]
    assert views["gpu"].rejected.equals(views["reference"].rejected)  # the same error, worded the same
    assert views["gpu"].index["path"].tolist() == views["reference"].index["path"].tolist()


def test_gpu_decode_converts_a_cmyk_jpeg_as_the_reference(cli, tiny_clip_spec, tmp_path):
    root = _dataset(tmp_path / "images")
    Image.fromarray(_rgb(7, 50, 60)).convert("CMYK").save(root / WNID / "cmyk.jpg", quality=90)
    feats = {}
    for mode in ("reference", "gpu"):
        assert _extract(cli, tiny_clip_spec, root, tmp_path / mode, "--decode", mode).exit_code == 0
        from isood.features.featurestore import load_features

        x, index = load_features(tmp_path / mode)
        feats[mode] = dict(zip(index["path"], x))
    cmyk = f"{WNID}/cmyk.jpg"
    assert np.array_equal(feats["gpu"][cmyk], feats["reference"][cmyk])  # the reference path itself


@pytest.mark.parametrize("mode", ["reference", "gpu"])
def test_decoding_processes_do_not_change_a_byte(mode, cli, tiny_clip_spec, tiny_images, tmp_path):
    shards = {}
    for workers in (0, 1, 2):
        out = tmp_path / f"w{workers}"
        r = cli.invoke(["extract", "--images", tiny_images, "--clip", tiny_clip_spec, "--out", out, "--device",
                        "cpu", "--workers", workers, "--decode", mode, "--batch-size", "5", "--shard-size", "7"])
        assert r.exit_code == 0, r.output
        shards[workers] = {p.name: hashlib.sha256(p.read_bytes()).hexdigest()
                           for p in sorted(out.glob("features-*")) if not p.name.startswith(".~")}
        recorded = manifests.read(out, kind="features").config["workers"]
        assert recorded == {"decode_processes": workers, "ray_actors": None}
    assert len(shards[0]) == 6 and shards[0] == shards[1] == shards[2]


@pytest.mark.parametrize("extra, words", [
    (["--decode", "turbo"], ["--decode 'turbo'", "reference, fast or gpu"]),
])
def test_bad_extract_decode_option_is_one_line(extra, words, cli, tiny_clip_spec, tmp_path):
    root = _dataset(tmp_path / "images")
    line = cli.one_line_error(_extract(cli, tiny_clip_spec, root, tmp_path / "o", *extra))
    assert all(w in line for w in words), line
    assert not (tmp_path / "o").exists()


# ------------------------------------------------------------------------------------------------ evaluate
ID = ["n01440764", "n01443537"]
OOD = ["n02084071"]


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    import timm
    import torch
    from safetensors.torch import save_file

    from isood.science.grid import cell_name, cell_table, edges_table
    from isood.stages.splits import write_splits

    root = tmp_path_factory.mktemp("decode_matrix")
    rng = np.random.default_rng(0)
    colour = {w: rng.integers(30, 225, 3) for w in ID + OOD}

    def jpeg(path: Path, w: str) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        Image.fromarray(np.clip(colour[w] + rng.normal(0, 25, (24, 32, 3)), 0, 255).astype(np.uint8)).save(path)

    for w in ID:
        for i in range(4):
            jpeg(root / "train" / w / f"{w}_{i}.jpg", w)
            jpeg(root / "val" / w / f"{w}_{i}.jpg", w)
    rows = []
    for s in range(2):
        for i in range(4):
            w = ID[i % 2] if s == 0 else OOD[0]
            jpeg(root / "test" / w / f"{w}_s{s}_{i}.jpg", w)
            rows.append({"path": f"{w}/{w}_s{s}_{i}.jpg", "wnid": w, "d_sem": 0.1 + s, "d_cov": 0.1,
                         "sem_level": s, "cov_level": 0, "cell": cell_name(0, s)})
    images = pd.DataFrame(rows)
    write_splits(root / "splits", images=images, cells=cell_table(images["cov_level"], images["sem_level"], 2, 2),
                 edges=edges_table([0.0, 1.0, 2.0], [0.0, 1.0, 2.0]), argv=["test"],
                 config={"test_root": str(root / "test"), "n_levels": 2, "na_threshold": 2})
    torch.manual_seed(0)
    model = timm.create_model("test_resnet", pretrained=False, num_classes=2)
    save_file({k: v.contiguous() for k, v in model.state_dict().items()}, str(root / "resnet.safetensors"))
    return root


def _evaluate(world: Path, out: Path, *extra, id_test: Path | None = None) -> list:
    return ["evaluate", "--splits", world / "splits", "--id-test", id_test or world / "val", "--id-train",
            world / "train", "--model", "test_resnet", "--checkpoint", world / "resnet.safetensors",
            "--detectors", "msp,energy", "--na-threshold", "2", "--plot-metrics", "auroc", "--device", "cpu",
            "--cache-dir", out.parent / "cache", "--out", out, *extra]


def test_gpu_decode_and_bf16_evaluate(world, cli, tmp_path):
    r = cli.invoke(_evaluate(world, tmp_path / "ev", "--decode", "gpu", "--precision", "bf16", "--workers", "1"))
    assert r.exit_code == 0, r.output
    config = manifests.read(tmp_path / "ev", kind="evaluation").config
    assert (config["decode"], config["precision"]) == ("gpu", "bf16")


@pytest.mark.parametrize("extra, words", [
    (["--decode", "nearest"], ["--decode 'nearest'", "reference, fast or gpu"]),
    (["--precision", "fp64"], ["--precision 'fp64'", "fp32, fp16 or bf16"]),
    (["--precision", "fp16"], ["--precision fp16 runs on CUDA", "bf16"]),
])
def test_bad_evaluate_decode_or_precision_is_one_line_before_any_work(extra, words, world, cli, tmp_path):
    out = tmp_path / "ev"
    line = cli.one_line_error(cli.invoke(_evaluate(world, out, *extra)))
    assert all(w in line for w in words), line
    assert not out.exists() and not (tmp_path / "cache").exists()


def test_fast_decode_evaluate_matches_the_reference_inputs(world, cli, tmp_path):
    """evaluate --decode fast (as extract --decode fast): the classifier's inputs agree with its own transform on
    PIL images (cosine >= 0.999 per image), and the run records the mode."""
    import timm
    import torch

    from isood.classifiers.image_list import ImageList

    model = timm.create_model("test_resnet", pretrained=False, num_classes=2)
    transform = timm.data.create_transform(**timm.data.resolve_data_config({}, model=model))
    files = sorted((world / "val").rglob("*.jpg"))
    ref = ImageList(files, [0] * len(files), transform, decode="reference")
    fast = ImageList(files, [0] * len(files), transform, decode="fast")
    assert fast.decoder is not None and fast.decoder.jpeg_tensor  # the transform's steps: not the reference path
    a = torch.stack([ref[i][0] for i in range(len(files))]).flatten(1).double()
    b = fast.finish(fast.collate([fast[i] for i in range(len(files))]), "cpu")["image"].flatten(1).double()
    assert float(torch.nn.functional.cosine_similarity(a, b).min()) >= 0.999
    r = cli.invoke(_evaluate(world, tmp_path / "ev", "--decode", "fast"))
    assert r.exit_code == 0, r.output
    assert manifests.read(tmp_path / "ev", kind="evaluation").config["decode"] == "fast"


def test_gpu_decode_names_a_jpeg_neither_decoder_reads(world, cli, tmp_path):
    import shutil

    val = tmp_path / "val"
    shutil.copytree(world / "val", val)
    bad = val / ID[1] / f"{ID[1]}_1.jpg"
    bad.write_bytes(_corrupt_scan(bad.read_bytes()))
    out = tmp_path / "ev"
    line = cli.one_line_error(cli.invoke(_evaluate(world, out, "--decode", "gpu", "--workers", "1", id_test=val)))
    assert f"{ID[1]}_1.jpg" in line and "OSError" in line, line
    assert not (out / "manifest.json").exists()


@pytest.mark.parametrize("mode", ["fast", "gpu"])
def test_evaluate_decodes_with_the_batch_pipeline_of_extract(mode, world, monkeypatch):
    """evaluate --decode fast|gpu runs extract's batch decode pipeline (``isood.features.batch_decode``): every batch
    of an evaluation pass goes through ``ImageDecoder.finish``, and the inputs are those that pipeline makes from
    the same files (independent reference: ``image_decoder(transform, mode).decode``)."""
    import timm
    import torch

    from isood.classifiers.capture import extract_outputs
    from isood.classifiers.image_list import ImageList
    from isood.classifiers.models import wrap_model
    from isood.features.batch_decode import ImageDecoder, image_decoder

    model = timm.create_model("test_resnet", pretrained=False, num_classes=2)
    transform = timm.data.create_transform(**timm.data.resolve_data_config({}, model=model))
    files = sorted((world / "val").rglob("*.jpg"))
    finished = []
    finish = ImageDecoder.finish

    def spy(self, parts, names, device):
        finished.append(len(names))
        return finish(self, parts, names, device)

    monkeypatch.setattr(ImageDecoder, "finish", spy)
    data = ImageList(files, [0] * len(files), transform, decode=mode)
    outputs, _ = extract_outputs(wrap_model(model, name="test_resnet"), data, ("logits",), batch_size=3)
    assert finished == [3, 3, 2] and outputs.logits.shape == (len(files), 2)
    finished.clear()
    got = data.finish(data.collate([data[i] for i in range(len(files))]), "cpu")["image"]
    want = image_decoder(transform, mode).decode([str(f) for f in files])
    assert torch.allclose(got, torch.stack([t for t, _ in want]), atol=1e-6)
