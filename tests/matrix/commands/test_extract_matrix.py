"""The bad-input matrix, rows "images" and "options" of `isood extract`: each row drives the real CLI on tiny data made
here (the tiny open_clip of tests/conftest.py) and names the guard it checks (``module.function``).

Bad files inside a run are never fatal: exit 0, a ``manifest.json``, the file in the ``rejected`` table with the
exception type (and the readable images in the index). Non-RGB images are converted, not rejected: their features
equal those of an RGB image written out here by a formula (not by the code under test). User errors: exit 2,
one line on stderr naming the option or value, no traceback, no ``manifest.json`` in ``--out``.

| row                   | input                                            | guard                                     |
|-----------------------|--------------------------------------------------|-------------------------------------------|
| truncated_jpeg       | a JPEG cut in half                               | isood.features.decoding.decode_image (try/except)     |
| zero_bytes           | a 0-byte .png                                    | isood.features.decoding.decode_image                  |
| not_an_image         | text saved as .jpg in a class folder             | isood.features.decoding.decode_image                  |
| png_bomb             | 1-bit PNG, 17000 x 10000 px (1x-2x PIL's limit)  | isood.features.decoding.check_pixels (in _decode)     |
| jpeg_bomb_fast       | JPEG header 12000 x 12000, --decode fast         | isood.features.decoding.check_pixels (in _decode)     |
| outside_file_link    | symlink to a file outside the root               | isood.features.listing.outside_root (_refusals)      |
| outside_folder_link  | symlinked class folder outside the root          | isood.features.listing._folder_paths + outside_root  |
| broken_link          | a dangling symlink                               | isood.features.listing._folder_paths (links listed)  |
| converted modes      | L, LA, P, CMYK, RGBA, 16-bit PNG                 | isood.features.decoding.to_rgb (16-bit: scaled)       |
| names                | non-wnid folder, unicode + spaces                | isood.features.listing.image_rows ('' wnid)          |
| link policy          | inside link read, cycle once, --follow-symlinks  | _folder_paths (aliases), ExtractOptions    |
| file list            | missing, duplicates written 4 ways, ``..``       | isood.features.listing._list_paths                   |
| user errors          | empty folder/list, bad counts, ...               | list_images, check_sizes, check_shard_args |
"""

from __future__ import annotations

import os
import resource
import time
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

import manifests
from isood.features.featurestore import load_features

WNID = "n01440764"


def _rgb(seed: int, h: int = 36, w: int = 44) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, 256, (h, w, 3), dtype=np.uint8)


def _dataset(root: Path, n: int = 2) -> Path:
    """``n`` readable RGB PNGs in one wnid folder."""
    (root / WNID).mkdir(parents=True, exist_ok=True)
    for i in range(n):
        Image.fromarray(_rgb(i)).save(root / WNID / f"ok_{i}.png")
    return root


def _extract(cli, spec, images, out, *extra):
    return cli.invoke(["extract", "--images", images, "--clip", spec, "--out", out, "--device", "cpu",
                       "--workers", "0", *extra])


def _features(out: Path) -> dict[str, np.ndarray]:
    x, index = load_features(out)
    return {p: x[i] for i, p in enumerate(index["path"])}


