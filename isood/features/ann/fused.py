"""Exact nearest-neighbour search at matrix-multiply speed (``backend='torch-fused'``).

The reference is uploaded once and stays on the device (:class:`FusedIndex`); query blocks are streamed. Per
query block:

1. *Candidates in reduced precision.* The query block and the reference, rounded to ``precision`` (fp16 by
   default; bf16 or tf32), are multiplied in one matrix product per reference block (the torch kernel: cuBLAS /
   the CPU BLAS with float32 accumulation, the product written in the input precision) or in one fused Triton
   kernel that never writes the product (``isood.features.ann.fused_kernel``: float32 accumulation, only the maxima
   leave the chip). Reference rows are taken in groups of :data:`GROUP_ROWS` consecutive rows; what is kept of
   each query x group is its largest approximate similarity (the *group maxima*, ``n_ref / 32`` per query).
2. *Exact re-rank.* The :data:`CANDIDATE_GROUPS` groups of largest maxima are re-ranked exactly: every row of
   them in float32 (TF32 off), the best :data:`RESCORE` of those again in float64 (ties: the lowest row).
3. *Certificate.* Rounding the unit rows to ``precision`` moves a similarity by at most :func:`error_bound`
   (``eps``: 2u + u^2 for the inputs, u the unit round-off, the float32 accumulation of ``dim`` products, and u
   again where the product is written in fp16/bf16; 1.5e-3 for fp16 at 256 dimensions). A row outside the
   candidates has an approximate similarity of at most the largest group maximum left out (``tau``), so its
   exact similarity is at most ``tau + eps``. When the re-ranked best is above ``tau + eps`` it is the exact
   nearest row: certified. A query that is not certified is re-ranked again with :data:`WIDE_GROUPS` groups
   (its group maxima are still in memory), and one that is still not certified (many near-ties within
   ``eps``) is searched in full in float32 and its best :data:`RESCORE` rows rescored in float64.

So the answer is exact search's, whatever the precision: the similarity is the float64 inner product of the
float32 rows, rounded to float32 (within 6e-8 of the true one; the blocked float32 search is within ~1e-6), the
row is the nearest one (the lowest of exact ties). A row's answer does not depend on the other rows of its
block. :class:`FusedStats` counts how each query was answered (the benches print it).

Memory: the reference twice on the device (float32 for the re-rank, the reduced copy for the candidates:
1.28M x 256 rows take 1.3 + 0.66 GB), plus ``memory_mb`` for a query block's group maxima, one product block
(torch kernel) and the re-rank's gathered rows. torch (and triton) are imported inside the functions.
"""

from __future__ import annotations

import contextlib
import math
import os
from dataclasses import asdict, dataclass

import numpy as np

from isood.core.devices import torch_device
from isood.core.errors import BadInputError

__all__ = ["PRECISIONS", "DEFAULT_PRECISION", "KERNELS", "GROUP_ROWS", "CANDIDATE_GROUPS", "WIDE_GROUPS", "RESCORE",
           "FusedIndex", "FusedStats", "error_bound", "check_precision", "triton_available", "search_fused"]

#: Reduced precisions of the candidate pass (fp16: 11 significant bits, the tightest bound at tensor-core speed;
#: unit rows cannot overflow it).
PRECISIONS = ("fp16", "bf16", "tf32")
DEFAULT_PRECISION = "fp16"
#: Candidate kernels: 'auto' = Triton on a CUDA device when triton imports, else torch.
KERNELS = ("auto", "torch", "triton")
#: Consecutive reference rows per group (one group maximum per query x group).
GROUP_ROWS = 32
#: Groups re-ranked exactly per query, first round and for the queries the first round did not certify.
CANDIDATE_GROUPS = 8
WIDE_GROUPS = 64
#: Rows of the float32 re-rank rescored in float64.
RESCORE = 8

#: Unit round-off of each precision (tf32: 10 stored bits; truncating conversions allowed for) and the absolute
#: error below its normal range (fp16 subnormals: half the spacing 2^-24).
_UNIT = {"fp16": 2.0 ** -11, "bf16": 2.0 ** -8, "tf32": 2.0 ** -10}
_TINY = {"fp16": 2.0 ** -25, "bf16": 0.0, "tf32": 0.0}
_U32 = 2.0 ** -24


