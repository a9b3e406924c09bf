"""Shared fixtures: the real WordNet 3.0 and timm's ImageNet lists, loaded once per test run."""

import pytest

from wordnet_tools import Hierarchy, filter_classes, load_synset_list, load_wordnet


@pytest.fixture(scope="session")
def wordnet():
    return load_wordnet()


@pytest.fixture(scope="session")
def hierarchy(wordnet):
    return Hierarchy(wordnet)


@pytest.fixture(scope="session")
def in1k():
    return load_synset_list("1k")


@pytest.fixture(scope="session")
def in21k():
    return load_synset_list("21k")


@pytest.fixture(scope="session")
def filtered_21k(in21k, in1k, hierarchy):
    """21k candidates vs 1k ID with the default exclusion (organism.n.01), indexed by wnid."""
    return filter_classes(in21k, in1k, hierarchy).set_index("wnid", drop=False)


@pytest.fixture(scope="session")
def filtered_21k_sisters(in21k, in1k, hierarchy):
    return filter_classes(in21k, in1k, hierarchy, sisters_only=True).set_index("wnid", drop=False)


# ------------------------------------------------------------------------------------- a made-up hierarchy
from wordnet_tools.errors import UnknownWnidError  # noqa: E402

#: wnid -> (synset name, parents). ID classes: diver, beagle, car. Everything the rules decide here is known
#: by construction (see test_wn_presets.py).
TOY = {
    "n00000001": ("entity.n.01", ()),
    "n00000002": ("organism.n.01", ("n00000001",)),
    "n00000003": ("person.n.01", ("n00000002",)),
    "n00000004": ("diver.n.01", ("n00000003",)),
    "n00000005": ("pianist.n.01", ("n00000003",)),
    "n00000006": ("plant.n.02", ("n00000002",)),
    "n00000007": ("rose.n.01", ("n00000006",)),
    "n00000008": ("animal.n.01", ("n00000002",)),
    "n00000009": ("dog.n.01", ("n00000008",)),
    "n00000010": ("beagle.n.01", ("n00000009",)),
    "n00000011": ("lemon_beagle.n.01", ("n00000010",)),
    "n00000012": ("poodle.n.01", ("n00000009",)),
    "n00000013": ("cat.n.01", ("n00000008",)),
    "n00000014": ("artifact.n.01", ("n00000001",)),
    "n00000015": ("vehicle.n.01", ("n00000014",)),
    "n00000016": ("car.n.01", ("n00000015",)),
    "n00000017": ("bike.n.01", ("n00000015",)),
    "n00000018": ("tool.n.01", ("n00000014",)),
    "n00000019": ("hammer.n.01", ("n00000018",)),
}
TOY_ID = ["n00000004", "n00000010", "n00000016"]


class StubHierarchy(Hierarchy):
    """``Hierarchy`` over the made-up ``TOY`` graph: only the primitive lookups are replaced, the closure and
    nearest-descendant logic the rules use is the real one."""

    def __init__(self, graph=TOY):
        super().__init__(wordnet=None)
        self.graph = dict(graph)
        self.by_name = {name: w for w, (name, _) in self.graph.items()}
        self.id_wnids = list(TOY_ID)
        #: short name ('beagle') -> wnid
        self.w = {name.split(".")[0]: w for w, (name, _) in self.graph.items()}

    def is_known(self, wnid):
        return wnid in self.graph

    def synset(self, wnid):
        if wnid not in self.graph:
            raise UnknownWnidError(f"unknown wnid {wnid!r}", wnid)
        return self.graph[wnid][0]

    def resolve(self, ref):
        if ref in self.graph:
            return ref
        if ref in self.by_name:
            return self.by_name[ref]
        raise UnknownWnidError(f"unknown class {ref!r}", ref)

    def name(self, wnid):
        return self.graph[wnid][0].split(".")[0].replace("_", " ")

    def parents(self, wnid):
        self.synset(wnid)
        return tuple(sorted(self.graph[wnid][1]))

    def children(self, wnid):
        return tuple(sorted(w for w, (_, ps) in self.graph.items() if wnid in ps))


@pytest.fixture()
def toy():
    return StubHierarchy()
