"""The Triton kernel of the fused exact search (:mod:`isood.features.ann.fused`): group maxima of a query block against
the whole resident reference in one launch, without writing the similarity matrix.

Each program multiplies a ``BM`` x ``dim`` tile of queries with a ``BN`` x ``dim`` tile of reference rows
(``tl.dot``, float32 accumulation; fp16 / bf16 inputs, or float32 inputs as TF32), masks the rows past the
reference's end, and stores the maximum of each group of ``GROUP`` consecutive reference rows: ``BN / GROUP``
float32 values per query. Programs sweep the query tiles fastest, so one reference tile is read from memory once
and reused from L2 by every query tile of the block. Imported only when the kernel runs (triton is optional;
the torch kernel of :class:`isood.features.ann.fused.FusedIndex` is the fallback, and ``TRITON_INTERPRET=1`` runs this
one on the CPU for the tests).
"""

from __future__ import annotations

import triton
import triton.language as tl

__all__ = ["group_maxima", "BLOCK_M", "BLOCK_N"]

BLOCK_M, BLOCK_N = 128, 128
_MAX_GRID_Y = 65_535


@triton.jit
def _group_max_kernel(q_ptr, r_ptr, out_ptr, M, N, n_groups, stride_q, stride_r, stride_out,
                      DIM: tl.constexpr, BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr,
                      GROUP: tl.constexpr, TF32: tl.constexpr):
    pid_m = tl.program_id(0)
    pid_n = tl.program_id(1)
    rm = pid_m * BM + tl.arange(0, BM)
    rn = pid_n * BN + tl.arange(0, BN)
    rk = tl.arange(0, BK)
    acc = tl.zeros((BM, BN), dtype=tl.float32)
    for k0 in range(0, DIM, BK):
        a = tl.load(q_ptr + rm[:, None] * stride_q + (k0 + rk)[None, :], mask=rm[:, None] < M, other=0.0)
        b = tl.load(r_ptr + rn[None, :] * stride_r + (k0 + rk)[:, None], mask=rn[None, :] < N, other=0.0)
        if TF32:
            acc += tl.dot(a, b, input_precision="tf32")
        else:
            acc += tl.dot(a, b)
    acc = tl.where(rn[None, :] < N, acc, float("-inf"))
    gmax = tl.max(tl.reshape(acc, (BM, BN // GROUP, GROUP)), axis=2)
    gi = pid_n * (BN // GROUP) + tl.arange(0, BN // GROUP)
    tl.store(out_ptr + rm[:, None] * stride_out + gi[None, :], gmax,
             mask=(rm[:, None] < M) & (gi[None, :] < n_groups))


def group_maxima(q, r, n: int, group: int, *, tf32: bool = False):
    """(queries, ceil(n / group)) float32 group maxima of ``q @ r[:n].T`` (``q``, ``r``: same dtype, the same
    number of columns, a multiple of 16; ``r`` may hold padding rows past ``n``)."""
    import torch

    m, dim = q.shape
    n_groups = -(-n // group)
    if BLOCK_N % group or dim % 16 or r.shape[1] != dim:
        raise ValueError(f"group_maxima: need BLOCK_N % group == 0 and dims a multiple of 16, got group {group}, "
                         f"dims {dim} / {r.shape[1]}")
    q, r = q.contiguous(), r.contiguous()
    out = torch.empty((m, n_groups), dtype=torch.float32, device=q.device)
    bk = 64 if dim % 64 == 0 else 32 if dim % 32 == 0 else 16
    span = _MAX_GRID_Y * BLOCK_N  # a CUDA grid has at most 65,535 programs along its second axis
    for n0 in range(0, n, span):
        rows = min(span, n - n0)
        grid = (triton.cdiv(m, BLOCK_M), triton.cdiv(rows, BLOCK_N))
        sub = out[:, n0 // group:]
        _group_max_kernel[grid](q, r[n0:], sub, m, rows, -(-rows // group), q.stride(0), r.stride(0),
                                sub.stride(0), DIM=dim, BM=BLOCK_M, BN=BLOCK_N, BK=bk, GROUP=group,
                                TF32=bool(tf32), num_warps=8, num_stages=3)
    return out
