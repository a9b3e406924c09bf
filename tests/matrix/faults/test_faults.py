"""The bad-input matrix, rows "faults": the real CLI in a subprocess, killed (SIGKILL) or interrupted (SIGINT) at a
chosen point, then rerun; two processes on one ``--out``; a full disk; a read-only ``--out``.

The fault is injected by a small driver (``DRIVER`` below, run as ``python driver.py FAULT ARGS...``): it wraps one
function of the code under test so that its Nth call sends the signal to its own process (or, for the two-writer
row, waits), then calls the ``isood`` entry point. No test hook lives in the production code.

| row                        | guard                                                                             |
|----------------------------|-----------------------------------------------------------------------------------|
| kill -9 / SIGINT, rerun    | extract: ``featurestore.extraction._reusable`` (content shard key) + ``write_shard`` (rows, then .npy, atomically); build-splits: the same, per feature set; generate-syn: ``generation.outputs.prepare_outputs`` (content keys, valid PNG); evaluate: ``evaluation.capture.OutputCache``; extract-gpu / evaluate-gpu: the same, with ``--decode gpu``, decoding processes and (evaluate) ``--precision bf16``; all: ``manifests.writing`` (the work waits in a staging folder beside --out, resumed by the rerun, swapped in when complete) |
| SIGINT: exit 130, one line | ``isood.cli._app.FriendlyGroup.invoke`` (``except KeyboardInterrupt``)                |
| second writer refused      | the lock beside --out (``isood.core.files.lock_path``) ``manifests.writing`` takes (``output_lock`` for exports) |
| --out of another kind, or foreign files | ``manifests.output.check_output``, before any work; the demo: ``isood.dev.demo.check_demo_out`` |
| disk full / read-only      | ``isood.cli._app.FriendlyGroup.invoke`` (``except OSError`` -> ``os_error_message``) + manifest.json last |

Byte-identical: every file of the rerun's ``--out`` equals the uninterrupted run's, and the two manifest.json
differ only in ``RUN_FIELDS`` (when and how long the run took, what it found done); both reference runs and
faulted runs use the same paths (the reference is moved aside), so recorded paths agree.
"""

from __future__ import annotations

import errno
import hashlib
import json
import re
import os
import shutil
import signal
import subprocess
import sys
import textwrap
from pathlib import Path, PurePosixPath

import pytest

DRIVER = textwrap.dedent('''
    import importlib, json, os, signal, sys, time

    def arm(fault):
        """Wrap fault["target"] ("module:attr" or "module:Class.method") so that its fault["nth"] call sends
        fault["signal"] (KILL or INT) to this process, or waits for FILE.go after creating FILE.ready (pause)."""
        module, _, attr = fault["target"].partition(":")
        owner, *path = attr.split(".")
        owner = getattr(importlib.import_module(module), owner) if path else importlib.import_module(module)
        name = path[0] if path else attr
        original, calls = getattr(owner, name), [0]

        def fire():
            if fault.get("pause"):
                open(fault["pause"] + ".ready", "w").close()
                while not os.path.exists(fault["pause"] + ".go"):
                    time.sleep(0.05)
                return
            os.kill(os.getpid(), getattr(signal, "SIG" + fault["signal"]))
            time.sleep(30)  # SIGKILL never returns; SIGINT raises KeyboardInterrupt in this sleep

        def wrapper(*args, **kwargs):
            calls[0] += 1
            hit = calls[0] == fault["nth"]
            if hit and fault.get("when") == "before":
                fire()
            result = original(*args, **kwargs)
            if hit and fault.get("when", "after") == "after":
                fire()
            return result

        setattr(owner, name, wrapper)

    # Ctrl-C as in a terminal: a test run started in the background (`make test &`) hands its children SIGINT
    # ignored, and Python then installs no KeyboardInterrupt handler.
    signal.signal(signal.SIGINT, signal.default_int_handler)
    fault = json.loads(sys.argv[1])
    if fault:
        arm(fault)
    sys.argv = ["isood", *sys.argv[2:]]
    from isood.cli import main
    main()
''')

