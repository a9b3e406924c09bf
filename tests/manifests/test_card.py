import json
from pathlib import Path

import pyarrow.parquet as pq
import pytest
import yaml
from typer.testing import CliRunner

import manifests
from isood.cli import app
from isood.core.errors import ManifestError
from isood.stages.interop import import_isood_lists
from manifests import add_card
from manifests.card import dataset_card
from manifests.card_layout import config_layout

FIXTURE_V1 = next(p for p in Path(__file__).resolve().parents if (p / "pyproject.toml").is_file()) / "tests" / "data" / "v1_splits"
MAIN = {"splits": "images", "syn-is": "images", "class-filter": "classes", "audit": "classes", "features": "index"}


def _front_matter(root):
    text = (Path(root) / "README.md").read_text()
    assert text.startswith("---\n")
    return yaml.safe_load(text.split("---\n")[1])


def _config_names(root):
    return [c["config_name"] for c in _front_matter(root)["configs"]]


@pytest.mark.parametrize("kind", ["splits", "syn-is", "class-filter", "audit", "features"])
def test_every_kind_loads_offline_with_all_config_and_verifies(tmp_path, write_kind, load, kind):
    m = write_kind(kind, tmp_path / kind)
    assert m.kind == kind and manifests.verify(m.root).ok
    assert "README.md" in {f["path"] for f in m.meta["files"]}
    expected = m.frame(MAIN[kind])
    ds = load(m.root)  # the `all` config is the default
    (split,) = ds.keys()
    assert split == ("test" if kind in ("splits", "syn-is") else "train")
    got = ds[split].to_pandas()
    assert list(got.columns) == list(expected.columns)
    key = "path" if "path" in expected else "wnid"
    assert got[key].tolist() == expected[key].tolist()
    assert manifests.verify(m.root).ok  # loading wrote nothing into the manifest


@pytest.mark.parametrize("kind", ["splits", "syn-is"])
def test_cell_configs_return_exactly_the_cell_rows_and_na_cells_none(tmp_path, write_kind, load, kind):
    m = write_kind(kind, tmp_path / kind)
    images = m.frame("images")
    cells = m.frame("cells")
    usable = cells[~cells["na"]]
    assert {c for c in _config_names(m.root) if c.startswith("cov_")} == set(cells["cell"])  # every cell
    for rec in usable.itertuples():
        got = load(m.root, rec.cell)["test"].to_pandas()
        want = images[(images.cov_level == rec.cov_level) & (images.sem_level == rec.sem_level)]
        assert len(got) == rec.n
        assert got["path"].tolist() == want["path"].tolist()
        assert set(got["cov_level"]) == {rec.cov_level} and set(got["sem_level"]) == {rec.sem_level}
    na_cell = cells[cells["na"] & (cells["n"] > 0)]["cell"].iloc[0]  # an N/A cell with rows: its config has none
    assert list(load(m.root, na_cell, streaming=True)["test"]) == []
    with pytest.raises(ValueError, match="corresponds to no data"):  # `datasets` builds no split without rows
        load(m.root, na_cell)


def test_planted_cell_cov_2_sem_5_and_rows_without_level(tmp_path, worlds, load):
    m = worlds.write_splits(tmp_path / "s")
    cell = load(m.root, "cov_2_sem_5")["test"]
    assert cell.num_rows == worlds.PLANTED_CELLS[(2, 5)]
    assert set(cell["wnid"]) == {"n09000025"}
    everything = load(m.root)["test"]
    assert everything.num_rows == sum(worlds.PLANTED_CELLS.values()) + worlds.NO_LEVEL_ROWS


def test_class_filter_kept_and_dropped_configs(tmp_path, worlds, load):
    m = worlds.write_class_filter(tmp_path / "cf")
    classes = m.frame("classes")
    kept = load(m.root, "kept")["train"]
    dropped = load(m.root, "dropped")["train"]
    assert kept["wnid"] == ["n00288000"]  # dressage: the only clean candidate
    assert dropped["wnid"] == sorted(set(worlds.CLASS_FILTER_CANDIDATES) - {"n00288000"})
    assert dropped["rule"] == classes[classes["decision"] == "drop"]["rule"].tolist()
    assert _config_names(m.root) == ["all", "dropped", "kept", "summary"]


