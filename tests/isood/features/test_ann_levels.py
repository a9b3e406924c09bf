"""ann_levels (isood.features.ann.levels): levels against a brute-force numpy search on a generator the search was not
tuned on, the held-out bound from queries excluded from tuning, and the near-edge rule as a proof."""
from __future__ import annotations

import numpy as np
import pytest

from isood.features.ann import SearchOptions, sample_rows, search_report
from isood.features.ann.levels import lower_bound, near_edge
from isood.science.grid import bin_with_edges, level_edges
from isood.features.shift import nearest, nearest_cosine_distance


def _unit(x):
    return (x / np.linalg.norm(x, axis=1, keepdims=True)).astype(np.float32)


def heavy_tailed_world(n_ref=6000, n_query=16000, dim=24, seed=3):
    """Zipf class sizes, anisotropic (power-law) noise, near and far queries: a structure of its own."""
    rng = np.random.default_rng(seed)
    n_cls = 150
    centres = _unit(rng.standard_normal((n_cls, dim)))
    sizes = rng.zipf(1.7, n_cls).astype(float)
    labels = rng.choice(n_cls, n_ref, p=sizes / sizes.sum())
    scale = np.arange(1, dim + 1) ** -0.7
    basis = np.linalg.qr(rng.standard_normal((dim, dim)))[0]
    noise = lambda n, a: (rng.standard_normal((n, dim)) * scale * a) @ basis.T  # noqa: E731
    ref = _unit(centres[labels] + noise(n_ref, 0.3))
    near = rng.random(n_query) < 0.4
    base = np.where(near[:, None], centres[rng.integers(0, n_cls, n_query)], _unit(rng.standard_normal((n_query, dim))))
    return ref, _unit(base + noise(n_query, 0.4))


def brute_force(q, r):
    return np.clip(1.0 - (q.astype(np.float64) @ r.T.astype(np.float64)).max(axis=1), 0.0, 2.0)


@pytest.fixture(scope="module")
def searched():
    ref, q = heavy_tailed_world()
    sims, _, report = search_report(q, ref, SearchOptions(levels=0.999, sample=1000, seed=0))
    return ref, q, np.clip(1.0 - sims.astype(np.float64), 0.0, 2.0), report, brute_force(q, ref)


def test_levels_match_brute_force_on_an_untuned_generator(searched):
    ref, q, approx, report, exact = searched
    assert report.levels["exact_share"] < 0.9  # the IVF answered a share of the queries itself
    for edges in (level_edges(approx, 8), level_edges(exact, 8)):  # the build's edges, an exact build's
        agree = np.mean(bin_with_edges(approx, edges) == bin_with_edges(exact, edges))
        assert agree >= 0.999, agree
    assert np.all(approx >= exact - 1e-5)  # an approximate distance can only overestimate


def test_heldout_bound_comes_from_queries_excluded_from_tuning(searched):
    ref, q, approx, report, exact = searched
    tune, held = sample_rows(len(q), 1000, 0)
    assert np.array_equal(report.check_rows, held) and not np.intersect1d(tune, held).size
    edges = level_edges(approx, 8)
    # the held-out queries' own (pre-exact) answers, recomputed: their levels vs brute force
    mine = np.clip(1.0 - report.check_approx.astype(np.float64), 0.0, 2.0)
    agree = bin_with_edges(mine, edges) == bin_with_edges(exact[held], edges)
    k, n = int(agree.sum()), len(held)
    assert report.levels["levels_heldout"] == pytest.approx(k / n)
    assert report.levels["levels_heldout_lower"] == pytest.approx(lower_bound(k, n))
    assert report.levels["levels_heldout_lower"] < report.levels["levels_heldout"] <= 1.0
    assert report.levels["uncovered"] == 0


def test_lower_bound_is_one_sided_wilson():
    from statistics import NormalDist

    z = NormalDist().inv_cdf(0.95)
    k, n = 1996, 2000
    p = k / n
    expect = (p + z * z / (2 * n) - z * np.sqrt(p * (1 - p) / n + z * z / (4 * n * n))) / (1 + z * z / n)
    assert lower_bound(k, n) == pytest.approx(expect)
    assert lower_bound(2000, 2000) < 1.0 and lower_bound(0, 0) == 0.0


def test_a_query_not_near_an_edge_keeps_its_level_whatever_the_exact_answer():
    rng = np.random.default_rng(0)
    edges = np.sort(rng.uniform(0.1, 0.9, 9))
    # found distances: random, on the edges, and a hair above them (near-ties)
    d = np.concatenate([rng.uniform(0.0, 1.0, 20000), edges, np.nextafter(edges, 2.0), edges + 1e-9])
    reach = rng.uniform(0.0, 0.1, len(d))
    reach[-3 * len(edges):] = np.repeat([0.0, 1e-12, 2e-9], len(edges))  # zero, tiny and tie-sized reaches
    free = ~near_edge(d, reach, edges)
    for frac in (0.0, 0.5, 1.0 - 1e-12, 1.0):  # every exact distance in [d - reach, d]
        true = d - frac * reach
        assert np.array_equal(bin_with_edges(true[free], edges), bin_with_edges(d[free], edges))
    # and the rule is not vacuous: most random queries are free, a query within reach above an edge is not
    assert free[:20000].mean() > 0.3
    assert near_edge(np.array([edges[3] + 0.01]), np.array([0.02]), edges)[0]
    assert near_edge(np.array([np.nan]), np.array([0.0]), edges)[0]


def test_end_edges_are_exact_quantiles_when_nothing_near_them_is_approximate(searched):
    ref, q, approx, report, exact = searched
    e_a, e_x = level_edges(approx, 8), level_edges(exact, 8)
    assert np.allclose(e_a, e_x, atol=1e-5)


def test_public_names_keep_working_with_ann_levels():
    ref, q = heavy_tailed_world(n_ref=3000, n_query=4000, dim=16, seed=5)
    found = nearest(q, ref, ann_levels=0.999, ann_sample=500)
    d = nearest_cosine_distance(q, ref, ann_levels=0.999, ann_sample=500)
    assert np.allclose(found.distance, d, atol=1e-6)
    exact = brute_force(q, ref)
    assert np.all(found.distance >= exact - 1e-5)
    # the index is the row the distance was measured to
    assert np.allclose(found.distance, np.clip(1.0 - np.einsum("ij,ij->i", q, ref[found.index]), 0, 2), atol=1e-5)
