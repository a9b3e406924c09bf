"""The integrity matrix ("nothing lost, nothing silently wrong"), rows of the inputs: text inputs (a byte-order
mark kept in a path, a Latin-1 file as a traceback), the OpenOOD export of every manifest kind (Syn-IS and its
label names), generate-syn's bounds (--size, --safety-checker, non-finite floats) and its terminal (diffusers'
own lines), the --levels bound, messages that must list something and not contradict themselves, the ANN report
against a real exact build and `isood publish` without feature shards. A row names its guard
(``module.function``); each fails without its fix. Inputs are made here with the real writers (tiny models)."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from PIL import Image

import manifests

LATIN1 = "caf\xe9".encode("latin-1")  # b"caf\xe9": not UTF-8 (0xe9 starts a 3-byte sequence)
BOM = b"\xef\xbb\xbf"


def _latin1_error(line: str, name: str, line_no: int, offset: int) -> None:
    """The one line of a text file in another encoding: the file, the line, the byte offset, what to do."""
    assert name in line and f":{line_no}:" in line and f"byte offset {offset}" in line, line
    assert "save it as UTF-8" in line, line


# ============================================================================================ text inputs
@pytest.fixture(scope="module")
def release(tmp_path_factory) -> Path:
    """A 2 x 2 IS-OOD release folder (one list per cell, 2 images each)."""
    root = tmp_path_factory.mktemp("release") / "imagenet21k"
    root.mkdir()
    for c in range(2):
        for s in range(2):
            (root / f"cov_{c}_sem_{s}.txt").write_text("".join(f"n01440764/n01440764_{c}{s}{i}.JPEG\n"
                                                               for i in range(2)))
    return root


def _bom_release(root: Path, odd: bool) -> Path:
    """A copy of the release whose lists start with a BOM (``odd``: a non-ASCII path too, so the exact Python
    parser reads them instead of the vectorised one)."""
    out = root.parent / ("bom_odd" if odd else "bom") / root.name
    out.mkdir(parents=True, exist_ok=True)
    for f in root.glob("*.txt"):
        extra = "n01440764/caf\u00e9.JPEG\n".encode() if odd and f.name == "cov_0_sem_0.txt" else b""
        (out / f.name).write_bytes(BOM + f.read_bytes() + extra)
    return out


@pytest.mark.parametrize("fmt, text", [("imagenet-ood", "n01440764/a.JPEG\r\nn01443537/b.JPEG\r\n"),
                                       ("openood-imglist", "n01440764/a.JPEG 3\nn01443537/b.JPEG 4\n")],
                         ids=["imagenet_ood-textio.read_lines", "openood_imglist-textio.read_lines"])
def test_bom_is_not_part_of_the_first_imported_path(fmt, text, cli, tmp_path):
    src = tmp_path / "list.txt"
    src.write_bytes(BOM + text.encode())
    r = cli.invoke(["import", fmt, src, "--out", tmp_path / "m"])
    assert r.exit_code == 0, r.output
    images = manifests.read(tmp_path / "m").table("images").to_pylist()
    assert [(i["path"], i["wnid"]) for i in images] == [("n01440764/a.JPEG", "n01440764"),
                                                        ("n01443537/b.JPEG", "n01443537")]


@pytest.mark.parametrize("odd", [False, True], ids=["vectorised-lines.read_lines", "exact-imports.parse_list"])
def test_bom_is_not_part_of_the_first_path_of_release_lists(odd, release, cli, tmp_path):
    src = _bom_release(release, odd)
    r = cli.invoke(["import", "isood-lists", src, "--out", tmp_path / "m", "--levels", "2", "--na-threshold", "1"])
    assert r.exit_code == 0, r.output
    paths = manifests.read(tmp_path / "m").table("images").column("path").to_pylist()
    expected = [f"n01440764/n01440764_{c}{s}{i}.JPEG" for c in range(2) for s in range(2) for i in range(2)]
    assert sorted(paths) == sorted(expected + (["n01440764/caf\u00e9.JPEG"] if odd else []))
    assert not any("\ufeff" in p for p in paths)


def _write(tmp: Path, name: str, data: bytes) -> Path:
    (tmp / name).write_bytes(data)
    return tmp / name


def test_bom_is_dropped_by_every_reader_of_a_user_text_file(tmp_path, tiny_images):
    """Every reader of a user's text file, through the function its option calls: a file saved with a BOM (as
    Windows Notepad does) reads as the same file without one. Before, the BOM stayed in the first entry: an
    unknown class, a term that never matched, a label taken as a name, a JSON / TOML error, an unreadable path."""
    from generation.safety import PromptBlocklist
    from generation.styles import parse_style_file
    from isood.classifiers.classes import read_class_file
    from isood.features.listing import list_images
    from isood.features.labels import load_labels
    from isood.stages.splits.options import read_toml  # isood.core.optconfig.from_config of SplitsOptions
    from isood.stages.wordnet.jobs import read_list_file
    from wordnet_tools.synsets import load_synset_list

    wnids = BOM + b"n01440764\r\nn01443537\r\n"
    assert read_class_file(_write(tmp_path, "classes.txt", wnids)) == ["n01440764", "n01443537"]
    assert load_synset_list(_write(tmp_path, "cands.txt", wnids)) == ["n01440764", "n01443537"]
    assert [w for _, w in read_list_file(_write(tmp_path, "audit.txt", wnids))] == ["n01440764", "n01443537"]
    assert PromptBlocklist.build(_write(tmp_path, "block.txt", BOM + b"zebra\n"), use_default=False).match(
        "a zebra at dusk") == "zebra"
    labels = load_labels(str(_write(tmp_path, "labels.txt", wnids))).frame
    assert labels["wnid"].tolist() == ["n01440764", "n01443537"] and labels["label"].tolist()[0] == "tench"
    style = {"name": "ink", "prompt": "an ink drawing of {prompt}", "negative_prompt": "photo"}
    assert [s.name for s in parse_style_file(_write(tmp_path, "s.json", BOM + json.dumps([style]).encode()))] == ["ink"]
    assert read_toml(_write(tmp_path, "b.toml", BOM + b"levels = 4\n"))["levels"] == 4
    rels = sorted(p.relative_to(tiny_images).as_posix() for p in tiny_images.rglob("*.JPEG"))[:3]
    listing = _write(tmp_path, "files.txt", BOM + "".join(f"{tiny_images / r}\n" for r in rels).encode())
    source = list_images(listing)
    assert len(source.files) == 3 and all(Path(f).is_file() for f in source.files)
    assert not any("\ufeff" in str(f) for f in source.files)


# --------------------------------------------------------------------- a file in another encoding: one line
@pytest.fixture(scope="module")
def syn_inputs(tmp_path_factory, syn_inputs_factory, tiny_clip_spec):
    """generate-syn's inputs for the tiny CLIP: ID features, a LAID file, labels; ``args``: a --prompts-only run."""
    root = syn_inputs_factory(tmp_path_factory.mktemp("syn_inputs"))["root"]
    options = {"--labels": root / "labels.txt", "--clip": tiny_clip_spec, "--laid": root / "laid.safetensors",
               "--id-features": root / "id", "--device": "cpu", "--styles": "sdxl:anime,clay", "--per-cell": "1"}
    return {"root": root, "options": options, "base": _syn_args(options)}


