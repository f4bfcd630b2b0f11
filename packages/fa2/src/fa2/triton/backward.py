"""FlashAttention-2 backward kernels and their launcher.

By default two launches, neither of which materialises the score matrix nor races:
1. dQ: a program owns BLOCK_M queries and walks the key tiles they can see, recomputing
   P = exp(S - L) tile by tile. It also computes D = rowsum(dO ∘ O) for its rows, which it needs
   itself, and stores it for the next pass (this replaces a separate preprocess launch).
2. dK/dV: a program owns BLOCK_N keys of one key/value head and walks the query tiles that
   can see them, of every query head that shares the key/value head (grouped-query attention).
Each output row is written by exactly one program. Recomputing S in both passes costs two
matmuls per tile pair more than an atomic-add design but keeps dQ deterministic.

The single-pass form, which `deterministic=False` allows and `configs.single_pass_backward`
picks where it is faster (fp32 inputs): a small pass computes D and zeroes an fp32 dQ buffer,
then the dK/dV pass also computes dQ and adds it into the buffer (TMA bulk reductions on
Hopper, atomic adds elsewhere): 5 matmuls per tile pair instead of 7, but dQ's last bits
depend on the order the additions land in.
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Callable

import torch
import triton
import triton.language as tl

from fa2.layouts import as_bhsd
from fa2.triton import configs, gluon_backward
from fa2.triton.configs import (
    DKDV,
    DKDV_ATOMIC,
    DQ,
    Tile,
    cdiv,
    choose_tile,
    delta_rows,
    head_counts,
    kernel_scales,
    l2_group,
    seq_bucket,
)
from fa2.triton.forward import ForwardPlan
from fa2.triton.launch import (
    CachedLaunch,
    contiguous_where,
    needs_int64,
    output_strides,
    read_layouts,
    tma_capable,
    tma_layouts,
    unused_pointers,
)
from fa2.triton.tiles import (
    LOG2E,
    add_tile,
    at_row,
    band,
    key_range,
    load_row_pair,
    load_rows,
    load_tile,
    program_ids,
    query_range,
    row_source,
    sequence,
    softcapped,
    store_tile,
    visible,
)

__all__ = ["BackwardPlan", "backward_plan"]


@triton.jit
def _dkdv_tiles(
    dk,
    dv,
    k,
    v,
    q_src,
    do_src,
    l_base,
    delta_base,
    dq_base,
    stride_qn,
    stride_don,
    offs_n,
    offs_d,
    start,
    end,
    n_q,
    lo,
    hi,
    qk_scale,
    sm_scale,
    cap_scale,
    HEAD_DIM: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_D: tl.constexpr,
    MASKED: tl.constexpr,
    IS_CAUSAL: tl.constexpr,
    LOCAL: tl.constexpr,
    SOFTCAP: tl.constexpr,
    UPCAST: tl.constexpr,
    PRECISION: tl.constexpr,
    LARGE: tl.constexpr,
    ATOMIC_DQ: tl.constexpr,
    TMA: tl.constexpr,
    WS: tl.constexpr,
):
    """Accumulate into (dk, dv) of one key tile the query tiles [start, end) of one query head;
    with ATOMIC_DQ also add this key tile's share of dQ into the fp32 rows at dq_base."""
    for start_m in tl.range(start, end, BLOCK_M, warp_specialize=WS):
        rows = start_m + tl.arange(0, BLOCK_M)
        if MASKED:
            lse = tl.load(l_base + rows, mask=rows < n_q, other=0.0)
            delta = tl.load(delta_base + rows, mask=rows < n_q, other=0.0)
        else:
            lse = tl.load(l_base + rows)
            delta = tl.load(delta_base + rows)
        q, do = load_row_pair(
            q_src, stride_qn, do_src, stride_don, start_m, offs_d, n_q,
            HEAD_DIM, BLOCK_M, BLOCK_D, MASKED, UPCAST, LARGE, TMA,
        )  # fmt: skip
        s_t = tl.dot(k, tl.trans(q), input_precision=PRECISION)  # (BLOCK_N, BLOCK_M), raw
        # Issued before the exponentials so the tensor cores work while they are computed
        # (measured: 6-7% faster on an H100 than after the dV update).
        dp_t = tl.dot(v, tl.trans(do), input_precision=PRECISION)
        if SOFTCAP:
            s_t = softcapped(s_t, cap_scale)
        # One fused multiply-add per exponent: the logsumexp is taken to log2 units per row.
        # A query that saw no key has L = +inf, hence P = 0.
        p_t = tl.math.exp2(s_t * qk_scale - (lse * LOG2E)[None, :])
        if MASKED:  # the transpose of `visible`: keys along rows, queries along columns
            keep = rows[None, :] < n_q
            if IS_CAUSAL:
                keep = keep & (offs_n[:, None] <= rows[None, :] + hi)
            if LOCAL:
                keep = keep & (offs_n[:, None] >= rows[None, :] + lo)
            p_t = tl.where(keep, p_t, 0.0)
        dv = tl.dot(p_t.to(do.dtype), do, dv, input_precision=PRECISION)
        ds_t = p_t * (dp_t - delta[None, :])
        if SOFTCAP:  # through softcap * tanh(s * scale / softcap): a factor 1 - tanh²
            ds_t = ds_t * (1.0 - s_t * s_t)
        dk = tl.dot(ds_t.to(q.dtype), q, dk, input_precision=PRECISION)
        if ATOMIC_DQ:
            dq = tl.dot(tl.trans(ds_t.to(k.dtype)), k, input_precision=PRECISION) * sm_scale
            if ATOMIC_DQ == 2:  # one bulk reduction of the tile from shared memory (TMA)
                dq_base.atomic_add([start_m, 0], dq)
            else:
                add_tile(dq_base, rows, HEAD_DIM, offs_d, n_q, dq, MASKED, HEAD_DIM, BLOCK_D, LARGE)
    return dk, dv


