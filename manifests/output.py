"""The one safe writer of every stage: a manifest is built in a sibling folder and swapped in when complete.

``writing(out, kind, inputs=...)`` is how a stage writes its ``--out``::

    with manifests.writing(out, SPLITS, inputs=[test_images, id_features]) as work:
        ...                       # every file of the new version goes into ``work``
        write_manifest(work, ...) # manifest.json last

What it promises:

* **Refusal before any work** (``check_output``): an ``--out`` that is a file, that holds a manifest of another
  kind, a manifest isood cannot read (a hand-edited version or changelog, a future schema), files its manifest
  does not list, or anything at all that is not an isood manifest, is refused with one line saying what is there
  and what to pass instead. So is an ``--out`` equal to, inside, or around one of the stage's inputs.
* **Readers see the old or the new version, never a mix.** The new version is built in the hidden sibling
  ``.~<name>.isood-new`` (on the same file system). When the stage has written its ``manifest.json`` there, the
  two folders are exchanged in one ``renameat2(RENAME_EXCHANGE)`` (Linux; elsewhere two renames, and a reader in
  between gets "no manifest.json", never a mix). A reader that opened the old version and reads a table after the
  swap gets a one-line error (``Manifest`` checks the folder's identity), not the new table under the old
  manifest.
* **A crash leaves the old version intact** and the half-built one in the sibling, where the same command resumes
  it (shards, images and caches there are reused by their content keys). The previous version's files are
  hard-linked into a new sibling (copied where links are impossible), so a stage reuses them as before; every
  isood write replaces a file by rename (``atomic_write_bytes``), never in place, so a link never changes the old
  version.
* **Nothing is deleted that isood did not write.** After the swap, the old version's folder loses exactly the
  files its manifest listed, its ``manifest.json`` and isood's ``.~`` bookkeeping; anything else (a file a user
  put there during the run) is kept, in a visible ``<name>.isood-old-<time>`` folder that the result names.
* **One writer per output**: an exclusive lock (``.~<name>.isood.lock`` beside it) refuses a second process at
  once, naming the first one's pid; the kernel drops it when its holder dies.

``write_manifest`` called on a folder that is not a staging folder (plain API use) still refuses another kind or
foreign files (``guard_direct_write``), but only stages get the swap.
"""

from __future__ import annotations

import contextlib
import ctypes
import ctypes.util
import datetime as _dt
import errno
import json
import os
import re
import shutil
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterable, Iterator, Sequence

from isood.errors import BadInputError, IsoodError
from isood.errors import one_line
from isood.files import LOCK_FILE, LOCK_SUFFIX, TMP_PREFIX, file_lock, lock_path
from manifests.meta import MANIFEST_FILE, load_meta, validate_meta
from manifests.paths import is_inside

__all__ = [
    "STAGING_SUFFIX", "STAGING_MARKER", "OutputState", "Output", "check_output", "writing", "is_staging",
    "listed_files", "guard_direct_write", "public_path",
]

#: The half-built version of ``<name>`` lives in ``.~<name>.isood-new`` beside it.
STAGING_SUFFIX = ".isood-new"
#: Written last when a staging folder is prepared; a folder without it is discarded and prepared again.
STAGING_MARKER = f"{TMP_PREFIX}isood-staging.json"
_OLD_SUFFIX = ".isood-old"
_PARKED = f"{TMP_PREFIX}manifest.json.prev"  # an in-place writer's set-aside manifest (isood < 0.2)


def _staging(final: Path) -> Path:
    return final.with_name(f"{TMP_PREFIX}{final.name}{STAGING_SUFFIX}")


def _old(final: Path) -> Path:
    return final.with_name(f"{TMP_PREFIX}{final.name}{_OLD_SUFFIX}")


_STAGED_RE = re.compile(re.escape(TMP_PREFIX) + r"(?P<name>[^/]+)" + re.escape(STAGING_SUFFIX) + r"(?=/|$)")


def public_path(path: str | os.PathLike) -> str:
    """A path inside a staging folder (``.~<name>.isood-new``) as the path it will have in the output, for
    messages (a user never typed the staging folder's name)."""
    return _STAGED_RE.sub(lambda m: m.group("name"), os.fspath(path))


