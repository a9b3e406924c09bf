"""The integrity matrix, "every manifest a dataset": every stage writes its dataset card, so
`datasets.load_dataset(DIR)` loads every manifest kind (its default config: exactly the rows of the kind's main
table) or fails with one clear line; every cell of a grid has a config (an N/A or empty one without rows), in
memory and streamed, with one split or several; `isood card` changes nothing on a fresh output and adds a card
to a plain manifest without bumping its version.

Every manifest is written here by its real stage (the CLI, or the stage's function where a fixture of the suite
builds it), from tiny inputs: a tiny open_clip, the tiny image folders, a tiny SDXL pipeline, a planted IS-OOD
release. Each row names its guard (``module.function``). The rows of the kinds whose stage already wrote its
card (the imports, `splits clean`, Syn-IS, the WordNet jobs, the evaluation) pin that behaviour; the others
(extract, its parts, build-splits, generate-syn's prompts and parts) and every other test fail without the fix.
"""

from __future__ import annotations

import hashlib
import os
import shutil
from pathlib import Path

os.environ.setdefault("HF_DATASETS_OFFLINE", "1")  # before `datasets` is imported: never try the Hub

import pyarrow.parquet as pq  # noqa: E402
import pytest  # noqa: E402
import yaml  # noqa: E402

import manifests  # noqa: E402
from manifests.card_layout import split_name  # noqa: E402

NA_THRESHOLD = 8  # the tiny test images fall in cov_0_sem_0 (9, measured), cov_1_sem_1 (7, N/A) and 2 empty cells
# (subset, (cov, sem)) -> entries of a planted IS-OOD release (train/ and val/ side by side, as the release has them)
RELEASE = {"train": {(0, 0): 6, (2, 5): 11, (7, 1): 3, (4, 4): 2}, "val": {(0, 0): 5, (2, 5): 1, (4, 4): 2}}


# ------------------------------------------------------------------------------------------------ helpers
@pytest.fixture
def load(tmp_path):
    """`datasets.load_dataset` with a private cache folder (offline)."""
    import datasets

    def _load(path, *args, **kw):
        return datasets.load_dataset(str(path), *args, cache_dir=str(tmp_path / "hf-cache"), **kw)

    return _load


def _run(cli, args: list) -> None:
    r = cli.invoke(args)
    assert r.exit_code == 0, r.output


def _configs(root: Path) -> dict[str, dict[str, str]]:
    front = yaml.safe_load((root / "README.md").read_text().split("---\n")[1])
    return {c["config_name"]: {d["split"]: d["path"] for d in c["data_files"]} for c in front["configs"]}


def files_of(root: Path) -> dict[str, str]:
    """sha256 of every file under ``root`` (isood's ``.~`` bookkeeping aside)."""
    return {p.relative_to(root).as_posix(): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(root.rglob("*")) if p.is_file() and not p.name.startswith(".~")}


def _one_line(e: BaseException) -> str:
    text = str(e).strip()
    assert text and "\n" not in text, repr(text)
    return text


def _write_release(root: Path, release=RELEASE) -> Path:
    """An IS-OOD-style release folder: a ``cov_{c}_sem_{s}.txt`` per cell of the grid and subset (empty lists for
    the cells without images, as the release ships all 64)."""
    for subset, cells in release.items():
        (root / subset).mkdir(parents=True, exist_ok=True)
        for c in range(8):
            for s in range(8):
                n = cells.get((c, s), 0)
                wnid = f"n{9100000 + 10 * c + s:08d}"
                (root / subset / f"cov_{c}_sem_{s}.txt").write_text(
                    "".join(f"./in21k_{subset}/{wnid}/{wnid}_{i}.JPEG\n" for i in range(n)))
    return root


# ------------------------------------------------------------------------------------------------ the outputs
@pytest.fixture(scope="module")
def world(tmp_path_factory, tiny_clip_spec, tiny_images, tiny_encoder, image_dataset_factory):
    """Inputs of the stages: ID images, a LAID file, a labels file, a planted release, a tiny SDXL pipeline."""
    import torch

    from isood.science.laid import LAID
    from isood.science.simulate import random_orthogonal

    torch.set_num_threads(1)
    root = tmp_path_factory.mktemp("datasets")
    image_dataset_factory(root / "id_images", classes={"n01440764": 4, "n01443537": 4}, seed=7, corrupt=None)
    LAID(random_orthogonal(tiny_encoder.embed_dim, seed=2)).save(root / "laid.safetensors")
    (root / "labels.txt").write_text("n01440764\nred fox\nsailboat\nvolcano\nteapot\nviolin\n")
    _write_release(root / "release" / "imagenet21k")
    (root / "imagenet_ood.txt").write_text("n02084071/a.JPEG\nn04399382/b.JPEG\nn00288000/c.JPEG\n")
    (root / "openood.txt").write_text("n02084071/a.JPEG 3\nn04399382/b.JPEG 4\n")
    (root / "candidates.txt").write_text("n00005787\nn00288000\nn02084071\nn02085620\n")
    from isood.dev.tiny_models import build_tiny_sdxl

    build_tiny_sdxl().save_pretrained(root / "sdxl")
    return root


