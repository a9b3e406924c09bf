"""isood.features.ann.fused (backend 'torch-fused'): exact search through reduced-precision candidates, an exact re-rank
and a certificate, checked against a float64 numpy brute force on made-up data full of near-ties (exact and
near-duplicate reference rows, queries at tiny angles from them); the rounding error bound against adversarial
rows; the Triton kernel through its interpreter (a subprocess with TRITON_INTERPRET=1); the reference kept on
the device across chunks; and on a GPU (``pytest -m gpu``) the CUDA kernels against the same brute force."""
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

import isood.features.ann.fused as fused
from isood.features.ann import FusedIndex, SearchOptions, error_bound, resolve_backend
from isood.core.errors import BadInputError
from isood.science.grid import assign_levels, bin_with_edges
from isood.science.laid import LAID
from isood.features.shift import ShiftStream, nearest, shift_search
from isood.science.simulate import random_orthogonal

ROOT = next(p for p in Path(__file__).resolve().parents if (p / "pyproject.toml").is_file())


def _unit(x):
    x = np.asarray(x, np.float64)
    return (x / np.linalg.norm(x, axis=1, keepdims=True)).astype(np.float32)


def near_ties(n_ref=3000, n_query=700, dim=64, seed=0):
    """Clustered reference with exact duplicates (one row 12 times), near-duplicates (20 rows within 1e-4 rad of
    one row) and rows a tiny angle apart; queries: in-cluster, far (random directions: many near-ties), and
    queries within 1e-6 of a duplicated row."""
    rng = np.random.default_rng(seed)
    centres = rng.standard_normal((40, dim))
    ref = _unit(centres[rng.integers(0, 40, n_ref)] + 0.3 * rng.standard_normal((n_ref, dim)))
    ref[np.linspace(400, n_ref - 1, 12).astype(int)] = ref[5]  # exact duplicates, in 12 groups of 32 rows
    ref[300:320] = _unit(ref[6] + 1e-4 * rng.standard_normal((20, dim)))  # near-duplicates
    ref[200:260:3] = _unit(ref[7] + 3e-3 * rng.standard_normal((20, dim)))
    n_far = n_query // 3
    query = _unit(np.concatenate([
        centres[rng.integers(0, 40, n_query - n_far - 3)] + 0.3 * rng.standard_normal((n_query - n_far - 3, dim)),
        rng.standard_normal((n_far, dim)),
        ref[5:8] + 1e-6 * rng.standard_normal((3, dim))]))
    return query, ref


def brute(q, r):
    """float64 brute force, 500 queries at a time: (best similarity, its row, second-best similarity)."""
    best, arg, second = (np.empty(len(q)) for _ in range(3))
    r64 = r.astype(np.float64)
    for s0 in range(0, len(q), 500):
        s = q[s0:s0 + 500].astype(np.float64) @ r64.T
        top2 = np.sort(s, axis=1)[:, -2:]
        best[s0:s0 + 500], second[s0:s0 + 500], arg[s0:s0 + 500] = top2[:, 1], top2[:, 0], s.argmax(axis=1)
    return best, arg.astype(np.int64), second


def check_exact(q, r, sims, idx):
    """The fused answer is exact search's: similarity within 1e-6 of float64 for every row, the row the nearest
    one or tied with it, and the same grid level."""
    best, arg, second = brute(q, r)
    assert np.abs(sims.astype(np.float64) - best).max() < 1e-6
    own = np.einsum("ij,ij->i", q.astype(np.float64), r[idx].astype(np.float64))
    assert np.all(np.abs(own - best) < 1e-12)  # the row found is the nearest or exactly tied with it
    untied = second < best - 1e-9  # where the nearest row is unique, it is that row
    assert untied.sum() > len(q) // 2 and np.array_equal(idx[untied], arg[untied])
    lv_exact, edges = assign_levels(1.0 - best)
    assert np.array_equal(bin_with_edges(1.0 - sims.astype(np.float64), edges), lv_exact)


@pytest.fixture(scope="module")
def data():
    return near_ties()


