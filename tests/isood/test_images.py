"""isood.images: listing (folder / file list), the path -> wnid column, decoding and the bad-image policy."""

from __future__ import annotations

import hashlib

import numpy as np
import pytest
import torch
from PIL import Image

from isood.errors import BadInputError, IsoodError
from isood.images import (IMAGE_EXTENSIONS, collate, decode_image, decode_images, image_rows, list_images,
                          listing_sha256)


def _to_tensor(im: Image.Image) -> torch.Tensor:
    return torch.from_numpy(np.asarray(im, dtype=np.float32)).permute(2, 0, 1)


@pytest.mark.parametrize("path, wnid", [
    ("n01440764/n01440764_10026.JPEG", "n01440764"),
    ("train/n01440764/img.JPEG", "n01440764"),
    ("n01440764_10026.JPEG", "n01440764"),
    ("places/abbey/00001.jpg", ""),   # a folder that is not a wnid names no ImageNet class
    ("x/n01440764", "n01440764"),     # a class entry
    ("c.png", ""),
])
def test_image_rows_wnid_column(path, wnid):
    rows = image_rows([path])
    assert rows.columns.tolist() == ["path", "wnid"] and rows.iloc[0].tolist() == [path, wnid]


def test_listing_hash_is_the_hash_of_path_size_lines():
    expected = hashlib.sha256(b"a.png\t3\nb/c.jpg\t-1").hexdigest()
    assert listing_sha256(["a.png", "b/c.jpg"], [3, -1]) == expected


def test_list_folder_sorted_recursive_skips_hidden_and_non_images(tiny_images, tiny_image_info):
    src = list_images(tiny_images)
    n = sum(tiny_image_info["classes"].values()) + 1  # + the corrupt .JPEG
    assert src.kind == "folder" and src.root == tiny_images and len(src.files) == len(src.table) == n
    assert src.table["path"].tolist() == sorted(src.table["path"])
    assert all(f == tiny_images / p for f, p in zip(src.files, src.table["path"]))
    assert src.sizes == [f.stat().st_size for f in src.files]
    assert src.listing_sha256 == listing_sha256(src.table["path"].tolist(), src.sizes)
    assert (src.table["wnid"] == src.table["path"].str.split("/").str[0]).all()
    assert not any(p.endswith(".txt") for p in src.table["path"])


def test_list_file_relative_absolute_comments_duplicates_and_missing(tmp_path):
    (tmp_path / "d").mkdir()
    (tmp_path / "d" / "n01440764_1.png").write_bytes(b"x")
    other = tmp_path / "elsewhere" / "n02084071" / "a.png"
    other.parent.mkdir(parents=True)
    other.write_bytes(b"yy")
    lst = tmp_path / "d" / "list.txt"
    lst.write_text(f"# comment\n\nn01440764_1.png\n{other}\nn01440764_1.png\ngone.JPEG\n")
    src = list_images(lst)
    assert src.kind == "list" and src.root == tmp_path / "d"
    assert src.table["path"].tolist() == sorted([other.as_posix(), "gone.JPEG", "n01440764_1.png"])
    assert dict(zip(src.table["path"], src.table["wnid"])) == {
        other.as_posix(): "n02084071", "gone.JPEG": "", "n01440764_1.png": "n01440764"}
    assert dict(zip(src.table["path"], src.sizes)) == {other.as_posix(): 2, "gone.JPEG": -1, "n01440764_1.png": 1}


def test_list_errors_are_one_line(tmp_path):
    with pytest.raises(BadInputError, match="does not exist") as e:
        list_images(tmp_path / "nope")
    assert "\n" not in str(e.value)
    (tmp_path / "empty").mkdir()
    with pytest.raises(IsoodError, match="holds no images"):
        list_images(tmp_path / "empty")
    assert ".jpg" in IMAGE_EXTENSIONS and ".txt" not in IMAGE_EXTENSIONS


def test_decode_reports_unreadable_images_by_name_never_raises(tmp_path):
    good = tmp_path / "good.png"
    Image.fromarray(np.full((4, 6, 3), 7, np.uint8)).save(good)
    bad = tmp_path / "bad.JPEG"
    bad.write_bytes(b"\xff\xd8\xff not a jpeg")
    t, err = decode_image(good, _to_tensor, "good.png")
    assert err == "" and t.shape == (3, 4, 6) and float(t.max()) == 7.0
    t, err = decode_image(bad, _to_tensor, "x/bad.JPEG")
    assert t is None and err.startswith(("UnidentifiedImageError", "OSError")) and "x/bad.JPEG" in err
    assert str(tmp_path) not in err
    t, err = decode_image(tmp_path / "gone.png", _to_tensor, "gone.png")
    assert t is None and err.startswith("FileNotFoundError") and str(tmp_path) not in err


def test_decompression_bomb_is_rejected_in_threads(tmp_path, monkeypatch):
    from concurrent.futures import ThreadPoolExecutor

    big = tmp_path / "big.png"
    Image.fromarray(np.zeros((40, 40, 3), np.uint8)).save(big)
    small = tmp_path / "small.png"
    Image.fromarray(np.zeros((8, 8, 3), np.uint8)).save(small)
    monkeypatch.setattr(Image, "MAX_IMAGE_PIXELS", 1000)  # 1600 px warns (a bomb), 64 px does not
    with ThreadPoolExecutor(2) as pool:
        items = decode_images([big, small, big], _to_tensor, ["big.png", "small.png", "big2.png"], pool)
    assert [err.split(":")[0] for _, err in items] == ["DecompressionBombWarning", "", "DecompressionBombWarning"]
    ok, batch, bad = collate(items)
    assert ok == [1] and batch.shape == (1, 3, 8, 8) and [j for j, _ in bad] == [0, 2]
    assert collate([(None, "E: x")]) == ([], None, [(0, "E: x")])