#: manifest.json fields allowed to differ between an uninterrupted run and a resumed one: when the run happened
#: (and so the hash of the dataset card, which quotes it), how long it took; generate-syn also counts the images
#: and pipeline batches it found done (skipped) instead of generating them.
RUN_FIELDS = {"created", "files.README.md.sha256", "summary.seconds", "summary.laid_fit_seconds",
              "summary.images_per_second", "summary.generated", "summary.skipped", "summary.batches",
              "writer.version", "writer.own"}  # the version identity and its marker (manifests.ownership)


# ------------------------------------------------------------------------------------------------ helpers
def _env(cache: Path) -> dict[str, str]:
    return {**os.environ, "HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false", "OMP_NUM_THREADS": "1",
            "MKL_NUM_THREADS": "1", "ISOOD_CACHE_DIR": str(cache), "COLUMNS": "200"}


def run_cli(root: Path, args: list[str], fault: dict | None = None, **popen) -> subprocess.CompletedProcess:
    """The isood CLI in a subprocess (through the driver, with ``fault`` armed), in the scenario folder ``root``
    (``OUT`` and ``CACHE`` in ``args`` are ``root/out`` and ``root/cache``)."""
    args = [a.replace("{OUT}", str(root / "out")).replace("{CACHE}", str(root / "cache")) for a in args]
    cmd = [sys.executable, str(root.parent / "driver.py"), json.dumps(fault or {}), *args]
    return subprocess.run(cmd, env=_env(root / "cache"), capture_output=True, text=True, timeout=600, **popen)


def files_of(root: Path) -> dict[str, str]:
    """sha256 of every file under ``root`` but the ``.~`` bookkeeping ones."""
    return {p.relative_to(root).as_posix(): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(root.rglob("*")) if p.is_file() and not p.name.startswith(".~")}


def _final_name(rel: str) -> str:
    """A path inside a staging folder (``.~<name>.isood-new``, where an interrupted writer left its work) as the
    path it gets once the folder is swapped in."""
    return "/".join(re.sub(r"^\.~(.+)\.isood-new$", r"\1", part) for part in rel.split("/"))


def identities(root: Path, pattern: str) -> dict[str, tuple[int, int]]:
    """(inode, mtime) of the files matching ``pattern``, also where they wait in a staging folder (under their
    final name): a file kept by a rerun keeps both, as the swap renames folders and never copies."""
    found = {}
    for p in root.rglob("*"):
        rel = p.relative_to(root).as_posix()
        if p.is_file() and PurePosixPath(_final_name(rel)).match(pattern):
            found[_final_name(rel)] = (p.stat().st_ino, p.stat().st_mtime_ns)
    return found


def json_diff(a, b, prefix: str = "") -> set[str]:
    """Dotted paths where two JSON values differ."""
    if isinstance(a, dict) and isinstance(b, dict):
        return set().union(*(json_diff(a.get(k), b.get(k), f"{prefix}{k}.") for k in set(a) | set(b))) if (
            set(a) | set(b)) else set()
    return set() if a == b else {prefix.rstrip(".")}


def assert_same_outputs(out: Path, ref: Path) -> set[str]:
    """Every data file equal; every manifest.json equal but for RUN_FIELDS (returned: what differed)."""
    got, want = files_of(out), files_of(ref)
    assert sorted(got) == sorted(want)
    differ = sorted(rel for rel in got if got[rel] != want[rel] and Path(rel).name != "manifest.json"
                    and not (Path(rel).name == "README.md" and _card(out, rel) == _card(ref, rel)))
    assert not differ, differ
    fields: set[str] = set()
    for rel in (r for r in got if Path(r).name == "manifest.json"):
        a, b = ({**(m := json.loads((d / rel).read_text())), "files": {f["path"]: f for f in m["files"]}}
                for d in (out, ref))
        assert a["content_sha256"] == b["content_sha256"], rel
        fields |= json_diff(a, b)
    assert fields <= RUN_FIELDS, fields - RUN_FIELDS
    return fields


