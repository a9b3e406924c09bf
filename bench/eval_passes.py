"""Benchmark of one-pass scoring (``isood.classifiers.scoring.run_detectors``): the 12 post-hoc detectors (all but
ODIN) scored from ONE forward pass per batch vs each detector run on its own (its own passes over the same data,
no cache).

Every run also scores the ID training images (``score_train=True``): DER95/DER99 need the training scores of
every detector, so in an evaluation each detector pays the pass over the ID training set anyway, and the runs
compare the same work (ID train + ID test + OOD) done once vs 12 times.

Model: a randomly initialised timm ResNet (``--model``, default resnet18, ``pretrained=False``; no download) with
``--classes`` outputs. Data: seeded random images (ID train with labels, ID test, OOD shifted in mean), all
``--size`` x ``--size``. One warm-up run first; then each configuration is timed ``--repeats`` times, interleaved,
and its best time counts. Wall-clock and process CPU time are both reported: on shared cores the CPU time is the
steadier measure (with ``--threads 1`` it is the work done).

Printed: the time of all 12 together, of each alone, and one summary line with the ratio
``all 12 together / mean single-detector run`` (target <= 1.3) and the speed-up over running them one by one.
A row is appended to bench/results.local.md (``--no-record`` to skip).

    python bench/eval_passes.py            # resnet18, 112 px, 256 train + 128 test + 128 OOD (minutes on 1 core)
    python bench/eval_passes.py --quick    # 64 px, 128 train + 64 test + 64 OOD, one repeat (under a minute)
"""
from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from _results import record, summary  # noqa: E402

TARGET_RATIO = 1.3


