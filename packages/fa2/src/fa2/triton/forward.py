"""FlashAttention-2 forward kernel and its launcher.

One program owns BLOCK_M query rows of one batch entry and walks the key tiles once, keeping the
running max, running sum and output accumulator in fp32 registers (online softmax, base 2 with
log2(e) folded into the scale). Causal tiles entirely above the diagonal are never visited; the
masks are applied only on the diagonal tiles and on a ragged last tile.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from fa2.triton.configs import (
    FORWARD,
    LOG2E,
    Tile,
    block_d,
    cdiv,
    choose_tile,
    dot_precision,
    seq_bucket,
    upcast,
)
from fa2.triton.tiles import load_tile, store_tile, visible

__all__ = ["flash_forward"]


@triton.jit
def _fwd_tiles(
    acc,
    l_i,
    m_i,
    q,
    k_base,
    v_base,
    stride_kn,
    stride_vn,
    offs_m,
    offs_d,
    start,
    end,
    N_K,
    qk_scale,
    HEAD_DIM: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_D: tl.constexpr,
    MASKED: tl.constexpr,
    IS_CAUSAL: tl.constexpr,
    UPCAST: tl.constexpr,
    PRECISION: tl.constexpr,
):
    """Fold key tiles [start, end) into the running (acc, l_i, m_i) of one query tile."""
    for start_n in tl.range(start, end, BLOCK_N):
        cols = start_n + tl.arange(0, BLOCK_N)
        k = load_tile(k_base, cols, stride_kn, offs_d, N_K, HEAD_DIM, BLOCK_D, MASKED, UPCAST)
        v = load_tile(v_base, cols, stride_vn, offs_d, N_K, HEAD_DIM, BLOCK_D, MASKED, UPCAST)
        # (BLOCK_M, BLOCK_N) scores in log2 units
        s = tl.dot(q, tl.trans(k), input_precision=PRECISION) * qk_scale
        if MASKED:
            s = tl.where(visible(offs_m, cols, 0, N_K, False, IS_CAUSAL), s, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(s, 1))
        p = tl.math.exp2(s - m_new[:, None])
        alpha = tl.math.exp2(m_i - m_new)
        l_i = l_i * alpha + tl.sum(p, 1)
        # Accumulating inside the dot lets the tensor cores add into acc in place.
        acc = tl.dot(p.to(v.dtype), v, acc * alpha[:, None], input_precision=PRECISION)
        m_i = m_new
    return acc, l_i, m_i


@triton.jit
def _fwd_kernel(
    Q,
    K,
    V,
    O,
    L,
    stride_qb,
    stride_qn,
    stride_kb,
    stride_kn,
    stride_vb,
    stride_vn,
    stride_ob,
    stride_on,
    N_Q,
    N_K,
    qk_scale,
    HEAD_DIM: tl.constexpr,
    BLOCK_D: tl.constexpr,
    IS_CAUSAL: tl.constexpr,
    UPCAST: tl.constexpr,
    PRECISION: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
):
    # Heaviest causal tiles (the last query rows) start first, so the grid's tail is short.
    pid_m = tl.program_id(0)
    if IS_CAUSAL:
        pid_m = tl.cdiv(N_Q, BLOCK_M) - 1 - pid_m
    bid = tl.program_id(1).to(tl.int64)
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_d = tl.arange(0, BLOCK_D)
    q = load_tile(
        Q + bid * stride_qb, offs_m, stride_qn, offs_d, N_Q, HEAD_DIM, BLOCK_D, True, UPCAST
    )
    k_base = K + bid * stride_kb
    v_base = V + bid * stride_vb

    m_i = tl.full([BLOCK_M], float("-inf"), tl.float32)
    l_i = tl.zeros([BLOCK_M], tl.float32)
    acc = tl.zeros([BLOCK_M, BLOCK_D], tl.float32)

    # Keys [0, full_end) are in range and visible to every row of this tile: no masks there.
    # Causal rows see keys j <= i, so the tile's diagonal starts at its first row, pid_m * BLOCK_M.
    full_end = (N_K // BLOCK_N) * BLOCK_N
    end = N_K
    if IS_CAUSAL:
        full_end = tl.minimum(full_end, pid_m * BLOCK_M)
        end = tl.minimum(end, (pid_m + 1) * BLOCK_M)
    acc, l_i, m_i = _fwd_tiles(
        acc, l_i, m_i, q, k_base, v_base, stride_kn, stride_vn, offs_m, offs_d,
        0, full_end, N_K, qk_scale,
        HEAD_DIM, BLOCK_N, BLOCK_D, False, IS_CAUSAL, UPCAST, PRECISION,
    )  # fmt: skip
    acc, l_i, m_i = _fwd_tiles(
        acc, l_i, m_i, q, k_base, v_base, stride_kn, stride_vn, offs_m, offs_d,
        full_end, end, N_K, qk_scale,
        HEAD_DIM, BLOCK_N, BLOCK_D, True, IS_CAUSAL, UPCAST, PRECISION,
    )  # fmt: skip

    # Key 0 is visible to every row, so l_i >= 1 here and the division is safe.
    acc = acc / l_i[:, None]
    lse = (m_i + tl.math.log2(l_i)) / 1.4426950408889634  # back to natural-log units
    tl.store(L + bid * N_Q + offs_m, lse, mask=offs_m < N_Q)
    store_tile(O + bid * stride_ob, offs_m, stride_on, offs_d, N_Q, acc, HEAD_DIM)


def flash_forward(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool, scale: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """Run the forward kernel on `(batch, n, d)` tensors with unit stride in d; returns (o, lse)."""
    batch, n_q, d = q.shape
    n_k = k.shape[1]
    o = torch.empty_like(q)
    lse = torch.empty((batch, n_q), device=q.device, dtype=torch.float32)
    meta = dict(
        HEAD_DIM=d,
        BLOCK_D=block_d(d),
        IS_CAUSAL=causal,
        UPCAST=upcast(q.dtype),
        PRECISION=dot_precision(q.dtype),
    )

    def run(tile: Tile) -> None:
        _fwd_kernel[(cdiv(n_q, tile.block_m), batch)](
            q, k, v, o, lse,
            q.stride(0), q.stride(1), k.stride(0), k.stride(1),
            v.stride(0), v.stride(1), o.stride(0), o.stride(1),
            n_q, n_k, scale * LOG2E,
            BLOCK_M=tile.block_m, BLOCK_N=tile.block_n,
            num_warps=tile.warps, num_stages=tile.stages, **meta,
        )  # fmt: skip

    key = (causal, seq_bucket(n_q, n_k))
    run(choose_tile(FORWARD, head_dim_block=meta["BLOCK_D"], dtype=q.dtype, key=key, run=run))
    return o, lse