def _card(root: Path, rel: str) -> str:
    """A dataset card with its manifest's ``created`` time (a RUN_FIELD it quotes) blanked out."""
    text = (root / rel).read_text()
    manifest = (root / rel).parent / "manifest.json"
    return text.replace(json.loads(manifest.read_text())["created"], "<created>") if manifest.is_file() else text


def one_error_line(stderr: str, *, others: bool = False) -> str:
    """The one line a failed or interrupted command printed (its progress lines aside)."""
    from isood.core.progress import is_progress_line

    lines = [ln for ln in stderr.splitlines() if ln.strip() and not is_progress_line(ln)]
    assert "Traceback" not in stderr and "KeyboardInterrupt" not in stderr, stderr
    assert len(lines) == 1 or (others and lines), stderr  # others: a library's own loading messages came first
    return " ".join(lines[-1].split())


def _tiny_sdxl(folder: Path) -> Path:
    """The tiny SDXL pipeline (``isood.dev.tiny_models``), saved with save_pretrained."""
    from isood.dev.tiny_models import build_tiny_sdxl

    build_tiny_sdxl().save_pretrained(folder)
    return folder


def _timm_world(root: Path, ext: str = ".png") -> dict[str, Path]:
    """ID train / val image folders, test images (``ext``: .png, or .jpg for `--decode gpu`), a splits manifest
    over them, a test_resnet checkpoint."""
    import numpy as np
    import pandas as pd
    from PIL import Image

    from isood.science.grid import cell_name, cell_table, edges_table
    from isood.dev.tiny_models import build_tiny_classifier
    from isood.stages.splits import write_splits

    rng = np.random.default_rng(0)
    ids, oods = ["n01440764", "n01443537"], ["n02084071", "n04399382"]
    colour = {w: rng.integers(30, 225, 3) for w in ids + oods}

    def image(path: Path, w: str, shift: float = 0.0) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        Image.fromarray(np.clip(colour[w] + shift + rng.normal(0, 25, (16, 16, 3)), 0, 255).astype(np.uint8)).save(path)

    for w in ids:
        for i in range(4):
            image(root / "train" / w / f"{w}_{i}{ext}", w)
        for i in range(2):
            image(root / "val" / w / f"{w}_{i}{ext}", w)
    rows = []
    for c in range(2):
        for s in range(2):
            for i in range(3):
                w = (ids if s == 0 else oods)[i % 2]
                rel = f"{w}/{w}_c{c}s{s}_{i}{ext}"
                image(root / "test" / rel, w, 50.0 * c)
                rows.append({"path": rel, "wnid": w, "d_sem": 0.2 + s, "d_cov": 0.2 + c, "sem_level": s,
                             "cov_level": c, "cell": cell_name(c, s)})
    images = pd.DataFrame(rows)
    write_splits(root / "splits", images=images, cells=cell_table(images["cov_level"], images["sem_level"], 2, 2),
                 edges=edges_table([0.0, 1.0, 2.0], [0.0, 1.0, 2.0]), argv=["isood", "build-splits"],
                 config={"test_root": str(root / "test"), "n_levels": 2, "na_threshold": 2})
    build_tiny_classifier(root / "resnet.safetensors", num_classes=2)
    return {"train": root / "train", "val": root / "val", "splits": root / "splits", "ckpt": root / "resnet.safetensors"}


# ------------------------------------------------------------------------------------------------ scenarios
LABELS = ["tench", "goldfish", "dog", "teddy bear", "cat", "car", "house", "boat"]


