"""`isood wordnet audit` of a manifest: per-image rule, per-cell and per-level counts of images and classes per
rule. The expected verdicts come from the made-up hierarchy (conftest ``toy``) worked out by hand, the counts
from a brute-force loop over the rows."""

from collections import Counter, defaultdict

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest
from typer.testing import CliRunner

import manifests
from isood.cli import app
from isood.science.grid import cell_name, cell_table, edges_table
from isood.stages.interop import import_isood_lists
from isood.stages.splits import write_splits
from manifests.store import parquet_bytes
from wordnet_tools.audit import IMAGE_COLUMNS, ImageAuditor, audit_classes, audit_images, count_wnids
from wordnet_tools.class_filter import DEFAULT_EXCLUDE
from isood.stages.wordnet.jobs import audit_manifest, open_audited_table, write_audit
from wordnet_tools.rules import AUDIT_RULES, LEAK_RULES, cell_rule_table, leak_mask, level_rule_table, parse_rules, \
    rule_codes

# verdicts with the default exclusion (organism.n.01), by hand (see test_wn_presets.py)
BY_HAND = {"diver": "id", "beagle": "id", "car": "id", "dog": "hypernym", "vehicle": "hypernym",
           "lemon_beagle": "hyponym", "poodle": "excluded_subtree", "rose": "excluded_subtree", "bike": "",
           "hammer": "", "tool": ""}


def _rows(toy, seed=0, n=300):
    """Random images of the toy classes (plus a few without a class) spread over a 3 x 3 grid."""
    rng = np.random.default_rng(seed)
    names = list(BY_HAND) + ["?"]
    pick = rng.choice(names, size=n)
    cov, sem = rng.integers(0, 3, n), rng.integers(0, 3, n)
    sem[pick == "diver"] = 0  # plant structure: ID classes only at semantic level 0
    wnid = [toy.w[p] if p != "?" else None for p in pick]
    return pd.DataFrame({"path": [f"x/{w or 'none'}/{i}.jpg" for i, w in enumerate(wnid)], "wnid": wnid,
                         "d_sem": 0.0, "d_cov": 0.0, "sem_level": sem, "cov_level": cov,
                         "cell": [cell_name(c, s) for c, s in zip(cov, sem)]}), pick


def _brute(pick, keys):
    """{key: {rule: (images, set of classes)}} counted row by row."""
    out = defaultdict(lambda: defaultdict(lambda: [0, set()]))
    for p, k in zip(pick, keys):
        rule = "unknown" if p == "?" else (BY_HAND[p] or "kept")
        out[k][rule][0] += 1
        out[k][rule][1].add(p)
    return out


def test_audit_images_on_a_made_up_hierarchy(toy):
    df, pick = _rows(toy)
    a = audit_images(df, toy.id_wnids, toy)
    images = a.images.to_pandas()
    assert list(images["path"]) == list(df["path"])  # input order, one row per image
    want = ["unknown" if p == "?" else BY_HAND[p] for p in pick]
    assert images["rule"].tolist() == want
    cells = a.cells.set_index("cell")
    brute = _brute(pick, df["cell"])
    assert set(cells.index) == set(brute)
    for cell, per_rule in brute.items():
        for rule in AUDIT_RULES:
            n, classes = per_rule.get(rule, (0, set()))
            assert cells.loc[cell, f"images_{rule}"] == n and cells.loc[cell, f"classes_{rule}"] == len(classes)
        leak = sum(per_rule.get(r, (0, ()))[0] for r in LEAK_RULES)
        assert cells.loc[cell, "leak_images"] == leak
        assert cells.loc[cell, "leak_share"] == pytest.approx(leak / sum(v[0] for v in per_rule.values()))
    levels = a.levels.set_index(["axis", "level"])
    for axis, col in (("sem", "sem_level"), ("cov", "cov_level")):
        for level, per_rule in _brute(pick, df[col]).items():
            assert levels.loc[(axis, level), "images"] == sum(v[0] for v in per_rule.values())
            assert levels.loc[(axis, level), "classes"] == len(set().union(*(v[1] for v in per_rule.values())))
            assert levels.loc[(axis, level), "images_id"] == per_rule.get("id", (0,))[0]
    # the class table counts every image once, per class
    assert a.classes["entries"].sum() == len(df)


def test_leak_mask_maps_class_verdicts_and_names_missing_classes(toy):
    df, pick = _rows(toy, seed=1, n=50)
    verdicts = audit_images(df, toy.id_wnids, toy).classes
    rules = dict(zip(verdicts["wnid"], verdicts["rule"]))
    got = leak_mask(df["wnid"], rules)
    assert got.tolist() == [p != "?" and BY_HAND[p] in LEAK_RULES for p in pick]
    wider = leak_mask(df["wnid"], rules, rules=parse_rules("id,excluded_subtree"))
    assert wider.tolist() == [p != "?" and BY_HAND[p] in ("id", "excluded_subtree") for p in pick]
    with pytest.raises(Exception, match="n99999999"):
        leak_mask(["n99999999"], rules)
    with pytest.raises(Exception, match="bogus"):
        parse_rules("id,bogus")


