"""Run the bench/ suite one script after another and print every script's SUMMARY line at the end.

Default sizes finish in under 10 minutes on a 2-core CPU machine (``make bench``); ``--full`` runs the sizes
meant for a GPU machine (each script's own ``--full``, with the FLOP/byte floor beside the measured time).
Each script appends its row to bench/results.local.md (``--no-record`` passes through).

    python bench/run_all.py                       # make bench
    python bench/run_all.py --full                # a GPU machine
    python bench/run_all.py --only manifest_build,extract_throughput
"""
from __future__ import annotations

import argparse
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent

#: script -> (arguments here, arguments with --full)
SUITE = {
    "shift_nn": (["--n-ref", "250000", "--n-query", "10000", "--exact-queries", "1000", "--torch-queries", "500"],
                 ["--full"]),
    "eval_passes": (["--quick"], []),
    "wordnet_filter": ([], ["--full"]),
    "extract_clip": (["--images", "64", "--texts", "64"], ["--full"]),
    "extract_throughput": ([], ["--full"]),
    "manifest_build": ([], ["--full"]),
    "release_lists": ([], []),
    "leak_audit": (["--quick"], ["--full"]),
    "decode": (["--images", "300"], []),
    "full_scale": (["--quick"], []),  # last: reads the shift_nn and manifest_build rows just written
}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--full", action="store_true", help="GPU-machine sizes")
    p.add_argument("--only", help="comma-separated script names (default: all): " + ", ".join(SUITE))
    p.add_argument("--no-record", action="store_true", help="do not append to bench/results.local.md")
    a = p.parse_args(argv)
    names = [n.strip() for n in a.only.split(",")] if a.only else list(SUITE)
    unknown = [n for n in names if n not in SUITE]
    if unknown:
        p.error(f"unknown script(s) {unknown}; choose from {', '.join(SUITE)}")

    lines, failed, t_all = [], [], time.perf_counter()
    for name in names:
        if not (HERE / f"{name}.py").is_file():
            lines.append(f"SUMMARY {name}: skipped (bench/{name}.py is missing)")
            continue
        args = SUITE[name][1 if a.full else 0] + (["--no-record"] if a.no_record else [])
        cmd = [sys.executable, str(HERE / f"{name}.py"), *args]
        print(f"\n=== {name}: {' '.join(cmd[1:])}", flush=True)
        t = time.perf_counter()
        proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, bufsize=1)
        summary, last = None, ""
        for line in proc.stdout:
            sys.stdout.write(line)
            if line.startswith("SUMMARY "):
                summary = line.rstrip("\n")
            elif line.strip():
                last = line.rstrip("\n")
        rc = proc.wait()
        took = time.perf_counter() - t
        if rc != 0:
            failed.append(name)
            summary = f"SUMMARY {name}: FAILED (exit {rc}); last line: {last}"
        lines.append(f"{summary or f'SUMMARY {name}: (no summary line) {last}'}  [{took:.0f} s]")

    print(f"\n=== bench summary ({'full' if a.full else 'default'} sizes, {time.perf_counter() - t_all:.0f} s)")
    for line in lines:
        print(line)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