@pytest.fixture(scope="module")
def inputs(tmp_path_factory, tiny_clip_spec, image_dataset_factory):
    """Everything the four long commands need, made once: images, a features manifest (the ID features of
    generate-syn), a LAID file, labels, the tiny SDXL pipeline, the tiny timm world."""
    from isood.features.featurestore import extract_features
    from isood.science.laid import LAID
    from isood.science.simulate import random_orthogonal

    root = tmp_path_factory.mktemp("fault-inputs")
    (root / "driver.py").write_text(DRIVER)
    images = image_dataset_factory(root / "images", classes={"n01440764": 5, "n01443537": 5, "n02084071": 4,
                                                             "n04399382": 3}, seed=5, corrupt=None)
    test_images = image_dataset_factory(root / "test_images", classes={"n02084071": 5, "n04399382": 5,
                                                                       "n01440764": 3}, seed=3, corrupt=None)
    extract_features(images, tiny_clip_spec, root / "features", batch_size=8, device="cpu", progress=False)
    LAID(random_orthogonal(32, seed=2)).save(root / "laid.safetensors")
    (root / "labels.txt").write_text("\n".join(LABELS) + "\n")
    return {"root": root, "images": images, "test_images": test_images, "clip": tiny_clip_spec,
            "features": root / "features", "laid": root / "laid.safetensors", "labels": root / "labels.txt",
            "sdxl": _tiny_sdxl(root / "sdxl"), "timm": _timm_world(root / "timm"),
            "timm_jpeg": _timm_world(root / "timm_jpeg", ".jpg")}


def _args(name: str, i: dict) -> list[str]:
    """The command line of each scenario; ``{OUT}`` / ``{CACHE}`` are filled in by run_cli."""
    small = ["--batch-size", "2", "--device", "cpu"]
    return {
        "extract": ["extract", "--images", str(i["images"]), "--clip", i["clip"], "--shard-size", "4",
                    "--workers", "0", *small, "--out", "{OUT}"],
        "build-splits": ["build-splits", "--id", str(i["images"]), "--test", str(i["test_images"]), "--clip",
                         i["clip"], "--labels", str(i["labels"]), "--triplets", "150", "--laid-steps", "30",
                         "--levels", "2", "--na-threshold", "2", "--shard-size", "4", "--workers", "0",
                         "--cache-dir", "{CACHE}", *small, "--out", "{OUT}"],
        "generate-syn": ["generate-syn", "--styles", "sdxl:anime,clay", "--labels", str(i["labels"]), "--clip",
                         i["clip"], "--laid", str(i["laid"]), "--id-features", str(i["features"]), "--per-cell", "1",
                         "--pipeline", f"local-dir:{i['sdxl']}", "--size", "64", "--steps", "1", *small,
                         "--out", "{OUT}"],
        "evaluate": ["evaluate", "--splits", str(i["timm"]["splits"]), "--id-test", str(i["timm"]["val"]),
                     "--id-train", str(i["timm"]["train"]), "--model", "test_resnet", "--checkpoint",
                     str(i["timm"]["ckpt"]), "--detectors", "msp,energy,knn:k=3", "--na-threshold", "2",
                     "--plot-metrics", "auroc", "--cache-dir", "{CACHE}", *small, "--out", "{OUT}"],
        # JPEGs decoded by the batched decode_jpeg path (on the CPU here), in decoding processes
        "extract-gpu": ["extract", "--images", str(i["images"]), "--clip", i["clip"], "--shard-size", "4",
                        "--workers", "2", "--decode", "gpu", *small, "--out", "{OUT}"],
        "evaluate-gpu": ["evaluate", "--splits", str(i["timm_jpeg"]["splits"]), "--id-test", str(i["timm_jpeg"]["val"]),
                         "--id-train", str(i["timm_jpeg"]["train"]), "--model", "test_resnet", "--checkpoint",
                         str(i["timm_jpeg"]["ckpt"]), "--detectors", "msp,energy,knn:k=3", "--na-threshold", "2",
                         "--plot-metrics", "auroc", "--cache-dir", "{CACHE}", "--decode", "gpu", "--precision",
                         "bf16", "--workers", "1", *small, "--out", "{OUT}"],
    }[name]


