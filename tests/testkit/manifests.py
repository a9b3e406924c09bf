"""Small planted manifests of every kind, each written by the real writer of its kind (the stage's write step),
for the manifests tests: splits (``isood.stages.splits.write_splits``), syn-is (``isood.stages.syn.
write_syn_manifest``), class-filter and audit (``isood.stages.wordnet.jobs``), features (``isood.features.featurestore.
extract_features``), IS-OOD release lists (``isood.stages.interop.import_isood_lists``)."""

import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")  # before `datasets` is imported anywhere: never try the Hub
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")

from pathlib import Path  # noqa: E402

import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402
import pytest  # noqa: E402

from isood.science.grid import bin_with_edges, cell_names, cell_table, edges_table  # noqa: E402

# planted grid: (cov, sem) -> number of images; cells with < 10 images are N/A
PLANTED_CELLS = {(2, 5): 12, (0, 0): 15, (7, 7): 10, (3, 1): 4, (6, 2): 1}
NO_LEVEL_ROWS = 3  # images whose shift was NaN (level -1): in `all`, in no cell
N_LEVELS, NA_THRESHOLD = 8, 10
EDGES = np.linspace(0.0, 1.0, N_LEVELS + 1)  # both axes: level l holds shifts in [l/8, (l+1)/8)
# (cov, sem) -> images of the planted Syn-IS world
SYN_CELLS = {(1, 4): 11, (5, 0): 3}
# classes of the planted WordNet lists: n02084071 dog (hypernym of ID dog breeds), n02085620 Chihuahua (ID),
# n00288000 dressage (clean), n00005787 benthos (an organism), n09999999 (no such synset)
CLASS_FILTER_CANDIDATES = ["n00005787", "n00288000", "n02084071", "n02085620", "n09999999"]
# (source, (cov, sem)) -> number of list entries of a planted IS-OOD release
RELEASE = {"in21k-train": {(0, 0): 12, (2, 5): 11, (7, 1): 3}, "in21k-val": {(2, 5): 10, (4, 4): 2},
           "syn-is": {(1, 6): 14}}


def planted_shifts(cells=PLANTED_CELLS, seed=0) -> pd.DataFrame:
    """path, wnid, d_sem, d_cov of images planted inside the given cells (plus NO_LEVEL_ROWS with NaN shifts)."""
    rng = np.random.default_rng(seed)
    rows = []
    for (c, s), n in sorted(cells.items()):
        wnid = f"n{9000000 + 10 * c + s:08d}"
        for i in range(n):
            rows.append({"path": f"{wnid}/{wnid}_{i}.JPEG", "wnid": wnid, "d_sem": (s + rng.uniform(0.1, 0.9)) / 8,
                         "d_cov": (c + rng.uniform(0.1, 0.9)) / 8})
    for i in range(NO_LEVEL_ROWS):
        rows.append({"path": f"n09999999/n09999999_{i}.JPEG", "wnid": "n09999999", "d_sem": np.nan, "d_cov": np.nan})
    return pd.DataFrame(rows)


def binned(shifts: pd.DataFrame) -> pd.DataFrame:
    """The images table: shifts binned on EDGES (``isood.science.grid``), with their cell names."""
    sem, cov = bin_with_edges(shifts["d_sem"], EDGES), bin_with_edges(shifts["d_cov"], EDGES)
    return shifts.assign(sem_level=sem, cov_level=cov, cell=cell_names(cov, sem))


def splits_tables(cells=PLANTED_CELLS, seed=0) -> dict:
    images = binned(planted_shifts(cells, seed))
    return {"images": images,
            "cells": cell_table(images["cov_level"], images["sem_level"], N_LEVELS, NA_THRESHOLD),
            "edges": edges_table(EDGES, EDGES)}


def write_splits(root, cells=PLANTED_CELLS, **kw):
    """A splits manifest written by the build-splits write step (``isood.stages.splits.write_splits``)."""
    from isood.stages.splits import write_splits as write

    t = splits_tables(cells)
    args = dict(images=t["images"], cells=t["cells"], edges=t["edges"],
                config={"n_levels": N_LEVELS, "na_threshold": NA_THRESHOLD},
                argv=["isood", "build-splits", "--out", str(root)])
    args.update(kw)
    return write(root, **args)


