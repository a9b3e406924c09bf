"""ann_levels' second stage (isood.features.ann.widen): the widening rule by hand, the tuner's robustness to where the
build's edges fall, and the two-stage search against a brute-force numpy search on a planted world of near and
far queries."""
from __future__ import annotations

import math

import numpy as np
import pytest

from isood.features.ann import sample_rows
from isood.features.ann.levels import LevelSearch, _moved, near_edge
from isood.features.ann.tune import Target
from isood.features.ann.widen import GAP_MISSES, gap_candidates, list_rows, widen_stat
from isood.science.grid import bin_with_edges, level_edges


def _unit(x):
    return (x / np.linalg.norm(x, axis=1, keepdims=True)).astype(np.float32)


def near_and_far_world(n_ref=8000, n_query=16000, dim=32, seed=11):
    """Compact classes; queries are new images of them (near: their nearest row in their class's list) or
    directions of their own (far: the nearest rows are near-ties spread over many lists)."""
    rng = np.random.default_rng(seed)
    centres = _unit(rng.standard_normal((80, dim)))
    ref = _unit(centres[rng.integers(0, 80, n_ref)] + 0.35 * rng.standard_normal((n_ref, dim)) / np.sqrt(dim))
    near = rng.random(n_query) < 0.5
    base = np.where(near[:, None], centres[rng.integers(0, 80, n_query)], _unit(rng.standard_normal((n_query, dim))))
    return ref, _unit(base + 0.45 * rng.standard_normal((n_query, dim)) / np.sqrt(dim))


def brute_force(q, r):
    sims = q.astype(np.float64) @ r.T.astype(np.float64)
    return sims.max(axis=1), sims.argmax(axis=1)


def test_widen_stat_is_the_gap_to_the_lower_edge_of_the_highest_possible_level():
    rng = np.random.default_rng(0)
    edges = np.sort(rng.uniform(0.1, 0.9, 9))
    slack = rng.uniform(0.0, 0.02, 9)
    d = np.concatenate([rng.uniform(0.0, 1.0, 3000), edges, edges - slack, edges + slack])
    nxt = rng.uniform(0.0, 1.0, len(d))
    got = widen_stat(d, nxt, edges, slack)
    for k in range(len(d)):
        inner = [j for j in range(1, len(edges) - 1) if edges[j] - slack[j] <= d[k]]
        expect = -math.inf if not inner else nxt[k] - (1.0 - (edges[max(inner)] + slack[max(inner)]))
        assert got[k] == pytest.approx(expect, abs=1e-12)
    assert widen_stat(np.array([np.nan, np.inf]), np.array([0.0, 0.0]), edges)[0] == math.inf


def test_a_query_the_rule_leaves_alone_keeps_its_level_when_no_unprobed_row_beats_the_best_centroid():
    rng = np.random.default_rng(1)
    edges = np.linspace(0.2, 0.8, 9)
    d = rng.uniform(0.0, 1.0, 20000)  # found distances
    nxt = 1.0 - d + rng.uniform(-0.2, 0.2, len(d))  # best unprobed centroid similarity
    free = widen_stat(d, nxt, edges) < 0.0  # gap 0: not widened
    # exact answers: as good as the best unprobed similarity could make them (never better than found)
    exact_d = np.minimum(d, 1.0 - nxt)
    assert np.array_equal(bin_with_edges(exact_d[free], edges), bin_with_edges(d[free], edges))
    assert 0.2 < free.mean() < 0.95  # not vacuous either way


def test_gap_candidates_leave_exactly_that_many_changed_queries_unwidened():
    rng = np.random.default_rng(2)
    stat = rng.standard_normal(500)
    changed = rng.random(500) < 0.2
    for gap in gap_candidates(stat, changed):
        missed = int(np.sum(changed & ~(stat >= gap)))
        assert missed in set(GAP_MISSES) | {int(changed.sum())}
    assert gap_candidates(stat, np.zeros(500, bool)) == [math.inf]
    rows = list_rows(np.array([5, 1, 4]), np.array([[2, 0, -1]]), 10)
    assert np.allclose(rows, [[0.4, 0.9, 0.9]])


def test_moved_counts_a_query_that_changes_level_at_edges_within_their_slack():
    edges = np.linspace(0.1, 0.9, 9)
    slack = np.full(9, 0.01)
    exact = np.array([0.2948, 0.3048, 0.44, 0.20])
    found = np.array([0.2952, 0.3052, 0.46, 0.20])  # 1st, 2nd: straddle edge 0.3 moved by half its slack;
    # 3rd: farther than the slack from every edge; 4th: exact
    moved = _moved(found, exact, edges, slack)
    assert moved.tolist() == [True, True, False, False]
    assert not np.any(bin_with_edges(found, edges)[:2] != bin_with_edges(exact, edges)[:2])  # not at the edges


@pytest.fixture(scope="module")
def searched():
    ref, q = near_and_far_world()
    rows = sample_rows(len(q), 1500, 0)
    both = np.concatenate(rows)

    def exact(x):
        s, i = brute_force(x, ref)
        return s.astype(np.float32), i

    search = LevelSearch(ref, q[both], rows, n_query=len(q), target=Target(levels=0.999), exact=exact, nlist=128)
    approx, _ = search.search(q)
    approx = approx.copy()
    fixes, report = search.finish()
    sims = approx.copy()
    for at, s, _ in fixes:
        sims[at] = s
    return ref, q, rows, search, approx, sims, report, brute_force(q, ref)[0]


def test_two_stage_search_keeps_the_levels_of_a_brute_force_search(searched):
    ref, q, rows, search, approx, sims, report, exact = searched
    d, ex = np.clip(1.0 - sims.astype(np.float64), 0, 2), np.clip(1.0 - exact, 0, 2)
    assert np.all(d >= ex - 1e-5)  # only overestimates
    for edges in (level_edges(d, 8), level_edges(ex, 8)):
        assert np.mean(bin_with_edges(d, edges) == bin_with_edges(ex, edges)) >= 0.999
    plan = report.levels["plan"]
    assert plan["wide"] > plan["nprobe"] and 0.0 < report.levels["widened_share"] < 1.0  # the second stage ran
    # the widened queries are the far ones: a near query rarely needs more lists than its first
    assert report.levels["widened_share"] < 0.9


def test_sampled_queries_are_re_searched_by_their_own_answer_like_every_other_query(searched):
    ref, q, rows, search, approx, sims, report, exact = searched
    edges = level_edges(np.clip(1.0 - sims.astype(np.float64), 0, 2), 8)
    own = np.clip(1.0 - approx[rows[1]].astype(np.float64), 0, 2)  # held-out queries' own answers
    near = near_edge(own, search.reach[rows[1]], edges)
    assert near.any()  # the plan searches some queries exactly near an edge (else this checks nothing)
    # every held-out query an edge is within reach of (by its own answer) was answered exactly, as any other
    assert np.allclose(report.check_approx[near], exact[rows[1]][near], atol=1e-5)
    assert report.levels["levels_heldout_lower"] < report.levels["levels_heldout"] <= 1.0
