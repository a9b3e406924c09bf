"""`isood splits clean`: a leak-free copy of a splits manifest. Verdicts are planted in an audit written by the
audit's own writer; the expected images, counts, N/A flags and list files are worked out row by row here."""

import numpy as np
import pyarrow as pa
import pandas as pd
import pyarrow.parquet as pq
import pytest

import manifests
from isood.core.errors import BadInputError
from isood.science.grid import cell_name, cell_table, edges_table
from isood.stages.clean.stage import (clean_splits, count_cells, filter_list, filter_lists, leak_dropped, leaking_rows,
                                recount_cells)
from isood.stages.splits import write_splits
from isood.stages.wordnet.jobs import write_audit

# class -> planted verdict ('' = kept)
VERDICT = {"n00000001": "id", "n00000002": "hypernym", "n00000003": "hyponym", "n00000004": "excluded_subtree",
           "n00000005": "", "n00000006": "", "n00000007": "unknown"}
LEAKS = {"id", "hypernym", "hyponym"}


def _audit(root, verdict=VERDICT):
    w = list(verdict)
    classes = pd.DataFrame({"wnid": w, "name": [f"c{x[-1]}" for x in w],
                            "decision": ["keep" if verdict[x] == "" else "drop" for x in w],
                            "rule": [verdict[x] for x in w], "conflict_wnid": "", "conflict_name": "",
                            "conflict_hops": pd.array([pd.NA] * len(w), dtype="Int64"), "entries": 1})
    return write_audit(root, classes=classes, config={"list": "planted"}, argv=["test"])


def _images(seed=0, n=120):
    rng = np.random.default_rng(seed)
    wnid = rng.choice(list(VERDICT), size=n)
    cov, sem = rng.integers(0, 2, n), rng.integers(0, 2, n)
    return pd.DataFrame({"path": [f"{w}/{w}_{i}.JPEG" for i, w in enumerate(wnid)], "wnid": wnid,
                         "d_sem": rng.random(n), "d_cov": rng.random(n), "sem_level": sem, "cov_level": cov,
                         "cell": [cell_name(c, s) for c, s in zip(cov, sem)]})


def _splits(root, images, na_threshold=10):
    cells = cell_table(images["cov_level"], images["sem_level"], n_levels=2, na_threshold=na_threshold)
    return write_splits(root, images=images, cells=cells, edges=edges_table([0, .5, 1], [0, .5, 1]), argv=["t"],
                        files={"laid.safetensors": b"weights", "laid.json": "{}"},
                        config={"test_root": "/data/test", "n_levels": 2, "na_threshold": na_threshold,
                                "clip": "ViT-B-16:openai"})


def test_clean_removes_exactly_the_leaking_images(tmp_path):
    images = _images()
    # one cell made small enough that removing its leaks makes it N/A: keep 10 images there, 4 of them clean
    small = images["cell"] == "cov_1_sem_1"
    images = pd.concat([images[~small], images[small].head(0)], ignore_index=True)
    extra = pd.DataFrame({"path": [f"s/{i}.JPEG" for i in range(10)],
                          "wnid": ["n00000005"] * 4 + ["n00000001"] * 6, "d_sem": 0.9, "d_cov": 0.9,
                          "sem_level": 1, "cov_level": 1, "cell": "cov_1_sem_1"})
    images = pd.concat([images, extra], ignore_index=True)
    src = _splits(tmp_path / "splits", images)
    _audit(tmp_path / "audit")
    r = clean_splits(tmp_path / "splits", tmp_path / "audit", out=tmp_path / "clean", argv=["t"])
    m = manifests.read(tmp_path / "clean", kind="splits")
    assert manifests.verify(tmp_path / "clean").ok
    keep = [VERDICT[w] not in LEAKS for w in images["wnid"]]
    assert m.images["path"].tolist() == images.loc[keep, "path"].tolist()
    assert r.removed == len(images) - sum(keep) and r.kept == sum(keep)
    for rec in m.cells.itertuples():
        n = sum(k and c == rec.cell for k, c in zip(keep, images["cell"]))
        assert rec.n == n and rec.na == (n < 10)
    assert m.cells.set_index("cell").loc["cov_1_sem_1", "na"]
    assert not src.cells.set_index("cell").loc["cov_1_sem_1", "na"]
    pd.testing.assert_frame_equal(m.edges, src.edges)
    # every cell list holds exactly its kept paths, in order
    for cell in m.cells["cell"]:
        want = [p for p, c, k in zip(images["path"], images["cell"], keep) if k and c == cell]
        assert m.path(f"lists/{cell}.txt").read_text().split() == want
    dropped = m.frame("dropped").set_index("path")
    for p, w, k in zip(images["path"], images["wnid"], keep):
        assert (p in dropped.index) == (not k)
        if not k:
            assert dropped.loc[p, "reason"] == f"leak:{VERDICT[w]}"
    # provenance to both inputs; the views read the same fields as the input's
    inputs = {i["name"]: i["sha256"] for i in m.meta["inputs"]}
    assert inputs == {"splits": src.content_sha256, "audit": manifests.read(tmp_path / "audit").content_sha256}
    assert (m.test_root, m.clip, m.na_threshold, m.n_levels) == ("/data/test", "ViT-B-16:openai", 10, 2)
    assert m.laid_path is not None and m.laid_path.read_bytes() == b"weights"


