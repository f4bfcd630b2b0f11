"""FlashAttention-2 forward kernel and its launcher.

One program owns BLOCK_M query rows of one (batch, head) and walks the key tiles once, keeping the
running max, running sum and output accumulator in fp32 registers (online softmax, base 2 with
log2(e) folded into the scale). Causal tiles entirely above the diagonal are never visited; the
masks are applied only on the diagonal tiles and on a ragged last tile.
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Callable

import torch
import triton
import triton.language as tl

from fa2.checks import Call
from fa2.layouts import as_bhsd
from fa2.triton.configs import (
    FORWARD,
    GLUON_FORWARD_MIN_SEQ,
    Tile,
    cdiv,
    choose_tile,
    gluon_default_possible,
    gluon_forward_default,
    gluon_forward_requested,
    gluon_persistent_default,
    head_counts,
    kernel_meta,
    kernel_scales,
    seq_bucket,
    symbolic_shapes_refusal,
    tile_settings,
)
from fa2.triton.launch import (
    CachedLaunch,
    contiguous_where,
    needs_int64,
    output_strides,
    plan_cache,
    read_layouts,
    tma_layouts,
    unused_pointers,
)
from fa2.triton.tiles import (
    LOG2E,
    at_row,
    band,
    key_range,
    load_row_pair,
    load_rows,
    row_source,
    sequence,
    softcapped,
    store_tile,
    visible,
)

__all__ = ["ForwardPlan", "forward_plan"]


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
    EMPTY_ROWS: tl.constexpr,
    SOFTCAP: tl.constexpr,
    UPCAST: tl.constexpr,
    PRECISION: tl.constexpr,
    LARGE: tl.constexpr,
    TMA: tl.constexpr,
    WS: tl.constexpr,
):
    """Fold key tiles [start, end) into the running (acc, l_i, m_i) of one query tile.

    m_i is kept in scaled log2 units; the row max is taken on the raw scores (the scale is
    positive) so that each exponent is one fused multiply-add, s * qk_scale - m. With SOFTCAP
    the scores are first capped (`softcapped`; qk_scale then carries the cap). EMPTY_ROWS: a
    row may have seen no key yet in a masked tile (windows, bottom-right alignment); its
    exponents are then taken from 0 rather than from -inf, which would give NaN."""
    for start_n in tl.range(start, end, BLOCK_N, warp_specialize=WS):
        cols = start_n + tl.arange(0, BLOCK_N)
        k, v = load_row_pair(
            k_src, stride_kn, v_src, stride_vn, start_n, offs_d, n_k,
            HEAD_DIM, BLOCK_N, BLOCK_D, MASKED, UPCAST, LARGE, TMA,
        )  # fmt: skip
        s = tl.dot(q, tl.trans(k), input_precision=PRECISION)  # (BLOCK_M, BLOCK_N) raw scores
        if SOFTCAP:
            s = softcapped(s, cap_scale)
        if MASKED:
            keep = visible(offs_m, cols, 0, n_k, lo, hi, False, IS_CAUSAL, LOCAL)
            s = tl.where(keep, s, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(s, 1) * qk_scale)
        m_sub = m_new
        if MASKED and EMPTY_ROWS:
            m_sub = tl.where(m_new == float("-inf"), 0.0, m_new)
        p = tl.math.exp2(s * qk_scale - m_sub[:, None])
        alpha = tl.math.exp2(m_i - m_sub)
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
    HEADS,
    N_Q,
    N_K,
    qk_scale,
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
    WS: tl.constexpr,
):
    """o and L of BLOCK_M query rows of one (batch, head), or with VARLEN of one (packed
    sequence, head): sequence b is rows CU_Q[b]:CU_Q[b + 1] of q and o (and CU_K of k, v),
    N_Q and N_K are then the total rows, and L is (heads, N_Q). Query i sees key j iff j is in
    range and, where bounded, i + lo <= j (LOCAL) and j <= i + hi (IS_CAUSAL), with
    lo, hi = d - WIN_LEFT, d + WIN_RIGHT, d = 0 or with BOTTOM_RIGHT n_k - n_q (fa2.masks).
    WS: one warp-specialised loop over the key tiles (configs, "Warp specialisation")."""
    tl.static_assert(BLOCK_M % BLOCK_N == 0, "the causal diagonal must start on a key tile")
    # Python floats arrive as fp32 from Triton's launcher but as fp64 from torch.compile's.
    qk_scale = tl.cast(qk_scale, tl.float32)
    cap_scale = tl.cast(cap_scale, tl.float32)
    pid_m = tl.program_id(0)
    q_start, k_start, n_q, n_k = sequence(CU_Q, CU_K, tl.program_id(1) // HEADS, N_Q, N_K, VARLEN)
    # The grid covers the longest sequence; tiles past this one's end have no work. (Two
    # tests: the outer one is a constexpr, which compiles the inner one only for VARLEN.) A
    # warp-specialised loop may not follow a return (the pass fails): there such a tile runs
    # no key tile and, its rows past the end, stores nothing.
    IDLE_TILES: tl.constexpr = VARLEN and WS
    if VARLEN and not WS:  # noqa: SIM102
        if pid_m * BLOCK_M >= n_q:
            return
    # Heaviest causal tiles (the last query rows) start first, so the grid's tail is short.
    if IS_CAUSAL:
        if IDLE_TILES:
            pid_m = tl.where(pid_m * BLOCK_M < n_q, tl.cdiv(n_q, BLOCK_M) - 1 - pid_m, pid_m)
        else:
            pid_m = tl.cdiv(n_q, BLOCK_M) - 1 - pid_m
    # One program per (batch, query head); GROUP query heads share one key/value head.
    bh = tl.program_id(1).to(tl.int64)
    b, h = bh // HEADS, bh % HEADS
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_d = tl.arange(0, BLOCK_D)
    q = load_rows(
        at_row(Q + b * stride_qb + h * stride_qh, q_start, stride_qn, VARLEN), pid_m * BLOCK_M,
        n_q, stride_qn, offs_d, HEAD_DIM, BLOCK_M, BLOCK_D, UPCAST, LARGE, WS,
    )  # fmt: skip
    k_base = at_row(K + b * stride_kb + (h // GROUP) * stride_kh, k_start, stride_kn, VARLEN)
    v_base = at_row(V + b * stride_vb + (h // GROUP) * stride_vh, k_start, stride_vn, VARLEN)
    k_src = row_source(k_base, n_k, stride_kn, HEAD_DIM, BLOCK_N, BLOCK_D, TMA)
    v_src = row_source(v_base, n_k, stride_vn, HEAD_DIM, BLOCK_N, BLOCK_D, TMA)

    m_i = tl.full([BLOCK_M], float("-inf"), tl.float32)
    l_i = tl.zeros([BLOCK_M], tl.float32)
    acc = tl.zeros([BLOCK_M, BLOCK_D], tl.float32)

    lo, hi = band(n_q, n_k, WIN_LEFT, WIN_RIGHT, BOTTOM_RIGHT)
    EMPTY_ROWS: tl.constexpr = LOCAL or BOTTOM_RIGHT
    ALIGNED: tl.constexpr = WIN_RIGHT == 0 and not BOTTOM_RIGHT
    start, full_start, full_end, end = key_range(
        pid_m, n_k, lo, hi, BLOCK_M, BLOCK_N, IS_CAUSAL, LOCAL, ALIGNED
    )
    if WS:  # one warp-specialised loop over every key tile, each masked
        if IDLE_TILES:
            end = tl.where(pid_m * BLOCK_M < n_q, end, start)
        acc, l_i, m_i = _fwd_tiles(
            acc, l_i, m_i, q, k_src, v_src, stride_kn, stride_vn, offs_m, offs_d,
            start, end, n_k, lo, hi, qk_scale, cap_scale, HEAD_DIM, BLOCK_N, BLOCK_D,
            True, IS_CAUSAL, LOCAL, EMPTY_ROWS, SOFTCAP, UPCAST, PRECISION, LARGE, TMA, True,
        )  # fmt: skip
    else:
        if LOCAL:  # keys the first rows of the tile see but not the last
            acc, l_i, m_i = _fwd_tiles(
                acc, l_i, m_i, q, k_src, v_src, stride_kn, stride_vn, offs_m, offs_d,
                start, full_start, n_k, lo, hi, qk_scale, cap_scale, HEAD_DIM, BLOCK_N, BLOCK_D,
                True, IS_CAUSAL, LOCAL, EMPTY_ROWS, SOFTCAP, UPCAST, PRECISION, LARGE, TMA, False,
            )  # fmt: skip
        acc, l_i, m_i = _fwd_tiles(  # keys every row of the tile sees: no masks
            acc, l_i, m_i, q, k_src, v_src, stride_kn, stride_vn, offs_m, offs_d,
            full_start, full_end, n_k, lo, hi, qk_scale, cap_scale, HEAD_DIM, BLOCK_N, BLOCK_D,
            False, IS_CAUSAL, LOCAL, EMPTY_ROWS, SOFTCAP, UPCAST, PRECISION, LARGE, TMA, False,
        )  # fmt: skip
        acc, l_i, m_i = _fwd_tiles(  # the diagonal and a ragged last tile
            acc, l_i, m_i, q, k_src, v_src, stride_kn, stride_vn, offs_m, offs_d,
            full_end, end, n_k, lo, hi, qk_scale, cap_scale, HEAD_DIM, BLOCK_N, BLOCK_D,
            True, IS_CAUSAL, LOCAL, EMPTY_ROWS, SOFTCAP, UPCAST, PRECISION, LARGE, TMA, False,
        )  # fmt: skip

    if EMPTY_ROWS or VARLEN:  # a row that saw no key: o = 0, L = +inf (flash-attn's convention)
        seen = l_i > 0
        l_i = tl.where(seen, l_i, 1.0)
        m_i = tl.where(seen, m_i, float("inf"))
    # Otherwise key 0 is visible to every row, so l_i >= 1 here and the division is safe.
    acc = acc / l_i[:, None]
    lse = (m_i + tl.math.log2(l_i)) / LOG2E  # back to natural-log units
    if VARLEN:  # L: (heads, N_Q)
        l_rows = L + h * N_Q + q_start
    else:
        l_rows = L + bh * N_Q
    tl.store(l_rows + offs_m, lse, mask=offs_m < n_q)
    o_base = at_row(O + b * stride_ob + h * stride_oh, q_start, stride_on, VARLEN)
    store_tile(o_base, offs_m, stride_on, offs_d, n_q, acc, HEAD_DIM, LARGE)


class ForwardPlan:
    """The forward launch for one combination of shapes, strides, dtypes, device and options.

    Call as `plan(q, k, v, scale, cu_seqlens, max_seqlens, traced) -> (o, lse)` with tensors
    like the ones it was built from (`forward_plan` finds or builds it); `cu_seqlens` and
    `max_seqlens` are pairs (q, k) for packed sequences, else None. o is allocated contiguous
    in the caller's layout, lse contiguous `(..., heads, n_q)` (packed: `(heads, total_q)`).
    `backward_plans` holds the backward plans of this forward's outputs (`backward_plan`).
    """

    def __init__(
        self,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        call: Call,
        precision: str,
        same_lengths: bool,
        traced: bool,
        seq_len: int | None = None,
    ) -> None:
        """`seq_len`: the longest sequence (packed sequences: their longest), which picks the
        tiles; the longer of the query and key lengths when None."""
        self.call, self.precision = call, precision
        self.layout = layout = call.layout
        self.varlen = layout == "thd"
        views = tuple(as_bhsd(t, layout) for t in (q, k, v))  # (..., heads, n, d)
        qv, kv = views[:2]
        *lead, n_q, d = qv.shape
        n_k = kv.shape[-2]
        heads, group = head_counts(qv, kv)
        self.heads = heads
        self.empty = qv.numel() == 0
        self.out_shapes = (q.shape, qv.shape[:-1])
        self.copies, strides = read_layouts(views)
        strides.append(output_strides(q.shape, layout))  # o
        self.ints = (*(s for st in strides for s in st), heads, n_q, n_k)
        self.batch_heads, self.n_q = math.prod(lead), n_q
        self.meta = kernel_meta(
            d, q.dtype, precision, call.band, softcap=call.softcap, varlen=self.varlen,
            same_lengths=same_lengths,
        )  # fmt: skip
        self.meta.update(
            GROUP=group, LARGE=needs_int64([qv.shape, kv.shape, kv.shape, qv.shape], strides)
        )
        # Tiles with `tma` read keys and values through TMA descriptors where the layout
        # allows (and, when traced, the alignment is known: see `tma_layouts`).
        self.tma_loads = tma_layouts(views[1:], strides[1:3], traced=traced)
        # A warp-specialised tile also reads its queries through a descriptor (`load_rows`).
        self.ws_loads = self.tma_loads and tma_layouts(views[:1], strides[:1], traced=traced)
        self.backward_plans: dict = {}
        # no guard when traced with symbolic lengths
        self.seq_len = torch.sym_max(n_q, n_k) if seq_len is None else seq_len
        # FA2_GLUON_FORWARD: the Gluon kernel where the call allows it (`_gluon_allowed`).
        requested = gluon_forward_requested()
        self.gluon_mode = requested
        if requested == "auto":  # FA3's overlap; in the persistent grid for short sequences
            short = gluon_persistent_default(self.seq_len)
            self.gluon_mode = "persistent" if short else "overlap"
        self.gluon = requested is not None and self._gluon_allowed(
            views, strides[:3], group, auto=requested == "auto"
        )
        self.device, self.n_k, self.element_size = q.device, n_k, q.element_size()
        # Whether the persistent Gluon grid cannot take the call (None: it can), where asked.
        self.persistent_refusal = "not asked for"
        if self.gluon and self.gluon_mode == "persistent":
            from fa2.triton.gluon_forward import persistent_refusal

            batch = self.batch_heads // max(heads, 1)
            shapes = [(batch, heads, n) for n in (n_q, n_k, n_k, n_q)]
            self.persistent_refusal = persistent_refusal(shapes, strides)

        def run(tile: Tile) -> None:  # for FA2_AUTOTUNE's timing only
            inputs = contiguous_where((q, k, v), self.copies, layout)
            dummy = self.outputs(q)[1]
            self._launch(tile)((*inputs, *self.outputs(q), dummy, dummy), (*self.ints, 1.0, 0.0))

        tile = choose_tile(
            FORWARD,
            head_dim_block=self.meta["BLOCK_D"],
            dtype=q.dtype,
            precision=precision,
            seq_len=self.seq_len,
            key=lambda: (call.band, seq_bucket(n_q, n_k)),
            run=None if traced or self.varlen or self.gluon else run,
            specialisable=self.ws_loads,
            device=q.device,
        )
        self.tile = tile
        self.launch = self._launch(tile)

    def _gluon_allowed(
        self, views: tuple, strides: list[tuple[int, int, int]], group: int, *, auto: bool
    ) -> bool:
        """Whether this call runs the Gluon forward. `auto` (FA2_GLUON_FORWARD unset): only
        where it measured faster than the Triton forward (`gluon_forward_default`: sequences of
        at least `GLUON_FORWARD_MIN_SEQ` tokens at the head dim; docs/design/fa2.md, "The Gluon
        forward"), and silently, except for a call traced with symbolic lengths on Hopper
        (`symbolic_shapes_refusal` says so once); forced: wherever the call allows it, warning
        why (once per reason) where it does not."""
        from fa2.triton.gluon_forward import gluon_forward_refusal

        meta = self.meta
        sizes = (*views[0].shape, *views[1].shape, *(s for st in strides for s in st))
        if auto and not gluon_forward_default(meta["HEAD_DIM"], self.seq_len):
            # a symbolic length is not known to reach the Gluon forward's: say why, where it
            # might have (`symbolic_shapes_refusal`)
            if gluon_default_possible(GLUON_FORWARD_MIN_SEQ, meta["HEAD_DIM"]):
                symbolic_shapes_refusal(sizes, views[0].device, "forward")
            return False
        reason = symbolic_shapes_refusal(sizes, views[0].device, "forward")
        if reason is None:
            reason = gluon_forward_refusal(
                *views, strides, group=group, packed=self.varlen, softcap=bool(meta["SOFTCAP"]),
                windowed=bool(meta["LOCAL"] or meta["WIN_RIGHT"]),
                causal_bottom_right=bool(meta["BOTTOM_RIGHT"]),
            )  # fmt: skip
        if reason is not None and not auto and reason not in _gluon_refusals:
            _gluon_refusals.add(reason)
            warnings.warn(
                f"FA2_GLUON_FORWARD is set, but the Triton forward runs instead: {reason}",
                UserWarning,
                stacklevel=2,
            )
        return reason is None

    def _launch(self, tile: Tile) -> CachedLaunch:
        """The launch of this plan's forward: the Gluon kernel where the plan takes it (with
        `tile`'s plain Triton launch for misaligned tensors), else the Triton kernel."""
        if not self.gluon:
            return self._triton_launch(tile)
        from fa2.triton.gluon_forward import (
            BLOCK_M,
            gluon_constexprs,
            gluon_forward_kernel,
            gluon_launch_options,
            persistent_grid,
            persistent_group,
        )

        mode, items = self.gluon_mode, cdiv(self.n_q, BLOCK_M) * self.batch_heads
        grid = (cdiv(self.n_q, BLOCK_M), self.batch_heads)
        group = 1
        if mode == "persistent":
            if self.persistent_refusal is None:
                grid = persistent_grid(self.device, items)
                group = persistent_group(self.n_k, self.meta["HEAD_DIM"], self.element_size)
            else:  # the one-item grid, in the mode persistent programs take
                mode = "overlap"
        return CachedLaunch(
            gluon_forward_kernel(), grid,
            gluon_constexprs(self.meta["HEAD_DIM"], bool(self.meta["IS_CAUSAL"]), mode=mode),
            **gluon_launch_options(), scratch=True,
            unaligned=self._triton_launch(tile._replace(tma=False)), checked=(0, 1, 2),
            trailing=(self.batch_heads, group),
        )  # fmt: skip

    def _triton_launch(self, tile: Tile) -> CachedLaunch:
        tma = tile.tma and self.tma_loads
        ws = tile.ws and tma  # plain loads (misaligned tensors): the plain kernel
        grid = None if self.varlen else (cdiv(self.n_q, tile.block_m), self.batch_heads)
        constexprs = dict(self.meta, TMA=tma, BLOCK_M=tile.block_m, BLOCK_N=tile.block_n, WS=ws)
        return CachedLaunch(
            _fwd_kernel, grid, constexprs, num_warps=tile.warps, num_stages=tile.stages,
            scratch=tma,
            unaligned=self._triton_launch(tile._replace(tma=False)) if tma else None,
            checked=(0, 1, 2, 5, 6) if self.varlen else (0, 1, 2),  # q, k, v (, cu_seqlens)
        )  # fmt: skip

    def outputs(self, q: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        o_shape, lse_shape = self.out_shapes
        return q.new_empty(o_shape), q.new_empty(lse_shape, dtype=torch.float32)

    def __call__(
        self,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        scale: float,
        cu_seqlens: tuple[torch.Tensor, torch.Tensor] | None,
        max_seqlens: tuple[int, int] | None,
        traced: bool,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        o, lse = self.outputs(q)
        if self.empty:
            return o, lse
        launch = self.launch.traceable if traced else self.launch
        inputs = q, k, v
        if self.copies is not None:
            inputs = contiguous_where(inputs, self.copies, self.layout)
        scalars = (*self.ints, *kernel_scales(scale, self.call.softcap))
        if cu_seqlens is None:  # the plan's own grid; unused pointers in the cu_seqlens slots
            launch((*inputs, o, lse, *unused_pointers(lse, traced)), scalars)
        else:
            n_seqs = cu_seqlens[0].shape[0] - 1
            grid = (cdiv(max_seqlens[0], self.tile.block_m), n_seqs * self.heads)
            launch((*inputs, o, lse, *cu_seqlens), scalars, grid)
        return o, lse


_plans = plan_cache(ForwardPlan)
# Why FA2_GLUON_FORWARD=1 calls ran the Triton forward, each warned about once.
_gluon_refusals: set[str] = set()


def forward_plan(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    options: tuple,
    seq_len: int | None,
    check: Callable[[], tuple[Call, str, bool]],
) -> ForwardPlan:
    """The cached plan for tensors like q, k, v and `options` (hashable: everything about the
    call but the scale and the packed sequences' boundaries), built on first use after
    `check()` validated the call and returned (call, dot precision, same_lengths); `seq_len`
    as `ForwardPlan` takes it."""
    try:
        key = (
            q.shape, k.shape, v.shape, q.stride(), k.stride(), v.stride(),
            q.dtype, k.dtype, v.dtype, q.device, k.device, v.device, options, tile_settings(),
        )  # fmt: skip
        plan = _plans.cache.get(key)
    except (AttributeError, TypeError):  # not tensors, or an unhashable option
        check()  # says what is wrong
        raise
    if plan is None:
        call, precision, same_lengths = check()
        plan = _plans(key, q, k, v, call, precision, same_lengths, False, seq_len)
    return plan
