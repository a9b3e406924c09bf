"""The public names users import keep working over the layered folders: each is the very object of its home
module (a re-export, never a copy), and a facade module offers every name of its home's ``__all__``."""

from __future__ import annotations

import importlib

import pytest

FACADES = {  # public module -> the modules whose __all__ it re-exports
    "isood.laid": ["isood.science.laid"],
    "isood.grid": ["isood.science.grid"],
    "isood.shift": ["isood.science.shift", "isood.features.shift"],
    "isood.evaluation.metrics": ["isood.science.metrics"],
}


@pytest.mark.parametrize("facade", sorted(FACADES))
def test_a_facade_offers_every_name_of_its_home_as_the_same_object(facade):
    public = importlib.import_module(facade)
    for home_name in FACADES[facade]:
        home = importlib.import_module(home_name)
        for name in home.__all__:
            assert getattr(public, name) is getattr(home, name), f"{facade}.{name}"
            assert name in public.__all__, f"{facade}.__all__ lacks {name}"


@pytest.mark.parametrize("name, home", [
    ("read", "isood.kinds"), ("evaluate", "isood.stages.evaluate.api"), ("evaluate_scores", "isood.science.cells"),
    ("fit_laid", "isood.science.laid"), ("nearest_cosine_distance", "isood.features.shift"),
    ("assign_levels", "isood.science.grid"), ("SplitsOptions", "isood.stages.splits.options"),
    ("Benchmark", "isood.benchmarks.api"), ("load_dataset", "isood.features.image_datasets"),
])
def test_isood_names_are_their_homes_objects(name, home):
    import isood

    assert getattr(isood, name) is getattr(importlib.import_module(home), name)


def test_the_documented_calls_of_the_public_modules_run():
    """The calls the architecture names, through the public modules, on a tiny input against numpy."""
    import numpy as np

    import isood.evaluation.metrics as M
    import isood.grid
    import isood.laid
    import isood.shift

    rng = np.random.default_rng(0)
    q = rng.normal(size=(5, 4))
    r = rng.normal(size=(7, 4))
    qn = (q / np.linalg.norm(q, axis=1, keepdims=True)).astype(np.float32)
    rn = (r / np.linalg.norm(r, axis=1, keepdims=True)).astype(np.float32)
    d = isood.shift.nearest_cosine_distance(qn, rn)
    np.testing.assert_allclose(d, 1 - (qn @ rn.T).max(axis=1), atol=1e-5)
    levels, edges = isood.grid.assign_levels(np.linspace(0, 1, 100), 4)
    assert levels.min() == 0 and levels.max() == 3 and len(edges) == 5
    assert M.auroc(np.array([2.0, 3.0]), np.array([0.0, 1.0])) == 1.0
    assert callable(isood.laid.fit_laid) and isood.laid.LAID is importlib.import_module("isood.science.laid").LAID