def _splits(root, wnids, levels):
    rows = [{"path": f"{w}/{w}_{i}.JPEG", "wnid": w, "d_sem": 0.1, "d_cov": 0.1, "sem_level": s, "cov_level": c,
             "cell": cell_name(c, s)} for i, (w, (c, s)) in enumerate(zip(wnids, levels))]
    images = pd.DataFrame(rows)
    cells = cell_table(images["cov_level"], images["sem_level"], n_levels=2, na_threshold=2)
    return write_splits(root, images=images, cells=cells, edges=edges_table([0, 1, 2], [0, 1, 2]), argv=["t"],
                        config={"test_root": "/nowhere", "n_levels": 2, "na_threshold": 2})


def test_audit_command_on_a_splits_manifest_and_an_image_list(tmp_path, in1k, hierarchy):
    # real WordNet: Chihuahua (ID), dog (hypernym), dressage (clean), aardvark (organism)
    chihuahua, dog, dressage, aardvark = "n02085620", "n02084071", "n00288000", hierarchy.resolve("aardvark.n.01")
    wnids = [chihuahua, chihuahua, dog, dressage, dressage, dressage, aardvark, dog]
    levels = [(0, 0), (0, 0), (0, 0), (0, 1), (1, 1), (1, 1), (1, 0), (1, 0)]
    _splits(tmp_path / "splits", wnids, levels)
    out = tmp_path / "audit"
    r = CliRunner().invoke(app, ["wordnet", "audit", str(tmp_path / "splits"), "--out", str(out)], terminal_width=200)
    assert r.exit_code == 0, r.output
    view = manifests.read(out, kind="audit")
    assert manifests.verify(out).ok
    images = view.optional("images")
    assert images["rule"].tolist() == ["id", "id", "hypernym", "", "", "", "excluded_subtree", "hypernym"]
    cells = view.optional("cells").set_index("cell")
    assert cells.loc["cov_0_sem_0", ["images", "leak_images", "images_id", "classes_id"]].tolist() == [3, 3, 2, 1]
    assert cells.loc["cov_1_sem_0", ["images", "leak_images", "images_excluded_subtree"]].tolist() == [2, 1, 1]
    sem = view.optional("levels").query("axis == 'sem'").set_index("level")
    assert sem.loc[0, "leak_share"] == pytest.approx(4 / 5) and sem.loc[1, "leak_images"] == 0
    assert {i["name"] for i in view.meta["inputs"]} >= {"source", "id", "wordnet"}
    assert view.meta["command"]["config"]["source_kind"] == "splits"
    # the release preset: the aardvark is still excluded (an animal); an image list has no cells
    from isood.stages.interop import import_imagenet_ood

    lst = tmp_path / "ood.txt"
    lst.write_text("".join(f"{w}/{w}_{i}.JPEG\n" for i, w in enumerate(wnids)))
    import_imagenet_ood(lst, tmp_path / "il", argv=["t"])
    r = CliRunner().invoke(app, ["wordnet", "audit", str(tmp_path / "il"), "--preset", "imagenet-ood-release",
                                 "--out", str(tmp_path / "a2")])
    assert r.exit_code == 0, r.output
    v2 = manifests.read(tmp_path / "a2", kind="audit")
    assert v2.optional("images")["rule"].tolist() == images["rule"].tolist() and v2.optional("cells") is None


def test_audit_of_a_manifest_without_wnid_is_one_line(tmp_path):
    from manifests.schema import INT, KindSpec, TableSpec, register_kind

    register_kind(KindSpec("evaluation-like", writer="a test", tables={"t": TableSpec({"a": INT})}))
    manifests.write_manifest(tmp_path / "m", kind="evaluation-like", tables={"t": pd.DataFrame({"a": [1]})},
                             config={}, argv=["t"])
    r = CliRunner().invoke(app, ["wordnet", "audit", str(tmp_path / "m")])
    assert r.exit_code == 2 and "wnid" in r.output and "Traceback" not in r.output


