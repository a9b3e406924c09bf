"""The integrity matrix, rows "content": resume and cache keys hold content, weight fingerprints hash the weights, and
odd images, links and names are converted or rejected, never silently wrong. Each row drives the real CLI (or the
stage's own function) on tiny data made here and names its guard.

| row                      | input                                          | guard                                   |
|--------------------------|------------------------------------------------|-----------------------------------------|
| overwritten_same_size    | image overwritten in place, same size and mtime| featurestore.shards.shard_key (content) |
| reads                    | first run, rerun, touch, racy file             | isood.core.content.content_hashes, StatCache |
| machine_independent      | a copy of the images (other inodes, mtimes)    | shard_key: relative paths + content     |
| job_array                | parts merged, then rerun                       | stages.extract.stage._take_part (stat caches) |
| evaluate_overwritten     | a test image overwritten in place, same size   | stages.evaluate.datasets.data_identity  |
| truncated_cache          | a truncated model-output cache file            | classifiers.output_cache.OutputCache.get|
| new_weights              | new weights saved into the same pipeline folder| generation.fingerprint.pipeline_weights |
| weights_cached           | a weights folder fingerprinted twice, touched  | isood.core.content.folder_fingerprint        |
| float / int32 images     | TIFF mode F in [0,1], [0,255], other; mode I   | isood.features.decoding.to_rgb                     |
| nan_float                | a float TIFF with NaN                          | isood.features.decoding.to_rgb (ValueError row)    |
| alias_folder             | ln -s n01443537 root/n01440764                 | isood.features.listing._folder_paths (AliasError) |
| outside_twice            | two links to one folder outside the root       | isood.features.listing._folder_paths              |
| non_utf8_names           | a file and a folder named in non-UTF-8 bytes   | isood.features.listing._utf8_names (UnicodeError)|
| portability              | one text encoded in batches of 2 and of 1      | tolerance, not bit equality             |
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from PIL import Image

import manifests
from isood.features.featurestore import load_features

WNID, OTHER = "n01440764", "n01443537"


def _rgb(seed: int, h: int = 24, w: int = 28) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, 256, (h, w, 3), dtype=np.uint8)


def _bmp(path: Path, seed: int) -> Path:
    """An uncompressed BMP: every image of one shape has the same file size, whatever its pixels."""
    path.parent.mkdir(parents=True, exist_ok=True)
    Image.fromarray(_rgb(seed)).save(path, format="BMP")
    return path


def _extract(cli, spec, images, out, *extra):
    return cli.invoke(["extract", "--images", images, "--clip", spec, "--out", out, "--device", "cpu",
                       "--workers", "0", *extra])


def _counts(result) -> str:
    """The 'shards written N, reused M' part of extract's summary line."""
    text = " ".join(result.stdout.split())
    assert result.exit_code == 0, result.output
    return text[text.index("shards written"):].split(";")[0]


def _features(out: Path) -> dict[str, np.ndarray]:
    x, index = load_features(out)
    return {p: x[i] for i, p in enumerate(index["path"])}


@pytest.fixture
def reads(monkeypatch):
    """Counts what touches file bytes: ``decoded`` (images read by the decoder, which hashes them on the way),
    ``hashed`` (images read only to hash them: a stat-cache miss) and ``weights`` (other files hashed: weights
    and configs)."""
    import isood.core.content
    import isood.features.decoding
    import isood.features.listing

    counts = {"decoded": 0, "hashed": 0, "weights": 0}
    read_hashed, hash_file = isood.features.decoding.read_hashed, isood.core.content.hash_file

    def decoded(path, digest):
        counts["decoded"] += 1
        return read_hashed(path, digest)

    def hashed(path):
        counts["hashed" if Path(path).suffix.lower() in isood.features.listing.IMAGE_EXTENSIONS else "weights"] += 1
        return hash_file(path)

    monkeypatch.setattr(isood.features.decoding, "read_hashed", decoded)
    monkeypatch.setattr(isood.core.content, "hash_file", hashed)

    def take(*keys: str) -> dict[str, int]:
        got = {k: v for k, v in counts.items() if k in (keys or ("decoded", "hashed"))}
        counts.update(decoded=0, hashed=0, weights=0)
        return got

    return take