def is_staging(root: str | os.PathLike) -> bool:
    """Whether ``root`` is a staging folder prepared by ``writing`` (a stage's work folder)."""
    return (Path(root) / STAGING_MARKER).is_file()


def _ours(rel: str) -> bool:
    """A path isood keeps beside its outputs for bookkeeping (any component starting with ``.~``)."""
    return any(part.startswith(TMP_PREFIX) for part in rel.split("/"))


def _walk(root: Path) -> Iterator[tuple[str, str]]:
    """(relative path, name) of every file (and symlink) below ``root``, isood's ``.~`` folders skipped."""
    for folder, dirs, names in os.walk(root):
        rel_folder = Path(folder).relative_to(root).as_posix()
        dirs[:] = [d for d in dirs if not d.startswith(TMP_PREFIX)]
        for n in names:
            yield (n if rel_folder == "." else f"{rel_folder}/{n}"), n


def _present(root: Path) -> list[str]:
    """Every file below ``root``, relative, but isood's ``.~`` bookkeeping and the manifest.json files (its own
    and those of manifests nested in it, e.g. a splits manifest's ``features-test/``)."""
    return sorted(rel for rel, n in _walk(root) if not n.startswith(TMP_PREFIX) and n != MANIFEST_FILE)


def _nested_manifests(root: Path) -> set[str]:
    return {rel for rel, n in _walk(root) if n == MANIFEST_FILE}


def listed_files(meta: dict) -> set[str]:
    """The relative paths a manifest's ``files`` lists."""
    return {str(r.get("path")) for r in meta.get("files", []) if isinstance(r, dict)}


@dataclass
class OutputState:
    """What ``--out`` holds now: ``kind`` of its manifest (None: new or empty folder) and its metadata."""

    final: Path
    kind: str | None = None
    meta: dict | None = None


def _read_meta(folder: Path) -> tuple[dict | None, str | None]:
    """(manifest.json of ``folder`` validated, None) or (None, why it cannot be read), or (None, None) without one."""
    for name in (MANIFEST_FILE, _PARKED):
        if (folder / name).is_file():
            try:
                if name == MANIFEST_FILE:
                    return load_meta(folder), None
                return validate_meta(json.loads((folder / name).read_text(encoding="utf-8")), str(folder)), None
            except (IsoodError, OSError, ValueError) as e:
                return None, one_line(e, 160)
    return None, None


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


def check_output(out: str | os.PathLike, kind: str | Sequence[str], *, inputs: Iterable = (),
                 option: str = "--out", allow: Iterable[str] = ()) -> OutputState:
    """Refuse, with one line and before any work, an ``out`` that ``kind``'s writer may not replace (module
    docstring). ``kind``: the kind written, or several a command may write there (e.g. syn-is / syn-is-prompts).
    ``allow``: relative paths the caller itself has put there (registered by its ``write_manifest``)."""
    final = Path(out)
    kinds = (kind,) if isinstance(kind, str) else tuple(kind)
    if final.exists() and not final.is_dir():
        raise BadInputError(f"{option} {final} is a file; pass a directory")
    _check_inputs(final, inputs, option)
    if not final.is_dir():
        return OutputState(final)
    meta, problem = _read_meta(final)
    present = _present(final)
    if problem is not None:
        raise BadInputError(f"{option} {final} holds a manifest isood cannot read ({problem}); fix or move it "
                            f"(`isood verify {final}`), or pass another {option}")
    if meta is None:
        foreign = [p for p in present if p not in set(allow)]
        if foreign:
            more = f" and {len(foreign) - 3} more" if len(foreign) > 3 else ""
            raise BadInputError(f"{option} {final} is not empty and holds no isood manifest ({', '.join(foreign[:3])}"
                                f"{more}); pass a new or empty directory (isood never deletes files it did not write)")
        return OutputState(final)
    other = meta.get("kind")
    if other not in kinds:
        raise BadInputError(f"{option} {final} holds a {other!r} manifest, not {' or '.join(map(repr, kinds))}; "
                            f"pass another directory (isood never replaces a manifest of another kind)")
    unlisted = [p for p in present if p not in listed_files(meta) and p not in set(allow)]
    if unlisted:
        more = f" and {len(unlisted) - 3} more" if len(unlisted) > 3 else ""
        raise BadInputError(f"{option} {final} holds files its {other} manifest does not list ({', '.join(unlisted[:3])}"
                            f"{more}); move them away or pass another directory (isood never deletes files it did "
                            "not write)")
    return OutputState(final, other, meta)