def _syn_args(options: dict, **replace) -> list:
    """generate-syn's arguments from ``options`` (option -> value), with ``replace`` ('labels' -> '--labels')."""
    merged = {**options, **{f"--{k.replace('_', '-')}": v for k, v in replace.items()}}
    return ["generate-syn", *[x for kv in merged.items() for x in kv]]


LATIN1_ROWS = [  # (file name, its first line, arguments given the file and the inputs); guard in the id
    pytest.param("ood.txt", b"n01440764/a.JPEG\n", lambda p, i: ["import", "imagenet-ood", p],
                 id="import_imagenet_ood-imports.parse_list"),
    pytest.param("imglist.txt", b"n01440764/a.JPEG 1\n", lambda p, i: ["import", "openood-imglist", p],
                 id="import_openood_imglist-imports.parse_list"),
    pytest.param("blocklist.txt", b"zebra\n", lambda p, i: [*_syn_args(i["options"], blocklist=p), "--prompts-only"],
                 id="generate_syn_blocklist-safety.read_blocklist"),
    pytest.param("labels.txt", b"n01440764\n", lambda p, i: [*_syn_args(i["options"], labels=p), "--prompts-only"],
                 id="generate_syn_labels-labels._read_lines"),
    pytest.param("styles.json", b'[{"name": "ink",\n', lambda p, i: [*_syn_args(i["options"], styles=p),
                                                                      "--prompts-only"],
                 id="generate_syn_styles-styles.parse_style_file"),
    pytest.param("candidates.txt", b"n01440764\n", lambda p, i: ["wordnet", "filter", "--candidates", p],
                 id="wordnet_filter_candidates-synsets.load_synset_list"),
    pytest.param("id.txt", b"n01440764\n", lambda p, i: ["wordnet", "filter", "--candidates", "1k", "--id-classes", p],
                 id="wordnet_filter_id-synsets.load_synset_list"),
    pytest.param("audit.txt", b"n01440764\n", lambda p, i: ["wordnet", "audit", p],
                 id="wordnet_audit-jobs.read_list_file"),
    pytest.param("build.toml", b"levels = 4\n", lambda p, i: ["build-splits", "--config", p],
                 id="build_splits_config-config.read_toml"),
]


