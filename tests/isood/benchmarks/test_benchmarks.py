"""Named benchmarks (``isood benchmarks``, ``isood evaluate --benchmark NAME --data-root DIR``) and the object API
(``isood.Benchmark``, ``isood.detectors``).

References: OpenOOD v1.5's own ``DATA_INFO['imagenet']`` (its evaluator's table of ID / near / far image lists,
written out below as published), and the explicit route every user had before: the lists imported with the real
importers and passed as ``--ood GROUP:NAME=MANIFEST --ood-root NAME=DIR``. The world is made here: an OpenOOD-style
data root (``benchmark_imglist/imagenet/*.txt`` + ``images_largescale/``) of small made-up images, and a tiny timm
ResNet with random weights saved locally.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from PIL import Image
from typer.testing import CliRunner

#: OpenOOD v1.5 evaluation_api/datasets.py DATA_INFO['imagenet'] (ood part): set -> imglist, by group.
OPENOOD_IMAGENET = {
    "near": {"ssb_hard": "benchmark_imglist/imagenet/test_ssb_hard.txt",
             "ninco": "benchmark_imglist/imagenet/test_ninco.txt"},
    "far": {"inaturalist": "benchmark_imglist/imagenet/test_inaturalist.txt",
            "textures": "benchmark_imglist/imagenet/test_textures.txt",
            "openimage_o": "benchmark_imglist/imagenet/test_openimage_o.txt"},
}
OPENOOD_ID_TEST = "benchmark_imglist/imagenet/test_imagenet.txt"
NAME = "openood-v1.5-imagenet1k"


def _image(path: Path, rng, base: float) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    a = np.clip(base + rng.normal(0, 30, (20, 24, 3)), 0, 255).astype(np.uint8)
    Image.fromarray(a).save(path, format="JPEG")


@pytest.fixture(scope="module")
def openood_root(tmp_path_factory):
    """An OpenOOD v1.5 data root for ImageNet (lists as OpenOOD writes them: ``path label``), a training folder
    and a tiny 3-class timm ResNet checkpoint."""
    import timm
    import torch
    from safetensors.torch import save_file

    root = tmp_path_factory.mktemp("openood")
    data = root / "data"
    rng = np.random.default_rng(0)
    lines = []
    for i in range(12):
        rel = f"imagenet_1k/val/ILSVRC2012_val_{i + 1:08d}.JPEG"
        _image(data / "images_largescale" / rel, rng, 60 + 50 * (i % 3))
        lines.append(f"{rel} {i % 3}")
    (data / OPENOOD_ID_TEST).parent.mkdir(parents=True)
    (data / OPENOOD_ID_TEST).write_text("\n".join(lines) + "\n")
    for g, sets in OPENOOD_IMAGENET.items():
        for k, (name, imglist) in enumerate(sets.items()):
            rels = [f"{name}/{name}_{i}.jpg" for i in range(5 + k)]
            for rel in rels:
                _image(data / "images_largescale" / rel, rng, 30 + 40 * k + (0 if g == "near" else 90))
            (data / imglist).write_text("".join(f"{rel} -1\n" for rel in rels))
    for c, w in enumerate(["n01440764", "n01443537", "n01484850"]):
        for i in range(4):
            _image(root / "train" / w / f"{w}_{i}.JPEG", rng, 60 + 50 * c)
    torch.manual_seed(0)
    model = timm.create_model("test_resnet", pretrained=False, num_classes=3)
    save_file({k: v.contiguous() for k, v in model.state_dict().items()}, str(root / "m.safetensors"))
    return root


def _cli(args):
    import torch

    from isood.cli import app

    torch.set_num_threads(1)
    return CliRunner().invoke(app, [str(a) for a in args])


def _common(root: Path, out: Path, cache: Path):
    return ["--id-train", root / "train", "--model", "test_resnet", "--checkpoint", root / "m.safetensors",
            "--detectors", "msp,energy", "--plot-metrics", "auroc", "--cache-dir", cache, "--out", out]


# ------------------------------------------------------------------------------------------------ the registry
def test_the_builtin_openood_benchmark_is_openood_s_own_data_info():
    from isood.benchmarks import available_benchmarks

    known = available_benchmarks()
    assert {"is-ood", "imagenet-ood", NAME} <= set(known)
    spec = known[NAME]
    got = {g: {s.name: s.list for s in spec.ood if s.group == g} for g in ("near", "far")}
    assert got == OPENOOD_IMAGENET
    assert {s.root for s in spec.ood} == {"images_largescale"} and {s.format for s in spec.ood} == {"openood-imglist"}
    assert spec.id_test.list == OPENOOD_ID_TEST and spec.id_test.root == "images_largescale"
    assert spec.id_test.format == "openood-imglist"  # OpenOOD's lists are 'path label' lines


def test_the_is_ood_benchmark_is_the_release_layout_the_importer_reads():
    from isood.benchmarks import get_benchmark

    spec = get_benchmark("is-ood")
    assert [(s.name, s.format, s.list, s.root) for s in spec.ood] == [
        ("imagenet21k", "isood-lists", "imglist/imagenet21k", "imagenet21k"),
        ("synis", "isood-lists", "imglist/SynIS", "SynIS")]
    assert (spec.id_test.list, spec.id_test.root) == ("imglist/imagenet1k/test_imagenet.txt", "imagenet1k")


def test_a_user_benchmark_is_found_in_the_env_folder_and_a_taken_name_is_refused(tmp_path, monkeypatch):
    from isood.benchmarks import available_benchmarks, get_benchmark
    from isood.core.errors import IsoodError

    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "b.toml").write_text('name = "my-bench"\ntitle = "t"\n[id_test]\nfolder = "val"\n'
                                 '[[ood]]\nname = "x"\ngroup = "far"\nformat = "imagenet-ood"\nlist = "x.txt"\n'
                                 'root = "imgs"\n')
    monkeypatch.setenv("ISOOD_BENCHMARKS", str(mine))
    assert available_benchmarks()["my-bench"].ood[0].group == "far"
    assert get_benchmark(mine / "b.toml").name == "my-bench"
    (mine / "c.toml").write_text((mine / "b.toml").read_text().replace("my-bench", "is-ood"))
    with pytest.raises(IsoodError, match="taken by"):
        available_benchmarks()


@pytest.mark.parametrize("edit, words", [
    (('list = "x.txt"', 'list = "../x.txt"'), ["inside the data root"]),
    (('list = "x.txt"', 'list = "/etc/passwd"'), ["inside the data root"]),
    (('format = "imagenet-ood"', 'format = "csv"'), ["format", "openood-imglist"]),
    (('group = "far"', 'group = "middle"'), ["group", "near"]),
    (('name = "x"', 'name = "id_test"'), ["name", "id_test"]),
    (('title = "t"', 'titel = "t"'), ["unknown key", "titel"]),
])
def test_a_bad_benchmark_file_is_one_line(edit, words, tmp_path):
    from isood.benchmarks.registry import parse_benchmark
    from isood.core.errors import IsoodError

    text = ('name = "b"\ntitle = "t"\n[id_test]\nfolder = "val"\n[[ood]]\nname = "x"\ngroup = "far"\n'
            'format = "imagenet-ood"\nlist = "x.txt"\nroot = "imgs"\n')
    (tmp_path / "b.toml").write_text(text.replace(*edit))
    with pytest.raises(IsoodError) as e:
        parse_benchmark(tmp_path / "b.toml")
    assert all(w in str(e.value) for w in words) and "\n" not in str(e.value), str(e.value)


# ------------------------------------------------------------------------------------- evaluate --benchmark
def test_evaluate_by_name_equals_the_explicit_sets_and_reuses_its_imports(openood_root, tmp_path):
    import manifests
    from isood.stages.interop import import_openood_imglist

    import os
    import shutil

    data = tmp_path / "data"  # a copy: one of its lists is changed below
    shutil.copytree(openood_root / "data", data)
    cache = tmp_path / "cache"

    os.environ["ISOOD_CACHE_DIR"] = str(tmp_path / "isood-cache")
    try:
        r = _cli(["evaluate", "--benchmark", NAME, "--data-root", data, *_common(openood_root, tmp_path / "a", cache)])
        assert r.exit_code == 0, r.output
        imports = sorted(p for p in (tmp_path / "isood-cache" / "benchmarks" / NAME).iterdir() if p.is_dir())
        assert len(imports) == 5  # one manifest per OOD list (and the ID list's paths beside them)
        before = {p.name: (p / "manifest.json").stat().st_mtime_ns for p in imports}
        # the explicit route: import each list with the real importer, name the groups and roots by hand
        explicit = []
        for g, sets in OPENOOD_IMAGENET.items():
            for name, imglist in sets.items():
                import_openood_imglist(data / imglist, tmp_path / "m" / name)
                explicit += ["--ood", f"{g}:{name}={tmp_path / 'm' / name}", "--ood-root",
                             f"{name}={data / 'images_largescale'}"]
        plain = tmp_path / "id_paths.txt"  # the ID list's paths, one per line; its labels from the list itself
        plain.write_text("".join(ln.split(" ")[0] + "\n" for ln in (data / OPENOOD_ID_TEST).read_text().splitlines()))
        r2 = _cli(["evaluate", *explicit, "--id-test", plain, "--id-test-root",
                   data / "images_largescale", "--id-test-labels", data / OPENOOD_ID_TEST,
                   *_common(openood_root, tmp_path / "b", cache)])
        assert r2.exit_code == 0, r2.output
        a = manifests.read(tmp_path / "a", kind="evaluation").frame("set_metrics")
        b = manifests.read(tmp_path / "b", kind="evaluation").frame("set_metrics")
        assert set(a["dataset"]) >= {"ssb_hard", "ninco", "inaturalist", "textures", "openimage_o", "nearood", "farood"}
        pd.testing.assert_frame_equal(a.sort_values(["detector", "dataset"]).reset_index(drop=True),
                                      b.sort_values(["detector", "dataset"]).reset_index(drop=True), rtol=1e-9)
        # a second run reuses every import (same content); a changed list is imported anew
        r3 = _cli(["evaluate", "--benchmark", NAME, "--data-root", data, *_common(openood_root, tmp_path / "c", cache)])
        assert r3.exit_code == 0, r3.output
        after = {p.name: (p / "manifest.json").stat().st_mtime_ns
                 for p in (tmp_path / "isood-cache" / "benchmarks" / NAME).iterdir() if p.is_dir()}
        assert after == before
        ninco = data / OPENOOD_IMAGENET["near"]["ninco"]
        ninco.write_text("\n".join(ninco.read_text().splitlines()[:-1]) + "\n")
        r4 = _cli(["evaluate", "--benchmark", NAME, "--data-root", data, *_common(openood_root, tmp_path / "d", cache)])
        assert r4.exit_code == 0, r4.output
        new = sorted({p for p in (tmp_path / "isood-cache" / "benchmarks" / NAME).iterdir() if p.is_dir()}
                     - set(imports))
        assert [p.name.split("-")[0] for p in new] == ["ninco"]
        d = manifests.read(tmp_path / "d", kind="evaluation").frame("set_metrics")
        assert int(d[(d["dataset"] == "ninco") & (d["detector"] == "msp")]["n"].iloc[0]) == 5
    finally:
        del os.environ["ISOOD_CACHE_DIR"]


def test_what_is_missing_is_named_in_one_line_before_any_work(openood_root, tmp_path):
    import shutil

    data = tmp_path / "data"
    shutil.copytree(openood_root / "data" / "benchmark_imglist", data / "benchmark_imglist")
    (data / "images_largescale").mkdir()
    (data / OPENOOD_IMAGENET["far"]["textures"]).unlink()
    r = _cli(["evaluate", "--benchmark", NAME, "--data-root", data, *_common(openood_root, tmp_path / "o", tmp_path)])
    assert r.exit_code == 2, r.output
    lines = [ln for ln in r.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1 and "test_textures.txt (textures list)" in lines[0], r.stderr
    assert "test_ninco.txt" not in lines[0] and not (tmp_path / "o").exists()
    r = _cli(["evaluate", "--benchmark", "no-such", "--data-root", data, "--out", tmp_path / "o"])
    assert r.exit_code == 2 and NAME in r.stderr and "isood benchmarks" in r.stderr
    r = _cli(["evaluate", "--benchmark", NAME, "--out", tmp_path / "o"])
    assert r.exit_code == 2 and "--data-root" in r.stderr


def test_isood_benchmarks_lists_and_shows_what_is_there(openood_root):
    r = _cli(["benchmarks"])
    assert r.exit_code == 0 and NAME in r.stdout and "is-ood" in r.stdout and "imagenet-ood" in r.stdout
    r = _cli(["benchmarks", "is-ood", "--data-root", openood_root / "data"])
    assert r.exit_code == 0 and r.stdout.count("missing") == 6, r.stdout
    r = _cli(["benchmarks", NAME, "--data-root", openood_root / "data"])
    assert r.exit_code == 0 and "missing" not in r.stdout and r.stdout.count(" yes ") == 12, r.stdout


# -------------------------------------------------------------------------------------------- the object API
def test_benchmark_objects_and_detector_objects_give_the_string_api_s_frames(openood_root, tmp_path, monkeypatch):
    import isood
    from isood.detectors import KNN, MSP

    monkeypatch.setenv("ISOOD_CACHE_DIR", str(tmp_path / "cache"))
    data = openood_root / "data"
    common = dict(checkpoint=openood_root / "m.safetensors", id_train=openood_root / "train")
    bench = isood.Benchmark.from_name(NAME, data_root=data)
    assert bench.ood == {f"{g}:{n}": bench.ood[f"{g}:{n}"] for g, s in OPENOOD_IMAGENET.items() for n in s}
    by_objects = bench.evaluate("test_resnet", detectors=[MSP(), KNN(k=3)], **common)
    plain = tmp_path / "id_paths.txt"
    plain.write_text("".join(ln.split(" ")[0] + "\n" for ln in (data / OPENOOD_ID_TEST).read_text().splitlines()))
    by_strings = isood.evaluate("test_resnet", id_test=plain, id_test_root=data / "images_largescale",
                                id_test_labels=data / OPENOOD_ID_TEST, ood=bench.ood, roots=bench.roots,
                                detectors="msp,knn:k=3", **common)
    pd.testing.assert_frame_equal(by_objects.per_set, by_strings.per_set, rtol=1e-9)
    assert set(by_objects.per_set["detector"]) == {"msp", "knn"}
    manual = isood.Benchmark.from_manifests(ood=bench.ood, roots=bench.roots, id_test=bench.id_test,
                                            id_test_root=bench.id_test_root, id_test_labels=bench.id_test_labels)
    pd.testing.assert_frame_equal(manual.evaluate("test_resnet", detectors="msp,knn:k=3", **common).per_set,
                                  by_strings.per_set, rtol=1e-9)


@pytest.mark.parametrize("make", [
    lambda d: d.KNN(k=7), lambda d: d.MSP(), lambda d: d.Energy(temperature=2.5), lambda d: d.ReAct(percentile=85),
    lambda d: d.ASH(percentile=80, variant="s"), lambda d: d.ViM(dim=12), lambda d: d.ODIN(temperature=100.0),
])
def test_a_detector_object_and_its_spec_text_are_one_description(make):
    import isood

    d = make(isood.detectors)
    (name, again), = isood.detectors.parse_detectors(d.spec()).items()
    assert name == d.name and type(again) is type(d) and again.params() == d.params(), d.spec()
