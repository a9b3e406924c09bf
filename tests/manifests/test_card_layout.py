"""The dataset card is laid out from the kind's CardSpec alone (manifests.card_layout knows no kind)."""

from pathlib import Path

import pandas as pd
import pytest
import yaml

import manifests
from isood.core.errors import ManifestError
from manifests.card import CONFIGS_DIR, write_with_card
from manifests.card_layout import config_layout, split_name
from manifests.schema import INT, STRING, CardSpec, KindSpec, TableSpec, register_kind

seen_meta = {}


def _allowed(tables, meta):
    seen_meta.update(meta)
    return {"a", ("s2", "b")}  # a: every split; b: split s2 only; c: none


register_kind(KindSpec(
    "card-test", writer="the card test", tables={"rows": TableSpec({"grp": STRING, "n": INT})},
    card=CardSpec(title="Card test", description="Rows for the card test.", main="rows", split="test",
                  split_by="src", config_by="grp", config_names={"a": "alpha"}, allowed_configs=_allowed,
                  sections=lambda meta, tables: [("Extra", f"{len(tables['rows'])} rows of {meta['kind']}\n")],
                  licence=lambda meta: "Use it kindly.\n")))


def _rows():
    return pd.DataFrame({"grp": ["a", "b", "c", "a", "b", "b"], "n": range(6), "src": ["s1", "s1", "s1", "s2", "s2", "s2"]})


def _front(root):
    return yaml.safe_load((root / "README.md").read_text().split("---\n")[1])


def test_configs_follow_main_split_by_config_by_and_allowed(tmp_path, load):
    more = pd.DataFrame({"k": [1, 2]})
    m = write_with_card(tmp_path / "m", kind="card-test", tables={"rows": _rows(), "more": more},
                        config={"threshold": 3}, argv=["test"])
    front = _front(m.root)
    configs = {c["config_name"]: {f["split"]: f["path"] for f in c["data_files"]} for c in front["configs"]}
    assert [c["config_name"] for c in front["configs"]] == ["all", "alpha", "b", "more"]  # partitions before others
    assert front["configs"][0]["default"] is True and front["pretty_name"] == "Card test"
    assert configs["all"] == {"s1": f"{CONFIGS_DIR}/all/s1.parquet", "s2": f"{CONFIGS_DIR}/all/s2.parquet"}
    assert configs["alpha"] == {"s1": f"{CONFIGS_DIR}/alpha/s1.parquet", "s2": f"{CONFIGS_DIR}/alpha/s2.parquet"}
    assert configs["b"] == {"s2": f"{CONFIGS_DIR}/b/s2.parquet"}  # allowed in s2 only
    assert configs["more"] == {"train": "data/more.parquet"}
    assert seen_meta["command"]["config"] == {"threshold": 3}  # the callback sees the manifest's config
    assert load(m.root, "b")["s2"]["n"] == [4, 5]
    assert load(m.root, "alpha")["s1"]["n"] == [0] and load(m.root, "alpha")["s2"]["n"] == [3]
    assert load(m.root)["s1"].num_rows == 3
    assert manifests.verify(m.root).ok


def test_sections_licence_and_description_come_from_the_spec(tmp_path):
    m = write_with_card(tmp_path / "m", kind="card-test", tables={"rows": _rows()}, config={})
    text = (m.root / "README.md").read_text()
    assert "# Card test (v1.0.0)\n\nRows for the card test." in text
    assert "## Extra\n\n6 rows of card-test" in text
    assert text.rstrip().endswith("## Licence\n\nUse it kindly.")
    assert text.index("## Extra") < text.index("## Provenance")


