"""isood.features.ann's IVF (batched list scanning, adaptive probe plans) and the recall-tuned search, each against a
brute-force numpy reference (float64 similarities, every row / every probed list enumerated by hand)."""
import math

import numpy as np
import pytest

from isood.features.ann import (AnnReport, ProbePlan, SearchOptions, build_ivf, ivf_search, probe_ladder, sample_rows,
                       scan_lists, search_report, search_tuned, tune_plan)
from isood.features.ann.tune import MAX_SCAN_FRACTION
from isood.core.errors import BadInputError
from isood.science.grid import level_edges
from isood.features.shift import level_agreement


def _unit(x):
    return (x / np.linalg.norm(x, axis=1, keepdims=True)).astype(np.float32)


def _clustered(n, centres, seed, spread=0.25):
    rng = np.random.default_rng(seed)
    return _unit(centres[rng.integers(0, len(centres), n)] + spread * rng.standard_normal((n, centres.shape[1])))


def _brute(q, r, rows=None):
    """Exact best similarity and row of each query (over ``rows`` of r only, when given)."""
    rows = np.arange(len(r)) if rows is None else np.asarray(rows)
    s = q.astype(np.float64) @ r[rows].astype(np.float64).T
    return s.max(axis=1), rows[s.argmax(axis=1)]


def _lists_by_hand(index, q, n):
    """Every query's ``n`` most similar centroids (float64, by hand) and the reference rows of each list."""
    order = np.argsort(-(q.astype(np.float64) @ index.centroids.astype(np.float64).T), axis=1, kind="stable")
    members = [index.ids[index.offsets[i]:index.offsets[i + 1]] for i in range(index.nlist)]
    return order[:, :n], members


@pytest.fixture(scope="module")
def clustered():
    centres = np.random.default_rng(0).standard_normal((40, 16))
    ref = _clustered(6000, centres[:30], seed=1)
    query = _clustered(4000, centres, seed=2)  # a quarter from clusters absent in ref: far queries
    return query, ref


def test_build_ivf_partitions_every_row_once_into_its_nearest_centroid(clustered):
    _, ref = clustered
    index = build_ivf(ref, nlist=32, seed=0)
    assert index.nlist == 32 and index.offsets[0] == 0 and index.offsets[-1] == len(ref)
    assert sorted(index.ids.tolist()) == list(range(len(ref)))
    np.testing.assert_array_equal(index.vectors, ref[index.ids])
    sims = ref.astype(np.float64) @ index.centroids.astype(np.float64).T
    own = sims[np.arange(len(ref)), index.list_of_row]
    assert np.all(own >= sims.max(axis=1) - 1e-5)  # each row sits in (one of) its most similar lists
    np.testing.assert_allclose(np.linalg.norm(index.centroids, axis=1), 1.0, atol=1e-5)  # spherical k-means


@pytest.mark.parametrize("threads", [1, 3])
def test_scan_lists_is_brute_force_over_the_given_lists(clustered, threads):
    query, ref = clustered
    index = build_ivf(ref, nlist=32, seed=0)
    rng = np.random.default_rng(5)
    q = query[:300]
    lists = rng.integers(-1, 32, size=(300, 4))  # any lists, repeats and -1 (none) included
    lists[7] = -1  # a query that probes nothing
    best, arg = scan_lists(index, q, lists, threads=threads)
    members = [index.ids[index.offsets[i]:index.offsets[i + 1]] for i in range(32)]
    for i in range(300):
        rows = np.unique(np.concatenate([members[lst] for lst in lists[i] if lst >= 0] or [np.empty(0, int)]))
        if not len(rows):
            assert arg[i] == -1 and best[i] == -np.inf
            continue
        want_s, want_i = _brute(q[i:i + 1], ref, rows)
        assert best[i] == pytest.approx(want_s[0], abs=1e-5) and arg[i] == want_i[0]