@pytest.fixture(scope="module")
def outputs(world, cli, tiny_clip_spec, tiny_images, planted_evaluation):
    """kind row -> the manifest directory its stage wrote (the CLI; the evaluation: the planted demo's)."""
    out = world / "out"
    clip = ["--clip", tiny_clip_spec, "--device", "cpu"]
    _run(cli, ["extract", "--images", tiny_images, *clip, "--out", out / "features"])
    _run(cli, ["extract", "--images", tiny_images, *clip, "--shard-size", "8", "--num-shards", "2", "--shard-index",
               "0", "--out", out / "features-part"])
    _run(cli, ["build-splits", "--id", world / "id_images", "--test", tiny_images, *clip[:2], "--laid",
               world / "laid.safetensors", "--levels", "2", "--na-threshold", NA_THRESHOLD, "--cache-dir",
               world / "cache", "--out", out / "build-splits"])
    release = world / "release" / "imagenet21k"
    _run(cli, ["import", "isood-lists", release, "--out", out / "import-pooled"])
    _run(cli, ["import", "isood-lists", release, "--na-rule", "per-subset", "--out", out / "import-per-subset"])
    _run(cli, ["import", "imagenet-ood", world / "imagenet_ood.txt", "--out", out / "imagenet-ood"])
    _run(cli, ["import", "openood-imglist", world / "openood.txt", "--out", out / "openood-imglist"])
    _run(cli, ["wordnet", "filter", "--candidates", world / "candidates.txt", "--out", out / "class-filter"])
    _run(cli, ["wordnet", "audit", out / "import-pooled", "--out", out / "audit"])
    _run(cli, ["splits", "clean", out / "import-pooled", "--audit", out / "audit", "--out", out / "clean"])
    syn = ["generate-syn", "--labels", world / "labels.txt", *clip, "--laid", world / "laid.safetensors",
           "--id-features", out / "features", "--styles", "sdxl:anime,clay", "--per-cell", "1", "--pipeline",
           f"local-dir:{world / 'sdxl'}", "--size", "64", "--batch-size", "2"]
    _run(cli, [*syn, "--out", out / "syn-is"])
    _run(cli, [*syn, "--prompts-only", "--out", out / "syn-is-prompts"])
    _run(cli, [*syn, "--num-shards", "2", "--shard-index", "0", "--out", out / "syn-is-part"])
    found = {p.name: p for p in out.iterdir()}
    found["evaluation"] = planted_evaluation[3].manifest.root
    return found


# (row, kind, main table, key column whose values are compared, guard)
ROWS = [
    ("features", "features", "index", "path", "featurestore.extraction.write_features_manifest"),
    ("features-part", "features-part", "shards", "shard", "stages.extract.write_part"),
    ("build-splits", "splits", "images", "path", "stages.splits.write.write_splits"),
    ("import-pooled", "splits", "images", "path", "stages.interop.release.import_isood_lists"),
    ("import-per-subset", "splits", "images", "path", "stages.interop.release.import_isood_lists"),
    ("clean", "splits", "images", "path", "stages.clean"),
    ("syn-is", "syn-is", "images", "path", "isood.stages.syn.write.write_syn_manifest"),
    ("syn-is-prompts", "syn-is-prompts", "images", "prompt_id", "isood.stages.syn.write.write_syn_manifest"),
    ("syn-is-part", "syn-is-part", "images", "path", "isood.stages.syn.write.write_part"),
    ("class-filter", "class-filter", "classes", "wnid", "isood.stages.wordnet.jobs.run_filter"),
    ("audit", "audit", "classes", "wnid", "isood.stages.wordnet.jobs.run_audit"),
    ("imagenet-ood", "image-list", "images", "path", "stages.interop.imports"),
    ("openood-imglist", "image-list", "images", "path", "stages.interop.imports"),
    ("evaluation", "evaluation", "cell_metrics", "cell", "stages.evaluate.write"),
]


