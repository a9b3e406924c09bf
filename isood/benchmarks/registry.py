"""Named benchmarks: descriptions kept as data files, like open_clip's model configs.

A benchmark is one TOML file (``isood/benchmarks/data/*.toml`` ships ``is-ood``, ``imagenet-ood`` and
``openood-v1.5-imagenet1k``; add your own in a folder named by ``$ISOOD_BENCHMARKS`` (several: separated by
``os.pathsep``), or pass a file's path wherever a name is taken)::

    name = "my-bench"
    title = "one line"
    source = "where the lists come from"
    [id_test]                       # the ID test set: a list (+ its image root, optional labels) or a folder
    list = "lists/test_id.txt"      # relative to DATA_ROOT
    root = "images"
    format = "openood-imglist"      # optional: 'path label' lines (default 'paths': one image per line)
    labels = "lists/test_id.txt"    # optional: '<image> <label>' lines (an openood-imglist list is its own)
    [[ood]]                         # one table per OOD set
    name = "far_set"
    group = "far"                   # near, far or none (omit)
    format = "openood-imglist"      # openood-imglist | imagenet-ood | isood-lists (a folder of per-cell lists)
    list = "lists/test_far.txt"     # the list (a folder for isood-lists), relative to DATA_ROOT
    root = "images"                 # the folder its image paths are relative to, relative to DATA_ROOT

Every path is relative to the data root the user passes (``--data-root``): ``missing`` names what is not there.
"""

from __future__ import annotations

import os
import re
import tomllib
from dataclasses import dataclass
from pathlib import Path, PurePosixPath

from isood.core.defaults import OOD_GROUPS
from isood.core.errors import BadInputError

__all__ = ["ENV_BENCHMARKS", "LIST_FORMATS", "ID_LIST_FORMATS", "IdTestSpec", "OodSetSpec", "BenchmarkSpec", "benchmark_folders",
           "available_benchmarks", "get_benchmark", "parse_benchmark"]

#: Folders of user benchmark files (``os.pathsep``-separated), searched after the built-in ones.
ENV_BENCHMARKS = "ISOOD_BENCHMARKS"
#: How an OOD set's list is read: the importer of that format (``isood import ...``).
LIST_FORMATS = ("openood-imglist", "imagenet-ood", "isood-lists")
#: How the ID test list is read: one image path per line, or OpenOOD's 'path label' lines (the labels are then the
#: ground truth, as --id-test-labels).
ID_LIST_FORMATS = ("paths", "openood-imglist")
_BUILTIN = Path(__file__).resolve().parent / "data"
_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*$")
_RESERVED = {"id_train", "id_test", "splits", "syn-is", *OOD_GROUPS.values()}


@dataclass(frozen=True)
class IdTestSpec:
    """The ID test set of a benchmark: a ``list`` with its image ``root`` (and optional ``labels`` file), or a
    ``folder`` of wnid sub-folders; paths relative to the data root."""

    list: str | None = None
    root: str | None = None
    labels: str | None = None
    folder: str | None = None
    format: str = "paths"             # paths (one image per line) or openood-imglist ('path label' lines)


@dataclass(frozen=True)
class OodSetSpec:
    """One OOD set: its ``name``, OpenOOD ``group`` ('near', 'far' or ''), list ``format``, the ``list`` (file, or
    folder for isood-lists) and the image ``root``, relative to the data root."""

    name: str
    format: str
    list: str
    root: str
    group: str = ""


@dataclass(frozen=True)
class BenchmarkSpec:
    """A named benchmark (module docstring): where its description came from (``file``) and its sets."""

    name: str
    title: str
    source: str
    id_test: IdTestSpec
    ood: tuple[OodSetSpec, ...]
    file: str

    def paths(self) -> list[tuple[str, str, bool]]:
        """``(relative path, what it is, is a folder)`` of everything the benchmark needs under its data root."""
        need: list[tuple[str, str, bool]] = []
        t = self.id_test
        if t.folder:
            need.append((t.folder, "ID test folder", True))
        else:
            need.append((str(t.list), "ID test list", False))
            need.append((str(t.root), "ID test image root", True))
            if t.labels and t.labels != t.list:
                need.append((t.labels, "ID test labels", False))
        for s in self.ood:
            need.append((s.list, f"{s.name} {'lists folder' if s.format == 'isood-lists' else 'list'}",
                         s.format == "isood-lists"))
            need.append((s.root, f"{s.name} image root", True))
        return list(dict.fromkeys(need))

    def missing(self, data_root: str | os.PathLike) -> list[str]:
        """What ``paths()`` lacks under ``data_root`` (each as ``'REL (what)'``); empty when all is there."""
        root = Path(data_root)
        out = []
        for rel, what, folder in self.paths():
            p = root / rel
            if not (p.is_dir() if folder else p.is_file()):
                out.append(f"{rel} ({what})")
        return out


def _relative(value: object, where: str) -> str:
    if not isinstance(value, str) or not value.strip():
        raise BadInputError(f"{where}: must be a path relative to the data root, got {value!r}")
    p = PurePosixPath(value.strip())
    if p.is_absolute() or ".." in p.parts or "\x00" in value:
        raise BadInputError(f"{where}: {value!r} must stay inside the data root (relative, no '..')")
    return str(p)


def _table(data: dict, key: str, where: str) -> dict:
    value = data.get(key)
    if not isinstance(value, dict):
        raise BadInputError(f"{where}: needs a [{key}] table")
    return value


