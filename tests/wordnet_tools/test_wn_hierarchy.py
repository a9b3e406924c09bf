import pytest

from isood.core.errors import BadInputError
from wordnet_tools.errors import UnknownWnidError
from wordnet_tools.loader import wnid_of

HAND_BLOWER = "n03483316"
BLOWER, DRYER, APPLIANCE, DEVICE = "n02855089", "n03251766", "n02729837", "n03183080"
LION, TIGER, LIGER, BIG_CAT = "n02129165", "n02129604", "n02129991", "n02127808"
ORGANISM, ENTITY = "n00004475", "n00001740"


def _nltk_closure(synset, rel):
    return {wnid_of(s) for s in synset.closure(rel)}


def _up(s):
    return s.hypernyms() + s.instance_hypernyms()


def _down(s):
    return s.hyponyms() + s.instance_hyponyms()


def test_ancestors_match_nltk_closure(hierarchy, wordnet):
    anc = hierarchy.ancestors(HAND_BLOWER)
    assert {BLOWER, DRYER, APPLIANCE, DEVICE, ENTITY} <= anc
    assert HAND_BLOWER not in anc
    assert anc == _nltk_closure(wordnet.synset("hand_blower.n.01"), _up)
    assert hierarchy.ancestor_hops(HAND_BLOWER)[BLOWER] == 1
    assert hierarchy.ancestor_hops(HAND_BLOWER)[APPLIANCE] == 2
    assert hierarchy.ancestor_hops(HAND_BLOWER)[ENTITY] == 8


def test_ancestors_follow_instance_hypernyms(hierarchy):
    einstein = hierarchy.resolve("einstein.n.01")
    assert hierarchy.parents(einstein) == (hierarchy.resolve("physicist.n.01"),)
    assert hierarchy.resolve("person.n.01") in hierarchy.ancestors(einstein)
    assert einstein in hierarchy.descendants(hierarchy.resolve("physicist.n.01"))


def test_descendants_match_nltk_closure(hierarchy, wordnet):
    desc = hierarchy.descendants(BIG_CAT)
    assert {LION, TIGER, LIGER} <= desc
    assert BIG_CAT not in desc
    assert desc == _nltk_closure(wordnet.synset("big_cat.n.01"), _down)


def test_sisters_share_a_direct_hypernym(hierarchy):
    assert hierarchy.sisters(LION) == {
        "n02128385", "n02128757", "n02128925", TIGER, LIGER, "n02130086", "n02130308", "n02130545",
    }  # leopard, snow leopard, jaguar, tiger, liger, tiglon, cheetah, saber-toothed tiger
    # hand blower has two parents (blower, dryer): bellows is under the first, clothes dryer under the second
    assert hierarchy.sisters(HAND_BLOWER) == {"n02826259", "n03050655"}


def test_in_subtree_by_wnid_or_synset_name(hierarchy):
    assert hierarchy.in_subtree(LION, "organism.n.01")
    assert hierarchy.in_subtree(LION, ORGANISM)
    assert hierarchy.in_subtree(ORGANISM, "organism.n.01")  # the root itself
    assert not hierarchy.in_subtree(HAND_BLOWER, "organism.n.01")
    assert hierarchy.in_subtree(HAND_BLOWER, "device.n.01")
    with pytest.raises(UnknownWnidError, match="organsm.n.01"):
        hierarchy.in_subtree(LION, "organsm.n.01")
    with pytest.raises(UnknownWnidError, match="not a noun"):
        hierarchy.in_subtree(LION, "run.v.01")


def test_hop_distance_undirected(hierarchy, in1k):
    assert hierarchy.hop_distance(LION, {LION}) == 0
    assert hierarchy.hop_distance(LION, {TIGER}) == 2  # via big cat
    assert hierarchy.hop_distance(BIG_CAT, {TIGER, ENTITY}) == 1
    assert hierarchy.hop_distance(BLOWER, in1k) == 1  # hand blower is its hyponym
    assert hierarchy.nearest_in(LIGER, in1k) == (2, "n02128385")  # nearest: sisters at 2 hops, smallest wnid
    assert hierarchy.hop_distances([LIGER, BLOWER, LION], in1k) == {LIGER: 2, BLOWER: 1, LION: 0}
    with pytest.raises(BadInputError, match="empty"):
        hierarchy.hop_distance(LION, [])


def test_names_lemmas_definitions(hierarchy):
    assert hierarchy.name(HAND_BLOWER) == "hand blower"
    assert hierarchy.lemmas(HAND_BLOWER)[:3] == ["hand blower", "blow dryer", "blow drier"]
    assert "hair dryer" in hierarchy.lemmas(HAND_BLOWER)
    assert hierarchy.definition(HAND_BLOWER).startswith("a hand-held electric blower")
    assert hierarchy.name("n02084071") == "dog"


def test_unknown_wnid_raises_specific_error(hierarchy):
    assert not hierarchy.is_known("n00000001")
    assert not hierarchy.is_known("dog")
    for query in (hierarchy.name, hierarchy.ancestors, hierarchy.sisters, hierarchy.descendants):
        with pytest.raises(UnknownWnidError, match="n00000001"):
            query("n00000001")
    with pytest.raises(UnknownWnidError):
        hierarchy.hop_distance("n00000001", {LION})
