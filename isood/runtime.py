"""L0: runtime helpers every layer shares: device resolution, progress bars, atomic writes, job-array parts and
the ``BatchEngine`` protocol (with the in-process ``LocalEngine``).

Nothing here knows about the benchmark domain. torch and rich are imported inside the functions that need them.
"""

from __future__ import annotations

import contextlib
import hashlib
import importlib
import os
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterable, Iterator, Mapping, Protocol, Sequence, runtime_checkable

from isood.defaults import SEED_MAX
from isood.errors import BadInputError, IsoodError

__all__ = [
    "TMP_PREFIX", "one_line", "explicit_device", "resolve_device", "torch_device", "progress_bar", "track",
    "atomic_write_bytes", "naming", "sha256_bytes", "sha256_file", "link_or_copy", "remove_temporaries", "PART_SUFFIX",
    "PER_TASK_KEYS",
    "check_seed", "check_shard_args", "selected_units", "part_info", "default_workers", "BatchEngine", "LocalEngine",
    "batch_rows", "thread_limit", "require", "lazy_exports", "LOCK_FILE", "LOCK_SUFFIX", "OutputLocked", "output_lock",
    "file_lock", "lock_path",
]

#: Prefix of every temporary or bookkeeping file isood leaves beside its outputs (``isood verify`` ignores them).
TMP_PREFIX = ".~"


def one_line(error: BaseException | str, limit: int = 200) -> str:
    """An exception (or text) as one short line: whitespace collapsed, cut at ``limit`` characters."""
    text = " ".join(str(error).split()) or (type(error).__name__ if isinstance(error, BaseException) else "")
    return text if len(text) <= limit else text[: limit - 3] + "..."


# ------------------------------------------------------------------------------------------------- devices
def explicit_device(device: str | None) -> str | None:
    """``device`` as given, or ``None`` when it asks for the default (``None``, ``''`` or ``'auto'``)."""
    return None if device in (None, "", "auto") else str(device)


def resolve_device(device: str | None) -> str:
    """``None``/``''``/``'auto'`` -> ``'cuda'`` when a GPU is present else ``'cpu'``; ``'cpu'``, ``'cuda'``,
    ``'cuda:N'`` are checked against the machine. A one-line error names what to pass instead."""
    import torch

    if explicit_device(device) is None:
        return "cuda" if torch.cuda.is_available() else "cpu"
    text = str(device)
    try:
        dev = torch.device(text)
    except (RuntimeError, ValueError):
        raise BadInputError(f"unknown device {text!r}; pass cpu, cuda, cuda:N or auto") from None
    if dev.type == "cuda":
        if not torch.cuda.is_available():
            raise BadInputError(f"device {text!r} requested but CUDA is not available; pass --device cpu")
        if dev.index is not None and dev.index >= torch.cuda.device_count():
            raise BadInputError(f"device {text!r}: only {torch.cuda.device_count()} GPU(s); pass --device cuda:0 "
                                "or --device cpu")
    elif dev.type != "cpu":
        raise BadInputError(f"unsupported device {text!r}; pass cpu, cuda, cuda:N or auto")
    return text


def torch_device(device: str | None):
    """``resolve_device`` as a ``torch.device``."""
    import torch

    return torch.device(resolve_device(device))


# ------------------------------------------------------------------------------------------------ progress
def progress_bar(enabled: bool = True, *, rate_unit: str | None = None, transient: bool = False, console=None):
    """A rich progress bar on stderr (description, bar, done/total, elapsed, remaining; with ``rate_unit`` a
    ``{task.fields[rate]} <unit>/s`` column, set with ``bar.update(task, rate=...)``). Disabled: a silent bar
    with the same API."""
    from rich.console import Console
    from rich.progress import (BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn,
                               TimeRemainingColumn)

    columns = [TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn()]
    if rate_unit:
        columns.append(TextColumn("{task.fields[rate]:.2f} " + rate_unit + "/s"))
    columns += [TimeElapsedColumn(), TimeRemainingColumn()]
    return Progress(*columns, console=console or Console(stderr=True), disable=not enabled, transient=transient)