def test_adaptive_plan_follows_the_margin_rule(clustered):
    query, ref = clustered
    index = build_ivf(ref, nlist=32, seed=0)
    q = query[:400]
    plan = ProbePlan(2, 8, margin=0.05)
    best, arg, reprobed = ivf_search(index, q, plan, query_chunk=150)  # several chunks
    top, members = _lists_by_hand(index, q, 8)
    csims = np.sort(q.astype(np.float64) @ index.centroids.astype(np.float64).T, axis=1)[:, ::-1]
    n_again = 0
    for i in range(len(q)):
        s1, _ = _brute(q[i:i + 1], ref, np.concatenate([members[lst] for lst in top[i, :2]]))
        again = s1[0] < csims[i, 2] + 0.05  # written out: best after 2 lists vs the 3rd centroid + margin
        n_again += again
        rows = np.concatenate([members[lst] for lst in top[i, :8 if again else 2]])
        want_s, want_i = _brute(q[i:i + 1], ref, rows)
        assert best[i] == pytest.approx(want_s[0], abs=1e-5) and arg[i] == want_i[0]
    assert reprobed == pytest.approx(n_again / len(q))
    assert 0 < n_again < len(q)  # the rule splits the queries: the check is not vacuous


def test_full_probe_is_exact_and_a_plan_never_beats_exact(clustered):
    query, ref = clustered
    index = build_ivf(ref, nlist=16, seed=0)
    want_s, want_i = _brute(query, ref)
    best, arg, _ = ivf_search(index, query, 16)
    np.testing.assert_allclose(best, want_s, atol=1e-5)
    assert np.mean(arg == want_i) == 1.0
    best1, _, _ = ivf_search(index, query, ProbePlan(1, 4, margin=0.0))
    assert np.all(best1 <= want_s + 1e-5)


def test_probe_ladder_steps_by_half_octaves_up_to_the_limit():
    assert probe_ladder(1) == [1]
    assert probe_ladder(10) == [1, 2, 3, 4, 6, 8, 10]
    assert probe_ladder(64) == [1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 48, 64]


def test_tuned_plan_is_the_cheapest_meeting_the_target_on_the_sample(clustered):
    query, ref = clustered
    index = build_ivf(ref, nlist=64, seed=0)
    q = query[:1000]
    _, exact_rows = _brute(q, ref)
    plan, reached = tune_plan(index, q, exact_rows, recall=0.97)
    need = 0.97 + math.sqrt(0.97 * 0.03 / len(q))
    _, arg, reprobed = ivf_search(index, q, plan)
    assert np.mean(arg == exact_rows) == pytest.approx(reached, abs=2 / len(q)) and reached >= need - 1e-9
    # cheaper than every uniform plan that meets the target (uniform plans are among those searched)
    uniform = [p for p in probe_ladder(int(64 * MAX_SCAN_FRACTION))
               if np.mean(ivf_search(index, q, p)[1] == exact_rows) >= need]
    cost = plan.nprobe + reprobed * (plan.widest - plan.nprobe)
    assert uniform and cost <= min(uniform) + 1e-9
    assert plan.widest <= 64 * MAX_SCAN_FRACTION


def test_search_tuned_reaches_the_target_and_reports_against_brute_force(clustered):
    query, ref = clustered
    want_s, want_i = _brute(query, ref)
    exact_calls = []

    def exact(x):
        exact_calls.append(len(x))
        return _brute(x, ref)

    sims, idx, report = search_tuned(query, ref, recall=0.98, exact=exact, sample=500, nlist=64, seed=1)
    assert isinstance(report, AnnReport) and report.plan is not None
    assert report.tune_queries == report.check_queries == 500 and exact_calls[0] == 1000
    # the held-out numbers are the brute-force truth on the held-out rows
    rows = report.check_rows
    np.testing.assert_allclose(report.check_exact, want_s[rows], atol=1e-5)
    hit = report.check_approx >= want_s[rows] - 1e-6
    assert report.recall_check == pytest.approx(np.mean(hit), abs=1e-9)
    # the sampled rows carry exact answers; the search as a whole meets the target (within sampling error)
    tune_rows, check_rows = sample_rows(len(query), 500, 1)
    assert np.all(idx[np.concatenate([tune_rows, check_rows])] == want_i[np.concatenate([tune_rows, check_rows])])
    others = np.setdiff1d(np.arange(len(query)), np.concatenate([tune_rows, check_rows]))
    assert np.mean(idx[others] == want_i[others]) >= 0.98 - 3 * math.sqrt(0.98 * 0.02 / len(others))
    assert np.mean(idx == want_i) < 1.0  # it is approximate: the check is not vacuous
    assert np.all(sims <= want_s + 1e-5)


