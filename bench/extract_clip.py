"""Throughput of `isood extract` (isood.features) with a real-size open_clip architecture.

Offline there are no pretrained weights, so the model is randomly initialised (speed does not depend on the
weights). Measures: images/s of extract_features (JPEG decode + preprocess in DataLoader workers, batched
encode, AMP on CUDA), the cost of a no-op resume (every shard complete), and texts/s of encode_texts.

    python bench/extract_clip.py [--model ViT-B-32] [--images 256] [--batch-size 64] [--workers 0 1] [--device auto]
"""

from __future__ import annotations

import argparse
import os
import platform
import tempfile
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import numpy as np  # noqa: E402


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
    ap.add_argument("--images", type=int, default=256)
    ap.add_argument("--batch-size", type=int, default=64)
    ap.add_argument("--workers", type=int, nargs="+", default=[0, 1])
    ap.add_argument("--texts", type=int, default=512)
    ap.add_argument("--device", default="auto")
    args = ap.parse_args()

    import open_clip
    import torch

    from isood.features import ClipEncoder, _resolve_device, encode_texts, extract_features

    dev = _resolve_device(args.device)
    model, _, preprocess = open_clip.create_model_and_transforms(args.model, pretrained=None, device=dev)
    model.eval()
    tok = open_clip.get_tokenizer(args.model)
    with torch.inference_mode():
        dim = int(model.encode_text(tok(["x"]).to(dev)).shape[-1])
    enc = ClipEncoder(model, preprocess, tok, f"bench-random:{args.model}", args.model, dev, dim)

    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        make_images(tmp / "img", args.images)
        results = {}
        for w in args.workers:
            out = tmp / f"out-w{w}"
            t = time.perf_counter()
            extract_features(tmp / "img", enc, out, batch_size=args.batch_size, workers=w, shard_size=128, progress=False)
            results[w] = args.images / (time.perf_counter() - t)
            t = time.perf_counter()
            r = extract_features(tmp / "img", enc, out, batch_size=args.batch_size, workers=w, shard_size=128, progress=False)
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


if __name__ == "__main__":
    main()
