"""The bad-input matrix, rows "images" and "options" of `isood build-splits` (ID and test images extracted on the fly
with the tiny open_clip of tests/conftest.py; LAID trained on a labels file, few steps).

Bad files among the test images are never fatal: exit 0, a ``manifest.json``, each file in the ``dropped`` table
with its reason (``unreadable: <ExceptionType>: ...``), the others binned. A 16-bit image is converted: its
shifts equal those of its 8-bit twin. User errors: exit 2, one line naming the option or value, no traceback,
no ``manifest.json`` in ``--out``; the guard of each row is named in its id (``module.function``; ``check_sizes`` is
``isood.features.featurestore.check_sizes``, a second guard for the extraction's counts).
"""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

import manifests

FAST = ["--triplets", "150", "--laid-steps", "40", "--levels", "4", "--na-threshold", "2", "--workers", "0"]
ID_CLASSES = {"n01440764": 5, "n02123045": 5}
TEST_CLASSES = {"n01443537": 4, "n02084071": 4, "n04399382": 4}
LABELS = ["tench", "goldfish", "dog", "teddy bear", "cat", "car", "house", "tree"]


def _bad_test_images(root: Path, outside: Path) -> dict[str, str]:
    """Bad files added to the test images: path -> the start of its ``dropped`` reason."""
    d = root / "n01443537"
    Image.fromarray(np.full((40, 40, 3), 90, np.uint8)).save(d / "cut.jpg")
    data = (d / "cut.jpg").read_bytes()
    (d / "cut.jpg").write_bytes(data[: len(data) // 2])
    (d / "empty.png").write_bytes(b"")
    (d / "notes.jpg").write_text("not an image")
    Image.fromarray(np.full((30, 30, 3), 200, np.uint8)).save(outside / "far.png")
    os.symlink(outside / "far.png", d / "far.png")
    return {"n01443537/cut.jpg": "unreadable: OSError",
            "n01443537/empty.png": "unreadable: UnidentifiedImageError",
            "n01443537/notes.jpg": "unreadable: UnidentifiedImageError",
            "n01443537/far.png": "unreadable: OutsideRootError"}


def _twins(root: Path) -> None:
    """An 8-bit grayscale image and its 16-bit twin (same values x 257), in a folder that names no wnid."""
    gray = np.random.default_rng(3).integers(0, 256, (36, 36), dtype=np.uint8)
    (root / "misc photos").mkdir()
    Image.fromarray(gray, "L").save(root / "misc photos" / "twin 8.png")
    Image.fromarray(gray.astype(np.uint16) * 257).save(root / "misc photos" / "twin 16.png")


@pytest.fixture(scope="module")
def world(tmp_path_factory, tiny_clip_spec, image_dataset_factory):
    base = tmp_path_factory.mktemp("build_matrix")
    image_dataset_factory(base / "id", classes=ID_CLASSES, seed=7, corrupt=None)
    image_dataset_factory(base / "test", classes=TEST_CLASSES, seed=8, corrupt=None)
    (base / "outside").mkdir()
    bad = _bad_test_images(base / "test", base / "outside")
    _twins(base / "test")
    (base / "labels.txt").write_text("\n".join(LABELS) + "\n")
    args = ["build-splits", "--id", base / "id", "--test", base / "test", "--clip", tiny_clip_spec,
            "--labels", base / "labels.txt", "--cache-dir", base / "cache", *FAST]
    return {"base": base, "bad": bad, "args": args}


@pytest.fixture(scope="module")
def built(world, cli):
    out = world["base"] / "splits"
    r = cli.invoke([*world["args"], "--out", out])
    assert r.exit_code == 0, r.output
    return manifests.read(out, kind="splits")


@pytest.mark.parametrize("row", ["cut.jpg", "empty.png", "notes.jpg", "far.png"])
def test_bad_test_image_is_a_dropped_row(row, world, built):
    """Guards: isood.features.decoding.decode_image (truncated, 0 bytes, not an image), isood.features.listing.outside_root (link)."""
    path = f"n01443537/{row}"
    dropped = built.frame("dropped").set_index("path")
    assert dropped.loc[path, "set"] == "test" and dropped.loc[path, "reason"].startswith(world["bad"][path])
    assert path not in set(built.images["path"])
    assert len(built.images) == sum(TEST_CLASSES.values()) + 2  # the readable ones and the twins


def test_16bit_image_has_the_shifts_of_its_8bit_twin_and_no_wnid(built):
    """Guard: isood.features.decoding.to_rgb (16-bit values scaled, not clipped at 255)."""
    images = built.images.set_index("path")
    a, b = images.loc["misc photos/twin 8.png"], images.loc["misc photos/twin 16.png"]
    assert a["wnid"] == b["wnid"] == ""
    assert np.isclose(a["d_sem"], b["d_sem"], atol=1e-5) and np.isclose(a["d_cov"], b["d_cov"], atol=1e-5)


def _labels_with_unknown_wnid(base: Path) -> list:
    (base / "labels_bad.txt").write_text("tench\nn99999999\ncat\n")
    return ["--labels", base / "labels_bad.txt"]


def _labels_root_with_unknown_wnid(base: Path) -> list:
    for w in ("n01440764", "n02123045", "n99999999"):
        (base / "labels_root" / w).mkdir(parents=True, exist_ok=True)
    return ["--labels", base / "labels_root"]


def _empty_id(base: Path) -> list:
    (base / "empty_id" / "n01440764").mkdir(parents=True, exist_ok=True)
    return ["--id", base / "empty_id"]


def _empty_test_list(base: Path) -> list:
    (base / "empty.txt").write_text("# no test images\n")
    return ["--test", base / "empty.txt"]


USER_ERRORS = [  # (extra args or a function of the base folder returning them, substrings of the one line)
    pytest.param(["--levels", "0"], ["--levels", "0"], id="levels_0-optspec.check"),
    pytest.param(["--levels", "-3"], ["--levels", "-3"], id="levels_neg-config._check"),
    pytest.param(["--na-threshold", "-1"], ["--na-threshold", "-1"], id="na_threshold_neg-config._check"),
    pytest.param(["--triplets", "0"], ["--triplets", "0"], id="triplets_0-config._check"),
    pytest.param(["--batch-size", "0"], ["--batch-size", "0"], id="batch_size_0-config._check+check_sizes"),
    pytest.param(["--shard-size", "-2"], ["--shard-size", "-2"], id="shard_size_neg-config._check+check_sizes"),
    pytest.param(["--workers", "-1"], ["--workers", "-1"], id="workers_neg-config._AT_LEAST+check_sizes"),
    pytest.param(["--laid-steps", "0"], ["--laid-steps", "0"], id="laid_steps_0-config._AT_LEAST"),
    pytest.param(["--seed", "-1"], ["--seed", "-1"], id="seed_neg-optspec.seed_option"),
    pytest.param(["--backend", "annoy"], ["--backend", "annoy"], id="unknown_backend-config._check"),
    pytest.param(["--ann-recall", "1.5"], ["--ann-recall", "1.5"], id="ann_recall_above_1-optspec.check"),
    pytest.param(["--clip-quantile", "0.9,0.1"], ["--clip-quantile"], id="quantiles_reversed-config.parse_quantile"),
    pytest.param(_labels_with_unknown_wnid, ["n99999999", "labels_bad.txt"],
                 id="labels_unknown_wnid-labels_from_lines"),
    pytest.param(_labels_root_with_unknown_wnid, ["n99999999", "labels_root"],
                 id="labels_root_unknown_wnid-load_labels"),
    pytest.param(lambda b: ["--labels", b / "absent.txt"], ["--labels", "absent.txt"], id="labels_missing-load_labels"),
    pytest.param(_empty_id, ["holds no images", "empty_id"], id="id_empty_folder-list_images"),
    pytest.param(_empty_test_list, ["holds no images", "empty.txt"], id="test_empty_list-list_images"),
    pytest.param(lambda b: ["--id", b / "absent"], ["--id", "absent", "does not exist"], id="id_missing-splits.load"),
]


@pytest.mark.parametrize("extra, names", USER_ERRORS)
def test_user_error_is_one_line_exit_2_and_nothing_complete(extra, names, world, cli, tmp_path):
    extra = extra(world["base"]) if callable(extra) else extra
    out = tmp_path / "out"
    line = cli.one_line_error(cli.invoke([*world["args"], *extra, "--out", out]))
    assert all(str(n) in line for n in names), line
    assert not (out / "manifest.json").exists()
