"""Queries on the WordNet 3.0 noun hierarchy, addressed by ImageNet wnid.

The hypernym graph used throughout: an edge joins a synset to each of its hypernyms and instance hypernyms
(``dog.n.01 -> canine.n.02``). Ancestors/descendants are its transitive closure upwards/downwards (self
excluded); "hops" count edges. Everything is computed lazily and cached in dicts on the instance: building
the full noun closure takes ~7 s, but the ancestors of a class are ~10-20 synsets, so the filter asks for
ancestors of the candidates and of the ID classes only, and tests "is a descendant of" via those ancestor sets.
"""

from __future__ import annotations

import warnings
from collections import deque
from collections.abc import Iterable, Mapping
from functools import lru_cache

from isood.core.errors import BadInputError
from wordnet_tools.errors import UnknownWnidError
from wordnet_tools.loader import load_wordnet, synset_from_wnid, wnid_of
from wordnet_tools.wnids import is_wnid


class Hierarchy:
    """Hypernym-graph queries on wnids over one nltk ``WordNetCorpusReader`` (WordNet 3.0)."""

    def __init__(self, wordnet):
        self.wordnet = wordnet
        self._synsets: dict[str, object] = {}  # wnid -> synset, or None when WordNet has no such noun
        self._parents: dict[str, tuple[str, ...]] = {}
        self._children: dict[str, tuple[str, ...]] = {}
        self._ancestor_hops: dict[str, dict[str, int]] = {}
        self._descendants: dict[str, frozenset[str]] = {}
        self._nearest_descendant: dict[frozenset[str], dict[str, tuple[int, str]]] = {}

    # --- synsets ---------------------------------------------------------------------------------------------
    def is_known(self, wnid: str) -> bool:
        """True if ``wnid`` is well formed and names a WordNet 3.0 noun synset."""
        if wnid not in self._synsets:
            if not is_wnid(wnid):
                return False
            try:
                self._synsets[wnid] = synset_from_wnid(wnid, self.wordnet)
            except UnknownWnidError:
                self._synsets[wnid] = None
        return self._synsets[wnid] is not None

    def synset(self, wnid: str):
        """The nltk synset of ``wnid``; UnknownWnidError if malformed or unknown."""
        if not self.is_known(wnid):
            synset_from_wnid(wnid, self.wordnet)  # raises the specific message (malformed vs unknown)
        return self._synsets[wnid]

    def resolve(self, ref: str) -> str:
        """The wnid of a class given as a wnid (``n00004475``) or a synset name (``organism.n.01``)."""
        if is_wnid(ref):
            self.synset(ref)
            return ref
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                synset = self.wordnet.synset(ref)
        except Exception as exc:  # nltk raises WordNetError/ValueError for unknown or malformed names
            raise UnknownWnidError(
                f"unknown class {ref!r}: give a wnid (n00004475) or a noun synset name (organism.n.01)", ref
            ) from exc
        if synset.pos() != "n":
            raise UnknownWnidError(f"{ref!r} is not a noun synset; ImageNet classes are nouns", ref)
        wnid = wnid_of(synset)
        self._synsets.setdefault(wnid, synset)
        return wnid

    def name(self, wnid: str) -> str:
        """First lemma of the synset, underscores as spaces (``n03483316`` -> 'hand blower')."""
        return self.lemmas(wnid)[0]

    def lemmas(self, wnid: str) -> list[str]:
        """All lemma names of the synset, underscores as spaces, in WordNet's order."""
        return [name.replace("_", " ") for name in self.synset(wnid).lemma_names()]

    def definition(self, wnid: str) -> str:
        """The synset's gloss."""
        return self.synset(wnid).definition()

    # --- graph -----------------------------------------------------------------------------------------------
    def parents(self, wnid: str) -> tuple[str, ...]:
        """Direct hypernyms and instance hypernyms, sorted by wnid."""
        if wnid not in self._parents:
            s = self.synset(wnid)
            found = sorted({wnid_of(p) for p in s.hypernyms() + s.instance_hypernyms()})
            self._parents[wnid] = tuple(found)
        return self._parents[wnid]

    def children(self, wnid: str) -> tuple[str, ...]:
        """Direct hyponyms and instance hyponyms, sorted by wnid."""
        if wnid not in self._children:
            s = self.synset(wnid)
            found = sorted({wnid_of(c) for c in s.hyponyms() + s.instance_hyponyms()})
            self._children[wnid] = tuple(found)
        return self._children[wnid]

    def ancestor_hops(self, wnid: str) -> Mapping[str, int]:
        """Every ancestor (self excluded) -> fewest hypernym hops from ``wnid`` up to it. Cached."""
        cached = self._ancestor_hops.get(wnid)
        if cached is not None:
            return cached
        # Iterative post-order so deep chains cannot hit the recursion limit.
        stack = [wnid]
        while stack:
            node = stack[-1]
            pending = [p for p in self.parents(node) if p not in self._ancestor_hops]
            if pending:
                stack.extend(pending)
                continue
            stack.pop()
            if node in self._ancestor_hops:
                continue
            hops: dict[str, int] = {}
            for p in self.parents(node):
                hops[p] = 1
                for a, h in self._ancestor_hops[p].items():
                    if h + 1 < hops.get(a, 1 << 30):
                        hops[a] = h + 1
            self._ancestor_hops[node] = hops
        return self._ancestor_hops[wnid]

    def ancestors(self, wnid: str) -> frozenset[str]:
        """All hypernyms and instance hypernyms, transitively, excluding ``wnid`` itself."""
        return frozenset(self.ancestor_hops(wnid))

    def descendants(self, wnid: str) -> frozenset[str]:
        """All hyponyms and instance hyponyms, transitively, excluding ``wnid`` itself. Cached per wnid.

        Costs a walk of the subtree (organism.n.01: ~1 s); for "is x under y" use ``in_subtree``, which does not.
        """
        if wnid not in self._descendants:
            seen: set[str] = set()
            queue = deque(self.children(wnid))
            while queue:
                node = queue.popleft()
                if node not in seen:
                    seen.add(node)
                    queue.extend(self.children(node))
            self._descendants[wnid] = frozenset(seen)
        return self._descendants[wnid]

    def sisters(self, wnid: str) -> frozenset[str]:
        """Classes that share a direct hypernym (or instance hypernym) with ``wnid``, excluding itself."""
        out: set[str] = set()
        for p in self.parents(wnid):
            out.update(self.children(p))
        out.discard(wnid)
        return frozenset(out)

    def in_subtree(self, wnid: str, root: str) -> bool:
        """True if ``wnid`` is ``root`` or one of its descendants; root as wnid or synset name."""
        root_wnid = self.resolve(root)
        return wnid == root_wnid or root_wnid in self.ancestor_hops(wnid)

    # --- distances to a set of classes ----------------------------------------------------------------------
    def nearest_ancestor_in(self, wnid: str, wnids: Iterable[str]) -> tuple[int, str] | None:
        """(hops, wnid) of the nearest ancestor of ``wnid`` in ``wnids``; ties -> smallest wnid; None if none."""
        hops = self.ancestor_hops(wnid)
        found = [(hops[w], w) for w in set(wnids) if w in hops]
        return min(found) if found else None

    def nearest_descendants(self, wnids: Iterable[str]) -> Mapping[str, tuple[int, str]]:
        """For every ancestor of a class in ``wnids``: (hops, wnid) of its nearest descendant in ``wnids``.

        Ties go to the smallest wnid. Built once per distinct set from the classes' ancestor sets (no descendant
        walk) and cached, so "is x a hypernym of some class in the set" is one dict lookup.
        """
        key = frozenset(wnids)
        if key not in self._nearest_descendant:
            index: dict[str, tuple[int, str]] = {}
            for w in sorted(key):
                for a, h in self.ancestor_hops(w).items():
                    if (h, w) < index.get(a, (1 << 30, "")):
                        index[a] = (h, w)
            self._nearest_descendant[key] = index
        return self._nearest_descendant[key]

    def nearest_in(self, wnid: str, wnids: Iterable[str]) -> tuple[int, str]:
        """(hops, wnid) of the class in ``wnids`` nearest to ``wnid`` along the undirected hypernym graph.

        Breadth-first search from ``wnid``; ties at the same distance go to the smallest wnid.
        """
        targets = frozenset(wnids)
        if not targets:
            raise BadInputError("nearest_in: the set of classes is empty; pass at least one wnid")
        self.synset(wnid)
        if wnid in targets:
            return 0, wnid
        seen = {wnid}
        frontier = [wnid]
        hops = 0
        while frontier:
            hops += 1
            nxt: list[str] = []
            for node in frontier:
                for nb in self.parents(node) + self.children(node):
                    if nb not in seen:
                        seen.add(nb)
                        nxt.append(nb)
            hits = [w for w in nxt if w in targets]
            if hits:
                return hops, min(hits)
            frontier = nxt
        raise BadInputError(f"no class of the given set is connected to {wnid} in the hypernym graph")

    def hop_distance(self, wnid: str, wnids: Iterable[str]) -> int:
        """Shortest path length (undirected hypernym graph) from ``wnid`` to the nearest class in ``wnids``."""
        return self.nearest_in(wnid, wnids)[0]

    def hop_distances(self, wnids: Iterable[str], targets: Iterable[str]) -> dict[str, int]:
        """``hop_distance`` for many classes at once: one breadth-first search from all ``targets`` together,
        stopped as soon as every class in ``wnids`` is reached. Unknown wnids raise UnknownWnidError."""
        targets = frozenset(targets)
        if not targets:
            raise BadInputError("hop_distances: the set of classes is empty; pass at least one wnid")
        wanted = set(wnids)
        for w in sorted(wanted | targets):
            self.synset(w)
        dist = {t: 0 for t in targets}
        remaining = wanted - targets
        frontier = sorted(targets)
        hops = 0
        while frontier and remaining:
            hops += 1
            nxt: list[str] = []
            for node in frontier:
                for nb in self.parents(node) + self.children(node):
                    if nb not in dist:
                        dist[nb] = hops
                        nxt.append(nb)
                        remaining.discard(nb)
            frontier = nxt
        return {w: dist[w] for w in sorted(wanted)}


@lru_cache(maxsize=1)
def load_hierarchy() -> Hierarchy:
    """A process-wide ``Hierarchy`` over ``load_wordnet()`` (its closure caches are shared by every caller)."""
    return Hierarchy(load_wordnet())