# ---------------------------------------------------------------------------------------- extract keys by content
def test_overwritten_same_size_image_is_re_extracted(cli, tiny_clip_spec, tmp_path):
    """The image is overwritten by one of the same size and its mtime put back: only its bytes (and ctime) differ."""
    root = tmp_path / "images"
    target = _bmp(root / WNID / "a.bmp", 1)
    _bmp(root / WNID / "b.bmp", 2)
    _bmp(root / "ref" / "new.bmp", 3)  # what a.bmp becomes: the independent reference
    out = tmp_path / "out"
    assert _counts(_extract(cli, tiny_clip_spec, root, out)) == "shards written 1, reused 0"
    before = _features(out)
    assert not np.allclose(before[f"{WNID}/a.bmp"], before["ref/new.bmp"], atol=1e-3)
    st = target.stat()
    size = st.st_size
    _bmp(target, 3)
    os.utime(target, ns=(st.st_atime_ns, st.st_mtime_ns))
    assert target.stat().st_size == size and target.stat().st_mtime_ns == st.st_mtime_ns
    assert _counts(_extract(cli, tiny_clip_spec, root, out)) == "shards written 1, reused 0"
    after = _features(out)
    np.testing.assert_allclose(after[f"{WNID}/a.bmp"], after["ref/new.bmp"], atol=1e-6)
    np.testing.assert_allclose(after[f"{WNID}/b.bmp"], before[f"{WNID}/b.bmp"], atol=1e-6)
    assert manifests.verify(out).ok


def test_rerun_reads_no_unchanged_file_touch_reads_one(cli, tiny_clip_spec, tmp_path, reads, monkeypatch):
    """First run: every image read once, by the decoder (its hash comes free). Rerun: nothing read. A touched file
    with the same bytes: read once (to hash it), the shard kept. A file changed in place: its shard re-extracted."""
    import isood.core.content

    monkeypatch.setattr(isood.core.content, "RACY_NS", 0)  # the images were written just now; see the racy row below
    root = tmp_path / "images"
    for i in range(5):
        _bmp(root / WNID / f"{i}.bmp", i)
    out = tmp_path / "out"
    assert _counts(_extract(cli, tiny_clip_spec, root, out, "--shard-size", "2")) == "shards written 3, reused 0"
    assert reads() == {"decoded": 5, "hashed": 0}
    assert _counts(_extract(cli, tiny_clip_spec, root, out, "--shard-size", "2")) == "shards written 0, reused 3"
    assert reads() == {"decoded": 0, "hashed": 0}
    os.utime(root / WNID / "3.bmp")  # touched, same bytes
    assert _counts(_extract(cli, tiny_clip_spec, root, out, "--shard-size", "2")) == "shards written 0, reused 3"
    assert reads() == {"decoded": 0, "hashed": 1}
    assert _counts(_extract(cli, tiny_clip_spec, root, out, "--shard-size", "2")) == "shards written 0, reused 3"
    assert reads() == {"decoded": 0, "hashed": 0}  # the new stat was recorded
    _bmp(root / WNID / "4.bmp", 9)  # same size, other bytes: shard 2 (file 4) only
    r = _extract(cli, tiny_clip_spec, root, out, "--shard-size", "2")
    assert _counts(r) == "shards written 1, reused 2" and reads() == {"decoded": 1, "hashed": 1}


def test_a_racy_file_is_hashed_again(cli, tiny_clip_spec, tmp_path, reads):
    """A file written less than RACY_NS before its stat could change again within the same timestamp tick: its hash
    is not trusted on stat alone, so the rerun reads it (and still reuses the shard)."""
    root = tmp_path / "images"
    _bmp(root / WNID / "0.bmp", 0)
    out = tmp_path / "out"
    _extract(cli, tiny_clip_spec, root, out)
    reads()
    assert _counts(_extract(cli, tiny_clip_spec, root, out)) == "shards written 0, reused 1"
    assert reads() == {"decoded": 0, "hashed": 1}