def test_card_states_counts_edges_provenance_and_licence(tmp_path, worlds):
    m = worlds.write_splits(tmp_path / "s")
    text = (m.root / "README.md").read_text()
    grid = text.split("## Counts per cell")[1].split("##")[0]
    row2 = next(line for line in grid.splitlines() if line.startswith("| 2 |"))
    assert row2.split("|")[2 + 5].strip() == "12"  # cov 2, sem 5
    row3 = next(line for line in grid.splitlines() if line.startswith("| 3 |"))
    assert row3.split("|")[2 + 1].strip() == "N/A (4)"
    assert "3 cells usable" in grid
    assert "| sem | 7 | 0.875 | 1 |" in text  # the last semantic level of the edges table
    assert m.meta["content_sha256"] in text
    assert "isood build-splits --out" in text
    assert "never redistributed" in text
    syn = worlds.write_syn_is(tmp_path / "syn")
    syn_text = (syn.root / "README.md").read_text()
    assert "Syn-IS images under `images/`" in syn_text and "local-dir:/tiny" in syn_text
    assert "never redistributed" not in syn_text


def test_card_only_points_at_files_the_manifest_has(tmp_path, worlds):
    m = worlds.write_splits(tmp_path / "plain", card=False)  # no per-cell config files
    tables = {name: m.frame(name) for name in m.tables}
    front = yaml.safe_load(dataset_card(m.meta, tables).split("---\n")[1])
    assert [c["config_name"] for c in front["configs"]] == ["all", "cells", "edges"]


def test_content_change_bumps_version_and_changelog_through_the_card_writer(tmp_path, worlds, load):
    root = tmp_path / "s"
    first = worlds.write_splits(root)
    again = worlds.write_splits(root)
    assert again.dataset_version == first.dataset_version == "1.0.0"
    assert len(again.meta["changelog"]) == 1
    # cov_2_sem_5 drops below the N/A threshold: content changes, its config keeps no rows
    cells = {**worlds.PLANTED_CELLS, (2, 5): 9}
    changed = worlds.write_splits(root, cells=cells, note="fewer images in cov_2_sem_5")
    assert changed.dataset_version == "1.1.0"
    assert [c["version"] for c in changed.meta["changelog"]] == ["1.0.0", "1.1.0"]
    assert changed.meta["changelog"][-1]["note"] == "fewer images in cov_2_sem_5"
    assert manifests.verify(root).ok
    assert pq.ParquetFile(root / "data/configs/cov_2_sem_5/test.parquet").metadata.num_rows == 0
    text = (root / "README.md").read_text()
    assert "(v1.1.0)" in text and "1.1.0 (" in text and "fewer images in cov_2_sem_5" in text
    assert "cov_2_sem_5" in _config_names(root)  # an N/A cell has an empty config
    assert list(load(root, "cov_2_sem_5", streaming=True)["test"]) == []
    with pytest.raises(ValueError, match="corresponds to no data"):
        load(root, "cov_2_sem_5")


def test_card_is_not_content(tmp_path, worlds):
    m = worlds.write_splits(tmp_path / "s")
    assert m.meta["content_sha256"] == manifests.store.content_hash(m.meta["files"])
    rewritten = worlds.write_splits(tmp_path / "s", argv=["isood", "build-splits", "--again"])  # only the card differs
    assert rewritten.dataset_version == "1.0.0"
    assert "isood build-splits --again" in (tmp_path / "s/README.md").read_text()


def test_add_card_to_a_plain_manifest(tmp_path, worlds, load):
    root = tmp_path / "plain"
    before = worlds.write_splits(root, card=False)
    lists = (root / "lists/cov_2_sem_5.txt").read_text()
    result = CliRunner().invoke(app, ["card", str(root)])
    assert result.exit_code == 0, result.output
    m = manifests.read(root)
    # the card and its config files are derived from the tables: content hash and version stay
    assert m.dataset_version == "1.0.0" and len(m.meta["changelog"]) == 1
    assert m.content_sha256 == before.content_sha256
    assert manifests.verify(root).ok
    assert (root / "lists/cov_2_sem_5.txt").read_text() == lists and lists.count("\n") == 12
    assert load(root, "cov_0_sem_0")["test"].num_rows == 15
    add_card(root)  # idempotent
    assert manifests.read(root).dataset_version == "1.0.0"


def test_writer_refuses_files_it_owns(tmp_path, worlds):
    with pytest.raises(ManifestError, match="README.md"):
        worlds.write_splits(tmp_path / "s", files={"README.md": "mine"})


