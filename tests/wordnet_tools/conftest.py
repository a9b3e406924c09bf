"""Shared fixtures: the real WordNet 3.0 and timm's ImageNet lists, loaded once per test session."""

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
