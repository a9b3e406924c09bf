"""WordNet 3.0 tools for ImageNet class lists: loading, synset lists, hierarchy queries, the ImageNet-OOD class
filter (with its presets) and the audit of class lists and manifests (per class, per image, per cell).
Everything is offline (timm's bundled lists, a local WordNet).

``wnid_from_path`` (``wordnet_tools.wnids``) is isood's one rule for the class an image path names; ``wnid_of``
maps a synset to its wnid. The commands that use it (``isood wordnet filter`` / ``audit``) live with isood's stages.
Names are re-exported lazily: ``import wordnet_tools.wnids`` does not load nltk.
"""

from __future__ import annotations

from isood.core.lazy import lazy_exports

_MODULES = {
    "audit_classes": "audit", "audit_images": "audit", "leaks": "audit", "parse_class_list": "audit",
    "PRESETS": "rules", "LEAK_RULES": "rules", "resolve_exclude": "rules", "leak_mask": "rules",
    "DEFAULT_EXCLUDE": "class_filter", "RULES": "class_filter", "ClassRules": "class_filter",
    "filter_classes": "class_filter", "summarise": "class_filter",
    "ClassListError": "errors", "UnknownWnidError": "errors", "WordNetNotFound": "errors",
    "Hierarchy": "hierarchy", "load_hierarchy": "hierarchy",
    "find_wordnet_source": "loader", "load_wordnet": "loader", "synset_from_wnid": "loader", "wnid_of": "loader",
    "NAMED_LISTS": "synsets", "imagenet_definitions": "synsets", "imagenet_lemmas": "synsets",
    "imagenet_names": "synsets", "load_synset_list": "synsets",
    "WNID_RE": "wnids", "is_wnid": "wnids", "wnid_from_path": "wnids",
}
_EXPORTS = {name: f"{__name__}.{module}" for name, module in _MODULES.items()}
__all__ = sorted(_EXPORTS)
__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS)
