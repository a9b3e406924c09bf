"""generate-syn with `isood.engines.ray.RayEngine`: what the stage refuses before any work. (The Ray-vs-local
equality of a whole run is tests/isood/engines/test_engines_ray.py::test_generate_syn_ray_equals_local.)"""

from __future__ import annotations

import pytest

from isood.stages.syn import SynOptions, run_generate_syn
from isood.core.errors import BadInputError

pytest.importorskip("ray")


def test_custom_generator_is_refused_with_ray_before_any_work(tmp_path):
    from isood.engines.ray import RayEngine

    with pytest.raises(BadInputError, match="only with the local engine, not 'ray'"):
        run_generate_syn(SynOptions(out=tmp_path / "o", id_features="unused", progress=False),
                         engine=RayEngine(actors=1, device="cpu"), generator=lambda *a: [])
    assert not (tmp_path / "o").exists()
