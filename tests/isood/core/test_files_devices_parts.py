"""L0 foundations: atomic writes, job-array units, the local engine, device resolution, defaults."""

import os
import stat

import numpy as np
import pytest

from isood.core import defaults
from isood.core.errors import BadInputError, IsoodError
from isood.core.engine import LocalEngine, BatchEngine
from isood.core.devices import explicit_device, resolve_device
from isood.core.files import atomic_write_bytes, link_or_copy, remove_temporaries
from isood.core.parts import check_shard_args, selected_units


def test_atomic_write_replaces_whole_file_and_leaves_no_temporary(tmp_path):
    p = tmp_path / "sub" / "x.bin"
    atomic_write_bytes(p, b"first")
    atomic_write_bytes(p, b"second, longer")
    assert p.read_bytes() == b"second, longer"
    assert sorted(q.name for q in p.parent.iterdir()) == ["x.bin"]
    mode = stat.S_IMODE(p.stat().st_mode)
    umask = os.umask(0)
    os.umask(umask)
    assert mode == 0o666 & ~umask  # what a plain open() would give, not mkstemp's 0600


def test_a_killed_write_leaves_the_old_file_and_a_temporary_that_is_cleaned(tmp_path, monkeypatch):
    p = tmp_path / "x.bin"
    atomic_write_bytes(p, b"old")

    def boom(src, dst):
        raise KeyboardInterrupt

    monkeypatch.setattr(os, "replace", boom)
    with pytest.raises(KeyboardInterrupt):
        atomic_write_bytes(p, b"new")
    monkeypatch.undo()
    assert p.read_bytes() == b"old"
    (tmp_path / ".~x.bin.stale.tmp").write_bytes(b"left by a kill -9")
    assert remove_temporaries(tmp_path) == 1
    assert sorted(q.name for q in tmp_path.iterdir()) == ["x.bin"]


def test_link_or_copy_puts_identical_bytes(tmp_path):
    src = tmp_path / "a.npy"
    src.write_bytes(b"\x00\x01payload")
    link_or_copy(src, tmp_path / "out" / "a.npy")
    assert (tmp_path / "out" / "a.npy").read_bytes() == src.read_bytes()


@pytest.mark.parametrize("n_units,num_shards", [(0, 1), (1, 3), (10, 3), (17, 4), (5, 5)])
def test_job_array_units_partition_every_unit_once(n_units, num_shards):
    got = [selected_units(n_units, num_shards, i) for i in range(num_shards)]
    flat = sorted(u for part in got for u in part)
    assert flat == list(range(n_units))  # every unit exactly once
    assert max(map(len, got)) - min(map(len, got)) <= 1  # balanced whatever N is


@pytest.mark.parametrize("num_shards,index", [(0, 0), (-1, 0), (3, 3), (3, -1)])
def test_impossible_shard_arguments_are_one_line_errors(num_shards, index):
    with pytest.raises(BadInputError) as e:
        check_shard_args(num_shards, index)
    assert "\n" not in str(e.value)


class _Doubler:
    built = 0

    def __init__(self, factor):
        type(self).built += 1
        self.factor = factor

    def __call__(self, batch):
        return {"i": batch["i"], "y": batch["x"] * self.factor}


def test_local_engine_builds_the_worker_once_and_keeps_batches_and_order():
    _Doubler.built = 0
    engine = LocalEngine()
    assert isinstance(engine, BatchEngine)
    batches = [{"i": np.arange(s, min(s + 3, 10)), "x": np.arange(s, min(s + 3, 10)) * 1.0} for s in range(0, 10, 3)]
    out = list(engine.map(_Doubler, (2.0,), batches, total=10, description="t", progress=False))
    assert _Doubler.built == 1
    assert [len(o["i"]) for o in out] == [3, 3, 3, 1]  # one call per input batch, unsplit
    assert np.concatenate([o["y"] for o in out]).tolist() == [2.0 * k for k in range(10)]


@pytest.mark.parametrize("bad", ["gpu", "cuda:99", "tpu", "cuda"])
def test_unusable_devices_are_one_line_errors(bad):
    import torch

    if bad == "cuda" and torch.cuda.is_available():
        pytest.skip("this machine has CUDA")
    with pytest.raises(IsoodError) as e:
        resolve_device(bad)
    assert "\n" not in str(e.value) and "--device" in str(e.value) or "pass" in str(e.value)


def test_auto_device_is_cpu_without_cuda():
    import torch

    assert resolve_device(None) == ("cuda" if torch.cuda.is_available() else "cpu")
    assert resolve_device("cpu") == "cpu"


@pytest.mark.parametrize("given, expected", [(None, None), ("", None), ("auto", None), ("cpu", "cpu"),
                                             ("cuda", "cuda"), ("cuda:1", "cuda:1")])
def test_explicit_device_is_none_only_for_the_default(given, expected):
    assert explicit_device(given) == expected
    if expected is None:  # resolve_device picks for these what it picks for None
        assert resolve_device(given) == resolve_device(None)


def test_cache_dir_expands_home_and_joins(monkeypatch, tmp_path):
    monkeypatch.setenv("HOME", str(tmp_path))
    monkeypatch.setenv(defaults.ENV_CACHE_DIR, "~/my-cache")
    assert defaults.cache_dir("text-features") == tmp_path / "my-cache" / "text-features"
    monkeypatch.delenv(defaults.ENV_CACHE_DIR)
    assert defaults.cache_dir() == tmp_path / ".cache" / "isood"


def test_output_lock_refuses_a_second_writer_and_is_released_by_a_dead_holder(tmp_path):
    import subprocess
    import sys

    from isood.core.files import OutputLocked, output_lock

    holder = subprocess.Popen([sys.executable, "-c", (
        "import sys, time; from isood.core.files import output_lock\n"
        f"with output_lock({str(tmp_path / 'out')!r}):\n"
        "    print('locked', flush=True); time.sleep(60)\n")], stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "locked"
        with pytest.raises(OutputLocked) as e:
            with output_lock(tmp_path / "out"):
                pass
        assert f"pid {holder.pid}" in str(e.value) and "\n" not in str(e.value)
    finally:
        holder.kill()  # SIGKILL: no cleanup code runs in the holder
        holder.wait()
    with output_lock(tmp_path / "out") as folder:  # the kernel dropped the dead holder's lock
        assert folder == tmp_path / "out"
