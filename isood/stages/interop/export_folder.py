"""The bookkeeping of an OpenOOD export folder (``isood.stages.interop.openood``): the ledger of what each export
wrote there, its image-root links, and whether the listed images resolve.

- The ledger (``.~isood-export.json``) records, per export (a benchmark name, or ``@id:<split>`` for an ID
  list), the list files it wrote and the image-root links it made. It is validated before it is trusted: every
  file is relative, inside the folder, and one of the names that export writes (``benchmark_imglist/<name>/*.txt``,
  ``imglist/<name>/*.txt``, the two lists of an ID split); every link is relative, inside, outside the list
  folders. Anything else is a one-line refusal (an altered ledger is never followed).
- It is written first as an intent (the earlier files and the new ones), then the files are committed, then the
  files the export no longer writes are removed and the ledger is rewritten: an export killed at any point
  leaves a folder the same command takes up again. A file is removed only when it is a regular file inside the
  folder; a link only when it is still the link recorded.
- Image roots: each dataset's ``data_dir`` is a folder of the data root; the export links it to the image root it
  knows (``--id-root`` / the ID folders' parent for ``imagenet1k/``; ``--image-root``, a splits manifest's
  ``test_root`` or a Syn-IS manifest's folder for a benchmark), never replacing anything it did not make.
  ``unresolved`` says which image folders (or first images) are still missing.
"""

from __future__ import annotations

import json
import os
import re
import secrets
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath
from typing import Iterable, Mapping, Sequence

from isood.core.errors import BadInputError
from isood.core.files import TMP_PREFIX, atomic_write_bytes
from isood.stages.interop.id_lists import id_list_paths
from isood.stages.interop.openood_info import ID_SPLITS
from manifests.paths import is_inside

__all__ = ["EXPORT_INFO", "EXPORT_LEDGER", "BENCHMARK_DIR", "RELEASE_DIR", "NAME_RE", "Ledger", "check_data_dir",
           "remove_empty_parents", "holds_only_staging", "unresolved"]

EXPORT_INFO = "openood_data_info.json"
BENCHMARK_DIR = "benchmark_imglist"  # OpenOOD imglists: <BENCHMARK_DIR>/<name>/[<source>/]test_<cell>.txt
RELEASE_DIR = "imglist"  # release-format lists: <RELEASE_DIR>/<name>/[<subset>/]cov_{c}_sem_{s}.txt
#: The files each export wrote and the links it made, by export (benchmark name, ``@id:<split>``).
EXPORT_LEDGER = f"{TMP_PREFIX}isood-export.json"
LEDGER_FORMAT = "isood export ledger 2"
#: A benchmark name (``--name``): one folder name, starting with a letter or digit.
NAME_RE = r"[A-Za-z0-9][\w.-]*"
_STAGED = re.compile(r"^\.~.+\.[0-9a-f]{12}\.tmp$")  # manifests.stream.StagedFile's temporary names
#: ``isood.core.files.atomic_write_bytes``'s temporaries of the folder's own files (a killed export's)
_OWN_TMP = re.compile(r"^\.~(\.~isood-export\.json|openood_data_info\.json|openood_ood_dataset\.yml)\.\w+\.tmp$")


def _clean_rel(rel: object) -> str | None:
    """``rel`` when it is a clean relative POSIX path (no '', '.', '..', backslash, control character, absolute
    or drive form, hidden ``.~`` part), else None."""
    if not isinstance(rel, str) or not rel or rel.startswith("/") or "\\" in rel or ":" in rel.split("/")[0]:
        return None
    if any(ord(ch) < 0x20 for ch in rel):
        return None
    parts = rel.split("/")
    if any(p in ("", ".", "..") or p.startswith(TMP_PREFIX) for p in parts):
        return None
    return PurePosixPath(rel).as_posix()


def _file_allowed(key: str, rel: str) -> bool:
    """Whether an export ``key`` writes a file named ``rel``."""
    if key.startswith("@id:"):
        split = key[4:]
        return split in ID_SPLITS and rel in id_list_paths(split)
    return re.fullmatch(NAME_RE, key) is not None and rel.endswith(".txt") and (
        rel.startswith(f"{BENCHMARK_DIR}/{key}/") or rel.startswith(f"{RELEASE_DIR}/{key}/"))


def check_data_dir(data_dir: str, option: str = "--data-dir") -> str:
    """A dataset's image folder in the data root: '' (the root itself) or a clean relative folder outside the
    list folders, returned with one trailing '/'; a one-line error otherwise."""
    stripped = data_dir.strip("/") if data_dir not in ("", "./") else ""
    if stripped and (data_dir.startswith("/") or _clean_rel(stripped) is None
                     or stripped.split("/")[0] in (BENCHMARK_DIR, RELEASE_DIR)):
        raise BadInputError(f"{option} {data_dir!r}: pass a folder relative to --out, without '..', outside "
                            f"{BENCHMARK_DIR}/ and {RELEASE_DIR}/ (e.g. imagenet21k/)")
    return f"{stripped}/" if stripped else ""