def test_level_agreement_is_the_written_out_binning(clustered):
    query, ref = clustered
    _, _, report = search_tuned(query, ref, recall=0.9, exact=lambda x: _brute(x, ref), sample=500, nlist=64)
    d_exact, d_approx = 1 - report.check_exact, 1 - report.check_approx
    edges = level_edges(1 - _brute(query, ref)[0], 8)
    lo, width = edges[0], edges[1] - edges[0]

    def level(d):  # equal-width levels, folded ends
        return np.clip(np.floor((d - lo) / width), 0, 7)

    assert level_agreement(report, edges) == pytest.approx(np.mean(level(d_exact) == level(d_approx)), abs=1e-9)


def test_an_unreachable_target_is_a_one_line_error():
    rng = np.random.default_rng(3)
    ref, query = _unit(rng.standard_normal((4000, 64))), _unit(rng.standard_normal((2000, 64)))  # no structure
    with pytest.raises(BadInputError) as e:
        search_report(query, ref, SearchOptions(recall=0.99, sample=400, nlist=64))
    message = str(e.value)
    assert "\n" not in message and "0.99" in message and "64 lists" in message


def test_small_query_sets_are_searched_exactly():
    rng = np.random.default_rng(4)
    ref, query = _unit(rng.standard_normal((500, 8))), _unit(rng.standard_normal((30, 8)))
    _, idx, report = search_report(query, ref, SearchOptions(recall=0.99))
    assert report.plan is None and np.all(idx == _brute(query, ref)[1])


@pytest.mark.parametrize("bad", [0, 0.0, 1.5, -0.1, float("nan"), True, "high"])
def test_recall_must_be_in_zero_one(bad):
    with pytest.raises(BadInputError, match="recall"):
        SearchOptions(recall=bad)


def test_recall_asks_for_approximate_search():
    for backend in ("torch", "faiss-flat"):
        with pytest.raises(BadInputError, match=backend):
            SearchOptions(backend=backend, recall=0.99)
    with pytest.raises(BadInputError, match="nprobe"):
        SearchOptions(recall=0.99, nprobe=8)
    assert SearchOptions(backend="faiss-ivf", recall=np.float32(0.9)).recall == np.float32(0.9)


def test_reachable_target_is_the_highest_target_the_reached_recall_allows():
    from isood.features.ann.tune import _needed, reachable_target

    for reached, n in [(0.9993, 2000), (0.904, 500), (0.5, 100), (1.0, 2000)]:
        t = reachable_target(reached, n)
        assert _needed(t, n) <= reached + 1e-12 and round(t * 10_000) == t * 10_000
        assert t == 1.0 or _needed(t + 1e-4, n) > reached  # the next target up needs more than was reached
    assert reachable_target(0.0, 10) == 0.0


def test_estimate_exact_edges_moves_the_ends_by_the_weighted_sample_difference():
    from isood.features.ann import estimate_exact_edges

    rng = np.random.default_rng(0)
    exact = rng.uniform(0.2, 0.8, 4000)
    approx = exact.copy()
    approx[exact > 0.7] += 0.05  # the far images' distances overestimated
    edges = np.linspace(0.25, 0.85, 5)
    got = estimate_exact_edges(edges, exact, approx, (0.01, 0.99), weight=0.5)
    lo_shift = np.quantile(approx, 0.01) - np.quantile(exact, 0.01)
    hi_shift = np.quantile(approx, 0.99) - np.quantile(exact, 0.99)
    np.testing.assert_allclose(got, np.linspace(0.25 - 0.5 * lo_shift, 0.85 - 0.5 * hi_shift, 5))
    assert hi_shift > 0.04 and lo_shift == 0
    np.testing.assert_array_equal(estimate_exact_edges(edges, exact, exact, (0.01, 0.99)), edges)