def test_hashed_outputs_hold_no_stat(cli, tiny_clip_spec, tmp_path, monkeypatch):
    """Two copies of the images (other inodes, mtimes, ctimes) give the same shard files, byte for byte; the stat
    caches are `.~` bookkeeping that `isood verify` ignores."""
    import isood.core.content

    monkeypatch.setattr(isood.core.content, "RACY_NS", 0)  # so that the stat caches hold entries
    a = tmp_path / "a" / "images"
    for i in range(3):
        _bmp(a / WNID / f"{i}.bmp", i)
    b = tmp_path / "b" / "images"
    shutil.copytree(a, b)
    os.utime(b / WNID / "1.bmp", ns=(1, 10**9))
    for side in (a, b):
        assert _counts(_extract(cli, tiny_clip_spec, side, side.parent / "out")) == "shards written 1, reused 0"
    for name in ("features-00000.npy", "features-00000.rows.parquet"):
        assert (tmp_path / "a/out" / name).read_bytes() == (tmp_path / "b/out" / name).read_bytes()
    assert (tmp_path / "a/out/.~features-00000.stats.parquet").is_file()
    assert manifests.verify(tmp_path / "a/out").ok


def test_merged_job_array_keeps_the_stat_caches(cli, tiny_clip_spec, tmp_path, reads, monkeypatch):
    import isood.core.content

    monkeypatch.setattr(isood.core.content, "RACY_NS", 0)
    root = tmp_path / "images"
    for i in range(4):
        _bmp(root / WNID / f"{i}.bmp", i)
    for k in range(2):
        r = _extract(cli, tiny_clip_spec, root, tmp_path / f"part{k}", "--shard-size", "2", "--num-shards", "2",
                     "--shard-index", str(k))
        assert r.exit_code == 0, r.output
    r = cli.invoke(["merge", tmp_path / "part0", tmp_path / "part1", "--out", tmp_path / "merged"])
    assert r.exit_code == 0, r.output
    reads()
    r = _extract(cli, tiny_clip_spec, root, tmp_path / "merged", "--shard-size", "2")
    assert _counts(r) == "shards written 0, reused 2" and reads() == {"decoded": 0, "hashed": 0}


# -------------------------------------------------------------------------------------------- isood evaluate
ID, OOD = ["n01440764", "n01443537"], ["n02084071", "n04399382"]


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    """ID train / val folders, test images with a splits manifest (written by the splits writer), a test_resnet
    checkpoint; every image a 20 x 20 BMP (so an overwrite keeps the file size)."""
    from isood.dev.tiny_models import build_tiny_classifier

    from isood.science.grid import cell_name, cell_table, edges_table
    from isood.stages.splits import write_splits

    root = tmp_path_factory.mktemp("integrity_evaluate")
    rng = np.random.default_rng(0)
    colour = {w: rng.integers(30, 225, 3) for w in ID + OOD}

    def image(path: Path, w: str, shift: float = 0.0) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        a = np.clip(colour[w] + shift + rng.normal(0, 25, (20, 20, 3)), 0, 255).astype(np.uint8)
        Image.fromarray(a).save(path, format="BMP")

    for w in ID:
        for i in range(3):
            image(root / "train" / w / f"{w}_{i}.bmp", w)
        for i in range(2):
            image(root / "val" / w / f"{w}_{i}.bmp", w)
    rows = []
    for c in range(2):
        for s in range(2):
            for i in range(3):
                w = (ID if s == 0 else OOD)[i % 2]
                rel = f"{w}/{w}_c{c}s{s}_{i}.bmp"
                image(root / "test" / rel, w, 50.0 * c)
                rows.append({"path": rel, "wnid": w, "d_sem": 0.1 + s, "d_cov": 0.1 + c, "sem_level": s,
                             "cov_level": c, "cell": cell_name(c, s)})
    images = pd.DataFrame(rows)
    write_splits(root / "splits", images=images, cells=cell_table(images["cov_level"], images["sem_level"], 2, 2),
                 edges=edges_table([0.0, 1.0, 2.0], [0.0, 1.0, 2.0]), argv=["test"],
                 config={"test_root": str(root / "test"), "n_levels": 2, "na_threshold": 2})
    build_tiny_classifier(root / "resnet.safetensors", num_classes=2)
    return root


