"""Throughput of `isood extract` (isood.features.featurestore, isood.features.clip) with a real-size open_clip architecture.

Offline there are no pretrained weights, so the model is randomly initialised (speed does not depend on the
weights). Measures: images/s of extract_features (JPEG decode + preprocess on decoding threads, batched
encode, AMP on CUDA), the cost of a no-op resume (every shard complete), and texts/s of encode_texts. Prints
one SUMMARY line with the FLOP/byte floor (bench/_results.py) beside the best time, and appends a row to
bench/results.local.md (``--no-record`` to skip).

    python bench/extract_clip.py [--model ViT-B-32] [--images 256] [--batch-size 64] [--workers 0 1] [--device auto]
    python bench/extract_clip.py --full    # a GPU machine: 4,096 images, batch 256, workers 4 8
"""

from __future__ import annotations

import argparse
import os
import platform
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import numpy as np  # noqa: E402

from _results import floor_text, peaks, record, summary  # noqa: E402


def make_images(root: Path, n: int, seed: int = 0) -> None:
    from PIL import Image

    rng = np.random.default_rng(seed)
    for i in range(n):
        wnid = f"n{1440764 + i % 8:08d}"
        (root / wnid).mkdir(parents=True, exist_ok=True)
        img = rng.integers(0, 256, size=(240, 320, 3), dtype=np.uint8)
        Image.fromarray(img).save(root / wnid / f"{wnid}_{i}.JPEG", quality=90)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="ViT-B-32")
    ap.add_argument("--images", type=int, default=None, help="default 256 (--full: 4,096)")
    ap.add_argument("--batch-size", type=int, default=None, help="default 64 (--full: 256)")
    ap.add_argument("--workers", type=int, nargs="+", default=None, help="default 0 1 (--full: 4 8)")
    ap.add_argument("--texts", type=int, default=512)
    ap.add_argument("--device", default="auto")
    ap.add_argument("--full", action="store_true", help="GPU-machine sizes")
    ap.add_argument("--no-record", action="store_true", help="do not append to bench/results.local.md")
    args = ap.parse_args()
    args.images = args.images or (4096 if args.full else 256)
    args.batch_size = args.batch_size or (256 if args.full else 64)
    args.workers = args.workers or ([4, 8] if args.full else [0, 1])

    import open_clip
    import torch

    from isood.features.clip import ClipEncoder, encode_texts
    from isood.features.featurestore import extract_features
    from isood.core.devices import torch_device

    dev = torch_device(args.device)
    model, _, preprocess = open_clip.create_model_and_transforms(args.model, pretrained=None, device=dev)
    model.eval()
    tok = open_clip.get_tokenizer(args.model)
    with torch.inference_mode():
        dim = int(model.encode_text(tok(["x"]).to(dev)).shape[-1])
    enc = ClipEncoder(model, preprocess, tok, f"bench-random:{args.model}", args.model, dev, dim)

    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        make_images(tmp / "img", args.images)
        jpeg_bytes = sum(p.stat().st_size for p in (tmp / "img").rglob("*.JPEG"))
        results = {}
        for w in args.workers:
            out = tmp / f"out-w{w}"
            t = time.perf_counter()
            extract_features(tmp / "img", enc, out, batch_size=args.batch_size, decode_processes=w, shard_size=128,
                             progress=False)
            results[w] = args.images / (time.perf_counter() - t)
            t = time.perf_counter()
            r = extract_features(tmp / "img", enc, out, batch_size=args.batch_size, decode_processes=w, shard_size=128,
                             progress=False)
            resume_s = time.perf_counter() - t
            assert not r.shards_written
        texts = [f"a photo of a thing number {i}." for i in range(args.texts)]
        t = time.perf_counter()
        encode_texts(enc, texts, batch_size=256)
        text_rate = args.texts / (time.perf_counter() - t)

    per_w = ", ".join(f"workers={w}: {r:.1f} img/s" for w, r in results.items())
    print(f"machine: {platform.node()} {os.cpu_count()} CPUs, torch threads {torch.get_num_threads()}, device {dev}")
    print(f"{args.model} ({dim}-d) extract {args.images} JPEGs 320x240, batch {args.batch_size}: {per_w}; "
          f"no-op resume {resume_s:.2f} s; encode_texts {text_rate:.0f} texts/s")
    from torch.utils.flop_counter import FlopCounterMode

    side = model.visual.image_size
    side = side[0] if isinstance(side, (tuple, list)) else side
    with torch.inference_mode(), FlopCounterMode(display=False) as fc:
        model.encode_image(torch.randn(4, 3, side, side, device=dev))
    best_w = max(results, key=results.get)
    floor = floor_text(fc.get_total_flops() / 4 * args.images, jpeg_bytes, peaks(str(dev)), args.images / results[best_w])
    text = (f"{args.model} {args.images} JPEGs: {per_w} (best/worst {max(results.values()) / min(results.values()):.2f}x); "
            f"no-op resume {resume_s:.2f} s; encode_texts {text_rate:.0f} texts/s; best run vs {floor}")
    summary("extract_clip", text)
    if not args.no_record:
        record("extract_clip.py" + (" --full" if args.full else ""),
               f"{args.model} random, {args.images} JPEGs 320x240, batch {args.batch_size}, workers {args.workers}",
               text, device=str(dev))


if __name__ == "__main__":
    main()