def track(iterable: Iterable, total: int | None, description: str, enabled: bool = True) -> Iterator:
    """Iterate ``iterable`` with a transient progress bar (no bar when disabled)."""
    if not enabled:
        yield from iterable
        return
    with progress_bar(True, transient=True) as bar:
        task = bar.add_task(description, total=total)
        for item in iterable:
            yield item
            bar.advance(task)


# --------------------------------------------------------------------------------------------------- files
def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


_UMASK = _umask()


@contextlib.contextmanager
def naming(path: str | os.PathLike) -> Iterator[None]:
    """Re-raise an ``OSError`` that names no file (a write or flush on a full disk, from Python or from a
    library such as pyarrow) as the same error naming ``path``, so the one-line message says where."""
    try:
        yield
    except OSError as e:
        if e.filename is None and e.errno is not None:
            raise type(e)(e.errno, e.strerror, str(path)) from None
        if e.filename is None:  # pyarrow's IOError: no errno, the reason in its text
            raise OSError(_errno_of(str(e)), str(e), str(path)) from None
        raise


def _errno_of(text: str) -> int | None:
    import errno

    for code, words in ((errno.ENOSPC, "No space left"), (errno.EROFS, "Read-only file system"),
                        (errno.EDQUOT, "Disk quota exceeded"), (errno.EACCES, "Permission denied")):
        if words in text:
            return code
    return None


