"""The bad-input matrix, rows "images" and "options" of `isood evaluate` (a tiny timm ResNet with random weights saved
as a local checkpoint, image folders and a splits manifest written by the splits stage's writer, all made here).

An evaluation scores every image it is given, so an unreadable one is a user error here (not a rejected row): exit
2, one line naming the file, no traceback, no ``manifest.json`` — also when the image is decoded in a DataLoader
worker process (``--workers 1``). A 16-bit image is converted: it scores as its 8-bit twin. Bad options and
detector parameters are refused before anything is read. The guard of each row is named in its id.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

import manifests

ID = ["n01440764", "n01443537", "n01484850"]
OOD = ["n02084071", "n04399382"]


@pytest.fixture(scope="module")
def world(tmp_path_factory, tiny_eval):
    from isood.dev.tiny_models import build_tiny_classifier

    _image = tiny_eval.image
    root = tmp_path_factory.mktemp("evaluate_matrix")
    rng = np.random.default_rng(0)
    colour = {w: rng.integers(30, 225, 3) for w in ID + OOD}
    for w in ID:
        for i in range(4):
            _image(root / "train" / w / f"{w}_{i}.png", colour[w], rng)
        for i in range(2):
            _image(root / "val" / w / f"{w}_{i}.png", colour[w], rng)
    tiny_eval.grid_splits(root / "splits", root / "test", rng, colour, id_wnids=ID, ood_wnids=OOD, per_cell=4,
                          cov_shift=50.0)
    build_tiny_classifier(root / "test_resnet.safetensors", num_classes=3)
    return root


def _args(world: Path, out: Path, *extra, id_test: Path | None = None, id_train: Path | None = None) -> list:
    return ["evaluate", "--splits", world / "splits", "--id-test", id_test or world / "val", "--id-train",
            id_train or world / "train", "--model", "test_resnet", "--checkpoint", world / "test_resnet.safetensors",
            "--na-threshold", "2", "--cache-dir", out.parent / "cache", "--plot-metrics", "auroc", "--detectors",
            "msp", "--out", out, *extra]


def test_the_base_arguments_work(world, cli, tmp_path):
    """Every row below differs from this run by its one bad value or file."""
    r = cli.invoke(_args(world, tmp_path / "ev"))
    assert r.exit_code == 0, r.output
    assert manifests.verify(tmp_path / "ev").ok


OPTION_ROWS = [  # (extra args, substrings of the one line)
    pytest.param(["--batch-size", "0"], ["--batch-size", "0"], id="batch_size_0-options.check_options"),
    pytest.param(["--batch-size", "-8"], ["--batch-size", "-8"], id="batch_size_neg-options.check_options"),
    pytest.param(["--workers", "-1"], ["--workers", "-1"], id="workers_neg-options.check_options"),
    pytest.param(["--na-threshold", "0"], ["--na-threshold", "0"], id="na_threshold_0-options.check_options"),
    pytest.param(["--num-classes", "0"], ["--num-classes", "0"], id="num_classes_0-options.check_options"),
    pytest.param(["--seed", "-1"], ["--seed", "-1"], id="seed_neg-options.check_options"),
    pytest.param(["--leak-rules", "nope"], ["--leak-rules", "'nope'"], id="leak_rules_unknown-options.check_options"),
    pytest.param(["--plot-metrics", "auroc,nope"], ["--plot-metrics", "nope"],
                 id="plot_metrics_unknown-options.check_options"),
    pytest.param(["--detectors", "nope"], ["'nope'", "msp"], id="unknown_detector-registry.get_detector"),
    pytest.param(["--detectors", "msp,nope"], ["'nope'"], id="unknown_detector_in_list-registry.get_detector"),
    pytest.param(["--detectors", "knn:k=0"], ["knn", "k", "0"], id="knn_k_0-detectors.knn"),
    pytest.param(["--detectors", "knn:k=abc"], ["knn", "k", "abc"], id="knn_k_abc-detectors.base"),
    pytest.param(["--detectors", "react:percentile=150"], ["react", "percentile", "150"],
                 id="react_percentile_150-detectors.react"),
    pytest.param(["--detectors", "msp:foo=1"], ["msp", "'foo'"], id="unknown_key-registry.get_detector(known+bind)"),
    pytest.param(["--detectors", "knn:k"], ["'k'", "name:key=value"], id="malformed_param-registry._tokens"),
    pytest.param(["--detectors", ""], ["--detectors", "empty"], id="no_detector-registry._tokens"),
    pytest.param(["--detectors", "msp,msp"], ["'msp'", "twice"], id="detector_twice-registry.parse_detectors"),
    pytest.param(["--detectors", "ash:variant=q"], ["ash", "variant", "'q'"], id="ash_variant_q-detectors.ash"),
]


@pytest.mark.parametrize("extra, names", OPTION_ROWS)
def test_bad_option_is_one_line_exit_2_and_nothing_written(extra, names, world, cli, tmp_path):
    """Refused before anything is read or scored: no model output reached the cache."""
    out = tmp_path / "ev"
    line = cli.one_line_error(cli.invoke(_args(world, out, *extra)))
    assert all(n in line for n in names), line
    assert not (out / "manifest.json").exists() and not (tmp_path / "cache").exists()


# ------------------------------------------------------------------------------------------------ image folders
def _copy(world: Path, tmp: Path, name: str) -> Path:
    return Path(shutil.copytree(world / name, tmp / name))


def _truncate(folder: Path) -> Path:
    p = folder / ID[0] / f"{ID[0]}_0.png"
    p.write_bytes(p.read_bytes()[:60])
    return p


def _zero(folder: Path) -> Path:
    (folder / ID[1] / "empty.png").write_bytes(b"")
    return folder / ID[1] / "empty.png"


def _bomb(folder: Path, kit) -> Path:
    (folder / ID[2] / "bomb.png").write_bytes(kit.bilevel_png(17_000, 10_000))  # 170 M px: PIL only warns
    return folder / ID[2] / "bomb.png"


IMAGE_ROWS = [  # (which set, make the bad file -> its path, extra args, substrings besides the path)
    pytest.param("val", lambda d, kit: _truncate(d), (), ["cannot read image", "OSError"],
                 id="truncated_id_test-capture.ImageList"),
    pytest.param("val", lambda d, kit: _truncate(d), ("--workers", "1"), ["cannot read image", "OSError"],
                 id="truncated_id_test_in_worker-capture.worker_message"),
    pytest.param("train", lambda d, kit: _zero(d), (), ["cannot read image", "UnidentifiedImageError"],
                 id="zero_bytes_id_train-capture.ImageList"),
    pytest.param("val", _bomb, (), ["cannot read image", "DecompressionBombError"],
                 id="bomb_id_test-images.read_rgb.check_pixels"),
]


@pytest.mark.parametrize("which, make, extra, names", IMAGE_ROWS)
def test_unreadable_image_is_one_line_naming_it(which, make, extra, names, world, cli, bad_images, tmp_path):
    folder = _copy(world, tmp_path, which)
    bad = make(folder, bad_images)
    out = tmp_path / "ev"
    line = cli.one_line_error(cli.invoke(_args(world, out, *extra, **{f"id_{which.replace('val', 'test')}": folder})))
    assert str(bad) in line and all(n in line for n in names), line
    assert not (out / "manifest.json").exists()


def _empty_folder(world: Path, tmp: Path) -> dict:
    (tmp / "empty" / ID[0]).mkdir(parents=True)
    return {"id_train": tmp / "empty"}


def _empty_list(world: Path, tmp: Path) -> dict:
    (tmp / "val.txt").write_text("# no images\n")
    return {"id_test": tmp / "val.txt"}


def _no_wnid(world: Path, tmp: Path) -> dict:
    folder = _copy(world, tmp, "val")
    (folder / "my fish").mkdir()
    for i, p in enumerate(sorted((folder / ID[2]).iterdir())):  # ImageNet file names carry the wnid too
        shutil.move(p, folder / "my fish" / f"fish {i}.png")
    (folder / ID[2]).rmdir()
    return {"id_test": folder}


FOLDER_ROWS = [  # (make the --id-* override, substrings of the one line)
    pytest.param(_empty_folder, ["holds no images", "empty"], id="empty_id_train-images.list_images"),
    pytest.param(_empty_list, ["holds no images", "val.txt"], id="empty_id_test_list-images.list_images"),
    pytest.param(_no_wnid, ["--id-test", "no wnid", "2 image(s)"], id="non_wnid_folder-classes.labels_for"),
]


@pytest.mark.parametrize("make, names", FOLDER_ROWS)
def test_unusable_image_folder_is_one_line(make, names, world, cli, tmp_path):
    out = tmp_path / "ev"
    line = cli.one_line_error(cli.invoke(_args(world, out, **make(world, tmp_path))))
    assert all(n in line for n in names), line
    assert not (out / "manifest.json").exists()


def test_16bit_image_scores_as_its_8bit_twin(world, cli, tmp_path):
    """Guard: isood.features.decoding.to_rgb through capture.ImageList (PIL's own conversion clips 16-bit values at 255)."""
    folder = _copy(world, tmp_path, "val")
    gray = np.asarray(Image.open(folder / ID[0] / f"{ID[0]}_0.png").convert("L"))
    Image.fromarray(gray, "L").save(folder / ID[0] / "twin8.png")
    Image.fromarray(gray.astype(np.uint16) * 257).save(folder / ID[0] / "twin16.png")
    out = tmp_path / "ev"
    r = cli.invoke(_args(world, out, id_test=folder))
    assert r.exit_code == 0, r.output
    scores = manifests.read(out, kind="evaluation").frame("scores").query("dataset == 'id_test'").set_index("path")
    a, b = scores.loc[f"{ID[0]}/twin8.png", "msp"], scores.loc[f"{ID[0]}/twin16.png", "msp"]
    assert a == pytest.approx(b, abs=1e-6)
    assert scores["msp"].nunique() > 2  # the scores do depend on the image
