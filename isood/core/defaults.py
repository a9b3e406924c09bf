"""The one home of isood's constants (the papers' defaults) and of every environment variable it reads.

Constants come from IS-OOD ("A Sorites Paradox", grid of 8 levels per axis, a cell with fewer than 10 images is
N/A, level range between the 1st and 99th percentile), OpenOOD (label -1 for OOD) and the model cards
(CLIP ViT-B-32 openai, SDXL-Turbo). Nothing else in isood hard-codes them.
"""

from __future__ import annotations

import os
from pathlib import Path


__all__ = [
    "N_LEVELS", "MAX_LEVELS", "LEVELS_NOTE", "NA_THRESHOLD", "QUANTILE_CLIP", "OOD_LABEL", "WORDNET_EXCLUDE",
    "DEFAULT_DETECTORS", "DEFAULT_CLIP", "DEFAULT_PIPELINE", "LAID_TRIPLETS", "DEFAULT_VERIFY", "VERIFY_MODES",
    "VERIFY_HELP", "DEFAULT_PLOT_METRICS", "ALL_PLOT_METRICS", "SEED_MAX", "DEFAULT_BOOTSTRAP", "CI_LEVEL",
    "DEFAULT_BATCH_SIZE", "DEFAULT_SHARD_SIZE", "ENGINES", "ENV_CACHE_DIR", "ENV_WORDNET_DIR", "cache_dir", "wordnet_dir_override",
]

#: Bootstrap replicates behind the 95% intervals of an evaluation (per cell and Table 1; 0 switches them off).
DEFAULT_BOOTSTRAP = 1000
#: The coverage of those intervals (percentile bootstrap).
CI_LEVEL = 0.95
#: Shift levels per axis of the IS-OOD grid (cells ``cov_{c}_sem_{s}``, 0-based).
N_LEVELS = 8
#: The most levels per axis a command takes: 32 x 32 = 1024 cells (IS-OOD uses 8 x 8); finer grids leave most
#: cells under the N/A threshold even for millions of images, and an import or export writes a list per cell.
MAX_LEVELS = 32
#: A cell with fewer images than this is N/A (IS-OOD).
NA_THRESHOLD = 10
#: Why level counts are bounded (said by every refusal of one).
LEVELS_NOTE = (f"IS-OOD uses {N_LEVELS}; {MAX_LEVELS} per axis is already {MAX_LEVELS * MAX_LEVELS} cells of at least "
               f"{NA_THRESHOLD} images each, and one list file per cell")
#: Quantiles of the shift values that bound the level range (outliers fold into the end levels).
QUANTILE_CLIP = (0.01, 0.99)
#: OpenOOD's label of an OOD image in an imglist.
OOD_LABEL = -1
#: OpenOOD's groups of OOD sets and the name of each group's mean row (``Evaluator.eval_ood``).
OOD_GROUPS = {"near": "nearood", "far": "farood"}
#: WordNet subtrees the ImageNet-OOD class filter drops by default (the paper's rule: organisms are excluded).
WORDNET_EXCLUDE = ("organism.n.01",)
#: Detectors `isood evaluate` scores when --detectors is not given.
DEFAULT_DETECTORS = "msp,maxlogit,energy,mds,knn"
#: Metrics `isood evaluate` draws (heatmaps and level curves) when --plot-metrics is not given (``all``: every
#: computed metric); every metric is in the tables and CSVs whatever is drawn.
DEFAULT_PLOT_METRICS = "auroc,fpr95"
#: ``--plot-metrics all``: draw every computed metric.
ALL_PLOT_METRICS = "all"
#: The largest ``--seed`` of every command: faiss' k-means (build-splits --ann-recall) takes a C int, and the
#: demo's random orthogonal baseline (numpy's legacy RandomState) takes seed + 1 < 2**32.
SEED_MAX = 2**31 - 1
#: The CLIP IS-OOD measures shift with (open_clip ``MODEL:PRETRAINED``).
DEFAULT_CLIP = "ViT-B-32:openai"
#: The text-to-image model of Syn-IS.
DEFAULT_PIPELINE = "stabilityai/sdxl-turbo"
#: LAID training triplets sampled from labels x CLIP templates.
LAID_TRIPLETS = 10_000
#: How a stage checks the manifests it reads (``--verify``): ``fast`` (sizes, every table and small file hashed,
#: large files hashed when their size / mtime / inode changed since they last verified) or ``full`` (every hash).
DEFAULT_VERIFY = "fast"
VERIFY_MODES = ("fast", "full")
#: The help of every command's ``--verify`` (``isood.core.shared_options.verify_option``).
VERIFY_HELP = ("How the manifests this command reads are checked first: fast (sizes; every table and small file "
               "hashed; larger files when their size, mtime or inode changed since they last verified) or full "
               "(every hash).")

#: Images per batch of a model's forward pass (extract, build-splits, evaluate).
DEFAULT_BATCH_SIZE = 64
#: Images per feature shard (``features-NNNNN.npy``): the unit of resuming and of a job array's share.
DEFAULT_SHARD_SIZE = 10_000
#: ``--engine``: ``local`` (this process, decoding in ``--workers`` processes) or ``ray`` (Ray Data actors).
ENGINES = ("local", "ray")

#: Folder of isood's caches (text features, model outputs, WordNet staging); default ``~/.cache/isood``.
ENV_CACHE_DIR = "ISOOD_CACHE_DIR"
#: A WordNet 3.0 ``dict`` folder to use instead of nltk's data or Debian's ``/usr/share/wordnet``.
ENV_WORDNET_DIR = "ISOOD_WORDNET_DIR"


def cache_dir(*parts: str) -> Path:
    """``$ISOOD_CACHE_DIR`` (``~`` expanded; default ``~/.cache/isood``), joined with ``parts``."""
    base = os.environ.get(ENV_CACHE_DIR) or str(Path.home() / ".cache" / "isood")
    return Path(base).expanduser().joinpath(*parts)


def wordnet_dir_override() -> Path | None:
    """The folder named by ``$ISOOD_WORDNET_DIR`` (``~`` expanded), or None when unset."""
    value = os.environ.get(ENV_WORDNET_DIR)
    return Path(value).expanduser() if value else None


#: `isood show`'s files and defaults (``isood.report.mosaic`` draws them; the options need no matplotlib).
MOSAIC_PNG, MOSAIC_PDF = "mosaic.png", "mosaic.pdf"
MOSAIC_PER_CELL, MOSAIC_SIZE = 4, 64