def guard_direct_write(root: str | os.PathLike, kind: str, allow: Iterable[str]) -> None:
    """``write_manifest`` outside a stage's staging folder: refuse what ``check_output`` refuses (another kind,
    foreign files) before anything is replaced."""
    if not is_staging(root):
        check_output(root, kind, option="manifest folder", allow=allow)


# --------------------------------------------------------------------------------------------- swapping
_RENAME_EXCHANGE = 2
_libc = None


def _exchange(a: Path, b: Path) -> bool:
    """Swap two paths atomically (Linux ``renameat2(RENAME_EXCHANGE)``); False where the system cannot."""
    global _libc
    try:
        if _libc is None:
            _libc = ctypes.CDLL(ctypes.util.find_library("c") or None, use_errno=True)
        fn = _libc.renameat2
    except (OSError, AttributeError):
        return False
    fn.argtypes = [ctypes.c_int, ctypes.c_char_p, ctypes.c_int, ctypes.c_char_p, ctypes.c_uint]
    at_fdcwd = -100
    if fn(at_fdcwd, os.fsencode(a), at_fdcwd, os.fsencode(b), _RENAME_EXCHANGE) == 0:
        return True
    err = ctypes.get_errno()
    if err in (errno.EINVAL, errno.ENOSYS, errno.ENOTSUP, errno.EOPNOTSUPP, errno.EXDEV):
        return False
    raise OSError(err, os.strerror(err), str(b))