@pytest.mark.parametrize("row, kind, main, key", [pytest.param(*r[:4], id=f"{r[0]}-{r[4]}") for r in ROWS])
def test_every_manifest_kind_loads_as_its_main_table(outputs, load, row, kind, main, key):
    """The default config of each kind's card is its main table: the same rows (count, order, a column's values)
    and columns, split by source where the kind splits; loading writes nothing into the manifest."""
    root = outputs[row]
    m = manifests.read(root)
    assert m.kind == kind and "README.md" in {r["path"] for r in m.meta["files"]}
    want = m.frame(main)
    assert len(want) > 0, "the row needs a non-empty main table"
    ds = load(root)  # the default config
    sources = want["source"].astype(str) if "source" in want.columns else None
    default = "test" if kind in ("splits", "syn-is", "syn-is-prompts", "syn-is-part", "image-list") else "train"
    expected = ({default: want} if sources is None else
                {split_name(s, default): want[sources == s] for s in sorted(sources.unique())})
    assert sorted(ds) == sorted(expected)
    for split, rows in expected.items():
        got = ds[split].to_pandas()
        assert list(got.columns) == list(want.columns)
        assert len(got) == len(rows) and got[key].astype(str).tolist() == rows[key].astype(str).tolist()
    assert manifests.verify(root).ok


def test_a_manifest_without_rows_fails_with_one_line_or_streams_none(world, cli, tiny_clip_spec, tiny_images, load):
    """Guard: manifests.card_layout.resolve_empty. A job-array task that got no feature shard writes a part whose main
    table has no rows: `datasets` cannot build a split without rows, so loading it says so in one line (its own:
    a 0-row table written as one empty row group failed with an opaque DatasetGenerationError); streamed, it
    has the table's columns and no rows."""
    out = world / "empty-part"
    _run(cli, ["extract", "--images", tiny_images, "--clip", tiny_clip_spec, "--device", "cpu", "--shard-size", "8",
               "--num-shards", "4", "--shard-index", "3", "--out", out])
    m = manifests.read(out)
    assert m.kind == "features-part" and len(m.frame("shards")) == 0
    with pytest.raises(ValueError) as e:
        load(out)
    assert "corresponds to no data" in _one_line(e.value)
    streamed = load(out, streaming=True)["train"]
    assert list(streamed) == [] and list(streamed.features) == list(m.frame("shards").columns)


# ------------------------------------------------------------------------------------------------ grid cells
def _check_cells(root: Path, load, loaded_empty: int = 2) -> tuple[int, int]:
    """Every row of the `cells` table has a config: a measured (source, cell) exactly its images (the images
    table filtered by cell, in its order), an N/A or empty one no rows (streamed: none, the main table's columns;
    not streamed: `datasets`' one line; the files of the empty cells past the first ``loaded_empty`` are read
    with pyarrow, not loaded). Returns (measured, N/A) configs checked."""
    m = manifests.read(root)
    images, cells = m.frame("images"), m.frame("cells")
    configs = _configs(root)
    assert {c for c in configs if c.startswith("cov_")} == set(cells["cell"])
    by_source = "source" in cells.columns
    measured = na = 0
    for cell, rows in cells.groupby("cell", sort=True):
        if rows["na"].astype(bool).all() and (rows["n"] == 0).all() and loaded_empty <= 0:
            for rel in configs[cell].values():
                f = pq.ParquetFile(root / rel)
                assert f.metadata.num_rows == 0 and f.schema_arrow.names == list(images.columns)
            na += 1
            continue
        loaded_empty -= int((rows["n"] == 0).all())
        usable = rows[~rows["na"].astype(bool)]
        if len(usable):
            ds = load(root, cell)
            for rec in usable.itertuples():
                want = images[(images["cell"] == cell) & ((images["source"] == rec.source) if by_source else True)]
                got = ds[split_name(rec.source, "test") if by_source else "test"].to_pandas()
                assert len(got) == len(want) == rec.n and got["path"].tolist() == want["path"].tolist()
            assert sorted(ds) == sorted(split_name(s, "test") for s in usable["source"]) if by_source else ["test"]
            measured += 1
        else:
            ds = load(root, cell, streaming=True)
            splits = sorted(split_name(s, "test") for s in images["source"].unique()) if by_source else ["test"]
            assert sorted(ds) == splits
            for split in splits:
                assert list(ds[split]) == [] and list(ds[split].features) == list(images.columns)
            with pytest.raises(ValueError) as e:
                load(root, cell)
            assert "corresponds to no data" in _one_line(e.value)
            na += 1
    return measured, na


def test_build_splits_na_cells_have_empty_configs(outputs, load):
    """Guards: isood.kinds.grid_card.grid_cells (CardSpec.config_values) + manifests.card_layout.plan_configs: `load_dataset(DIR,
    "cov_1_sem_1")` of an N/A cell raised "BuilderConfig not found"; the card said N/A cells get no config."""
    root = outputs["build-splits"]
    cells = manifests.read(root).frame("cells").set_index("cell")
    assert cells.loc["cov_0_sem_0", "n"] >= NA_THRESHOLD and 0 < cells.loc["cov_1_sem_1", "n"] < NA_THRESHOLD
    assert _check_cells(root, load) == (1, 3)
    text = (root / "README.md").read_text()
    assert "get no config" not in text and "Every cell has a config" in text
    assert "cov_1_sem_1`: split `test` (data/configs/cov_1_sem_1/test.parquet, no rows)" in text