@triton.jit
def _dkdv_kernel(
    Q,
    K,
    V,
    DO,
    L,
    Delta,
    DK,
    DV,
    DQ,
    CU_Q,
    CU_K,
    stride_qb,
    stride_qh,
    stride_qn,
    stride_kb,
    stride_kh,
    stride_kn,
    stride_vb,
    stride_vh,
    stride_vn,
    stride_dob,
    stride_doh,
    stride_don,
    stride_dkb,
    stride_dkh,
    stride_dkn,
    stride_dvb,
    stride_dvh,
    stride_dvn,
    KV_HEADS,
    N_Q,
    N_K,
    qk_scale,
    sm_scale,
    cap_scale,
    HEAD_DIM: tl.constexpr,
    BLOCK_D: tl.constexpr,
    IS_CAUSAL: tl.constexpr,
    LOCAL: tl.constexpr,
    WIN_LEFT: tl.constexpr,
    WIN_RIGHT: tl.constexpr,
    BOTTOM_RIGHT: tl.constexpr,
    VARLEN: tl.constexpr,
    SOFTCAP: tl.constexpr,
    UPCAST: tl.constexpr,
    PRECISION: tl.constexpr,
    GROUP: tl.constexpr,
    LARGE: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    EVEN_Q: tl.constexpr,
    ATOMIC_DQ: tl.constexpr,
    TMA: tl.constexpr,
    WS: tl.constexpr,
    L2_GROUP: tl.constexpr,
):
    """dK and dV of BLOCK_N keys; with ATOMIC_DQ also dQ, added atomically into DQ: fp32,
    zeroed, contiguous `(..., heads, N_Q, HEAD_DIM)` (unread otherwise). Masks, packed
    sequences (VARLEN) and the softcap as in the forward kernel. WS: one warp-specialised
    loop over the query tiles (configs, "Warp specialisation"); L2_GROUP: the launch order
    (`program_ids`)."""
    tl.static_assert(BLOCK_N % BLOCK_M == 0, "the causal diagonal must start on a query tile")
    # Python floats arrive as fp32 from Triton's launcher but as fp64 from torch.compile's.
    qk_scale, sm_scale = tl.cast(qk_scale, tl.float32), tl.cast(sm_scale, tl.float32)
    cap_scale = tl.cast(cap_scale, tl.float32)
    pid_n, pid_bh = program_ids(L2_GROUP)
    # One program per (batch, key/value head): it sums over the GROUP query heads sharing it,
    # so dK and dV of a shared head are written once, without atomics.
    bh = pid_bh.to(tl.int64)
    b, hk = bh // KV_HEADS, bh % KV_HEADS
    q_start, k_start, n_q, n_k = sequence(CU_Q, CU_K, b, N_Q, N_K, VARLEN)
    # The grid covers the longest sequence; tiles past this one's end have no work. (Two
    # tests: the outer one is a constexpr, which compiles the inner one only for VARLEN.) A
    # warp-specialised loop may not follow a return (the pass fails): there such a tile runs
    # no query tile and, its keys past the end, stores nothing.
    if VARLEN and not WS:  # noqa: SIM102
        if pid_n * BLOCK_N >= n_k:
            return
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, BLOCK_D)
    k = load_rows(
        at_row(K + b * stride_kb + hk * stride_kh, k_start, stride_kn, VARLEN), pid_n * BLOCK_N,
        n_k, stride_kn, offs_d, HEAD_DIM, BLOCK_N, BLOCK_D, UPCAST, LARGE, WS,
    )  # fmt: skip
    v = load_rows(
        at_row(V + b * stride_vb + hk * stride_vh, k_start, stride_vn, VARLEN), pid_n * BLOCK_N,
        n_k, stride_vn, offs_d, HEAD_DIM, BLOCK_N, BLOCK_D, UPCAST, LARGE, WS,
    )  # fmt: skip
    dk = tl.zeros([BLOCK_N, BLOCK_D], tl.float32)
    dv = tl.zeros([BLOCK_N, BLOCK_D], tl.float32)

    lo, hi = band(n_q, n_k, WIN_LEFT, WIN_RIGHT, BOTTOM_RIGHT)
    ALIGNED: tl.constexpr = WIN_RIGHT == 0 and not BOTTOM_RIGHT
    # Query tiles [start, masked_end) see part of this key tile (the diagonal), [full_start,
    # full_end) all of it, [max(full_start, full_end), end) part again (a window's far edge, a
    # ragged last tile).
    start, masked_end, full_start, full_end, end = query_range(
        pid_n * BLOCK_N, n_q, lo, hi, BLOCK_M, BLOCK_N, IS_CAUSAL, LOCAL, ALIGNED
    )
    for g in range(GROUP):
        h = hk * GROUP + g  # a query head reading this key/value head
        q_base = at_row(Q + b * stride_qb + h * stride_qh, q_start, stride_qn, VARLEN)
        do_base = at_row(DO + b * stride_dob + h * stride_doh, q_start, stride_don, VARLEN)
        q_src = row_source(q_base, n_q, stride_qn, HEAD_DIM, BLOCK_M, BLOCK_D, TMA)
        do_src = row_source(do_base, n_q, stride_don, HEAD_DIM, BLOCK_M, BLOCK_D, TMA)
        if VARLEN:  # L, D: (heads, N_Q); the fp32 dQ rows: (heads, N_Q, HEAD_DIM)
            rows_base = h * N_Q + q_start
        else:  # (batch, query head) rows of L and D
            rows_base = (bh * GROUP + g) * N_Q
        l_base = L + rows_base
        delta_base = Delta + rows_base
        dq_base = DQ + rows_base * HEAD_DIM
        if ATOMIC_DQ == 2:  # rows past n_q and columns past HEAD_DIM are clipped by the TMA unit
            dq_base = tl.make_tensor_descriptor(
                dq_base, [n_q, HEAD_DIM], [HEAD_DIM, 1], block_shape=[BLOCK_M, BLOCK_D]
            )
        if WS:  # one warp-specialised loop over every query tile, each masked
            if VARLEN:
                end = tl.where(pid_n * BLOCK_N < n_k, end, start)
            dk, dv = _dkdv_tiles(
                dk, dv, k, v, q_src, do_src, l_base, delta_base, dq_base, stride_qn, stride_don,
                offs_n, offs_d, start, end, n_q, lo, hi, qk_scale, sm_scale, cap_scale,
                HEAD_DIM, BLOCK_M, BLOCK_D, True, IS_CAUSAL, LOCAL, SOFTCAP, UPCAST, PRECISION,
                LARGE, ATOMIC_DQ, TMA, True,
            )  # fmt: skip
        else:
            if IS_CAUSAL:
                dk, dv = _dkdv_tiles(
                    dk, dv, k, v, q_src, do_src, l_base, delta_base, dq_base, stride_qn,
                    stride_don, offs_n, offs_d, start, masked_end, n_q, lo, hi, qk_scale,
                    sm_scale, cap_scale, HEAD_DIM, BLOCK_M, BLOCK_D, True, IS_CAUSAL, LOCAL,
                    SOFTCAP, UPCAST, PRECISION, LARGE, ATOMIC_DQ, TMA, False,
                )  # fmt: skip
            dk, dv = _dkdv_tiles(
                dk, dv, k, v, q_src, do_src, l_base, delta_base, dq_base, stride_qn, stride_don,
                offs_n, offs_d, full_start, full_end, n_q, lo, hi, qk_scale, sm_scale, cap_scale,
                HEAD_DIM, BLOCK_M, BLOCK_D, False, IS_CAUSAL, LOCAL, SOFTCAP, UPCAST, PRECISION,
                LARGE, ATOMIC_DQ, TMA, False,
            )  # fmt: skip
            if not EVEN_Q or LOCAL:  # Compiled out otherwise: on an H100 the mere presence of
                # this (empty) loop made the whole kernel 25% slower (measured).
                dk, dv = _dkdv_tiles(
                    dk, dv, k, v, q_src, do_src, l_base, delta_base, dq_base, stride_qn,
                    stride_don, offs_n, offs_d, tl.maximum(full_start, full_end), end, n_q, lo,
                    hi, qk_scale, sm_scale, cap_scale, HEAD_DIM, BLOCK_M, BLOCK_D, True,
                    IS_CAUSAL, LOCAL, SOFTCAP, UPCAST, PRECISION, LARGE, ATOMIC_DQ, TMA, False,
                )  # fmt: skip

    store_tile(
        at_row(DK + b * stride_dkb + hk * stride_dkh, k_start, stride_dkn, VARLEN), offs_n,
        stride_dkn, offs_d, n_k, dk * sm_scale, HEAD_DIM, LARGE,
    )  # fmt: skip
    store_tile(
        at_row(DV + b * stride_dvb + hk * stride_dvh, k_start, stride_dvn, VARLEN), offs_n,
        stride_dvn, offs_d, n_k, dv, HEAD_DIM, LARGE,
    )  # fmt: skip


