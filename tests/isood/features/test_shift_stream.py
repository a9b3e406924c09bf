"""isood.features.shift's streamed measurement (ShiftStream), isood.science.shift's blocks (check_rows /
normalise_rows, laid_halves, rechunk) and isood.features.ann's chunked searches: a set given chunk by chunk gives the
bytes of the set held in memory, whatever the chunks; distances against a float64 brute force; the ID side kept as its
two LAID halves only."""
import numpy as np
import pytest

import isood.features.shift as shift
from isood.features.ann import (QUERY_CHUNK, IvfChunks, SearchOptions, TunedSearch, build_ivf, ivf_search, sample_rows,
                                search_tuned)
from isood.science.laid import LAID
from isood.features.shift import ShiftStream, shift_search
from isood.science.shift import BLOCK_ROWS, check_rows, laid_halves, normalise_rows, prepare_features, rechunk
from isood.science.simulate import random_orthogonal


def _unit(x):
    return (x / np.linalg.norm(x, axis=1, keepdims=True)).astype(np.float32)


def _brute_halves(test, ids, W):
    """D_sem, D_cov by the written-out formula in float64: halves of f W, re-normalised, 1 - max cosine."""
    def halves(x):
        x = x.astype(np.float64) / np.linalg.norm(x.astype(np.float64), axis=1, keepdims=True)
        y = x @ W.astype(np.float64)
        k = W.shape[0] // 2
        return [h / np.linalg.norm(h, axis=1, keepdims=True) for h in (y[:, :k], y[:, k:])]
    return [1.0 - (t @ i.T).max(axis=1) for t, i in zip(halves(test), halves(ids))]


def _pieces(x, sizes):
    """``x`` cut into consecutive chunks of the given sizes (cycled)."""
    out, s, k = [], 0, 0
    while s < len(x):
        out.append(x[s:s + sizes[k % len(sizes)]])
        s += sizes[k % len(sizes)]
        k += 1
    return out


@pytest.fixture(scope="module")
def world():
    rng = np.random.default_rng(0)
    centres = rng.standard_normal((50, 24))
    ids = _unit(centres[rng.integers(0, 35, 3000)] + 0.3 * rng.standard_normal((3000, 24)))
    test = _unit(centres[rng.integers(0, 50, 9000)] + 0.3 * rng.standard_normal((9000, 24)))
    return test, ids, LAID(random_orthogonal(24, seed=2))


def test_rechunk_gives_exact_blocks_in_order():
    x = np.arange(103 * 2).reshape(103, 2)
    for sizes in ([1], [7, 13], [40], [103], [500], [0, 5]):
        blocks = list(rechunk(_pieces(x, sizes) if sizes != [0, 5] else [x[:0], *_pieces(x, [5])], 10))
        assert [len(b) for b in blocks] == [10] * 10 + [3]
        np.testing.assert_array_equal(np.concatenate(blocks), x)
    whole = list(rechunk([x], 50))
    assert all(np.shares_memory(b, x) for b in whole)  # one long chunk is cut into views


def test_check_rows_and_normalise_rows_block_by_block_give_prepare_features_bytes():
    rng = np.random.default_rng(1)
    x = rng.standard_normal((5000, 12)).astype(np.float32)
    x /= np.linalg.norm(x, axis=1, keepdims=True)
    for dirty in (False, True):
        y = x.copy()
        if dirty:  # one NaN row and one row off unit norm: every kept row is divided by its norm
            y[1234] = np.nan
            y[4321] *= 3.0
        notes = []
        want, dropped = prepare_features(y, "f", warn=notes.append)
        blocks = _pieces(y, [700, 1300])
        check = check_rows(blocks)
        assert check.as_given == (not dirty) and check.dropped.tolist() == dropped.tolist()
        assert check.messages("f") == notes
        got = np.concatenate([normalise_rows(b, as_given=check.as_given) for b in blocks])
        assert got.tobytes() == want.tobytes()
        if dirty:
            assert check.n_off == 1 and check.off_min == pytest.approx(3.0, rel=1e-6)


def test_laid_halves_are_the_normalised_halves_of_f_w(world):
    test, _, laid = world
    sem, cov = laid_halves(test, laid, block_rows=1000)
    y = test.astype(np.float64) @ laid.W.astype(np.float64)
    for got, half in ((sem, y[:, :12]), (cov, y[:, 12:])):
        np.testing.assert_allclose(got, half / np.linalg.norm(half, axis=1, keepdims=True), atol=1e-6)


def test_a_shift_block_is_one_ivf_query_chunk():
    """The LAID blocks of the rows are the IVF search's query chunks: a set of one block is one chunk."""
    assert BLOCK_ROWS == QUERY_CHUNK and shift.BLOCK_ROWS == BLOCK_ROWS