def check_precision(precision: str | None) -> str:
    """``precision`` (None = :data:`DEFAULT_PRECISION`), checked."""
    p = DEFAULT_PRECISION if precision is None else precision
    if p not in PRECISIONS:
        raise BadInputError(f"unknown search precision {precision!r}; pass one of {', '.join(PRECISIONS)}")
    return p


def error_bound(precision: str, dim: int, *, rounded_output: bool) -> float:
    """The largest error of an approximate similarity of two unit rows of ``dim`` dimensions: both rounded to
    ``precision`` (relative u each, plus the absolute error below the normal range), the ``dim`` products
    summed in float32 (gamma_dim), and, with ``rounded_output``, the sum rounded to ``precision`` (u). Norms
    are allowed 1e-5 above 1 (clean rows are unit within 1e-6)."""
    u, eta = _UNIT[check_precision(precision)], _TINY[precision]
    norm = 1.0 + 1e-5
    inputs = (2 * u + u * u) * norm * norm + 2 * eta * (1 + u) * math.sqrt(dim) * norm + dim * eta * eta
    gamma = dim * _U32 / (1 - dim * _U32)
    acc = gamma * (1 + u) ** 2 * norm * norm
    out = u * (norm * norm + inputs + acc) if rounded_output else 0.0
    return inputs + acc + out


def triton_available() -> bool:
    """Whether triton imports here (it ships with Linux torch wheels)."""
    try:
        import triton  # noqa: F401
    except ImportError:
        return False
    return True


def _interpreting() -> bool:
    return os.environ.get("TRITON_INTERPRET", "") == "1"


@dataclass
class FusedStats:
    """How the queries searched so far were answered: certified in the first round, in the second
    (``widened``), or searched in full (``fallback``)."""

    queries: int = 0
    certified: int = 0
    widened: int = 0
    fallback: int = 0

    def as_dict(self) -> dict:
        return asdict(self)


@contextlib.contextmanager
def _matmul_mode(precision: str | None):
    """torch's matmul settings for one pass: ``None`` = exact float32 (TF32 off); 'tf32' = TF32 allowed;
    'fp16' / 'bf16' = float32 accumulation of reduced inputs (no reduced-precision split-K reductions).
    Restored afterwards."""
    import torch

    before = torch.get_float32_matmul_precision()
    cuda_mm = torch.backends.cuda.matmul
    flags = {k: getattr(cuda_mm, k) for k in ("allow_fp16_reduced_precision_reduction",
                                              "allow_bf16_reduced_precision_reduction") if hasattr(cuda_mm, k)}
    try:
        torch.set_float32_matmul_precision("high" if precision == "tf32" else "highest")
        for k in flags:
            setattr(cuda_mm, k, False)
        yield
    finally:
        torch.set_float32_matmul_precision(before)
        for k, v in flags.items():
            setattr(cuda_mm, k, v)


