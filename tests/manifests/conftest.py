"""Small planted manifests of every kind, written through the dataset-card writer, for the manifests tests."""

import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")  # before `datasets` is imported anywhere: never try the Hub
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")

import numpy as np
import pandas as pd
import pytest

from manifests.card import write_with_card

# planted grid: (cov, sem) -> number of images; cells with < 10 images are N/A
PLANTED_CELLS = {(2, 5): 12, (0, 0): 15, (7, 7): 10, (3, 1): 4, (6, 2): 1}
NO_LEVEL_ROWS = 3  # images whose shift was NaN (level -1): in `all`, in no cell


def splits_tables(cells=PLANTED_CELLS, seed=0):
    rng = np.random.default_rng(seed)
    rows = []
    for (c, s), n in sorted(cells.items()):
        for i in range(n):
            wnid = f"n{9000000 + 10 * c + s:08d}"
            rows.append({"path": f"{wnid}/{wnid}_{i}.JPEG", "wnid": wnid, "d_sem": s / 8 + rng.random() / 8,
                         "d_cov": c / 8 + rng.random() / 8, "sem_level": s, "cov_level": c})
    for i in range(NO_LEVEL_ROWS):
        rows.append({"path": f"n09999999/n09999999_{i}.JPEG", "wnid": "n09999999", "d_sem": np.nan,
                     "d_cov": np.nan, "sem_level": -1, "cov_level": -1})
    images = pd.DataFrame(rows)
    grid = [(c, s) for c in range(8) for s in range(8)]
    n = [cells.get(k, 0) for k in grid]
    cells_df = pd.DataFrame({"cell": [f"cov_{c}_sem_{s}" for c, s in grid], "cov_level": [c for c, _ in grid],
                             "sem_level": [s for _, s in grid], "n": n, "na": [x < 10 for x in n]})
    edges = pd.DataFrame({"axis": ["cov"] * 9 + ["sem"] * 9, "index": list(range(9)) * 2,
                          "edge": list(np.linspace(0, 1, 9)) * 2})
    return {"images": images, "cells": cells_df, "edges": edges}


def write_splits(root, cells=PLANTED_CELLS, **kw):
    args = dict(kind="splits", tables=splits_tables(cells), config={"n_levels": 8, "na_threshold": 10},
                files={"lists/cov_2_sem_5.txt": "x\n"}, argv=["isood", "build-splits", "--out", str(root)])
    args.update(kw)
    return write_with_card(root, **args)


def write_syn_is(root):
    t = splits_tables({(1, 4): 11, (5, 0): 3})
    imgs = t["images"]
    imgs = imgs[imgs["sem_level"] >= 0].reset_index(drop=True)
    imgs["path"] = [f"images/{i:05d}.png" for i in range(len(imgs))]
    imgs["prompt"] = [f"a watercolor painting of thing {i}" for i in range(len(imgs))]
    imgs["style"] = "watercolor"
    imgs["seed"] = np.arange(len(imgs), dtype=np.int64)
    blobs = {p: f"PNG-{i}".encode() for i, p in enumerate(imgs["path"])}
    import hashlib

    imgs["sha256"] = [hashlib.sha256(blobs[p]).hexdigest() for p in imgs["path"]]
    t["images"] = imgs
    t["cells"] = t["cells"].assign(n=lambda d: [11 if c == "cov_1_sem_4" else 3 if c == "cov_5_sem_0" else 0
                                                for c in d["cell"]]).assign(na=lambda d: d["n"] < 10)
    return write_with_card(root, kind="syn-is", tables=t, files=blobs, config={"pipeline": "local-dir:/tiny"},
                           argv=["isood", "generate-syn"])


def write_class_filter(root):
    classes = pd.DataFrame({
        "wnid": ["n00000001", "n00000002", "n00000003", "n00000004", "n00000005"],
        "name": ["a", "b", "c", "d", "e"],
        "decision": ["keep", "drop", "keep", "drop", "drop"],
        "rule": ["", "hypernym", "", "hyponym", "excluded"],
        "conflict_wnid": ["", "n01440764", "", "n01443537", ""],
        "conflict_name": ["", "tench", "", "goldfish", ""],
    })
    return write_with_card(root, kind="class-filter", tables={"classes": classes}, config={"id": "1k"},
                           argv=["isood", "wordnet", "filter"])


def write_audit(root):
    audit = pd.DataFrame({"wnid": ["n00000001", "n00000009"], "decision": ["keep", "drop"], "rule": ["", "id_class"],
                          "entries": [3, 2]})
    return write_with_card(root, kind="audit", tables={"audit": audit}, config={}, argv=["isood", "wordnet", "audit"])


def write_features(root):
    root.mkdir(parents=True, exist_ok=True)
    np.save(root / "features-00000.npy", np.eye(3, dtype=np.float32))
    index = pd.DataFrame({"path": ["a/1.jpg", "a/2.jpg", "b/3.jpg"], "wnid": [None, None, None]})
    return write_with_card(root, kind="features", tables={"index": index}, config={"clip": "tiny"},
                           existing_files=["features-00000.npy"], argv=["isood", "extract"])


WRITERS = {"splits": write_splits, "syn-is": write_syn_is, "class-filter": write_class_filter,
           "audit": write_audit, "features": write_features}


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
    WRITERS = WRITERS
    splits_tables = staticmethod(splits_tables)
    write_splits = staticmethod(write_splits)
    write_syn_is = staticmethod(write_syn_is)
    write_class_filter = staticmethod(write_class_filter)


@pytest.fixture
def worlds():
    """The planted-manifest writers above (test modules cannot import conftest under --import-mode=importlib)."""
    return _Worlds
