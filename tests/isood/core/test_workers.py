"""isood.core.workers: one meaning per worker count, one default rule, one record."""

from __future__ import annotations

import os

import pytest

from isood.core.engine import LocalEngine
from isood.core.workers import MAX_DEFAULT_DECODE_PROCESSES, RAY_DECODE_PROCESSES, WorkerSpec, resolve_workers


def test_the_default_decoders_are_every_cpu_but_the_models_at_most_32(monkeypatch):
    for cpus, want in ((None, 0), (1, 0), (2, 1), (16, 15), (200, MAX_DEFAULT_DECODE_PROCESSES)):
        monkeypatch.setattr(os, "cpu_count", lambda: cpus)
        assert resolve_workers() == resolve_workers(None, LocalEngine()) == WorkerSpec(want, None)
    assert resolve_workers(5) == WorkerSpec(5, None)  # asked: taken as is


def test_a_cluster_engine_gets_its_actors_and_the_actors_default_decoders():
    class Cluster(LocalEngine):
        def __init__(self):
            super().__init__(name="cluster")

        @property
        def actors(self):
            return 7

    assert resolve_workers(None, Cluster()) == WorkerSpec(RAY_DECODE_PROCESSES, 7)
    assert resolve_workers(2, Cluster()).as_config() == {"decode_processes": 2, "ray_actors": 7}


def test_every_command_that_decodes_takes_the_one_default():
    """extract, build-splits and evaluate: ``--workers`` is the field ``decode_processes``, default None (the one
    rule), bounded by the same description."""
    from isood.core.optspec import option_fields
    from isood.stages.evaluate.options import EvaluateOptions
    from isood.stages.extract import ExtractOptions
    from isood.stages.splits.options import SplitsOptions

    described = []
    for cls in (ExtractOptions, SplitsOptions, EvaluateOptions):
        (f, spec, kind), = [(f, s, k) for f, s, k in option_fields(cls) if s.flag_name(f.name) == "--workers"]
        described.append((f.name, f.default, spec.least, spec.most, kind))
    assert described == [("decode_processes", None, 0, 256, "int")] * 3
    opts = EvaluateOptions(splits="s", id_test="t", out="o")
    assert opts.workers == resolve_workers()


@pytest.mark.parametrize("cls_name", ["ExtractOptions", "SynOptions"])
def test_ray_workers_is_the_field_ray_actors(cls_name):
    from isood.core.optspec import option_fields
    from isood.stages.extract import ExtractOptions
    from isood.stages.syn.options import SynOptions

    cls = {"ExtractOptions": ExtractOptions, "SynOptions": SynOptions}[cls_name]
    flags = {s.flag_name(f.name): (f.name, s.aliases, s.least) for f, s, _ in option_fields(cls)}
    assert flags["--ray-workers"] == ("ray_actors", (), 1)
    assert "--workers" not in flags or flags["--workers"][0] == "decode_processes"
