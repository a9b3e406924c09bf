"""Does CPU image decoding scale with cores? (Decoding with threads in one process is
GIL-bound: 8 and 15 threads give the same rate.)

The local engine decodes in processes (``isood.features.batch_decode.prepared_batches``: a torch DataLoader whose workers
each prepare chunks of a batch, put back together in order). This bench times that pipeline alone, no model:
ImageNet-like made-up JPEGs (``bench/decode.py``'s sizes and scenes), the reference decoding (PIL + open_clip's
224 px ViT-B-32 transform) and ``--decode fast``, batches of 64, every batch finished as the extraction finishes
it (``ImageDecoder.finish``: the chunks placed in one tensor) in the main process. It reports images/s with the
decoding in this process (0 workers: one core), in 1 and 2 .. N worker processes, and the same pipeline with N
threads in one process (what a Ray actor does), and prints the
measured ratio rate(N) / rate(1) against the target 0.7 x N. On a shared machine the wall rates depend on
what else runs (the load average is printed), so it also gives the CPU time per image (this process and its
decoding processes together): equal CPU per image at 0 and N workers means the processes cost nothing extra,
and N idle cores give N times the one-core rate.

    python bench/decode_scaling.py                  # 2 cores: 0, 1, 2 workers; 400 JPEGs, best of 3
    python bench/decode_scaling.py --workers 0 1 4 8 15 --images 4000   # a 16-core machine
"""
from __future__ import annotations

import argparse
import os
import resource
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from _results import record, summary  # noqa: E402
from decode import make_jpegs  # noqa: E402

TARGET = 0.7  # rate(N workers) >= TARGET x N x rate(1 worker)


def clip_transform(size: int = 224):
    import open_clip

    return open_clip.image_transform(size, is_train=False, mean=(0.48145466, 0.4578275, 0.40821073),
                                     std=(0.26862954, 0.26130258, 0.27577711), resize_mode="shortest",
                                     interpolation="bicubic")


def batches_of(files, batch: int):
    return [([str(f) for f in files[s:s + batch]], [f.name for f in files[s:s + batch]])
            for s in range(0, len(files), batch)]


def cpu_seconds() -> float:
    """CPU time of this process and of its finished children (the decoding processes, once joined)."""
    me, kids = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return me.ru_utime + me.ru_stime + kids.ru_utime + kids.ru_stime


def processes(decoder, batches, workers: int) -> tuple[float, float]:
    """(wall seconds, CPU seconds) to prepare (in ``workers`` processes) and finish every batch."""
    from isood.features.batch_decode import prepared_batches

    t, c = time.perf_counter(), cpu_seconds()
    for (paths, names), parts in zip(batches, prepared_batches(decoder, batches, workers)):
        decoder.finish(parts, names, "cpu")
    return time.perf_counter() - t, cpu_seconds() - c


def threads(decoder, batches, n: int) -> float:
    """Seconds for the same work with ``n`` threads in this process (a Ray actor's decoding)."""
    t = time.perf_counter()
    with ThreadPoolExecutor(n) as pool:
        for paths, names in batches:
            decoder.finish([decoder.prepare(paths, names, pool if n > 1 else None)], names, "cpu")
    return time.perf_counter() - t


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--images", type=int, default=400)
    p.add_argument("--batch-size", type=int, default=64)
    p.add_argument("--workers", type=int, nargs="+", default=None, help="default: 0 1 .. CPUs")
    p.add_argument("--modes", nargs="+", default=["reference", "fast"])
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--no-record", action="store_true", help="do not append to bench/results.local.md")
    a = p.parse_args(argv)
    cpus = os.cpu_count() or 1
    workers = a.workers or list(range(0, cpus + 1))
    top = max(workers)

    import torch

    from isood.features.batch_decode import image_decoder

    torch.set_num_threads(1)
    load = os.getloadavg()[0]
    pp = clip_transform()
    out, parts = {}, []
    with tempfile.TemporaryDirectory() as tmp:
        facts = make_jpegs(Path(tmp), a.images, 0)
        batches = batches_of(facts["files"], a.batch_size)
        for mode in a.modes:
            decoder = image_decoder(pp, mode)
            processes(decoder, batches[:2], min(1, top))  # warm the page cache and the imports
            runs = {w: [processes(decoder, batches, w) for _ in range(a.repeats)] for w in workers}
            rate = {w: a.images / min(r[0] for r in rs) for w, rs in runs.items()}
            cpu = {w: 1000 * min(r[1] for r in rs) / a.images for w, rs in runs.items()}
            thr = {n: a.images / min(threads(decoder, batches, n) for _ in range(a.repeats)) for n in (1, top)}
            one = rate.get(1, rate[min(workers)])
            ratio = rate[top] / one
            verdict = "meets" if ratio >= TARGET * top else "misses"
            out[mode] = ratio
            parts.append(
                f"{mode}: " + ", ".join(f"{w} worker{'s' if w != 1 else ''} {r:,.0f} img/s" for w, r in rate.items())
                + f"; {top} vs 1 worker processes {ratio:.2f}x (target >= {TARGET} x {top} = {TARGET * top:.1f}x: "
                f"{verdict}); CPU per image " + ", ".join(f"{w} workers {c:.2f} ms" for w, c in cpu.items())
                + f" ({cpu[min(workers)] / cpu[top]:.2f}x the in-process work per image at {top}); threads in one "
                f"process: 1 {thr[1]:,.0f}, {top} {thr[top]:,.0f} img/s = {thr[top] / thr[1]:.2f}x")
    sizes = (f"{a.images} made-up ImageNet-like JPEGs (mean {facts['mean_w']:.0f}x{facts['mean_h']:.0f}, "
             f"{facts['kb']:.0f} KB), open_clip 224 px transform, batch {a.batch_size}, no model, best of "
             f"{a.repeats}, load average {load:.1f} at the start, {os.getloadavg()[0]:.1f} at the end")
    print(sizes, flush=True)
    text = "; ".join(parts)
    summary("decode_scaling", text)
    if not a.no_record:
        record("decode_scaling.py", sizes, text + (" [2 shared cores: the main process finishing batches competes "
                                                   "with the workers]" if cpus <= 2 else ""), device="cpu")
    return 0


if __name__ == "__main__":
    sys.exit(main())
