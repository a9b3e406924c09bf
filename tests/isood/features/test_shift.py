"""isood.features.shift + isood.features.ann: every backend against a brute-force numpy reference, chunking, bad input, nearest,
shift_distances."""
import warnings

import numpy as np
import pytest
import torch

from isood.features.ann import SearchOptions, block_sizes, default_nlist, resolve_backend
from isood.core.errors import BadInputError, IsoodError
from isood.science.laid import LAID
from isood.features.shift import nearest, nearest_cosine_distance, shift_distances
from isood.science.shift import Nearest, prepare_features
from isood.science.simulate import random_orthogonal


def _clustered(n, centres, seed, spread=0.3):
    rng = np.random.default_rng(seed)
    x = centres[rng.integers(0, len(centres), n)] + spread * rng.standard_normal((n, centres.shape[1]))
    return (x / np.linalg.norm(x, axis=1, keepdims=True)).astype(np.float32)


def _brute(q, r):
    q = q / np.linalg.norm(q, axis=1, keepdims=True)
    r = r / np.linalg.norm(r, axis=1, keepdims=True)
    s = q.astype(np.float64) @ r.astype(np.float64).T
    return 1.0 - s.max(axis=1), s.argmax(axis=1)


@pytest.fixture(scope="module")
def data():
    centres = np.random.default_rng(0).standard_normal((60, 32))
    ref = _clustered(3000, centres[:40], seed=1)
    query = _clustered(500, centres, seed=2)  # a third of the queries come from clusters absent in ref
    return query, ref, *_brute(query, ref)


@pytest.mark.parametrize("backend", ["torch", "faiss-flat", "auto"])
def test_exact_backends_match_brute_force(data, backend):
    query, ref, d_true, i_true = data
    d, i = nearest(query, ref, backend=backend, device="cpu")
    assert d.shape == (500,) and d.dtype == np.float32
    np.testing.assert_allclose(d, d_true, atol=2e-6)
    assert (i == i_true).mean() == 1.0
    assert d_true.min() < 0.2 and d_true.max() > 0.5  # the check is not vacuous: distances spread out


def test_ivf_at_full_nprobe_is_exact_and_low_nprobe_only_overestimates(data):
    query, ref, d_true, i_true = data
    d, i = nearest(query, ref, backend="faiss-ivf", nlist=32, nprobe=32)
    np.testing.assert_allclose(d, d_true, atol=2e-6)
    assert (i == i_true).mean() == 1.0
    d1, i1 = nearest(query, ref, backend="faiss-ivf", nlist=32, nprobe=1)
    assert np.all(d1 >= d_true - 2e-6)  # an approximate search can only miss the nearest row, never beat it
    recall1 = (i1 == i_true).mean()
    d8, i8 = nearest(query, ref, backend="faiss-ivf", nlist=32, nprobe=8)
    assert (i8 == i_true).mean() >= recall1 and (i8 == i_true).mean() > 0.9


def test_ivf_is_deterministic_for_a_seed(data):
    query, ref, _, _ = data
    a = nearest_cosine_distance(query, ref, backend="faiss-ivf", nlist=32, nprobe=2, seed=3)
    b = nearest_cosine_distance(query, ref, backend="faiss-ivf", nlist=32, nprobe=2, seed=3)
    np.testing.assert_array_equal(a, b)


def test_default_nlist_rule():
    assert default_nlist(10) == 1
    assert default_nlist(3000) == 76  # 4*sqrt(3000)=219 -> 256, capped at 3000 // 39 = 76
    assert default_nlist(1_000_000) == 4096


@pytest.mark.parametrize("backend", ["torch", "faiss-flat"])
def test_chunking_gives_identical_results(data, backend):
    query, ref, _, _ = data
    d0, i0 = nearest(query, ref, backend=backend)
    d1, i1 = nearest(query, ref, backend=backend, query_chunk=7, reference_chunk=113)
    d2, i2 = nearest(query, ref, backend=backend, memory_mb=0.05)
    np.testing.assert_allclose(d1, d0, rtol=0, atol=1e-6)
    np.testing.assert_allclose(d2, d0, rtol=0, atol=1e-6)
    np.testing.assert_array_equal(i1, i0)
    np.testing.assert_array_equal(i2, i0)


def test_torch_tensors_are_accepted(data):
    query, ref, d_true, _ = data
    d = nearest_cosine_distance(torch.from_numpy(query), torch.from_numpy(ref), backend="torch")
    np.testing.assert_allclose(d, d_true, atol=2e-6)


