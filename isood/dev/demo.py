"""`isood demo` (run and rendered by ``isood.cli.demo``): the whole pipeline on the embedded default, with
ground truth to check it against.

1. The ImageNet-OOD class filter, ImageNet-21K candidates vs ImageNet-1K (real WordNet 3.0 + timm lists).
2. A planted world (isood.science.simulate): LAID is fitted on its text triplets, then the real `build-splits` stage runs
   on its precomputed image features; the measured shifts are compared with the planted ones, next to a random
   orthogonal W as the baseline.
3. Evaluation (isood.dev.planted): a linear classifier on the planted ID features, OOD detectors scored per
   measured cell of the splits manifest, heatmaps and report; MSP's AUROC per semantic level is printed.
4. Syn-IS binning on a CLIP-like world (isood.science.simulate_clip, in memory): the modality gap, and how many of the
   64 cells hold style x label prompts when they are binned on the image grid's edges vs on their own
   (``generate-syn --prompt-edges``).
"""

from __future__ import annotations

import io
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, NamedTuple

import numpy as np
import pandas as pd
from scipy.stats import spearmanr

import manifests
from isood.stages.syn.edges import choose_edges, spread_warnings
from isood.core.errors import BadInputError
from isood.kinds import CLASS_FILTER, EVALUATION, SPLITS
from isood.science.laid import LAID, fit_laid
from isood.core.shared_options import check_seed
from isood.core.files import TMP_PREFIX, atomic_write_bytes
from isood.science.grid import bin_with_edges, level_edges
from isood.features.shift import shift_distances
from isood.science.simulate import PlantedWorld, make_planted_world, random_orthogonal, subspace_recovery
from isood.science.simulate_clip import make_clip_world, modality_cosines
from isood.stages.splits import SplitsOptions, BuildResult, build_splits
from isood.stages.wordnet.jobs import run_filter

__all__ = ["PlantedReport", "PlantedRun", "planted_report", "write_planted_features", "run_planted",
           "run_class_filter", "FILTER_ARGS", "FILTER_EXCLUDE", "check_demo_out", "DEMO_MANIFESTS", "PLANTED_DIR",
           "GapReport", "run_modality_gap", "DEMO_CLIP_WORLD"]


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


#: The demo's class filter: candidates, ID classes, excluded subtree.
FILTER_ARGS = ("21k", "1k")
FILTER_EXCLUDE = ("organism.n.01",)


class PlantedRun(NamedTuple):
    """A planted-world run: the world, the build-splits result, the ground-truth report."""

    world: PlantedWorld
    result: BuildResult
    report: PlantedReport


def _spearman(a, b) -> float:
    return float(spearmanr(a, b).statistic)


def planted_report(world: PlantedWorld, laid: LAID, d_sem, d_cov, sem_level, cov_level, *,
                   seed: int = 0) -> PlantedReport:
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
    dirs = []
    for name, x, labels in (("id", world.id_features, world.id_labels), ("test", world.test_features, world.test_labels)):
        d = Path(root) / f"{name}-features"
        index = pd.DataFrame({
            "path": [f"planted/{name}/{i:06d}.png" for i in range(len(x))],
            "wnid": [f"planted{int(c):04d}" for c in labels],
            "label": labels.astype(np.int64),
        })
        buf = io.BytesIO()
        np.save(buf, np.ascontiguousarray(x, dtype=np.float32))
        atomic_write_bytes(d / "features.npy", buf.getvalue())
        atomic_write_bytes(d / "index.parquet", manifests.parquet_bytes(index))
        dirs.append(d)
    return dirs[0], dirs[1]


#: What ``isood demo --out DIR`` writes into DIR: three manifests and the planted world's raw features.
DEMO_MANIFESTS = {"class-filter": CLASS_FILTER, "splits": SPLITS, "evaluation": EVALUATION}
PLANTED_DIR = "planted-world"
_PLANTED_FILES = {"laid.safetensors", "laid.json", "id-features/features.npy", "id-features/index.parquet",
                  "test-features/features.npy", "test-features/index.parquet"}


def check_demo_out(out: str | Path) -> None:
    """Refuse, before any work, a demo ``--out`` that is a manifest itself or holds anything but what the demo
    writes (its three manifests, each checked by ``manifests.check_output`` for its kind, and the planted
    world): the demo never replaces or mixes into what it did not write."""
    out = Path(out)
    if out.exists() and not out.is_dir():
        raise BadInputError(f"--out {out} is a file; pass a directory")
    if (out / manifests.MANIFEST_FILE).is_file():
        raise BadInputError(f"--out {out} is a manifest; the demo writes several manifests into a folder: pass a new "
                            "folder (or an earlier demo's)")
    if not out.is_dir():
        return
    known = {*DEMO_MANIFESTS, PLANTED_DIR}
    other = sorted(p.name for p in out.iterdir() if p.name not in known and not p.name.startswith(TMP_PREFIX))
    if other:
        raise BadInputError(f"--out {out} holds {', '.join(other[:3])}, which the demo does not write; pass a new "
                            "folder (or an earlier demo's)")
    for name, kind in DEMO_MANIFESTS.items():
        manifests.check_output(out / name, kind, option="--out")
    world = out / PLANTED_DIR
    if world.is_dir():
        foreign = sorted(p.relative_to(world).as_posix() for p in world.rglob("*")
                         if p.is_file() and not p.name.startswith(TMP_PREFIX)
                         and p.relative_to(world).as_posix() not in _PLANTED_FILES)
        if foreign:
            raise BadInputError(f"--out {out}/{PLANTED_DIR} holds {', '.join(foreign[:3])}, which the demo does not "
                                "write; pass a new folder")