@dataclass
class Ledger:
    """What each export of a folder wrote: ``files`` (export -> relative paths) and ``links`` (export -> {relative
    path: absolute target})."""

    path: Path
    files: dict[str, list[str]] = field(default_factory=dict)
    links: dict[str, dict[str, str]] = field(default_factory=dict)

    @classmethod
    def read(cls, out: Path) -> "Ledger":
        """The folder's ledger (empty when there is none or it cannot be parsed: then no file counts as an
        export's), validated: a one-line refusal names an entry no export writes."""
        path = out / EXPORT_LEDGER
        try:
            data = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            return cls(path)
        if not isinstance(data, dict):
            raise cls._refuse(path, data)
        if data.get("format") != LEDGER_FORMAT:
            raise BadInputError(f"{path} is not a ledger an isood export writes (format {data.get('format')!r}, not "
                                f"{LEDGER_FORMAT!r}): the ledger was altered, so nothing in this folder is removed; "
                                "pass a new --out")
        files, links = data.get("files", {}), data.get("links", {})
        if not isinstance(files, dict) or not isinstance(links, dict):
            raise cls._refuse(path, data)
        ledger = cls(path)
        for key, rels in files.items():
            if not isinstance(rels, list):
                raise cls._refuse(path, rels, key)
            for rel in rels:
                if _clean_rel(rel) != rel or not _file_allowed(str(key), rel):
                    raise cls._refuse(path, rel, key)
            ledger.files[str(key)] = list(rels)
        for key, entries in links.items():
            if not isinstance(entries, dict) or not (re.fullmatch(NAME_RE, str(key)) or str(key) == "@id"):
                raise cls._refuse(path, entries, key)
            for rel, target in entries.items():
                if (_clean_rel(rel) != rel or rel.split("/")[0] in (BENCHMARK_DIR, RELEASE_DIR)
                        or not isinstance(target, str) or not os.path.isabs(target)):
                    raise cls._refuse(path, rel, key)
            ledger.links[str(key)] = dict(entries)
        return ledger

    @staticmethod
    def _refuse(path: Path, entry: object, key: object = None) -> BadInputError:
        of = f" (export {key!r})" if key is not None else ""
        return BadInputError(f"{path} lists {str(entry)[:120]!r}{of}, which is not a file an isood export writes "
                             "inside --out: the ledger was altered, so nothing in this folder is removed; pass a new "
                             "--out")

    def owners(self) -> dict[str, str]:
        """Every recorded file -> its export."""
        return {f: k for k, fs in self.files.items() for f in fs}

    def link_owner(self, rel: str, *, but: Iterable[str] = ()) -> tuple[str, str] | None:
        """(export, target) of the link at ``rel`` made by an export other than ``but``; None when none did."""
        skip = set(but)
        return next(((k, v[rel]) for k, v in self.links.items() if k not in skip and rel in v), None)

    def check_written(self, out: Path, keys: Sequence[str], written: Iterable[str]) -> None:
        """Refuse to overwrite a file another export of the folder wrote, or one no isood export wrote."""
        owner = {f: k for k, fs in self.files.items() if k not in keys for f in fs}
        ours = {f for k in keys for f in self.files.get(k, [])}
        for rel in written:
            if rel in owner:
                raise BadInputError(f"{out / rel} belongs to the export {owner[rel]!r} in this folder; pass another "
                                    "--name")
            if rel not in ours and os.path.lexists(out / rel):
                raise BadInputError(f"{out / rel} exists and was not written by an isood export; move it or pass "
                                    "another --out")

    def write(self) -> None:
        data = {"format": LEDGER_FORMAT, "files": {k: sorted(v) for k, v in sorted(self.files.items())},
                "links": {k: dict(sorted(v.items())) for k, v in sorted(self.links.items()) if v}}
        atomic_write_bytes(self.path, json.dumps(data, indent=1, sort_keys=True).encode())

    def intend(self, files: Mapping[str, Sequence[str]], links: Mapping[str, Mapping[str, str]]) -> None:
        """Record, before anything is committed, the new files and links beside the earlier ones."""
        for k, fs in files.items():
            self.files[k] = sorted(set(self.files.get(k, [])) | set(fs))
        for k, ls in links.items():
            self.links[k] = {**self.links.get(k, {}), **ls}
        self.write()

    def settle(self, out: Path, before: "Ledger", files: Mapping[str, Sequence[str]],
               links: Mapping[str, Mapping[str, str]]) -> None:
        """After the commit: remove what each export of ``files`` wrote ``before`` and writes no more (a regular
        file inside ``out``), the staged temporaries a killed export left in the folders of its lists, and each
        earlier link of an export of ``links`` that it replaced (still pointing
        where recorded, kept by no other export); then record exactly the new files and the links made (an
        export that made no link keeps its earlier ones)."""
        real_out = os.path.realpath(out)
        for key, fs in files.items():
            for rel in sorted(set(before.files.get(key, [])) - set(fs)):
                p = out / rel
                if is_inside(os.path.realpath(p.parent), real_out) and p.is_file() and not p.is_symlink():
                    p.unlink()
                remove_empty_parents(out, p)
            self.files[key] = sorted(fs)
        for folder in {(out / rel).parent for fs in files.values() for rel in fs} | {out}:  # a killed export's
            if folder.is_dir() and is_inside(os.path.realpath(folder), real_out):  # temporaries
                for p in folder.iterdir():
                    pattern = _OWN_TMP if folder == out else _STAGED
                    if pattern.match(p.name) and p.is_file() and not p.is_symlink():
                        p.unlink()
        for key, made in links.items():
            self.links[key] = dict(made)
            for rel, target in before.links.get(key, {}).items():
                p = out / rel
                if rel in made or self.link_owner(rel, but=[key]) is not None:
                    continue
                if is_inside(os.path.realpath(p.parent), real_out) and p.is_symlink() and os.readlink(p) == target:
                    p.unlink()
        self.write()


