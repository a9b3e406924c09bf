"""isood.stages.wordnet.jobs returns data (manifests, frames); it agrees with the pure rules it runs."""

import manifests
from isood.kinds import AuditView, ClassFilterView
from wordnet_tools.audit import audit_classes, parse_class_list
from wordnet_tools.class_filter import filter_classes, summarise
from isood.stages.wordnet.jobs import AuditResult, rule_counts, run_audit, run_filter

# dressage (clean), Chihuahua (ID), dog (hypernym of ID breeds), benthos (an organism), no such synset
CANDIDATES = ["n00288000", "n02085620", "n02084071", "n00005787", "n09999999"]


def test_run_filter_writes_the_filter_table_as_a_class_filter_manifest(tmp_path, in1k, hierarchy):
    cand = tmp_path / "c.txt"
    cand.write_text("\n".join(CANDIDATES) + "\n")
    m = run_filter(str(cand), "1k", out=tmp_path / "cf", argv=["test"])
    view = manifests.read(m.root, kind="class-filter")
    assert isinstance(view, ClassFilterView) and manifests.verify(m.root).ok
    want = filter_classes(CANDIDATES, in1k, hierarchy)
    got = view.classes
    assert got[["wnid", "decision", "rule", "conflict_wnid"]].equals(want[["wnid", "decision", "rule", "conflict_wnid"]])
    assert view.kept()[0] == ["n00288000"]
    assert m.meta["summary"]["rules"] == rule_counts(summarise(want))
    assert m.meta["command"]["config"]["exclude"] == ["organism.n.01"]
    again = run_filter(str(cand), "1k", exclude=(), out=tmp_path / "cf2")
    rules = manifests.read(again.root, kind="class-filter").classes.set_index("wnid")["rule"]
    assert rules["n00005787"] == ""  # no exclusion: the organism is kept


def test_run_audit_returns_the_table_and_counts_and_writes_only_with_out(tmp_path, in1k, hierarchy):
    lst = tmp_path / "l.txt"
    lines = ["n00288000/a.JPEG", "n00288000/b.JPEG", "n02085620_17.JPEG", "n02084071/c.jpg", "n09999999/d.jpg"]
    lst.write_text("\n".join(lines) + "\n")
    r = run_audit(lst, "1k")
    assert isinstance(r, AuditResult) and r.manifest is None and r.entries == 5
    want = audit_classes(parse_class_list(lines, "x"), in1k, hierarchy)
    assert r.table[["wnid", "rule", "entries"]].equals(want[["wnid", "rule", "entries"]])
    assert r.counts.equals(summarise(want)) and int(r.counts["entries"].sum()) == 5
    assert sorted(r.leaks["wnid"]) == ["n02084071", "n02085620", "n09999999"]
    written = run_audit(lst, "1k", out=tmp_path / "audit")
    view = manifests.read(written.manifest.root, kind="audit")
    assert isinstance(view, AuditView) and view.frame("summary").equals(r.counts)