def test_nan_query_rows_give_nan_and_bad_reference_rows_are_excluded(data):
    query, ref, d_true, i_true = data
    q = query[:50].copy()
    q[3, 0] = np.nan
    q[10] = 0.0
    r = np.concatenate([np.full((1, 32), np.inf, np.float32), ref])
    with pytest.warns(UserWarning) as rec:
        d, i = nearest(q, r, backend="torch")
    messages = [str(w.message) for w in rec]
    assert any(m.startswith("query: 2 of 50 rows contain NaN/inf or are all zero") for m in messages)
    assert any(m.startswith("reference: 1 of 3001 rows contain NaN/inf") for m in messages)
    assert np.isnan(d[[3, 10]]).all() and i[3] == -1 and i[10] == -1
    ok = np.setdiff1d(np.arange(50), [3, 10])
    np.testing.assert_allclose(d[ok], d_true[ok], atol=2e-6)
    np.testing.assert_array_equal(i[ok], i_true[ok] + 1)  # indices refer to the original reference rows


def test_non_normalised_input_is_normalised_with_a_warning(data):
    query, ref, d_true, _ = data
    with pytest.warns(UserWarning, match=r"query: 500 of 500 rows are not L2-normalised"):
        d = nearest_cosine_distance(query * 3.0, ref, backend="faiss-flat")
    np.testing.assert_allclose(d, d_true, atol=2e-6)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # normalised input: no warning at all
        nearest_cosine_distance(query, ref, backend="faiss-flat")


def test_prepare_features_in_blocks_matches_a_whole_array_reference():
    """Blocked normalisation (no N x D float64 copy) = the float64 formula on the whole array, bad rows on
    both sides of block boundaries included."""
    rng = np.random.default_rng(9)
    x = rng.standard_normal((40_000, 6)).astype(np.float32) * rng.uniform(0.5, 3.0, (40_000, 1)).astype(np.float32)
    bad = [0, 16_383, 16_384, 32_768, 39_999]
    x[bad[:3]] = np.nan
    x[bad[3]] = 0.0
    x[bad[4], 2] = np.inf
    y, dropped = prepare_features(x, "f", warn=False)
    assert np.flatnonzero(dropped).tolist() == bad
    keep = ~dropped
    want = x[keep].astype(np.float64) / np.linalg.norm(x[keep].astype(np.float64), axis=1, keepdims=True)
    np.testing.assert_allclose(y[keep], want, atol=1e-6)
    assert np.isnan(y[dropped]).all()


def test_prepare_features_keeps_clean_unit_rows_without_a_copy_and_normalises_near_unit_ones():
    rng = np.random.default_rng(10)
    x = rng.standard_normal((100, 8)).astype(np.float32)
    x /= np.linalg.norm(x, axis=1, keepdims=True)
    y, dropped = prepare_features(x, "f", warn=False)
    assert np.shares_memory(x, y) and not dropped.any()  # already clean: a large reference is not copied
    x2 = x.copy()
    x2[5] *= 1.0 + 1e-4  # off by more than float32 rounding: normalised (silently, within the 1e-3 tolerance)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        y2, _ = prepare_features(x2, "f")
    assert not np.shares_memory(x2, y2) and x2[5, 0] != y2[5, 0]
    np.testing.assert_allclose(np.linalg.norm(y2.astype(np.float64), axis=1), 1.0, atol=1e-6)


def test_prepare_features_returns_mask_and_unit_rows():
    x = np.array([[3.0, 4.0], [np.nan, 1.0], [0.0, 2.0]])
    with pytest.warns(UserWarning):
        y, dropped = prepare_features(x, "f")
    assert dropped.tolist() == [False, True, False]
    np.testing.assert_allclose(y[[0, 2]], [[0.6, 0.8], [0.0, 1.0]], atol=1e-7)
    assert np.isnan(y[1]).all() and y.dtype == np.float32


