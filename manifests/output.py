"""The one safe writer of every stage: a manifest is built in a sibling folder and swapped in when complete.

``writing(out, kind, inputs=...)`` is how a stage writes its ``--out``::

    with manifests.writing(out, SPLITS, inputs=[test_images, id_features]) as work:
        ...                       # every file of the new version goes into ``work``
        write_manifest(work, ...) # manifest.json last

What it promises:

* **Refusal before any work** (``check_output``), one line naming ``--out`` and what is there: an ``--out`` that
  is a file; that holds a manifest of another kind or one isood cannot read; any file its manifest neither lists
  nor records as the writer's own (``manifests.ownership``: a ``.~backup/`` folder, an editor's lock file, a
  ``manifest.json`` of a web app in a sub-folder are the user's); a symbolic link leading out of it; or that
  is equal to, inside, or around an input, or a cache folder of the run (``scratch``). ``writing`` also refuses
  an ``--out`` that is the working directory or holds it, and a mount point (a Docker volume, an NFS share: a
  mount point cannot be renamed, so the swap could never happen).
* **Readers see the old or the new version, never a mix.** The new version is built in the hidden sibling
  ``.~<name>.isood-new``; when its ``manifest.json`` is written, the two folders are exchanged in one
  ``renameat2(RENAME_EXCHANGE)`` (Linux; elsewhere two renames, and a reader in between gets "no
  manifest.json", never a mix). Each version carries its own version marker (``manifests.ownership``), which a
  reader checks before and after every table it reads.
* **A crash leaves the old version intact** and the half-built one in the sibling, where the same command resumes
  it. The previous version's files (those listed and those the writer recorded) are hard-linked into a new
  sibling (copied where links are impossible); every isood write replaces a file by rename, never in place.
* **Nothing is deleted that isood did not write.** After the swap, the old version loses exactly the files it
  listed or recorded, never through a symbolic link. A listed file whose content no longer has its recorded
  hash (edited by hand) is kept, and so is anything that appeared during the run: both go to a visible
  ``<name>.isood-old-<time>`` folder beside ``--out``, named in a warning and in ``Output.kept``.
* **One writer per output**: an exclusive lock (``.~<name>.isood.lock`` beside it) refuses a second process at
  once, naming the first one's pid; the kernel drops it when its holder dies.

Messages name ``--out``, never the staging folder. ``write_manifest`` called on a folder that is not a staging
folder (plain API use) still refuses what ``check_output`` refuses (``guard_direct_write``); only stages get the
swap.
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
import re
import shutil
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterable, Iterator, Mapping, Sequence

from isood.core.errors import BadInputError, IsoodError, IsoodWarning, ManifestError, MissingWeightsError
from isood.core.files import TMP_PREFIX, atomic_write_bytes, file_lock, lock_path
from manifests.meta import MANIFEST_FILE
from manifests.ownership import (RECORD_KEY, escaping_links, foreign_paths, new_version_id, owned_paths,
                                 read_meta, version_marker, version_of, walk_files)
from manifests.paths import is_inside
from manifests.swap import OLD_SUFFIX, Kept, discard_version, exchange, fsync_dir

__all__ = [
    "STAGING_SUFFIX", "STAGING_MARKER", "OutputState", "Output", "check_output", "writing", "is_staging",
    "listed_files", "guard_direct_write", "public_path",
]

#: The half-built version of ``<name>`` lives in ``.~<name>.isood-new`` beside it.
STAGING_SUFFIX = ".isood-new"
#: Written last when a staging folder is prepared; a folder without it is discarded and prepared again.
STAGING_MARKER = f"{TMP_PREFIX}isood-staging.json"


def _staging(final: Path) -> Path:
    return final.with_name(f"{TMP_PREFIX}{final.name}{STAGING_SUFFIX}")


def _old(final: Path) -> Path:
    return final.with_name(f"{TMP_PREFIX}{final.name}{OLD_SUFFIX}")


_STAGED_RE = re.compile(re.escape(TMP_PREFIX) + r"(?P<name>[^/\s'\"]+?)" + re.escape(STAGING_SUFFIX)
                        + r"(?=[/\s'\":;,)]|$)")


def public_path(path: str | os.PathLike) -> str:
    """A path (or a message) naming a staging folder (``.~<name>.isood-new``), with the path it will have in the
    output instead (a user never typed the staging folder's name)."""
    return _STAGED_RE.sub(lambda m: m.group("name"), os.fspath(path))


def is_staging(root: str | os.PathLike) -> bool:
    """Whether ``root`` is a staging folder prepared by ``writing`` (a stage's work folder)."""
    return (Path(root) / STAGING_MARKER).is_file()


def listed_files(meta: dict) -> set[str]:
    """The relative paths a manifest's ``files`` lists."""
    return {str(r.get("path")) for r in meta.get("files", []) if isinstance(r, dict)}


@dataclass
class OutputState:
    """What ``--out`` holds now: ``kind`` of its manifest (None: new or empty folder) and its metadata."""

    final: Path
    kind: str | None = None
    meta: dict | None = None


def _check_inputs(final: Path, inputs: Iterable[str | os.PathLike | None], option: str) -> None:
    real = Path(os.path.realpath(final))
    for given in inputs:
        if given is None or str(given) == "":
            continue
        inp = Path(os.path.realpath(given))
        if real == inp:
            raise BadInputError(f"{option} {final} is also an input of this command ({given}); pass another {option} "
                                "(isood never writes over what it reads)")
        if is_inside(real, inp):
            raise BadInputError(f"{option} {final} is inside the input {given}; pass an {option} outside your inputs")
        if is_inside(inp, real):
            raise BadInputError(f"{option} {final} holds the input {given}; pass an {option} that does not contain "
                                "your inputs")


def _check_scratch(final: Path, scratch: Mapping[str, str | os.PathLike | None], option: str) -> None:
    real = os.path.realpath(final)
    for flag, path in scratch.items():
        if path is not None and str(path) != "" and is_inside(os.path.realpath(path), real):
            raise BadInputError(f"{flag} {path} is inside {option} {final}, which every run replaces as a whole; "
                                f"pass a {flag} outside {option}")


def _listing(paths: Sequence[str]) -> str:
    return ", ".join(paths[:3]) + (f" and {len(paths) - 3} more" if len(paths) > 3 else "")


def check_output(out: str | os.PathLike, kind: str | Sequence[str], *, inputs: Iterable = (),
                 option: str = "--out", allow: Iterable[str] = (),
                 scratch: Mapping[str, str | os.PathLike | None] | None = None) -> OutputState:
    """Refuse, with one line and before any work, an ``out`` that ``kind``'s writer may not replace (module
    docstring). ``kind``: the kind written, or several a command may write there (e.g. syn-is / syn-is-prompts).
    ``allow``: relative paths the caller itself has put there (registered by its ``write_manifest``).
    ``scratch``: option -> folder the run writes besides ``out`` (``--cache-dir``), refused inside it."""
    final = Path(out)
    kinds = (kind,) if isinstance(kind, str) else tuple(kind)
    if final.exists() and not final.is_dir():
        raise BadInputError(f"{option} {final} is a file; pass a directory")
    _check_inputs(final, inputs, option)
    _check_scratch(final, scratch or {}, option)
    if not final.is_dir():
        return OutputState(final)
    meta, problem = read_meta(final)
    if problem is not None:
        raise BadInputError(f"{option} {final} holds a manifest isood cannot read ({problem}); fix or move it "
                            f"(`isood verify {final}`), or pass another {option}")
    links = escaping_links(final)
    if links:
        rel, target = links[0]
        raise BadInputError(f"{option} {final} holds {rel}, a symbolic link to {target} outside it; isood never "
                            f"writes or deletes through such a link: replace it by a real folder or pass another "
                            f"{option}")
    foreign = foreign_paths(final, meta, set(allow))
    if meta is None:
        if foreign:
            raise BadInputError(f"{option} {final} is not empty and holds no isood manifest ({_listing(foreign)}); "
                                "pass a new or empty directory (isood never deletes files it did not write)")
        return OutputState(final)
    other = meta.get("kind")
    if other not in kinds:
        raise BadInputError(f"{option} {final} holds a {other!r} manifest, not {' or '.join(map(repr, kinds))}; "
                            f"pass another directory (isood never replaces a manifest of another kind)")
    if foreign:
        raise BadInputError(f"{option} {final} holds files its {other} manifest does not list ({_listing(foreign)}); "
                            "move them away or pass another directory (isood never deletes files it did not write)")
    return OutputState(final, other, meta)


def guard_direct_write(root: str | os.PathLike, kind: str, allow: Iterable[str]) -> None:
    """``write_manifest`` outside a stage's staging folder: refuse what ``check_output`` refuses (another kind,
    foreign files) before anything is replaced."""
    if not is_staging(root):
        check_output(root, kind, option="manifest folder", allow=allow)


def _check_place(final: Path, out: str | os.PathLike, option: str) -> None:
    """Refuse an ``out`` a folder swap cannot replace: the working directory (or a folder holding it: the shell
    would be left in a deleted folder) and a mount point (``rename`` fails with EBUSY)."""
    try:
        cwd = os.path.realpath(os.getcwd())
    except OSError:
        cwd = None
    real = os.path.realpath(final)
    if cwd is not None and is_inside(cwd, real):
        raise BadInputError(f"{option} {out} is the working directory or holds it, and a new version replaces "
                            f"{option} as a whole; pass a folder below it (e.g. {option} results)")
    if final.is_dir() and _is_mount(real):
        raise BadInputError(f"{option} {out} is a mount point (a volume or network share), which cannot be renamed "
                            f"to swap a new version in; pass a folder inside it (e.g. {option} "
                            f"{os.path.join(os.fspath(out), 'results')})")


def _is_mount(real: str) -> bool:
    if os.path.ismount(real):
        return True
    try:  # a bind mount of a folder of the same file system (Docker volumes) has its parent's device
        with open("/proc/self/mountinfo", encoding="utf-8", errors="replace") as f:
            points = {line.split()[4].replace("\\040", " ") for line in f if len(line.split()) > 4}
    except OSError:
        return False
    return real in points


# --------------------------------------------------------------------------------------------- swapping
def _recover(final: Path) -> Kept:
    """Finish a swap a crash interrupted between its two renames (systems without an atomic exchange)."""
    old = _old(final)
    if not old.exists():
        return Kept()
    if not final.exists():
        os.rename(old, final)
        return Kept()
    return discard_version(old, final, final)


def _record(work: Path, meta: dict) -> None:
    """Write the writer's record (``manifests.ownership``) into the finished version's manifest.json: its
    version identity and marker, and every file of the folder its manifest does not list."""
    version = version_of(meta) or new_version_id()
    marker = work / version_marker(version)
    if not marker.is_file():
        atomic_write_bytes(marker, (version + "\n").encode())
    listed = listed_files(meta)
    own = sorted(rel for rel in walk_files(work) if rel not in listed and rel != MANIFEST_FILE)
    meta = {**meta, RECORD_KEY: {"version": version, "own": own}}
    atomic_write_bytes(work / MANIFEST_FILE, (json.dumps(meta, indent=2) + "\n").encode())


def _commit(work: Path, final: Path, kinds: Sequence[str], option: str) -> Kept:
    """Swap the finished ``work`` folder in as ``final``; what was kept of the old version."""
    meta, problem = read_meta(work)
    if meta is None or meta.get("kind") not in kinds:
        raise IsoodError(f"{final}: the stage finished without writing its {'/'.join(kinds)} manifest"
                         f"{f' ({problem})' if problem else ''}; rerun the command")
    (work / STAGING_MARKER).unlink(missing_ok=True)
    _record(work, meta)
    fsync_dir(work)
    try:
        if not final.exists():
            os.rename(work, final)
            fsync_dir(final.parent)
            return Kept()
        if exchange(work, final):
            fsync_dir(final.parent)
            return discard_version(work, final, final)
        old = _old(final)
        os.rename(final, old)
    except OSError as e:
        if e.errno in (errno.EBUSY, errno.EXDEV):
            raise BadInputError(f"{option} {final} cannot be replaced by a rename ({e.strerror}: a mount point?); "
                                "pass a folder inside it") from None
        raise
    os.rename(work, final)
    fsync_dir(final.parent)
    return discard_version(old, final, final)


# --------------------------------------------------------------------------------------------- staging
def _link_tree(src: Path, dst: Path, rels: Iterable[str]) -> None:
    for rel in sorted(rels):
        s, d = src / rel, dst / rel
        if s.is_symlink() or not s.is_file():
            continue
        d.parent.mkdir(parents=True, exist_ok=True)
        try:
            os.link(s, d)
        except OSError:
            shutil.copy2(s, d)


def _carried(final: Path, meta: dict) -> set[str]:
    """What a new version starts from: the previous version's listed and owned files and its manifest.json
    (``write_manifest`` bumps its version), but its version marker (a reader of the previous version must see it
    vanish) and temporaries."""
    version = version_of(meta)
    skip = {version_marker(version)} if version else set()
    return {rel for rel in owned_paths(meta) if rel not in skip and not rel.endswith(".tmp")}


def _snapshot(work: Path) -> dict[str, int]:
    out = {}
    for folder, _dirs, names in os.walk(work):
        for n in names:
            p = Path(folder) / n
            with contextlib.suppress(OSError):
                out[p.relative_to(work).as_posix()] = p.stat().st_ino
    return out


def _prepare(final: Path, kinds: Sequence[str], state: OutputState) -> tuple[Path, dict[str, int] | None]:
    """The staging folder of ``final``: resumed when a killed run of the same kind left one, else new (the previous
    version's files linked in). Returns it and, when new, its first listing (to tell later whether work was done)."""
    work = _staging(final)
    if work.exists():
        marker = work / STAGING_MARKER
        try:
            staged = json.loads(marker.read_text(encoding="utf-8")).get("kind")
        except (OSError, ValueError, AttributeError):
            staged = None
        if staged in kinds:
            return work, None
        if marker.is_file():
            shutil.rmtree(work)  # a killed run of another command left it: all ours
        else:
            kept = discard_version(work, final)  # an interrupted swap left the old version here
            if kept.folder is not None:
                raise IsoodError(f"{final}: files found in an interrupted rewrite were kept in {kept.folder}; look "
                                 "at them, then rerun")
    work.mkdir()
    if state.meta is not None:
        _link_tree(final, work, _carried(final, state.meta))
    (work / STAGING_MARKER).write_text(json.dumps({"kind": kinds[0], "for": final.name}) + "\n", encoding="utf-8")
    return work, _snapshot(work)


@dataclass
class Output:
    """What ``writing`` hands a stage: ``work`` (write everything here), ``final`` (the ``--out`` it becomes),
    ``previous`` (the replaced manifest's metadata, None for a new output) and, after the swap, ``kept`` (the
    folder beside ``final`` holding what was kept of the old version: files isood did not write and files edited
    since it wrote them, ``kept_edited``; None normally)."""

    work: Path
    final: Path
    previous: dict | None = None
    kept: Path | None = field(default=None)
    keep_previous: bool = field(default=False)
    kept_edited: list[str] = field(default_factory=list)

    def unchanged(self) -> None:
        """Nothing to write after all (e.g. a card that is already current): the block ends without a swap and
        the staging folder is removed; the output stays as it was."""
        self.keep_previous = True


def _public(e: BaseException) -> BaseException | None:
    """``e`` with its message naming the output instead of the staging folder (None: it names none)."""
    text = str(e)
    if isinstance(e, OSError) and e.filename is not None and public_path(e.filename) != os.fspath(e.filename):
        return type(e)(e.errno, e.strerror, public_path(e.filename))
    if isinstance(e, IsoodError) and public_path(text) != text:
        try:
            return type(e)(public_path(text))
        except TypeError:
            return IsoodError(public_path(text))
    return None


def _tell(result: Output, kept: Kept) -> None:
    result.kept, result.kept_edited = kept.folder, kept.edited
    if kept.folder is None:
        return
    what = []
    if kept.edited:
        what.append(f"your edited {_listing(kept.edited)} (changed since isood wrote them)")
    if kept.other:
        what.append(f"files isood did not write ({_listing(kept.other)})")
    warnings.warn(f"{result.final}: the new version is in place; kept {' and '.join(what) or 'the rest'} of the "
                  f"previous version in {kept.folder}", IsoodWarning, stacklevel=4)


@contextlib.contextmanager
def writing(out: str | os.PathLike, kind: str | Sequence[str], *, inputs: Iterable = (),
            option: str = "--out", scratch: Mapping[str, str | os.PathLike | None] | None = None) -> Iterator[Output]:
    """Write a new version of the manifest ``out`` through a staging folder (module docstring): refuse a bad
    ``out`` (``check_output``; ``scratch``: option -> a folder the run writes, e.g. ``{"--cache-dir": ...}``,
    refused inside ``out``), take the output lock, prepare or resume the staging folder, yield it, and swap it in
    when the block ends normally with the manifest written. On an error the old version is untouched; the
    staging folder stays for a resume, unless this call made it and the block wrote nothing into it or refused
    its input (a ``BadInputError``, ``ManifestError`` or ``MissingWeightsError``; a failure on the way, such as
    a safety checker's error, keeps the work done for the rerun). Inside a stage's work folder (an API writer called by a stage) it yields that
    folder as it is: the stage's own writer swaps it in."""
    kinds = (kind,) if isinstance(kind, str) else tuple(kind)
    if is_staging(out):  # already a stage's work folder: the outer writer swaps it in
        yield Output(Path(out), Path(out))
        return
    final = Path(os.path.abspath(out))
    if Path(out).is_symlink() and Path(out).is_dir():  # write where the link points, keep the link
        final = Path(os.path.realpath(out))
    inputs = list(inputs)
    check_output(out, kinds, inputs=inputs, option=option, scratch=scratch)
    _check_place(final, out, option)
    created = [d for d in (final.parent, *final.parent.parents) if not d.exists()]
    final.parent.mkdir(parents=True, exist_ok=True)
    try:
        with file_lock(lock_path(final), what=f"{option} {out}", option=option, target=final):
            recovered = _recover(final)
            state = check_output(out, kinds, inputs=inputs, option=option, scratch=scratch)  # again, under the lock
            work, first = _prepare(final, kinds, state)
            result = Output(work, final, state.meta)
            try:
                yield result
            except BaseException as e:
                refused = isinstance(e, (BadInputError, ManifestError, MissingWeightsError))
                if first is not None and (refused or _snapshot(work) == first):
                    shutil.rmtree(work, ignore_errors=True)  # nothing done, or a refusal: leave nothing behind
                public = _public(e)
                if public is not None:
                    raise public from None
                raise
            if result.keep_previous:
                shutil.rmtree(work, ignore_errors=True)
                return
            kept = _commit(work, final, kinds, option)
            _tell(result, kept if kept.folder is not None else recovered)
    finally:
        for d in created:  # deepest first: folders made for this output and left empty
            try:
                d.rmdir()
            except OSError:
                break