@pytest.mark.parametrize("name, first, make_args", LATIN1_ROWS)
def test_latin1_text_file_is_one_line_naming_file_line_and_offset(name, first, make_args, syn_inputs, cli,
                                                                    tmp_path):
    path = tmp_path / name
    path.write_bytes(first + b"n01443537 " + LATIN1 + b"\n")
    out = tmp_path / "out"
    line = cli.one_line_error(cli.invoke([*make_args(path, syn_inputs), "--out", out]))
    _latin1_error(line, name, 2, len(first) + len(b"n01443537 caf"))
    assert not (out / "manifest.json").exists()


def test_latin1_release_list_is_one_line(release, cli, tmp_path):
    src = tmp_path / "rel" / release.name
    src.mkdir(parents=True)
    for f in release.glob("*.txt"):
        (src / f.name).write_bytes(f.read_bytes() + (b"n01440764/" + LATIN1 + b".JPEG\n" if "0_sem_1" in f.name
                                                     else b""))
    line = cli.one_line_error(cli.invoke(["import", "isood-lists", src, "--out", tmp_path / "m", "--levels", "2"]))
    _latin1_error(line, "cov_0_sem_1.txt", 3, len(b"n01440764/n01440764_010.JPEG\n" * 2) + len(b"n01440764/caf"))


def test_utf16_file_is_named_as_such(cli, tmp_path):
    src = tmp_path / "list.txt"
    src.write_bytes("n01440764/a.JPEG\n".encode("utf-16"))
    line = cli.one_line_error(cli.invoke(["import", "imagenet-ood", src, "--out", tmp_path / "m"]))
    assert "list.txt" in line and "UTF-16" in line and "save it as UTF-8" in line


# ------------------------------------------------------------------------ evaluate: --classes and messages
ID = ["n01440764", "n01443537", "n01484850"]
OOD = ["n02084071", "n04399382"]


@pytest.fixture(scope="module")
def eval_world(tmp_path_factory, tiny_eval):
    """Image folders (train / val with 3 ID classes), a 2 x 2 splits manifest written by the splits writer, and
    a tiny timm ResNet with random weights saved as a local checkpoint."""
    from isood.dev.tiny_models import build_tiny_classifier

    _image = tiny_eval.image
    root = tmp_path_factory.mktemp("eval_world")
    rng = np.random.default_rng(0)
    colour = {w: rng.integers(30, 225, 3) for w in ID + OOD}
    for w in ID:
        for i in range(3):
            _image(root / "train" / w / f"{w}_{i}.png", colour[w], rng)
            _image(root / "val" / w / f"{w}_{i}.png", colour[w], rng)
    tiny_eval.grid_splits(root / "splits", root / "test", rng, colour, id_wnids=ID, ood_wnids=OOD, per_cell=3)
    build_tiny_classifier(root / "test_resnet.safetensors", num_classes=3)
    return root


def _evaluate(world: Path, out: Path, *extra) -> list:
    return ["evaluate", "--splits", world / "splits", "--id-test", world / "val", "--id-train", world / "train",
            "--model", "test_resnet", "--checkpoint", world / "test_resnet.safetensors", "--na-threshold", "2",
            "--cache-dir", out.parent / "cache", "--detectors", "msp", "--out", out, *extra]


def test_evaluate_classes_latin1_is_one_line(eval_world, cli, tmp_path):
    """Guard: isood.classifiers.classes.read_class_file (was a UnicodeDecodeError traceback)."""
    path = tmp_path / "classes.txt"
    path.write_bytes(b"n01440764\nn01443537 " + LATIN1 + b"\nn01484850\n")
    out = tmp_path / "out"
    line = cli.one_line_error(cli.invoke(_evaluate(eval_world, out, "--classes", path)))
    _latin1_error(line, "classes.txt", 2, len(b"n01440764\nn01443537 caf"))
    assert "--classes" in line and not (out / "manifest.json").exists()


def test_evaluate_classes_with_a_bom_is_the_same_run(eval_world, cli, tmp_path):
    """A --classes file saved with a BOM scores like the one without (its first class was unknown before)."""
    path = tmp_path / "classes.txt"
    path.write_bytes(BOM + "".join(f"{w}\n" for w in ID).encode())
    r = cli.invoke(_evaluate(eval_world, tmp_path / "out", "--classes", path))
    assert r.exit_code == 0, r.output
    assert manifests.read(tmp_path / "out").meta["command"]["config"]["classes"] == str(path)


def test_plot_metric_when_every_cell_is_na_says_why(eval_world, cli, tmp_path):
    """Guard: isood.science.levels.metric_choices (was "pass among " followed by nothing)."""
    line = cli.one_line_error(cli.invoke(_evaluate(eval_world, tmp_path / "out", "--plot-metrics", "auroc",
                                                   "--na-threshold", "100")))
    assert "auroc" in line and "every cell is N/A" in line and "--na-threshold" in line, line
    assert not re.search(r"(among|one of):?\s*$", line), line


def test_detector_without_parameters_says_so(eval_world, cli, tmp_path):
    """Guard: isood.science.detectors.registry.get_detector (was "pass one of: none")."""
    args = _evaluate(eval_world, tmp_path / "out")
    args[args.index("--detectors") + 1] = "maxlogit:k=3"
    line = cli.one_line_error(cli.invoke(args))
    assert "maxlogit takes no parameters" in line and "'k'" in line and "one of" not in line, line