#: command -> (the work units a rerun must reuse (glob under the scenario folder), the SIGKILL fault, the SIGINT
#: fault). Each fault names the function whose Nth call is followed by the signal.
SCENARIOS = {
    "extract": ("out/features-*", {"target": "isood.features.featurestore.extraction:write_shard", "nth": 2},
                {"target": "isood.features.featurestore.extraction:write_shard", "nth": 3}),
    # the 17 ID files are shards 1-5 (calls 1-5), the test images shards 6-9: killed inside the test set
    "build-splits": ("out/features-*/features-*", {"target": "isood.features.featurestore.extraction:write_shard", "nth": 7},
                     {"target": "isood.stages.splits.job:train_laid", "nth": 1, "when": "before"}),
    # batches of 2: killed after the first image of the second batch
    "generate-syn": ("out/images/*/*.png", {"target": "generation.sdxl:write_image", "nth": 3},
                     {"target": "generation.sdxl:write_image", "nth": 4}),
    # SIGKILL while the evaluation manifest is being written (some of its files are there); SIGINT after the
    # second cached model output
    "evaluate": ("cache/**/*.safetensors", {"target": "manifests.store:atomic_write_bytes", "nth": 3},
                 {"target": "isood.classifiers.output_cache:OutputCache.save", "nth": 2}),
    "extract-gpu": ("out/features-*", {"target": "isood.features.featurestore.extraction:write_shard", "nth": 2},
                    {"target": "isood.features.featurestore.extraction:write_shard", "nth": 3}),
    "evaluate-gpu": ("cache/**/*.safetensors", {"target": "isood.classifiers.output_cache:OutputCache.save", "nth": 3},
                     {"target": "isood.classifiers.output_cache:OutputCache.save", "nth": 2}),
}


def _fresh_root(inputs, name: str) -> Path:
    """The folder every run of ``name`` uses (so that the paths recorded in its manifests agree), emptied."""
    root = inputs["root"] / f"run-{name}"
    shutil.rmtree(root, ignore_errors=True)
    root.mkdir()
    return root


@pytest.fixture(scope="module")
def references(inputs):
    """Per command, one uninterrupted run, moved aside to ``ref-<command>``, made on first use."""
    made: dict[str, Path] = {}

    def get(name: str) -> Path:
        if name not in made:
            root = _fresh_root(inputs, name)
            r = run_cli(root, _args(name, inputs))
            assert r.returncode == 0, r.stderr[-3000:]
            made[name] = root.rename(inputs["root"] / f"ref-{name}") / "out"
        return made[name]

    return get


@pytest.mark.parametrize("name", list(SCENARIOS))
def test_kill_9_then_rerun_gives_the_same_bytes(inputs, references, name):
    units, kill, _ = SCENARIOS[name]
    ref = references(name)
    root = _fresh_root(inputs, name)
    r = run_cli(root, _args(name, inputs), {**kill, "signal": "KILL"})
    assert r.returncode == -signal.SIGKILL, r.stderr[-3000:]
    assert not (root / "out" / "manifest.json").exists()  # nothing looks complete
    done = identities(root, units)
    r = run_cli(root, _args(name, inputs))
    assert r.returncode == 0, r.stderr[-3000:]
    fields = assert_same_outputs(root / "out", ref)
    kept = identities(root, units)
    assert done and all(kept.get(rel) == ident for rel, ident in done.items())  # the work before the kill was reused
    print(f"\n{name}: kill -9 after call {kill['nth']} of {kill['target']}: {len(done)} unit files reused; "
          f"manifest.json differs only in {sorted(fields)}")


@pytest.mark.parametrize("name", list(SCENARIOS))
def test_sigint_stops_cleanly_and_a_rerun_resumes(inputs, references, name):
    units, _, interrupt = SCENARIOS[name]
    ref = references(name)
    root = _fresh_root(inputs, name)
    r = run_cli(root, _args(name, inputs), {**interrupt, "signal": "INT"})
    assert r.returncode == 130, r.stderr[-3000:]
    one_error_line(r.stderr, others=name == "generate-syn")  # diffusers reports its pipeline loading on stderr
    assert not (root / "out" / "manifest.json").exists()
    done = identities(root, units)
    r = run_cli(root, _args(name, inputs))
    assert r.returncode == 0, r.stderr[-3000:]
    fields = assert_same_outputs(root / "out", ref)
    kept = identities(root, units)
    assert done and all(kept.get(rel) == ident for rel, ident in done.items())
    print(f"\n{name}: SIGINT after call {interrupt['nth']} of {interrupt['target']}: {len(done)} unit files "
          f"reused; manifest.json differs only in {sorted(fields)}")


