"""Image decoding at GPU speed on one GPU for `isood extract` and `isood evaluate`, in ONE run.

Makes its own JPEGs (500x375, made-up photos: ``bench/decode.py``'s scenes, quality 75-95) in a temporary folder
and measures, each against its target:

(a) decoding on ONE core: PIL decode + resize (baseline: 317 img/s on one core of an H100 machine) and the
    reference decoding path (PIL + open_clip's ViT-B-32 transform: resize, crop, normalise);
(b) ``isood extract --decode gpu`` end to end (listing, hashing, nvJPEG decode, tensor steps on the GPU,
    ViT-B-32 with random weights, shards, manifest): target >= 8,000 img/s; and the cosine of its features to
    the reference decoding's (target >= 0.999);
(c) the CPU decoding path end to end on all cores (``--decode reference`` and ``fast``, ``--workers`` CPUs - 1
    decoding processes): target >= 0.7 x cores x the one-core rate of (a), and >= 3,500 img/s on 16 cores;
(d) `isood evaluate`'s forward pass (``scoring.run_detectors``, msp/energy/maxlogit, ResNet-50 from torchvision
    with random weights, batch 256, CPUs - 1 DataLoader workers): ``--decode gpu`` in fp32 (target >= 5,000
    img/s), bf16 and fp16 (channels-last, autocast), the reference decoding in fp32 (baseline: ~1,100 img/s),
    beside the model alone on a batch already on the device (fp32; fp16 channels-last).

Prints one ``SUMMARY gpu_extract.<measurement>: ...`` line per measurement with the measured ratio to its target
and appends one row to bench/results.local.md (``--no-record`` to skip; ``--smoke`` never records).

    python bench/gpu_extract.py --device cuda            # H100: 8,192 JPEGs; about 2 minutes (estimate)
    python bench/gpu_extract.py --smoke --device cpu     # tiny sizes: checks the script (< 1 minute on 2 cores)

``bench/gpu_suite.py`` calls ``run(device=..., smoke=...)`` (returns the SUMMARY lines) or ``main(argv)``.
"""
from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from _results import record, summary  # noqa: E402

TARGETS = {"extract_gpu": 8000.0, "extract_cpu_16": 3500.0, "scaling": 0.7, "evaluate_gpu": 5000.0,
           "cosine": 0.999}
#: Figures measured before on an H100 machine, printed beside this run's.
BASELINE = {"pil_one_core": 317.0, "evaluate_reference": 1100.0}


# ----------------------------------------------------------------------------------------------- images
def _one_jpeg(job) -> int:
    import numpy as np

    from decode import scene

    path, seed = job
    rng = np.random.default_rng(seed)
    w, h = (500, 375) if seed % 4 else (375, 500)
    scene(w, h, rng, gray=False).save(path, "JPEG", quality=int(rng.integers(75, 96)))
    return os.path.getsize(path)


def make_jpegs(root: Path, n: int) -> list[Path]:
    """``n`` made-up 500x375 (every 4th 375x500) JPEGs in 8 wnid folders, made on every core."""
    from multiprocessing import Pool

    files = []
    for i in range(n):
        wnid = f"n{1440764 + i % 8:08d}"
        (root / wnid).mkdir(parents=True, exist_ok=True)
        files.append(root / wnid / f"{wnid}_{i:05d}.JPEG")
    with Pool(os.cpu_count() or 1) as pool:
        pool.map(_one_jpeg, [(str(f), i) for i, f in enumerate(files)], chunksize=16)
    return sorted(files)


# ----------------------------------------------------------------------------------------------- measurements
def sync(device) -> None:
    import torch

    if str(device).startswith("cuda"):
        torch.cuda.synchronize()


def one_core(files, pp) -> dict:
    """(a) images/s on one core: PIL decode + resize to 224 (short side, bicubic), and the reference path."""
    import torch
    from PIL import Image

    from isood.features.decoding import decode_image

    torch.set_num_threads(1)
    t = time.perf_counter()
    for f in files:
        with Image.open(f) as im:
            im = im.convert("RGB")
            s = 224 / min(im.size)
            im.resize((round(im.size[0] * s), round(im.size[1] * s)), Image.BICUBIC)
    pil = len(files) / (time.perf_counter() - t)
    t = time.perf_counter()
    for f in files:
        decode_image(f, pp)
    ref = len(files) / (time.perf_counter() - t)
    return {"pil": pil, "reference": ref}


