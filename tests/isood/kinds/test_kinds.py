"""Typed reads of isood's manifest kinds: the right view, a wrong kind or a wrong column refused in one line."""

from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from typer.testing import CliRunner

import manifests
from isood.cli import app
from isood.core.errors import ManifestError, SchemaError
from isood.kinds import ClassFilterView, ImageListView, SplitsView, SynView
from isood.stages.interop import import_imagenet_ood
from isood.stages.splits import write_splits

FIXTURE_V1 = next(p for p in Path(__file__).resolve().parents if (p / "pyproject.toml").is_file()) / "tests" / "data" / "v1_splits"


def _one_line(e: Exception) -> str:
    msg = str(e)
    assert "\n" not in msg
    return msg


def test_splits_view_reads_edges_levels_and_threshold(tmp_path, worlds):
    worlds.write_splits(tmp_path / "s")
    v = manifests.read(tmp_path / "s", kind="splits")
    assert isinstance(v, SplitsView)
    np.testing.assert_array_equal(v.axis_edges("sem"), worlds.EDGES)
    np.testing.assert_array_equal(v.axis_edges("cov"), worlds.EDGES)
    assert v.n_levels == worlds.N_LEVELS and v.na_threshold == 10
    assert int(v.cells.set_index("cell").loc["cov_2_sem_5", "n"]) == worlds.PLANTED_CELLS[(2, 5)]
    assert v.test_root is None and v.clip is None  # written without them
    assert isinstance(manifests.read(tmp_path / "s", kind=("splits", "syn-is")), SplitsView)


def test_each_kind_reads_as_its_view(tmp_path, worlds):
    assert isinstance(manifests.read(worlds.write_syn_is(tmp_path / "syn").root, kind="syn-is"), SynView)
    cf = manifests.read(worlds.write_class_filter(tmp_path / "cf").root, kind="class-filter")
    assert isinstance(cf, ClassFilterView) and cf.kept()[0] == ["n00288000"]
    f = tmp_path / "list.txt"
    f.write_text("n01440764/a.JPEG\nb/c.jpg\n")
    il = manifests.read(import_imagenet_ood(f, tmp_path / "il").root, kind="image-list")
    assert isinstance(il, ImageListView) and il.images["path"].tolist() == ["n01440764/a.JPEG", "b/c.jpg"]


def test_a_wrong_kind_is_refused_in_one_line(tmp_path, worlds):
    cf = worlds.write_class_filter(tmp_path / "cf")
    with pytest.raises(ManifestError) as info:
        manifests.read(cf.root, kind="splits")
    msg = _one_line(info.value)
    assert "'class-filter'" in msg and "'splits'" in msg
    with pytest.raises(ManifestError, match="'splits' or 'syn-is'"):
        manifests.read(cf.root, kind=("splits", "syn-is"))


def _value_edges(worlds) -> pd.DataFrame:
    """An edges table of the wrong shape: one `value` per edge instead of each level's lower/upper."""
    return pd.DataFrame({"axis": ["sem"] * 9 + ["cov"] * 9, "level": list(range(9)) * 2,
                         "value": list(worlds.EDGES) * 2})


def test_splits_with_a_value_edges_table_is_refused_at_write(tmp_path, worlds):
    t = worlds.splits_tables()
    with pytest.raises(SchemaError) as info:
        write_splits(tmp_path / "bad", images=t["images"], cells=t["cells"], edges=_value_edges(worlds),
                     config={"n_levels": 8, "na_threshold": 10})
    msg = _one_line(info.value)
    assert "'edges'" in msg and "'lower'" in msg
    assert not (tmp_path / "bad" / "manifest.json").exists()


def test_splits_with_a_value_edges_table_is_refused_at_read(tmp_path, worlds):
    m = worlds.write_splits(tmp_path / "s")
    # the edges file is replaced behind the writer's back (bypassing its schema check)
    pq.write_table(pa.Table.from_pandas(_value_edges(worlds)), m.path("data/edges.parquet"))
    assert manifests.read(m.root).kind == "splits"  # a plain read does not check schemas
    with pytest.raises(SchemaError) as info:
        manifests.read(m.root, kind="splits")
    msg = _one_line(info.value)
    assert "'edges'" in msg and "'lower'" in msg
    result = CliRunner().invoke(app, ["export", "openood", str(m.root), "--out", str(tmp_path / "o")])
    # a stage verifies what it reads first: the swapped file is named as changed
    assert result.exit_code == 2 and "Traceback" not in result.output
    assert "fails verification" in result.output and "data/edges.parquet" in result.output


def test_a_column_of_the_wrong_type_is_named(tmp_path, worlds):
    m = worlds.write_splits(tmp_path / "s")
    images = m.frame("images").assign(sem_level=lambda d: d["sem_level"].astype(str))
    pq.write_table(pa.Table.from_pandas(images), m.path("data/images.parquet"))
    with pytest.raises(SchemaError, match=r"'images'.*'sem_level'"):
        manifests.read(m.root, kind="splits")


def test_commands_refuse_a_manifest_of_the_wrong_kind(tmp_path, worlds):
    cf = worlds.write_class_filter(tmp_path / "cf")
    out = tmp_path / "o"
    result = CliRunner().invoke(app, ["export", "openood", str(cf.root), "--out", str(out)])
    assert result.exit_code == 2 and "Traceback" not in result.output
    assert "'class-filter'" in result.output and "'splits'" in result.output
    assert not out.exists()


def test_the_frozen_v1_layout_is_readable_plain_but_refused_typed():
    assert manifests.read(FIXTURE_V1).kind == "splits"
    with pytest.raises(SchemaError) as info:  # v1 images had no `cell`, edges no lower/upper
        manifests.read(FIXTURE_V1, kind="splits")
    assert "'images'" in _one_line(info.value) and "'cell'" in str(info.value)


def test_a_kind_without_a_spec_is_an_error_not_a_plain_view(tmp_path):
    """guard: ``manifests.store.read`` refuses ``kind=K`` when no spec of K is registered (it returned a plain
    view and skipped every schema check)."""
    manifests.write_manifest(tmp_path / "m", kind="nosuchkind", tables={}, config={})
    with pytest.raises(ManifestError, match="no spec is registered for manifest kind 'nosuchkind'"):
        manifests.read(tmp_path / "m", kind="nosuchkind")


def test_isood_kinds_are_registered_from_above_without_install_metadata(tmp_path, worlds):
    """guard: with no entry points at all (a source checkout on PYTHONPATH, no install metadata), ``manifests``
    loads no isood module by name: ``manifests.read(kind='splits')`` is a one-line error naming ``isood.kinds``,
    and ``isood.read`` (which imports ``isood.kinds``, registering its kinds) returns the typed view."""
    import subprocess
    import sys

    worlds.write_splits(tmp_path / "s")
    code = ("import importlib.metadata as md\n"
            "md.entry_points = lambda **kw: []\n"
            "import manifests, isood\n"
            "try:\n"
            f"    manifests.read({str(tmp_path / 's')!r}, kind='splits')\n"
            "except Exception as e:\n"
            "    print('refused', 'import isood.kinds' in str(e))\n"
            f"v = isood.read({str(tmp_path / 's')!r}, kind='splits')\n"
            "print(type(v).__name__, v.n_levels)\n")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr[-2000:]
    assert r.stdout.split() == ["refused", "True", "SplitsView", str(worlds.N_LEVELS)]
