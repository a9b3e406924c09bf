"""Extraction throughput, local engine vs Ray Data engine (isood.features.featurestore.extract_features, --engine ray).

Both engines extract the same images into the same shard layout; this measures images/s of each, end to end
(listing, decode, preprocess, encode, shard and manifest writing). The Ray time excludes ``ray.init`` (timed
apart: a cluster is started once per job, not per dataset) but includes starting the actors, which each load
the model; the marginal rate between a run on a quarter of the images and one on all of them cancels such
fixed costs (start-up, listing, model loading) for both engines. Default: a tiny open_clip model (embed 32, ViT 64 wide, 2 layers, 32 px) and small JPEGs, so the
run measures the engines' overhead, not the model; ``--full`` (a GPU machine): ViT-B-32 (random weights, same
cost as trained ones) on 224-px JPEGs. The FLOP/byte floor (bench/_results.py) is printed beside the time.

    python bench/extract_throughput.py            # tiny model, 16,384 images, local vs one Ray actor per CPU
    python bench/extract_throughput.py --full     # ViT-B-32, 40,000 images, one Ray actor per GPU
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from _results import floor_text, peaks, record, summary  # noqa: E402

TINY = {  # as tests/conftest.py's tiny model
    "model_cfg": {
        "embed_dim": 32,
        "vision_cfg": {"image_size": 32, "layers": 2, "width": 64, "head_width": 32, "patch_size": 8},
        "text_cfg": {"context_length": 77, "vocab_size": 49408, "width": 64, "heads": 2, "layers": 2},
    },
    "preprocess_cfg": {"mean": [0.48145466, 0.4578275, 0.40821073], "std": [0.26862954, 0.26130258, 0.27577711],
                       "interpolation": "bicubic", "resize_mode": "shortest"},
}


def save_model(folder: Path, full: bool) -> str:
    """A local-dir open_clip model with seeded random weights (tiny, or ViT-B-32 with --full)."""
    import open_clip
    import torch
    from open_clip.model import CLIP
    from safetensors.torch import save_file

    cfg = TINY if not full else {"model_cfg": open_clip.get_model_config("ViT-B-32"),
                                 "preprocess_cfg": TINY["preprocess_cfg"]}
    folder.mkdir(parents=True, exist_ok=True)
    torch.manual_seed(0)
    model = CLIP(**cfg["model_cfg"])
    save_file({k: v.contiguous() for k, v in model.state_dict().items()}, str(folder / "open_clip_model.safetensors"))
    (folder / "open_clip_config.json").write_text(json.dumps(cfg))
    return f"local-dir:{folder}"


def make_images(root: Path, n: int, side: int, seed: int = 0) -> int:
    import numpy as np
    from PIL import Image

    rng = np.random.default_rng(seed)
    total = 0
    for i in range(n):
        wnid = f"n{1440764 + i % 16:08d}"
        (root / wnid).mkdir(parents=True, exist_ok=True)
        img = rng.integers(0, 256, size=(side, side * 4 // 3, 3), dtype=np.uint8)
        p = root / wnid / f"{wnid}_{i}.JPEG"
        Image.fromarray(img).save(p, quality=90)
        total += p.stat().st_size
    return total


def image_flops(spec: str, device: str) -> float:
    """FLOPs of encode_image for one image (torch's FlopCounterMode on a batch of 8)."""
    import torch
    from torch.utils.flop_counter import FlopCounterMode

    from isood.features.clip import load_clip

    enc = load_clip(spec, device)
    side = enc.model.visual.image_size
    side = side[0] if isinstance(side, (tuple, list)) else side
    x = torch.randn(8, 3, side, side, device=enc.device)
    with torch.inference_mode(), FlopCounterMode(display=False) as fc:
        enc.model.encode_image(x)
    return fc.get_total_flops() / 8


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--full", action="store_true", help="ViT-B-32 on 224-px images, 20,000 of them (a GPU machine)")
    p.add_argument("--images", type=int)
    p.add_argument("--side", type=int, help="image height in pixels (width 4/3 of it)")
    p.add_argument("--batch-size", type=int)
    p.add_argument("--shard-size", type=int)
    p.add_argument("--workers", type=int, default=None, help="decoding processes per model worker (default: "
                   "isood.core.workers.resolve_workers: CPUs - 1 locally, 4 threads per Ray actor)")
    p.add_argument("--ray-workers", type=int, default=None, help="Ray actors (default: one per GPU, else per CPU)")
    p.add_argument("--device", default=None, help="cpu or cuda (default: cuda when available)")
    p.add_argument("--no-record", action="store_true", help="do not append to bench/results.local.md")
    a = p.parse_args(argv)
    n = a.images or (40_000 if a.full else 16_384)
    side = a.side or (224 if a.full else 48)
    batch = a.batch_size or (256 if a.full else 64)
    shard = a.shard_size or (4_096 if a.full else 1_024)

    import numpy as np
    import torch

    from isood.features import featurestore as F
    from isood.engines.ray import RayEngine, RayOptions
    from isood.features.listing import list_images
    from isood.core.workers import resolve_workers

    device = a.device or ("cuda" if torch.cuda.is_available() else "cpu")
    workers = resolve_workers(a.workers).decode_processes
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        spec = save_model(tmp / "model", a.full)
        nbytes = make_images(tmp / "img", n, side)
        per_image = image_flops(spec, device)

        small = max(shard, n // 4)  # the marginal rate (n - small) / (t(n) - t(small)) cancels fixed costs
        (tmp / "img" / "small.txt").write_text("".join(f"{r}\n" for r in list_images(tmp / "img").table["path"][:small]))
        kw = dict(batch_size=batch, shard_size=shard, progress=False)

        def timed(fn) -> float:
            t = time.perf_counter()
            fn()
            return time.perf_counter() - t

        local_small = timed(lambda: F.extract_features(tmp / "img" / "small.txt", spec, tmp / "local-small", decode_processes=workers,
                                                       device=device, **kw))
        local_s = timed(lambda: F.extract_features(tmp / "img", spec, tmp / "local", decode_processes=workers, device=device,
                                                   **kw))

        import ray

        t = time.perf_counter()
        ray.init(num_cpus=os.cpu_count(), include_dashboard=False, logging_level="ERROR")
        init_s = time.perf_counter() - t
        opts = RayOptions(actors=a.ray_workers)
        actors, gpus, _ = opts.resolve("cpu" if device == "cpu" else None)
        rdev = "cpu" if device == "cpu" else None
        engine = RayEngine(opts, device=rdev)
        threads = resolve_workers(a.workers, engine).decode_processes
        ray_small = timed(lambda: F.extract_features(tmp / "img" / "small.txt", spec, tmp / "ray-small", engine=engine,
                                                     decode_processes=threads, device=rdev, **kw))
        ray_s = timed(lambda: F.extract_features(tmp / "img", spec, tmp / "ray", engine=engine, decode_processes=threads,
                                                 device=rdev, **kw))
        ray.shutdown()
        fl, _ = F.load_features(tmp / "local")
        fr, _ = F.load_features(tmp / "ray")
        same = bool(np.allclose(fl, fr, atol=1e-3 if device != "cpu" else 1e-5))
        assert len(fl) == len(fr) == n
        assert len(F.load_features(tmp / "ray-small")[0]) == small  # the quarter run read real images
    local_marginal = (n - small) / max(1e-9, local_s - local_small)
    ray_marginal = (n - small) / max(1e-9, ray_s - ray_small)

    pk = peaks(device)
    flops = per_image * n
    model = "ViT-B-32 (random)" if a.full else "tiny open_clip (embed 32, ViT 64x2, 32 px)"
    sizes = f"{model}, {n:,} JPEGs {side * 4 // 3}x{side}, batch {batch}, shard {shard}, device {device}"
    local_rate, ray_rate = n / local_s, n / ray_s
    floor = floor_text(flops, nbytes, pk, local_s)
    text = (f"{n:,} images: local {local_rate:,.0f} img/s ({workers} decoding processes), ray {ray_rate:,.0f} img/s "
            f"({actors} actors x {gpus:g} GPU, incl. actor start; ray.init {init_s:.1f} s apart) = "
            f"{ray_rate / local_rate:.2f}x local; marginal rate ({small:,} -> {n:,} images, fixed costs cancelled): "
            f"local {local_marginal:,.0f}, ray {ray_marginal:,.0f} img/s = {ray_marginal / local_marginal:.2f}x; "
            f"features allclose: {same}; local {local_s:.1f} s vs {floor}")
    print(sizes, flush=True)
    summary("extract_throughput", text)
    if not a.no_record:
        record("extract_throughput.py" + (" --full" if a.full else ""), sizes, text, device=device)
    return 0 if same else 1


if __name__ == "__main__":
    sys.exit(main())