def clip_encoder(device: str):
    import open_clip
    import torch

    from isood.features.clip import ClipEncoder

    model, _, pp = open_clip.create_model_and_transforms("ViT-B-32", pretrained=None, device=device)
    model.eval()
    tok = open_clip.get_tokenizer("ViT-B-32")
    with torch.inference_mode():
        dim = int(model.encode_text(tok(["x"]).to(device)).shape[-1])
    return ClipEncoder(model, pp, tok, "bench-random:ViT-B-32", "ViT-B-32", torch.device(device), dim)


def extract(root: Path, encoder, out: Path, *, decode: str, workers: int, batch: int) -> tuple[float, object]:
    """Seconds of one `isood extract` run (end to end) and its features."""
    from isood.features.featurestore import extract_features, load_features

    sync(encoder.device)
    t = time.perf_counter()
    extract_features(root, encoder, out, batch_size=batch, decode_processes=workers, progress=False, decode=decode)
    sync(encoder.device)
    seconds = time.perf_counter() - t
    return seconds, load_features(out)[0]


def evaluate_rate(files, device: str, *, decode: str, precision: str, workers: int, batch: int) -> float:
    """(d) images/s of run_detectors (msp, energy, maxlogit) on ResNet-50 with random weights, no cache."""
    import torchvision

    from isood.classifiers.image_list import ImageList, default_transform
    from isood.classifiers.models import wrap_model
    from isood.classifiers.scoring import run_detectors

    adapter = wrap_model(torchvision.models.resnet50(weights=None), transform=default_transform())
    data = ImageList(files, [0] * len(files), adapter.transform, decode=decode)
    sync(device)
    t = time.perf_counter()
    run_detectors(adapter, "msp,energy,maxlogit", {"test": data}, device=device, num_workers=workers,
                  batch_size=batch, precision=precision)
    sync(device)
    return len(files) / (time.perf_counter() - t)


def model_only(device: str, batch: int, steps: int) -> dict:
    """(d) images/s of ResNet-50 alone on a batch already on the device: fp32; half precision channels-last."""
    import torch
    import torchvision

    from isood.classifiers.capture import precision_context

    model = torchvision.models.resnet50(weights=None).eval().to(device)
    x = torch.randn(batch, 3, 224, 224, device=device)
    half = "fp16" if str(device).startswith("cuda") else "bf16"
    out = {}
    for name, prec in (("fp32", "fp32"), (f"{half} channels-last", half)):
        if prec != "fp32":
            model = model.to(memory_format=torch.channels_last)
            x = x.contiguous(memory_format=torch.channels_last)
        with torch.inference_mode(), precision_context(device, prec):
            model(x)
            sync(device)
            t = time.perf_counter()
            for _ in range(steps):
                model(x)
            sync(device)
        out[name] = batch * steps / (time.perf_counter() - t)
    return out


def _verdict(ratio: float) -> str:
    return "meets" if ratio >= 1.0 else "misses"