@triton.jit
def _load_do_store_delta(
    do_base,
    stride_don,
    o_base,
    stride_on,
    delta_base,
    rows,
    offs_d,
    n_q,
    HEAD_DIM: tl.constexpr,
    BLOCK_D: tl.constexpr,
    UPCAST: tl.constexpr,
    LARGE: tl.constexpr,
):
    """dO of the query rows `rows`, and D = rowsum(dO ∘ O) of them in fp32, which is stored at
    delta_base: returns (dO, D)."""
    do = load_tile(do_base, rows, stride_don, offs_d, n_q, HEAD_DIM, BLOCK_D, True, UPCAST, LARGE)
    o = load_tile(o_base, rows, stride_on, offs_d, n_q, HEAD_DIM, BLOCK_D, True, True, LARGE)
    delta = tl.sum(o * do.to(tl.float32), 1)
    tl.store(delta_base + rows, delta, mask=rows < n_q)
    return do, delta


@triton.jit
def _dq_tiles(
    dq,
    q,
    do,
    lse2,
    delta,
    k_src,
    v_src,
    stride_kn,
    stride_vn,
    rows,
    offs_d,
    start,
    end,
    n_k,
    lo,
    hi,
    qk_scale,
    cap_scale,
    HEAD_DIM: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_D: tl.constexpr,
    MASKED: tl.constexpr,
    IS_CAUSAL: tl.constexpr,
    LOCAL: tl.constexpr,
    SOFTCAP: tl.constexpr,
    UPCAST: tl.constexpr,
    PRECISION: tl.constexpr,
    LARGE: tl.constexpr,
    TMA: tl.constexpr,
):
    """Accumulate into dq of one query tile the key tiles [start, end)."""
    for start_n in tl.range(start, end, BLOCK_N):
        cols = start_n + tl.arange(0, BLOCK_N)
        k, v = load_row_pair(
            k_src, stride_kn, v_src, stride_vn, start_n, offs_d, n_k,
            HEAD_DIM, BLOCK_N, BLOCK_D, MASKED, UPCAST, LARGE, TMA,
        )  # fmt: skip
        s = tl.dot(q, tl.trans(k), input_precision=PRECISION)  # (BLOCK_M, BLOCK_N), raw
        if SOFTCAP:
            s = softcapped(s, cap_scale)
        p = tl.math.exp2(s * qk_scale - lse2[:, None])  # one fused multiply-add per exponent
        if MASKED:
            p = tl.where(visible(rows, cols, 0, n_k, lo, hi, False, IS_CAUSAL, LOCAL), p, 0.0)
        dp = tl.dot(do, tl.trans(v), input_precision=PRECISION)
        ds = p * (dp - delta[:, None])
        if SOFTCAP:  # through softcap * tanh(s * scale / softcap): a factor 1 - tanh²
            ds = ds * (1.0 - s * s)
        dq = tl.dot(ds.to(k.dtype), k, dq, input_precision=PRECISION)
    return dq


