"""isood.features.listing, decoding and batch_decode: listing (folder / file list), the path -> wnid column, decoding and the bad-image policy."""

from __future__ import annotations

import hashlib

import numpy as np
import pytest
import torch
from PIL import Image

from isood.core.errors import BadInputError, IsoodError
from isood.features.listing import IMAGE_EXTENSIONS, image_rows, list_images, listing_sha256
from isood.features.decoding import collate, decode_image, decode_images


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
    # one explicit root for every entry: the deepest folder holding the list and what it names
    assert src.kind == "list" and src.root == tmp_path
    mine, theirs = "d/n01440764_1.png", "elsewhere/n02084071/a.png"
    assert src.table["path"].tolist() == sorted([theirs, "d/gone.JPEG", mine])
    assert dict(zip(src.table["path"], src.table["wnid"])) == {theirs: "n02084071", "d/gone.JPEG": "",
                                                               mine: "n01440764"}
    assert dict(zip(src.table["path"], src.sizes)) == {theirs: 2, "d/gone.JPEG": -1, mine: 1}
    assert list_images(tmp_path / "d" / "only.txt" if (tmp_path / "d" / "only.txt").write_text(
        "n01440764_1.png\n") else None).root == tmp_path / "d"  # a list naming only its own folder keeps it


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
    monkeypatch.setattr(Image, "MAX_IMAGE_PIXELS", 1000)  # 1600 px: PIL warns, isood refuses; 64 px: fine
    with ThreadPoolExecutor(2) as pool:
        items = decode_images([big, small, big], _to_tensor, ["big.png", "small.png", "big2.png"], pool)
    assert [err.split(":")[0] for _, err in items] == ["DecompressionBombError", "", "DecompressionBombError"]
    ok, batch, bad = collate(items)
    assert ok == [1] and batch.shape == (1, 3, 8, 8) and [j for j, _ in bad] == [0, 2]
    assert collate([(None, "E: x")]) == ([], None, [(0, "E: x")])


# ----------------------------------------------------------------------------------------------- fast decoding
def _scene(w: int, h: int, seed: int = 0) -> Image.Image:
    """A made-up photo: smooth colour field + noise (JPEG-like content, not flat)."""
    rng = np.random.default_rng(seed)
    small = Image.fromarray(rng.integers(0, 256, size=(6, 8, 3), dtype=np.uint8)).resize((w, h), Image.BICUBIC)
    a = np.asarray(small, dtype=np.float32) + rng.normal(0, 10, size=(h, w, 3))
    return Image.fromarray(np.clip(a, 0, 255).astype(np.uint8))


