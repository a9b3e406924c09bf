"""Streaming writes (manifests.stream, manifests.card_stream) against the in-memory writers as the reference."""

import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import yaml

import manifests
from isood.core.errors import ManifestError
from manifests.card import write_with_card
from manifests.card_stream import MainTableStream, write_streamed
from manifests.schema import INT, STRING, CardSpec, KindSpec, TableSpec, register_kind
from manifests.stream import ParquetStream, key_counts, partition_parquet

register_kind(KindSpec(
    "stream-test", writer="the stream test",
    tables={"rows": TableSpec({"grp": STRING, "n": INT}), "extra": TableSpec({"k": INT})},
    card=CardSpec(title="Stream test", description="Rows for the stream test.", main="rows", split="test",
                  split_by="src", config_by="grp", config_names={"a": "alpha"},
                  allowed_configs=lambda tables, meta: {"a", "c", ("s2", "b")} if len(tables["extra"]) else None)))


def _rows(n=30, sources=("s1", "s2")):
    return pa.table({"grp": [["a", "b", "c", "d"][i % 4] for i in range(n)], "n": list(range(n)),
                     "src": [sources[(i // 3) % len(sources)] for i in range(n)]})


def test_parquet_stream_row_groups_do_not_depend_on_the_pieces(tmp_path):
    table = _rows(100)
    out = {}
    for sizes in ((100,), (1, 7, 50, 42), (33, 33, 34)):
        s = ParquetStream(tmp_path / f"{sizes}.parquet", table.schema, row_group_rows=16)
        start = 0
        for k in sizes:
            s.write(table.slice(start, k))
            start += k
        assert not (tmp_path / f"{sizes}.parquet").exists()  # staged until committed
        assert s.commit() == 100
        out[sizes] = (tmp_path / f"{sizes}.parquet").read_bytes()
    assert len(set(out.values())) == 1
    meta = pq.ParquetFile(tmp_path / "(100,).parquet").metadata
    assert [meta.row_group(i).num_rows for i in range(meta.num_row_groups)] == [16] * 6 + [4]
    assert pq.read_table(tmp_path / "(100,).parquet").equals(table)


def test_parquet_stream_abort_and_bad_pieces_leave_nothing(tmp_path):
    table = _rows(10)
    with pytest.raises(RuntimeError):
        with ParquetStream(tmp_path / "t.parquet", table.schema) as s:
            s.write(table)
            raise RuntimeError("boom")
    assert list(tmp_path.iterdir()) == []
    with ParquetStream(tmp_path / "t.parquet", table.schema) as s:
        with pytest.raises(ManifestError, match="t.parquet"):
            s.write(pa.table({"other": [1]}))
        s.write(table.select(["src", "n", "grp"]))  # columns in another order are fine
    assert pq.read_table(tmp_path / "t.parquet").equals(table)


def test_key_counts_and_partition_match_pandas(tmp_path):
    table = _rows(50)
    pq.write_table(table, tmp_path / "t.parquet", row_group_size=7)
    df = table.to_pandas()
    assert key_counts(tmp_path / "t.parquet", ["src", "grp"]) == df.groupby(["src", "grp"]).size().to_dict()
    assert key_counts(tmp_path / "t.parquet", [None, "grp"]) == {("", g): n for g, n in df.groupby("grp").size().items()}
    written = partition_parquet(tmp_path / "t.parquet", ["src", "grp"],
                                {("s1", "a"): [tmp_path / "x.parquet"], ("s2", "a"): [tmp_path / "x.parquet",
                                                                                     tmp_path / "y.parquet"]})
    x = pq.read_table(tmp_path / "x.parquet").to_pandas()
    pd.testing.assert_frame_equal(x, df[df["grp"] == "a"].reset_index(drop=True))  # row order kept
    assert written[tmp_path / "y.parquet"] == int(((df["grp"] == "a") & (df["src"] == "s2")).sum())


def _configs(root):
    front = yaml.safe_load((root / "README.md").read_text().split("---\n")[1])
    return {c["config_name"]: {d["split"]: d["path"] for d in c["data_files"]} for c in front["configs"]}


@pytest.mark.parametrize("sources", [("s1", "s2"), ("s1",)])
@pytest.mark.parametrize("how", ["stream", "table_files"])
def test_streamed_card_equals_the_in_memory_card(tmp_path, sources, how):
    rows, extra = _rows(40, sources), pd.DataFrame({"k": [1, 2]})
    ref = write_with_card(tmp_path / "ref", kind="stream-test", tables={"rows": rows, "extra": extra},
                          config={"x": 1}, argv=["t"])
    root = tmp_path / "new"
    if how == "stream":
        s = MainTableStream(root, "stream-test", rows.schema, row_group_rows=8, plain_columns=["n"])
        for lo in range(0, 40, 11):
            s.write(rows.slice(lo, 11))
        m = write_streamed(root, kind="stream-test", stream=s, tables={"extra": extra}, config={"x": 1},
                           argv=["t"])
    else:
        pq.write_table(rows, (root / "data").mkdir(parents=True) or root / "data/rows.parquet", row_group_size=9)
        m = write_streamed(root, kind="stream-test", tables={"extra": extra}, table_files={"rows": "data/rows.parquet"},
                           config={"x": 1}, argv=["t"])
    assert _configs(m.root) == _configs(ref.root)
    for config, splits in _configs(ref.root).items():
        for rel in splits.values():
            pd.testing.assert_frame_equal(pq.read_table(root / rel).to_pandas(), pq.read_table(ref.root / rel).to_pandas(),
                                          check_dtype=False)
    assert manifests.verify(root).ok and not list((root / "data/configs").glob(".~*"))
    assert sorted(p.name for p in (root / "data/configs").iterdir()) == sorted(
        p.name for p in (ref.root / "data/configs").iterdir())  # the unused copies (d, b in s1) are gone
    assert m.meta["tables"]["rows"]["rows"] == 40


def test_a_main_table_in_table_files_needs_its_layout(tmp_path):
    (tmp_path / "data").mkdir()
    pq.write_table(_rows(4), tmp_path / "data/rows.parquet")
    with pytest.raises(ManifestError, match="write_streamed"):
        write_with_card(tmp_path, kind="stream-test", tables={"extra": pd.DataFrame({"k": [1]})},
                        table_files={"rows": "data/rows.parquet"}, config={})


def test_manifest_batches_reads_row_groups(tmp_path):
    rows = _rows(40)
    s = MainTableStream(tmp_path, "stream-test", rows.schema, row_group_rows=16)
    s.write(rows)
    m = write_streamed(tmp_path, kind="stream-test", stream=s, tables={"extra": pd.DataFrame({"k": [1]})}, config={})
    parts = list(manifests.read(tmp_path).batches("rows", columns=["n"]))
    assert [p.num_rows for p in parts] == [16, 16, 8] and parts[0].column_names == ["n"]
    assert pa.concat_tables(parts).column("n").to_pylist() == list(range(40)) and m.kind == "stream-test"


def test_a_table_streamed_in_whole_table_row_groups_has_the_bytes_it_had_written_whole(tmp_path):
    """``WHOLE_TABLE_ROWS``: a side table moved from the in-memory writer (``parquet_bytes``) to a stream keeps
    its bytes (so its content hash and dataset version), whatever the pieces; more than one row group here."""
    import numpy as np
    import pyarrow.compute as pc

    from manifests.card_stream import WHOLE_TABLE_ROWS
    from manifests.store import parquet_bytes

    n = WHOLE_TABLE_ROWS + 70_001
    rng = np.random.default_rng(0)
    table = pa.table({"n": rng.integers(0, 1000, n), "s": pc.cast(pa.array(rng.integers(0, 10**6, n)), pa.string())})
    with ParquetStream(tmp_path / "t.parquet", table.schema, row_group_rows=WHOLE_TABLE_ROWS) as s:
        for lo, hi in [(0, 1), (1, 250_000), (250_000, 250_000), (250_000, 1_100_000), (1_100_000, n)]:
            s.write(table.slice(lo, hi - lo))
    assert (tmp_path / "t.parquet").read_bytes() == parquet_bytes(table)
    assert pq.ParquetFile(tmp_path / "t.parquet").num_row_groups == 2
