"""Image decoding per CPU core: today's reference path vs reduced-size JPEG decoding and tensor resizing, and
what each does to the CLIP features.

On a GPU, CLIP extraction of ImageNet-sized JPEGs (~500x375) is bound by decoding and preprocessing on the CPU,
not by the model. This bench makes JPEGs with ImageNet's size distribution (made up: smooth random scenes,
quality 75-95, 4:2:0; half 500x375 / 375x500 / 500x333 / 500x500, 44% smaller, 6% larger, 3% grayscale)
and times, on ONE thread (images/s per core, CPU time, best of ``--repeats``), the paths from file to the
model's input tensor:

* ``reference``  PIL full decode -> open_clip's own transform (PIL bicubic resize, crop, ToTensor, Normalize)
                 = ``isood extract`` today and by default;
* ``draft``      (a) PIL ``Image.draft('RGB', (D, D))`` (libjpeg DCT scaling by 1/2, 1/4 or 1/8, never below
                 D = 2x the model's input) -> the same open_clip transform, as is (it sizes the resize from
                 the drafted image, whose rounded size shifts the crop);
* ``tv-decode``  (b) ``torchvision.io.decode_jpeg`` -> open_clip's resize/crop/normalise steps on the uint8
                 tensor (torch's SIMD antialiased bicubic; ``isood.features.image_tensors.tensor_preprocess``);
* ``tensor``     PIL full decode -> the same tensor steps (isolates the resize);
* ``fast``       ``isood extract --decode fast`` (``isood.features.decoding.FAST_DECODE``): the tensor steps; JPEGs with
                 both sides >= 2D drafted to >= D and mapped exactly onto the full image's geometry, other
                 JPEGs decoded by torchvision, other formats by PIL;
* ``gpu``        ``isood extract --decode gpu`` (``isood.features.decoding.GPU_DECODE``) with the model on the CPU: the
                 JPEGs decoded by torchvision's decode_jpeg on CPU tensors (libjpeg; nvJPEG on a GPU, which
                 ``bench/gpu_extract.py`` measures), then the tensor steps; one image per call here.

For each path it reports the cosine between the features of its tensors and those of the reference tensors,
min and mean over the images, on two tiny open_clip models with seeded random weights: the test fixture's
(32 px input) and the same with a 224 px input (ViT patch 32), so the resize ratio is ImageNet's. Random
weights are a weak judge of "same features" (features of different images are already close), so the row
also gives the centred cosine (the mean reference feature subtracted), the cosine between DIFFERENT images
(the scale a 0.999 threshold sits on) and the mean absolute difference of the input tensors (model-free).

    python bench/decode.py                 # 300 JPEGs, best of 3 (under a minute on 2 cores)
    python bench/decode.py --images 1000 --repeats 5
    python bench/decode.py --sizes large --images 100   # camera-sized JPEGs: where drafting pays
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

PREPROCESS = {"mean": [0.48145466, 0.4578275, 0.40821073], "std": [0.26862954, 0.26130258, 0.27577711],
              "interpolation": "bicubic", "resize_mode": "shortest"}
TEXT = {"context_length": 77, "vocab_size": 49408, "width": 64, "heads": 2, "layers": 2}
MODELS = {  # name -> open_clip vision config (32 px: tests/conftest.py's tiny model)
    "tiny-32px": {"image_size": 32, "layers": 2, "width": 64, "head_width": 32, "patch_size": 8},
    "tiny-224px": {"image_size": 224, "layers": 2, "width": 64, "head_width": 32, "patch_size": 32},
}
PATHS = ("reference", "draft", "tv-decode", "tensor", "fast", "gpu")
THRESHOLD = 0.999


# ----------------------------------------------------------------------------------------------- images
def imagenet_like_sizes(n: int, rng) -> list[tuple[int, int]]:
    """(w, h) of ``n`` images (mean about 420x380; ImageNet's is about 400x350, most at 500 px on the long
    side): 28% 500x375, 8% 375x500, 7% 500x333, 4% 333x500, 3% 500x500, 44% smaller (long side 160-480, aspect
    3:4..1), 6% larger (long side 600-1300, 4:3 or 3:4)."""
    common = [(500, 375)] * 28 + [(375, 500)] * 8 + [(500, 333)] * 7 + [(333, 500)] * 4 + [(500, 500)] * 3
    out = []
    for _ in range(n):
        u = int(rng.integers(0, 100))
        if u < len(common):
            out.append(common[u])
        elif u < 94:
            long, aspect = int(rng.integers(160, 481)), float(rng.uniform(0.75, 1.0))
            out.append((long, int(long * aspect)) if rng.random() < 0.6 else (int(long * aspect), long))
        else:
            long = int(rng.integers(600, 1301))
            out.append((long, long * 3 // 4) if rng.random() < 0.7 else (long * 3 // 4, long))
    return out


def scene(w: int, h: int, rng, gray: bool):
    """A made-up photo: a random colour field (10 px cells, bicubic), a dozen ellipses, sensor noise (sigma 20)
    -- about ImageNet's bytes per pixel (its train JPEGs average ~110 KB: 138 GB / 1.28 M files)."""
    import numpy as np
    from PIL import Image, ImageDraw

    small = rng.integers(0, 256, size=(max(2, h // 10), max(2, w // 10), 3)).astype(np.uint8)
    im = Image.fromarray(small).resize((w, h), Image.BICUBIC)
    draw = ImageDraw.Draw(im)
    for _ in range(12):
        x0, y0 = int(rng.integers(0, w)), int(rng.integers(0, h))
        x1, y1 = x0 + int(rng.integers(5, max(6, w // 2))), y0 + int(rng.integers(5, max(6, h // 2)))
        draw.ellipse([x0, y0, x1, y1], fill=tuple(int(c) for c in rng.integers(0, 256, 3)))
    a = np.asarray(im, dtype=np.float32) + rng.normal(0, 20, size=(h, w, 3))
    im = Image.fromarray(np.clip(a, 0, 255).astype(np.uint8))
    return im.convert("L") if gray else im


def large_sizes(n: int, rng) -> list[tuple[int, int]]:
    """(w, h) of ``n`` camera-sized images (``--sizes large``): long side 1000-2000, 4:3 or 3:4."""
    out = []
    for _ in range(n):
        long = int(rng.integers(1000, 2001))
        out.append((long, long * 3 // 4) if rng.random() < 0.7 else (long * 3 // 4, long))
    return out


def make_jpegs(root: Path, n: int, seed: int, sizes: str = "imagenet") -> dict:
    """``n`` JPEGs under ``root``; returns their facts (files, mean size, bytes)."""
    import numpy as np

    rng = np.random.default_rng(seed)
    root.mkdir(parents=True, exist_ok=True)
    files, nbytes = [], 0
    sizes = imagenet_like_sizes(n, rng) if sizes == "imagenet" else large_sizes(n, rng)
    for i, (w, h) in enumerate(sizes):
        p = root / f"img_{i:05d}.JPEG"
        scene(w, h, rng, gray=rng.random() < 0.03).save(p, "JPEG", quality=int(rng.integers(75, 96)))
        files.append(p)
        nbytes += p.stat().st_size
    ws, hs = np.array(sizes).T
    return {"files": files, "sizes": sizes, "mean_w": float(ws.mean()), "mean_h": float(hs.mean()),
            "kb": nbytes / n / 1024, "share_500x375": float(np.mean([s in ((500, 375), (375, 500)) for s in sizes]))}


# ----------------------------------------------------------------------------------------------- model, paths
def tiny_clip(vision: dict):
    """A seeded random tiny open_clip CLIP (as tests/conftest.py builds it) and its eval transform."""
    import open_clip
    import torch
    from open_clip.model import CLIP

    torch.manual_seed(0)
    model = CLIP(embed_dim=32, vision_cfg=vision, text_cfg=TEXT).eval()
    with torch.no_grad():
        for p in model.parameters():
            p.add_(0.02 * torch.randn_like(p))
    pp = open_clip.image_transform(vision["image_size"], is_train=False, mean=PREPROCESS["mean"],
                                   std=PREPROCESS["std"], resize_mode="shortest", interpolation="bicubic")
    return model, pp


def path_functions(pp) -> dict:
    """path name -> f(file) -> input tensor (3, S, S)."""
    from isood.features.image_tensors import draft_size, read_jpeg_tensor, tensor_preprocess
    from isood.features.decoding import FAST_DECODE, GPU_DECODE, decode_image
    from isood.features.batch_decode import image_decoder

    steps, draft = tensor_preprocess(pp), draft_size(pp)
    fast, gpu = image_decoder(pp, FAST_DECODE), image_decoder(pp, GPU_DECODE)

    def checked(item):
        tensor, error = item
        if tensor is None:
            raise RuntimeError(error)
        return tensor

    return {
        "reference": lambda f: checked(decode_image(f, pp)),
        "draft": lambda f: checked(decode_image(f, pp, draft=draft)),
        "tv-decode": lambda f: steps(read_jpeg_tensor(f)),
        "tensor": lambda f: checked(decode_image(f, steps)),
        "fast": lambda f: checked(fast.decode([str(f)])[0]),
        "gpu": lambda f: checked(gpu.decode([str(f)])[0]),
    }


def time_paths(fns: dict, files, repeats: int) -> dict:
    """path -> (best CPU seconds per pass, best wall seconds per pass); passes interleaved, so a busy spell of
    the machine hits every path alike."""
    best = {k: [float("inf"), float("inf")] for k in fns}
    for r in range(repeats):
        for name in list(fns)[r % len(fns):] + list(fns)[:r % len(fns)]:
            c, t = time.process_time(), time.perf_counter()
            for f in files:
                fns[name](f)
            best[name][0] = min(best[name][0], time.process_time() - c)
            best[name][1] = min(best[name][1], time.perf_counter() - t)
    return best


def features(model, tensors):
    import torch

    with torch.inference_mode():
        out = [model.encode_image(torch.stack(tensors[s: s + 64])) for s in range(0, len(tensors), 64)]
    return torch.nn.functional.normalize(torch.cat(out).float(), dim=-1).numpy()


def compare(model, fns: dict, files) -> dict:
    """path -> cosine/centred cosine to the reference features (min, mean) and mean |input difference|."""
    import numpy as np

    inputs = {k: [fn(f) for f in files] for k, fn in fns.items()}
    feats = {k: features(model, v) for k, v in inputs.items()}
    ref = feats["reference"]
    centre = ref.mean(0)

    def unit(x):
        return x / np.linalg.norm(x, axis=1, keepdims=True)

    out = {}
    for k, x in feats.items():
        cos = (x * ref).sum(1)
        ccos = (unit(x - centre) * unit(ref - centre)).sum(1)
        diff = np.mean([float((a - b).abs().mean()) for a, b in zip(inputs[k], inputs["reference"])])
        out[k] = {"min": float(cos.min()), "mean": float(cos.mean()), "cmin": float(ccos.min()),
                  "cmean": float(ccos.mean()), "input_diff": diff}
    gram = ref @ ref.T
    out["between_images"] = float((gram.sum() - np.trace(gram)) / (len(ref) * (len(ref) - 1)))
    return out


def decoded_pixels(files, size) -> float:
    """Pixels decoded with draft to ``size`` / without, summed over ``files``."""
    from PIL import Image

    full = drafted = 0
    for f in files:
        with Image.open(f) as im:
            full += im.size[0] * im.size[1]
            im.draft("RGB", size)
            drafted += im.size[0] * im.size[1]
    return drafted / full


# ----------------------------------------------------------------------------------------------- run
def run_model(name: str, facts: dict, repeats: int) -> dict:
    from isood.features.image_tensors import draft_size

    model, pp = tiny_clip(MODELS[name])
    fns = path_functions(pp)
    times = time_paths(fns, facts["files"], repeats)
    n = len(facts["files"])
    rate = {k: n / t[0] for k, t in times.items()}
    wall = {k: n / t[1] for k, t in times.items()}
    return {"rate": rate, "wall": wall, "cos": compare(model, fns, facts["files"]),
            "pixels": decoded_pixels(facts["files"], draft_size(pp))}


def fastest(r: dict) -> str:
    """The fastest path on one model whose cosine to the reference is >= THRESHOLD on every image (so the mean
    is too); the centred cosine is reported beside it, a stricter check on random weights."""
    ok = [k for k in PATHS if r["cos"][k]["min"] >= THRESHOLD]
    return max(ok, key=lambda k: r["rate"][k])


def model_text(name: str, r: dict) -> str:
    ref = r["rate"]["reference"]
    parts = []
    for k in PATHS:
        c = r["cos"][k]
        s = f"{k} {r['rate'][k]:,.0f} img/s/core"
        if k != "reference":
            s += (f" ({r['rate'][k] / ref:.2f}x; cos min {c['min']:.5f} mean {c['mean']:.6f}, centred min "
                  f"{c['cmin']:.4f} mean {c['cmean']:.5f}; |dx| {c['input_diff']:.4f})")
        parts.append(s)
    return (f"{name}: " + ", ".join(parts) + f"; draft decodes {r['pixels']:.0%} of the pixels; cos between "
            f"different images {r['cos']['between_images']:.3f}")


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--images", type=int, default=300)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--sizes", choices=("imagenet", "large"), default="imagenet",
                   help="imagenet: ImageNet-like sizes (default); large: camera-sized, long side 1000-2000")
    p.add_argument("--no-record", action="store_true", help="do not append to bench/results.local.md")
    a = p.parse_args(argv)

    import torch

    torch.set_num_threads(1)  # per core
    with tempfile.TemporaryDirectory() as tmp:
        facts = make_jpegs(Path(tmp), a.images, a.seed, a.sizes)
        res = {name: run_model(name, facts, a.repeats) for name in MODELS}
    sizes = (f"{a.images} made-up JPEGs (mean {facts['mean_w']:.0f}x{facts['mean_h']:.0f}, "
             f"{facts['share_500x375']:.0%} 500x375/375x500, {facts['kb']:.0f} KB), 1 thread, best of {a.repeats}, "
             "preprocessing only (no model)")
    text = "; ".join(model_text(n, r) for n, r in res.items())
    best = {n: fastest(r) for n, r in res.items()}
    text += (f" | fastest with cos >= {THRESHOLD} on every image: "
             + ", ".join(f"{n} {b} ({r['rate'][b] / r['rate']['reference']:.2f}x)"
                         for (n, r), b in zip(res.items(), best.values()))
             + "; --decode fast: " + ", ".join(f"{n} {r['rate']['fast'] / r['rate']['reference']:.2f}x"
                                                 for n, r in res.items())
             + "; --decode gpu on CPU tensors: " + ", ".join(
                 f"{n} {r['rate']['gpu'] / r['rate']['reference']:.2f}x, cos min {r['cos']['gpu']['min']:.5f}"
                 for n, r in res.items()))
    print(sizes, flush=True)
    summary("decode", text)
    if not a.no_record:
        record("decode.py" + (" --sizes large" if a.sizes == "large" else ""), sizes, text + " [2 shared, busy cores: noisy; re-run on a quiet machine]", device="cpu")
    return 0


if __name__ == "__main__":
    sys.exit(main())