def test_a_kind_without_a_spec_gets_a_plain_card(tmp_path, load):
    m = write_with_card(tmp_path / "m", kind="no-such-kind", tables={"b": pd.DataFrame({"x": [1]}),
                                                                      "a": pd.DataFrame({"y": [2, 3]})}, config={})
    front = _front(m.root)
    assert [(c["config_name"], c["data_files"]) for c in front["configs"]] == [
        ("all", [{"split": "train", "path": "data/a.parquet"}]), ("b", [{"split": "train", "path": "data/b.parquet"}])]
    text = (m.root / "README.md").read_text()
    assert "# isood no-such-kind manifest" in text and "## Licence" not in text
    assert load(m.root)["train"]["y"] == [2, 3]


def test_config_layout_without_allowed_gives_every_value():
    layout = config_layout("no-such-kind", {"rows": _rows()})
    assert set(layout.configs) == {"all"} and layout.partitions == []  # no spec: no config_by


@pytest.mark.parametrize("source,name", [("", "test"), (None, "test"), ("in21k-val", "in21k_val"),
                                         ("a/b c", "a_b_c"), ("2024", "s_2024")])
def test_split_name(source, name):
    assert split_name(source, "test") == name


def test_clashing_split_names_are_refused():
    rows = _rows().assign(src=["x-y", "x_y", "x-y", "x_y", "x-y", "x_y"])
    with pytest.raises(ManifestError, match="x-y"):
        config_layout("card-test", {"rows": rows})


# ------------------------------------------------------------------- the card loads only what it reads
seen_tables = []

register_kind(KindSpec(
    "card-reads-test", writer="the card reads test", tables={"rows": TableSpec({"grp": STRING, "n": INT})},
    card=CardSpec(title="Reads test", description="Side tables.", main="rows", config_by="grp",
                  allowed_configs=lambda tables, meta: seen_tables.append(sorted(tables)) or None,
                  sections=lambda meta, tables: (seen_tables.append(sorted(tables))
                                                 or [("Small", f"{len(tables['small'])}\n")]),
                  reads=("small",))))


@pytest.mark.parametrize("main", ["in memory", "streamed"])
def test_side_tables_in_table_files_get_configs_and_only_the_read_ones_are_loaded(tmp_path, monkeypatch, main):
    import pyarrow as pa
    import pyarrow.parquet as pq

    import manifests.card_layout as layout_module
    from manifests.card_stream import MainTableStream, write_streamed

    rows, small, big = _rows(), pd.DataFrame({"k": [1, 2, 3]}), pd.DataFrame({"path": [f"p{i}" for i in range(50)]})
    root = tmp_path / "m"
    (root / "data").mkdir(parents=True)
    for name, df in (("small", small), ("big", big)):
        pq.write_table(pa.Table.from_pandas(df, preserve_index=False), root / f"data/{name}.parquet")
    read = []
    real = layout_module.pq.read_table
    monkeypatch.setattr(layout_module.pq, "read_table", lambda p, *a, **k: read.append(Path(p).name) or real(p, *a, **k))
    seen_tables.clear()
    side = {"small": "data/small.parquet", "big": "data/big.parquet"}
    if main == "streamed":
        s = MainTableStream(root, "card-reads-test", pa.Table.from_pandas(rows, preserve_index=False).schema)
        s.write(pa.Table.from_pandas(rows, preserve_index=False))
        m = write_streamed(root, kind="card-reads-test", stream=s, tables={}, table_files=side, config={})
    else:
        m = write_with_card(root, kind="card-reads-test", tables={"rows": rows}, table_files=side, config={})
    ref = write_with_card(tmp_path / "ref", kind="card-reads-test", tables={"rows": rows, "small": small, "big": big},
                          config={})
    assert _front(m.root)["configs"] == _front(ref.root)["configs"]  # `big` and `small` get their configs
    big_config = {"config_name": "big", "data_files": [{"split": "train", "path": "data/big.parquet"}]}
    assert big_config in _front(m.root)["configs"]
    assert "big.parquet" not in read  # never loaded: the kind's card does not read it
    assert all(names in (["rows", "small"], ["small"]) for names in seen_tables) and seen_tables, seen_tables
    assert "## Small\n\n3" in (m.root / "README.md").read_text()
    assert manifests.verify(m.root).ok
