"""Shared helpers of the bench/ scripts: the machine line, the results row, the summary line, and the
FLOP/byte floor (the time a run cannot beat on this machine: max(FLOPs / peak FLOP/s, bytes / peak bandwidth),
with both peaks measured here in a second, so the floor is honest for CPU and GPU alike).

Rows look like those shift_nn.py and eval_passes.py write:
``- DATE | SCRIPT MODE | MACHINE | SIZES | RESULTS``.

Rows go to ``bench/results.local.md``: a local log, ignored by git (each machine keeps its own runs).
"""

from __future__ import annotations

import datetime as _dt
import os
import platform
import resource
import sys
import time
from pathlib import Path

RESULTS = Path(__file__).resolve().parent / "results.local.md"
HEADER = "# Benchmark results\n\nOne row per run; appended by the bench scripts.\n\n"


def machine(device: str | None = None) -> str:
    """``x86_64 Linux 2 CPUs, <device>, Python 3.11.7[, torch X]``."""
    parts = [f"{platform.machine()} {platform.system()} {os.cpu_count()} CPUs"]
    if device:
        name = device
        if device.startswith("cuda"):
            try:
                import torch

                name = torch.cuda.get_device_name(0)
            except Exception:
                pass
        parts.append(name)
    parts.append(f"Python {platform.python_version()}")
    if "torch" in sys.modules:
        parts.append(f"torch {sys.modules['torch'].__version__}")
    return ", ".join(parts)


def record(script: str, sizes: str, results: str, *, device: str | None = None, path: Path | None = None) -> str:
    """Append one row to bench/results.local.md (created with its header if missing); returns the row."""
    path = path or RESULTS
    if not path.exists():
        path.write_text(HEADER)
    row = f"- {_dt.date.today().isoformat()} | {script} | {machine(device)} | {sizes} | {results}\n"
    with path.open("a") as f:
        f.write(row)
    return row


def summary(name: str, text: str) -> str:
    """Print and return the one summary line (``SUMMARY name: text``) run_all.py collects."""
    line = f"SUMMARY {name}: {text}"
    print(line, flush=True)
    return line


def peak_rss_bytes() -> int:
    """Peak resident memory of this process so far (ru_maxrss: KiB on Linux, bytes on macOS)."""
    r = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return int(r if sys.platform == "darwin" else r * 1024)


def _status(field: str) -> int | None:
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith(field + ":"):
                return int(line.split()[1]) * 1024
    except OSError:
        pass
    return None


def reset_peak() -> bool:
    """Reset the peak-RSS mark (Linux: ``echo 5 > /proc/self/clear_refs`` resets VmHWM), so that
    :func:`phase_peak_bytes` reads the peak of the phase that follows; False where not supported."""
    try:
        Path("/proc/self/clear_refs").write_text("5")
        return True
    except OSError:
        return False


def phase_peak_bytes() -> int:
    """Peak resident memory since the last :func:`reset_peak` (VmHWM), else since the start (ru_maxrss)."""
    return _status("VmHWM") or peak_rss_bytes()


def rss_bytes() -> int:
    """Current resident memory (VmRSS), or the peak where /proc is missing."""
    return _status("VmRSS") or peak_rss_bytes()


def gb(n: float) -> str:
    return f"{n / 1e9:.2f} GB"


def peaks(device: str = "cpu", seconds: float = 0.5) -> dict[str, float]:
    """Measured peak float32 matmul FLOP/s (fp16 on CUDA, as AMP runs) and copy bandwidth (bytes/s, read +
    write) of ``device``: the best of a few runs of a 2048^3 (CUDA 8192^3) matmul and a 256 MiB copy."""
    import torch

    dev = torch.device(device)
    cuda = dev.type == "cuda"
    n = 8192 if cuda else 2048
    dtype = torch.float16 if cuda else torch.float32
    a = torch.randn(n, n, device=dev, dtype=dtype)
    b = torch.randn(n, n, device=dev, dtype=dtype)
    x = torch.empty(64 * 1024 * 1024, device=dev, dtype=torch.float32)
    y = torch.empty_like(x)

    def best(fn) -> float:
        fn()
        if cuda:
            torch.cuda.synchronize()
        t_best, t_end = float("inf"), time.perf_counter() + seconds
        while time.perf_counter() < t_end or t_best == float("inf"):
            t = time.perf_counter()
            fn()
            if cuda:
                torch.cuda.synchronize()
            t_best = min(t_best, time.perf_counter() - t)
        return t_best

    flops = 2 * n ** 3 / best(lambda: a @ b)
    bandwidth = 2 * x.numel() * 4 / best(lambda: y.copy_(x))
    return {"flops": flops, "bandwidth": bandwidth}


def floor_seconds(flops: float, nbytes: float, peak: dict[str, float]) -> float:
    """Roofline floor: the larger of compute time and memory-traffic time at the measured peaks."""
    return max(flops / peak["flops"], nbytes / peak["bandwidth"])


def floor_text(flops: float, nbytes: float, peak: dict[str, float], measured: float) -> str:
    f = floor_seconds(flops, nbytes, peak)
    bound = "compute" if flops / peak["flops"] >= nbytes / peak["bandwidth"] else "memory"
    return (f"floor {f:.3g} s ({bound}-bound: {flops / 1e9:.3g} GFLOP at {peak['flops'] / 1e9:.0f} GFLOP/s, "
            f"{nbytes / 1e9:.3g} GB at {peak['bandwidth'] / 1e9:.1f} GB/s); measured = {measured / f:.3g}x the floor"
            if f > 0 else "floor n/a")
