"""FlashAttention-2 backward kernels and their launcher.

Three launches, none of which materialises the score matrix and none of which races:
1. preprocess: D = rowsum(dO ∘ O) per query row;
2. dK/dV: a program owns BLOCK_N keys and walks the query tiles that can see them, recomputing
   P = exp(S - L) tile by tile (each key row is written by exactly one program);
3. dQ: a program owns BLOCK_M queries and walks the key tiles they can see (each query row is
   written by exactly one program).
Recomputing S twice (once per pass) costs one extra matmul of the five, but avoids atomics,
which would make dQ non-deterministic and need an fp32 buffer and a cast.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from fa2.triton.configs import (
    LOG2E,
    block_d,
    dkdv_configs,
    dot_precision,
    dq_configs,
    prune_dkdv,
    prune_dq,
    seq_bucket,
    upcast,
)

__all__ = ["flash_backward"]

_PREPROCESS_ROWS = 128  # rows per program of the preprocess: a pure bandwidth kernel


@triton.jit
def _preprocess_kernel(
    O,
    DO,
    Delta,
    stride_ob,
    stride_on,
    stride_dob,
    stride_don,
    N_Q,
    HEAD_DIM: tl.constexpr,
    BLOCK_D: tl.constexpr,
    BLOCK_M: tl.constexpr,
):
    bid = tl.program_id(1).to(tl.int64)
    rows = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_d = tl.arange(0, BLOCK_D)
    mask = (rows[:, None] < N_Q) & (offs_d[None, :] < HEAD_DIM)
    o = tl.load(O + bid * stride_ob + rows[:, None] * stride_on + offs_d[None, :], mask=mask)
    do = tl.load(DO + bid * stride_dob + rows[:, None] * stride_don + offs_d[None, :], mask=mask)
    delta = tl.sum(o.to(tl.float32) * do.to(tl.float32), 1)
    tl.store(Delta + bid * N_Q + rows, delta, mask=rows < N_Q)


@triton.jit
def _dkdv_tiles(
    dk,
    dv,
    k,
    v,
    q_base,
    do_base,
    l_base,
    delta_base,
    stride_qn,
    stride_don,
    offs_n,
    offs_d,
    start,
    end,
    N_Q,
    qk_scale,
    HEAD_DIM: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_D: tl.constexpr,
    MASKED: tl.constexpr,
    IS_CAUSAL: tl.constexpr,
    UPCAST: tl.constexpr,
    PRECISION: tl.constexpr,
):
    """Accumulate into (dk, dv) of one key tile the query tiles [start, end)."""
    offs_m = tl.arange(0, BLOCK_M)
    d_ok = offs_d[None, :] < HEAD_DIM
    for start_m in tl.range(start, end, BLOCK_M):
        rows = start_m + offs_m
        if MASKED:
            row_ok = rows < N_Q
            qo_mask = row_ok[:, None] & d_ok
            lse = tl.load(l_base + rows, mask=row_ok, other=0.0)
            delta = tl.load(delta_base + rows, mask=row_ok, other=0.0)
        else:
            qo_mask = d_ok
            lse = tl.load(l_base + rows)
            delta = tl.load(delta_base + rows)
        q = tl.load(q_base + rows[:, None] * stride_qn + offs_d[None, :], mask=qo_mask, other=0.0)
        do_ptrs = do_base + rows[:, None] * stride_don + offs_d[None, :]
        do = tl.load(do_ptrs, mask=qo_mask, other=0.0)
        if UPCAST:
            q = q.to(tl.float32)
            do = do.to(tl.float32)
        s_t = tl.dot(k, tl.trans(q), input_precision=PRECISION) * qk_scale  # (BLOCK_N, BLOCK_M)
        p_t = tl.math.exp2(s_t - lse[None, :] * 1.4426950408889634)
        if MASKED:
            keep = rows[None, :] < N_Q
            if IS_CAUSAL:
                keep = keep & (offs_n[:, None] <= rows[None, :])
            p_t = tl.where(keep, p_t, 0.0)
        dv = tl.dot(p_t.to(do.dtype), do, dv, input_precision=PRECISION)
        dp_t = tl.dot(v, tl.trans(do), input_precision=PRECISION)
        ds_t = p_t * (dp_t - delta[None, :])
        dk = tl.dot(ds_t.to(q.dtype), q, dk, input_precision=PRECISION)
    return dk, dv


@triton.autotune(
    configs=dkdv_configs(),
    key=["BLOCK_D", "IS_CAUSAL", "SEQ_BUCKET"],
    prune_configs_by={"early_config_prune": prune_dkdv},
    cache_results=True,
)
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
    stride_qb,
    stride_qn,
    stride_kb,
    stride_kn,
    stride_vb,
    stride_vn,
    stride_dob,
    stride_don,
    stride_dkb,
    stride_dkn,
    stride_dvb,
    stride_dvn,
    N_Q,
    N_K,
    SEQ_BUCKET,
    qk_scale,
    sm_scale,
    HEAD_DIM: tl.constexpr,
    BLOCK_D: tl.constexpr,
    IS_CAUSAL: tl.constexpr,
    UPCAST: tl.constexpr,
    PRECISION: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
):
    pid_n = tl.program_id(0)
    bid = tl.program_id(1).to(tl.int64)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, BLOCK_D)
    kv_mask = (offs_n[:, None] < N_K) & (offs_d[None, :] < HEAD_DIM)
    k = tl.load(K + bid * stride_kb + offs_n[:, None] * stride_kn + offs_d[None, :], mask=kv_mask)
    v = tl.load(V + bid * stride_vb + offs_n[:, None] * stride_vn + offs_d[None, :], mask=kv_mask)
    if UPCAST:
        k = k.to(tl.float32)
        v = v.to(tl.float32)
    dk = tl.zeros([BLOCK_N, BLOCK_D], tl.float32)
    dv = tl.zeros([BLOCK_N, BLOCK_D], tl.float32)
    q_base = Q + bid * stride_qb
    do_base = DO + bid * stride_dob
    l_base = L + bid * N_Q
    delta_base = Delta + bid * N_Q

    # Query rows [0, full_end) are whole tiles; causal rows before this key tile see none of it,
    # rows on its diagonal [lo, lo + BLOCK_N) see part of it, later rows see all of it.
    full_end = (N_Q // BLOCK_M) * BLOCK_M
    lo = 0
    if IS_CAUSAL:
        lo = pid_n * BLOCK_N
        dk, dv = _dkdv_tiles(
            dk, dv, k, v, q_base, do_base, l_base, delta_base, stride_qn, stride_don,
            offs_n, offs_d, lo, tl.minimum(lo + BLOCK_N, N_Q), N_Q, qk_scale,
            HEAD_DIM, BLOCK_M, BLOCK_D, True, IS_CAUSAL, UPCAST, PRECISION,
        )  # fmt: skip
        lo = lo + BLOCK_N
    dk, dv = _dkdv_tiles(
        dk, dv, k, v, q_base, do_base, l_base, delta_base, stride_qn, stride_don,
        offs_n, offs_d, lo, full_end, N_Q, qk_scale,
        HEAD_DIM, BLOCK_M, BLOCK_D, False, IS_CAUSAL, UPCAST, PRECISION,
    )  # fmt: skip
    dk, dv = _dkdv_tiles(
        dk, dv, k, v, q_base, do_base, l_base, delta_base, stride_qn, stride_don,
        offs_n, offs_d, tl.maximum(lo, full_end), N_Q, N_Q, qk_scale,
        HEAD_DIM, BLOCK_M, BLOCK_D, True, IS_CAUSAL, UPCAST, PRECISION,
    )  # fmt: skip

    dk = dk * sm_scale
    dk_ptrs = DK + bid * stride_dkb + offs_n[:, None] * stride_dkn + offs_d[None, :]
    dv_ptrs = DV + bid * stride_dvb + offs_n[:, None] * stride_dvn + offs_d[None, :]
    tl.store(dk_ptrs, dk.to(DK.dtype.element_ty), mask=kv_mask)
    tl.store(dv_ptrs, dv.to(DV.dtype.element_ty), mask=kv_mask)


@triton.jit
def _dq_tiles(
    dq,
    q,
    do,
    lse2,
    delta,
    k_base,
    v_base,
    stride_kn,
    stride_vn,
    rows,
    offs_d,
    start,
    end,
    N_K,
    qk_scale,
    HEAD_DIM: tl.constexpr,
    BLOCK_N: tl.constexpr,
    MASKED: tl.constexpr,
    IS_CAUSAL: tl.constexpr,
    UPCAST: tl.constexpr,
    PRECISION: tl.constexpr,
):
    """Accumulate into dq of one query tile the key tiles [start, end)."""
    offs_n = tl.arange(0, BLOCK_N)
    d_ok = offs_d[None, :] < HEAD_DIM
    for start_n in tl.range(start, end, BLOCK_N):
        cols = start_n + offs_n
        if MASKED:
            kv_mask = (cols[:, None] < N_K) & d_ok
        else:
            kv_mask = d_ok
        k = tl.load(k_base + cols[:, None] * stride_kn + offs_d[None, :], mask=kv_mask, other=0.0)
        v = tl.load(v_base + cols[:, None] * stride_vn + offs_d[None, :], mask=kv_mask, other=0.0)
        if UPCAST:
            k = k.to(tl.float32)
            v = v.to(tl.float32)
        s = tl.dot(q, tl.trans(k), input_precision=PRECISION) * qk_scale  # (BLOCK_M, BLOCK_N)
        p = tl.math.exp2(s - lse2[:, None])
        if MASKED:
            keep = cols[None, :] < N_K
            if IS_CAUSAL:
                keep = keep & (cols[None, :] <= rows[:, None])
            p = tl.where(keep, p, 0.0)
        dp = tl.dot(do, tl.trans(v), input_precision=PRECISION)
        ds = p * (dp - delta[:, None])
        dq = tl.dot(ds.to(k.dtype), k, dq, input_precision=PRECISION)
    return dq


@triton.autotune(
    configs=dq_configs(),
    key=["BLOCK_D", "IS_CAUSAL", "SEQ_BUCKET"],
    prune_configs_by={"early_config_prune": prune_dq},
    cache_results=True,
)
@triton.jit
def _dq_kernel(
    Q,
    K,
    V,
    DO,
    L,
    Delta,
    DQ,
    stride_qb,
    stride_qn,
    stride_kb,
    stride_kn,
    stride_vb,
    stride_vn,
    stride_dob,
    stride_don,
    stride_dqb,
    stride_dqn,
    N_Q,
    N_K,
    SEQ_BUCKET,
    qk_scale,
    sm_scale,
    HEAD_DIM: tl.constexpr,
    BLOCK_D: tl.constexpr,
    IS_CAUSAL: tl.constexpr,
    UPCAST: tl.constexpr,
    PRECISION: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
):
    pid_m = tl.program_id(0)
    if IS_CAUSAL:
        pid_m = tl.cdiv(N_Q, BLOCK_M) - 1 - pid_m  # heaviest tiles first
    bid = tl.program_id(1).to(tl.int64)
    rows = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_d = tl.arange(0, BLOCK_D)
    row_ok = rows < N_Q
    q_mask = row_ok[:, None] & (offs_d[None, :] < HEAD_DIM)
    q = tl.load(Q + bid * stride_qb + rows[:, None] * stride_qn + offs_d[None, :], mask=q_mask)
    do = tl.load(DO + bid * stride_dob + rows[:, None] * stride_don + offs_d[None, :], mask=q_mask)
    if UPCAST:
        q = q.to(tl.float32)
        do = do.to(tl.float32)
    lse2 = tl.load(L + bid * N_Q + rows, mask=row_ok, other=0.0) * 1.4426950408889634
    delta = tl.load(Delta + bid * N_Q + rows, mask=row_ok, other=0.0)
    dq = tl.zeros([BLOCK_M, BLOCK_D], tl.float32)
    k_base = K + bid * stride_kb
    v_base = V + bid * stride_vb

    full_end = (N_K // BLOCK_N) * BLOCK_N
    end = N_K
    if IS_CAUSAL:
        full_end = tl.minimum(full_end, pid_m * BLOCK_M)
        end = tl.minimum(end, (pid_m + 1) * BLOCK_M)
    dq = _dq_tiles(
        dq, q, do, lse2, delta, k_base, v_base, stride_kn, stride_vn, rows, offs_d,
        0, full_end, N_K, qk_scale,
        HEAD_DIM, BLOCK_N, False, IS_CAUSAL, UPCAST, PRECISION,
    )  # fmt: skip
    dq = _dq_tiles(
        dq, q, do, lse2, delta, k_base, v_base, stride_kn, stride_vn, rows, offs_d,
        full_end, end, N_K, qk_scale,
        HEAD_DIM, BLOCK_N, True, IS_CAUSAL, UPCAST, PRECISION,
    )  # fmt: skip

    dq = dq * sm_scale
    dq_ptrs = DQ + bid * stride_dqb + rows[:, None] * stride_dqn + offs_d[None, :]
    tl.store(dq_ptrs, dq.to(DQ.dtype.element_ty), mask=q_mask)


def flash_backward(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    o: torch.Tensor,
    lse: torch.Tensor,
    do: torch.Tensor,
    causal: bool,
    scale: float,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Gradients of attention on `(batch, n, d)` tensors with unit stride in d."""
    batch, n_q, d = q.shape
    n_k = k.shape[1]
    meta = dict(
        HEAD_DIM=d,
        BLOCK_D=block_d(d),
        IS_CAUSAL=causal,
        UPCAST=upcast(q.dtype),
        PRECISION=dot_precision(q.dtype),
    )
    delta = torch.empty((batch, n_q), device=q.device, dtype=torch.float32)
    _preprocess_kernel[(triton.cdiv(n_q, _PREPROCESS_ROWS), batch)](
        o, do, delta, o.stride(0), o.stride(1), do.stride(0), do.stride(1), n_q,
        HEAD_DIM=d, BLOCK_D=block_d(d), BLOCK_M=_PREPROCESS_ROWS,
    )  # fmt: skip

    dq, dk, dv = torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)
    bucket = seq_bucket(n_q, n_k)
    _dkdv_kernel[lambda m: (triton.cdiv(n_k, m["BLOCK_N"]), batch)](
        q, k, v, do, lse, delta, dk, dv,
        q.stride(0), q.stride(1), k.stride(0), k.stride(1), v.stride(0), v.stride(1),
        do.stride(0), do.stride(1), dk.stride(0), dk.stride(1), dv.stride(0), dv.stride(1),
        n_q, n_k, bucket, scale * LOG2E, scale, **meta,
    )  # fmt: skip
    _dq_kernel[lambda m: (triton.cdiv(n_q, m["BLOCK_M"]), batch)](
        q, k, v, do, lse, delta, dq,
        q.stride(0), q.stride(1), k.stride(0), k.stride(1), v.stride(0), v.stride(1),
        do.stride(0), do.stride(1), dq.stride(0), dq.stride(1),
        n_q, n_k, bucket, scale * LOG2E, scale, **meta,
    )  # fmt: skip
    return dq, dk, dv