# ------------------------------------------------------------------------------------------------ two writers
def test_a_second_process_on_the_same_out_is_refused(inputs, references):
    """Two real `isood extract` processes on one --out: the first paused after its first shard, the second refused
    in one line naming the first's pid; the first then finishes with the bytes of an undisturbed run."""
    ref = references("extract")
    root = _fresh_root(inputs, "extract")
    gate = root / "gate"
    first = subprocess.Popen(
        [sys.executable, str(inputs["root"] / "driver.py"),
         json.dumps({"target": "isood.features.featurestore.extraction:write_shard", "nth": 1, "pause": str(gate)}),
         *[a.replace("{OUT}", str(root / "out")) for a in _args("extract", inputs)]],
        env=_env(root / "cache"), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        for _ in range(1200):
            if Path(f"{gate}.ready").exists() or first.poll() is not None:
                break
            __import__("time").sleep(0.1)
        assert Path(f"{gate}.ready").exists(), first.communicate()[1][-3000:]
        second = run_cli(root, _args("extract", inputs))
        assert second.returncode == 2, second.stderr[-3000:]
        line = one_error_line(second.stderr)
        assert str(root / "out") in line and f"pid {first.pid}" in line, line
    finally:
        Path(f"{gate}.go").touch()
        _, err = first.communicate(timeout=600)
    assert first.returncode == 0, err[-3000:]
    assert_same_outputs(root / "out", ref)


@pytest.fixture(scope="module")
def writers(inputs):
    """Every command that writes an --out, with inputs that let it run to the end: ``name -> args(out)``."""
    from isood.stages.extract import ExtractOptions, run_extract
    from isood.stages.wordnet.jobs import run_audit

    root, timm = inputs["root"], inputs["timm"]
    for k in range(2):
        run_extract(ExtractOptions(images=inputs["images"], clip=inputs["clip"], out=root / f"part{k}", batch_size=8,
                                   shard_size=4, device="cpu", num_shards=2, shard_index=k, progress=False))
    run_audit(timm["splits"], "1k", out=root / "audit")
    for c, s in ((0, 0), (0, 1), (1, 0), (1, 1)):
        (root / "release" / f"cov_{c}_sem_{s}.txt").parent.mkdir(exist_ok=True)
        (root / "release" / f"cov_{c}_sem_{s}.txt").write_text(f"n02084071/x{c}{s}.JPEG\nn04399382/y{c}{s}.JPEG\n")
    (root / "ood.txt").write_text("n02084071/n02084071_1.JPEG\nn04399382/n04399382_2.JPEG\n")
    (root / "imglist.txt").write_text("n02084071/a.JPEG 0\nn04399382/b.JPEG 1\n")
    (root / "candidates.txt").write_text("n00288000\nn02084071\nn02085620\n")
    i, feats = inputs, str(inputs["features"])
    return {
        "extract": lambda o: ["extract", "--images", str(i["images"]), "--clip", i["clip"], "--device", "cpu",
                              "--workers", "0", "--out", o],
        "merge": lambda o: ["merge", str(root / "part0"), str(root / "part1"), "--out", o],
        "build-splits": lambda o: ["build-splits", "--id", feats, "--test", feats, "--laid", str(i["laid"]),
                                   "--levels", "2", "--na-threshold", "2", "--out", o],
        "generate-syn": lambda o: ["generate-syn", "--styles", "sdxl:anime", "--labels", str(i["labels"]), "--clip",
                                   i["clip"], "--laid", str(i["laid"]), "--id-features", feats, "--prompts-only",
                                   "--device", "cpu", "--out", o],
        "evaluate": lambda o: _args("evaluate", i)[:-2] + ["--out", o],
        "splits clean": lambda o: ["splits", "clean", str(timm["splits"]), "--audit", str(root / "audit"),
                                   "--out", o],
        "import isood-lists": lambda o: ["import", "isood-lists", str(root / "release"), "--levels", "2", "--out", o],
        "import imagenet-ood": lambda o: ["import", "imagenet-ood", str(root / "ood.txt"), "--out", o],
        "import openood-imglist": lambda o: ["import", "openood-imglist", str(root / "imglist.txt"), "--out", o],
        "export openood": lambda o: ["export", "openood", str(timm["splits"]), "--out", o],
        "wordnet filter": lambda o: ["wordnet", "filter", "--candidates", str(root / "candidates.txt"), "--out", o],
        "wordnet audit": lambda o: ["wordnet", "audit", str(root / "ood.txt"), "--out", o],
        "publish --dry-run": lambda o: ["publish", str(timm["splits"]), "--repo-id", "someone/isood-test",
                                        "--dry-run", "--out", o],
        "card": lambda o: ["card", o],  # writes into the manifest folder itself
        "demo": lambda o: ["demo", "--out", o],
    }


def _target(inputs, name: str, out: Path) -> Path:
    """The folder a command writes: --out, or for `card` a copy of a manifest."""
    if name == "card":
        shutil.copytree(inputs["features"], out)
    return out


def _invoke(args: list[str]):
    import torch
    from typer.testing import CliRunner

    from isood.cli import app

    torch.set_num_threads(1)
    return CliRunner().invoke(app, [a.replace("{CACHE}", str(Path(args[-1]).parent / "cache")) for a in args])


WRITERS = ["extract", "merge", "build-splits", "generate-syn", "evaluate", "splits clean", "import isood-lists",
           "import imagenet-ood", "import openood-imglist", "export openood", "wordnet filter", "wordnet audit",
           "publish --dry-run", "card", "demo"]


@pytest.mark.parametrize("name", WRITERS)
def test_every_writer_takes_the_out_lock(inputs, writers, tmp_path, name):
    """guard: the lock ``manifests.writing`` takes for every manifest stage (``output_lock`` for exports and
    receipts), on the one lock file beside ``--out`` (``isood.core.files.lock_path``)"""
    from isood.core.files import lock_path

    out = _target(inputs, name, tmp_path / "out")
    before = files_of(out) if out.exists() else {}
    holder = subprocess.Popen([sys.executable, "-c", (
        "import time; from isood.core.files import output_lock\n"
        f"with output_lock({str(out)!r}):\n    print('locked', flush=True); time.sleep(120)\n")],
        stdout=subprocess.PIPE, text=True, env=_env(tmp_path / "cache"))
    try:
        assert holder.stdout.readline().strip() == "locked"
        r = _invoke(writers[name](str(out)))
        assert r.exit_code == 2, r.output[-3000:]
        line = one_error_line(r.stderr)
        assert str(out) in line and f"pid {holder.pid}" in line, line
        assert files_of(out) == before and lock_path(out).is_file()
        assert not [p for p in out.parent.iterdir() if p.name.endswith(".isood-new")]  # refused before any staging
    finally:
        holder.kill()
        holder.wait()


# -------------------------------------------------------------------------------------------------------- --out
#: The commands that write a manifest, and a manifest of another kind for each (it must not be replaced).
MANIFEST_WRITERS = [w for w in WRITERS if w not in ("export openood", "publish --dry-run", "card", "demo")]


def _other_kind(inputs, name: str, out: Path) -> Path:
    """A copy of a manifest that ``name`` does not write: the features manifest, or for the features writers the
    timm world's splits manifest."""
    src = inputs["timm"]["splits"] if name in ("extract", "merge") else inputs["features"]
    shutil.copytree(src, out)
    return out


@pytest.mark.parametrize("name", MANIFEST_WRITERS)
def test_an_out_holding_another_kind_is_refused_and_left_whole(inputs, writers, tmp_path, name):
    """guard: ``manifests.output.check_output`` (kind), called by ``manifests.writing`` before any work"""
    out = _other_kind(inputs, name, tmp_path / "out")
    before = files_of(out)
    r = _invoke(writers[name](str(out)))
    assert r.exit_code == 2, r.output[-3000:]
    line = one_error_line(r.stderr)
    assert str(out) in line and "manifest, not" in line, line
    assert files_of(out) == before and not list(tmp_path.glob(".~*.isood-new"))


@pytest.mark.parametrize("name", MANIFEST_WRITERS + ["demo"])
def test_an_out_holding_foreign_files_is_refused_and_left_whole(inputs, writers, tmp_path, name):
    """guard: ``manifests.output.check_output`` (not a manifest) / ``isood.dev.demo.check_demo_out``"""
    out = tmp_path / "out"
    out.mkdir()
    (out / "notes.txt").write_text("mine\n")
    r = _invoke(writers[name](str(out)))
    assert r.exit_code == 2, r.output[-3000:]
    line = one_error_line(r.stderr)
    assert "notes.txt" in line, line
    assert files_of(out) == {"notes.txt": hashlib.sha256(b"mine\n").hexdigest()}


# ------------------------------------------------------------------------------------------------ full / read-only disks
def _mount_tmpfs(path: Path, options: str) -> None:
    """A tmpfs at ``path`` (removed at the end of the test); skipped, with the reason, where it cannot be had."""
    if os.geteuid() != 0:
        pytest.skip("a full or read-only disk is simulated with a tmpfs mount, which needs root")
    path.mkdir(parents=True, exist_ok=True)
    r = subprocess.run(["mount", "-t", "tmpfs", "-o", options, "tmpfs", str(path)], capture_output=True, text=True)
    if r.returncode:
        pytest.skip(f"cannot mount a tmpfs in this container: {r.stderr.strip() or r.returncode}")


@pytest.fixture
def mounts():
    made: list[Path] = []

    def mount(path: Path, options: str) -> Path:
        _mount_tmpfs(path, options)
        made.append(path)
        return path

    yield mount
    for path in reversed(made):
        subprocess.run(["umount", "-l", str(path)], capture_output=True)


@pytest.mark.parametrize("name", ["extract", "build-splits", "generate-syn", "evaluate"])
def test_a_full_disk_is_one_line_and_leaves_no_manifest(inputs, mounts, tmp_path, name):
    """guard: ``FriendlyGroup.invoke``'s ``except OSError`` (ENOSPC -> one line) and manifest.json written last"""
    disk = mounts(tmp_path / "disk", "size=16k")  # four pages: a few files, then ENOSPC
    out = disk / "out"
    args = _args(name, inputs)
    if name == "generate-syn":
        args = args[:-2] + ["--size", "64", "--out", "{OUT}"]
    r = _invoke([a.replace("{OUT}", str(out)) for a in args])
    assert r.exit_code == 2, r.output[-3000:]
    line = one_error_line(r.stderr, others=name == "generate-syn")
    assert os.strerror(errno.ENOSPC) in line and str(disk) in line, line
    assert not (out / "manifest.json").exists() and not list(out.rglob(".~*.tmp"))
    subprocess.run(["mount", "-o", "remount,size=64m", str(disk)], check=True)  # space freed: the rerun finishes
    r = _invoke([a.replace("{OUT}", str(out)) for a in args])
    assert r.exit_code == 0, r.output[-3000:]
    assert _invoke(["verify", str(out)]).exit_code == 0


@pytest.mark.parametrize("name, exists", [(w, False) for w in WRITERS] + [("extract", True), ("card", True)])
def test_a_read_only_out_is_one_line(inputs, writers, mounts, tmp_path, name, exists):
    """guard: ``FriendlyGroup.invoke``'s ``except OSError`` (EROFS -> one line naming the path)"""
    disk = mounts(tmp_path / "ro", "size=1m")
    out = disk / "out"
    if exists:
        _target(inputs, name, out).mkdir(exist_ok=True)
    before = files_of(disk)
    subprocess.run(["mount", "-o", "remount,ro", str(disk)], check=True)
    r = _invoke(writers[name](str(out)))
    assert r.exit_code == 2, r.output[-3000:]
    line = one_error_line(r.stderr)
    if name == "card" and not exists:  # card writes into an existing manifest: a missing one is refused as such
        assert "no manifest.json" in line and str(out) in line, line
    else:
        assert os.strerror(errno.EROFS) in line and str(out) in line, line
    assert files_of(disk) == before
