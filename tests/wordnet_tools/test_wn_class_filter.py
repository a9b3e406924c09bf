import random

import pytest

from wordnet_tools.class_filter import RULES, filter_classes, summarise
from wordnet_tools.errors import ClassListError, UnknownWnidError
from wordnet_tools.loader import wnid_of

HAND_BLOWER, BLOWER, DRYER, APPLIANCE = "n03483316", "n02855089", "n03251766", "n02729837"
BELLOWS, CLOTHES_DRYER = "n02826259", "n03050655"
AIRBUS, AIRLINER = "n02686121", "n02690373"
LION_CUB, LION, LIGER, PUPPY = "n01322898", "n02129165", "n02129991", "n01322604"
ORGANISM, ARTIFACT = "n00004475", "n00021939"


def _row(df, wnid):
    return df.loc[wnid].to_dict()


def test_hypernyms_of_an_id_class_are_dropped_with_it_as_conflict(filtered_21k):
    for hyper in (BLOWER, DRYER):
        r = _row(filtered_21k, hyper)
        assert (r["decision"], r["rule"], r["conflict_wnid"], r["conflict_name"], r["conflict_hops"]) == (
            "drop", "hypernym", HAND_BLOWER, "hand blower", 1)


def test_hypernym_conflict_is_the_nearest_id_class_smallest_wnid_on_ties(filtered_21k, in1k, wordnet):
    ids = set(in1k)
    for wnid in (APPLIANCE, "n03183080", "n02084071"):  # appliance, device, dog
        # independent check: walk nltk's hyponyms level by level until ID classes appear
        level, hops = [wordnet.synset_from_pos_and_offset("n", int(wnid[1:]))], 0
        while True:
            hops += 1
            level = [c for s in level for c in s.hyponyms() + s.instance_hyponyms()]
            hits = sorted({wnid_of(s) for s in level} & ids)
            if hits:
                break
        r = _row(filtered_21k, wnid)
        assert (r["rule"], r["conflict_wnid"], r["conflict_hops"]) == ("hypernym", hits[0], hops)
    assert _row(filtered_21k, APPLIANCE)["conflict_wnid"] == HAND_BLOWER


def test_hyponyms_of_an_id_class_are_dropped_with_it_as_conflict(filtered_21k):
    r = _row(filtered_21k, AIRBUS)
    assert (r["rule"], r["conflict_wnid"], r["conflict_name"], r["conflict_hops"]) == (
        "hyponym", AIRLINER, "airliner", 1)
    # lion cub is also an organism: hyponym comes first in the rule precedence
    r = _row(filtered_21k, LION_CUB)
    assert (r["rule"], r["conflict_wnid"], r["conflict_name"]) == ("hyponym", LION, "lion")


def test_id_classes_are_dropped_as_id(filtered_21k, in1k):
    r = _row(filtered_21k, HAND_BLOWER)
    assert (r["rule"], r["conflict_wnid"], r["conflict_hops"]) == ("id", HAND_BLOWER, 0)
    assert (filtered_21k["rule"] == "id").sum() == 999  # teddy bear (1k) is not among the 21k candidates
    assert set(filtered_21k.index[filtered_21k["rule"] == "id"]) == set(in1k) - {"n04399382"}


def test_organisms_dropped_by_subtree_rule_and_kept_without_exclusion(filtered_21k, in21k, in1k, hierarchy):
    for wnid in (LIGER, PUPPY):
        r = _row(filtered_21k, wnid)
        assert (r["rule"], r["conflict_wnid"], r["conflict_name"]) == ("excluded_subtree", ORGANISM, "organism")
    liger, organism = (hierarchy.synset(w) for w in (LIGER, ORGANISM))
    assert _row(filtered_21k, LIGER)["conflict_hops"] == liger.shortest_path_distance(organism) == 9
    open_ = filter_classes(in21k, in1k, hierarchy, exclude=()).set_index("wnid")
    assert open_.loc[LIGER, "decision"] == "keep" and open_.loc[PUPPY, "decision"] == "keep"
    assert (open_["rule"] == "excluded_subtree").sum() == 0
    # the exclusion only moves classes between 'keep' and 'excluded_subtree'
    changed = (open_["rule"] != filtered_21k["rule"])
    assert set(filtered_21k.loc[changed[changed].index, "rule"]) == {"excluded_subtree"}


