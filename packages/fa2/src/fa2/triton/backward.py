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
from collections.abc import Callable

import torch
import triton
import triton.language as tl

from fa2.triton import configs
from fa2.triton.configs import (
    DKDV,
    DKDV_ATOMIC,
    DQ,
    LOG2E,
    Tile,
    autotuning,
    cdiv,
    choose_tile,
    delta_rows,
    head_counts,
    kernel_meta,
    seq_bucket,
)
from fa2.triton.launch import (
    CachedLaunch,
    contiguous_where,
    dense_strides,
    needs_int64,
    plan_cache,
    read_layouts,
    tma_capable,
    tma_layouts,
)
from fa2.triton.tiles import add_tile, load_row_pair, load_tile, row_source, store_tile, visible

__all__ = ["flash_backward"]


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
    N_Q,
    qk_scale,
    sm_scale,
    HEAD_DIM: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_D: tl.constexpr,
    MASKED: tl.constexpr,
    IS_CAUSAL: tl.constexpr,
    UPCAST: tl.constexpr,
    PRECISION: tl.constexpr,
    LARGE: tl.constexpr,
    ATOMIC_DQ: tl.constexpr,
    TMA: tl.constexpr,
):
    """Accumulate into (dk, dv) of one key tile the query tiles [start, end) of one query head;
    with ATOMIC_DQ also add this key tile's share of dQ into the fp32 rows at dq_base."""
    for start_m in tl.range(start, end, BLOCK_M):
        rows = start_m + tl.arange(0, BLOCK_M)
        if MASKED:
            lse = tl.load(l_base + rows, mask=rows < N_Q, other=0.0)
            delta = tl.load(delta_base + rows, mask=rows < N_Q, other=0.0)
        else:
            lse = tl.load(l_base + rows)
            delta = tl.load(delta_base + rows)
        q, do = load_row_pair(
            q_src, stride_qn, do_src, stride_don, start_m, offs_d, N_Q,
            HEAD_DIM, BLOCK_M, BLOCK_D, MASKED, UPCAST, LARGE, TMA,
        )  # fmt: skip
        s_t = tl.dot(k, tl.trans(q), input_precision=PRECISION)  # (BLOCK_N, BLOCK_M), raw
        # Issued before the exponentials so the tensor cores work while they are computed
        # (measured: 6-7% faster on an H100 than after the dV update).
        dp_t = tl.dot(v, tl.trans(do), input_precision=PRECISION)
        # One fused multiply-add per exponent: the logsumexp is taken to log2 units per row.
        p_t = tl.math.exp2(s_t * qk_scale - (lse * 1.4426950408889634)[None, :])
        if MASKED:  # the transpose of `visible`: keys along rows, queries along columns
            keep = rows[None, :] < N_Q
            if IS_CAUSAL:
                keep = keep & (offs_n[:, None] <= rows[None, :])
            p_t = tl.where(keep, p_t, 0.0)
        dv = tl.dot(p_t.to(do.dtype), do, dv, input_precision=PRECISION)
        ds_t = p_t * (dp_t - delta[None, :])
        dk = tl.dot(ds_t.to(q.dtype), q, dk, input_precision=PRECISION)
        if ATOMIC_DQ:
            dq = tl.dot(tl.trans(ds_t.to(k.dtype)), k, input_precision=PRECISION) * sm_scale
            if ATOMIC_DQ == 2:  # one bulk reduction of the tile from shared memory (TMA)
                dq_base.atomic_add([start_m, 0], dq)
            else:
                add_tile(dq_base, rows, HEAD_DIM, offs_d, N_Q, dq, MASKED, HEAD_DIM, BLOCK_D, LARGE)
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
    HEAD_DIM: tl.constexpr,
    BLOCK_D: tl.constexpr,
    IS_CAUSAL: tl.constexpr,
    UPCAST: tl.constexpr,
    PRECISION: tl.constexpr,
    GROUP: tl.constexpr,
    LARGE: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    EVEN_Q: tl.constexpr,
    ATOMIC_DQ: tl.constexpr,
    TMA: tl.constexpr,
):
    """dK and dV of BLOCK_N keys; with ATOMIC_DQ also dQ, added atomically into DQ: fp32,
    zeroed, `(batch, heads, N_Q, HEAD_DIM)` contiguous (unread otherwise)."""
    # Python floats arrive as fp32 from Triton's launcher but as fp64 from torch.compile's.
    qk_scale, sm_scale = tl.cast(qk_scale, tl.float32), tl.cast(sm_scale, tl.float32)
    pid_n = tl.program_id(0)
    # One program per (batch, key/value head): it sums over the GROUP query heads sharing it,
    # so dK and dV of a shared head are written once, without atomics.
    bh = tl.program_id(1).to(tl.int64)
    b, hk = bh // KV_HEADS, bh % KV_HEADS
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, BLOCK_D)
    k = load_tile(
        K + b * stride_kb + hk * stride_kh, offs_n, stride_kn, offs_d, N_K,
        HEAD_DIM, BLOCK_D, True, UPCAST, LARGE,
    )  # fmt: skip
    v = load_tile(
        V + b * stride_vb + hk * stride_vh, offs_n, stride_vn, offs_d, N_K,
        HEAD_DIM, BLOCK_D, True, UPCAST, LARGE,
    )  # fmt: skip
    dk = tl.zeros([BLOCK_N, BLOCK_D], tl.float32)
    dv = tl.zeros([BLOCK_N, BLOCK_D], tl.float32)

    # Query rows [0, full_end) are whole tiles; causal rows before this key tile see none of it,
    # rows on its diagonal [lo, lo + BLOCK_N) see part of it, later rows see all of it.
    full_end = (N_Q // BLOCK_M) * BLOCK_M
    first = 0
    if IS_CAUSAL:
        first = pid_n * BLOCK_N
    for g in range(GROUP):
        h = hk * GROUP + g  # a query head reading this key/value head
        q_src = row_source(
            Q + b * stride_qb + h * stride_qh, N_Q, stride_qn, HEAD_DIM, BLOCK_M, BLOCK_D, TMA
        )
        do_src = row_source(
            DO + b * stride_dob + h * stride_doh, N_Q, stride_don, HEAD_DIM, BLOCK_M, BLOCK_D, TMA
        )
        l_base = L + (bh * GROUP + g) * N_Q  # (batch, query head) rows of L and Delta
        delta_base = Delta + (bh * GROUP + g) * N_Q
        dq_base = DQ + (bh * GROUP + g) * N_Q * HEAD_DIM
        if ATOMIC_DQ == 2:  # rows past N_Q and columns past HEAD_DIM are clipped by the TMA unit
            dq_base = tl.make_tensor_descriptor(
                dq_base, [N_Q, HEAD_DIM], [HEAD_DIM, 1], block_shape=[BLOCK_M, BLOCK_D]
            )
        lo = first
        if IS_CAUSAL:
            dk, dv = _dkdv_tiles(
                dk, dv, k, v, q_src, do_src, l_base, delta_base, dq_base, stride_qn, stride_don,
                offs_n, offs_d, lo, tl.minimum(lo + BLOCK_N, N_Q), N_Q, qk_scale, sm_scale,
                HEAD_DIM, BLOCK_M, BLOCK_D, True, IS_CAUSAL, UPCAST, PRECISION, LARGE,
                ATOMIC_DQ, TMA,
            )  # fmt: skip
            lo = lo + BLOCK_N
        dk, dv = _dkdv_tiles(
            dk, dv, k, v, q_src, do_src, l_base, delta_base, dq_base, stride_qn, stride_don,
            offs_n, offs_d, lo, full_end, N_Q, qk_scale, sm_scale,
            HEAD_DIM, BLOCK_M, BLOCK_D, False, IS_CAUSAL, UPCAST, PRECISION, LARGE,
            ATOMIC_DQ, TMA,
        )  # fmt: skip
        if not EVEN_Q:  # a ragged last query tile. Compiled out otherwise: on an H100 the mere
            # presence of this (empty) loop made the whole kernel 25% slower (measured).
            dk, dv = _dkdv_tiles(
                dk, dv, k, v, q_src, do_src, l_base, delta_base, dq_base, stride_qn, stride_don,
                offs_n, offs_d, tl.maximum(lo, full_end), N_Q, N_Q, qk_scale, sm_scale,
                HEAD_DIM, BLOCK_M, BLOCK_D, True, IS_CAUSAL, UPCAST, PRECISION, LARGE,
                ATOMIC_DQ, TMA,
            )  # fmt: skip

    store_tile(
        DK + b * stride_dkb + hk * stride_dkh, offs_n, stride_dkn, offs_d, N_K, dk * sm_scale,
        HEAD_DIM, LARGE,
    )  # fmt: skip
    store_tile(
        DV + b * stride_dvb + hk * stride_dvh, offs_n, stride_dvn, offs_d, N_K, dv,
        HEAD_DIM, LARGE,
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
    N_Q,
    HEAD_DIM: tl.constexpr,
    BLOCK_D: tl.constexpr,
    UPCAST: tl.constexpr,
    LARGE: tl.constexpr,
):
    """dO of the query rows `rows`, and D = rowsum(dO ∘ O) of them in fp32, which is stored at
    delta_base: returns (dO, D)."""
    do = load_tile(do_base, rows, stride_don, offs_d, N_Q, HEAD_DIM, BLOCK_D, True, UPCAST, LARGE)
    o = load_tile(o_base, rows, stride_on, offs_d, N_Q, HEAD_DIM, BLOCK_D, True, True, LARGE)
    delta = tl.sum(o * do.to(tl.float32), 1)
    tl.store(delta_base + rows, delta, mask=rows < N_Q)
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
    N_K,
    qk_scale,
    HEAD_DIM: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_D: tl.constexpr,
    MASKED: tl.constexpr,
    IS_CAUSAL: tl.constexpr,
    UPCAST: tl.constexpr,
    PRECISION: tl.constexpr,
    LARGE: tl.constexpr,
    TMA: tl.constexpr,
):
    """Accumulate into dq of one query tile the key tiles [start, end)."""
    for start_n in tl.range(start, end, BLOCK_N):
        cols = start_n + tl.arange(0, BLOCK_N)
        k, v = load_row_pair(
            k_src, stride_kn, v_src, stride_vn, start_n, offs_d, N_K,
            HEAD_DIM, BLOCK_N, BLOCK_D, MASKED, UPCAST, LARGE, TMA,
        )  # fmt: skip
        s = tl.dot(q, tl.trans(k), input_precision=PRECISION)  # (BLOCK_M, BLOCK_N), raw
        p = tl.math.exp2(s * qk_scale - lse2[:, None])  # one fused multiply-add per exponent
        if MASKED:
            p = tl.where(visible(rows, cols, 0, N_K, False, IS_CAUSAL), p, 0.0)
        dp = tl.dot(do, tl.trans(v), input_precision=PRECISION)
        ds = p * (dp - delta[:, None])
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
    HEAD_DIM: tl.constexpr,
    BLOCK_D: tl.constexpr,
    IS_CAUSAL: tl.constexpr,
    UPCAST: tl.constexpr,
    PRECISION: tl.constexpr,
    GROUP: tl.constexpr,
    LARGE: tl.constexpr,
    TMA: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
):
    # Python floats arrive as fp32 from Triton's launcher but as fp64 from torch.compile's.
    qk_scale, sm_scale = tl.cast(qk_scale, tl.float32), tl.cast(sm_scale, tl.float32)
    pid_m = tl.program_id(0)
    if IS_CAUSAL:
        pid_m = tl.cdiv(N_Q, BLOCK_M) - 1 - pid_m  # heaviest tiles first
    bh = tl.program_id(1).to(tl.int64)  # (batch, query head)
    b, h = bh // HEADS, bh % HEADS
    rows = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_d = tl.arange(0, BLOCK_D)
    q = load_tile(
        Q + b * stride_qb + h * stride_qh, rows, stride_qn, offs_d, N_Q,
        HEAD_DIM, BLOCK_D, True, UPCAST, LARGE,
    )  # fmt: skip
    lse2 = tl.load(L + bh * N_Q + rows, mask=rows < N_Q, other=0.0) * 1.4426950408889634
    do, delta = _load_do_store_delta(  # D: for this pass and the next
        DO + b * stride_dob + h * stride_doh, stride_don, O + b * stride_ob + h * stride_oh,
        stride_on, Delta + bh * N_Q, rows, offs_d, N_Q, HEAD_DIM, BLOCK_D, UPCAST, LARGE,
    )  # fmt: skip
    dq = tl.zeros([BLOCK_M, BLOCK_D], tl.float32)
    k_src = row_source(K + b * stride_kb + (h // GROUP) * stride_kh, N_K, stride_kn,
                       HEAD_DIM, BLOCK_N, BLOCK_D, TMA)  # fmt: skip
    v_src = row_source(V + b * stride_vb + (h // GROUP) * stride_vh, N_K, stride_vn,
                       HEAD_DIM, BLOCK_N, BLOCK_D, TMA)  # fmt: skip

    full_end = (N_K // BLOCK_N) * BLOCK_N
    end = N_K
    if IS_CAUSAL:
        full_end = tl.minimum(full_end, pid_m * BLOCK_M)
        end = tl.minimum(end, (pid_m + 1) * BLOCK_M)
    dq = _dq_tiles(
        dq, q, do, lse2, delta, k_src, v_src, stride_kn, stride_vn, rows, offs_d,
        0, full_end, N_K, qk_scale,
        HEAD_DIM, BLOCK_N, BLOCK_D, False, IS_CAUSAL, UPCAST, PRECISION, LARGE, TMA,
    )  # fmt: skip
    dq = _dq_tiles(
        dq, q, do, lse2, delta, k_src, v_src, stride_kn, stride_vn, rows, offs_d,
        full_end, end, N_K, qk_scale,
        HEAD_DIM, BLOCK_N, BLOCK_D, True, IS_CAUSAL, UPCAST, PRECISION, LARGE, TMA,
    )  # fmt: skip

    store_tile(
        DQ + b * stride_dqb + h * stride_dqh, rows, stride_dqn, offs_d, N_Q, dq * sm_scale,
        HEAD_DIM, LARGE,
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
):
    """D = rowsum(dO ∘ O) of BLOCK_M query rows, and those rows of the fp32 dQ accumulator
    zeroed, ahead of the single-pass backward (which needs D from its first tile on)."""
    pid_m = tl.program_id(0)
    bh = tl.program_id(1).to(tl.int64)  # (batch, query head)
    b, h = bh // HEADS, bh % HEADS
    rows = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_d = tl.arange(0, BLOCK_D)
    _load_do_store_delta(
        DO + b * stride_dob + h * stride_doh, stride_don, O + b * stride_ob + h * stride_oh,
        stride_on, Delta + bh * N_Q, rows, offs_d, N_Q, HEAD_DIM, BLOCK_D, False, LARGE,
    )  # fmt: skip
    zeros = tl.zeros([BLOCK_M, BLOCK_D], tl.float32)
    store_tile(DQ + bh * N_Q * HEAD_DIM, rows, HEAD_DIM, offs_d, N_Q, zeros, HEAD_DIM, LARGE)


# The single-pass backward adds dQ tiles with TMA bulk reductions where it can (see
# `tma_reduce_available`); False forces per-element atomics (for comparisons).
USE_TMA_REDUCE = True


def tma_reduce_available(q: torch.Tensor) -> bool:
    """Whether the single-pass backward can add dQ tiles with the TMA unit's bulk reductions:
    a Hopper or newer GPU, outside the interpreter, with fp32 dQ rows 16-byte aligned."""
    return USE_TMA_REDUCE and tma_capable(q.device) and q.shape[-1] % 4 == 0


class BackwardPlan:
    """The backward launches for one combination of shapes, strides, dtype, causality,
    precision and determinism.

    Two-pass (deterministic, and the choice for 16-bit inputs): the dQ pass, then the dK/dV
    pass. Single-pass (`deterministic=False` where `configs.single_pass_backward` says so): a
    small pass for D = rowsum(dO ∘ O), then one pass that computes dK, dV and dQ together and
    adds dQ into an fp32 buffer (5 matmuls per tile pair instead of 7; the order of the
    additions, hence dQ's last bits, varies between runs).

    Call as `plan(q, k, v, o, lse, do, scale, traced) -> (dq, dk, dv)` with tensors like the
    ones it was built from; `flash_backward` finds or builds it. Gradients are allocated
    contiguous.
    """

    def __init__(
        self,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        o: torch.Tensor,
        lse: torch.Tensor,
        do: torch.Tensor,
        causal: bool,
        precision: str,
        deterministic: bool,
        traced: bool,
    ) -> None:
        *lead, n_q, d = q.shape
        n_k = k.shape[-2]
        heads, group = head_counts(q, k)
        self.shapes = (q.shape, k.shape, v.shape)
        self.dtype = q.dtype
        self.batch_heads, self.n_q, self.n_k = math.prod(lead), n_q, n_k
        self.batch_kv_heads = self.batch_heads // group
        tensors = (q, k, v, o, do)
        copies, strides = read_layouts(tensors)
        if copies is not None or not lse.is_contiguous():  # in the order q, k, v, o, lse, do:
            copies = copies or (False,) * 5
            copies = (*copies[:4], not lse.is_contiguous(), copies[4])
        self.copies = copies
        sq, sk, sv, so, sdo = strides
        sdq, sdk = dense_strides(q.shape), dense_strides(k.shape)  # gradients: contiguous
        self.dq_ints = (*sq, *sk, *sv, *so, *sdo, *sdq, heads, n_q, n_k)
        self.dkdv_ints = (*sq, *sk, *sv, *sdo, *sdk, *sdk, heads // group, n_q, n_k)
        self.delta_ints = (*so, *sdo, heads, n_q)
        self.single_pass = not deterministic and configs.single_pass_backward(q.dtype)
        self.tma_reduce = self.single_pass and not traced and tma_reduce_available(q)
        # Tiles with `tma` read the inner loop's rows through TMA descriptors where the
        # layouts of those rows allow (and, when traced, their alignment is known: see
        # `tma_layouts`): keys and values in the dQ pass, queries and output gradients in the
        # dK/dV pass and the single pass.
        kv_tma = tma_layouts((k, v), [sk, sv], traced=traced)
        q_do_tma = tma_layouts((q, do), [sq, sdo], traced=traced)
        self.tma_loads = dict(dq=kv_tma, dkdv=q_do_tma, fused=q_do_tma)
        self.meta = kernel_meta(d, causal, q.dtype, precision)
        shapes = [t.shape for t in tensors]
        self.meta.update(GROUP=group, LARGE=needs_int64(shapes, strides))

        def tuning_run(which: str) -> Callable[[Tile], None]:  # for FA2_AUTOTUNE only
            def run(tile: Tile) -> None:
                inputs = contiguous_where((q, k, v, o, lse, do), self.copies)
                self._run(which, self._launch(which, tile), inputs, self.outputs(q), 1.0)

            return run

        choice = dict(
            head_dim_block=self.meta["BLOCK_D"],
            dtype=q.dtype,
            precision=precision,
            seq_len=torch.sym_max(n_q, n_k),  # no guard when traced with symbolic lengths
            key=lambda: (causal, seq_bucket(n_q, n_k)),
        )
        # In launch order: the first pass writes D, which the second reads.
        passes = (("fused", DKDV_ATOMIC),) if self.single_pass else (("dq", DQ), ("dkdv", DKDV))
        self.launches = {}
        if self.single_pass:
            self.launches["delta"] = self._launch("delta", Tile(delta_rows(d), 0, 4, 1))
        for which, table in passes:
            tile = choose_tile(table, run=None if traced else tuning_run(which), **choice)
            self.launches[which] = self._launch(which, tile)

    def _launch(self, which: str, tile: Tile) -> CachedLaunch:
        """The launch of one pass with `tile`: "dq" or "dkdv" (the deterministic passes),
        "delta" or "fused" (the single-pass backward)."""
        if which == "delta":
            meta = {name: self.meta[name] for name in ("HEAD_DIM", "BLOCK_D", "LARGE")}
            grid = (cdiv(self.n_q, tile.block_m), self.batch_heads)
            return CachedLaunch(
                _delta_kernel, grid, dict(meta, BLOCK_M=tile.block_m), num_warps=4, num_stages=1
            )
        tma = tile.tma and self.tma_loads[which]
        constexprs = dict(self.meta, TMA=tma, BLOCK_M=tile.block_m, BLOCK_N=tile.block_n)
        if which == "dq":
            kernel, grid = _dq_kernel, (cdiv(self.n_q, tile.block_m), self.batch_heads)
        else:
            kernel, grid = _dkdv_kernel, (cdiv(self.n_k, tile.block_n), self.batch_kv_heads)
            constexprs["EVEN_Q"] = self.n_q % tile.block_m == 0
            constexprs["ATOMIC_DQ"] = 0 if which == "dkdv" else (2 if self.tma_reduce else 1)
        return CachedLaunch(
            kernel, grid, constexprs, num_warps=tile.warps, num_stages=tile.stages,
            scratch=tma or constexprs.get("ATOMIC_DQ") == 2,
            unaligned=self._launch(which, tile._replace(tma=False)) if tma else None,
        )  # fmt: skip

    def _run(
        self,
        which: str,
        launch: Callable[[tuple, tuple], None],
        inputs: tuple[torch.Tensor, ...],
        outputs: tuple[torch.Tensor, ...],
        scale: float,
    ) -> None:
        """Launch one pass with its arguments in its kernel's order."""
        q, k, v, o, lse, do = inputs
        delta, dq, dk, dv = outputs
        if which == "dq":
            launch((q, k, v, o, do, lse, delta, dq), (*self.dq_ints, scale * LOG2E, scale))
        elif which == "delta":
            launch((o, do, delta, dq), self.delta_ints)
        else:  # dkdv, or fused (which also adds into dq)
            launch((q, k, v, do, lse, delta, dk, dv, dq), (*self.dkdv_ints, scale * LOG2E, scale))

    def outputs(self, q: torch.Tensor) -> tuple[torch.Tensor, ...]:
        """delta = rowsum(dO ∘ O), dq (fp32 in the single pass, for its atomic additions), dk,
        dv."""
        q_shape, k_shape, v_shape = self.shapes
        delta = q.new_empty((self.batch_heads, self.n_q), dtype=torch.float32)
        dq = q.new_empty(q_shape, dtype=torch.float32 if self.single_pass else q.dtype)
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
        traced: bool,
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        inputs = contiguous_where((q, k, v, o, lse, do), self.copies)
        outputs = self.outputs(q)
        for which, launch in self.launches.items():
            self._run(which, launch.traceable if traced else launch, inputs, outputs, scale)
        _, dq, dk, dv = outputs
        return dq.to(self.dtype), dk, dv


_plans = plan_cache(BackwardPlan)


def flash_backward(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    o: torch.Tensor,
    lse: torch.Tensor,
    do: torch.Tensor,
    causal: bool,
    scale: float,
    precision: str,
    *,
    deterministic: bool = True,
    traced: bool = False,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """dq, dk, dv of attention on `(..., heads, n, d)` tensors (lse: `(..., heads, n_q)` fp32),
    n_q, n_k >= 1; k and v may have fewer heads than q (a divisor of q's).

    `deterministic=False`: allow the single-pass backward, with dQ added atomically, where it
    is the faster one (see `BackwardPlan`). `traced`: launch in the form torch.compile traces
    into (see `CachedLaunch.traceable`), from a plan built afresh (shapes may be symbolic
    there, and tracing happens once)."""
    args = (q, k, v, o, lse, do)
    if traced:
        plan = BackwardPlan(*args, causal, precision, deterministic, traced)
        return plan(*args, scale, traced)
    key = (
        q.shape, k.shape, v.shape, q.stride(), k.stride(), v.stride(), o.stride(), do.stride(),
        lse.stride(), q.dtype, q.device, causal, precision, deterministic, autotuning(),
    )  # fmt: skip
    return _plans(key, *args, causal, precision, deterministic, traced)(*args, scale, traced)
