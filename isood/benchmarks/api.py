"""``isood.Benchmark``: a benchmark as an object (like pytorch-ood's ``Benchmark``), beside the CLI's strings.

    import isood
    from isood.detectors import KNN, MSP
    bench = isood.Benchmark.from_name("openood-v1.5-imagenet1k", data_root="/data/openood")
    ev = bench.evaluate("resnet50", id_train="imagenet/train", detectors=[MSP(), KNN(k=50)])
    ev.per_set                                            # the same frames as isood.evaluate

    bench = isood.Benchmark.from_manifests(ood={"grid": "out/splits", "near:ssb": "imports/ssb"},
                                           roots={"ssb": "/data/ssb"}, id_test="imagenet/val")

``isood evaluate --benchmark NAME --data-root DIR`` resolves a benchmark the same way (``resolve_benchmark``).
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Any, Mapping

from isood.core.errors import BadInputError
from isood.stages.evaluate.api import Evaluation, evaluate

from .registry import BenchmarkSpec, get_benchmark
from .resolve import resolve_benchmark

__all__ = ["Benchmark"]


def _entries(value: Mapping[str, Any] | None, what: str) -> dict[str, str]:
    if value is None:
        return {}
    if not isinstance(value, Mapping):
        raise BadInputError(f"{what}: pass a dict {{name: path}}")
    return {str(k): os.fspath(v) for k, v in value.items()}


@dataclass(frozen=True)
class Benchmark:
    """OOD sets (``ood``: ``{[group:]name: manifest}``), their image roots (``roots``) and an ID test set
    (``id_test``, with ``id_test_root`` / ``id_test_labels`` for a flat list), named ``name``."""

    name: str
    ood: dict[str, str]
    id_test: str | None = None
    roots: dict[str, str] = field(default_factory=dict)
    id_test_root: str | None = None
    id_test_labels: str | None = None
    spec: BenchmarkSpec | None = None

    @classmethod
    def from_name(cls, name: str | os.PathLike, data_root: str | os.PathLike, *,
                  cache: str | os.PathLike | None = None, verify: str = "fast") -> Benchmark:
        """A registered benchmark (``isood benchmarks``; or a ``.toml`` file) found under ``data_root``: its lists
        imported once into the cache (``resolve_benchmark``); one line naming whatever is missing."""
        spec = get_benchmark(name)
        r = resolve_benchmark(spec, data_root, cache=cache, verify=verify)
        ood = {}
        for entry in r.ood:
            key, _, manifest = entry.partition("=")
            ood[key] = manifest
        roots = dict(x.split("=", 1) for x in r.ood_root)
        return cls(name=spec.name, ood=ood, id_test=r.id_test, roots=roots, id_test_root=r.id_test_root,
                   id_test_labels=r.id_test_labels, spec=spec)

    @classmethod
    def from_manifests(cls, *, ood: Mapping[str, Any] | None = None, splits: str | os.PathLike | None = None,
                       syn: str | os.PathLike | None = None, roots: Mapping[str, Any] | None = None,
                       id_test: str | os.PathLike | None = None, id_test_root: str | os.PathLike | None = None,
                       id_test_labels: str | os.PathLike | None = None, name: str = "custom") -> Benchmark:
        """A benchmark of manifests you have: ``splits`` / ``syn`` (the datasets ``splits`` and ``syn-is``) and
        any ``ood`` ``{[group:]name: manifest}``."""
        sets = _entries(ood, "ood")
        if splits is not None:
            sets = {"splits": os.fspath(splits), **sets}
        if syn is not None:
            sets = {"syn-is": os.fspath(syn), **sets}
        if not sets:
            raise BadInputError("Benchmark.from_manifests: pass splits=, syn= or ood={name: manifest}")
        return cls(name=name, ood=sets, id_test=os.fspath(id_test) if id_test is not None else None,
                   roots=_entries(roots, "roots"),
                   id_test_root=os.fspath(id_test_root) if id_test_root is not None else None,
                   id_test_labels=os.fspath(id_test_labels) if id_test_labels is not None else None)

    def evaluate(self, model=None, *, detectors: Any = None, **options: Any) -> Evaluation:
        """``isood.evaluate`` on this benchmark: the same options (``id_train``, ``preprocess``, ``na_threshold``,
        ...), ``detectors`` as a spec string or detector objects; returns the same ``Evaluation`` frames."""
        sets = dict(self.ood)
        kw: dict[str, Any] = {}
        for key in ("splits", "syn-is"):  # the two named datasets go by their own options, as on the CLI
            if key in sets:
                kw["splits" if key == "splits" else "syn"] = sets.pop(key)
        id_test = options.pop("id_test", None) or self.id_test
        if id_test is None:
            raise BadInputError(f"benchmark {self.name}: no ID test set; pass id_test=...")
        for key in ("id_test_root", "id_test_labels"):
            if getattr(self, key) is not None:
                options.setdefault(key, getattr(self, key))
        if detectors is not None:
            kw["detectors"] = detectors
        return evaluate(model, id_test=id_test, ood=sets or None, roots=dict(self.roots) or None, **kw, **options)