@pytest.mark.parametrize("precision", ["fp16", "bf16", "tf32"])
def test_fused_torch_kernel_is_exact_search_on_near_ties(data, precision):
    q, r = data
    index = FusedIndex(r, device="cpu", precision=precision, kernel="torch", memory_mb=2)
    sims, idx = index.search(q)
    assert sims.dtype == np.float32 and idx.dtype == np.int64
    check_exact(q, r, sims, idx)
    st = index.stats
    assert st.queries == len(q) == st.certified + st.widened + st.fallback
    if precision == "bf16":  # bf16's bound (0.012) leaves far queries uncertified in the first round
        assert st.widened + st.fallback > 0


def test_every_uncertified_query_goes_to_the_full_search_and_stays_exact(data):
    q, r = data
    index = FusedIndex(r, device="cpu", precision="bf16", kernel="torch", candidates=1, wide=1, memory_mb=2)
    sims, idx = index.search(q)
    assert index.stats.fallback > 0 and index.stats.widened == 0
    check_exact(q, r, sims, idx)


def test_a_false_certificate_would_be_caught(data, monkeypatch):
    """The check is not vacuous: with the error bound forced to -1 (every first round 'certified') one candidate
    group per query misses the nearest row of some queries."""
    q, r = data
    index = FusedIndex(r, device="cpu", precision="bf16", kernel="torch", candidates=1, wide=1, memory_mb=2)
    index.eps = -1.0
    sims, _ = index.search(q)
    best, _, _ = brute(q, r)
    assert np.abs(sims - best).max() > 1e-4


def _aligned_row(stored_bits: int, frac: float, dim: int = 256) -> np.ndarray:
    """A unit float32 row whose components (all ~1/16) each lose ``frac`` of a unit in the last place of a
    format with ``stored_bits`` mantissa bits when rounded (nearest: frac 0.499; truncation: 0.999), all
    downwards: the largest aligned rounding error a unit row can have."""
    hi, lo = 2.0 ** -4 * 2.0 ** -stored_bits, 2.0 ** -5 * 2.0 ** -stored_bits
    x, y = 2.0 ** -4 + frac * hi, 2.0 ** -4 - (1 - frac) * lo
    k = int(round((1 - dim * y * y) / (x * x - y * y)))
    row = np.array([x] * k + [y] * (dim - k - 1), np.float64)
    row = np.append(row, np.sqrt(1 - np.sum(row ** 2)))
    return row.astype(np.float32)


@pytest.mark.parametrize("precision", ["fp16", "bf16", "tf32"])
def test_error_bound_holds_for_adversarial_rows(precision):
    """Rows whose every component rounds the same way, as far as it can: the reduced-precision similarity of
    the row with itself stays within error_bound of the float64 one, and the bound is tight (not a blanket)."""
    bits, frac = {"fp16": (10, 0.499), "bf16": (7, 0.499), "tf32": (10, 0.999)}[precision]
    q = _aligned_row(bits, frac)
    assert abs(np.linalg.norm(q.astype(np.float64)) - 1) < 1e-6
    if precision == "tf32":  # a truncating tf32 conversion (the worst case): drop 13 of the 23 stored bits
        qq = (q.view(np.int32) & ~np.int32(0x1FFF)).view(np.float32).astype(np.float64)
        approx = float(np.float32(qq @ qq))
    else:
        t = torch.from_numpy(q)[None].to({"fp16": torch.float16, "bf16": torch.bfloat16}[precision])
        approx = float((t @ t.T).float())
    err = abs(approx - float(q.astype(np.float64) @ q.astype(np.float64)))
    bound = error_bound(precision, 256, rounded_output=precision != "tf32")
    assert err <= bound
    assert err > bound / 4  # the bound is of the right order (3u, half of it reached)