# ==================================================================================== export of every kind
class Pictures:
    """A generator for the Syn-IS stage (the API's ``generator``): one flat image per prompt, coloured by seed."""

    fingerprint = {"generator": "flat-colour test images", "size": 16}

    def __call__(self, prompts, negative_prompts, seeds):
        return [(Image.new("RGB", (16, 16), tuple(int(x) for x in np.random.default_rng(s).integers(0, 255, 3))),
                 None) for s in seeds]


@pytest.fixture(scope="module")
def syn_manifest(syn_inputs, tiny_clip_spec, tmp_path_factory) -> Path:
    """A generated Syn-IS manifest written by the generate-syn stage and its writer (labels are names)."""
    from isood.stages.syn import SynOptions, run_generate_syn

    root = syn_inputs["root"]
    out = tmp_path_factory.mktemp("syn") / "syn"
    run_generate_syn(SynOptions(out=out, styles="sdxl:anime,clay", labels=str(root / "labels.txt"),
                                clip=tiny_clip_spec, laid=str(root / "laid.safetensors"), id_features=str(root / "id"),
                                per_cell=1, size=16, device="cpu", levels=2, na_threshold=1, progress=False),
                     generator=Pictures())
    return out


def test_syn_is_export_lists_every_generated_image_per_cell(syn_manifest, cli, tmp_path):
    """Guard: isood.stages.interop.openood.has_class_label (was ArrowInvalid: 'tench'): a Syn-IS label is the
    prompt's name, not a class index, so every image is listed with OpenOOD's OOD label -1, in its cell."""
    from isood.science.grid import cell_name

    images = manifests.read(syn_manifest).frame("images")
    assert images["label"].map(type).eq(str).all() and len(images) >= 3  # names such as "tench"
    out = tmp_path / "export"
    r = cli.invoke(["export", "openood", syn_manifest, "--out", out])
    assert r.exit_code == 0, r.output
    written = {}
    for f in (out / "benchmark_imglist" / "syn").glob("test_*.txt"):  # named after the manifest's folder
        for ln in f.read_text().splitlines():
            path, label = ln.rsplit(" ", 1)
            written[path] = (f.name, label)
    expected = {p: (f"test_{cell_name(c, s)}.txt", "-1")
                for p, c, s in zip(images["path"], images["cov_level"], images["sem_level"])}
    assert written == expected
    info = json.loads((out / "openood_data_info.json").read_text())
    record = info["benchmarks"]["syn"]
    assert record["manifest"]["kind"] == "syn-is" and sum(d["n"] for d in record["datasets"]) == len(images)


def _empty_manifest(root: Path, kind: str) -> Path:
    """A manifest of ``kind`` with empty tables of its registered columns (manifests.write_manifest)."""
    import pyarrow as pa

    from manifests.schema import BOOL, FLOAT, INT, STRING, kind_spec

    types = {INT: pa.int64(), FLOAT: pa.float64(), STRING: pa.string(), BOOL: pa.bool_()}
    tables = {name: pa.schema([(c, types[f]) for c, f in t.columns.items()]).empty_table()
              for name, t in kind_spec(kind).tables.items() if not t.optional}
    manifests.write_manifest(root, kind=kind, tables=tables, config={})
    return root


@pytest.fixture(scope="module")
def exportable(syn_manifest, release, tmp_path_factory):
    """A manifest of each kind `export openood` reads, written by its own writer."""
    from isood.kinds import IMAGE_LIST, SPLITS, SYN_IS
    from isood.stages.interop import import_imagenet_ood, import_isood_lists

    base = tmp_path_factory.mktemp("exportable")
    (base / "ood.txt").write_text("n01440764/a.JPEG\nn01443537/b.JPEG\n")
    import_imagenet_ood(base / "ood.txt", base / "list")
    import_isood_lists(release, base / "splits", n_levels=2, na_threshold=1)
    return {SYN_IS: syn_manifest, IMAGE_LIST: base / "list", SPLITS: base / "splits"}


def _kinds():
    from isood.kinds import EVALUATION  # noqa: F401  (registers every kind of isood)
    from manifests.schema import registered_kinds

    return registered_kinds()


@pytest.mark.parametrize("kind", _kinds())
def test_every_kind_exports_or_is_refused_in_one_line(kind, exportable, cli, tmp_path):
    """Guard: isood.stages.interop.openood.export_openood: every registered kind either exports (an imglist per
    dataset, every image once) or is refused with one line naming the kinds it reads, writing nothing."""
    from isood.stages.interop import EXPORT_KINDS

    out = tmp_path / "export"
    if kind in EXPORT_KINDS:
        r = cli.invoke(["export", "openood", exportable[kind], "--out", out])
        assert r.exit_code == 0, r.output
        n = manifests.read(exportable[kind]).meta["summary"].get("images")
        lines = [ln for f in (out / "benchmark_imglist").rglob("*.txt") for ln in f.read_text().splitlines()]
        assert len(lines) == len(set(lines)) == (n if n is not None else len(lines)) > 0
    else:
        line = cli.one_line_error(cli.invoke(["export", "openood", _empty_manifest(tmp_path / "m", kind), "--out",
                                              out]))
        assert repr(kind) in line and all(repr(k) in line for k in EXPORT_KINDS), line
        assert not out.exists() or not any(out.iterdir())


