"""L1 manifest kinds: schema checks by type family, typed views, wrong kinds refused in one line."""

import pandas as pd
import pyarrow as pa
import pytest

import manifests
from isood.core.errors import ManifestError, SchemaError
from manifests.schema import FLOAT, INT, STRING, KindSpec, TableSpec, check_schema, register_kind
from manifests.store import ManifestView

register_kind(KindSpec("test-kind", writer="the test writer",
                       tables={"rows": TableSpec({"name": STRING, "n": INT, "x": FLOAT}),
                               "extra": TableSpec({"a": INT}, optional=True)},
                       fields={"owner": "command.config.owner"}))


def _schema(**cols):
    return pa.schema([(k, v) for k, v in cols.items()])


@pytest.mark.parametrize("schemas,ok,named", [
    ({"rows": _schema(name=pa.string(), n=pa.int32(), x=pa.float32())}, True, None),  # any width of the family
    ({"rows": _schema(name=pa.large_string(), n=pa.int64(), x=pa.float64(), more=pa.bool_())}, True, None),
    ({"rows": _schema(name=pa.null(), n=pa.int64(), x=pa.float64())}, True, None),  # all-missing column
    ({"rows": _schema(name=pa.string(), n=pa.float64(), x=pa.float64())}, False, "'n'"),
    ({"rows": _schema(name=pa.string(), x=pa.float64())}, False, "'n'"),
    ({"other": _schema(a=pa.int64())}, False, "'rows'"),
    ({"rows": _schema(name=pa.string(), n=pa.int8(), x=pa.float16()), "extra": _schema(b=pa.int64())}, False, "'a'"),
])
def test_check_schema_by_type_family(schemas, ok, named):
    if ok:
        check_schema("test-kind", schemas)
        return
    with pytest.raises(SchemaError) as e:
        check_schema("test-kind", schemas, "somewhere")
    msg = str(e.value)
    assert named in msg and "\n" not in msg and "the test writer" in msg


def test_write_refuses_bad_tables_and_read_returns_a_view_or_refuses(tmp_path):
    good = pd.DataFrame({"name": ["a", "b"], "n": [1, 2], "x": [0.5, 1.5]})
    with pytest.raises(SchemaError, match="'x'"):
        manifests.write_manifest(tmp_path / "bad", kind="test-kind", tables={"rows": good.drop(columns="x")},
                                 config={})
    assert not (tmp_path / "bad" / "manifest.json").exists()
    manifests.write_manifest(tmp_path / "m", kind="test-kind", tables={"rows": good}, config={"owner": "me"})
    view = manifests.read(tmp_path / "m", kind="test-kind")
    assert isinstance(view, ManifestView) and view.field("owner") == "me"
    assert view.frame("rows")["n"].tolist() == [1, 2]
    assert type(manifests.read(tmp_path / "m")) is manifests.Manifest  # no kind: no schema check, plain
    with pytest.raises(ManifestError, match="'test-kind'.*'splits'"):
        manifests.read(tmp_path / "m", kind="splits")


def test_read_checks_the_parquet_schema_not_only_manifest_json(tmp_path):
    good = pd.DataFrame({"name": ["a"], "n": [1], "x": [0.5]})
    m = manifests.write_manifest(tmp_path / "m", kind="test-kind", tables={"rows": good}, config={})
    # the table file is replaced behind the manifest's back by one whose column has another type
    pd.DataFrame({"name": ["a"], "n": ["one"], "x": [0.5]}).to_parquet(m.path("data/rows.parquet"))
    with pytest.raises(SchemaError, match="'rows'.*'n'"):
        manifests.read(tmp_path / "m", kind="test-kind")
    m.path("data/rows.parquet").write_bytes(b"PAR1 truncated")
    with pytest.raises(ManifestError, match="'rows'"):
        manifests.read(tmp_path / "m", kind="test-kind")