def _id_test(data: dict, where: str) -> IdTestSpec:
    t = _table(data, "id_test", where)
    unknown = sorted(set(t) - {"list", "root", "labels", "folder", "format"})
    if unknown:
        raise BadInputError(f"{where}: [id_test] has an unknown key {unknown[0]!r}; pass list, root, labels, format "
                            "or folder")
    fmt = t.get("format", "paths")
    if fmt not in ID_LIST_FORMATS:
        raise BadInputError(f"{where}: [id_test] format {fmt!r} must be one of {', '.join(ID_LIST_FORMATS)}")
    if "folder" in t:
        if set(t) != {"folder"}:
            raise BadInputError(f"{where}: [id_test] takes either folder or list + root (+ labels), not both")
        return IdTestSpec(folder=_relative(t["folder"], f"{where} [id_test] folder"))
    if "list" not in t or "root" not in t:
        raise BadInputError(f"{where}: [id_test] needs list and root (or folder)")
    labels = _relative(t["labels"], f"{where} [id_test] labels") if "labels" in t else None
    return IdTestSpec(list=_relative(t["list"], f"{where} [id_test] list"),
                      root=_relative(t["root"], f"{where} [id_test] root"), labels=labels, format=fmt)


def _ood(data: dict, where: str) -> tuple[OodSetSpec, ...]:
    sets = data.get("ood")
    if not isinstance(sets, list) or not sets:
        raise BadInputError(f"{where}: needs at least one [[ood]] table")
    out: list[OodSetSpec] = []
    for i, s in enumerate(sets):
        w = f"{where} [[ood]] #{i + 1}"
        if not isinstance(s, dict):
            raise BadInputError(f"{w}: must be a table")
        unknown = sorted(set(s) - {"name", "group", "format", "list", "root"})
        if unknown:
            raise BadInputError(f"{w}: unknown key {unknown[0]!r}; pass name, group, format, list, root")
        name = s.get("name")
        if not isinstance(name, str) or not _NAME.match(name) or name in _RESERVED:
            raise BadInputError(f"{w}: name {name!r} must be letters, digits, '.', '_' or '-' and not one of "
                                f"{', '.join(sorted(_RESERVED))}")
        group = s.get("group", "")
        if group not in ("", *OOD_GROUPS):
            raise BadInputError(f"{w}: group {group!r} must be one of {', '.join(OOD_GROUPS)} (or omitted)")
        fmt = s.get("format")
        if fmt not in LIST_FORMATS:
            raise BadInputError(f"{w}: format {fmt!r} must be one of {', '.join(LIST_FORMATS)}")
        out.append(OodSetSpec(name=name, group=group, format=fmt, list=_relative(s.get("list"), f"{w} list"),
                              root=_relative(s.get("root"), f"{w} root")))
    names = [s.name for s in out]
    twice = sorted({n for n in names if names.count(n) > 1})
    if twice:
        raise BadInputError(f"{where}: the OOD set name {twice[0]!r} is used twice; give each set its own name")
    return tuple(out)


def parse_benchmark(path: str | os.PathLike) -> BenchmarkSpec:
    """A benchmark file read and checked (one-line ``BadInputError`` naming the file and the key)."""
    p = Path(path)
    try:
        data = tomllib.loads(p.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise BadInputError(f"benchmark file {p}: not found; pass a name from `isood benchmarks` or a .toml "
                            "file") from None
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as e:
        raise BadInputError(f"benchmark file {p}: invalid TOML ({' '.join(str(e).split())})") from None
    where = f"benchmark file {p}"
    unknown = sorted(set(data) - {"name", "title", "source", "id_test", "ood"})
    if unknown:
        raise BadInputError(f"{where}: unknown key {unknown[0]!r}; pass name, title, source, [id_test], [[ood]]")
    name = data.get("name")
    if not isinstance(name, str) or not _NAME.match(name):
        raise BadInputError(f"{where}: name {name!r} must be letters, digits, '.', '_' or '-'")
    return BenchmarkSpec(name=name, title=str(data.get("title", "")), source=str(data.get("source", "")),
                         id_test=_id_test(data, where), ood=_ood(data, where), file=str(p))


def benchmark_folders() -> list[Path]:
    """The folders searched for benchmark files: the built-in one, then ``$ISOOD_BENCHMARKS``'s."""
    extra = [Path(x).expanduser() for x in os.environ.get(ENV_BENCHMARKS, "").split(os.pathsep) if x.strip()]
    return [_BUILTIN, *extra]


def available_benchmarks() -> dict[str, BenchmarkSpec]:
    """Every benchmark by name (built-in first; a user file may not reuse a built-in name)."""
    found: dict[str, BenchmarkSpec] = {}
    for folder in benchmark_folders():
        for f in sorted(folder.glob("*.toml")) if folder.is_dir() else ():
            spec = parse_benchmark(f)
            if spec.name in found:
                raise BadInputError(f"benchmark file {f}: the name {spec.name!r} is taken by {found[spec.name].file}; "
                                    "rename one of them")
            found[spec.name] = spec
    return found


def get_benchmark(name_or_path: str | os.PathLike) -> BenchmarkSpec:
    """A benchmark by name (``available_benchmarks()``) or by the path of its ``.toml`` file."""
    text = os.fspath(name_or_path)
    if text.endswith(".toml") or os.sep in text:
        return parse_benchmark(text)
    known = available_benchmarks()
    if text not in known:
        raise BadInputError(f"--benchmark {text!r}: unknown benchmark; pass one of {', '.join(sorted(known))} or a "
                            f".toml file (see `isood benchmarks`; add yours in ${ENV_BENCHMARKS})")
    return known[text]