class FusedIndex:
    """A reference (clean, L2-normalised float32 rows) resident on ``device`` for exact search through
    reduced-precision candidates (module docstring). ``search(q)`` -> (max inner product float32, row int64)
    per query; ``stats`` counts how the queries were answered. ``kernel``: 'auto' (Triton on CUDA when
    available), 'torch' or 'triton' (CUDA, or the Triton interpreter: ``TRITON_INTERPRET=1``)."""

    def __init__(self, reference: np.ndarray, *, device: str | None = None, precision: str | None = None,
                 memory_mb: float = 256, kernel: str = "auto", group: int = GROUP_ROWS,
                 candidates: int = CANDIDATE_GROUPS, wide: int = WIDE_GROUPS, rescore: int = RESCORE):
        import torch

        self.precision = check_precision(precision)
        if kernel not in KERNELS:
            raise BadInputError(f"unknown fused-search kernel {kernel!r}; pass one of {', '.join(KERNELS)}")
        self.device = torch_device(device)
        cuda = self.device.type == "cuda"
        if kernel == "auto":
            kernel = "triton" if cuda and triton_available() else "torch"
        if kernel == "triton" and not (cuda or _interpreting()):
            raise BadInputError("the fused Triton kernel needs a CUDA device (or TRITON_INTERPRET=1 to interpret "
                                "it); pass kernel='torch'")
        if kernel == "triton" and not triton_available():
            raise BadInputError("kernel='triton' needs triton (pip install triton); pass kernel='torch'")
        if kernel == "triton" and not cuda and self.precision == "bf16":  # numpy has no bfloat16
            raise BadInputError("the Triton interpreter cannot run bf16; pass precision 'fp16' or 'tf32' on the CPU")
        self.kernel = kernel
        r = np.ascontiguousarray(reference, dtype=np.float32)
        if r.ndim != 2 or len(r) == 0:
            raise BadInputError(f"fused search: the reference must be a non-empty (N, D) array, got {r.shape}")
        self.n, self.dim = r.shape
        self.group, self.candidates, self.wide, self.rescore = int(group), int(candidates), int(wide), int(rescore)
        if min(self.group, self.candidates, self.rescore) < 1 or self.wide < self.candidates:
            raise BadInputError("fused search: need group, candidates, rescore >= 1 and wide >= candidates")
        self.n_groups = -(-self.n // self.group)
        # Triton's tl.dot wants dimensions of 16 or more, in steps of 16: zero columns change no product
        self.dim_pad = self.dim if kernel == "torch" else max(16, -(-self.dim // 16) * 16)
        exact = torch.zeros((self.n_groups * self.group, self.dim_pad), dtype=torch.float32, device=self.device)
        exact[:self.n, :self.dim] = torch.from_numpy(r).to(self.device)
        self.exact = exact
        low = {"fp16": torch.float16, "bf16": torch.bfloat16, "tf32": torch.float32}[self.precision]
        self.low = exact if low == torch.float32 else exact.to(low)
        # the torch kernel writes the product in the input precision (rounded); Triton keeps float32 sums
        self.eps = error_bound(self.precision, self.dim,
                               rounded_output=kernel == "torch" and self.precision != "tf32")
        self.budget = max(1.0, float(memory_mb)) * 2 ** 20
        g = self.group
        self.ref_block = min(len(exact), max(g, (65_536 // g) * g))
        per_row = self.n_groups * 4 + (self.ref_block * self.low.element_size() if kernel == "torch" else 0)
        self.query_block = int(max(1, min(65_536, self.budget // max(1, per_row))))
        self.stats = FusedStats()

    @property
    def nbytes(self) -> int:
        """Device memory of the resident reference (both copies)."""
        extra = 0 if self.low.data_ptr() == self.exact.data_ptr() else self.low.numel() * self.low.element_size()
        return int(self.exact.numel() * 4 + extra)

    # ------------------------------------------------------------------------------------------- passes
    def _upload(self, q: np.ndarray):
        import torch

        x = torch.from_numpy(np.ascontiguousarray(q, dtype=np.float32)).to(self.device)
        if self.dim_pad != self.dim:
            x = torch.nn.functional.pad(x, (0, self.dim_pad - self.dim))
        return x

    def group_maxima(self, q32):
        """(queries, groups) largest approximate similarity of each query in each group of reference rows."""
        import torch

        qlow = q32 if self.low.dtype == torch.float32 else q32.to(self.low.dtype)
        if self.kernel == "triton":
            from isood.features.ann.fused_kernel import group_maxima

            with _matmul_mode(self.precision):
                return group_maxima(qlow, self.low, self.n, self.group, tf32=self.precision == "tf32")
        b, g = len(qlow), self.group
        out = torch.empty((b, self.n_groups), dtype=self.low.dtype, device=self.device)
        with _matmul_mode(self.precision), torch.no_grad():
            for r0 in range(0, len(self.low), self.ref_block):
                s = qlow @ self.low[r0:r0 + self.ref_block].T
                if r0 + s.shape[1] > self.n:  # the padded rows of the last group
                    s[:, self.n - r0:] = -math.inf
                out[:, r0 // g:(r0 + s.shape[1]) // g] = s.view(b, -1, g).amax(dim=2)
        return out

    def _rescore(self, q32, rows):
        """float64 best similarity and row (lowest among ties) of each query over its ``rows`` (-1 = none)."""
        import torch

        valid = (rows >= 0) & (rows < self.n)
        safe = torch.where(valid, rows, torch.zeros_like(rows))
        s = (self.exact[safe].double() * q32.double().unsqueeze(1)).sum(dim=-1)
        s = torch.where(valid, s, torch.full_like(s, -math.inf))
        best = s.max(dim=1).values
        big = torch.full_like(rows, np.iinfo(np.int64).max)
        arg = torch.where((s == best.unsqueeze(1)) & valid, rows, big).min(dim=1).values
        return best, arg

    def _rerank(self, q32, cand):
        """Exact best of each query over the rows of its candidate groups ``cand`` (queries, k)."""
        import torch

        b, k = cand.shape
        g, d = self.group, self.dim_pad
        groups = self.exact.view(self.n_groups, g, d)
        best = torch.empty(b, dtype=torch.float64, device=self.device)
        arg = torch.empty(b, dtype=torch.int64, device=self.device)
        step = int(max(1, self.budget // (k * g * (d + 2) * 4 * 2)))
        offs = torch.arange(g, device=self.device)
        with _matmul_mode(None), torch.no_grad():
            for s0 in range(0, b, step):
                c = cand[s0:s0 + step]
                qq = q32[s0:s0 + step]
                m = len(c)
                rows = (c.unsqueeze(2) * g + offs).reshape(m, k * g)
                sims = torch.bmm(groups[c].reshape(m, k * g, d), qq.unsqueeze(2)).squeeze(2)
                sims = sims.masked_fill(rows >= self.n, -math.inf)
                top = sims.topk(min(self.rescore, k * g), dim=1).indices
                best[s0:s0 + m], arg[s0:s0 + m] = self._rescore(qq, rows.gather(1, top))
        return best, arg

    def _round(self, q32, maxima, k: int):
        """One certified round with ``k`` candidate groups: (best, row, certified) per query."""
        import torch

        k = min(k, self.n_groups)
        vals, groups = maxima.topk(min(k + 1, self.n_groups), dim=1)
        best, arg = self._rerank(q32, groups[:, :k])
        if k == self.n_groups:  # every group was re-ranked
            return best, arg, torch.ones_like(best, dtype=torch.bool)
        tau = vals[:, k].double()
        return best, arg, best > tau + self.eps

    def _full(self, q32):
        """float32 search of every reference row, the best :data:`RESCORE` rescored in float64."""
        import torch

        b, top = len(q32), min(self.rescore, self.n)
        best_v = torch.full((b, top), -math.inf, dtype=torch.float32, device=self.device)
        best_i = torch.full((b, top), -1, dtype=torch.int64, device=self.device)
        with _matmul_mode(None), torch.no_grad():
            for r0 in range(0, self.n, self.ref_block):
                s = q32 @ self.exact[r0:min(self.n, r0 + self.ref_block)].T
                v, i = s.topk(min(top, s.shape[1]), dim=1)
                v, j = torch.cat([best_v, v], 1).topk(top, dim=1)
                best_i = torch.cat([best_i, i + r0], 1).gather(1, j)
                best_v = v
        return self._rescore(q32, best_i)

    def _search_block(self, q32):
        import torch

        maxima = self.group_maxima(q32)
        best, arg, ok = self._round(q32, maxima, self.candidates)
        n_first = int(ok.sum())
        todo = torch.nonzero(~ok).squeeze(1)
        if len(todo) and self.wide > self.candidates:
            b2, a2, ok2 = self._round(q32[todo], maxima[todo], self.wide)
            best[todo], arg[todo], ok[todo] = b2, a2, ok2
        del maxima
        n_second = int(ok.sum()) - n_first
        todo = torch.nonzero(~ok).squeeze(1)
        for s0 in range(0, len(todo), self.query_block):
            rows = todo[s0:s0 + self.query_block]
            best[rows], arg[rows] = self._full(q32[rows])
        self.stats.queries += len(q32)
        self.stats.certified += n_first
        self.stats.widened += n_second
        self.stats.fallback += len(todo)
        return best, arg

    def search(self, q: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Max inner product (float32) and its reference row (int64) of each query row (clean unit rows)."""
        sims = np.empty(len(q), dtype=np.float32)
        idx = np.empty(len(q), dtype=np.int64)
        if q.ndim != 2 or q.shape[1] != self.dim:
            raise BadInputError(f"fused search: queries of shape {q.shape} do not match the reference's "
                                f"{self.dim} dimensions")
        for q0 in range(0, len(q), self.query_block):
            best, arg = self._search_block(self._upload(q[q0:q0 + self.query_block]))
            sims[q0:q0 + len(best)] = best.float().cpu().numpy()
            idx[q0:q0 + len(best)] = arg.cpu().numpy()
        return sims, idx


def search_fused(q: np.ndarray, r: np.ndarray, *, device: str | None = None, precision: str | None = None,
                 memory_mb: float = 256, kernel: str = "auto") -> tuple[np.ndarray, np.ndarray]:
    """One exact search of ``q`` in ``r`` through a :class:`FusedIndex` (built here, dropped after)."""
    return FusedIndex(r, device=device, precision=precision, memory_mb=memory_mb, kernel=kernel).search(q)