@pytest.mark.parametrize("row_group_rows", [2, 131072], ids=["row_groups_of_2", "one_row_group"])
def test_streamed_import_na_and_empty_cells_have_empty_configs(world, load, tmp_path, row_group_rows):
    """Guard: manifests.card_stream._plan (the main table of a release import is streamed, its configs cut in
    the same pass): every one of the 64 cells, pooled over train/ and val/, has a config: (0, 0) (6 + 5) and
    (2, 5) (11 + 1) their rows, the N/A (7, 1) and (4, 4) and the 60 empty cells none."""
    from isood.stages.interop import import_isood_lists

    m = import_isood_lists(world / "release" / "imagenet21k", tmp_path / "m", row_group_rows=row_group_rows)
    assert pq.ParquetFile(m.root / "data/images.parquet").metadata.num_row_groups == (
        -(-len(m.frame("images")) // row_group_rows))
    measured, na = _check_cells(m.root, load)
    usable = {c for c, n in (((c, s), sum(r.get((c, s), 0) for r in RELEASE.values())) for c in range(8)
                             for s in range(8)) if n >= 10}
    assert (measured, na) == (len(usable), 64 - len(usable)) == (2, 62)  # (0, 0): 11 and (2, 5): 12
    assert manifests.verify(m.root).ok


def test_per_subset_import_splits_na_cells_by_source(outputs, load):
    """Guard: manifests.card_layout.plan_configs with split_by: a cell measured in one subset keeps a config of that
    split only (loadable as it is); a cell N/A in every subset gets an empty split per subset."""
    root = outputs["import-per-subset"]
    configs = _configs(root)
    assert set(configs["cov_0_sem_0"]) == {"train", "val"}  # 6 and 5: N/A in both (pooled, 11 would be measured)
    assert set(configs["cov_2_sem_5"]) == {"train"}  # 11 in train (measured), 1 in val (N/A)
    assert load(root, "cov_2_sem_5")["train"].num_rows == 11
    assert set(configs["cov_4_sem_4"]) == {"train", "val"}  # 2 and 2: N/A in both
    measured, na = _check_cells(root, load)
    assert measured == 1 and na == 63


# ------------------------------------------------------------------------------------------------ isood card
def test_isood_card_on_a_fresh_build_splits_output_changes_nothing(outputs, cli, tmp_path):
    """Guard: manifests.card_stream.add_card (_card_is_current) + build-splits writing its card: `isood card` on
    a fresh output leaves every file as it is (same version, content hash, files and bytes)."""
    root = tmp_path / "splits"
    shutil.copytree(outputs["build-splits"], root)
    before, meta = files_of(root), manifests.read(root).meta
    _run(cli, ["card", root])
    after = manifests.read(root).meta
    assert (after["dataset_version"], after["content_sha256"]) == (meta["dataset_version"], meta["content_sha256"])
    assert files_of(root) == before


def test_isood_card_adds_a_card_to_a_plain_manifest_without_bumping_its_version(world, cli, tmp_path, load):
    """Guard: manifests.card_stream.add_card: a manifest written without card (an older isood's build-splits)
    gets its card and every cell config (N/A ones without rows), keeps its table files byte for byte, its content
    hash and its version; a second `isood card` changes nothing."""
    from isood.stages.splits import write_splits

    plain = manifests.read(world / "out" / "build-splits", kind="splits")
    root = tmp_path / "plain"
    write_splits(root, images=plain.images, cells=plain.cells, edges=plain.edges, config=plain.config,
                 argv=["isood", "build-splits"], card=False)
    before = manifests.read(root)
    assert "README.md" not in {r["path"] for r in before.meta["files"]}
    tables = {r["path"]: r["sha256"] for r in before.meta["files"] if r["path"].startswith("data/")}
    _run(cli, ["card", root])
    m = manifests.read(root)
    assert (m.dataset_version, m.content_sha256, len(m.meta["changelog"])) == (
        before.dataset_version, before.content_sha256, len(before.meta["changelog"]))
    assert {p: s for p, s in ((r["path"], r["sha256"]) for r in m.meta["files"]) if p in tables} == tables
    assert manifests.verify(root).ok
    assert _check_cells(root, load) == (1, 3)
    assert load(root)["test"]["path"] == plain.images["path"].tolist()
    again = files_of(root)
    _run(cli, ["card", root])
    assert files_of(root) == again