def _pil_draft_size(w: int, h: int, d: int) -> tuple[int, int]:
    """PIL's documented draft: the largest of 1/8, 1/4, 1/2 keeping both sides >= d, sizes rounded up."""
    s = next(s for s in (8, 4, 2, 1) if min(w // d, h // d) >= s)
    return -(-w // s), -(-h // s)


def _clip_transform(size, mode="shortest"):
    import open_clip

    return open_clip.image_transform(size, is_train=False, resize_mode=mode, interpolation="bicubic")


LEVEL = 1 / (255 * 0.26130258)  # one grey level after open_clip's normalisation (the smallest std)


@pytest.mark.parametrize("size, mode", [(32, "shortest"), ((24, 40), "shortest"), (32, "longest"),
                                        (32, "squash")])
def test_tensor_steps_equal_open_clip_transform_up_to_rounding(size, mode):
    from isood.features.image_tensors import pil_to_uint8, tensor_preprocess

    pp = _clip_transform(size, mode)
    steps = tensor_preprocess(pp)
    assert steps is not None
    for w, h in [(97, 61), (50, 80), (33, 33)]:
        im = _scene(w, h)
        ref, fast = pp(im), steps(pil_to_uint8(im))
        assert fast.shape == ref.shape and fast.dtype == ref.dtype
        diff = (fast - ref).abs()
        # the same antialiased bicubic filter on the same grid, each rounded to uint8: pixels a grey level or
        # two apart at most (a grid shifted by half a pixel is many levels off on this textured scene)
        assert float(diff.max()) <= 2 * LEVEL + 1e-6 and float(diff.mean()) <= 0.5 * LEVEL


@pytest.mark.parametrize("mode", ["reference", "fast"])
def test_decoders_hand_over_uint8_crops_and_finish_with_the_transforms_own_arithmetic(mode, tmp_path):
    """open_clip's and timm's transforms split at ToTensor: the decoding side makes uint8 crops (a quarter of the
    bytes to hand over between processes), the tail (/ 255, Normalize) runs on the batch; the reference decoder's
    inputs are the transform's, to the bit."""
    import timm

    from isood.features.decoding import decode_image
    from isood.features.batch_decode import image_decoder

    model = timm.create_model("test_resnet", pretrained=False)
    transforms = [_clip_transform(32), _clip_transform(224), _clip_transform(32, "longest"),
                  timm.data.create_transform(**timm.data.resolve_data_config(model=model))]
    files = []
    for i, (w, h) in enumerate([(500, 375), (90, 120), (33, 70)]):
        files.append(tmp_path / f"{i}.jpg")
        _scene(w, h, seed=i).save(files[-1], quality=90)
    for pp in transforms:
        dec = image_decoder(pp, mode)
        assert dec.tail is not None
        crops = [decode_image(f, dec.preprocess, draft=dec.draft, jpeg_tensor=dec.jpeg_tensor)[0] for f in files]
        assert all(c.dtype == torch.uint8 for c in crops)
        for f, (t, err), crop in zip(files, dec.decode([str(f) for f in files]), crops):
            assert err == "" and torch.equal(t, dec.tail(crop.unsqueeze(0))[0])
            if mode == "reference":
                assert torch.equal(t, pp(Image.open(f).convert("RGB")))


def test_resized_size_is_torchvision_resize_of_a_pil_image():
    from torchvision import transforms as T

    from isood.features.image_tensors import resized_size

    for size, max_size in [(32, None), (224, None), ((30, 50), None), (40, 60)]:
        for w, h in [(500, 375), (375, 500), (333, 500), (64, 64), (1000, 70)]:
            out = T.Resize(size, max_size=max_size)(Image.new("RGB", (w, h)))
            assert resized_size((w, h), size, max_size) == (out.size[1], out.size[0])


def test_draft_size_and_unknown_steps_fall_back_to_the_reference():
    from torchvision import transforms as T

    from isood.features.image_tensors import DRAFT_MARGIN, draft_size, tensor_preprocess
    from isood.features.decoding import FAST_DECODE, REFERENCE_DECODE
    from isood.features.batch_decode import image_decoder

    pp = _clip_transform(224)
    assert draft_size(pp) == (int(np.ceil(224 * DRAFT_MARGIN)),) * 2
    assert draft_size(_clip_transform((224, 320))) == (int(np.ceil(320 * DRAFT_MARGIN)),) * 2  # the larger side
    odd = T.Compose([T.Resize(32), T.Lambda(lambda x: x), T.ToTensor()])
    assert tensor_preprocess(odd) is None
    dec = image_decoder(odd, FAST_DECODE)
    assert dec.preprocess is odd and dec.draft is None and not dec.jpeg_tensor and dec.mode == FAST_DECODE
    ref = image_decoder(pp, REFERENCE_DECODE)
    assert ref.preprocess.steps == tuple(pp.transforms[:3]) and ref.draft is None and not ref.jpeg_tensor
    assert image_decoder(odd, REFERENCE_DECODE).preprocess is odd and image_decoder(odd, REFERENCE_DECODE).tail is None
    with pytest.raises(BadInputError, match="turbo"):
        image_decoder(pp, "turbo")


@pytest.fixture
def decode_spy(monkeypatch):
    """Records what the fast path decoded: ('pil', (w, h)) for a PIL image, ('jpeg-tensor', (w, h)) for
    torchvision's JPEG decoder."""
    import isood.features.image_tensors as IT
    import isood.features.decoding as I

    seen = []
    to_uint8, decode_jpeg = IT.pil_to_uint8, I.decode_jpeg_bytes

    def spy_pil(im):
        seen.append(("pil", im.size))
        return to_uint8(im)

    def spy_jpeg(data):
        x = decode_jpeg(data)
        seen.append(("jpeg-tensor", (int(x.shape[-1]), int(x.shape[-2]))))
        return x

    monkeypatch.setattr(IT, "pil_to_uint8", spy_pil)
    monkeypatch.setattr(I, "decode_jpeg_bytes", spy_jpeg)
    return seen


def test_fast_decode_drafts_large_jpegs_tensor_decodes_small_ones_and_pil_decodes_png(tmp_path, decode_spy):
    from isood.features.decoding import FAST_DECODE
    from isood.features.batch_decode import image_decoder

    pp = _clip_transform(32)
    dec = image_decoder(pp, FAST_DECODE)
    big, small, gray, png = (tmp_path / n for n in ("big.jpg", "small.jpg", "gray.jpg", "big.png"))
    _scene(400, 300).save(big, quality=90)
    _scene(80, 60).save(small, quality=90)   # < 2 x 64 px: not drafted
    _scene(400, 300).convert("L").save(gray, quality=90)
    _scene(400, 300).save(png)
    items = dec.decode([str(big), str(small), str(gray), str(png)])
    assert all(err == "" for _, err in items)
    d = dec.draft[0]
    assert decode_spy == [("pil", _pil_draft_size(400, 300, d)), ("jpeg-tensor", (80, 60)),
                          ("pil", _pil_draft_size(400, 300, d)), ("pil", (400, 300))]
    assert _pil_draft_size(400, 300, d)[0] * _pil_draft_size(400, 300, d)[1] <= 400 * 300 / 16  # really fewer
    for (t, _), f in zip(items, [big, small, gray, png]):
        ref = pp(Image.open(f).convert("RGB"))
        assert t.shape == ref.shape == (3, 32, 32)


def test_drafted_pixels_are_mapped_onto_the_full_images_geometry(tmp_path):
    """500x333 at 32 px: the drafted image's rounded size gives another resize width (47 vs 48 px), which
    shifts the centre crop; the fast path resizes by the full image's geometry, the naive draft does not."""
    from isood.features.image_tensors import draft_size
    from isood.features.decoding import FAST_DECODE, decode_image
    from isood.features.batch_decode import image_decoder

    pp = _clip_transform(32)
    dec = image_decoder(pp, FAST_DECODE)
    f = tmp_path / "a.jpg"
    _scene(500, 333, seed=3).save(f, quality=95)
    ref = pp(Image.open(f).convert("RGB"))
    fast = dec.tail(decode_image(f, dec.preprocess, draft=dec.draft, jpeg_tensor=True)[0].unsqueeze(0))[0]
    naive, _ = decode_image(f, pp, draft=draft_size(pp))
    fast_err, naive_err = float((fast - ref).abs().mean()), float((naive - ref).abs().mean())
    assert fast_err < naive_err / 2


def test_bad_images_are_rejected_not_fatal_in_both_modes(tmp_path):
    from isood.features.decoding import FAST_DECODE, REFERENCE_DECODE
    from isood.features.batch_decode import image_decoder

    big, small = tmp_path / "big.jpg", tmp_path / "small.jpg"
    _scene(400, 300).save(big, quality=90)   # drafted by the fast path
    _scene(80, 60).save(small, quality=90)   # decoded by torchvision in the fast path
    for f in (big, small):
        data = f.read_bytes()
        (tmp_path / f"cut-{f.name}").write_bytes(data[: len(data) // 2])
        (tmp_path / f"head-{f.name}").write_bytes(data[:400])
    (tmp_path / "garbage.JPEG").write_bytes(b"\xff\xd8\xff not a jpeg")
    names = ["cut-big.jpg", "head-big.jpg", "cut-small.jpg", "head-small.jpg", "garbage.JPEG", "gone.jpg",
             "big.jpg", "small.jpg"]
    kinds = {}
    for mode in (REFERENCE_DECODE, FAST_DECODE):
        items = image_decoder(_clip_transform(32), mode).decode([str(tmp_path / n) for n in names], names)
        assert [t is None for t, _ in items] == [True] * 6 + [False] * 2
        assert all(err and str(tmp_path) not in err for _, err in items[:6])  # one line; never the absolute path
        kinds[mode] = [err.split(":")[0] for _, err in items]
    assert kinds[FAST_DECODE] == kinds[REFERENCE_DECODE]  # PIL judges and words what torchvision cannot decode


def test_jpeg_header_reads_what_pil_reads(tmp_path):
    from isood.features.image_tensors import jpeg_header, tensor_decodes

    exif = Image.Exif()
    exif[0x010E] = "x" * 3000  # a long APP1 segment before the frame header
    cases = {"rgb.jpg": (_scene(123, 45), {"quality": 90, "exif": exif}),
             "gray.jpg": (_scene(64, 80).convert("L"), {}),
             "progressive.jpg": (_scene(90, 70), {"progressive": True}),
             "cmyk.jpg": (_scene(50, 40).convert("CMYK"), {})}
    for name, (im, kw) in cases.items():
        im.save(tmp_path / name, **kw)
        head = jpeg_header((tmp_path / name).read_bytes())
        with Image.open(tmp_path / name) as ref:
            assert (head.width, head.height) == ref.size and head.components == len(ref.getbands())
        assert head.precision == 8 and head.marker == (0xC2 if name.startswith("progressive") else 0xC0)
        assert tensor_decodes(head, (64, 64)) == (name != "cmyk.jpg")  # CMYK: PIL converts it, as the reference
    _scene(20, 20).save(tmp_path / "a.png")
    assert jpeg_header((tmp_path / "a.png").read_bytes()) is None and not tensor_decodes(None, None)
    assert jpeg_header(b"\xff\xd8\xff\xe0\x00") is None  # cut inside a segment


def test_tensor_decodes_leaves_large_and_bomb_sized_jpegs_to_pil(monkeypatch):
    from isood.features.image_tensors import JpegHeader, tensor_decodes

    head = JpegHeader(width=400, height=300, components=3, precision=8, marker=0xC0)
    assert tensor_decodes(head, None) and tensor_decodes(head, (160, 160))  # 300 < 2 x 160: not drafted
    assert not tensor_decodes(head, (150, 150))  # both sides >= 2 x 150: PIL drafts it
    assert not tensor_decodes(head._replace(precision=12), None) and not tensor_decodes(head._replace(marker=0xC9), None)
    monkeypatch.setattr(Image, "MAX_IMAGE_PIXELS", 400 * 300 - 1)
    assert not tensor_decodes(head, None)  # PIL judges decompression bombs


# ----------------------------------------------------------------------------------------------- gpu decoding
def _gpu_files(tmp_path) -> list:
    """JPEGs of several sizes (baseline, progressive, grayscale), a CMYK JPEG, a PNG, a JPEG cut short, a complete
    JPEG whose scan data is corrupt, garbage named .JPEG, a missing file: what `--decode gpu` meets."""
    files = []
    for i, (w, h) in enumerate([(500, 375), (375, 500), (500, 375), (120, 90), (64, 48)]):
        files.append(tmp_path / f"rgb{i}.jpg")
        _scene(w, h, seed=i).save(files[-1], quality=80 + 3 * i)
    extra = {"progressive.jpg": (_scene(300, 200, 7), {"progressive": True, "quality": 90}),
             "gray.jpg": (_scene(200, 150, 8).convert("L"), {"quality": 90}),
             "cmyk.jpg": (_scene(200, 150, 9).convert("CMYK"), {"quality": 90}),
             "p.png": (_scene(210, 160, 10), {})}
    for name, (im, kw) in extra.items():
        files.append(tmp_path / name)
        im.save(files[-1], **kw)
    files.append(tmp_path / "cut.jpg")
    files[-1].write_bytes(files[0].read_bytes()[:4000])
    data = files[3].read_bytes()  # complete, its header fine, a second frame header inside its scan data
    sos = data.index(b"\xff\xda")
    files.append(tmp_path / "twosof.jpg")
    files[-1].write_bytes(data[:sos + 40] + b"\xff\xc0\x00\x11" + data[sos + 44:])
    files.append(tmp_path / "garbage.JPEG")
    files[-1].write_bytes(b"\xff\xd8\xff not a jpeg")
    files.append(tmp_path / "gone.jpg")
    return files


@pytest.fixture
def jpeg_calls(monkeypatch):
    """Records each torchvision ``decode_jpeg`` call: the number of images it was given (0 for one tensor)."""
    import torchvision.io as tio

    calls, original = [], tio.decode_jpeg

    def spy(input, *args, **kwargs):
        calls.append(len(input) if isinstance(input, list) else 0)
        return original(input, *args, **kwargs)

    monkeypatch.setattr(tio, "decode_jpeg", spy)
    return calls


def test_device_decodes_only_complete_jpegs_torchvision_takes(tmp_path):
    from isood.features.image_tensors import device_decodes

    files = _gpu_files(tmp_path)[:-1]
    taken = {f.name: device_decodes(f.read_bytes()) for f in files}
    assert taken == {"rgb0.jpg": True, "rgb1.jpg": True, "rgb2.jpg": True, "rgb3.jpg": True, "rgb4.jpg": True,
                     "progressive.jpg": True, "gray.jpg": True, "cmyk.jpg": False, "p.png": False,
                     "cut.jpg": False, "twosof.jpg": True, "garbage.JPEG": False}
    assert not device_decodes(files[0].read_bytes() + b"\0trailer")  # bytes after the image: PIL decides


def test_gpu_decode_on_cpu_is_one_batched_call_close_to_the_reference_with_its_errors(tmp_path, jpeg_calls):
    from isood.features.decoding import GPU_DECODE, REFERENCE_DECODE
    from isood.features.batch_decode import image_decoder

    files = _gpu_files(tmp_path)
    names = [f.name for f in files]
    pp = _clip_transform(32)
    ref = image_decoder(pp, REFERENCE_DECODE).decode([str(f) for f in files], names)
    assert jpeg_calls == []
    gpu = image_decoder(pp, GPU_DECODE).decode([str(f) for f in files], names)
    # the 8 JPEGs torchvision takes, in ONE call; twosof.jpg fails it, so each is decoded alone after; the others
    # (CMYK, PNG, cut short, garbage, missing) by the reference path
    assert jpeg_calls == [8] + [0] * 8
    assert [err for _, err in gpu] == [err for _, err in ref]  # the same rejected files, worded the same
    assert [t is None for t, _ in ref] == [False] * 9 + [True] * 4 and "broken data stream" in ref[10][1]
    for (t, _), (r, _), name in zip(gpu, ref, names):
        if r is None:
            continue
        diff = (t - r).abs()
        assert t.shape == r.shape and float(diff.mean()) <= 0.5 * LEVEL, name  # libjpeg + torch's resize vs PIL's
        if name in ("cmyk.jpg", "p.png"):
            assert torch.equal(t, r)  # taken by the reference path itself
    assert [item.sha256 for item in gpu] == [item.sha256 for item in ref]


def test_a_jpeg_the_device_refuses_is_decoded_alone_then_by_the_reference(tmp_path, monkeypatch, jpeg_calls):
    """decode_jpeg returns nothing when one image of the batch fails (nvJPEG refusing an odd JPEG): the others
    are decoded one by one, the refused one by the reference path (its features the reference's)."""
    import torchvision.io as tio

    from isood.features.decoding import GPU_DECODE, REFERENCE_DECODE
    from isood.features.batch_decode import image_decoder

    files = _gpu_files(tmp_path)[:5]
    odd = files[1].read_bytes()
    spied = tio.decode_jpeg

    def refuses_odd(input, *args, **kwargs):
        inputs = input if isinstance(input, list) else [input]
        if any(x.numel() == len(odd) and bytes(x.numpy()) == odd for x in inputs):
            spied(input, *args, **kwargs)  # still counted
            raise RuntimeError("nvjpeg: unsupported JPEG")
        return spied(input, *args, **kwargs)

    monkeypatch.setattr(tio, "decode_jpeg", refuses_odd)
    pp = _clip_transform(32)
    gpu = image_decoder(pp, GPU_DECODE).decode([str(f) for f in files])
    ref = image_decoder(pp, REFERENCE_DECODE).decode([str(f) for f in files])
    assert jpeg_calls == [5, 0, 0, 0, 0, 0]  # the batch, then each image alone
    assert all(err == "" for _, err in gpu)
    assert torch.equal(gpu[1][0], ref[1][0]) and not torch.equal(gpu[0][0], ref[0][0])


def test_tensor_batch_equals_one_image_at_a_time():
    from isood.features.image_tensors import pil_to_uint8, tensor_preprocess

    steps = tensor_preprocess(_clip_transform(32))
    images = [pil_to_uint8(_scene(w, h, seed=i)) for i, (w, h) in enumerate([(90, 60), (50, 70), (90, 60), (33, 33)])]
    batch = steps.batch(images)
    assert batch.shape == (4, 3, 32, 32) and steps.batch([]) is None
    for x, row in zip(images, batch):
        assert torch.equal(steps(x), row)
