"""`isood demo`: the whole pipeline on the embedded default, with ground truth to check it against.

1. The ImageNet-OOD class filter, ImageNet-21K candidates vs ImageNet-1K (real WordNet 3.0 + timm lists).
2. A planted world (isood.simulate): LAID is fitted on its text triplets, then the real `build-splits` path runs
   on its precomputed image features; the measured shifts are compared with the planted ones, next to a random
   orthogonal W as the baseline.
3. Evaluation (isood.evaluation.planted): a linear classifier on the planted ID features, OOD detectors scored per
   measured cell of the splits manifest, heatmaps and report; MSP's AUROC per semantic level is printed.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pandas as pd
from rich.console import Console
from rich.table import Table
from scipy.stats import spearmanr

from isood.laid import LAID, fit_laid
from isood.shift import shift_distances
from isood.simulate import PlantedWorld, make_planted_world, random_orthogonal, subspace_recovery


@dataclass
class PlantedReport:
    """Ground-truth checks of one planted-world run (learned W vs a random orthogonal W)."""

    recovery: float
    recovery_random: float
    spearman_sem: float
    spearman_sem_random: float
    spearman_cov: float
    spearman_cov_random: float
    level_agreement_sem: float  # Spearman of measured vs planted semantic LEVEL (grid ordering)
    level_agreement_cov: float
    extra: dict = field(default_factory=dict)

    def rows(self) -> list[tuple[str, float, float]]:
        return [
            ("semantic subspace recovery (mean cos^2 of principal angles)", self.recovery, self.recovery_random),
            ("Spearman(D_sem, planted semantic shift)", self.spearman_sem, self.spearman_sem_random),
            ("Spearman(D_cov, planted covariate shift)", self.spearman_cov, self.spearman_cov_random),
        ]


def _spearman(a, b) -> float:
    return float(spearmanr(a, b).statistic)


def planted_report(world: PlantedWorld, laid: LAID, d_sem, d_cov, sem_level, cov_level, seed: int = 0) -> PlantedReport:
    """Compare measured shifts (and grid levels) with the planted ground truth, and with a random-W baseline."""
    W_rand = random_orthogonal(world.dim, seed + 1)
    r_sem, r_cov = shift_distances(world.test_features, world.id_features, LAID(W_rand))
    return PlantedReport(
        recovery=subspace_recovery(laid.W, world.semantic_basis),
        recovery_random=subspace_recovery(W_rand, world.semantic_basis),
        spearman_sem=_spearman(d_sem, world.test_semantic_shift),
        spearman_sem_random=_spearman(r_sem, world.test_semantic_shift),
        spearman_cov=_spearman(d_cov, world.test_covariate_shift),
        spearman_cov_random=_spearman(r_cov, world.test_covariate_shift),
        level_agreement_sem=_spearman(sem_level, world.test_semantic_level),
        level_agreement_cov=_spearman(cov_level, world.test_covariate_level),
    )


def write_planted_features(world: PlantedWorld, root: Path) -> tuple[Path, Path]:
    """The world's ID and test image features as precomputed feature sets (features.npy + index.parquet)."""
    import manifests

    dirs = []
    for name, x, labels in (("id", world.id_features, world.id_labels), ("test", world.test_features, world.test_labels)):
        d = root / f"{name}-features"
        index = pd.DataFrame({
            "path": [f"planted/{name}/{i:06d}.png" for i in range(len(x))],
            "wnid": [f"planted{int(c):04d}" for c in labels],
            "label": labels.astype(np.int64),
        })
        d.mkdir(parents=True, exist_ok=True)
        buf = __import__("io").BytesIO()
        np.save(buf, np.ascontiguousarray(x, dtype=np.float32))
        manifests.atomic_write_bytes(d / "features.npy", buf.getvalue())
        manifests.atomic_write_bytes(d / "index.parquet", manifests.parquet_bytes(index))
        dirs.append(d)
    return dirs[0], dirs[1]


def run_planted(out: Path, seed: int = 0, console: Console | None = None, progress: bool = True):
    """Planted world -> LAID -> `build-splits` on precomputed features -> ground-truth report."""
    from isood.pipeline import BuildConfig, build_splits

    console = console or Console()
    world = make_planted_world(seed=seed)
    world_dir = out / "planted-world"
    id_dir, test_dir = write_planted_features(world, world_dir)
    t0 = time.perf_counter()
    laid = fit_laid(world.text_anchor, world.text_semantic_shift, world.text_covariate_shift, seed=seed)
    fit_s = time.perf_counter() - t0
    laid_path = laid.save(world_dir / "laid.safetensors")
    cfg = BuildConfig(id=str(id_dir), test=str(test_dir), laid=str(laid_path), out=str(out / "splits"),
                      seed=seed, progress=progress)
    result = build_splits(cfg, console=console, argv=["isood", "demo", "--out", str(out), "--seed", str(seed)])
    images = result.manifest.frame("images")
    order = np.argsort([int(p.rsplit("/", 1)[1].split(".")[0]) for p in images["path"]])
    images = images.iloc[order].reset_index(drop=True)
    report = planted_report(world, laid, images["d_sem"], images["d_cov"], images["sem_level"], images["cov_level"], seed)
    report.extra.update(fit_seconds=round(fit_s, 2), orthogonality_error=laid.orthogonality_error)
    return world, result, report


def report_table(report: PlantedReport) -> Table:
    t = Table(title="Planted world: LAID and shift against the ground truth")
    t.add_column("check")
    t.add_column("learned W", justify="right")
    t.add_column("random W", justify="right")
    for name, learned, rand in report.rows():
        t.add_row(name, f"{learned:.3f}", f"{rand:.3f}")
    t.add_row("Spearman(grid level, planted level): semantic / covariate",
              f"{report.level_agreement_sem:.3f} / {report.level_agreement_cov:.3f}", "")
    return t


def run_demo(out: str | Path = "demo-out", seed: int = 0, console: Console | None = None, wordnet: bool = True) -> PlantedReport:
    console = console or Console()
    out = Path(out)
    t0 = time.perf_counter()
    if wordnet:
        from wordnet_tools.jobs import run_filter, summary_table

        with console.status("WordNet class filter: ImageNet-21K candidates vs ImageNet-1K"):
            cf = run_filter("21k", "1k", ["organism.n.01"], False, out / "class-filter")
        console.print(summary_table(cf, "ImageNet-OOD class filter (21k vs 1k, excluding organism.n.01)"))
    world, result, report = run_planted(out, seed=seed, console=console)
    console.print(report_table(report))
    cells = result.cells
    console.print(f"splits: {result.n_test} test images in {len(cells)} cells ({int(cells['na'].sum())} N/A), "
                  f"LAID fit {report.extra['fit_seconds']} s, ||W^T W - I|| = {report.extra['orthogonality_error']:.4f}")
    from isood.evaluation.planted import evaluate_planted, planted_table

    with console.status("Evaluation: OOD detectors per cell on the planted world"):
        ev = evaluate_planted(world, result.manifest, out / "evaluation", seed=seed)
    console.print(planted_table(ev))
    report.extra.update(msp_auroc_by_sem_level=ev.msp_by_level()["measured"].round(4).tolist())
    console.print(f"evaluation: {out}/evaluation/report.html ({len(ev.evaluation.detectors)} detectors, "
                  f"{int((~ev.evaluation.per_cell['na']).sum()) // len(ev.evaluation.detectors)} measured cells)")
    console.print(f"manifests under {out}/ (verify with `isood verify {out}/splits`); total {time.perf_counter() - t0:.1f} s")
    return report