def test_more_rules_remove_more_and_missing_verdicts_are_refused(tmp_path):
    images = _images(seed=1, n=60)
    _splits(tmp_path / "splits", images, na_threshold=2)
    _audit(tmp_path / "audit")
    r = clean_splits(tmp_path / "splits", tmp_path / "audit", out=tmp_path / "c2",
                     rules="id,hypernym,hyponym,excluded_subtree,unknown")
    kept = manifests.read(tmp_path / "c2", kind="splits").images
    assert set(kept["wnid"]) == {"n00000005", "n00000006"}
    assert r.removed_by_rule == {v: int((images["wnid"].map(VERDICT) == v).sum()) for v in set(VERDICT.values()) - {""}}
    _audit(tmp_path / "partial", {k: v for k, v in VERDICT.items() if k != "n00000006"})
    with pytest.raises(BadInputError, match="n00000006"):
        clean_splits(tmp_path / "splits", tmp_path / "partial", out=tmp_path / "c3")
    assert not (tmp_path / "c3").exists()
    with pytest.raises(BadInputError, match="--out"):
        clean_splits(tmp_path / "splits", tmp_path / "audit", out=tmp_path / "splits")


def test_the_manifest_threshold_is_the_default_and_an_explicit_one_overrides_it(tmp_path):
    """Guard: clean._clean (SplitsView.na_threshold the default; --na-threshold overrides, both recorded). Cell
    sizes chosen so that 2 and 6 decide differently, and one cell N/A at 2 before the clean is measured at 6's rule
    only when its count allows."""
    sizes = {(0, 0): 1, (0, 1): 4, (1, 0): 7, (1, 1): 12}  # kept (verdict '') images per cell
    rows = [{"path": f"k/{c}{s}_{i}.JPEG", "wnid": "n00000005", "d_sem": 0.1, "d_cov": 0.1, "sem_level": s,
             "cov_level": c, "cell": cell_name(c, s)} for (c, s), n in sizes.items() for i in range(n)]
    rows += [{"path": f"l/{i}.JPEG", "wnid": "n00000001", "d_sem": 0.1, "d_cov": 0.1, "sem_level": 1,
              "cov_level": 1, "cell": "cov_1_sem_1"} for i in range(3)]  # leaks, removed
    _splits(tmp_path / "splits", pd.DataFrame(rows), na_threshold=2)
    _audit(tmp_path / "audit")
    for explicit, used in ((None, 2), (6, 6)):
        out = tmp_path / f"clean{used}"
        clean_splits(tmp_path / "splits", tmp_path / "audit", out=out, argv=["t"], na_threshold=explicit)
        m = manifests.read(out, kind="splits")
        got = {r.cell: (int(r.n), bool(r.na)) for r in m.cells.itertuples()}
        assert got == {cell_name(c, s): (n, n < used) for (c, s), n in sizes.items()}
        assert m.na_threshold == used
        assert m.config["clean"]["na_threshold"] == {"manifest": 2, "used": used}
    with pytest.raises(BadInputError, match="--na-threshold"):
        clean_splits(tmp_path / "splits", tmp_path / "audit", out=tmp_path / "bad", na_threshold=0)


