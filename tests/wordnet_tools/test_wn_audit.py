import pytest

from isood.core.errors import BadInputError
from wordnet_tools.audit import audit_classes, leaks, parse_class_list
from wordnet_tools.class_filter import filter_classes, summarise
from wordnet_tools.errors import ClassListError

HAND_BLOWER, DRYER, AIRBUS, AIRLINER = "n03483316", "n03251766", "n02686121", "n02690373"
BELLOWS, CLOTHES_DRYER, ABATTOIR, PUPPY = "n02826259", "n03050655", "n02666943", "n01322604"


def test_parse_accepts_wnids_and_image_paths():
    lines = [
        "# header", "", "n02826259",
        "n03050655/img1.JPEG",
        "data/train/n02666943/x.JPEG",
        "n03483316_10026.JPEG",
        "val/n02686121/ILSVRC2012_val_00000293.JPEG 404",
        r"C:\\imgs\\n03251766\\a.jpg",
        "root/n01322604/",
    ]
    assert parse_class_list(lines, "list.txt") == [
        (3, BELLOWS), (4, CLOTHES_DRYER), (5, ABATTOIR), (6, HAND_BLOWER), (7, AIRBUS), (8, DRYER), (9, PUPPY),
    ]


def test_parse_error_names_source_and_line():
    lines = ["n02826259"] * 16 + ["foo bar"]
    with pytest.raises(ClassListError) as info:
        parse_class_list(lines, "list.txt")
    assert str(info.value).startswith("list.txt:17: no wnid in 'foo bar'")
    with pytest.raises(ClassListError, match=r"x\.txt:1: no wnid in 'n0282625/a\.jpg'"):
        parse_class_list(["n0282625/a.jpg"], "x.txt")


def test_audit_finds_exactly_the_planted_leaks(in1k, hierarchy):
    lines = (
        [f"ood/{BELLOWS}/{i}.JPEG" for i in range(5)]
        + [f"ood/{CLOTHES_DRYER}/{i}.JPEG" for i in range(3)]
        + [f"{ABATTOIR}_{i}.JPEG" for i in range(4)]
        + [f"ood/{HAND_BLOWER}/{i}.JPEG" for i in range(2)]  # an ID class
        + [f"ood/{DRYER}/{i}.JPEG" for i in range(6)]  # a hypernym of hand blower
        + [f"ood/{AIRBUS}/{i}.JPEG" for i in range(7)]  # a hyponym of airliner
        + [f"ood/{PUPPY}/{i}.JPEG" for i in range(1)]  # an organism
        + ["ood/n00000001/a.JPEG", "ood/n00000001/b.JPEG"]  # not in WordNet
    )
    df = audit_classes(parse_class_list(lines, "list.txt"), in1k, hierarchy)
    found = leaks(df).set_index("wnid")
    assert found[["rule", "conflict_wnid", "entries"]].to_dict("index") == {
        "n00000001": {"rule": "unknown", "conflict_wnid": "", "entries": 2},
        PUPPY: {"rule": "excluded_subtree", "conflict_wnid": "n00004475", "entries": 1},
        AIRBUS: {"rule": "hyponym", "conflict_wnid": AIRLINER, "entries": 7},
        DRYER: {"rule": "hypernym", "conflict_wnid": HAND_BLOWER, "entries": 6},
        HAND_BLOWER: {"rule": "id", "conflict_wnid": HAND_BLOWER, "entries": 2},
    }
    assert found.loc[DRYER, "conflict_name"] == "hand blower"
    clean = df[df["decision"] == "keep"].set_index("wnid")["entries"].to_dict()
    assert clean == {ABATTOIR: 4, BELLOWS: 5, CLOTHES_DRYER: 3}
    s = summarise(df).set_index("rule")
    assert s.loc["", "classes"] == 3 and s.loc["", "entries"] == 12
    assert s.loc["hypernym", "entries"] == 6 and s.loc["unknown", "entries"] == 2
    assert s.loc["not_sister", "classes"] == 0 and s["entries"].sum() == len(lines)
    # without the organism exclusion the puppy is clean
    open_ = audit_classes(parse_class_list(lines, "list.txt"), in1k, hierarchy, exclude=())
    assert PUPPY not in set(leaks(open_)["wnid"])


def test_audit_agrees_with_filter(in1k, hierarchy):
    wnids = [BELLOWS, HAND_BLOWER, DRYER, AIRBUS, PUPPY, "n00000001"]
    audit = audit_classes({w: 1 for w in wnids}, in1k, hierarchy).drop(columns="entries")
    assert audit.equals(filter_classes(wnids, in1k, hierarchy))
    counted = audit_classes([BELLOWS, BELLOWS, DRYER], in1k, hierarchy)
    assert counted.set_index("wnid")["entries"].to_dict() == {BELLOWS: 2, DRYER: 1}


def test_negative_counts_are_a_bad_input(in1k, hierarchy):
    with pytest.raises(BadInputError, match=BELLOWS):
        audit_classes({BELLOWS: -1}, in1k, hierarchy)
