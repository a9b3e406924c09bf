"""`isood evaluate --decode gpu` and `--precision fp16|bf16` on a tiny timm model (random weights saved as
a checkpoint) and JPEGs made here: the gpu decoding (run here on the CPU: the same batched decode_jpeg + tensor
steps) and bf16 keep the scores' ranking and each cell's AUROC; both are part of the output-cache key; unreadable
images are named as the reference names them; fp16 is CUDA-only (a GPU test compares it with fp32)."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
import torch
from scipy.stats import spearmanr

from isood.evaluation import metrics as M
from isood.stages.evaluate.job import run_evaluate
from isood.stages.evaluate.options import EvaluateOptions
from isood.science.grid import cell_name, cell_table, edges_table
from isood.stages.splits import write_splits

pytestmark = pytest.mark.usefixtures("one_thread")

ID = ["n01440764", "n01443537", "n01484850"]
OOD = ["n02084071", "n04399382"]
PER_CELL = 16  # (cov, sem) cells of the 2 x 2 grid, every one measured (>= --na-threshold)
DETECTORS = "msp,energy,maxlogit,knn:k=3"  # (MDS on 30 training images: a near-singular covariance, too touchy)


def _jpeg(path, colour, rng, shift=0.0, noise=40.0, size=(72, 54)):
    from PIL import Image

    path.parent.mkdir(parents=True, exist_ok=True)
    a = np.clip(colour + shift + rng.normal(0, noise, (size[1], size[0], 3)), 0, 255).astype(np.uint8)
    Image.fromarray(a).save(path, quality=90)


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    """ID train (10 per class) / ID test (8 per class) JPEG folders; a splits manifest of 4 cells x 16 JPEGs whose
    semantic-shift cells hold OOD classes coloured between the ID ones (overlapping scores: AUROC < 1); a
    test_resnet checkpoint."""
    import timm
    from safetensors.torch import save_file

    root = tmp_path_factory.mktemp("decode-precision")
    rng = np.random.default_rng(0)
    colour = {w: rng.integers(40, 215, 3).astype(float) for w in ID}
    colour[OOD[0]] = (colour[ID[0]] + colour[ID[1]]) / 2
    colour[OOD[1]] = (colour[ID[1]] + colour[ID[2]]) / 2
    for w in ID:
        for i in range(10):
            _jpeg(root / "train" / w / f"{w}_{i}.jpg", colour[w], rng)
        for i in range(8):
            _jpeg(root / "val" / w / f"{w}_{i}.jpg", colour[w], rng)
    rows = []
    for c in range(2):
        for s in range(2):
            for i in range(PER_CELL):
                w = ID[i % 3] if s == 0 else OOD[i % 2]
                rel = f"{w}/{w}_c{c}s{s}_{i}.jpg"
                _jpeg(root / "test" / rel, colour[w], rng, shift=25.0 * c, size=(72 + 8 * (i % 3), 54))
                rows.append({"path": rel, "wnid": w, "d_sem": 0.1 + s, "d_cov": 0.1 + c, "sem_level": s,
                             "cov_level": c, "cell": cell_name(c, s)})
    images = pd.DataFrame(rows)
    write_splits(root / "splits", images=images, cells=cell_table(images["cov_level"], images["sem_level"], 2, 2),
                 edges=edges_table([0.0, 1.0, 2.0], [0.0, 1.0, 2.0]), argv=["test"],
                 config={"test_root": str(root / "test"), "n_levels": 2, "na_threshold": 5})
    torch.manual_seed(0)
    model = timm.create_model("test_resnet", pretrained=False, num_classes=3)
    save_file({k: v.contiguous() for k, v in model.state_dict().items()}, str(root / "resnet.safetensors"))
    return root


def _opts(world, out, **kw) -> EvaluateOptions:
    return EvaluateOptions(splits=str(world / "splits"), out=str(out), id_test=str(world / "val"),
                           id_train=str(world / "train"), model="test_resnet",
                           checkpoint=str(world / "resnet.safetensors"), detectors=DETECTORS, na_threshold=5,
                           cache_dir=str(world / "cache"), plot_metrics="auroc", device="cpu", batch_size=16,
                           progress=False, **kw)


def _adapter(world):
    from isood.classifiers.named import adapter_from_option

    return adapter_from_option("test_resnet", checkpoint=str(world / "resnet.safetensors"), num_classes=None,
                               n_id_classes=3)


@pytest.fixture(scope="module")
def runs(world, tmp_path_factory):
    """mode -> (scores table, per-cell metrics, forward batches) of one evaluation per (decode, precision)."""
    torch.set_num_threads(1)
    out = tmp_path_factory.mktemp("runs")
    got = {}
    for decode, precision in (("reference", "fp32"), ("gpu", "fp32"), ("reference", "bf16"), ("gpu", "bf16")):
        adapter = _adapter(world)
        r = run_evaluate(_opts(world, out / f"{decode}-{precision}", decode=decode, precision=precision),
                         adapter=adapter)
        got[decode, precision] = (r.manifest.frame("scores"), r.evaluation.per_cell, adapter.forward_calls)
    return got


def _flippable_share(id_scores, ood_scores, error):
    """The share of (ID, OOD) pairs whose score gap is within ``2 * error``: only these can swap when every
    score moves by at most ``error``, so AUROC can move by at most this much."""
    gap = np.abs(np.subtract.outer(np.asarray(id_scores), np.asarray(ood_scores)))
    return float((gap <= 2 * error).mean())


@pytest.mark.parametrize("mode", [("gpu", "fp32"), ("reference", "bf16"), ("gpu", "bf16")])
def test_scores_keep_their_ranking_and_each_cells_auroc(runs, mode):
    base_scores, base_cells, _ = runs["reference", "fp32"]
    scores, cells, _ = runs[mode]
    assert scores[["dataset", "path", "cell"]].equals(base_scores[["dataset", "path", "cell"]])
    overlapping = 0
    for det in ("msp", "energy", "maxlogit", "knn"):
        a, b = base_scores[det].to_numpy(), scores[det].to_numpy()
        assert not np.array_equal(a, b), det  # another path really ran
        # bf16 keeps ~3 significant digits: ranks agree but for near-ties; gpu decoding moves pixels by a grey level
        assert spearmanr(a, b)[0] >= (0.999 if mode[1] == "fp32" else 0.98), det
        error = float(np.abs(a - b).max())
        ids = base_scores["dataset"] == "id_test"
        for cell, rows in base_scores[base_scores["dataset"] == "splits"].groupby("cell"):
            assert len(rows) == PER_CELL
            sel = base_scores.index.isin(rows.index)
            want, got = (float(c.query(f"detector == '{det}' and cell == '{cell}'")["auroc"].iloc[0])
                         for c in (base_cells[base_cells["dataset"] == "splits"], cells[cells["dataset"] == "splits"]))
            assert want == pytest.approx(M.auroc(a[ids], a[sel]))
            # within 1e-3, or within the pairs whose fp32 gap the other path's score error can bridge (a cell of 16
            # images against 24 ID ones weighs each pair 1/384 = 0.0026: one swapped near-tie exceeds 1e-3)
            assert abs(got - want) <= max(1e-3, _flippable_share(a[ids], a[sel], error)), (det, cell, got, want)
            overlapping += 0.05 < want < 0.95
    assert overlapping >= 8  # most cells' scores overlap: their AUROC could move


def test_decode_and_precision_are_in_the_cache_key_and_the_manifest(runs, world, tmp_path):
    assert all(calls > 0 for _, _, calls in runs.values())  # each mode ran its own passes: no cache hit across
    for decode, precision in runs:
        adapter = _adapter(world)
        r = run_evaluate(_opts(world, tmp_path / f"{decode}-{precision}", decode=decode, precision=precision),
                         adapter=adapter)
        assert adapter.forward_calls == 0  # the same mode again: every output from the cache
        config = r.manifest.config
        assert (config["decode"], config["precision"]) == (decode, precision)


def test_unreadable_jpegs_are_named_alike_in_both_decodings(world, tmp_path):
    import shutil

    from isood.classifiers.image_list import UnreadableImagesError

    val = tmp_path / "val"
    shutil.copytree(world / "val", val)
    good = val / ID[0] / f"{ID[0]}_0.jpg"
    (val / ID[0] / "cut.jpg").write_bytes(good.read_bytes()[:600])  # a JPEG cut short
    (val / ID[1] / "text.jpg").write_text("not an image")
    data = good.read_bytes()  # complete, a second frame header in its scan: the device decoder fails, so does PIL
    sos = data.index(b"\xff\xda")
    (val / ID[2] / "twosof.jpg").write_bytes(data[:sos + 40] + b"\xff\xc0\x00\x11" + data[sos + 44:])
    named = {}
    for decode in ("reference", "gpu"):
        opts = _opts(world, tmp_path / decode, decode=decode)
        with pytest.raises(UnreadableImagesError) as e:
            run_evaluate(EvaluateOptions(**{**opts.__dict__, "id_test": str(val)}), adapter=_adapter(world))
        named[decode] = sorted(e.value.images)
    assert named["gpu"] == named["reference"] and len(named["gpu"]) == 3


def test_a_jpeg_the_device_refuses_is_read_the_reference_way(world, monkeypatch):
    """The ``gpu`` batch decoder failing on one JPEG (nvJPEG refusing it): that image is read by PIL + the
    transform, the others are decoded on the device; every input as the reference path makes it (up to the
    decoders' rounding)."""
    import torchvision.io as tio

    from isood.classifiers.image_list import ImageList

    files = sorted((world / "val").rglob("*.jpg"))[:6]
    adapter = _adapter(world)
    odd = files[2].read_bytes()
    original = tio.decode_jpeg

    def refuses(input, *args, **kwargs):
        inputs = input if isinstance(input, list) else [input]
        if any(x.numel() == len(odd) and bytes(x.numpy()) == odd for x in inputs):
            raise RuntimeError("nvjpeg: unsupported JPEG")
        return original(input, *args, **kwargs)

    monkeypatch.setattr(tio, "decode_jpeg", refuses)
    ref, gpu = (ImageList(files, [0] * 6, adapter.transform, decode=d) for d in ("reference", "gpu"))
    want = ImageList.collate([ref[i] for i in range(6)])
    got = gpu.finish(ImageList.collate([gpu[i] for i in range(6)]), "cpu")
    assert torch.equal(got["label"], want["label"]) and got["unreadable"] == []
    assert torch.equal(got["image"][2], want["image"][2])  # the reference path itself
    diff = (got["image"] - want["image"]).abs()
    assert float(diff.mean()) < 0.01 and not torch.equal(got["image"], want["image"])


def test_odin_keeps_float32_in_a_bf16_run(tiny, tiny_data):
    """ODIN perturbs the input along its loss gradient: under autocast without loss scaling that gradient can
    underflow, so its forward + backward stay in float32 while the capture pass runs in bf16."""
    from isood.classifiers.models import wrap_model
    from isood.classifiers.scoring import run_detectors

    backbone, fc = tiny
    _, _, test, _ = tiny_data
    got = {}
    for precision in ("fp32", "bf16"):
        adapter = wrap_model(backbone=backbone, fc=fc, input_std=(0.2, 0.2, 0.2))
        # temperature 1: at OpenOOD's 1000 the softmax is nearly flat and hides any precision
        got[precision] = run_detectors(adapter, "odin:temperature=1,msp", {"test": test}, precision=precision).scores
    odin = [got[p]["odin"]["test"] for p in ("fp32", "bf16")]
    msp = [got[p]["msp"]["test"] for p in ("fp32", "bf16")]
    assert np.abs(odin[0] - odin[1]).max() < 1e-6  # float32 both times
    assert np.abs(msp[0] - msp[1]).max() > 1e-5  # the capture pass did run in bf16


def test_fp16_is_refused_on_the_cpu_before_any_work(world, tmp_path):
    from isood.core.errors import BadInputError

    with pytest.raises(BadInputError, match="--precision fp16 runs on CUDA"):
        run_evaluate(_opts(world, tmp_path / "o", precision="fp16"))
    assert not (tmp_path / "o").exists()


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_fp16_and_nvjpeg_on_cuda_keep_the_ranking(world, runs, tmp_path):
    base_scores, _, _ = runs["reference", "fp32"]
    for decode, precision in (("gpu", "fp32"), ("gpu", "fp16"), ("reference", "fp16")):
        r = run_evaluate(EvaluateOptions(**{**_opts(world, tmp_path / f"{decode}-{precision}").__dict__,
                                            "device": "cuda", "decode": decode, "precision": precision}),
                         adapter=_adapter(world))
        scores = r.manifest.frame("scores")
        for det in ("msp", "maxlogit", "knn"):
            assert spearmanr(base_scores[det], scores[det])[0] >= 0.98, (decode, precision, det)
