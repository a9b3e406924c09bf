"""A named benchmark under a data root -> the inputs of ``isood evaluate``: every OOD list imported once into a
manifest (the same importers as ``isood import ...``), kept in the cache under a key of the list's content, so a
second evaluation reuses it and a changed list is imported anew.

Everything the benchmark needs is checked first; what is missing is named in one line (all of it, not the first).
"""

from __future__ import annotations

import hashlib
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

from isood.core.defaults import cache_dir as default_cache_dir
from isood.core.errors import BadInputError
from isood.core.files import sha256_file
from isood.stages.interop import import_imagenet_ood, import_isood_lists, import_openood_imglist
from manifests import read

from .registry import BenchmarkSpec, OodSetSpec

__all__ = ["ResolvedBenchmark", "list_key", "resolve_benchmark"]

#: Bumped when an importer's output for the same list changes: old cache entries are then not reused.
IMPORT_VERSION = "1"
_IMPORTERS: dict[str, Callable] = {"openood-imglist": import_openood_imglist, "imagenet-ood": import_imagenet_ood,
                                   "isood-lists": import_isood_lists}


@dataclass(frozen=True)
class ResolvedBenchmark:
    """What ``isood evaluate`` takes for a benchmark: ``ood`` (``[GROUP:]NAME=MANIFEST`` entries), ``ood_root``
    (``NAME=DIR``), the ID test set (``id_test`` and, for a list, its ``id_test_root`` and ``id_test_labels``)."""

    name: str
    data_root: str
    ood: tuple[str, ...]
    ood_root: tuple[str, ...]
    id_test: str
    id_test_root: str | None = None
    id_test_labels: str | None = None
    manifests: dict[str, str] = field(default_factory=dict)


def list_key(spec: OodSetSpec, path: Path) -> str:
    """The cache key of one OOD set's import: its format and the content of its list (every ``.txt`` file of an
    isood-lists folder, with its relative name), not its path or modification time."""
    h = hashlib.sha256(f"isood benchmark import {IMPORT_VERSION}\0{spec.format}\0".encode())
    files = sorted(p for p in path.rglob("*.txt") if p.is_file()) if path.is_dir() else [path]
    for f in files:
        rel = f.relative_to(path).as_posix() if path.is_dir() else ""
        h.update(f"{rel}\0{sha256_file(f)}\0".encode())
    return h.hexdigest()[:20]


def _import(spec: OodSetSpec, source: Path, cache: Path, verify: str) -> Path:
    out = cache / f"{spec.name}-{list_key(spec, source)}"
    if (out / "manifest.json").is_file():
        read(out, verify=verify)  # a cached import is verified like any input
        return out
    out.parent.mkdir(parents=True, exist_ok=True)
    _IMPORTERS[spec.format](source, out)
    return out


def _id_paths(imglist: Path, cache: Path) -> Path:
    """The image paths of an OpenOOD ``path label`` list as a plain list in the cache (keyed by its content)."""
    from isood.stages.interop.imports import parse_list

    out = cache / f"id_test-{hashlib.sha256(imglist.read_bytes()).hexdigest()[:20]}.txt"
    if not out.is_file():
        entries = parse_list(imglist, labels="required", name="the ID test list")
        out.parent.mkdir(parents=True, exist_ok=True)
        tmp = out.with_name(f".{out.name}.{os.getpid()}.tmp")
        tmp.write_text("".join(f"{e.path}\n" for e in entries), encoding="utf-8")
        os.replace(tmp, out)
    return out


def resolve_benchmark(spec: BenchmarkSpec, data_root: str | os.PathLike, *, cache: str | os.PathLike | None = None,
                      verify: str = "fast") -> ResolvedBenchmark:
    """Check ``data_root`` holds everything ``spec`` names (one line listing what is missing), import each OOD list
    into the cache (``cache``, default ``$ISOOD_CACHE_DIR/benchmarks/<name>``; reused when its content is
    unchanged), and return the evaluation's inputs."""
    root = Path(data_root).expanduser()
    if not root.is_dir():
        raise BadInputError(f"--data-root {data_root}: not a folder; pass the folder holding the {spec.name} "
                            f"benchmark (`isood benchmarks {spec.name}` shows its layout)")
    missing = spec.missing(root)
    if missing:
        shown = "; ".join(missing[:6]) + (f"; and {len(missing) - 6} more" if len(missing) > 6 else "")
        raise BadInputError(f"benchmark {spec.name}: missing under {root}: {shown} (`isood benchmarks {spec.name}` "
                            "shows the layout)")
    where = Path(cache).expanduser() if cache else default_cache_dir("benchmarks", spec.name)
    ood, roots, made = [], [], {}
    for s in spec.ood:
        manifest = _import(s, root / s.list, where, verify)
        made[s.name] = str(manifest)
        ood.append(f"{s.group}:{s.name}={manifest}" if s.group else f"{s.name}={manifest}")
        roots.append(f"{s.name}={(root / s.root).resolve()}")
    t = spec.id_test
    if t.format == "openood-imglist":  # 'path label' lines: the paths as the list, the file as the labels
        id_list = root / str(t.list)
        paths = _id_paths(id_list, where)
        return ResolvedBenchmark(spec.name, str(root.resolve()), tuple(ood), tuple(roots), id_test=str(paths),
                                 id_test_root=str((root / str(t.root)).resolve()),
                                 id_test_labels=str(id_list.resolve()), manifests=made)
    if t.folder:
        return ResolvedBenchmark(spec.name, str(root.resolve()), tuple(ood), tuple(roots),
                                 id_test=str((root / t.folder).resolve()), manifests=made)
    return ResolvedBenchmark(spec.name, str(root.resolve()), tuple(ood), tuple(roots),
                             id_test=str((root / str(t.list)).resolve()),
                             id_test_root=str((root / str(t.root)).resolve()),
                             id_test_labels=str((root / t.labels).resolve()) if t.labels else None, manifests=made)
