"""WordNet 3.0 tools for ImageNet class lists: loading, synset lists, hierarchy queries, the ImageNet-OOD class
filter and the class-list audit. Everything is offline (timm's bundled lists, a local WordNet)."""

from functools import lru_cache

from wordnet_tools.audit import audit_classes, leaks, parse_class_list
from wordnet_tools.class_filter import DEFAULT_EXCLUDE, RULES, ClassRules, filter_classes, summarise
from wordnet_tools.errors import ClassListError, UnknownWnidError, WordNetNotFound
from wordnet_tools.hierarchy import Hierarchy
from wordnet_tools.loader import find_wordnet_source, load_wordnet, synset_from_wnid, wnid_of
from wordnet_tools.synsets import NAMED_LISTS, imagenet_definitions, imagenet_lemmas, imagenet_names, load_synset_list


@lru_cache(maxsize=1)
def load_hierarchy() -> Hierarchy:
    """A process-wide Hierarchy over ``load_wordnet()`` (its caches are shared by every caller)."""
    return Hierarchy(load_wordnet())


__all__ = [
    "DEFAULT_EXCLUDE", "NAMED_LISTS", "RULES", "ClassListError", "ClassRules", "Hierarchy", "UnknownWnidError",
    "WordNetNotFound", "audit_classes", "filter_classes", "find_wordnet_source", "imagenet_definitions",
    "imagenet_lemmas", "imagenet_names", "leaks", "load_hierarchy", "load_synset_list", "load_wordnet",
    "parse_class_list", "summarise", "synset_from_wnid", "wnid_of",
]