def test_sources_become_splits_and_never_mix(tmp_path, worlds, load):
    m = import_isood_lists(worlds.write_release(tmp_path / "rel"), tmp_path / "m", na_rule="per-subset",
                           allow_missing=True)
    images = m.frame("images")
    layout = config_layout("splits", {t: m.frame(t) for t in m.tables})
    assert layout.configs["cov_2_sem_5"] == {"in21k_train": "data/configs/cov_2_sem_5/in21k_train.parquet",
                                             "in21k_val": "data/configs/cov_2_sem_5/in21k_val.parquet"}
    ds = load(m.root, "cov_2_sem_5")
    assert sorted(ds) == ["in21k_train", "in21k_val"]
    val = images[(images["source"] == "in21k-val") & (images["cell"] == "cov_2_sem_5")]
    assert ds["in21k_val"]["path"] == val["path"].tolist()
    assert load(m.root)["in21k_train"].num_rows == sum(worlds.RELEASE["in21k-train"].values())
    one = config_layout("splits", {"images": images[images["source"] == "syn-is"]})
    assert one.configs["all"] == {"syn_is": "data/images.parquet"}  # a single source is not copied


def test_a_cell_na_in_one_source_has_no_split_of_that_source(tmp_path, worlds, load):
    release = {"a": {(2, 5): 11}, "b": {(2, 5): 3, (0, 0): 10}}
    m = import_isood_lists(worlds.write_release(tmp_path / "rel", release=release), tmp_path / "m",
                           na_rule="per-subset", allow_missing=True)
    assert sorted(load(m.root, "cov_2_sem_5")) == ["a"]  # b has 3 images there: N/A for b
    assert sorted(load(m.root, "cov_0_sem_0")) == ["b"]
    assert sorted(load(m.root)) == ["a", "b"]


def test_the_frozen_pre_release_fixture_is_read_plain_and_refused_by_verify(tmp_path, load):
    """tests/data/v1_splits was written once by the pre-release writer, whose content hash also
    covered the per-config files: its tables still read (and load with `datasets`), but ``verify`` refuses it with
    one line on ``content_sha256`` (the one rule leaves derived files out), as does a verified read."""
    import hashlib

    from manifests.verify import content_hash

    m = manifests.read(FIXTURE_V1)
    assert m.meta["schema"] == {"name": "isood-manifest", "version": "1.0"}
    assert m.kind == "splits" and m.dataset_version == "1.0.0"
    images = m.frame("images")
    assert len(images) == 25 and images["path"].iloc[0] == "n09000000/n09000000_0.JPEG"
    assert m.frame("cells").set_index("cell").loc["cov_2_sem_5", "n"] == 12
    cell = load(FIXTURE_V1, "cov_2_sem_5")["test"]
    assert cell.num_rows == 12 and set(cell["sem_level"]) == {5}
    meta = json.loads((FIXTURE_V1 / "manifest.json").read_text())
    with_configs = sorted(f"{r['path']}\t{r['sha256']}" for r in meta["files"] if r["path"] != "README.md")
    assert meta["content_sha256"] == hashlib.sha256("\n".join(with_configs).encode()).hexdigest()
    assert meta["content_sha256"] != content_hash(meta["files"])
    report = manifests.verify(FIXTURE_V1)
    assert not report.ok and not (report.missing or report.extra or report.changed or report.invalid)
    assert [ln for ln in report.lines() if "content_sha256" in ln] and len(report.fields) == 1
    with pytest.raises(ManifestError) as info:
        manifests.read(FIXTURE_V1, verify="fast")
    assert "content_sha256" in str(info.value) and "\n" not in str(info.value)


@pytest.mark.parametrize("kind", ["splits", "syn-is", "class-filter", "audit"])
def test_the_tables_a_kind_declares_its_card_reads_draw_the_card_every_table_draws(tmp_path, write_kind, monkeypatch,
                                                                                  kind):
    """``CardSpec.reads`` (the grid kinds: cells, edges; decision kinds: none) must cover what the card callbacks
    read: the card drawn from those tables only is the card drawn from every table."""
    import dataclasses

    import manifests.card as card_module
    import manifests.card_layout as layout_module

    m = write_kind(kind, tmp_path / kind)
    tables = {name: m.table(name) for name in m.tables}
    declared = dataset_card(m.meta, tables, root=m.root)
    assert layout_module.card_spec(kind, tables).reads is not None
    real = layout_module.card_spec
    for module in (card_module, layout_module):
        monkeypatch.setattr(module, "card_spec", lambda k, t: dataclasses.replace(real(k, t), reads=None))
    assert dataset_card(m.meta, tables, root=m.root) == declared
    assert declared == (m.root / "README.md").read_text()  # and it is the card the writer wrote