def _fsync_dir(folder: Path) -> None:
    with contextlib.suppress(OSError):
        fd = os.open(folder, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


def _discard_version(folder: Path, final: Path) -> Path | None:
    """Remove an old version's files: those its manifest listed, its manifest.json and isood's ``.~`` files; keep
    anything else (moved to a visible ``<name>.isood-old-<time>`` folder, returned). Empty folders go."""
    meta, _ = _read_meta(folder)
    listed = listed_files(meta) if meta else set()
    for rel in sorted(listed | _nested_manifests(folder) | {MANIFEST_FILE, _PARKED}):
        p = folder / rel
        if p.is_symlink() or p.is_file():
            p.unlink()
    for root, dirs, names in os.walk(folder, topdown=True):
        for d in [d for d in dirs if d.startswith(TMP_PREFIX)]:
            shutil.rmtree(Path(root) / d, ignore_errors=True)
            dirs.remove(d)
        for n in names:
            if n.startswith(TMP_PREFIX):
                (Path(root) / n).unlink(missing_ok=True)
    for root, dirs, _names in os.walk(folder, topdown=False):
        for d in dirs:
            with contextlib.suppress(OSError):
                (Path(root) / d).rmdir()
    try:
        folder.rmdir()
        return None
    except OSError:
        stamp = _dt.datetime.now().strftime("%Y%m%d-%H%M%S")
        kept = final.with_name(f"{final.name}{_OLD_SUFFIX}-{stamp}")
        os.rename(folder, kept)
        return kept


def _recover(final: Path) -> None:
    """Finish a swap a crash interrupted between its two renames (systems without an atomic exchange)."""
    old = _old(final)
    if not old.exists():
        return
    if not final.exists():
        os.rename(old, final)
    else:
        _discard_version(old, final)


def _commit(work: Path, final: Path, kinds: Sequence[str]) -> Path | None:
    """Swap the finished ``work`` folder in as ``final``; returns a folder of kept foreign files, if any."""
    meta, problem = _read_meta(work)
    if meta is None or meta.get("kind") not in kinds:
        raise IsoodError(f"{final}: the stage finished without writing its {'/'.join(kinds)} manifest"
                         f"{f' ({problem})' if problem else ''}; rerun the command")
    (work / STAGING_MARKER).unlink(missing_ok=True)
    (work / _PARKED).unlink(missing_ok=True)
    _fsync_dir(work)
    if not final.exists():
        os.rename(work, final)
        _fsync_dir(final.parent)
        return None
    if _exchange(work, final):
        _fsync_dir(final.parent)
        return _discard_version(work, final)
    old = _old(final)
    os.rename(final, old)
    os.rename(work, final)
    _fsync_dir(final.parent)
    return _discard_version(old, final)


# --------------------------------------------------------------------------------------------- staging
def _link_tree(src: Path, dst: Path, rels: Iterable[str]) -> None:
    for rel in sorted(rels):
        s, d = src / rel, dst / rel
        if not s.is_file():
            continue
        d.parent.mkdir(parents=True, exist_ok=True)
        try:
            os.link(s, d)
        except OSError:
            shutil.copy2(s, d)


def _bookkeeping(final: Path) -> set[str]:
    """A previous version's ``.~`` resume records (a generation state, rejection markers), which stages keep
    beside their outputs unlisted: carried into the new version, but not temporaries, locks or staging folders."""
    return {rel for rel, n in _walk(final) if n.startswith(TMP_PREFIX) and not n.endswith((".tmp", LOCK_SUFFIX))
            and n not in (_PARKED, LOCK_FILE)}


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
            kept = _discard_version(work, final)  # an interrupted swap left the old version here
            if kept is not None:
                raise IsoodError(f"{final}: files found in an interrupted rewrite were kept in {kept}; look at "
                                 "them, then rerun")
    work.mkdir()
    if state.meta is not None:
        _link_tree(final, work, listed_files(state.meta) | _nested_manifests(final) | _bookkeeping(final))
    (work / STAGING_MARKER).write_text(json.dumps({"kind": kinds[0], "for": final.name}) + "\n", encoding="utf-8")
    return work, _snapshot(work)


@dataclass
class Output:
    """What ``writing`` hands a stage: ``work`` (write everything here), ``final`` (the ``--out`` it becomes),
    ``previous`` (the replaced manifest's metadata, None for a new output) and, after the swap, ``kept`` (a
    folder of foreign files found beside the old version, None normally)."""

    work: Path
    final: Path
    previous: dict | None = None
    kept: Path | None = field(default=None)
    keep_previous: bool = field(default=False)

    def unchanged(self) -> None:
        """Nothing to write after all (e.g. a card that is already current): the block ends without a swap and
        the staging folder is removed; the output stays as it was."""
        self.keep_previous = True


@contextlib.contextmanager
def writing(out: str | os.PathLike, kind: str | Sequence[str], *, inputs: Iterable = (),
            option: str = "--out") -> Iterator[Output]:
    """Write a new version of the manifest ``out`` through a staging folder (module docstring): refuse a bad
    ``out`` (``check_output``), take the output lock, prepare or resume the staging folder, yield it, and swap it
    in when the block ends normally with the manifest written. On an error the old version is untouched; the
    staging folder stays for a resume unless the block wrote nothing into it. Inside a stage's work folder (an
    API writer called by a stage) it yields that folder as it is: the stage's own writer swaps it in."""
    kinds = (kind,) if isinstance(kind, str) else tuple(kind)
    if is_staging(out):  # already a stage's work folder: the outer writer swaps it in
        yield Output(Path(out), Path(out))
        return
    final = Path(os.path.abspath(out))
    if Path(out).is_symlink() and Path(out).is_dir():  # write where the link points, keep the link
        final = Path(os.path.realpath(out))
    inputs = list(inputs)
    check_output(out, kinds, inputs=inputs, option=option)
    created = [d for d in (final.parent, *final.parent.parents) if not d.exists()]
    final.parent.mkdir(parents=True, exist_ok=True)
    try:
        with file_lock(lock_path(final), what=f"{option} {out}", option=option, target=final):
            _recover(final)
            state = check_output(out, kinds, inputs=inputs, option=option)  # again, now that we hold the lock
            work, first = _prepare(final, kinds, state)
            result = Output(work, final, state.meta)
            try:
                yield result
            except BaseException:
                if first is not None and _snapshot(work) == first:
                    shutil.rmtree(work, ignore_errors=True)  # nothing done: leave nothing behind
                raise
            if result.keep_previous:
                shutil.rmtree(work, ignore_errors=True)
                return
            result.kept = _commit(work, final, kinds)
    finally:
        for d in created:  # deepest first: folders made for this output and left empty
            try:
                d.rmdir()
            except OSError:
                break