@triton.jit
def _dq_kernel(
    Q,
    K,
    V,
    O,
    DO,
    L,
    Delta,
    DQ,
    CU_Q,
    CU_K,
    stride_qb,
    stride_qh,
    stride_qn,
    stride_kb,
    stride_kh,
    stride_kn,
    stride_vb,
    stride_vh,
    stride_vn,
    stride_ob,
    stride_oh,
    stride_on,
    stride_dob,
    stride_doh,
    stride_don,
    stride_dqb,
    stride_dqh,
    stride_dqn,
    HEADS,
    N_Q,
    N_K,
    qk_scale,
    sm_scale,
    cap_scale,
    HEAD_DIM: tl.constexpr,
    BLOCK_D: tl.constexpr,
    IS_CAUSAL: tl.constexpr,
    LOCAL: tl.constexpr,
    WIN_LEFT: tl.constexpr,
    WIN_RIGHT: tl.constexpr,
    BOTTOM_RIGHT: tl.constexpr,
    VARLEN: tl.constexpr,
    SOFTCAP: tl.constexpr,
    UPCAST: tl.constexpr,
    PRECISION: tl.constexpr,
    GROUP: tl.constexpr,
    LARGE: tl.constexpr,
    TMA: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    L2_GROUP: tl.constexpr,
):
    """dQ of BLOCK_M query rows, and D = rowsum(dO ∘ O) of them for the dK/dV pass. Masks,
    packed sequences (VARLEN) and the softcap as in the forward kernel; L2_GROUP: the launch
    order (`program_ids`)."""
    tl.static_assert(BLOCK_M % BLOCK_N == 0, "the causal diagonal must start on a key tile")
    # Python floats arrive as fp32 from Triton's launcher but as fp64 from torch.compile's.
    qk_scale, sm_scale = tl.cast(qk_scale, tl.float32), tl.cast(sm_scale, tl.float32)
    cap_scale = tl.cast(cap_scale, tl.float32)
    pid_m, pid_bh = program_ids(L2_GROUP)
    q_start, k_start, n_q, n_k = sequence(CU_Q, CU_K, pid_bh // HEADS, N_Q, N_K, VARLEN)
    # The grid covers the longest sequence; tiles past this one's end have no work. (Two
    # tests: the outer one is a constexpr, which compiles the inner one only for VARLEN.)
    if VARLEN:  # noqa: SIM102
        if pid_m * BLOCK_M >= n_q:
            return
    if IS_CAUSAL:
        pid_m = tl.cdiv(n_q, BLOCK_M) - 1 - pid_m  # heaviest tiles first
    bh = pid_bh.to(tl.int64)  # (batch, query head)
    b, h = bh // HEADS, bh % HEADS
    if VARLEN:  # L and D: (heads, N_Q)
        rows_base = h * N_Q + q_start
    else:
        rows_base = bh * N_Q
    rows = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_d = tl.arange(0, BLOCK_D)
    q = load_tile(
        at_row(Q + b * stride_qb + h * stride_qh, q_start, stride_qn, VARLEN), rows, stride_qn,
        offs_d, n_q, HEAD_DIM, BLOCK_D, True, UPCAST, LARGE,
    )  # fmt: skip
    lse2 = tl.load(L + rows_base + rows, mask=rows < n_q, other=0.0) * LOG2E
    do, delta = _load_do_store_delta(  # D: for this pass and the next
        at_row(DO + b * stride_dob + h * stride_doh, q_start, stride_don, VARLEN), stride_don,
        at_row(O + b * stride_ob + h * stride_oh, q_start, stride_on, VARLEN), stride_on,
        Delta + rows_base, rows, offs_d, n_q, HEAD_DIM, BLOCK_D, UPCAST, LARGE,
    )  # fmt: skip
    dq = tl.zeros([BLOCK_M, BLOCK_D], tl.float32)
    k_base = at_row(K + b * stride_kb + (h // GROUP) * stride_kh, k_start, stride_kn, VARLEN)
    v_base = at_row(V + b * stride_vb + (h // GROUP) * stride_vh, k_start, stride_vn, VARLEN)
    k_src = row_source(k_base, n_k, stride_kn, HEAD_DIM, BLOCK_N, BLOCK_D, TMA)
    v_src = row_source(v_base, n_k, stride_vn, HEAD_DIM, BLOCK_N, BLOCK_D, TMA)

    lo, hi = band(n_q, n_k, WIN_LEFT, WIN_RIGHT, BOTTOM_RIGHT)
    ALIGNED: tl.constexpr = WIN_RIGHT == 0 and not BOTTOM_RIGHT
    start, full_start, full_end, end = key_range(
        pid_m, n_k, lo, hi, BLOCK_M, BLOCK_N, IS_CAUSAL, LOCAL, ALIGNED
    )
    if LOCAL:  # keys the first rows of the tile see but not the last
        dq = _dq_tiles(
            dq, q, do, lse2, delta, k_src, v_src, stride_kn, stride_vn, rows, offs_d,
            start, full_start, n_k, lo, hi, qk_scale, cap_scale, HEAD_DIM, BLOCK_N, BLOCK_D,
            True, IS_CAUSAL, LOCAL, SOFTCAP, UPCAST, PRECISION, LARGE, TMA,
        )  # fmt: skip
    dq = _dq_tiles(  # keys every row of the tile sees: no masks
        dq, q, do, lse2, delta, k_src, v_src, stride_kn, stride_vn, rows, offs_d,
        full_start, full_end, n_k, lo, hi, qk_scale, cap_scale, HEAD_DIM, BLOCK_N, BLOCK_D,
        False, IS_CAUSAL, LOCAL, SOFTCAP, UPCAST, PRECISION, LARGE, TMA,
    )  # fmt: skip
    dq = _dq_tiles(  # the diagonal and a ragged last tile
        dq, q, do, lse2, delta, k_src, v_src, stride_kn, stride_vn, rows, offs_d,
        full_end, end, n_k, lo, hi, qk_scale, cap_scale, HEAD_DIM, BLOCK_N, BLOCK_D,
        True, IS_CAUSAL, LOCAL, SOFTCAP, UPCAST, PRECISION, LARGE, TMA,
    )  # fmt: skip

    store_tile(
        at_row(DQ + b * stride_dqb + h * stride_dqh, q_start, stride_dqn, VARLEN), rows,
        stride_dqn, offs_d, n_q, dq * sm_scale, HEAD_DIM, LARGE,
    )  # fmt: skip


@triton.jit
def _delta_kernel(
    O,
    DO,
    Delta,
    DQ,
    stride_ob,
    stride_oh,
    stride_on,
    stride_dob,
    stride_doh,
    stride_don,
    HEADS,
    N_Q,
    HEAD_DIM: tl.constexpr,
    BLOCK_D: tl.constexpr,
    LARGE: tl.constexpr,
    BLOCK_M: tl.constexpr,
    ZERO_DQ: tl.constexpr,
):
    """D = rowsum(dO ∘ O) of BLOCK_M query rows, and those rows of the fp32 dQ accumulator
    zeroed where ZERO_DQ, ahead of the single-pass backward (which needs D from its first tile
    on). Packed sequences are one batch entry of N_Q rows here: D does not depend on where they
    end."""
    pid_m = tl.program_id(0)
    bh = tl.program_id(1).to(tl.int64)  # (batch, query head)
    b, h = bh // HEADS, bh % HEADS
    rows = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_d = tl.arange(0, BLOCK_D)
    _load_do_store_delta(
        DO + b * stride_dob + h * stride_doh, stride_don, O + b * stride_ob + h * stride_oh,
        stride_on, Delta + bh * N_Q, rows, offs_d, N_Q, HEAD_DIM, BLOCK_D, False, LARGE,
    )  # fmt: skip
    if ZERO_DQ:
        zeros = tl.zeros([BLOCK_M, BLOCK_D], tl.float32)
        store_tile(DQ + bh * N_Q * HEAD_DIM, rows, HEAD_DIM, offs_d, N_Q, zeros, HEAD_DIM, LARGE)


# The single-pass backward adds dQ tiles with TMA bulk reductions where it can (see
# `tma_reduce_available`); False forces per-element atomics (for comparisons).
USE_TMA_REDUCE = True


def tma_reduce_available(q: torch.Tensor) -> bool:
    """Whether the single-pass backward can add dQ tiles with the TMA unit's bulk reductions:
    a Hopper or newer GPU, outside the interpreter, with fp32 dQ rows 16-byte aligned."""
    return USE_TMA_REDUCE and tma_capable(q.device) and q.shape[-1] % 4 == 0


_gluon_warned: set[str] = set()


def _gluon_refusal(meta: dict, group: int, views, strides) -> str | None:
    """Why a backward plan cannot take the Gluon single pass (`fa2.triton.gluon_backward`), or
    None when it can. `views`: q, k, v, o, dO as `(..., heads, n, d)`; `strides`: how the
    kernels read them (`read_layouts`: copies where a layout needs one, as for the expanded
    gradient `out.sum()` gives). The pointers' alignment is checked per call."""
    unsupported = {
        "VARLEN": "packed sequences",
        "LOCAL": "a sliding window",
        "SOFTCAP": "a softcap",
        "BOTTOM_RIGHT": "a bottom-right causal diagonal",
    }
    for name, what in unsupported.items():
        if meta[name]:
            return f"it does not take {what}"
    if group != 1:
        return "it takes one key/value head per query head (no grouped-query attention)"
    q = views[0]
    sizes = (*q.shape, *views[1].shape, *(s for st in strides for s in st))
    reason = configs.symbolic_shapes_refusal(sizes, q.device, "backward")
    if reason is not None:
        return reason
    return gluon_backward.unsupported_reason(*views, pointers=False, strides=strides)


def _warn_gluon(reason: str) -> None:
    """Say once per reason that FA2_BACKWARD=gluon gave way to the Triton backward."""
    if reason not in _gluon_warned:
        _gluon_warned.add(reason)
        warnings.warn(
            f"FA2_BACKWARD=gluon: the Gluon backward cannot run this call ({reason}); fa2's "
            "Triton backward runs instead",
            UserWarning,
            stacklevel=4,
        )


class BackwardPlan:
    """The backward launches for the outputs of one forward plan, one layout of the output
    gradient and a choice of determinism.

    On Hopper, for the calls FA2_BACKWARD gives it (`configs.backward_form`; by default head
    dim 128 in 16 bits), the Gluon single pass (`fa2.triton.gluon_backward`), deterministic or
    not as the call asks. Otherwise the Triton kernels. Two-pass (deterministic, and the choice
    for 16-bit inputs): the dQ pass, then the dK/dV pass. Single-pass (`deterministic=False`
    where `configs.single_pass_backward` says so): a small pass for D = rowsum(dO ∘ O), then
    one pass that computes dK, dV and dQ together and adds dQ into an fp32 buffer (5 matmuls
    per tile pair instead of 7; the order of the additions, hence dQ's last bits, varies
    between runs).

    Call as `plan(q, k, v, o, lse, do, scale, cu_seqlens, max_seqlens, traced) -> (dq, dk,
    dv)` with tensors like the ones it was built from; `backward_plan` finds or builds it.
    Gradients are allocated contiguous in the caller's layout.
    """

    def __init__(
        self,
        fwd: ForwardPlan,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        o: torch.Tensor,
        lse: torch.Tensor,
        do: torch.Tensor,
        deterministic: bool,
        traced: bool,
    ) -> None:
        self.fwd = fwd
        layout = fwd.layout
        views = tuple(as_bhsd(t, layout) for t in (q, k, v, o, do))  # (..., heads, n, d)
        qv, kv = views[:2]
        *lead, n_q, d = qv.shape
        n_k = kv.shape[-2]
        heads, group = head_counts(qv, kv)
        self.shapes = (q.shape, k.shape, v.shape)
        self.dtype = q.dtype
        self.batch_heads, self.n_q, self.n_k, self.heads = math.prod(lead), n_q, n_k, heads
        self.empty = qv.numel() == 0 or kv.numel() == 0
        copies, strides = read_layouts(views)
        if copies is not None:  # in the order q, k, v, o, lse, do (lse is always contiguous)
            copies = (*copies[:4], False, copies[4])
        self.copies = copies
        sq, sk, sv, so, sdo = strides
        self.single_pass = not deterministic and configs.single_pass_backward(q.dtype)
        # Gradients: contiguous in the caller's layout; the single pass's fp32 dq buffer:
        # contiguous in the kernels' (..., heads, n, d) order (its rows are added atomically).
        sdq = output_strides(q.shape, layout)
        sdk = output_strides(k.shape, layout)
        self.dq_ints = (*sq, *sk, *sv, *so, *sdo, *sdq, heads, n_q, n_k)
        self.dkdv_ints = (*sq, *sk, *sv, *sdo, *sdk, *sdk, heads // group, n_q, n_k)
        self.delta_ints = (*so, *sdo, heads, n_q)
        self.dq_buffer_shape = qv.shape
        self.tma_reduce = self.single_pass and not traced and tma_reduce_available(q)
        # The Gluon single pass (FA2_BACKWARD, `configs.backward_form`) where the call can
        # take it, in the order of dQ's additions the call asks for; the Triton launches
        # below stay ready for misaligned pointers.
        form = configs.backward_form()
        self.deterministic = deterministic
        self.gluon = False
        if form == "gluon" or (form == "auto" and configs.gluon_backward_default(d, fwd.seq_len)):
            reason = _gluon_refusal(fwd.meta, group, views, strides)
            self.gluon = reason is None
            if reason is not None and form == "gluon":
                _warn_gluon(reason)
        elif form == "auto" and configs.gluon_default_possible(configs.GLUON_BACKWARD_MIN_SEQ, d):
            # a symbolic length or head dim is not known to reach the default: said once on
            # Hopper, where the Gluon backward is the default for known ones
            configs.symbolic_shapes_refusal((*qv.shape, *kv.shape), q.device, "backward")
        self.gluon_strides = (sq, sk, sv, so, sdo, sdk)
        # Tiles with `tma` read the inner loop's rows through TMA descriptors where the
        # layouts of those rows allow (and, when traced, their alignment is known: see
        # `tma_layouts`): keys and values in the dQ pass, queries and output gradients in the
        # dK/dV pass and the single pass.
        kv_tma = tma_layouts((kv, views[2]), [sk, sv], traced=traced)
        q_do_tma = tma_layouts((qv, views[4]), [sq, sdo], traced=traced)
        self.tma_loads = dict(dq=kv_tma, dkdv=q_do_tma, fused=q_do_tma)
        # A warp-specialised tile also reads its own keys and values through descriptors
        # (`load_rows`); only the dK/dV pass and the single pass have such tiles.
        self.ws_loads = kv_tma and q_do_tma
        self.meta = dict(fwd.meta)
        self.meta.update(LARGE=needs_int64([t.shape for t in views], strides))
        self.varlen = fwd.varlen
        # The passes' launch order (`configs.l2_group`), by the bytes of the rows each
        # (batch, head) of the grid re-reads: K and V in the dQ pass, Q and dO of the query
        # heads sharing a key/value head in the dK/dV pass; at most the grid's rows. Packed
        # sequences keep the grid's order.
        row_bytes = 2 * d * q.element_size()
        rows = self.batch_heads, self.batch_heads // group
        self.l2_groups = dict(
            dq=1 if self.varlen else min(l2_group(n_k * row_bytes), rows[0]),
            dkdv=1 if self.varlen else min(l2_group(group * n_q * row_bytes), rows[1]),
        )

        def tuning_run(which: str) -> Callable[[Tile], None]:  # for FA2_AUTOTUNE only
            def run(tile: Tile) -> None:
                inputs = contiguous_where((q, k, v, o, lse, do), self.copies, layout)
                self._run(which, self._launch(which, tile), inputs, self.outputs(q), 1.0, None)

            return run

        choice = dict(
            head_dim_block=self.meta["BLOCK_D"],
            dtype=q.dtype,
            precision=fwd.precision,
            seq_len=fwd.seq_len,
            key=lambda: (fwd.call.band, seq_bucket(n_q, n_k)),
            # dK/dV's loop over grouped heads around a specialised one fails to compile
            specialisable=self.ws_loads and group == 1,
            device=q.device,
        )
        # In launch order: the first pass writes D, which the second reads.
        passes = (("fused", DKDV_ATOMIC),) if self.single_pass else (("dq", DQ), ("dkdv", DKDV))
        self.tiles, self.launches = {}, {}
        if self.single_pass:
            self.tiles["delta"] = Tile(delta_rows(d), 0, 4, 1)
            self.launches["delta"] = self._launch("delta", self.tiles["delta"])
        for which, table in passes:
            run = None if traced or self.varlen else tuning_run(which)
            self.tiles[which] = choose_tile(table, run=run, **choice)
            self.launches[which] = self._launch(which, self.tiles[which])

    def _launch(self, which: str, tile: Tile) -> CachedLaunch:
        """The launch of one pass with `tile`: "dq" or "dkdv" (the deterministic passes),
        "delta" or "fused" (the single-pass backward)."""
        if which == "delta":  # packed sequences: one batch entry of all rows (see the kernel)
            meta = {name: self.meta[name] for name in ("HEAD_DIM", "BLOCK_D", "LARGE")}
            grid = (cdiv(self.n_q, tile.block_m), self.batch_heads)
            return CachedLaunch(
                # ZERO_DQ: the Triton single pass adds every dQ tile into the zeroed buffer
                _delta_kernel, grid, dict(meta, BLOCK_M=tile.block_m, ZERO_DQ=True), num_warps=4,
                num_stages=1,
                checked=(1,),  # dO; o, D and the dQ buffer are the plans' own
            )  # fmt: skip
        tma = tile.tma and self.tma_loads[which]
        constexprs = dict(self.meta, TMA=tma, BLOCK_M=tile.block_m, BLOCK_N=tile.block_n)
        # The caller's tensors (q, k, v, dO, and cu_seqlens if packed) are checked for alignment
        # per call; o and L are the forward plan's, D and the gradients this plan's.
        if which == "dq":
            kernel, grid = _dq_kernel, (cdiv(self.n_q, tile.block_m), self.batch_heads)
            checked = (0, 1, 2, 4, 8, 9) if self.varlen else (0, 1, 2, 4)
            constexprs["L2_GROUP"] = self.l2_groups["dq"]
        else:
            # one program per (batch, key/value head) and key tile
            grid = (cdiv(self.n_k, tile.block_n), self.batch_heads // self.meta["GROUP"])
            kernel = _dkdv_kernel
            constexprs["EVEN_Q"] = not self.varlen and self.n_q % tile.block_m == 0
            constexprs["ATOMIC_DQ"] = 0 if which == "dkdv" else (2 if self.tma_reduce else 1)
            constexprs["WS"] = tile.ws and tma  # plain loads (misaligned tensors): plain kernel
            constexprs["L2_GROUP"] = self.l2_groups["dkdv"]
            checked = (0, 1, 2, 3, 9, 10) if self.varlen else (0, 1, 2, 3)
        return CachedLaunch(
            kernel, None if self.varlen else grid, constexprs, num_warps=tile.warps,
            num_stages=tile.stages, scratch=tma or constexprs.get("ATOMIC_DQ") == 2,
            unaligned=self._launch(which, tile._replace(tma=False)) if tma else None,
            checked=checked,
        )  # fmt: skip

    def _grid(self, which: str, cu_seqlens, max_seqlens) -> tuple | None:
        """The grid of a pass over packed sequences (it covers the longest); None otherwise."""
        if cu_seqlens is None or which == "delta":
            return None
        tile, n_seqs = self.tiles[which], cu_seqlens[0].shape[0] - 1
        if which == "dq":
            return cdiv(max_seqlens[0], tile.block_m), n_seqs * self.heads
        return cdiv(max_seqlens[1], tile.block_n), n_seqs * (self.heads // self.meta["GROUP"])

    def _run(
        self,
        which: str,
        launch: Callable[..., None],
        inputs: tuple[torch.Tensor, ...],
        outputs: tuple[torch.Tensor, ...],
        scale: float,
        cu_seqlens: tuple[torch.Tensor, torch.Tensor] | None,
        max_seqlens: tuple[int, int] | None = None,
        traced: bool = False,
    ) -> None:
        """Launch one pass with its arguments in its kernel's order."""
        q, k, v, o, lse, do = inputs
        delta, dq, dk, dv = outputs
        cu = cu_seqlens or unused_pointers(lse, traced)  # when the sequences are not packed
        if which == "delta":
            launch((o, do, delta, dq), self.delta_ints)
            return
        scales = kernel_scales(scale, self.fwd.call.softcap)
        scalars = (scales[0], scale, scales[1])  # qk_scale, sm_scale, cap_scale
        grid = self._grid(which, cu_seqlens, max_seqlens)
        if which == "dq":
            launch((q, k, v, o, do, lse, delta, dq, *cu), (*self.dq_ints, *scalars), grid)
        else:  # dkdv, or fused (which also adds into dq)
            tensors = (q, k, v, do, lse, delta, dk, dv, dq, *cu)
            launch(tensors, (*self.dkdv_ints, *scalars), grid)

    def outputs(self, q: torch.Tensor) -> tuple[torch.Tensor, ...]:
        """delta = rowsum(dO ∘ O), dq (fp32 in the single pass, for its atomic additions), dk,
        dv."""
        q_shape, k_shape, v_shape = self.shapes
        delta = q.new_empty((self.batch_heads, self.n_q), dtype=torch.float32)
        if self.single_pass:
            dq = q.new_empty(self.dq_buffer_shape, dtype=torch.float32)
        else:
            dq = q.new_empty(q_shape)
        return delta, dq, q.new_empty(k_shape), q.new_empty(v_shape)

    def __call__(
        self,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        o: torch.Tensor,
        lse: torch.Tensor,
        do: torch.Tensor,
        scale: float,
        cu_seqlens: tuple[torch.Tensor, torch.Tensor] | None,
        max_seqlens: tuple[int, int] | None,
        traced: bool,
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        if self.empty:
            return tuple(q.new_zeros(shape) for shape in self.shapes)
        if self.gluon:
            grads = self._gluon(q, k, v, o, lse, do, scale)
            if grads is not None:
                return grads
            if configs.backward_form() == "gluon":
                _warn_gluon("a tensor is not 16-byte aligned")
        inputs = q, k, v, o, lse, do
        if self.copies is not None:
            inputs = contiguous_where(inputs, self.copies, self.fwd.layout)
        outputs = self.outputs(q)
        for which, launch in self.launches.items():
            launch = launch.traceable if traced else launch
            self._run(which, launch, inputs, outputs, scale, cu_seqlens, max_seqlens, traced)
        _, dq, dk, dv = outputs
        if self.single_pass:  # the fp32 buffer, (..., heads, n, d), to q's dtype and layout
            grad = q.new_empty(self.shapes[0])
            as_bhsd(grad, self.fwd.layout).copy_(dq)
            dq = grad
        return dq, dk, dv

    def _gluon(self, q, k, v, o, lse, do, scale: float) -> tuple[torch.Tensor, ...] | None:
        """The Gluon single pass: dQ summed in fp32 (in a fixed order where the call is
        deterministic), then cast into q's dtype and layout as the Triton single pass does;
        None where a pointer is not 16-byte aligned (the caller runs the Triton kernels)."""
        q_shape, k_shape, v_shape = self.shapes
        layout = self.fwd.layout
        # (..., heads, n, d) views, copied where the plan says (flags in the order q, k, v, o,
        # lse, do; lse is not among them)
        flags = None if self.copies is None else (*self.copies[:4], self.copies[5])
        views = contiguous_where(tuple(as_bhsd(t, layout) for t in (q, k, v, o, do)), flags, "bhsd")
        if any(t.data_ptr() % 16 for t in views):
            return None
        dk, dv = q.new_empty(k_shape), q.new_empty(v_shape)
        qv, kv, vv, ov, dov = views
        dkv, dvv = as_bhsd(dk, layout), as_bhsd(dv, layout)
        dq = gluon_backward.launch(
            qv, kv, vv, ov, lse, dov, dkv, dvv, self.gluon_strides, scale=scale,
            causal=bool(self.meta["IS_CAUSAL"]), deterministic=self.deterministic,
            block_m=configs.gluon_backward_block_m(self.meta["HEAD_DIM"]),
        )  # fmt: skip
        grad = q.new_empty(q_shape)
        as_bhsd(grad, layout).copy_(dq)
        return grad, dk, dv


def backward_plan(
    fwd: ForwardPlan,
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    o: torch.Tensor,
    lse: torch.Tensor,
    do: torch.Tensor,
    deterministic: bool,
) -> BackwardPlan:
    """The cached backward plan of a forward plan's outputs, for dO's strides and
    `deterministic` (everything else about the call is the forward plan's)."""
    key = (do.stride(), deterministic)  # FA2_AUTOTUNE is read when a plan is built
    plan = fwd.backward_plans.get(key)
    if plan is None:
        if len(fwd.backward_plans) >= 8:
            fwd.backward_plans.clear()
        plan = BackwardPlan(fwd, q, k, v, o, lse, do, deterministic, False)
        fwd.backward_plans[key] = plan
    return plan