def _evaluate(cli, world: Path, test: Path, out: Path, cache: Path):
    return cli.invoke(["evaluate", "--splits", world / "splits", "--test-root", test, "--id-test", world / "val",
                       "--id-train", world / "train", "--model", "test_resnet", "--checkpoint",
                       world / "resnet.safetensors", "--detectors", "msp", "--na-threshold", "2", "--plot-metrics",
                       "auroc", "--device", "cpu", "--cache-dir", cache, "--out", out])


def _direct_msp(world: Path, files: list[Path]) -> np.ndarray:
    """MSP of the checkpointed model on these images, computed here with timm's own preprocessing."""
    import timm
    import timm.data
    import torch

    model = timm.create_model("test_resnet", pretrained=False, num_classes=2,
                              checkpoint_path=str(world / "resnet.safetensors")).eval()
    tf = timm.data.create_transform(**timm.data.resolve_data_config(model=model))
    with torch.no_grad():
        x = torch.stack([tf(Image.open(f).convert("RGB")) for f in files])
        return torch.softmax(model(x), 1).max(1).values.numpy()


def _grid_msp(out: Path) -> pd.Series:
    scores = manifests.read(out, kind="evaluation").frame("scores")
    return scores[scores["dataset"] == "splits"].set_index("path")["msp"]


def test_evaluate_rescores_an_image_overwritten_in_place(world, cli, tmp_path):
    test = tmp_path / "test"
    shutil.copytree(world / "test", test)
    r = _evaluate(cli, world, test, tmp_path / "ev1", tmp_path / "cache")
    assert r.exit_code == 0, r.output
    rel = f"{OOD[0]}/{OOD[0]}_c1s1_0.bmp"
    size = (test / rel).stat().st_size
    shutil.copyfile(world / "test" / f"{ID[0]}/{ID[0]}_c0s0_0.bmp", test / rel)  # another image, same size
    assert (test / rel).stat().st_size == size
    r = _evaluate(cli, world, test, tmp_path / "ev2", tmp_path / "cache")
    assert r.exit_code == 0, r.output
    got, first = _grid_msp(tmp_path / "ev2"), _grid_msp(tmp_path / "ev1")
    assert got[rel] == pytest.approx(_direct_msp(world, [test / rel])[0], abs=1e-5)
    assert got[rel] != pytest.approx(first[rel], abs=1e-4)
    others = [p for p in got.index if p != rel]
    np.testing.assert_allclose(got[others], first[others], atol=1e-6)


