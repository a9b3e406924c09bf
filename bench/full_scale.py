"""Estimated wall time and peak memory of building the whole IS-OOD, from per-item costs measured here and
FLOP floors: (a) this machine's CPUs, (b) one H100, (c) 8 Ray workers with one H100 each.

The build: ID = ImageNet-1K train (1,281,167 images), test = ImageNet-21K-P winter21 train+val (11,797,647
images; override with --test-images), Syn-IS = 64 cells x 5,000 images
whose shift is measured from their prompts (320,000 prompt texts; generating the images with SDXL-Turbo is a
separate job, not estimated here). Stages: extraction (decode + CLIP ViT-B/32 at 224 of every ID and test image;
CLIP text features of the LAID texts and the Syn-IS prompts), LAID (fit of W), shift (nearest ID neighbour of
every test image and prompt, on both LAID halves of 256 dimensions), grid (levels, cells), manifest (write).

Measured here (each in seconds): JPEG decode + open_clip's reference preprocessing of ImageNet-sized (500x375)
made-up JPEGs per CPU core; ViT-B/32 (random weights) image and text forward on the CPU and their FLOPs
(torch's FlopCounterMode); the LAID fit on 10,000 random 512-d triplets; the exact faiss-flat rate; the grid
steps. Read from bench/results.local.md (measured by the other benches; re-run them first): the recall-tuned IVF
speed-up over exact search at 1M x 256 (bench/shift_nn.py), the 14M-row manifest write (bench/manifest_build.py)
and build-splits' peak RSS per test image, per ID image and fixed (bench/splits_memory.py; measured here with
its --quick sizes when the log has no row, or no log exists). build-splits streams the test features: its memory
is the ID side (features + both LAID halves while the halves are computed, then the halves), a few blocks of test rows,
and a few hundred bytes per test image.
Assumed (GPU side, stated in the output): H100 dense fp16 ~400 TFLOP/s effective for the CLIP forward, fp32
~50 TFLOP/s for the exact torch search, 16 host CPU cores per GPU for decoding, 110 KB per JPEG read at
2 GB/s, 60 s to start 8 Ray workers. Prints a table and one SUMMARY line; appends a row to bench/results.local.md.

    python bench/full_scale.py            # measure here, print the estimate (~1 minute)
    python bench/full_scale.py --quick    # smaller measurements (seconds)
"""
from __future__ import annotations

import argparse
import io
import re
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from _results import RESULTS, gb, peaks, phase_peak_bytes, record, reset_peak, rss_bytes, summary  # noqa: E402

N_ID, N_TEST, N_SYN = 1_281_167, 11_797_647, 64 * 5_000
DIM, HALF = 512, 256  # ViT-B/32 features; each LAID half
GPU_FP16, GPU_FP32, HOST_CORES, JPEG_BYTES, DISK_BPS, RAY_START = 400e12, 50e12, 16, 110e3, 2e9, 60.0
SCENARIOS = ("a", "b", "c")


def _timed(fn, repeat: int = 1) -> float:
    best = float("inf")
    for _ in range(repeat):
        t = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t)
    return best


def measure_decode(n: int) -> float:
    """Seconds per image, one core: PIL decode of a 500x375 JPEG + open_clip's ViT-B/32 eval transform."""
    import torch
    from open_clip.transform import image_transform
    from PIL import Image

    rng = np.random.default_rng(0)
    yy, xx = np.mgrid[0:375, 0:500]
    blobs = []
    for i in range(8):  # smooth scenes + texture: ~ImageNet-like file sizes
        base = np.stack([np.sin(xx / (20 + 7 * i) + c) * np.cos(yy / (15 + 5 * c)) for c in range(3)], -1)
        img = np.clip(127 + 80 * base + rng.normal(0, 12, base.shape), 0, 255).astype(np.uint8)
        buf = io.BytesIO()
        Image.fromarray(img).save(buf, format="JPEG", quality=90)
        blobs.append(buf.getvalue())
    print(f"decode: 500x375 JPEGs of {np.mean([len(b) for b in blobs]) / 1e3:.0f} KB on average", flush=True)
    transform = image_transform(224, is_train=False, resize_mode="shortest", interpolation="bicubic")
    torch.set_num_threads(1)
    seconds = _timed(lambda: [transform(Image.open(io.BytesIO(blobs[i % 8])).convert("RGB")) for i in range(n)], 2)
    torch.set_num_threads(2)
    return seconds / n