def make_link(out: Path, rel: str, target: str, *, recorded: bool) -> bool:
    """Link ``out/rel`` to ``target`` (absolute) unless it already resolves there; replaces only a link an export
    ``recorded``, never a user's file, folder or link. Returns whether the link is an export's to record."""
    p = out / rel
    if os.path.realpath(p) == os.path.realpath(target):
        return p.is_symlink() and recorded
    if os.path.lexists(p) and not (recorded and p.is_symlink()):
        return False
    parent = next(q for q in p.parents if os.path.lexists(q))  # never a link made inside a linked folder
    if not is_inside(os.path.realpath(parent), os.path.realpath(out)):
        return False
    p.parent.mkdir(parents=True, exist_ok=True)
    tmp = p.with_name(f"{TMP_PREFIX}{p.name}.{secrets.token_hex(6)}.link")
    os.symlink(target, tmp, target_is_directory=True)
    os.replace(tmp, p)
    return True


def remove_empty_parents(out: Path, p: Path) -> None:
    """Remove the folders between ``out`` and ``p`` that are empty, deepest first."""
    for parent in p.parents:
        if parent == out or not parent.is_relative_to(out):
            break
        try:
            parent.rmdir()
        except OSError:
            break


def holds_only_staging(p: Path) -> bool:
    """Whether ``p`` is a staged temporary of a killed export (``StagedFile``'s name) or a folder of nothing else."""
    if p.is_symlink():
        return False
    if p.is_dir():
        return all(holds_only_staging(c) for c in p.iterdir())
    return bool(_STAGED.match(p.name))


def _first_image(list_file: Path, *, bare: bool) -> str | None:
    """The image path of a list's first line (the whole line for the release's lists, else up to the first
    space, as OpenOOD's ``ImglistDataset`` splits it); None for an empty or unreadable list."""
    try:
        with open(list_file, encoding="utf-8") as f:
            line = f.readline().strip("\n")
    except OSError:
        return None
    return (line if bare else line.split(" ", 1)[0]) or None


def unresolved(out: Path, entries: Iterable[tuple[str, str, str, bool]]) -> list[str]:
    """For ``(data_dir, list, hint, bare)`` entries (the list relative to ``out``, ``hint`` what to pass), one line
    per image folder of ``out`` that is missing, or whose list's first image is not found in it."""
    lines: dict[str, str] = {}
    for data_dir, rel, hint, bare in entries:
        if data_dir in lines:
            continue
        folder = out / data_dir if data_dir else out
        if not folder.is_dir():
            lines[data_dir] = (f"{data_dir or './'} (the image folder of {rel}: link it to the folder its paths "
                               f"are relative to, ln -s DIR {folder}, or {hint})")
            continue
        first = _first_image(out / rel, bare=bare)
        if first is not None and not os.path.isfile(folder / first):
            lines[data_dir] = (f"{folder / first} (the first image of {rel}: {data_dir or './'} holds no such file; "
                               f"link {folder} to the folder the paths are relative to, or {hint})")
    return list(lines.values())