def test_bad_inputs_raise_one_line_errors(data):
    query, ref, _, _ = data
    with pytest.raises(IsoodError, match=r"^feature dimension mismatch: query has 16, reference has 32; pass features from the same encoder$"):
        nearest_cosine_distance(query[:, :16], ref)
    with pytest.raises(IsoodError, match=r"^reference set is empty"):
        nearest_cosine_distance(query, np.zeros((0, 32), np.float32))
    with pytest.warns(UserWarning), pytest.raises(IsoodError, match=r"^reference set is empty"):
        nearest_cosine_distance(query, np.full((4, 32), np.nan, np.float32))
    with pytest.raises(IsoodError, match=r"expected a 2-D array"):
        nearest_cosine_distance(query[0], ref)
    with pytest.raises(IsoodError, match=r"unknown shift backend 'annoy'"):
        nearest_cosine_distance(query, ref, backend="annoy")
    with pytest.raises(TypeError, match="k"):
        nearest_cosine_distance(query, ref, k=5)
    with pytest.raises(TypeError):
        nearest_cosine_distance(query, ref, return_index=True)  # the index comes from nearest()
    with pytest.raises(BadInputError, match="nprobe"):
        nearest_cosine_distance(query, ref, backend="faiss-ivf", nprobe=0)
    with pytest.raises(IsoodError) as info:
        nearest_cosine_distance(query, ref[:, :8])
    assert "\n" not in str(info.value)


def test_empty_query_returns_empty(data):
    _, ref, _, _ = data
    assert nearest_cosine_distance(np.zeros((0, 32), np.float32), ref).shape == (0,)


def test_shift_distances_matches_manual_laid_projection(data):
    query, ref, _, _ = data
    W = random_orthogonal(32, seed=5) * np.linspace(0.5, 1.5, 32)  # not orthogonal: halves need re-normalising
    laid = LAID(W)
    q = query.copy()
    q[7] = np.nan
    with pytest.warns(UserWarning, match="test features: 1 of 500"):
        d_sem, d_cov = shift_distances(q, ref, laid, backend="faiss-flat")
    ok = np.arange(500) != 7
    qs, qc = laid.transform(query)
    rs, rc = laid.transform(ref)
    np.testing.assert_allclose(d_sem[ok], _brute(qs, rs)[0][ok], atol=3e-6)
    np.testing.assert_allclose(d_cov[ok], _brute(qc, rc)[0][ok], atol=3e-6)
    assert np.isnan(d_sem[7]) and np.isnan(d_cov[7])
    # the two halves measure different things
    assert np.abs(d_sem[ok] - d_cov[ok]).mean() > 0.05
    with pytest.raises(IsoodError, match="LAID W is 32x32"):
        shift_distances(query[:, :16], ref[:, :16], laid)


def test_nearest_is_a_named_tuple_matching_nearest_cosine_distance(data):
    query, ref, d_true, i_true = data
    result = nearest(query, ref, backend="faiss-flat")
    assert isinstance(result, Nearest) and result._fields == ("distance", "index")
    np.testing.assert_array_equal(result.distance, nearest_cosine_distance(query, ref, backend="faiss-flat"))
    assert result.index.dtype == np.int64 and (result.index == i_true).all()
    d, i = result
    assert d is result.distance and i is result.index


@pytest.mark.parametrize("n_query, n_ref, dim, memory_mb, qc, rc, expected", [
    (500, 3000, 32, 256, None, None, (500, 3000)),          # everything fits in one block
    (10_000, 10**6, 512, 256, None, None, (4096, 14563)),   # 256 MiB // (4 B * (4096 + 512)) reference rows
    (500, 3000, 32, 256, 7, 113, (7, 113)),                 # explicit chunks win
    (500, 3000, 32, 0.05, None, None, (248, 936)),          # budget floored at 1 MiB; fewer queries per block
])
def test_block_sizes_follow_the_memory_budget(n_query, n_ref, dim, memory_mb, qc, rc, expected):
    assert block_sizes(n_query, n_ref, dim, memory_mb, qc, rc) == expected


def test_auto_backend_is_exact_and_options_are_checked():
    assert resolve_backend("auto", "cpu") == "faiss-flat"
    assert resolve_backend("faiss-ivf", None) == "faiss-ivf"
    with pytest.raises(BadInputError, match="unknown shift backend 'annoy'"):
        SearchOptions(backend="annoy")
    with pytest.raises(BadInputError, match="query_chunk"):
        SearchOptions(query_chunk=0)


def test_prepare_features_reports_to_a_callable_or_stays_silent():
    x = np.array([[3.0, 4.0], [np.nan, 1.0], [0.0, 1.0]])
    seen = []
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        _, dropped = prepare_features(x, "f", warn=seen.append)
        prepare_features(x, "f", warn=False)
    assert dropped.tolist() == [False, True, False]
    assert len(seen) == 2 and seen[0].startswith("f: 1 of 3 rows contain NaN/inf") and "not L2-normalised" in seen[1]
