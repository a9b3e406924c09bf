"""The `isood wordnet` commands end to end: manifests written, verified, tamper detected, errors one line."""

from typer.testing import CliRunner

import manifests
from isood.cli import app

runner = CliRunner()

# n02084071 dog (hypernym of ID dog breeds), n02085620 Chihuahua (ID), n03483316 hand blower (ID),
# n00288000 dressage (clean), n09999999 (no such synset). Note n04379243 'table' is NOT clean: it is a
# hypernym of the ID class 'dining table'.
CANDIDATES = ["n02084071", "n02085620", "n03483316", "n00288000", "n09999999"]


def test_filter_writes_a_manifest_that_verifies_and_detects_tampering(tmp_path):
    cand = tmp_path / "candidates.txt"
    cand.write_text("\n".join(CANDIDATES) + "\n")
    out = tmp_path / "cf"
    result = runner.invoke(app, ["wordnet", "filter", "--candidates", str(cand), "--id", "1k", "--out", str(out)])
    assert result.exit_code == 0, result.output
    m = manifests.read(out, kind="class-filter")
    assert int(m.frame("summary")["classes"].sum()) == 5 and "5" in result.output.split()
    assert m.kind == "class-filter"
    rows = m.frame("classes").set_index("wnid")
    assert rows.loc["n00288000", "decision"] == "keep"
    assert rows.loc["n02085620", "rule"] == "id"
    assert rows.loc["n02084071", "rule"] == "hypernym"
    assert rows.loc["n09999999", "rule"] == "unknown"
    assert m.meta["command"]["config"]["exclude"] == ["organism.n.01"]
    assert {i["name"] for i in m.meta["inputs"]} >= {"candidates", "id", "wordnet"}

    assert runner.invoke(app, ["verify", str(out)]).exit_code == 0
    df = rows.reset_index()
    df.loc[df.wnid == "n02084071", "decision"] = "keep"  # someone "fixes" a leak by hand
    (out / "data/classes.parquet").write_bytes(manifests.parquet_bytes(df))
    result = runner.invoke(app, ["verify", str(out)])
    assert result.exit_code == 1 and "changed: data/classes.parquet" in result.output


def test_filter_with_empty_exclusion_keeps_organisms(tmp_path):
    cand = tmp_path / "c.txt"
    cand.write_text("n00005787\nn02121808\n")  # benthos (an organism), domestic cat (hypernym of ID cats)
    rules = {}
    for flag in ([], ["--exclude", ""]):
        out = tmp_path / f"cf{len(flag)}"
        assert runner.invoke(app, ["wordnet", "filter", "--candidates", str(cand), *flag, "--out", str(out)]).exit_code == 0
        rules[len(flag)] = manifests.read(out).frame("classes").set_index("wnid")["rule"].to_dict()
    assert rules[0] == {"n00005787": "excluded_subtree", "n02121808": "hypernym"}
    assert rules[2] == {"n00005787": "", "n02121808": "hypernym"}


def test_audit_prints_per_rule_counts_and_writes_rows(tmp_path):
    lst = tmp_path / "ood_images.txt"
    lst.write_text("n00288000/a.JPEG\nn00288000/b.JPEG\nn02085620_17.JPEG\nn02084071/c.jpg\nn09999999/d.jpg\n")
    out = tmp_path / "audit"
    result = runner.invoke(app, ["wordnet", "audit", str(lst), "--id", "1k", "--out", str(out)], terminal_width=200)
    assert result.exit_code == 0, result.output
    classes = manifests.read(out, kind="audit").classes
    leaks = classes[classes["decision"] == "drop"]
    assert sorted(leaks["wnid"]) == ["n02084071", "n02085620", "n09999999"]
    assert all(w in result.output for w in leaks["wnid"])  # the leaks are listed on screen
    counts = manifests.read(out).frame("summary").set_index("rule")
    assert counts.loc["id", "entries"] == 1 and counts.loc["hypernym", "entries"] == 1
    assert counts.loc["unknown", "classes"] == 1 and counts.loc["", "entries"] == 2


def test_audit_malformed_line_is_one_line_error_naming_the_line(tmp_path):
    lst = tmp_path / "bad.txt"
    lst.write_text("n00288000/a.JPEG\n\nnot a path at all\n")
    result = runner.invoke(app, ["wordnet", "audit", str(lst)])
    assert result.exit_code == 2
    assert f"{lst}:3: no wnid in 'not a path at all'" in result.output
    assert "Traceback" not in result.output