@pytest.mark.parametrize("sizes", [[9000], [1], [2048, 777], [4096]])
def test_stream_equals_shift_search_whatever_the_chunks(world, sizes, monkeypatch):
    test, ids, laid = world
    monkeypatch.setattr(shift, "BLOCK_ROWS", 2048)  # several blocks in a small set
    whole = shift_search(test, ids, laid, backend="faiss-flat")
    stream = ShiftStream(ids, laid, n_test=len(test), backend="faiss-flat")
    got = stream.measure(lambda: _pieces(test, sizes))
    assert got.d_sem.tobytes() == whole.d_sem.tobytes() and got.d_cov.tobytes() == whole.d_cov.tobytes()
    d_sem, d_cov = _brute_halves(test, ids, laid.W)
    np.testing.assert_allclose(got.d_sem, d_sem, atol=2e-5)
    np.testing.assert_allclose(got.d_cov, d_cov, atol=2e-5)


def test_stream_keeps_only_the_two_id_halves(world):
    _, ids, laid = world
    stream = ShiftStream(ids, laid, n_test=10)
    assert stream.reference_bytes == ids.size * 4  # D/2 + D/2 float32 per ID row
    assert all(not np.shares_memory(r, ids) for r in stream.reference)


def test_stream_ann_recall_equals_the_in_memory_tuned_search(world, monkeypatch):
    test, ids, laid = world
    monkeypatch.setattr(shift, "BLOCK_ROWS", 1024)
    kw = dict(ann_recall=0.9, nlist=64, ann_sample=500, seed=3)
    whole = shift_search(test, ids, laid, **kw)
    calls = []

    def chunks():
        calls.append(1)
        return _pieces(test, [1500, 333])

    got = ShiftStream(ids, laid, n_test=len(test), **kw).measure(chunks)
    assert len(calls) == 2  # one pass gathers the tuning sample, one searches
    assert got.d_sem.tobytes() == whole.d_sem.tobytes() and got.d_cov.tobytes() == whole.d_cov.tobytes()
    tune, check = sample_rows(len(test), 500, 3)
    for axis in ("sem", "cov"):
        a, b = got.ann[axis], whole.ann[axis]
        assert (a.recall_tune, a.recall_check, a.reprobed, a.plan) == (b.recall_tune, b.recall_check, b.reprobed, b.plan)
        assert a.check_rows.tolist() == check.tolist()
        assert a.check_approx.tobytes() == b.check_approx.tobytes()
    d_sem, _ = _brute_halves(test, ids, laid.W)
    exact_rows = np.concatenate([tune, check])  # the sampled rows keep their exact answers
    np.testing.assert_allclose(got.d_sem[exact_rows], d_sem[exact_rows], atol=2e-5)
    assert np.all(got.d_sem >= d_sem - 2e-5)  # an approximate nearest row is never nearer than the nearest


def test_tuned_search_in_chunks_is_search_tuned_on_the_whole(world):
    test, ids, _ = world
    exact = lambda q: ((q.astype(np.float64) @ ids.T.astype(np.float64)).max(1).astype(np.float32),  # noqa: E731
                       (q.astype(np.float64) @ ids.T.astype(np.float64)).argmax(1))
    sims, idx, report = search_tuned(test, ids, recall=0.9, exact=exact, sample=400, nlist=64, seed=1)
    rows = sample_rows(len(test), 400, 1)
    tuned = TunedSearch(ids, test[np.concatenate(rows)], rows, n_query=len(test), recall=0.9, exact=exact,
                        nlist=64, seed=1, query_chunk=1000)
    parts = [tuned.search(c) for c in _pieces(test, [1000])]
    s2, i2 = np.concatenate([p[0] for p in parts]), np.concatenate([p[1] for p in parts])
    fixes, r2 = tuned.finish()
    for at, s, i in fixes:
        s2[at], i2[at] = s, i
    # one IVF chunk of the whole set vs 1000-row chunks: the same answers (ties aside), the same report
    np.testing.assert_allclose(s2, sims, atol=1e-6)
    assert np.mean(i2 == idx) > 0.999 and r2.plan == report.plan and r2.check_queries == report.check_queries


def test_ivf_chunks_search_the_empty_probes_exactly_at_the_end(world):
    _, ids, _ = world
    index = build_ivf(ids, nlist=16, seed=0)
    q = _unit(np.random.default_rng(5).standard_normal((3000, 24)))
    whole_s, whole_i, _ = ivf_search(index, q, 2, query_chunk=500)
    chunks = IvfChunks(index, 2, query_chunk=500)
    got = [chunks.search(c) for c in _pieces(q, [500])]
    assert np.concatenate([g[0] for g in got]).tobytes() == whole_s.tobytes()
    rows, s, i = chunks.missing(lambda x: (np.ones(len(x), np.float32), np.zeros(len(x), np.int64)))
    assert rows.tolist() == np.flatnonzero(whole_i < 0).tolist()


def test_options_are_checked_before_anything_is_measured(world):
    _, ids, laid = world
    with pytest.raises(Exception, match="nprobe"):
        ShiftStream(ids, laid, n_test=5, backend="faiss-ivf", nprobe=0)
    with pytest.raises(Exception, match="dimension mismatch"):
        ShiftStream(ids[:, :8], laid, n_test=5)
    stream = ShiftStream(ids, laid, n_test=5, backend="faiss-flat")
    with pytest.raises(Exception, match="4 test rows were read, 5 expected"):
        stream.measure(lambda: [ids[:4]])
    assert SearchOptions(backend="faiss-flat").recall is None