# ====================================================================================== generate-syn options
@pytest.fixture
def nothing_loads(monkeypatch):
    """generate-syn's inputs must not be loaded, nor Ray imported (the run is refused before)."""
    import isood.stages.syn.stage as stage

    def loaded(*args, **kwargs):
        raise AssertionError("the inputs were loaded before the options were checked")

    monkeypatch.setattr(stage, "load_inputs", loaded)
    monkeypatch.setitem(sys.modules, "ray", None)  # `import ray` fails: a cluster would start here


SYN_ROWS = [  # (extra arguments, substrings of the one line); guard in the id
    pytest.param(["--size", "100000"], ["--size", "100000", "4096"], id="size_huge-pipeline.GeneratorSettings"),
    pytest.param(["--size", "4104"], ["--size", "4104", "4096"], id="size_above_max-pipeline.GeneratorSettings"),
    pytest.param(["--guidance-scale", "nan"], ["--guidance-scale", "nan"],
                 id="guidance_nan-pipeline.GeneratorSettings"),
    pytest.param(["--guidance-scale", "inf"], ["--guidance-scale", "inf"],
                 id="guidance_inf-pipeline.GeneratorSettings"),
    pytest.param(["--guidance-scale", "-1"], ["--guidance-scale", "-1"], id="guidance_neg-pipeline.GeneratorSettings"),
    pytest.param(["--safety-checker", "os:getcwd"], ["os:getcwd", "(image, item)"],
                 id="checker_signature-safety.load_image_checker"),
    pytest.param(["--safety-checker", "json:loads"], ["json:loads", "(image, item)"],
                 id="checker_one_argument-safety.load_image_checker"),
    pytest.param(["--safety-checker", "os:no_such_checker"], ["os:no_such_checker", "import"],
                 id="checker_missing-safety.load_image_checker"),
    pytest.param(["--engine", "ray", "--num-gpus-per-worker", "nan"], ["--num-gpus-per-worker", "nan"],
                 id="ray_gpus_nan-engines.ray.RayOptions"),
    pytest.param(["--engine", "ray", "--num-gpus-per-worker", "inf"], ["--num-gpus-per-worker", "inf"],
                 id="ray_gpus_inf-engines.ray.RayOptions"),
]


@pytest.mark.parametrize("extra, names", SYN_ROWS)
def test_generate_syn_option_is_refused_before_anything_loads(extra, names, syn_inputs, nothing_loads, cli,
                                                              tmp_path):
    out = tmp_path / "out"
    line = cli.one_line_error(cli.invoke([*syn_inputs["base"], *extra, "--out", out]))
    assert all(n in line for n in names), line
    assert not (out / "manifest.json").exists()


@pytest.mark.parametrize("extra, names", [
    (["--ann-recall", "nan"], ["--ann-recall", "nan"]), (["--clip-quantile", "nan"], ["--clip-quantile"]),
    (["--clip-quantile", "0.01,inf"], ["--clip-quantile"])],
    ids=["ann_recall_nan-config._check_ann", "clip_quantile_nan-config.parse_quantile",
         "clip_quantile_inf-config.parse_quantile"])
def test_build_splits_float_options_refuse_nan_and_inf(extra, names, cli, tmp_path):
    line = cli.one_line_error(cli.invoke(["build-splits", "--id", tmp_path / "id", "--test", tmp_path / "test",
                                          "--out", tmp_path / "out", *extra]))
    assert all(n in line for n in names), line


@pytest.mark.parametrize("value", ["nan", "inf"])
def test_extract_ray_gpus_refuse_nan_and_inf(value, tiny_images, tiny_clip_spec, cli, tmp_path, monkeypatch):
    """Guard: isood.engines.ray.RayOptions (nan passed `< 0`; inf started a Ray cluster, then found no GPUs)."""
    monkeypatch.setitem(sys.modules, "ray", None)  # `import ray` fails: refused before a cluster starts
    line = cli.one_line_error(cli.invoke(["extract", "--images", tiny_images, "--clip", tiny_clip_spec, "--out",
                                          tmp_path / "out", "--engine", "ray", "--num-gpus-per-worker", value]))
    assert "--num-gpus-per-worker" in line and value in line, line