def atomic_write_bytes(path: str | os.PathLike, data: bytes) -> None:
    """Write ``data`` to ``path`` atomically: a temporary ``.~<name>.<random>.tmp`` beside it, fsync, rename.
    A kill leaves either the old file or the new one (and at most a temporary that ``remove_temporaries``
    deletes). The file gets the mode a plain ``open()`` would give it."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f"{TMP_PREFIX}{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.chmod(tmp, 0o666 & ~_UMASK)  # mkstemp creates 0600
        os.replace(tmp, path)
    except OSError as e:
        Path(tmp).unlink(missing_ok=True)
        if e.filename is None and e.errno is not None:  # a write / fsync error (a full disk) names no file: name it
            raise type(e)(e.errno, e.strerror, str(path)) from None
        raise
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def remove_temporaries(folder: str | os.PathLike, recursive: bool = False) -> int:
    """Delete the ``.~*.tmp`` files a killed ``atomic_write_bytes`` left in ``folder``; returns how many."""
    folder = Path(folder)
    if not folder.is_dir():
        return 0
    found = folder.rglob(f"{TMP_PREFIX}*.tmp") if recursive else folder.glob(f"{TMP_PREFIX}*.tmp")
    n = 0
    for p in found:
        p.unlink(missing_ok=True)
        n += 1
    return n


def sha256_bytes(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def sha256_file(path: str | os.PathLike, chunk: int = 1 << 20) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(chunk):
            h.update(block)
    return h.hexdigest()


def link_or_copy(src: str | os.PathLike, dst: str | os.PathLike) -> None:
    """Put ``src`` at ``dst`` atomically: a hard link where possible (same file system, no copy), else a copy."""
    src, dst = Path(src), Path(dst)
    dst.parent.mkdir(parents=True, exist_ok=True)
    tmp = dst.with_name(f"{TMP_PREFIX}{dst.name}.{os.getpid()}.tmp")
    tmp.unlink(missing_ok=True)
    try:
        try:
            os.link(src, tmp)
        except OSError:
            shutil.copyfile(src, tmp)
        os.replace(tmp, dst)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


# ------------------------------------------------------------------------------------------------- locking
#: The lock file of an older layout (inside the --out folder); kept as a name so that leftovers are recognised.
LOCK_FILE = f"{TMP_PREFIX}isood.lock"
LOCK_SUFFIX = ".isood.lock"


class OutputLocked(IsoodError):
    """Another process is writing the same output folder."""


def lock_path(out: str | os.PathLike) -> Path:
    """The one lock file of an output folder, beside it: ``<parent>/.~<name>.isood.lock`` (every writer of
    ``out``, manifest or not, locks this file; it lies outside ``out``, so a folder swapped in by rename keeps
    being locked)."""
    out = Path(os.path.abspath(out))
    return out.with_name(f"{TMP_PREFIX}{out.name}{LOCK_SUFFIX}")


@contextlib.contextmanager
def file_lock(path: str | os.PathLike, *, what: str, option: str = "--out",
              target: str | os.PathLike | None = None) -> Iterator[Path]:
    """Hold an exclusive lock (``fcntl.flock``) on the lock file ``path`` while a command writes ``what``; a
    second process asking for it gets a one-line ``OutputLocked`` at once (naming the holder's pid). The kernel
    drops the lock when the holder dies (even by ``kill -9``), so a stale lock file never blocks a rerun. On
    release the lock file is removed (while still held: a process that opened it meanwhile sees it replaced and
    takes the new one). An ``OSError`` taking it (a read-only disk) names ``target`` (the output) when given."""
    path = Path(path)
    try:
        fd = _take_lock(path, what, option)
    except OSError as e:
        if target is None:
            raise
        raise type(e)(e.errno, e.strerror, str(target)) from None
    try:
        yield path
    finally:
        path.unlink(missing_ok=True)
        os.close(fd)


@contextlib.contextmanager
def output_lock(folder: str | os.PathLike, option: str = "--out") -> Iterator[Path]:
    """Hold the lock of ``folder`` (``lock_path``) while a command writes files there that are not a manifest (an
    export, a publish receipt); manifests are written through ``manifests.writing``, which takes the same lock.
    The folders this call created are removed again when nothing was written into them: a command refused
    before writing leaves nothing behind."""
    folder = Path(folder)
    if folder.exists() and not folder.is_dir():
        raise BadInputError(f"{option} {folder} is a file; pass a directory")
    created = [d for d in (folder, *folder.parents) if not d.exists()]  # deepest first
    try:
        folder.parent.mkdir(parents=True, exist_ok=True)
        with file_lock(lock_path(folder), what=f"{option} {folder}", option=option, target=folder):
            folder.mkdir(exist_ok=True)
            yield folder
    finally:
        for d in created:
            try:
                d.rmdir()
            except OSError:  # something was written there (or another process uses it): keep it
                break


def _take_lock(path: Path, what: str, option: str) -> int:
    """An open descriptor of ``path`` holding its exclusive lock (the file at ``path`` when the lock was taken)."""
    import fcntl

    while True:
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.pread(fd, 64, 0).decode(errors="replace").strip() or "?"
            os.close(fd)
            raise OutputLocked(f"{what} is being written by another isood process (pid {holder}, lock "
                               f"{path.name}); wait for it to finish or pass another {option}") from None
        except BaseException:
            os.close(fd)
            raise
        try:
            current = os.stat(path)
        except FileNotFoundError:
            current = None
        mine = os.fstat(fd)
        if current is not None and (current.st_ino, current.st_dev) == (mine.st_ino, mine.st_dev):
            try:
                os.ftruncate(fd, 0)
                os.pwrite(fd, str(os.getpid()).encode(), 0)
            except OSError:  # e.g. a full disk: the pid is only for the message; the command's own writes will say
                pass
            return fd
        os.close(fd)  # the previous holder removed this file as we opened it: lock the new one


# ---------------------------------------------------------------------------------------------- job arrays
#: A job-array task writes a manifest of kind ``<kind>-part``.
PART_SUFFIX = "-part"
#: Config keys allowed to differ between the tasks of one array (machine-dependent, not content).
PER_TASK_KEYS = frozenset({"part", "workers", "device"})


def check_seed(seed: Any, flag: str = "--seed") -> int:
    """``seed`` when it is an integer in [0, ``isood.defaults.SEED_MAX``] (the bound every command's consumers
    take: see there), else a one-line error; the one check of every command's ``--seed``."""
    integral = not isinstance(seed, bool) and hasattr(seed, "__index__")  # int, numpy integers
    if not integral or not 0 <= seed.__index__() <= SEED_MAX:
        raise BadInputError(f"{flag} must be an integer in [0, {SEED_MAX}] (2**31 - 1: faiss and numpy's legacy "
                            f"generator take 31/32-bit seeds), got {seed!r}")
    return seed.__index__()


def check_shard_args(num_shards: int, shard_index: int) -> None:
    """One-line errors for impossible ``--num-shards`` / ``--shard-index`` values."""
    if int(num_shards) < 1:
        raise BadInputError(f"--num-shards must be >= 1, got {num_shards}")
    if not 0 <= int(shard_index) < int(num_shards):
        raise BadInputError(
            f"--shard-index must be in 0..{int(num_shards) - 1}, got {shard_index} "
            "(0-based: sbatch --array=0-N-1 with --shard-index $SLURM_ARRAY_TASK_ID)")


def selected_units(n_units: int, num_shards: int, shard_index: int) -> list[int]:
    """The units of task ``shard_index`` of ``num_shards``: every k in 0..n_units-1 with k % num_shards == i
    (round robin: equal shares whatever N is, and a resubmitted task touches only its own units)."""
    return list(range(int(shard_index), int(n_units), int(num_shards)))


def part_info(num_shards: int, shard_index: int, n_units: int, unit: str) -> dict:
    """The ``part`` entry of a part manifest's config."""
    return {"index": int(shard_index), "count": int(num_shards), "units": int(n_units), "unit": unit}


def default_workers() -> int:
    """Local decoding workers: min(8, CPUs - 1), at least 0."""
    return max(0, min(8, (os.cpu_count() or 1) - 1))


# ------------------------------------------------------------------------------------------------ engines
@runtime_checkable
class BatchEngine(Protocol):
    """Where batch work runs: in this process (``LocalEngine``) or on a cluster (``isood.engines.ray``).

    A *worker* is a class built once per process or actor (``worker(*args)``: the heavy part, e.g. loading a
    model) and then called on batches: ``worker(batch) -> result``, both ``dict[str, numpy array]`` with one
    row per item. ``map`` yields the results, locally in input order, on a cluster as they complete; each
    input batch is passed to exactly one worker call, unsplit, so batch composition (and hence numerics) is
    the same on every engine. Stages receive an engine from the CLI and never import a cluster backend.
    """

    name: str

    def map(self, worker: type, args: Sequence[Any], batches: Iterable[Mapping[str, Any]], *, total: int,
            description: str, progress: bool) -> Iterator[dict[str, Any]]: ...

    def as_config(self) -> dict[str, Any]: ...

    def device_name(self, device: str | None) -> str: ...


@dataclass
class LocalEngine:
    """The in-process engine: one worker built here, called on each batch in order."""

    name: str = "local"

    def map(self, worker: type, args: Sequence[Any], batches: Iterable[Mapping[str, Any]], *, total: int,
            description: str, progress: bool) -> Iterator[dict[str, Any]]:
        instance = worker(*args)
        with progress_bar(progress) as bar:
            task = bar.add_task(description, total=total)
            for batch in batches:
                out = instance(batch)
                bar.advance(task, batch_rows(batch))
                yield out

    def as_config(self) -> dict[str, Any]:
        return {"engine": "local"}

    def device_name(self, device: str | None) -> str:
        return resolve_device(device)


def batch_rows(batch: Mapping[str, Any]) -> int:
    """Rows of a ``dict[str, array]`` batch (the length of its first column)."""
    for v in batch.values():
        return len(v)
    return 0


@contextlib.contextmanager
def thread_limit(n: int):
    """Cap torch's CPU threads inside the block (tiny tensors run fastest on one); restored afterwards."""
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(int(n))
    try:
        yield
    finally:
        torch.set_num_threads(before)


def require(condition: bool, message: str, error: type[IsoodError] = BadInputError) -> None:
    """Raise ``error(message)`` unless ``condition``: one-line guards for user input."""
    if not condition:
        raise error(message)


def lazy_exports(package: str, exports: Mapping[str, str]) -> tuple[Any, Any]:
    """``(__getattr__, __dir__)`` for a package that re-exports ``name -> module`` lazily (PEP 562): a name is
    imported from its module on first access, so importing the package loads nothing heavy."""

    def __getattr__(name: str) -> Any:
        if name in exports:
            return getattr(importlib.import_module(exports[name]), name)
        raise AttributeError(f"module {package!r} has no attribute {name!r}")

    def __dir__() -> list[str]:
        return sorted(set(vars(importlib.import_module(package))) | set(exports))

    return __getattr__, __dir__