def write_syn_is(root):
    """A syn-is manifest written by the generate-syn write step, with planted images and prompts."""
    from isood.stages.syn import write_syn_manifest
    from isood.stages.syn.steps import rejected_rows
    from isood.core.files import sha256_bytes

    root = Path(root)
    t = binned(planted_shifts(SYN_CELLS))
    t = t[t["sem_level"] >= 0].reset_index(drop=True)
    n = len(t)
    prompts = pd.DataFrame({"prompt_id": [f"p{i:04d}" for i in range(n)], "style": "watercolor", "wnid": t["wnid"],
                            "label": [f"thing {i}" for i in range(n)],
                            "prompt": [f"a watercolor painting of thing {i}" for i in range(n)],
                            "negative_prompt": "", "d_sem": t["d_sem"], "d_cov": t["d_cov"],
                            "sem_level": t["sem_level"], "cov_level": t["cov_level"], "cell": t["cell"],
                            "selected": True})
    blobs = {f"images/watercolor/p{i:04d}_0.png": f"PNG-{i}".encode() for i in range(n)}
    for rel, data in blobs.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_bytes(data)
    images = prompts.drop(columns="selected").assign(
        path=list(blobs), image_index=0, seed=np.arange(n, dtype=np.int64),
        sha256=[sha256_bytes(b) for b in blobs.values()])
    manifest, _ = write_syn_manifest(
        root, images=images, prompts=prompts, edges=edges_table(EDGES, EDGES),
        rejected=rejected_rows(prompts.iloc[:0], "prompt"),
        config={"pipeline": "local-dir:/tiny", "n_levels": N_LEVELS, "na_threshold": NA_THRESHOLD},
        argv=["isood", "generate-syn"])
    return manifest


def write_class_filter(root):
    """A class-filter manifest written by `isood wordnet filter`'s job on a planted candidate list."""
    from isood.stages.wordnet.jobs import run_filter

    cand = Path(root).parent / f"{Path(root).name}-candidates.txt"
    cand.write_text("\n".join(CLASS_FILTER_CANDIDATES) + "\n")
    return run_filter(str(cand), "1k", out=root, argv=["isood", "wordnet", "filter"])


def write_audit(root):
    """An audit manifest written by `isood wordnet audit`'s job on a planted image list."""
    from isood.stages.wordnet.jobs import run_audit

    lst = Path(root).parent / f"{Path(root).name}-list.txt"
    lst.write_text("n00288000/a.JPEG\nn00288000/b.JPEG\nn02085620_17.JPEG\nn02084071/c.jpg\n")
    return run_audit(lst, "1k", out=root, argv=["isood", "wordnet", "audit"]).manifest


def write_features(root, images, clip):
    """A features manifest written by `isood extract` (``isood.features.featurestore.extract_features``, with its card)."""
    from isood.features.featurestore import extract_features

    return extract_features(images, clip, root, batch_size=8, device="cpu", progress=False,
                            argv=["isood", "extract"]).manifest


def write_release(root: Path, with_labels_in=("in21k-val",), release=RELEASE) -> Path:
    """An IS-OOD-style release folder of per-cell lists; 'in21k-val' lists carry OpenOOD labels, others bare paths."""
    for source, cells in release.items():
        for (c, s), n in cells.items():
            lines = []
            for i in range(n):
                if source == "syn-is":
                    path = f"syn/style{c}/img_{s}_{i}.png"
                else:
                    wnid = f"n{9100000 + 10 * c + s:08d}"
                    path = f"{wnid}/{wnid}_{i}.JPEG"
                lines.append(f"{path} -1" if source in with_labels_in else path)
            f = root / source / f"cov_{c}_sem_{s}.txt"
            f.parent.mkdir(parents=True, exist_ok=True)
            f.write_text("# IS-OOD list\n" + "\n".join(lines) + "\n\n")
    (root / "README.txt").write_text("not a list")
    return root


@pytest.fixture
def load(tmp_path):
    """`datasets.load_dataset` with a private cache folder (offline)."""
    import datasets

    def _load(path, *args, **kw):
        return datasets.load_dataset(str(path), *args, cache_dir=str(tmp_path / "hf-cache"), **kw)

    return _load


class _Worlds:
    PLANTED_CELLS = PLANTED_CELLS
    NO_LEVEL_ROWS = NO_LEVEL_ROWS
    SYN_CELLS = SYN_CELLS
    RELEASE = RELEASE
    CLASS_FILTER_CANDIDATES = CLASS_FILTER_CANDIDATES
    N_LEVELS = N_LEVELS
    EDGES = EDGES
    planted_shifts = staticmethod(planted_shifts)
    splits_tables = staticmethod(splits_tables)
    write_splits = staticmethod(write_splits)
    write_syn_is = staticmethod(write_syn_is)
    write_class_filter = staticmethod(write_class_filter)
    write_audit = staticmethod(write_audit)
    write_release = staticmethod(write_release)


@pytest.fixture
def worlds():
    """The planted-manifest writers above (test modules cannot import conftest under --import-mode=importlib)."""
    return _Worlds


@pytest.fixture
def write_kind(worlds, request):
    """``write_kind(kind, root)``: a manifest of that kind written by its real writer (features need the tiny
    CLIP model and images of tests/conftest.py, loaded only when asked for)."""

    def _write(kind, root):
        if kind == "features":
            return write_features(root, request.getfixturevalue("tiny_images"),
                                  request.getfixturevalue("tiny_encoder"))
        return {"splits": write_splits, "syn-is": write_syn_is, "class-filter": write_class_filter,
                "audit": write_audit}[kind](root)

    return _write