def test_nearest_torch_fused_and_the_stream_give_exact_answers_whatever_the_chunks(monkeypatch):
    import isood.features.shift as shift

    rng = np.random.default_rng(2)
    centres = rng.standard_normal((30, 24))
    ids = _unit(centres[rng.integers(0, 20, 2000)] + 0.3 * rng.standard_normal((2000, 24)))
    test = _unit(centres[rng.integers(0, 30, 3000)] + 0.3 * rng.standard_normal((3000, 24)))
    laid = LAID(random_orthogonal(24, seed=2))
    d, i = nearest(test, ids, backend="torch-fused", device="cpu")
    check_exact(test, ids, 1.0 - d.astype(np.float64), i)  # distance = 1 - similarity (clipped at 0)

    monkeypatch.setattr(shift, "BLOCK_ROWS", 1024)
    builds = []
    real = fused.FusedIndex.__init__

    def counting(self, *a, **k):
        builds.append(1)
        real(self, *a, **k)

    monkeypatch.setattr(fused.FusedIndex, "__init__", counting)
    whole = shift_search(test, ids, laid, backend="torch-fused", device="cpu")
    n_whole = len(builds)
    got = ShiftStream(ids, laid, n_test=len(test), backend="torch-fused", device="cpu").measure(
        lambda: [test[s:s + 700] for s in range(0, len(test), 700)])
    assert n_whole == 2 and len(builds) == 4  # one resident reference per axis, whatever the number of blocks
    assert got.d_sem.tobytes() == whole.d_sem.tobytes() and got.d_cov.tobytes() == whole.d_cov.tobytes()
    flat = shift_search(test, ids, laid, backend="faiss-flat")
    np.testing.assert_allclose(got.d_sem, flat.d_sem, atol=2e-6)
    np.testing.assert_allclose(got.d_cov, flat.d_cov, atol=2e-6)


def test_auto_picks_the_fused_search_on_cuda_and_options_are_checked(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    assert resolve_backend("auto", None) == "torch-fused"
    assert resolve_backend("auto", "cpu") == "faiss-flat"
    with pytest.raises(BadInputError, match="unknown search precision 'fp8'"):
        SearchOptions(precision="fp8")
    with pytest.raises(BadInputError, match="backend 'torch-fused' is exact"):
        SearchOptions(backend="torch-fused", recall=0.99)
    with pytest.raises(BadInputError, match="needs a CUDA device"):
        FusedIndex(np.eye(4, dtype=np.float32), device="cpu", kernel="triton")


_TRITON_SCRIPT = r"""
import numpy as np, sys, torch
sys.path.insert(0, {root!r}); sys.path.insert(0, {tests!r})
from test_shift_fused import near_ties, check_exact
from isood.features.ann.fused import FusedIndex
from isood.features.ann.fused_kernel import group_maxima
q, r = near_ties(n_ref=700, n_query=300, dim=40)
for precision in ("fp16", "tf32"):
    index = FusedIndex(r, device="cpu", precision=precision, kernel="triton", memory_mb=1)
    sims, idx = index.search(q)
    check_exact(q, r, sims, idx)
    ref = FusedIndex(r, device="cpu", precision=precision, kernel="torch")
    qq = index._upload(q[:50]).to(index.low.dtype)
    got = group_maxima(qq, index.low, len(r), 32).numpy()
    want = (qq[:, :40].double() @ torch.from_numpy(r).to(index.low.dtype).double().T).numpy()
    want = np.pad(want, ((0, 0), (0, 32 * index.n_groups - len(r))), constant_values=-np.inf)
    want = want.reshape(50, -1, 32).max(axis=2)
    assert np.abs(got - want).max() < 1e-5, np.abs(got - want).max()
    print(precision, index.kernel, index.stats)
print("ok")
"""


def test_triton_kernel_in_the_interpreter_is_exact():
    pytest.importorskip("triton")
    script = _TRITON_SCRIPT.format(root=str(ROOT), tests=str(Path(__file__).parent))
    env = {**os.environ, "TRITON_INTERPRET": "1", "PYTHONPATH": str(ROOT)}
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, env=env, timeout=600)
    assert proc.returncode == 0 and proc.stdout.strip().endswith("ok"), proc.stdout + proc.stderr
    assert "fp16 triton" in proc.stdout


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
@pytest.mark.parametrize("kernel", ["torch", "triton"])
@pytest.mark.parametrize("precision", ["fp16", "bf16", "tf32"])
def test_fused_on_cuda_is_exact_search(kernel, precision):
    if kernel == "triton":
        pytest.importorskip("triton")
    q, r = near_ties(n_ref=200_000, n_query=5_000, dim=256, seed=4)
    index = FusedIndex(r, device="cuda", precision=precision, kernel=kernel, memory_mb=512)
    sims, idx = index.search(q)
    check_exact(q, r, sims, idx)
    assert index.stats.certified > len(q) // 2