def test_a_checker_failing_on_an_image_is_one_line(syn_inputs, tiny_clip_spec, tmp_path):
    """Guard: generation.outputs.write_image: a user's checker raising on an image names it and the image."""
    from isood.stages.syn import SynOptions, run_generate_syn
    from isood.core.errors import IsoodError

    def broken(image, item):
        raise KeyError("nsfw_score")

    root = syn_inputs["root"]
    opts = SynOptions(out=tmp_path / "syn", styles="sdxl:anime", labels=str(root / "labels.txt"), clip=tiny_clip_spec,
                      laid=str(root / "laid.safetensors"), id_features=str(root / "id"), per_cell=1, size=16,
                      device="cpu", levels=2, na_threshold=1, progress=False)
    with pytest.raises(IsoodError) as e:
        run_generate_syn(opts, generator=Pictures(), image_checker=broken)
    assert "broken" in str(e.value) and "KeyError" in str(e.value) and "images/" in str(e.value)
    assert "\n" not in str(e.value)


def test_generate_syn_terminal_shows_only_isood_lines(syn_inputs, tmp_path):
    """Guard: generation.pipeline.quiet_libraries: a real run (a subprocess, so the libraries' loggers write to the
    real stderr) prints isood's progress lines and nothing of diffusers / transformers (their accelerate
    warning, "Loading pipeline components" and "Loading weights" bars)."""
    import torch

    from isood.dev.tiny_models import build_tiny_sdxl

    torch.set_num_threads(1)
    pipe_dir = tmp_path / "tiny_sdxl"
    build_tiny_sdxl().save_pretrained(pipe_dir)
    args = [str(a) for a in syn_inputs["base"]] + ["--pipeline", f"local-dir:{pipe_dir}", "--size", "64", "--out",
                                                   str(tmp_path / "syn")]
    r = subprocess.run([sys.executable, "-c", "import sys; from isood.cli import main; sys.exit(main())", *args],
                       capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr
    lines = [ln.strip() for ln in re.split(r"[\r\n]", r.stderr) if ln.strip()]
    assert lines and all(ln.startswith(("encoding prompts", "generating")) for ln in lines), r.stderr
    assert manifests.verify(tmp_path / "syn").ok


# ======================================================================================= levels
def test_import_levels_beyond_the_bound_is_refused_before_reading(release, cli, tmp_path):
    """Guard: isood.science.grid.check_levels (import isood-lists --levels 1000 wrote a million lists)."""
    for bad in ("1000", "33"):
        line = cli.one_line_error(cli.invoke(["import", "isood-lists", release, "--out", tmp_path / "m", "--levels",
                                              bad, "--allow-missing"]))
        assert f"--levels must be an integer in [1, 32], got {bad}" in line and "IS-OOD uses 8" in line, line
    assert not (tmp_path / "m").exists()


def test_build_splits_levels_beyond_the_bound_is_refused(cli, tmp_path):
    line = cli.one_line_error(cli.invoke(["build-splits", "--id", tmp_path / "id", "--test", tmp_path / "test",
                                          "--out", tmp_path / "out", "--levels", "1000"]))
    assert "--levels must be an integer in [1, 32]" in line, line


def test_generate_syn_levels_beyond_the_bound_is_refused(syn_inputs, nothing_loads, tiny_clip_spec, tmp_path):
    from isood.stages.syn import SynOptions, run_generate_syn
    from isood.core.errors import BadInputError

    root = syn_inputs["root"]
    with pytest.raises(BadInputError, match=r"--levels must be an integer in \[1, 32\], got 33"):
        run_generate_syn(SynOptions(out=tmp_path / "o", labels=str(root / "labels.txt"), clip=tiny_clip_spec,
                                    laid=str(root / "laid.safetensors"), id_features=str(root / "id"),
                                    prompts_only=True, levels=33, progress=False))


# ========================================================================== the ANN report and the --ann-recall refusal
def _unit(x):
    return (x / np.linalg.norm(x, axis=1, keepdims=True)).astype(np.float32)


def _feature_set(dest: Path, x: np.ndarray) -> Path:
    """A precomputed feature set (features.npy + index.parquet), one wnid-like folder per 100 rows."""
    dest.mkdir(parents=True)
    np.save(dest / "features.npy", x)
    paths = [f"n{i // 100:08d}/img_{i}.JPEG" for i in range(len(x))]
    pd.DataFrame({"path": paths, "wnid": [p.split("/")[0] for p in paths]}).to_parquet(dest / "index.parquet")
    return dest


@pytest.fixture(scope="module")
def planted(tmp_path_factory):
    """Clustered ID features (30 clusters) and test features from 40 clusters: a quarter of the test images are
    far from every ID image, where the nearest rows are near-ties an IVF search misses; and a noise world no
    IVF plan reaches a high recall on."""
    from isood.science.laid import LAID
    from isood.science.simulate import random_orthogonal

    base = tmp_path_factory.mktemp("planted")
    rng = np.random.default_rng(0)
    centres = rng.standard_normal((40, 32))
    x_id = _unit(centres[rng.integers(0, 30, 6000)] + 0.25 * rng.standard_normal((6000, 32)))
    x_test = _unit(centres[rng.integers(0, 40, 6000)] + 0.25 * rng.standard_normal((6000, 32)))
    LAID(random_orthogonal(32, seed=1)).save(base / "laid.safetensors")
    noise = _unit(np.random.default_rng(5).standard_normal((6000, 32)))
    return {"id": _feature_set(base / "id", x_id), "test": _feature_set(base / "test", x_test),
            "noise_id": _feature_set(base / "noise_id", noise[:4000]),
            "noise_test": _feature_set(base / "noise_test", noise[4000:]), "laid": base / "laid.safetensors"}


def _build(planted: dict, out: Path, *extra, id_key: str = "id", test_key: str = "test") -> list:
    return ["build-splits", "--id", planted[id_key], "--test", planted[test_key], "--laid", planted["laid"],
            "--levels", "4", "--na-threshold", "2", "--out", out, *extra]


def test_ann_report_matches_a_real_exact_build(planted, cli, tmp_path):
    """Guard: isood.features.ann.agreement.exact_agreement via isood.stages.splits.ann_summary. The reported share of
    images whose cell (and level) equals an exact build's holds, within its reported interval, the share counted
    against a real exact build of the same data; the grid's edges moved (the agreement at this build's own
    edges, all that was reported before, misses that)."""
    exact_out, approx_out = tmp_path / "exact", tmp_path / "approx"
    assert cli.invoke(_build(planted, exact_out)).exit_code == 0
    r = cli.invoke(_build(planted, approx_out, "--ann-recall", "0.9"))
    assert r.exit_code == 0, r.output
    exact = manifests.read(exact_out).frame("images").set_index("path")
    approx = manifests.read(approx_out).frame("images").set_index("path").loc[exact.index]
    ann = manifests.read(approx_out).meta["summary"]["ann"]
    truth = {a: float(np.mean(exact[f"{a}_level"] == approx[f"{a}_level"])) for a in ("sem", "cov")}
    truth["cell"] = float(np.mean(exact["cell"] == approx["cell"]))
    assert truth["cell"] < 0.995  # the approximation changes cells here: the test can tell a bad estimate
    lo, hi = ann["cell_agreement_ci"]
    assert lo <= truth["cell"] <= hi and lo <= ann["cell_agreement"] <= hi and ann["confidence"] == 0.95
    for a in ("sem", "cov"):
        lo, hi = ann["axes"][a]["level_agreement_ci"]
        assert lo <= truth[a] <= hi, (a, truth[a], ann["axes"][a])
    exact_edges = manifests.read(exact_out, kind="splits").axis_edges("cov")
    moved = float(np.max(np.abs(exact_edges - manifests.read(approx_out, kind="splits").axis_edges("cov"))))
    assert moved > 0 and ann["axes"]["cov"]["edge_shift"] > 0
    assert "CI" in r.output and f"{ann['cell_agreement']:.2%}" in r.output


def test_unreachable_ann_recall_says_what_it_needs_reached_and_what_to_pass(planted, cli, tmp_path):
    """Guard: isood.features.ann.tune.RecallOutOfReach (was "0.999 out of reach ... reaches 0.9993", and named the first
    axis only): the one line gives the recall the tuning sample needs, what each axis reached there (below it),
    and a target that runs on both axes."""
    line = cli.one_line_error(cli.invoke(_build(planted, tmp_path / "s", "--ann-recall", "0.99",
                                                id_key="noise_id", test_key="noise_test")))
    need = float(re.search(r"needs recall@1 >= ([\d.]+)", line).group(1))
    reached = {a: float(v) for a, v in re.findall(r"\b(sem|cov) ([\d.]+)", line)}
    suggested = re.search(r"pass --ann-recall ([\d.]+) or lower", line).group(1)
    assert set(reached) == {"sem", "cov"} and max(reached.values()) < need and 0.99 < need, line
    assert float(suggested) < min(reached.values()), line
    r = cli.invoke(_build(planted, tmp_path / "ok", "--ann-recall", suggested, id_key="noise_id",
                          test_key="noise_test"))
    assert r.exit_code == 0, r.output
    assert manifests.read(tmp_path / "ok").meta["summary"]["ann"]["target_recall"] == float(suggested)


# ================================================================================ publish: feature shards
class FakeHub:
    """Records the HfApi calls a publish makes."""

    def __init__(self):
        self.calls = []

    def create_repo(self, *args, **kwargs):
        self.calls.append(("create_repo", kwargs))

    def upload_folder(self, **kwargs):
        self.calls.append(("upload_folder", kwargs))
        return type("Commit", (), {"oid": "0" * 40, "commit_url": "https://hub.example/c"})()

    def upload_file(self, **kwargs):
        self.calls.append(("upload_file", kwargs))
        return type("Commit", (), {"oid": "1" * 40, "commit_url": "https://hub.example/m"})()

    def create_tag(self, repo_id, **kwargs):
        self.calls.append(("create_tag", kwargs))


@pytest.fixture(scope="module")
def splits_with_features(tmp_path_factory, tiny_clip_spec, tiny_images, image_dataset_factory):
    """build-splits from image folders (features extracted into features-id/ and features-test/), with a card."""
    import torch

    from isood.science.laid import LAID
    from isood.science.simulate import random_orthogonal
    from manifests import add_card

    torch.set_num_threads(1)
    base = tmp_path_factory.mktemp("publish")
    id_root = image_dataset_factory(base / "id_images", classes={"n01440764": 4, "n01443537": 4}, seed=7,
                                    corrupt=None)
    LAID(random_orthogonal(32, seed=2)).save(base / "laid.safetensors")
    from typer.testing import CliRunner

    from isood.cli import app

    out = base / "splits"
    r = CliRunner().invoke(app, ["build-splits", "--id", str(id_root), "--test", str(tiny_images), "--clip",
                                 tiny_clip_spec, "--laid", str(base / "laid.safetensors"), "--levels", "2",
                                 "--na-threshold", "1", "--out", str(out), "--cache-dir", str(base / "cache")])
    assert r.exit_code == 0, r.output
    add_card(out)
    return out


def _listed(output: str) -> list[str]:
    return [ln.split()[-1] for ln in output.splitlines() if re.match(r"^\s*[\d,]+\s+\S+$", ln)]


def test_publish_leaves_feature_shards_out_unless_asked(splits_with_features, cli, tmp_path):
    """Guard: manifests.hub.plan (uploaded features-test/, ~24 GB at IS-OOD's size, with no way to leave it out)."""
    from manifests import hub
    from manifests.card import is_feature_file

    root = splits_with_features
    files = {r["path"]: int(r["bytes"]) for r in manifests.read(root).meta["files"]}
    shards = {p: b for p, b in files.items() if p.startswith(("features-id/", "features-test/"))}
    assert shards and any(p.endswith(".npy") for p in shards)
    assert {p for p in files if is_feature_file(p)} == set(shards)
    r = cli.invoke(["publish", root, "--repo-id", "alice/splits", "--dry-run"])
    assert r.exit_code == 0, r.output
    assert sorted(_listed(r.stdout)) == sorted([p for p in files if p not in shards] + ["manifest.json"])
    assert f"left out: {len(shards)} feature files, {sum(shards.values()):,} bytes" in r.stdout
    assert "features-id/" in r.stdout and "--include-features" in r.stdout
    r = cli.invoke(["publish", root, "--repo-id", "alice/splits", "--dry-run", "--include-features"])
    assert r.exit_code == 0 and sorted(_listed(r.stdout)) == sorted([*files, "manifest.json"]), r.output
    assert "left out" not in r.stdout
    # the card says so, and lists the shards in no table
    card = (root / "README.md").read_text()
    assert f"{len(shards)} of them are feature shards ({sum(shards.values()):,} bytes" in card
    assert "--include-features" in card and not any(f"| {p} |" in card for p in shards)
    # what a real publish hands to the Hub: the same files as the dry run
    api = FakeHub()
    hub.publish(root, "alice/splits", api=api, echo=lambda s: None)
    calls = dict(api.calls)
    assert sorted(calls["upload_folder"]["allow_patterns"]) == sorted(p for p in files if p not in shards)
    # manifest.json last, listing only what was uploaded: a downloaded copy verifies (and says what it lacks)
    uploaded = json.loads(calls["upload_file"]["path_or_fileobj"])
    assert sorted(r["path"] for r in uploaded["files"]) == sorted(p for p in files if p not in shards)
    assert uploaded["published"]["left_out_files"] == len(shards)
    assert uploaded["published"]["full_content_sha256"] == manifests.read(root).content_sha256
    copy = tmp_path / "copy"
    assert cli.invoke(["publish", root, "--repo-id", "alice/splits", "--dry-run", "--out", copy]).exit_code == 0
    assert manifests.verify(copy).ok and [ln for ln in cli.invoke(["verify", copy]).output.splitlines()][0].startswith("OK")


def test_publish_of_a_feature_set_needs_include_features(tiny_images, tiny_clip_spec, cli, tmp_path):
    """Guard: manifests.hub.plan: a feature set's shards are its content: refused without --include-features."""
    from manifests import add_card

    out = tmp_path / "features"
    assert cli.invoke(["extract", "--images", tiny_images, "--clip", tiny_clip_spec, "--out", out, "--device",
                       "cpu"]).exit_code == 0
    add_card(out)
    line = cli.one_line_error(cli.invoke(["publish", out, "--repo-id", "alice/f", "--dry-run"]))
    assert "--include-features" in line and "feature" in line, line
    r = cli.invoke(["publish", out, "--repo-id", "alice/f", "--dry-run", "--include-features"])
    assert r.exit_code == 0 and any(p.endswith(".npy") for p in _listed(r.stdout)), r.output
