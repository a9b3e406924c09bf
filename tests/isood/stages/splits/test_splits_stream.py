"""`isood build-splits` streams the test side: on planted data in a sharded feature set (NaN rows, rows off unit
norm, unreadable images, ID classes among the test images) it writes the bytes of the in-memory steps
(clean -> filter -> measure -> bin, the whole test set as arrays), exact and --ann-recall; it reads the test
features a block at a time, and its memory does not grow with the test features."""
import tracemalloc

import numpy as np
import pandas as pd
import pytest

import isood.features.featurestore.loading as loading
import isood.features.shift as shift
import manifests
from isood.features.featurestore import load_features, write_features_manifest, write_shard
from isood.features.featurestore.loading import FeatureReader
from isood.kinds import FEATURES, SPLITS
from isood.science.laid import LAID
from isood.science.simulate import random_orthogonal
from isood.stages.splits import (SplitsOptions, ann_summary, bin_shifts, build_splits, clean_features, filter_test_rows,
                                 measure_shift, rejected_rows, write_splits)

DIM = 32
TABLES = ("images", "cells", "edges", "dropped")


def _unit(x):
    return (x / np.linalg.norm(x, axis=1, keepdims=True)).astype(np.float32)


def write_sharded(out, x, wnids, *, shard_size, rejected=()):
    """A features manifest of ``x`` in shards of ``shard_size`` rows, through the feature store's writers; the
    files listed in ``rejected`` (row numbers) are unreadable images."""
    out.mkdir(parents=True)
    shard_rows, row = {}, 0
    for k, s in enumerate(range(0, len(x), shard_size)):
        n = min(shard_size, len(x) - s)
        rows = pd.DataFrame({"path": [f"{wnids[i]}/{wnids[i]}_{i}.JPEG" for i in range(s, s + n)],
                             "wnid": list(wnids[s:s + n]), "row": np.arange(n, dtype=np.int64), "error": ""})
        bad = [r for r in rejected if s <= r < s + n]
        for r in bad:
            rows = pd.concat([rows, pd.DataFrame({"path": [f"{wnids[r]}/broken_{r}.JPEG"], "wnid": [wnids[r]],
                                                  "row": [-1], "error": ["corrupt JPEG"]})], ignore_index=True)
        write_shard(out, k, f"key{k}", rows, x[s:s + n])
        shard_rows[k] = rows
        row += n
    config = {"images": str(out.parent / "images"), "source_kind": "folder", "clip": "planted",
              "clip_identity": "planted", "embed_dim": x.shape[1], "shard_size": shard_size}
    write_features_manifest(out, shard_rows, config, [])
    return out


def write_flat(out, x, wnids):
    out.mkdir(parents=True)
    np.save(out / "features.npy", x)
    pd.DataFrame({"path": [f"{w}/{w}_{i}.JPEG" for i, w in enumerate(wnids)]}).to_parquet(out / "index.parquet")
    return out


@pytest.fixture(scope="module")
def planted(tmp_path_factory):
    base = tmp_path_factory.mktemp("stream")
    rng = np.random.default_rng(0)
    centres = rng.standard_normal((40, DIM))
    id_cls, test_cls = rng.integers(0, 30, 3000), rng.integers(0, 40, 14_000)
    x_id = _unit(centres[id_cls] + 0.25 * rng.standard_normal((3000, DIM)))
    x_test = _unit(centres[test_cls] + 0.25 * rng.standard_normal((14_000, DIM)))
    x_test[[5, 4100, 9001]] = np.nan  # dropped, on both sides of read and block bounds
    x_test[777] *= 2.5  # one row off unit norm: the whole set is renormalised, as in memory
    wn = lambda c: [f"n{int(k):08d}" for k in c]  # noqa: E731
    LAID(random_orthogonal(DIM, seed=1)).save(base / "laid.safetensors")
    return {"id": write_flat(base / "id", x_id, wn(id_cls)),
            "test": write_sharded(base / "test", x_test, wn(test_cls), shard_size=3333, rejected=(10, 7000)),
            "laid": base / "laid.safetensors", "base": base}


def _cfg(planted, out, **kw):
    return SplitsOptions(id=str(planted["id"]), test=str(planted["test"]), laid=str(planted["laid"]), out=str(out),
                       levels=4, na_threshold=2, exclude_id_classes=True, progress=False, **kw)


def _in_memory(planted, cfg, out):
    """The in-memory path of the same build: every test feature loaded, cleaned, filtered, measured, binned,
    written with the write step."""
    notes = []
    x_i, idx_i = load_features(planted["id"])
    x_t, idx_t = load_features(planted["test"])
    xi, ii, bad_i = clean_features(x_i, idx_i, "id", warn=notes.append)
    xt, it, bad_t = clean_features(x_t, idx_t, "test", warn=notes.append)
    keep, filtered = filter_test_rows(it, id_wnids=set(ii["wnid"]))
    xt, it = xt[keep], it.loc[keep].reset_index(drop=True)
    found = measure_shift(xt, xi, LAID.load(planted["laid"]), ann_recall=cfg.ann_recall, seed=cfg.seed)
    grid = bin_shifts(it, found.d_sem, found.d_cov, n_levels=cfg.levels, na_threshold=cfg.na_threshold,
                      clip=cfg.clip_quantile)
    ann = ann_summary(found.ann, grid.edges, warn=notes.append)
    rejected = rejected_rows("test", manifests.read(planted["test"], kind=FEATURES).rejected)
    dropped = pd.concat([p for p in (bad_i, rejected, bad_t, filtered) if p is not None], ignore_index=True)
    write_splits(out, images=grid.images, cells=grid.cells, edges=grid.edges, dropped=dropped, config={})
    return notes, ann