def run_planted(out: str | Path, *, seed: int = 0, progress: bool = True,
                warn: Callable[[str], None] | None = None) -> PlantedRun:
    """Planted world -> LAID -> `build-splits` on precomputed features -> ground-truth report."""
    check_seed(seed)
    out = Path(out)
    world = make_planted_world(seed=seed)
    world_dir = out / PLANTED_DIR
    id_dir, test_dir = write_planted_features(world, world_dir)
    t0 = time.perf_counter()
    laid = fit_laid(world.text_anchor, world.text_semantic_shift, world.text_covariate_shift, seed=seed)
    fit_s = time.perf_counter() - t0
    laid_path = laid.save(world_dir / "laid.safetensors")
    cfg = SplitsOptions(id=str(id_dir), test=str(test_dir), laid=str(laid_path), out=str(out / "splits"),
                      seed=seed, progress=progress)
    result = build_splits(cfg, warn=warn, argv=["isood", "demo", "--out", str(out), "--seed", str(seed)])
    images = result.manifest.images
    order = np.argsort([int(p.rsplit("/", 1)[1].split(".")[0]) for p in images["path"]])
    images = images.iloc[order].reset_index(drop=True)
    report = planted_report(world, laid, images["d_sem"], images["d_cov"], images["sem_level"], images["cov_level"],
                            seed=seed)
    report.extra.update(fit_seconds=round(fit_s, 2), orthogonality_error=laid.orthogonality_error)
    return PlantedRun(world, result, report)


def run_class_filter(out: str | Path) -> manifests.Manifest:
    """Step 1: the ImageNet-OOD class filter (21k candidates vs 1k, excluding organism.n.01) into ``out``."""
    return run_filter(*FILTER_ARGS, out=out, exclude=FILTER_EXCLUDE)


#: The demo's CLIP-like world: ImageNet's proportions at a size that builds and measures in about a second.
DEMO_CLIP_WORLD = dict(dim=64, n_id_classes=200, n_ood_classes=800, n_superclasses=20, n_styles=40)


class GapReport(NamedTuple):
    """Step 4: the CLIP-like world's mean cosines (``modality_cosines``) and the cells (of ``n_cells``) holding
    prompts binned on the image grid's edges and on their own, with the warnings of the former."""

    cosines: dict[str, float]
    cells_on_splits_edges: int
    cells_on_prompt_edges: int
    n_cells: int
    warnings: list[str]


def run_modality_gap(seed: int = 0, *, n_levels: int = 8) -> GapReport:
    """A CLIP-like world's image grid (2,000 test images vs 400 ID images, ideal LAID) and 4,800 style x label
    prompts (120 labels x 40 styles) measured against the same ID images, binned both ways (in memory)."""
    check_seed(seed)
    world = make_clip_world(**DEMO_CLIP_WORLD, seed=seed)
    laid = LAID(world.mixing)
    id_feats, _ = world.id_images(2, seed=seed)
    test, _, _ = world.test_images(2000, seed=seed + 1)
    i_sem, i_cov = shift_distances(test, id_feats, laid)
    rng = np.random.default_rng(seed)
    labels = np.concatenate([rng.choice(world.id_classes, 30, replace=False),
                             rng.choice(world.ood_classes, 90, replace=False)])
    classes, styles = (g.ravel() for g in np.meshgrid(labels, np.arange(len(world.styles)), indexing="ij"))
    p_sem, p_cov = shift_distances(world.texts(classes, styles), id_feats, laid)
    image_grid = choose_edges(p_sem, p_cov, mode="splits", n_levels=n_levels,
                              splits_edges=(level_edges(i_sem, n_levels), level_edges(i_cov, n_levels)))
    own = choose_edges(p_sem, p_cov, mode="prompts", n_levels=n_levels)

    def cells(e) -> int:
        return len(set(zip(bin_with_edges(p_sem, e.sem).tolist(), bin_with_edges(p_cov, e.cov).tolist())))

    return GapReport(modality_cosines(world, seed=seed), cells(image_grid), cells(own), n_levels ** 2,
                     spread_warnings(p_sem, p_cov, image_grid))