def _time(fn) -> tuple[float, float]:
    """(wall-clock seconds, CPU seconds of this process) of ``fn()``."""
    t, c = time.perf_counter(), time.process_time()
    fn()
    return time.perf_counter() - t, time.process_time() - c


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", default="resnet18")
    p.add_argument("--classes", type=int, default=100)
    p.add_argument("--size", type=int, default=112, help="image side in pixels")
    p.add_argument("--n-train", type=int, default=256)
    p.add_argument("--n-test", type=int, default=128, help="ID test images (and as many OOD images)")
    p.add_argument("--batch-size", type=int, default=64)
    p.add_argument("--device", default=None, help="cpu or cuda (default: cuda when available)")
    p.add_argument("--repeats", type=int, default=2)
    p.add_argument("--threads", type=int, default=1,
                   help="CPU threads for torch and BLAS (0: library defaults). On shared cores multi-threaded "
                        "OpenBLAS can be 10-80x slower (spinning threads), hence 1")
    p.add_argument("--quick", action="store_true", help="tiny smoke run")
    p.add_argument("--no-record", action="store_true", help="do not append to bench/results.local.md")
    a = p.parse_args(argv)
    if a.quick:
        a.size, a.n_train, a.n_test, a.repeats = 64, 128, 64, 1

    import timm

    if a.threads:  # before numpy/scipy/torch load their thread pools (OpenBLAS, OpenMP)
        for var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
            os.environ[var] = str(a.threads)
    import numpy as np
    import torch

    from isood.science.detectors import POST_HOC_DETECTORS, get_detector
    from isood.classifiers.models import wrap_model
    from isood.classifiers.scoring import run_detectors

    if a.threads:  # and every pool already loaded (some ignore the variables)
        from threadpoolctl import threadpool_limits

        torch.set_num_threads(a.threads)
        threadpool_limits(a.threads)
    a.device = a.device or ("cuda" if torch.cuda.is_available() else "cpu")
    torch.manual_seed(0)
    model = timm.create_model(a.model, pretrained=False, num_classes=a.classes).eval()
    g = torch.Generator().manual_seed(0)
    train = torch.randn(a.n_train, 3, a.size, a.size, generator=g)
    labels = torch.randint(0, a.classes, (a.n_train,), generator=g)
    datasets = {"id_test": torch.randn(a.n_test, 3, a.size, a.size, generator=g),
                "ood": torch.randn(a.n_test, 3, a.size, a.size, generator=g) + 0.5}
    id_train = torch.utils.data.TensorDataset(train, labels)
    knn_k = min(50, a.n_train)

    adapter = wrap_model(model)
    adapter.provides  # the one-off probe of what the model exposes, outside the timings

    def run(names):
        adapter.forward_calls = 0
        dets = [("knn", {"k": knn_k}) if n == "knn" else (n, {}) for n in names]
        run_detectors(adapter, {n: get_detector(n, **kw) for n, kw in dets}, datasets, id_train=id_train,
                      score_train=True, batch_size=a.batch_size, device=a.device)
        return adapter.forward_calls

    print(f"model {a.model} (random), {a.classes} classes, {a.size}px, train {a.n_train}, test {a.n_test} + "
          f"OOD {a.n_test}, batch {a.batch_size}, device {a.device}, threads {torch.get_num_threads()}",
          flush=True)
    all_calls = run(POST_HOC_DETECTORS)  # warm-up (lazy init, allocator, BLAS/faiss threads)
    inf = (float("inf"), float("inf"))
    t_all, single = inf, {n: inf for n in POST_HOC_DETECTORS}
    best = lambda old, new: (min(old[0], new[0]), min(old[1], new[1]))  # noqa: E731
    for r in range(a.repeats):
        t_all = best(t_all, _time(lambda: run(POST_HOC_DETECTORS)))
        for name in POST_HOC_DETECTORS:
            single[name] = best(single[name], _time(lambda n=name: run([n])))
        print(f"repeat {r + 1}/{a.repeats} (best so far, wall/CPU s): all 12 {t_all[0]:.2f}/{t_all[1]:.2f}; "
              + ", ".join(f"{n} {t[0]:.2f}/{t[1]:.2f}" for n, t in single.items()), flush=True)
    print(f"all 12 in one pass: wall {t_all[0]:.2f} s, CPU {t_all[1]:.2f} s ({all_calls} forward batches)")
    for name in POST_HOC_DETECTORS:
        print(f"  {name:9s} alone: wall {single[name][0]:.2f} s, CPU {single[name][1]:.2f} s", flush=True)
    cpu_all = t_all[1]
    cpu_mean = float(np.mean([t[1] for t in single.values()]))
    t_all = t_all[0]
    single = {n: t[0] for n, t in single.items()}
    mean_single = float(np.mean(list(single.values())))
    total_single = float(np.sum(list(single.values())))
    min_single = min(single.values())
    ratio = t_all / mean_single
    verdict = "meets" if ratio <= TARGET_RATIO else "misses"
    summary("eval_passes", f"all 12 post-hoc detectors in one pass {t_all:.2f} s = {ratio:.2f}x the mean "
            f"single-detector run ({mean_single:.2f} s; {t_all / min_single:.2f}x the cheapest, "
            f"{min(single, key=single.get)} {min_single:.2f} s); one-by-one total {total_single:.2f} s -> speed-up "
            f"{total_single / t_all:.1f}x; CPU-time ratio {cpu_all / cpu_mean:.2f}x "
            f"({cpu_all:.2f} / {cpu_mean:.2f} s); target <= {TARGET_RATIO}x {verdict}")
    if not a.no_record:
        record(f"eval_passes.py{' quick' if a.quick else ''}",
               f"{a.model} random, {a.classes} classes, {a.size}px, train {a.n_train}, test {a.n_test} + OOD "
               f"{a.n_test}, batch {a.batch_size}, threads {torch.get_num_threads()}, best of {a.repeats}",
               f"all 12 one pass {t_all:.2f} s; mean single {mean_single:.2f} s; ratio {ratio:.2f}x "
               f"({t_all / min_single:.2f}x the cheapest; CPU-time ratio {cpu_all / cpu_mean:.2f}x) "
               f"(target <= {TARGET_RATIO}x, {verdict}); one-by-one {total_single:.2f} s, speed-up "
               f"{total_single / t_all:.1f}x", device=a.device)
    return 0


if __name__ == "__main__":
    sys.exit(main())