def test_truncated_output_cache_entry_is_a_miss_with_one_warning(world, cli, tmp_path):
    cache = tmp_path / "cache"
    r = _evaluate(cli, world, world / "test", tmp_path / "ev1", cache)
    assert r.exit_code == 0, r.output
    entries = sorted(cache.rglob("logits.safetensors"))
    assert entries
    victim = entries[0]
    data = victim.read_bytes()
    victim.write_bytes(data[: len(data) // 2])
    r = _evaluate(cli, world, world / "test", tmp_path / "ev2", cache)
    assert r.exit_code == 0 and r.exception is None, r.output
    assert "Traceback" not in r.output
    warned = [ln for ln in r.stderr.splitlines() if "warning:" in ln]
    assert len(warned) == 1 and str(victim) in " ".join(r.stderr.split()) and "recomputing" in warned[0]
    pd.testing.assert_series_equal(_grid_msp(tmp_path / "ev2"), _grid_msp(tmp_path / "ev1"), atol=1e-6)
    assert victim.read_bytes() == data  # recomputed and replaced whole
    assert not list(cache.rglob("*.tmp"))


# ---------------------------------------------------------------------------------------- weights by content
def _tiny_sdxl():
    from isood.dev.tiny_models import build_tiny_sdxl

    return build_tiny_sdxl


def test_new_weights_in_the_same_pipeline_folder_regenerate(tmp_path, isood_cache):
    import torch

    from generation.pipeline import GeneratorSettings
    from generation.sdxl import generate_images

    torch.set_num_threads(1)
    build = _tiny_sdxl()
    folder = tmp_path / "sdxl"
    build(seed=0).save_pretrained(folder)
    plan = pd.DataFrame({"path": ["images/a.png", "images/b.png"], "prompt": ["a red fox", "a teapot"],
                         "negative_prompt": ["", ""], "seed": [1, 2]})
    settings = GeneratorSettings(pipeline=f"local-dir:{folder}", size=64, steps=1, batch_size=2, device="cpu")
    out = tmp_path / "out"
    first = generate_images(plan, out, settings=settings, progress=False)
    assert (first.generated, first.skipped) == (2, 0)
    again = generate_images(plan, out, settings=settings, progress=False)
    assert (again.generated, again.skipped) == (0, 2)
    build(seed=1).save_pretrained(folder)  # new weights, same folder, same file names
    new = generate_images(plan, out, settings=settings, progress=False)
    assert (new.generated, new.skipped) == (2, 0)
    fresh = tmp_path / "fresh"  # the reference: the new weights in a folder of their own
    build(seed=1).save_pretrained(fresh)
    ref = generate_images(plan, tmp_path / "ref", settings=GeneratorSettings(
        pipeline=f"local-dir:{fresh}", size=64, steps=1, batch_size=2, device="cpu"), progress=False)
    assert new.sha256 == ref.sha256 != first.sha256


def test_weights_fingerprint_is_cached_and_follows_content(tmp_path, isood_cache, reads, monkeypatch):
    """The fingerprint of a weights folder (CLIP local-dir identity, SDXL pipeline) reads its files once; a touch
    re-reads one and keeps the fingerprint; a same-size rewrite changes it."""
    import isood.core.content
    from isood.features.clip import parse_clip_spec
    from isood.dev.tiny_models import build_tiny_clip

    monkeypatch.setattr(isood.core.content, "RACY_NS", 0)
    folder = build_tiny_clip(tmp_path / "clip")
    spec = f"local-dir:{folder}"
    ident = parse_clip_spec(spec).identity
    assert reads("weights") == {"weights": 2}  # config + weights
    assert parse_clip_spec(spec).identity == ident and reads("weights") == {"weights": 0}
    weights = folder / "open_clip_model.safetensors"
    os.utime(weights)
    assert parse_clip_spec(spec).identity == ident and reads("weights") == {"weights": 1}
    data = bytearray(weights.read_bytes())
    data[-1] ^= 1  # one bit of one weight: same size
    weights.write_bytes(bytes(data))
    assert parse_clip_spec(spec).identity != ident


# ---------------------------------------------------------------------------------------- float and 32-bit images
def _gray() -> np.ndarray:
    return _rgb(7)[..., 0].astype(np.float64)


def _stretch(v: np.ndarray) -> np.ndarray:
    return np.rint((v - v.min()) * 255.0 / (v.max() - v.min()))


MODES = [  # (row, values written, PIL mode, the 8-bit gray it must become)
    pytest.param(_gray() / 255.0, "F", _gray(), id="float_0_1-x255"),
    pytest.param(_gray() + 0.2, "F", _gray(), id="float_0_255-as_is"),
    pytest.param(_gray() * 3.0 - 200.0, "F", _stretch(_gray() * 3.0 - 200.0), id="float_other-stretched"),
    pytest.param(_gray() * 1000.0, "I", _stretch(_gray() * 1000.0), id="int32_above_16bit-stretched"),
    pytest.param(_gray() * 257.0, "I", _gray(), id="int32_16bit_values-scaled"),
]


@pytest.mark.parametrize("values, mode, expected", MODES)
def test_float_and_32bit_images_convert_by_their_range(values, mode, expected, cli, tiny_clip_spec, tmp_path):
    root = tmp_path / "images"
    (root / WNID).mkdir(parents=True)
    dtype = np.float32 if mode == "F" else np.int32
    Image.fromarray(values.astype(dtype), mode).save(root / WNID / "odd.tif")
    assert Image.open(root / WNID / "odd.tif").mode == mode
    gray = expected.astype(np.uint8)
    Image.fromarray(np.repeat(gray[..., None], 3, axis=2), "RGB").save(root / "ref.png")
    Image.fromarray(np.zeros_like(np.repeat(gray[..., None], 3, axis=2)), "RGB").save(root / "black.png")
    assert _counts(_extract(cli, tiny_clip_spec, root, tmp_path / "out")) == "shards written 1, reused 0"
    feats = _features(tmp_path / "out")
    np.testing.assert_allclose(feats[f"{WNID}/odd.tif"], feats["ref.png"], atol=1e-5)
    assert not np.allclose(feats[f"{WNID}/odd.tif"], feats["black.png"], atol=1e-3)


def test_16bit_pgm_keeps_its_16bit_scaling():
    """PIL opens a 16-bit PGM as mode I: its values are 16-bit samples (x 255/65535), as before."""
    import io

    from isood.features.decoding import to_rgb

    g = _gray().astype(np.uint16) * 257
    buf = io.BytesIO(b"P5\n28 24\n65535\n" + g.astype(">u2").tobytes())
    im = Image.open(buf)
    assert im.mode == "I"
    np.testing.assert_array_equal(np.asarray(to_rgb(im))[..., 0], _gray().astype(np.uint8))


def test_nan_float_image_is_a_rejected_row(cli, tiny_clip_spec, tmp_path):
    root = tmp_path / "images"
    (root / WNID).mkdir(parents=True)
    values = (_gray() / 255.0).astype(np.float32)
    values[3, 4] = np.nan
    Image.fromarray(values, "F").save(root / WNID / "nan.tif")
    _bmp(root / WNID / "ok.bmp", 1)
    r = _extract(cli, tiny_clip_spec, root, tmp_path / "out")
    assert _counts(r) == "shards written 1, reused 0"
    view = manifests.read(tmp_path / "out", kind="features")
    assert view.index["path"].tolist() == [f"{WNID}/ok.bmp"]
    (error,) = view.rejected.loc[view.rejected["path"] == f"{WNID}/nan.tif", "error"]
    assert error.startswith("ValueError") and "NaN" in error


# ---------------------------------------------------------------------------------------- alias folders
def test_alias_folder_lists_the_real_class_and_rejects_the_alias(cli, tiny_clip_spec, tmp_path):
    """`ln -s n01443537 root/n01440764`: the link sorts first; the real class must not vanish."""
    root = tmp_path / "images"
    for i in range(2):
        _bmp(root / OTHER / f"{OTHER}_{i}.bmp", i)
    _bmp(root / "n02084071" / "dog.bmp", 5)
    os.symlink(OTHER, root / WNID)
    out = tmp_path / "out"
    assert _counts(_extract(cli, tiny_clip_spec, root, out)) == "shards written 1, reused 0"
    view = manifests.read(out, kind="features")
    assert sorted(view.index["path"]) == [f"{OTHER}/{OTHER}_0.bmp", f"{OTHER}/{OTHER}_1.bmp", "n02084071/dog.bmp"]
    assert sorted(view.index["wnid"]) == [OTHER, OTHER, "n02084071"]
    errors = dict(zip(view.rejected["path"], view.rejected["error"]))
    assert sorted(errors) == [f"{WNID}/{OTHER}_0.bmp", f"{WNID}/{OTHER}_1.bmp"]
    assert all(e.startswith(f"AliasError: folder {WNID} is a symlink to folder {OTHER} inside the root")
               for e in errors.values())
    assert view.rejected["wnid"].tolist() == [WNID, WNID]  # the alias class is visible, not silently gone


def test_second_link_to_one_outside_folder_is_an_alias(cli, tiny_clip_spec, tmp_path):
    outside = tmp_path / "elsewhere" / "fish"
    _bmp(outside / "f.bmp", 3)
    root = tmp_path / "images"
    _bmp(root / "real" / "r.bmp", 4)
    os.symlink(outside, root / "a_link")
    os.symlink(outside, root / "b_link")
    r = _extract(cli, tiny_clip_spec, root, tmp_path / "out", "--follow-symlinks")
    assert _counts(r) == "shards written 1, reused 0"
    view = manifests.read(tmp_path / "out", kind="features")
    assert sorted(view.index["path"]) == ["a_link/f.bmp", "real/r.bmp"]
    (error,) = view.rejected["error"]
    assert view.rejected["path"].tolist() == ["b_link/f.bmp"]
    assert error.startswith("AliasError: folder b_link is a symlink to folder a_link")
    r = _extract(cli, tiny_clip_spec, root, tmp_path / "default")  # without --follow-symlinks: refused, as before
    errors = dict(zip(*manifests.read(tmp_path / "default", kind="features").rejected[["path", "error"]].T.values))
    assert errors["a_link/f.bmp"].startswith("OutsideRootError") and errors["b_link/f.bmp"].startswith("AliasError")


# ---------------------------------------------------------------------------------------- names that are not UTF-8
def test_non_utf8_names_are_rejected_rows(cli, tiny_clip_spec, tmp_path):
    root = tmp_path / "images"
    _bmp(root / WNID / "ok.bmp", 1)
    bad_file = os.fsencode(root / WNID) + b"/caf\xe9.bmp"
    bad_dir = os.fsencode(root) + b"/d\xe9j\xe0"
    os.mkdir(bad_dir)
    for p in (bad_file, bad_dir + b"/x.bmp"):
        with open(p, "wb") as f:
            Image.fromarray(_rgb(2)).save(f, format="BMP")
    out = tmp_path / "out"
    r = _extract(cli, tiny_clip_spec, root, out)
    assert "Traceback" not in r.output and _counts(r) == "shards written 1, reused 0"
    view = manifests.read(out, kind="features")
    assert view.index["path"].tolist() == [f"{WNID}/ok.bmp"]
    errors = dict(zip(view.rejected["path"], view.rejected["error"]))
    assert sorted(errors) == ["d\\xe9j\\xe0/x.bmp", f"{WNID}/caf\\xe9.bmp"]
    assert all(e.startswith("UnicodeError") and "not valid UTF-8" in e and "rename it" in e for e in errors.values())
    assert manifests.verify(out).ok
    assert _counts(_extract(cli, tiny_clip_spec, root, out)) == "shards written 0, reused 1"


# ------------------------------------------------------------------------------------ portability
def test_one_text_in_batches_of_different_shapes_agrees_within_tolerance(tiny_encoder):
    """The premise of the tolerance in tests/isood/features/test_clip.py: batch shapes change the float rounding (bit
    equality held on one machine, not on another), never more than ~1e-7."""
    from isood.features.clip import encode_texts

    texts = ["a photo of a tench.", "a sketch of a dog.", "a photo of a tench."]
    two_and_one = encode_texts(tiny_encoder, texts, batch_size=2)
    alone = encode_texts(tiny_encoder, texts[:1], batch_size=1)
    np.testing.assert_allclose(two_and_one[0], two_and_one[2], atol=1e-6)
    np.testing.assert_allclose(two_and_one[0], alone[0], atol=1e-6)