def measure_clip(batch: int) -> dict[str, float]:
    """ViT-B/32 (random weights) on this CPU: seconds per image / text and FLOPs per image / text."""
    import open_clip
    import torch
    from torch.utils.flop_counter import FlopCounterMode

    model = open_clip.create_model("ViT-B-32", pretrained=None).eval()
    x = torch.randn(batch, 3, 224, 224)
    tokens = open_clip.get_tokenizer("ViT-B-32")(["a photo of a tench."] * batch)
    out = {}
    with torch.no_grad():
        for name, fn in (("image", lambda: model.encode_image(x)), ("text", lambda: model.encode_text(tokens))):
            model.train()  # counted outside the fused attention fast path, whose FLOPs the counter misses
            with FlopCounterMode(display=False) as fc:
                fn()
            out[f"{name}_flops"] = fc.get_total_flops() / batch
            model.eval()
            with torch.inference_mode():
                out[f"{name}_s"] = _timed(fn, 2) / batch
    return out


def measure_laid() -> tuple[int, float]:
    """(distinct texts of the default 10,000 LAID triplets over the ImageNet-21K labels, seconds of the fit on
    10,000 random 512-d triplets with the default options)."""
    from isood.core.defaults import LAID_TRIPLETS
    from isood.features.labels import load_labels
    from isood.science.laid import fit_laid
    from isood.features.laid_training import sample_triplets

    triplets = sample_triplets(load_labels("21k").texts, triplets=LAID_TRIPLETS)
    rng = np.random.default_rng(0)
    a, s, c = (rng.standard_normal((LAID_TRIPLETS, DIM)).astype(np.float32) for _ in range(3))
    return len(set(triplets.all_texts)), _timed(lambda: fit_laid(a, s, c))


def measure_flat(n_ref: int, n_query: int) -> float:
    """Effective FLOP/s of exact faiss flat search (2 * n_query * n_ref * 256 FLOPs)."""
    import faiss

    rng = np.random.default_rng(0)
    r = rng.standard_normal((n_ref, HALF)).astype(np.float32)
    q = rng.standard_normal((n_query, HALF)).astype(np.float32)
    index = faiss.IndexFlatIP(HALF)
    index.add(r)
    return 2.0 * n_query * n_ref * HALF / _timed(lambda: index.search(q, 1), 2)


def measure_grid(n: int) -> float:
    """Seconds per test image of the grid steps (levels on both axes, cell names, cell table)."""
    from isood.science.grid import assign_levels, cell_names, cell_table

    rng = np.random.default_rng(0)
    d_sem, d_cov = rng.random(n).astype(np.float32), rng.random(n).astype(np.float32)

    def grid():
        s, _ = assign_levels(d_sem)
        c, _ = assign_levels(d_cov)
        cell_names(c, s)
        cell_table(c, s)

    return _timed(grid) / n


def measure_splits_memory() -> dict[str, float]:
    """build-splits' peak RSS per test image, per ID image, fixed: bench/splits_memory.py at its --quick sizes."""
    from splits_memory import measure_memory

    return measure_memory(test_rows=400_000, id_rows=10_000)


def id_side_bytes(n_id: int) -> float:
    """The ID side while its LAID halves are computed: the features and both halves (N_id x D float32 each)."""
    return 2.0 * n_id * DIM * 4


def shift_memory(m: dict[str, float], *, n_id: int, n_query: int) -> float:
    """build-splits' peak: the larger of the ID phase (features + halves) and the search phase (halves, per test
    image, fixed), from the measured costs ``m``."""
    search = m["mem_id_row"] * n_id + m["mem_test_row"] * n_query + m["mem_fixed"]
    return max(id_side_bytes(n_id) + m["mem_fixed"], search)


def from_results() -> dict[str, float]:
    """The latest measured rows of bench/shift_nn.py (default size) and bench/manifest_build.py."""
    text = RESULTS.read_text() if RESULTS.exists() else ""
    out: dict[str, float] = {}
    for line in text.splitlines():
        if "| shift_nn.py default |" in line:
            for target in ("0.99", "0.995"):
                m = re.search(rf"target {target}: [^;]*?: build (\d+) s[^;]*?, ([\d.]+)x \(", line)
                if m:
                    out[f"ann_build_s_{target}"], out[f"ann_speedup_{target}"] = float(m.group(1)), float(m.group(2))
        m = re.search(r"manifest_build\.py.*?\| ([\d,]+) rows.*?write ([\d.]+) s, peak RSS while writing ([\d.]+) GB", line)
        if m:
            rows = float(m.group(1).replace(",", ""))
            out["manifest_s_per_row"], out["manifest_peak_per_row"] = float(m.group(2)) / rows, float(m.group(3)) * 1e9 / rows
        m = re.search(r"\| splits_memory\.py(?: after)? \|.*?([\d,]+) B per test image.*?([\d,]+) B per ID image.*?"
                      r"fixed ([\d.]+) GB", line)
        if m:
            out["mem_test_row"], out["mem_id_row"] = (float(g.replace(",", "")) for g in m.group(1, 2))
            out["mem_fixed"] = float(m.group(3)) * 1e9
    return out


