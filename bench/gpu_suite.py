"""The GPU benches on one GPU machine, in ONE run (< 8 minutes on an H100, by the estimates below), in sequence,
each printing its ``SUMMARY`` line(s) with the measured figure next to its target; at the end the collected
SUMMARY lines and the time each bench took.

1. ``bench/gpu_extract.py``: decoding on one core, ``isood extract --decode gpu`` end to end + cosine,
   the CPU decoding path on all cores, evaluate's forward pass in fp32/bf16/fp16 (about 2 minutes, its estimate);
2. ``bench/shift_nn.py --gpu``: exact search of 1M queries x 1.28M x 256 with ``torch-fused``, the
   float32 torch search beside it, exactness vs float64 on 10,000 rows (about 1 minute: data 20-30 s);
3. ``bench/eval_passes.py`` (evaluate's forward): 12 post-hoc detectors from one forward pass vs one pass each,
   ResNet-18 with random weights on the device (well under a minute);
4. ``bench/gpu_generate.py``: SDXL's full-size architecture with random weights (no download), the
   pipeline alone vs generate-syn with in-line writes, with the write pool, and with prompt strings (2-3 minutes).

A bench that fails prints ``FAILED <name>: <one line>`` and the suite goes on; the exit status is then 1.
On a machine without CUDA it says ``no CUDA: nothing measured`` and exits 0; ``--cpu-smoke`` runs every bench
at tiny sizes on the CPU instead (checks the script; nothing is recorded).

    python bench/gpu_suite.py                 # on the GPU machine; appends rows to bench/results.local.md
    python bench/gpu_suite.py --cpu-smoke     # anywhere: tiny sizes on the CPU (a few minutes on 2 cores)
    python bench/gpu_suite.py --only shift,generate
"""
from __future__ import annotations

import argparse
import gc
import io
import os
import sys
import time
from pathlib import Path
from typing import Callable

os.environ.setdefault("HF_HUB_OFFLINE", "1")
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

#: The time the suite should stay under on one H100 machine (seconds).
BUDGET_S = 480


class _Tee(io.TextIOBase):
    """Writes through to ``stream`` and keeps the ``SUMMARY`` lines (benches that only print theirs)."""

    def __init__(self, stream):
        self.stream, self.buffer_, self.lines = stream, "", []

    def write(self, s: str) -> int:
        self.stream.write(s)
        self.buffer_ += s
        *done, self.buffer_ = self.buffer_.split("\n")
        self.lines += [x for x in done if x.startswith("SUMMARY ")]
        return len(s)

    def flush(self) -> None:
        self.stream.flush()


def _extract(device: str, smoke: bool, record: bool) -> None:
    import gpu_extract

    gpu_extract.run(device=device, smoke=smoke, record_row=record)


def _shift(device: str, smoke: bool, record: bool) -> None:
    import shift_nn

    shift_nn.run_gpu(device, smoke, record_row=record)


def _evaluate(device: str, smoke: bool, record: bool) -> None:
    import eval_passes

    argv = ["--device", device, "--threads", "0" if device.startswith("cuda") else "1"]
    eval_passes.main(argv + (["--quick"] if smoke else []) + ([] if record else ["--no-record"]))


def _generate(device: str, smoke: bool, record: bool) -> None:
    import gpu_generate

    gpu_generate.run(device, smoke, record_row=record)


#: name -> (bench, what it measures)
BENCHES: dict[str, tuple[Callable[[str, bool, bool], None], str]] = {
    "extract": (_extract, "gpu_extract.py: decoding, extract --decode gpu, evaluate forward precisions"),
    "shift": (_shift, "shift_nn.py --gpu: exact search 1M x 1.28M x 256 (torch-fused)"),
    "evaluate": (_evaluate, "eval_passes.py: 12 detectors from one forward pass"),
    "generate": (_generate, "gpu_generate.py: SDXL architecture, write pool, prompt embeddings"),
}


def _free(device: str) -> None:
    gc.collect()
    if device.startswith("cuda"):
        import torch

        torch.cuda.empty_cache()


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--cpu-smoke", action="store_true", help="every bench at tiny sizes on the CPU (nothing recorded)")
    p.add_argument("--device", default="cuda", help="the GPU to measure (default cuda)")
    p.add_argument("--only", default="", help="comma list among " + ", ".join(BENCHES))
    p.add_argument("--no-record", action="store_true", help="do not append rows to bench/results.local.md")
    a = p.parse_args(argv)
    names = [n for n in a.only.split(",") if n] or list(BENCHES)
    unknown = [n for n in names if n not in BENCHES]
    if unknown:
        print(f"unknown bench {unknown[0]!r}; pass --only among {', '.join(BENCHES)}", file=sys.stderr)
        return 2
    import torch

    smoke = a.cpu_smoke
    device = "cpu" if smoke else a.device
    if not smoke and not torch.cuda.is_available():
        print("no CUDA: nothing measured (pass --cpu-smoke to run every bench at tiny sizes on the CPU)")
        return 0
    record = not (smoke or a.no_record)
    tee = _Tee(sys.stdout)
    times, failed = {}, []
    t_all = time.perf_counter()
    old = sys.stdout
    sys.stdout = tee
    try:
        for name in names:
            bench, what = BENCHES[name]
            print(f"== {name}: {what}{' (cpu smoke)' if smoke else ''}", flush=True)
            t = time.perf_counter()
            try:
                bench(device, smoke, record)
            except Exception as e:  # one bench failing must not hide the others' figures
                first = (str(e).strip().splitlines() or [""])[0][:300]
                print(f"FAILED {name}: {type(e).__name__}: {first}", flush=True)
                failed.append(name)
            times[name] = time.perf_counter() - t
            _free(device)
    finally:
        sys.stdout = old
    total = time.perf_counter() - t_all
    print("\n== summary" + (" (cpu smoke: targets not judged)" if smoke else ""))
    for line in tee.lines:
        print(line)
    print("times: " + ", ".join(f"{n} {s:.0f} s" for n, s in times.items()) + f"; total {total:.0f} s"
          + ("" if smoke else f" (budget {BUDGET_S} s: {'within' if total <= BUDGET_S else 'OVER'})"))
    if failed:
        print(f"failed: {', '.join(failed)}")
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main())
