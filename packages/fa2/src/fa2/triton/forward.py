"""FlashAttention-2 forward kernel and its launcher.

One program owns BLOCK_M query rows of one (batch, head) and walks the key tiles once, keeping the
running max, running sum and output accumulator in fp32 registers (online softmax, base 2 with
log2(e) folded into the scale). Causal tiles entirely above the diagonal are never visited; the
masks are applied only on the diagonal tiles and on a ragged last tile.
"""

from __future__ import annotations

import math

import torch
import triton
import triton.language as tl

from fa2.triton.configs import (
    FORWARD,
    LOG2E,
    Tile,
    autotuning,
    cdiv,
    choose_tile,
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
    tma_layouts,
)
from fa2.triton.tiles import load_row_pair, load_tile, row_source, store_tile, visible

__all__ = ["flash_forward"]


@triton.jit
def _fwd_tiles(
    acc,
    l_i,
    m_i,
    q,
    k_src,
    v_src,
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
    LARGE: tl.constexpr,
    TMA: tl.constexpr,
):
    """Fold key tiles [start, end) into the running (acc, l_i, m_i) of one query tile.

    m_i is kept in scaled log2 units; the row max is taken on the raw scores (the scale is
    positive) so that each exponent is one fused multiply-add, s * qk_scale - m."""
    for start_n in tl.range(start, end, BLOCK_N):
        cols = start_n + tl.arange(0, BLOCK_N)
        k, v = load_row_pair(
            k_src, stride_kn, v_src, stride_vn, start_n, offs_d, N_K,
            HEAD_DIM, BLOCK_N, BLOCK_D, MASKED, UPCAST, LARGE, TMA,
        )  # fmt: skip
        s = tl.dot(q, tl.trans(k), input_precision=PRECISION)  # (BLOCK_M, BLOCK_N) raw scores
        if MASKED:
            s = tl.where(visible(offs_m, cols, 0, N_K, False, IS_CAUSAL), s, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(s, 1) * qk_scale)
        p = tl.math.exp2(s * qk_scale - m_new[:, None])
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
    HEADS,
    N_Q,
    N_K,
    qk_scale,
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
    qk_scale = tl.cast(qk_scale, tl.float32)
    # Heaviest causal tiles (the last query rows) start first, so the grid's tail is short.
    pid_m = tl.program_id(0)
    if IS_CAUSAL:
        pid_m = tl.cdiv(N_Q, BLOCK_M) - 1 - pid_m
    # One program per (batch, query head); GROUP query heads share one key/value head.
    bh = tl.program_id(1).to(tl.int64)
    b, h = bh // HEADS, bh % HEADS
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_d = tl.arange(0, BLOCK_D)
    q = load_tile(
        Q + b * stride_qb + h * stride_qh, offs_m, stride_qn, offs_d, N_Q,
        HEAD_DIM, BLOCK_D, True, UPCAST, LARGE,
    )  # fmt: skip
    k_src = row_source(K + b * stride_kb + (h // GROUP) * stride_kh, N_K, stride_kn,
                       HEAD_DIM, BLOCK_N, BLOCK_D, TMA)  # fmt: skip
    v_src = row_source(V + b * stride_vb + (h // GROUP) * stride_vh, N_K, stride_vn,
                       HEAD_DIM, BLOCK_N, BLOCK_D, TMA)  # fmt: skip

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
        acc, l_i, m_i, q, k_src, v_src, stride_kn, stride_vn, offs_m, offs_d,
        0, full_end, N_K, qk_scale,
        HEAD_DIM, BLOCK_N, BLOCK_D, False, IS_CAUSAL, UPCAST, PRECISION, LARGE, TMA,
    )  # fmt: skip
    acc, l_i, m_i = _fwd_tiles(
        acc, l_i, m_i, q, k_src, v_src, stride_kn, stride_vn, offs_m, offs_d,
        full_end, end, N_K, qk_scale,
        HEAD_DIM, BLOCK_N, BLOCK_D, True, IS_CAUSAL, UPCAST, PRECISION, LARGE, TMA,
    )  # fmt: skip

    # Key 0 is visible to every row, so l_i >= 1 here and the division is safe.
    acc = acc / l_i[:, None]
    lse = (m_i + tl.math.log2(l_i)) / 1.4426950408889634  # back to natural-log units
    tl.store(L + bh * N_Q + offs_m, lse, mask=offs_m < N_Q)
    store_tile(
        O + b * stride_ob + h * stride_oh, offs_m, stride_on, offs_d, N_Q, acc, HEAD_DIM, LARGE
    )


class ForwardPlan:
    """The forward launch for one combination of shapes, strides, dtype, causality, precision.

    Call as `plan(q, k, v, scale, traced) -> (o, lse)` with tensors like the ones it was built
    from; `flash_forward` finds or builds it. o and lse are allocated contiguous.
    """

    def __init__(
        self,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        causal: bool,
        precision: str,
        traced: bool,
    ) -> None:
        *lead, n_q, d = q.shape
        n_k = k.shape[-2]
        heads, group = head_counts(q, k)
        self.shapes = (q.shape, q.shape[:-1])
        self.copies, strides = read_layouts((q, k, v))
        strides.append(dense_strides(q.shape))  # o
        self.ints = (*(s for st in strides for s in st), heads, n_q, n_k)
        self.batch_heads, self.n_q = math.prod(lead), n_q
        self.meta = kernel_meta(d, causal, q.dtype, precision)
        self.meta.update(
            GROUP=group, LARGE=needs_int64([q.shape, k.shape, v.shape, q.shape], strides)
        )
        # Tiles with `tma` read keys and values through TMA descriptors where the layout
        # allows (and, when traced, the alignment is known: see `tma_layouts`).
        self.tma_loads = tma_layouts((k, v), strides[1:3], traced=traced)

        def run(tile: Tile) -> None:  # for FA2_AUTOTUNE's timing only
            inputs = contiguous_where((q, k, v), self.copies)
            self._launch(tile)(inputs + self.outputs(q), (*self.ints, 1.0))

        tile = choose_tile(
            FORWARD,
            head_dim_block=self.meta["BLOCK_D"],
            dtype=q.dtype,
            precision=precision,
            seq_len=torch.sym_max(n_q, n_k),  # no guard when traced with symbolic lengths
            key=lambda: (causal, seq_bucket(n_q, n_k)),
            run=None if traced else run,
        )
        self.launch = self._launch(tile)

    def _launch(self, tile: Tile) -> CachedLaunch:
        tma = tile.tma and self.tma_loads
        grid = (cdiv(self.n_q, tile.block_m), self.batch_heads)
        constexprs = dict(self.meta, TMA=tma, BLOCK_M=tile.block_m, BLOCK_N=tile.block_n)
        return CachedLaunch(
            _fwd_kernel, grid, constexprs, num_warps=tile.warps, num_stages=tile.stages,
            scratch=tma, unaligned=self._launch(tile._replace(tma=False)) if tma else None,
        )  # fmt: skip

    def outputs(self, q: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        o_shape, lse_shape = self.shapes
        return q.new_empty(o_shape), q.new_empty(lse_shape, dtype=torch.float32)

    def __call__(
        self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float, traced: bool
    ) -> tuple[torch.Tensor, torch.Tensor]:
        o, lse = self.outputs(q)
        launch = self.launch.traceable if traced else self.launch
        launch((*contiguous_where((q, k, v), self.copies), o, lse), (*self.ints, scale * LOG2E))
        return o, lse


_plans = plan_cache(ForwardPlan)


def flash_forward(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    causal: bool,
    scale: float,
    precision: str,
    *,
    traced: bool = False,
) -> tuple[torch.Tensor, torch.Tensor]:
    """o and the logsumexp L (fp32) of attention on `(..., heads, n, d)` tensors, n_q, n_k >= 1;
    k and v may have fewer heads than q (a divisor of q's).

    `traced`: launch in the form torch.compile traces into (see `CachedLaunch.traceable`), from
    a plan built afresh (shapes may be symbolic there, and tracing happens once)."""
    if traced:
        return ForwardPlan(q, k, v, causal, precision, traced)(q, k, v, scale, traced)
    key = (
        q.shape, k.shape, v.shape, q.stride(), k.stride(), v.stride(),
        q.dtype, q.device, causal, precision, autotuning(),
    )  # fmt: skip
    return _plans(key, q, k, v, causal, precision, traced)(q, k, v, scale, traced)