# ----------------------------------------------------------------------------------------------- run
def run(device: str = "cuda", smoke: bool = False, images: int | None = None, batch: int | None = None,
        workers: int | None = None, record_row: bool = True) -> list[str]:
    """Every measurement (module docstring); returns the SUMMARY lines."""
    import torch

    from isood.core.devices import resolve_device
    from isood.core.workers import resolve_workers

    device = resolve_device(device)
    cuda = device.startswith("cuda")
    n = images or (16 if smoke else 8192)
    batch = batch or (8 if smoke else 256)
    workers = resolve_workers(workers).decode_processes
    cores = os.cpu_count() or 1
    lines: list[str] = []
    t_all = time.perf_counter()
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        t = time.perf_counter()
        files = make_jpegs(tmp / "img", n)
        made = time.perf_counter() - t
        kb = sum(f.stat().st_size for f in files) / n / 1024
        encoder = clip_encoder(device)
        a = one_core(files[: min(n, 16 if smoke else 512)], encoder.preprocess)
        torch.set_num_threads(1 if cuda else cores)  # the model's threads on a CPU run
        lines.append(summary("gpu_extract.decode_one_core",
                             f"PIL decode + resize {a['pil']:,.0f} img/s (baseline: "
                             f"{BASELINE['pil_one_core']:,.0f} on an H100 machine, "
                             f"{a['pil'] / BASELINE['pil_one_core']:.2f}x); reference decoding (resize, "
                             f"crop, normalise) {a['reference']:,.0f} img/s"))

        # (b) --decode gpu, warm-up first (cuDNN, nvJPEG, the DataLoader's fork) on a few images
        warm = tmp / "warm.txt"
        warm.write_text("\n".join(str(f) for f in files[: min(n, batch if smoke else 2 * batch)]) + "\n")
        extract(warm, encoder, tmp / "warm-gpu", decode="gpu", workers=workers, batch=batch)
        s_gpu, f_gpu = extract(tmp / "img", encoder, tmp / "gpu", decode="gpu", workers=workers, batch=batch)
        # (c) the CPU decoding path on all cores
        s_ref, f_ref = extract(tmp / "img", encoder, tmp / "ref", decode="reference", workers=workers, batch=batch)
        s_fast, _ = extract(tmp / "img", encoder, tmp / "fast", decode="fast", workers=workers, batch=batch)
        cos = (f_gpu * f_ref).sum(1)
        rate_gpu = n / s_gpu
        lines.append(summary("gpu_extract.extract_gpu",
                             f"--decode gpu {rate_gpu:,.0f} img/s end to end (target >= {TARGETS['extract_gpu']:,.0f}: "
                             f"{rate_gpu / TARGETS['extract_gpu']:.2f}x, {_verdict(rate_gpu / TARGETS['extract_gpu'])}); "
                             f"features vs --decode reference: cosine min {cos.min():.5f} mean {cos.mean():.6f} "
                             f"(target >= {TARGETS['cosine']}: {_verdict(float(cos.min()) / TARGETS['cosine'])})"))
        rate_ref, rate_fast = n / s_ref, n / s_fast
        scale = rate_ref / (cores * a["reference"])
        line = (f"--decode reference {rate_ref:,.0f} img/s end to end with {workers} decoding processes = "
                f"{scale:.2f} x cores x the one-core rate (target >= {TARGETS['scaling']}: "
                f"{_verdict(scale / TARGETS['scaling'])}); --decode fast {rate_fast:,.0f} img/s")
        if cores >= 16:
            line += (f"; target >= {TARGETS['extract_cpu_16']:,.0f} img/s on 16 cores: "
                     f"{rate_ref / TARGETS['extract_cpu_16']:.2f}x, {_verdict(rate_ref / TARGETS['extract_cpu_16'])}")
        lines.append(summary("gpu_extract.extract_cpu", line))
        del encoder, f_gpu, f_ref
        if cuda:
            torch.cuda.empty_cache()

        # (d) evaluate's forward pass
        precisions = ["fp32", "bf16"] + (["fp16"] if cuda else [])
        ev = {f"gpu {p}": evaluate_rate(files, device, decode="gpu", precision=p, workers=workers, batch=batch)
              for p in precisions}
        ev["reference fp32"] = evaluate_rate(files, device, decode="reference", precision="fp32", workers=workers,
                                             batch=batch)
        alone = model_only(device, batch, 1 if smoke else 20)
        g32 = ev["gpu fp32"]
        lines.append(summary("gpu_extract.evaluate",
                             "ResNet-50 run_detectors " + ", ".join(f"{k} {v:,.0f}" for k, v in ev.items())
                             + f" img/s (--decode gpu fp32 target >= {TARGETS['evaluate_gpu']:,.0f}: "
                             f"{g32 / TARGETS['evaluate_gpu']:.2f}x, {_verdict(g32 / TARGETS['evaluate_gpu'])}; "
                             f"reference fp32 vs the baseline ~{BASELINE['evaluate_reference']:,.0f}: "
                             f"{ev['reference fp32'] / BASELINE['evaluate_reference']:.2f}x); model alone "
                             + ", ".join(f"{k} {v:,.0f}" for k, v in alone.items()) + " img/s"))
    total = time.perf_counter() - t_all
    sizes = (f"{n} made-up JPEGs 500x375 ({kb:.0f} KB, made in {made:.1f} s), batch {batch}, {workers} decoding "
             f"workers, ViT-B-32 and ResNet-50 random weights, device {device}; whole run {total:.0f} s")
    print(sizes, flush=True)
    if record_row and not smoke:
        record("gpu_extract.py", sizes, " | ".join(ln.split(": ", 1)[1] for ln in lines), device=device)
    return lines


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--device", default="cuda")
    p.add_argument("--smoke", action="store_true", help="tiny sizes (checks the script; never recorded)")
    p.add_argument("--images", type=int, default=None, help="default 8,192 (--smoke: 16)")
    p.add_argument("--batch-size", type=int, default=None, help="default 256 (--smoke: 8)")
    p.add_argument("--workers", type=int, default=None, help="decoding processes (default: CPUs - 1)")
    p.add_argument("--no-record", action="store_true", help="do not append to bench/results.local.md")
    a = p.parse_args(argv)
    run(a.device, a.smoke, a.images, a.batch_size, a.workers, record_row=not a.no_record)
    return 0


if __name__ == "__main__":
    sys.exit(main())