def test_pure_steps():
    images = pd.DataFrame({"path": ["a", "b", "c", "d"], "wnid": ["n1", "n2", None, "n1"], "cov_level": [0, 0, 1, 1],
                           "sem_level": [0, 0, 1, 1], "source": ["tr", "va", "tr", "va"]})
    rules = {"n1": "id", "n2": "", "": "unknown"}
    assert leaking_rows(images, rules).tolist() == [True, False, False, True]
    drops = leak_dropped(images, np.array([True, False, False, True]), rules).to_pydict()
    assert drops == {"set": ["test", "test"], "path": ["a", "d"], "wnid": ["n1", "n1"],
                     "reason": ["leak:id", "leak:id"]}
    # per-source cells (an import deciding N/A per subset): each row recounted in its own source, others kept
    cells = pd.DataFrame({"cell": ["cov_0_sem_0", "cov_1_sem_1"] * 2, "cov_level": [0, 1, 0, 1],
                          "sem_level": [0, 1, 0, 1], "n": [1, 1, 1, 1], "na": [False, False, False, True],
                          "source": ["tr", "tr", "va", "va"], "note": list("wxyz")})
    counts = count_cells(images.iloc[[1, 2]], keys=["source"], n_levels=2)
    assert counts == {("va", 0, 0): 1, ("tr", 1, 1): 1}
    out = recount_cells(cells, counts, keys=["source"], na_threshold=1)
    assert out["n"].tolist() == [0, 1, 1, 0] and out["na"].tolist() == [True, False, False, True]
    assert out["note"].tolist() == list("wxyz")
    assert count_cells(images, keys=[], n_levels=2) == {(0, 0): 2, (1, 1): 2}
    removed = pa.array(["a", "b"])
    assert filter_list("a\nb 3\n\nc\n", removed) == "\nc\n" and filter_list("", removed) == ""


def test_clean_command(tmp_path):
    from typer.testing import CliRunner

    from isood.cli import app

    images = _images(seed=2, n=40)
    _splits(tmp_path / "splits", images, na_threshold=2)
    _audit(tmp_path / "audit")
    runner = CliRunner()
    r = runner.invoke(app, ["splits", "clean", str(tmp_path / "splits"), "--audit", str(tmp_path / "audit"),
                            "--out", str(tmp_path / "clean")])
    assert r.exit_code == 0, r.output
    got = manifests.read(tmp_path / "clean", kind="splits").images
    assert got["path"].tolist() == images.loc[~images["wnid"].map(VERDICT).isin(LEAKS), "path"].tolist()
    for audit, rules, named in ((tmp_path / "audit", "id,bogus", "bogus"), (tmp_path / "splits", "id", "audit")):
        r = runner.invoke(app, ["splits", "clean", str(tmp_path / "splits"), "--audit", str(audit), "--rules", rules,
                                "--out", str(tmp_path / "bad")])
        assert r.exit_code == 2 and named in r.output and "Traceback" not in r.output
        assert not (tmp_path / "bad").exists()


def _reference_filter(text, removed):
    """A list file's text without the lines whose first field is a removed path, line by line in Python."""
    return "\n".join(line for line in text.split("\n") if (line.split() or [""])[0] not in removed)


