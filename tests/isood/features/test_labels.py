"""isood.features.labels: one loader for every --labels source (named lists, class-filter manifests, dataset roots, files)."""

import pandas as pd
import pytest

from isood.core.errors import BadInputError
from isood.features.labels import LabelError, Labels, labels_from_lines, labels_from_manifest, load_labels
from isood.stages.wordnet.jobs import run_filter

NAMES = {"n00000001": "dog", "n00000002": "cat", "n00000003": "dog"}


@pytest.mark.parametrize("lines, rows", [
    (["n00000001", "n00000002"], [("n00000001", "dog"), ("n00000002", "cat")]),
    (["n00000009\tgreat white shark, white shark"], [("n00000009", "great white shark")]),  # named after the tab
    (["n00000001 hound"], [("n00000001", "dog")]),                     # a known name wins over the one written
    (["red panda", "  red panda  ", "# comment", "", "teddy # toy"], [("", "red panda"), ("", "teddy")]),
    (["n00000001", "n00000001", "dog"], [("n00000001", "dog"), ("", "dog")]),  # one row per wnid / free label
])
def test_labels_from_lines(lines, rows):
    df = labels_from_lines(lines, "labels.txt", names=NAMES)
    assert list(df.columns) == ["wnid", "label"]
    assert list(df.itertuples(index=False, name=None)) == rows


def test_labels_from_lines_errors_name_the_line():
    with pytest.raises(LabelError, match=r"labels.txt:2: wnid n00000009 has no known name"):
        labels_from_lines(["dog", "n00000009"], "labels.txt", names=NAMES)
    with pytest.raises(LabelError, match="no labels in empty.txt"):
        labels_from_lines(["# nothing", ""], "empty.txt", names=NAMES)
    assert issubclass(LabelError, BadInputError)


def test_texts_are_the_distinct_labels_in_order():
    labels = Labels(pd.DataFrame({"wnid": ["n00000001", "n00000003", ""], "label": ["dog", "dog", "cat"]}), "x")
    assert labels.texts == ["dog", "cat"] and len(labels) == 3


def test_named_list_and_default():
    labels = load_labels("21k")
    assert len(labels.texts) > 20_000 and "dog" in labels.texts
    assert labels.description.startswith("21k (21841 wnids")
    assert labels.frame["wnid"].is_unique and (labels.frame["label"] != "").all()
    assert load_labels(None).description == labels.description == load_labels("").description


def test_file_of_wnids_and_labels(tmp_path):
    f = tmp_path / "l.txt"
    f.write_text("n02084071\nn04399382  # teddy\nred panda\n\nred panda\n")
    labels = load_labels(f)
    assert labels.texts == ["dog", "teddy", "red panda"]
    assert labels.description == f"file {f} (3 labels)"
    assert labels.frame["wnid"].tolist() == ["n02084071", "n04399382", ""]


def test_dataset_root_gives_its_wnid_folders(tmp_path):
    for w in ("n04399382", "n02084071"):
        (tmp_path / "root" / w).mkdir(parents=True)
    labels = load_labels(tmp_path / "root")
    assert labels.frame["wnid"].tolist() == ["n02084071", "n04399382"] and labels.texts == ["dog", "teddy"]


def test_class_filter_manifest_gives_its_kept_classes_sorted(tmp_path):
    (tmp_path / "cand.txt").write_text("n04399382\nn02084071\nn01443537\n")
    (tmp_path / "id.txt").write_text("n01440764\n")
    run_filter(str(tmp_path / "cand.txt"), str(tmp_path / "id.txt"), out=tmp_path / "flt", exclude=["fish.n.01"])
    labels = load_labels(tmp_path / "flt")
    assert labels.frame["wnid"].tolist() == ["n02084071", "n04399382"]  # goldfish dropped (under fish.n.01)
    assert labels.texts == ["dog", "teddy"]
    assert labels.description == f"class filter {tmp_path / 'flt'} (2 kept classes)"
    pd.testing.assert_frame_equal(labels_from_manifest(tmp_path / "flt"), labels.frame)


def test_unknown_source_is_a_one_line_error(tmp_path):
    with pytest.raises(LabelError, match="unknown --labels"):
        load_labels(str(tmp_path / "missing.txt"))