def measure(quick: bool) -> dict[str, float]:
    """Every per-item cost measured here (see the module docstring)."""
    m: dict[str, float] = {"cores": float(__import__("os").cpu_count() or 1)}
    t0 = time.perf_counter()
    m["decode_s"] = measure_decode(16 if quick else 64)
    reset_peak()
    base = rss_bytes()
    m.update(measure_clip(4 if quick else 16))
    m["extract_peak"] = phase_peak_bytes() - base
    m["laid_texts"], m["laid_fit_s"] = measure_laid()
    m["flat_flops"] = measure_flat(50_000 if quick else 200_000, 500 if quick else 2_000)
    m["grid_s"] = measure_grid(200_000 if quick else 2_000_000)
    m["cpu_peak_flops"] = peaks("cpu")["flops"]
    m.update(from_results())
    if "mem_test_row" not in m:
        print("no bench/splits_memory.py row in results.local.md: measuring build-splits' memory (minutes)", flush=True)
        m.update(measure_splits_memory())
    print(f"measured in {time.perf_counter() - t0:.0f} s: " + ", ".join(f"{k} {v:.4g}" for k, v in m.items()), flush=True)
    return m


def estimate(m: dict[str, float], *, n_id: int, n_test: int, n_syn: int) -> list[tuple[str, dict, str]]:
    """Rows (stage, {scenario: seconds}, peak memory text) of the build, from the measured costs ``m``."""
    n_img, n_query, n_text = n_id + n_test, n_test + n_syn, m["laid_texts"] + n_syn
    shift_flops = 2 * 2.0 * n_query * n_id * HALF  # two axes, a multiply-add per dimension
    cpu_img = m["image_s"] + m["decode_s"] / m["cores"]  # the model's threads and decoding share the cores
    gpu_img = max(m["image_flops"] / GPU_FP16, m["decode_s"] / HOST_CORES, JPEG_BYTES / DISK_BPS)
    extract_b = n_img * gpu_img + n_text * m["text_flops"] / GPU_FP16
    exact_cpu = shift_flops / m["flat_flops"]
    tune = 2 * 4_000 * 2.0 * n_id * HALF / m["flat_flops"]  # the exact tuning + held-out samples, both axes
    shift_mem = shift_memory(m, n_id=n_id, n_query=n_query)
    rows = [
        ("extraction (images + texts)", {"a": n_img * cpu_img + n_text * m["text_s"], "b": extract_b,
                                         "c": extract_b / 8 + RAY_START}, gb(m["extract_peak"]) + " per worker"),
        ("LAID fit", dict.fromkeys(SCENARIOS, m["laid_fit_s"]), "< 0.1 GB"),
        ("shift, exact", {"a": exact_cpu, "b": shift_flops / GPU_FP32, "c": shift_flops / GPU_FP32},
         gb(shift_mem) + " RAM"),
    ]
    for target in ("0.99", "0.995"):
        if f"ann_speedup_{target}" in m:
            build = 2 * m[f"ann_build_s_{target}"] * (n_id / 1e6) ** 1.5
            ann = exact_cpu / m[f"ann_speedup_{target}"] + build + tune
            rows.append((f"shift, --ann-recall {target} (CPU)", {"a": ann, "b": float("nan"), "c": float("nan")},
                         gb(shift_mem + 2 * n_id * HALF * 4) + " RAM"))  # + the IVF copy of both halves
    manifest = m.get("manifest_s_per_row", float("nan")) * n_query
    rows += [("grid", dict.fromkeys(SCENARIOS, m["grid_s"] * n_query), "-"),
             ("manifest", dict.fromkeys(SCENARIOS, manifest),
              gb(m.get("manifest_peak_per_row", float("nan")) * n_query))]
    return rows


def _hms(s: float) -> str:
    if s != s:
        return "n/a"
    return f"{s / 86400:.1f} d" if s >= 86400 else f"{s / 3600:.1f} h" if s >= 3600 else f"{s / 60:.1f} min" \
        if s >= 60 else f"{s:.1f} s"