def test_other_excluded_roots(in21k, in1k, hierarchy):
    df = filter_classes([BELLOWS, LIGER, BLOWER], in1k, hierarchy, exclude=("artifact.n.01", ORGANISM))
    df = df.set_index("wnid")
    assert (df.loc[BELLOWS, "rule"], df.loc[BELLOWS, "conflict_wnid"]) == ("excluded_subtree", ARTIFACT)
    assert (df.loc[LIGER, "rule"], df.loc[LIGER, "conflict_wnid"]) == ("excluded_subtree", ORGANISM)
    assert df.loc[BLOWER, "rule"] == "hypernym"  # hypernym beats excluded_subtree
    root = filter_classes([ARTIFACT], ["n04399382"], hierarchy, exclude="artifact.n.01").iloc[0]
    assert (root["rule"], root["conflict_wnid"], root["conflict_hops"]) == ("hypernym", "n04399382", 2)  # teddy -> plaything -> artifact


def test_sisters_only_keeps_sisters_of_id_classes(filtered_21k_sisters, in1k, hierarchy, wordnet):
    df = filtered_21k_sisters
    assert df.loc[BELLOWS, "decision"] == "keep" and df.loc[CLOTHES_DRYER, "decision"] == "keep"
    assert df.loc["n00006484", "rule"] == "not_sister"  # cell: its parent 'living thing' has no 1k child
    assert df.loc[LIGER, "rule"] == "excluded_subtree"  # a sister of lion, but an organism
    # independent check on a sample: kept <=> clean and shares a direct hypernym with a 1k class (nltk)
    id_parents = set()
    for w in in1k:
        s = wordnet.synset_from_pos_and_offset("n", int(w[1:]))
        id_parents |= {wnid_of(p) for p in s.hypernyms() + s.instance_hypernyms()}
    clean = df[df["rule"].isin(["", "not_sister"])]
    for w in random.Random(0).sample(sorted(clean.index), 300):
        s = wordnet.synset_from_pos_and_offset("n", int(w[1:]))
        shares = bool(id_parents & {wnid_of(p) for p in s.hypernyms() + s.instance_hypernyms()})
        assert (df.loc[w, "decision"] == "keep") == shares, w


def test_kept_classes_are_unrelated_to_id_classes(filtered_21k, in1k, wordnet):
    ids = set(in1k)
    kept = sorted(filtered_21k.index[filtered_21k["decision"] == "keep"])
    for w in random.Random(1).sample(kept, 200):
        s = wordnet.synset_from_pos_and_offset("n", int(w[1:]))
        up = {wnid_of(a) for a in s.closure(lambda x: x.hypernyms() + x.instance_hypernyms())}
        down = {wnid_of(d) for d in s.closure(lambda x: x.hyponyms() + x.instance_hyponyms())}
        assert not (up | down | {w}) & ids, w
        assert ORGANISM not in up, w


def test_table_is_sorted_unique_deterministic_and_summarised(filtered_21k, in21k, in1k, hierarchy):
    df = filtered_21k.reset_index(drop=True)
    assert list(df["wnid"]) == sorted(set(in21k))
    again = filter_classes(list(reversed(in21k)), list(reversed(in1k)), hierarchy)
    assert again.equals(df)
    s = summarise(df)
    assert list(s["rule"]) == [""] + list(RULES)
    assert s["classes"].sum() == len(df) == 21841
    counts = df["rule"].value_counts()
    for _, r in s.iterrows():
        assert r["classes"] == counts.get(r["rule"], 0)
    assert ((df["decision"] == "keep") == (df["rule"] == "")).all()


def test_unknown_candidates_and_bad_inputs(in1k, hierarchy):
    df = filter_classes(["n00000001", BELLOWS], in1k, hierarchy, fallback_names={"n00000001": "mystery"})
    r = df.set_index("wnid").loc["n00000001"]
    assert (r["decision"], r["rule"], r["name"], r["conflict_wnid"]) == ("drop", "unknown", "mystery", "")
    with pytest.raises(UnknownWnidError, match="n00000001"):
        filter_classes([BELLOWS], ["n00000001"], hierarchy)
    with pytest.raises(ClassListError, match="empty"):  # an IsoodError (exit 2), still a ValueError
        filter_classes([BELLOWS], [], hierarchy)
    with pytest.raises(UnknownWnidError, match="organsm"):
        filter_classes([BELLOWS], in1k, hierarchy, exclude=("organsm.n.01",))