def _same_files(a, b):
    for t in TABLES:
        assert (a / "data" / f"{t}.parquet").read_bytes() == (b / "data" / f"{t}.parquet").read_bytes(), t
    lists = sorted(p.name for p in (a / "lists").iterdir())
    assert lists == sorted(p.name for p in (b / "lists").iterdir()) and len(lists) == 16
    for name in lists:
        assert (a / "lists" / name).read_bytes() == (b / "lists" / name).read_bytes(), name


@pytest.fixture
def small_blocks(monkeypatch):
    """Blocks smaller than the set, reads of another size than the blocks and the shards."""
    monkeypatch.setattr(shift, "BLOCK_ROWS", 4096)
    monkeypatch.setattr(loading, "READ_ROWS", 2500)


@pytest.mark.parametrize("ann_recall", [None, 0.95])
def test_streamed_build_writes_the_bytes_of_the_in_memory_steps(planted, tmp_path, small_blocks, ann_recall):
    cfg = _cfg(planted, tmp_path / "streamed", ann_recall=ann_recall)
    result = build_splits(cfg)
    notes, ann = _in_memory(planted, cfg, tmp_path / "memory")
    _same_files(tmp_path / "streamed", tmp_path / "memory")
    view = manifests.read(tmp_path / "streamed", kind=SPLITS)
    assert result.warnings == notes and notes[0].startswith("--test features: 3 of 14000 rows contain NaN")
    assert notes[1].startswith("--test features: 1 of 14000 rows are not L2-normalised")
    dropped = view.frame("dropped")
    assert (dropped["reason"] == "non-finite or zero feature").sum() == 3
    assert dropped["reason"].str.startswith("unreadable").sum() == 2 and (dropped["reason"] == "ID class").any()
    if ann_recall is not None:  # the tuning sample was drawn from the streamed rows as from the array
        for axis in ("sem", "cov"):
            a, b = view.ann["axes"][axis], ann["axes"][axis]
            assert {k: v for k, v in a.items() if "seconds" not in k} == {k: v for k, v in b.items() if "seconds" not in k}
        assert view.ann["cell_agreement"] == ann["cell_agreement"] and ann["held_out_images"] > 0


def test_streamed_distances_are_the_nearest_id_rows(planted, tmp_path, small_blocks):
    """Against a float64 brute force over the written-out LAID halves."""
    build_splits(_cfg(planted, tmp_path / "s"))
    images = manifests.read(tmp_path / "s", kind=SPLITS).images
    x_i, _ = load_features(planted["id"])
    x_t, idx_t = load_features(planted["test"])
    rows = idx_t.reset_index().set_index("path").loc[images["path"], "index"].to_numpy()
    W = LAID.load(planted["laid"]).W.astype(np.float64)
    k = DIM // 2

    def halves(x):
        y = (x / np.linalg.norm(x, axis=1, keepdims=True)).astype(np.float64) @ W
        return [h / np.linalg.norm(h, axis=1, keepdims=True) for h in (y[:, :k], y[:, k:])]

    for axis, t, i in zip(("d_sem", "d_cov"), halves(x_t[rows]), halves(x_i)):
        np.testing.assert_allclose(images[axis], 1.0 - (t @ i.T).max(axis=1), atol=2e-5)


def test_the_test_features_are_read_a_block_at_a_time(planted, tmp_path, small_blocks, monkeypatch):
    reads, read = [], FeatureReader.read

    def spy(self, start=0, stop=None):
        out = read(self, start, stop)
        reads.append((len(self), len(out)))
        return out

    monkeypatch.setattr(FeatureReader, "read", spy)
    build_splits(_cfg(planted, tmp_path / "s"))
    n_test = 14_000
    test_reads = [n for total, n in reads if total == n_test]
    assert max(test_reads) == 2500 and sum(test_reads) == 2 * n_test  # the check pass, the search pass
    assert [n for total, n in reads if total == 3000] == [3000]  # the ID side: read once, whole


def test_memory_does_not_grow_with_the_test_features(tmp_path, monkeypatch):
    """100,000 test rows of 256 floats (102 MB): the build's Python-side peak stays far below the features (the
    in-memory path held them, a normalised copy and their LAID transform)."""
    rng = np.random.default_rng(3)
    n, dim = 100_000, 256
    x_test = np.empty((n, dim), np.float32)
    for s in range(0, n, 10_000):
        x_test[s:s + 10_000] = _unit(rng.standard_normal((10_000, dim)))
    wnids = [f"n{int(c):08d}" for c in rng.integers(0, 50, n)]
    test = write_sharded(tmp_path / "test", x_test, wnids, shard_size=10_000)
    del x_test
    ids = write_flat(tmp_path / "id", _unit(rng.standard_normal((1000, dim))), wnids[:1000])
    LAID(random_orthogonal(dim, seed=0)).save(tmp_path / "laid.safetensors")
    monkeypatch.setattr(shift, "BLOCK_ROWS", 2048)  # 2 MB blocks: what stays is what grows with the rows
    monkeypatch.setattr(loading, "READ_ROWS", 2048)
    cfg = SplitsOptions(id=str(ids), test=str(test), laid=str(tmp_path / "laid.safetensors"), out=str(tmp_path / "s"),
                      progress=False)
    import torch  # noqa: F401  (the search imports it: ~70 MB of Python objects, before measuring)

    tracemalloc.start()
    try:
        result = build_splits(cfg)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert result.n_test == n
    print(f"peak {peak / 1e6:.1f} MB for {n * dim * 4 / 1e6:.0f} MB of test features")
    assert peak < 0.35 * n * dim * 4, f"peak {peak / 1e6:.0f} MB"