def totals(rows: list[tuple[str, dict, str]]) -> dict[str, dict[str, float]]:
    """Per scenario: total with the exact shift, total with the fastest shift that meets the accuracy targets
    (exact, or --ann-recall 0.995 on the CPU), dominant stage."""
    out = {}
    for sc in SCENARIOS:
        # the fastest shift meeting the targets of bench/shift_nn.py (--ann-recall 0.99 misses 99.9% levels)
        shift = {name: t[sc] for name, t, _ in rows if name.startswith("shift") and "recall 0.99 " not in name}
        best_shift = min((k for k in shift if shift[k] == shift[k]), key=shift.get)
        stages = {name: t[sc] for name, t, _ in rows if not name.startswith("shift") or name == best_shift}
        out[sc] = {"exact": sum(t[sc] for name, t, _ in rows if not name.startswith("shift") or name == "shift, exact"),
                   "best": sum(stages.values()), "dominant": max(stages, key=stages.get), "shift": best_shift}
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--quick", action="store_true", help="smaller measurements (seconds)")
    p.add_argument("--test-images", type=int, default=N_TEST, help="test-set size (default: ImageNet-21K-P winter21 train+val)")
    p.add_argument("--no-record", action="store_true", help="do not append to bench/results.local.md")
    a = p.parse_args(argv)
    m = measure(a.quick)
    rows = estimate(m, n_id=N_ID, n_test=a.test_images, n_syn=N_SYN)
    tot = totals(rows)
    head = ("(a) this machine, {:.0f} CPUs".format(m["cores"]), "(b) 1x H100", "(c) 8x H100, Ray")
    print(f"\nIS-OOD at full size: ID {N_ID:,} images, test {a.test_images:,} images, Syn-IS {N_SYN:,} prompts\n")
    print(f"| stage | {' | '.join(head)} | peak memory |\n|---|---|---|---|---|")
    for name, t, mem in rows:
        print(f"| {name} | {' | '.join(_hms(t[sc]) for sc in SCENARIOS)} | {mem} |")
    print(f"| **total, exact shift** | {' | '.join(_hms(tot[sc]['exact']) for sc in SCENARIOS)} | |")
    print(f"| **total, fastest accurate shift** | {' | '.join(_hms(tot[sc]['best']) for sc in SCENARIOS)} | |")
    print(f"| dominant stage | {' | '.join(tot[sc]['dominant'] for sc in SCENARIOS)} | |")
    print(f"\nassumptions: H100 {GPU_FP16 / 1e12:.0f} TFLOP/s fp16 (CLIP), {GPU_FP32 / 1e12:.0f} TFLOP/s fp32 (exact "
          f"torch search), {HOST_CORES} decode cores per GPU, {JPEG_BYTES / 1e3:.0f} KB/JPEG at {DISK_BPS / 1e9:.0f} GB/s, "
          f"{RAY_START:.0f} s Ray start; build-splits searches on one device (Ray spreads extraction only); IVF build "
          "scaled from 1M rows by N^1.5; CPU CLIP forward measured here ({:.1f} GFLOP/image, {:.1f} GFLOP/text, "
          "{:.0f}% of the CPU matmul peak)".format(m["image_flops"] / 1e9, m["text_flops"] / 1e9,
                                                   100 * m["image_flops"] / m["image_s"] / m["cpu_peak_flops"]))
    ram = __import__("os").sysconf("SC_PAGE_SIZE") * __import__("os").sysconf("SC_PHYS_PAGES")
    n_query = a.test_images + N_SYN
    peak = max(shift_memory(m, n_id=N_ID, n_query=n_query), m.get("manifest_peak_per_row", 0.0) * n_query,
               m["extract_peak"])
    fits = "fits" if peak < ram else "does not fit"
    print(f"peak memory of the build: {gb(peak)} (build-splits, exact: ID side {gb(id_side_bytes(N_ID))} = features + "
          f"LAID halves, then the halves + {m['mem_test_row']:,.0f} B per test image + {gb(m['mem_fixed'])}); this "
          f"machine has {gb(ram)}: {fits}")
    text = "; ".join(f"({sc}) {_hms(tot[sc]['exact'])} exact / {_hms(tot[sc]['best'])} with {tot[sc]['shift']}, "
                     f"dominated by {tot[sc]['dominant']}" for sc in SCENARIOS) + f"; peak RAM {gb(peak)} ({fits} here)"
    summary("full_scale", text)
    if not a.no_record:
        stages = "; ".join(f"{name}: " + "/".join(_hms(t[sc]) for sc in SCENARIOS) + f" ({mem})" for name, t, mem in rows)
        record("full_scale.py" + (" quick" if a.quick else ""),
               f"ID {N_ID:,}, test {a.test_images:,}, Syn-IS {N_SYN:,}; scenarios a/b/c", f"{text} | {stages}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