def test_list_files_filtered_together_equal_each_filtered_line_by_line():
    removed = ["a/x.JPEG", "b/y.JPEG", "c z.JPEG"]
    texts = ["a/x.JPEG\nb/y.JPEG\nkeep/1.JPEG\n", "  a/x.JPEG 3\nkeep/2.JPEG\t7\n\n\tb/y.JPEG\t1\nc\n",
             "", "\n\n", "keep/3.JPEG", "b/y.JPEGx\nb/y.JPEG 12 extra\n", "only/kept.JPEG\n" * 3]
    got = filter_lists(texts, pa.array(removed))
    assert got == [_reference_filter(t, set(removed)) for t in texts]
    assert got == [filter_list(t, pa.array(removed)) for t in texts]  # one batch or one file at a time
    assert filter_lists(texts, pa.array([], pa.string())) == texts


def _release(root, seed=0):
    """An IS-OOD release folder (train/val lists of all 64 cells, a few filled) of the planted classes."""
    rng, k = np.random.default_rng(seed), 0
    folder = root / "imglist" / "imagenet21k"
    for subset in ("train", "val"):
        (folder / subset).mkdir(parents=True)
        for c in range(8):
            for s in range(8):
                lines = []
                for w in rng.choice(list(VERDICT), int(rng.integers(0, 20)) if c < 2 and s < 3 else 0):
                    lines.append(f"./imagenet21k_{subset}/{w}/{w}_{k}.JPEG\n")
                    k += 1
                (folder / subset / f"cov_{c}_sem_{s}.txt").write_text("".join(lines))
    return folder


def test_clean_of_a_release_in_row_groups_equals_the_row_by_row_reference(tmp_path, monkeypatch):
    """Old vs new: the images read in many row groups, the dropped table streamed (the input's rows first), the
    lists filtered in several batches give what the row-by-row reference gives, and the dropped table has the
    bytes the in-memory writer gave it."""
    import isood.stages.clean.stage as clean_module
    from isood.stages.clean.stage import DROPPED_SCHEMA
    from isood.stages.interop import import_isood_lists
    from manifests.store import parquet_bytes

    import_isood_lists(_release(tmp_path), tmp_path / "m", row_group_rows=16, argv=["t"])
    _audit(tmp_path / "audit")
    monkeypatch.setattr(clean_module, "LIST_BATCH_CHARS", 300)  # the list files spread over several batches
    clean_splits(tmp_path / "m", tmp_path / "audit", out=tmp_path / "c1", rules="id", argv=["t"])
    r = clean_splits(tmp_path / "c1", tmp_path / "audit", out=tmp_path / "c2", argv=["t"])  # has `dropped`
    src = manifests.read(tmp_path / "m", kind="splits")
    assert pq.ParquetFile(src.path("data/images.parquet")).num_row_groups > 5  # really in pieces
    rows = list(zip(src.images["path"], src.images["wnid"]))
    first = [(p, w) for p, w in rows if VERDICT[w] == "id"]
    then = [(p, w) for p, w in rows if VERDICT[w] in {"hypernym", "hyponym"}]
    want = pa.table({"set": ["test"] * len(first + then), "path": [p for p, _ in first + then],
                     "wnid": [w for _, w in first + then], "reason": [f"leak:{VERDICT[w]}" for _, w in first + then]},
                    schema=DROPPED_SCHEMA)
    out = manifests.read(tmp_path / "c2", kind="splits")
    assert out.table("dropped").equals(want)
    assert out.path("data/dropped.parquet").read_bytes() == parquet_bytes(want)
    assert out.images["path"].tolist() == [p for p, w in rows if VERDICT[w] not in LEAKS]
    assert r.removed_by_rule == {v: sum(VERDICT[w] == v for _, w in then) for v in ("hypernym", "hyponym")}
    gone = {p for p, _ in first + then}
    lists = [f["path"] for f in src.meta["files"] if f["path"].startswith("lists/")]
    assert len(lists) == 128 and any(src.path(rel).read_text() for rel in lists)
    for rel in lists:
        assert out.path(rel).read_text() == _reference_filter(src.path(rel).read_text(), gone)
    left = [p for p in (tmp_path / "c2").rglob(".~*") if not p.name.endswith(".version")]  # but the version marker
    assert manifests.verify(tmp_path / "c2").ok and not left