# ------------------------------------------------------------------------------------ bad files: rejected rows
def _truncated(d: Path) -> str:
    Image.fromarray(_rgb(5, 64, 64)).save(d / "cut.jpg", quality=95)
    data = (d / "cut.jpg").read_bytes()
    (d / "cut.jpg").write_bytes(data[: len(data) // 2])
    return "cut.jpg"


def _zero(d: Path) -> str:
    (d / "empty.png").write_bytes(b"")
    return "empty.png"


def _text(d: Path) -> str:
    (d / "notes.jpg").write_text("this is not an image\n")
    return "notes.jpg"


def _png_bomb(d: Path, kit) -> str:
    (d / "bomb.png").write_bytes(kit.bilevel_png(17_000, 10_000))  # 170 M px: PIL only warns (limit 89.5 M)
    return "bomb.png"


def _jpeg_bomb(d: Path, kit) -> str:
    (d / "bomb.jpg").write_bytes(kit.jpeg_claiming(12_000, 12_000))  # 144 M px
    return "bomb.jpg"


BAD_FILES = [  # (row id, make the bad file in the class folder, expected error type, extra CLI args)
    pytest.param(lambda d, kit: _truncated(d), "OSError: image file is truncated", (), id="truncated_jpeg"),
    pytest.param(lambda d, kit: _zero(d), "UnidentifiedImageError", (), id="zero_bytes"),
    pytest.param(lambda d, kit: _text(d), "UnidentifiedImageError", (), id="not_an_image"),
    pytest.param(_png_bomb, "DecompressionBombError: 17000x10000", (), id="png_bomb"),
    pytest.param(_jpeg_bomb, "DecompressionBombError: 12000x12000", ("--decode", "fast"), id="jpeg_bomb_fast"),
]


@pytest.mark.parametrize("make, expected, extra", BAD_FILES)
def test_bad_file_is_a_rejected_row(make, expected, extra, cli, bad_images, tiny_clip_spec, tmp_path):
    root = _dataset(tmp_path / "images")
    bad = f"{WNID}/{make(root / WNID, bad_images)}"
    out = tmp_path / "out"
    r = _extract(cli, tiny_clip_spec, root, out, *extra)
    assert r.exit_code == 0, r.output
    view = manifests.read(out, kind="features")
    rejected = view.rejected
    assert rejected["path"].tolist() == [bad] and rejected["error"].iloc[0].startswith(expected.split(":")[0])
    assert expected in rejected["error"].iloc[0], rejected["error"].iloc[0]
    assert sorted(view.index["path"]) == [f"{WNID}/ok_0.png", f"{WNID}/ok_1.png"]


def test_bomb_is_refused_from_its_header_fast_and_without_pixels(tiny_encoder, bad_images, tmp_path):
    """The png_bomb row at the decoder: refused in well under a second and without the process's peak memory
    growing by the ~680 MB a decode (170 MB bilevel + 510 MB RGB) would take."""
    from isood.features.decoding import decode_images

    path = tmp_path / "bomb.png"
    path.write_bytes(bad_images.bilevel_png(17_000, 10_000))
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss  # KiB on Linux
    t0 = time.perf_counter()
    (tensor, error), = decode_images([path], tiny_encoder.preprocess, ["bomb.png"])
    seconds = time.perf_counter() - t0
    assert tensor is None and error.startswith("DecompressionBombError") and "170000000 pixels" in error
    assert seconds < 0.5, seconds
    assert resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - peak < 100 * 1024


# ------------------------------------------------------------------------------------ converted, not rejected
def _modes(root: Path) -> dict[str, tuple[str, str]]:
    """One image per mode in the class folder and, beside it, the RGB it must become (written from a formula):
    row -> (image path, reference path)."""
    d = root / WNID
    d.mkdir(parents=True)
    rows = {}

    def ref(name: str, rgb: np.ndarray) -> str:
        Image.fromarray(np.ascontiguousarray(rgb, dtype=np.uint8), "RGB").save(root / f"ref_{name}.png")
        return f"ref_{name}.png"

    gray = _rgb(1)[..., 0]
    Image.fromarray(gray, "L").save(d / "gray.png")
    rows["grayscale"] = (f"{WNID}/gray.png", ref("gray", np.repeat(gray[..., None], 3, axis=2)))
    alpha = _rgb(2)[..., 0]
    Image.fromarray(np.dstack([gray, alpha]), "LA").save(d / "gray_alpha.png")
    rows["gray_alpha"] = (f"{WNID}/gray_alpha.png", ref("la", np.repeat(gray[..., None], 3, axis=2)))
    rgba = np.dstack([_rgb(3), alpha])
    Image.fromarray(rgba, "RGBA").save(d / "rgba.png")
    rows["rgba"] = (f"{WNID}/rgba.png", ref("rgba", rgba[..., :3]))  # alpha dropped, colours kept
    pal = Image.fromarray(_rgb(4)).quantize(16)
    pal.save(d / "palette.png")
    table = np.array(pal.getpalette(), dtype=np.uint8).reshape(-1, 3)
    rows["palette"] = (f"{WNID}/palette.png", ref("p", table[np.asarray(pal)]))
    Image.fromarray(_rgb(5)).convert("CMYK").save(d / "cmyk.jpg", quality=95)
    cmyk = np.asarray(Image.open(d / "cmyk.jpg")).astype(np.float64)  # the decoded CMYK samples
    k = cmyk[..., 3:]
    rows["cmyk_jpeg"] = (f"{WNID}/cmyk.jpg", ref("cmyk", np.rint((255 - cmyk[..., :3]) * (255 - k) / 255)))
    g8 = _rgb(6)[..., 0].astype(np.int64)
    noise = np.random.default_rng(7).integers(-120, 121, g8.shape)  # 16-bit detail that rounds back to g8
    Image.fromarray(np.clip(g8 * 257 + noise, 0, 65535).astype(np.uint16)).save(d / "gray16.png")
    assert Image.open(d / "gray16.png").mode.startswith("I")
    rows["gray_16bit"] = (f"{WNID}/gray16.png", ref("g16", np.repeat(g8[..., None], 3, axis=2)))
    return rows


@pytest.fixture(scope="module")
def converted(tmp_path_factory, tiny_clip_spec, cli):
    root = tmp_path_factory.mktemp("modes")
    rows = _modes(root / "images")
    out = root / "out"
    r = _extract(cli, tiny_clip_spec, root / "images", out)
    assert r.exit_code == 0, r.output
    return rows, out


@pytest.mark.parametrize("row", ["grayscale", "gray_alpha", "rgba", "palette", "cmyk_jpeg", "gray_16bit"])
def test_non_rgb_image_is_converted_not_rejected(row, converted):
    rows, out = converted
    view = manifests.read(out, kind="features")
    assert len(view.rejected) == 0
    feats = _features(out)
    image, reference = rows[row]
    np.testing.assert_allclose(feats[image], feats[reference], atol=1e-5)
    assert not np.allclose(feats[image], feats[rows["rgba" if row != "rgba" else "grayscale"][0]], atol=1e-3)


# ------------------------------------------------------------------------------------ names, links, file lists
def test_non_wnid_and_unicode_names_round_trip(cli, tiny_clip_spec, tmp_path):
    root = tmp_path / "données photo"
    names = ["my photos/cat 1.png", "ünï cödé/ファイル 2.png", f"{WNID}/ok 3.png"]
    for i, name in enumerate(names):
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        Image.fromarray(_rgb(10 + i)).save(root / name)
    out = tmp_path / "sortie é"
    assert _extract(cli, tiny_clip_spec, root, out).exit_code == 0
    index = manifests.read(out, kind="features").index
    assert dict(zip(index["path"], index["wnid"])) == {names[0]: "", names[1]: "", names[2]: WNID}
    assert manifests.verify(out).ok
    listing = root / "liste été.txt"
    listing.write_text("\n".join(["# unicode list", *names]) + "\n", encoding="utf-8")
    r = _extract(cli, tiny_clip_spec, listing, tmp_path / "from list")
    assert r.exit_code == 0, r.output
    a, b = _features(out), _features(tmp_path / "from list")
    assert sorted(a) == sorted(b) and all(np.allclose(a[p], b[p], atol=1e-6) for p in names)
    again = _extract(cli, tiny_clip_spec, root, out)  # the manifest's paths lead back to the same files
    assert again.exit_code == 0 and "shards written 0, reused 1" in " ".join(again.stdout.split())


@pytest.fixture()
def linked(tmp_path):
    """A root with one real image, a link inside the root, a link to an outside file, a symlinked class folder
    outside, a dangling link and a link cycle; plus the outside images."""
    outside = tmp_path / "elsewhere"
    (outside / "n01443537").mkdir(parents=True)
    Image.fromarray(_rgb(20)).save(outside / "far.png")
    Image.fromarray(_rgb(21)).save(outside / "n01443537" / "fish.png")
    root = _dataset(tmp_path / "root", n=1)
    os.symlink(root / WNID / "ok_0.png", root / WNID / "alias.png")
    os.symlink(outside / "far.png", root / WNID / "far.png")
    os.symlink(outside / "n01443537", root / "n01443537")
    os.symlink(root / WNID / "gone.png", root / WNID / "dangling.png")  # inside the root, to nothing
    os.symlink(root, root / WNID / "loop")  # a cycle: root/n01440764/loop -> root
    return root, outside


def test_symlinks_leading_outside_the_root_are_rejected_naming_them(linked, cli, tiny_clip_spec, tmp_path):
    root, outside = linked
    out = tmp_path / "out"
    r = _extract(cli, tiny_clip_spec, root, out)
    assert r.exit_code == 0, r.output
    view = manifests.read(out, kind="features")
    errors = dict(zip(view.rejected["path"], view.rejected["error"]))
    loop = {p: e for p, e in errors.items() if p.startswith(f"{WNID}/loop/")}  # the cycle: an alias of the root
    assert sorted(loop) == [f"{WNID}/loop/{WNID}/{n}" for n in ("alias.png", "dangling.png", "far.png", "ok_0.png")]
    assert all(e.startswith(f"AliasError: folder {WNID}/loop is a symlink to the image root") for e in loop.values())
    errors = {p: e for p, e in errors.items() if p not in loop}
    assert sorted(errors) == [f"{WNID}/dangling.png", f"{WNID}/far.png", "n01443537/fish.png"]
    far = errors[f"{WNID}/far.png"]
    assert far.startswith("OutsideRootError") and str(outside / "far.png") in far
    assert str(outside / "n01443537" / "fish.png") in errors["n01443537/fish.png"]
    assert "--follow-symlinks" in far
    assert errors[f"{WNID}/dangling.png"].startswith("FileNotFoundError")
    # a link to a file inside the root is read; the cycle lists every file once under its real name
    assert sorted(view.index["path"]) == [f"{WNID}/alias.png", f"{WNID}/ok_0.png"]
    feats = _features(out)
    np.testing.assert_allclose(feats[f"{WNID}/alias.png"], feats[f"{WNID}/ok_0.png"], atol=1e-6)


def test_follow_symlinks_opts_in_and_is_recorded(linked, cli, tiny_clip_spec, tmp_path):
    root, outside = linked
    out = tmp_path / "out"
    Image.fromarray(_rgb(20)).save(root / WNID / "far_copy.png")
    r = _extract(cli, tiny_clip_spec, root, out, "--follow-symlinks")
    assert r.exit_code == 0, r.output
    view = manifests.read(out, kind="features")
    rejected = [p for p in view.rejected["path"] if not p.startswith(f"{WNID}/loop/")]  # the cycle's alias rows
    assert rejected == [f"{WNID}/dangling.png"]
    feats = _features(out)
    np.testing.assert_allclose(feats[f"{WNID}/far.png"], feats[f"{WNID}/far_copy.png"], atol=1e-6)
    assert view.meta["command"]["config"]["follow_symlinks"] is True
    # the default run after an opted-in one recomputes: the shard keys differ
    again = _extract(cli, tiny_clip_spec, root, out)
    assert again.exit_code == 0 and "shards written 1" in " ".join(again.stdout.split())
    assert f"{WNID}/far.png" in manifests.read(out, kind="features").rejected["path"].tolist()


def test_file_list_missing_duplicates_and_dotdot(cli, tiny_clip_spec, tmp_path):
    root = _dataset(tmp_path / "data", n=2)
    Image.fromarray(_rgb(30)).save(tmp_path / "beside.png")
    rel = f"{WNID}/ok_0.png"
    lines = [rel, f"./{rel}", str(root / rel), f"{WNID}/../{rel}", "missing/gone.png", "missing/gone.png",
             f"{WNID}/ok_1.png", "../beside.png"]
    (root / "list.txt").write_text("\n".join(lines) + "\n")
    out = tmp_path / "out"
    r = _extract(cli, tiny_clip_spec, root / "list.txt", out)
    assert r.exit_code == 0, r.output
    view = manifests.read(out, kind="features")
    # the root is the deepest folder holding the list and every entry (here tmp_path: ../beside.png leads out)
    assert view.image_root == str(tmp_path)
    assert view.rejected["path"].tolist() == ["data/missing/gone.png"]
    assert view.rejected["error"].iloc[0].startswith("FileNotFoundError")
    assert sorted(view.index["path"]) == sorted([f"data/{rel}", f"data/{WNID}/ok_1.png", "beside.png"])


# ------------------------------------------------------------------------------------ user errors: exit 2
def _empty_folder(tmp: Path) -> Path:
    (tmp / "empty" / WNID).mkdir(parents=True)
    (tmp / "empty" / WNID / "readme.txt").write_text("no images here")
    return tmp / "empty"


def _empty_list(tmp: Path) -> Path:
    (tmp / "list.txt").write_text("# nothing listed\n\n")
    return tmp / "list.txt"


def _latin1_list(tmp: Path) -> Path:
    (tmp / "list.txt").write_bytes("caf\xe9/une image.png\n".encode("latin-1"))
    return tmp / "list.txt"


USER_ERRORS = [  # (images source, extra args, substrings the one line must hold); guard in the id
    pytest.param(_empty_folder, (), ["holds no images", "empty"], id="empty_folder-list_images"),
    pytest.param(_empty_list, (), ["holds no images", "list.txt"], id="empty_list-list_images"),
    pytest.param(lambda t: t / "absent", (), ["does not exist", "absent"], id="missing_source-list_images"),
    pytest.param(_latin1_list, (), ["not UTF-8", "list.txt"], id="list_not_utf8-images._read_list"),
    pytest.param(None, ("--batch-size", "0"), ["--batch-size", "0"], id="batch_size_0-check_sizes"),
    pytest.param(None, ("--batch-size", "-4"), ["--batch-size", "-4"], id="batch_size_neg-check_sizes"),
    pytest.param(None, ("--shard-size", "0"), ["--shard-size", "0"], id="shard_size_0-check_sizes"),
    pytest.param(None, ("--workers", "-1"), ["--workers", "-1"], id="workers_neg-check_sizes"),
    pytest.param(None, ("--num-shards", "0"), ["--num-shards", "0"], id="num_shards_0-optspec.check"),
    pytest.param(None, ("--num-shards", "2", "--shard-index", "2"), ["--shard-index", "2"],
                 id="shard_index_out_of_range-check_shard_args"),
    pytest.param(None, ("--engine", "spark"), ["spark", "--engine"], id="unknown_engine-optspec.check"),
    pytest.param(None, ("--device", "tpu"), ["tpu"], id="unknown_device-resolve_device"),
]


@pytest.mark.parametrize("source, extra, names", USER_ERRORS)
def test_user_error_is_one_line_exit_2_and_nothing_complete(source, extra, names, cli, tiny_clip_spec, tmp_path):
    images = source(tmp_path) if source is not None else _dataset(tmp_path / "images")
    out = tmp_path / "out"
    line = cli.one_line_error(_extract(cli, tiny_clip_spec, images, out, *extra))
    assert all(n in line for n in names), line
    assert not (out / "manifest.json").exists() and not list(out.glob("features-*"))