# ------------------------------------------------------------------------------ streamed = audited whole
def _old_audit(table: pa.Table, classes: pd.DataFrame):
    """The per-image, per-cell and per-level tables as ``audit_images`` built them before the audit streamed
    (the whole table in memory, one class code per row, unweighted ``rule_table``s): the reference."""
    filled = pc.fill_null(table["wnid"].cast(pa.string()), "")
    enc = filled.combine_chunks().dictionary_encode()
    uniques = [str(w) for w in enc.dictionary.to_pylist()]
    codes = enc.indices.to_numpy(zero_copy_only=False).astype(np.int64)
    rule_of = dict(zip(classes["wnid"], classes["rule"]))
    class_rules = [rule_of[w] for w in uniques]
    columns = {c: (filled if c == "wnid" else table[c]) for c in IMAGE_COLUMNS if c in table.column_names}
    columns["rule"] = pa.array(class_rules, pa.string()).take(pa.array(codes))
    cov, sem = (pc.fill_null(table[c], -1).to_numpy().astype(np.int64) for c in ("cov_level", "sem_level"))
    rc = rule_codes(class_rules)
    return pa.table(columns), cell_rule_table(table["cell"], cov, sem, codes, rc), level_rule_table(cov, sem, codes, rc)


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_a_table_audited_piece_by_piece_equals_the_whole_table_audit(toy, seed):
    df, _ = _rows(toy, seed=seed, n=500)
    rng = np.random.default_rng(seed)
    df.loc[rng.random(len(df)) < 0.05, "cov_level"] = -1  # images without levels: in no cell
    df.loc[rng.random(len(df)) < 0.05, "sem_level"] = -2
    t = pa.Table.from_pandas(df, preserve_index=False)
    classes = audit_classes(count_wnids(t["wnid"]), toy.id_wnids, toy)
    auditor = ImageAuditor(classes, t.column_names)
    auditor.tally.merge_rows = 16  # the running counts are merged many times along the way
    cuts = np.sort(rng.choice(np.arange(1, len(df)), 15, replace=False))
    bounds = [0, 0, *cuts.tolist(), len(df)]  # an empty first piece too
    pieces = [t.slice(a, b - a) for a, b in zip(bounds[:-1], bounds[1:])]
    rows = [auditor.add(p) for p in pieces]
    images, cells, levels = _old_audit(t, classes)
    assert pa.concat_tables(rows).equals(images)
    pd.testing.assert_frame_equal(auditor.cells(), cells)
    pd.testing.assert_frame_equal(auditor.levels(), levels)
    counts: Counter = Counter()
    for p in pieces:
        count_wnids(p["wnid"], counts)
    assert counts == Counter(w if isinstance(w, str) else "" for w in df["wnid"])  # missing wnid -> class ''


def _toy_release(root, toy, seed=0):
    """An IS-OOD release folder (train/val lists of all 64 cells, most empty) of the toy classes."""
    rng, wnids, k = np.random.default_rng(seed), sorted(toy.graph), 0
    folder = root / "imglist" / "imagenet21k"
    for subset in ("train", "val"):
        (folder / subset).mkdir(parents=True)
        for c in range(8):
            for s in range(8):
                n = int(rng.integers(0, 25)) if c < 3 and s < 4 else 0
                lines = []
                for w in rng.choice(wnids, n):
                    lines.append(f"./imagenet21k_{subset}/{w}/{w}_{k}.JPEG\n")
                    k += 1
                (folder / subset / f"cov_{c}_sem_{s}.txt").write_text("".join(lines))
    return folder


def test_the_audit_of_a_manifest_streams_and_writes_what_the_whole_table_gave(tmp_path, toy):
    """Old vs new: a release import in many row groups, audited row group by row group, gives the tables (and
    the per-image file's bytes) that the in-memory audit of the whole table gave."""
    import_isood_lists(_toy_release(tmp_path, toy), tmp_path / "m", row_group_rows=16, argv=["t"])
    m, main, columns = open_audited_table(tmp_path / "m")
    assert pq.ParquetFile(m.path(m.meta["tables"][main]["path"])).num_row_groups > 10  # really in pieces
    a = audit_manifest(m, main, columns, toy.id_wnids, toy, exclude=DEFAULT_EXCLUDE, out=tmp_path / "audit")
    written = write_audit(tmp_path / "audit", classes=a.classes, images=a.images, cells=a.cells, levels=a.levels,
                          config={"list": "toy"}, argv=["t"])
    whole = m.table(main).select(columns)
    classes = audit_classes(count_wnids(whole["wnid"]), toy.id_wnids, toy)
    images, cells, levels = _old_audit(whole, classes)
    pd.testing.assert_frame_equal(a.classes, classes)
    assert a.entries == whole.num_rows and int(a.classes["entries"].sum()) == whole.num_rows
    pd.testing.assert_frame_equal(a.cells, cells)
    pd.testing.assert_frame_equal(a.levels, levels)
    view = manifests.read(written.root, kind="audit")
    assert manifests.verify(written.root).ok
    assert view.table("images").equals(images)
    assert view.path("data/images.parquet").read_bytes() == parquet_bytes(images)  # the bytes written whole
    assert set(view.tables) == {"classes", "summary", "images", "cells", "levels"}
    assert "data/images.parquet" in (written.root / "README.md").read_text()  # its config, as before
    assert not [p for p in written.root.rglob(".~*") if not p.name.endswith(".version")]  # no staged file left


def test_audit_refuses_to_write_over_the_audited_manifest(tmp_path):
    manifests.write_manifest(tmp_path / "m", kind="image-list-like", tables={"images": pd.DataFrame(
        {"path": ["n02085620/a.JPEG"], "wnid": ["n02085620"]})}, config={}, argv=["t"])
    before = (tmp_path / "m" / "manifest.json").read_bytes()
    r = CliRunner().invoke(app, ["wordnet", "audit", str(tmp_path / "m"), "--out", str(tmp_path / "m")])
    assert r.exit_code == 2 and "--out" in r.output and "Traceback" not in r.output
    assert (tmp_path / "m" / "manifest.json").read_bytes() == before
