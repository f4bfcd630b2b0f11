"""A hand warp-specialised FlashAttention forward for Hopper (sm_90), written in Gluon.

Gluon (`triton.experimental.gluon`, in the Triton 3.6 wheel) exposes what Triton's compiler
otherwise decides: shared-memory buffers, mbarriers, TMA copies, asynchronous warpgroup MMAs and
the partitions of a warp-specialised kernel. Triton 3.6's automatic warp specialisation turned
fa2's forward into a correct but slower kernel (every tile masked, one loop); here the split is
written by hand after FA3's Hopper forward:

- a producer partition of one warp streams Q once and the K and V tiles through a ring of
  `STAGES` shared-memory slots, each slot with a "ready" mbarrier (the TMA copy landed) and a
  "free" mbarrier (both consumers are done with it); K and V have barriers of their own, so
  S = QKᵀ of a tile may start before its V has landed and a K slot is refilled as soon as
  its QKᵀ is done;
- two consumer partitions (one warpgroup, 4 warps, each), the kernel's default partition and
  a worker, each own 64 of the program's 128 query rows: S = QKᵀ by wgmma from shared
  memory, the online softmax in registers (exp2, log2 e folded into the scale: one fused
  multiply-add per exponent, as fa2's Triton kernels), O += PV by wgmma with P taken from
  registers, one tile behind S; each writes its own rows of o (through shared memory and a TMA
  store, which drops rows past the end) and of L. How a consumer orders its wgmmas and
  softmax is one of GLUON_MODES: FA3's intra-warpgroup overlap, that and FA3's
  inter-warpgroup ping-pong, or neither (`_consumer`).

One program per 128 query rows of one (batch, head), or, in the persistent grid (the default
up to `configs.GLUON_PERSISTENT_MAX_SEQ` tokens, `FA2_GLUON_FORWARD=persistent`), one program
per multiprocessor taking several such work items (`_item`: (batch, head)s in groups whose keys
and values fit in L2, heaviest first, dealt in snake rounds), the producer loading the next
item's Q and keys while the consumers finish the last (Q's slot handed back early, o staged
apart); its descriptors span every head's rows, so it takes calls whose heads' rows follow each
other in whole tiles (`persistent_refusal`). Short sequences gain (a program's fixed costs are
hidden behind the last item's work); from 16k tokens the hardware's scheduling of one-item
programs balances better (docs/design/fa2.md, "The persistent grid").

Causal (top-left: query i sees keys j <= i, fa2's convention): key tiles past the program's last
row are never loaded; tiles every row of a consumer sees in full skip the mask, the diagonal
and a ragged last key tile take it (a branch in the loop: the autoWS limits, one loop and every
tile masked, do not apply to a kernel that places its own barriers). Rows and keys past the
sequence's end come from TMA's zero fill, so no garbage enters the matmuls.

Scope: bf16 or fp16, head dim 64 or 128, one key/value head per query head, no window, softcap
or packed sequences, q, k, v in fa2's kernel layout (batch, heads, seq, d) with strides TMA can
read (`gluon_forward_available`, `gluon_forward_refusal`). L is written as fa2's forward writes
it (natural log, fp32, contiguous (batch·heads, n_q)), so fa2's backward takes it unchanged.
Gluon kernels do not run in Triton's interpreter: on a CPU this kernel can only be compiled
(`FA2_GLUON_FORWARD=1 python packages/fa2/scripts/sm90_screen.py --kernels forward`).
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch

from fa2.triton.gluon_api import (
    fence_async_shared,
    gl,
    gluon,
    mbarrier,
    tma,
    warpgroup_mma,
    warpgroup_mma_wait,
)

__all__ = [
    "BLOCK_M",
    "GLUON_HEAD_DIMS",
    "GLUON_MODES",
    "gluon_forward_available",
    "gluon_forward_kernel",
    "gluon_forward_refusal",
    "gluon_importable",
    "gluon_launch_options",
    "persistent_grid",
    "persistent_group",
    "persistent_refusal",
]

# Query rows per program: two consumer warpgroups of 64 rows each (a wgmma's M is 64 per
# warpgroup: 4 warps x 16 rows), FA3's Hopper tile.
BLOCK_M = 128
# Key rows per tile: FA3's causal Hopper tile at d = 128; at d = 64 the same, so that each
# exponential pass covers as many keys per barrier round trip.
BLOCK_N = 128
# Ring slots for K and V. d = 128: 2 slots x (K + V) x 128 x 128 x 2 bytes = 128 KiB, plus
# Q's 32 KiB, within the 227 KiB a block may take on sm_90, as FA3 takes at this head dim (3
# slots, 224 KiB with Q, would fit too: untimed). d = 64: a slot is half that, 3 slots (96 KiB).
STAGES = {64: 3, 128: 2}
GLUON_HEAD_DIMS = tuple(STAGES)
# How the consumers order their work (`gluon_constexprs`); FA2_GLUON_FORWARD picks one.
GLUON_MODES = ("overlap", "pingpong", "plain", "persistent")
# Warps of each consumer partition (one warpgroup: wgmma is issued per warpgroup) and of the
# producer (one warp issues every TMA copy).
CONSUMER_WARPS = 4
PRODUCER_WARPS = 1
# Registers per thread requested for the worker partitions (setmaxnreg): the second consumer
# as many as FA3's consumers take (240); the producer, which holds only loop counters and
# coordinates, 24, the least setmaxnreg takes (as FA3's producer). Triton gives the default
# partition (the first consumer) 240 too: 128 x 240 x 2 + 128 x 24 (the producer's
# warpgroup) = 64,512 of the 65,536 registers a multiprocessor has.
CONSUMER_REGS = 240
PRODUCER_REGS = 24
_LN2 = math.log(2.0)  # natural log from base-2 units: ln(x) = log2(x) * ln 2


def gluon_importable() -> bool:
    """Whether this Triton ships the Gluon the kernel is written for (`gluon_api`)."""
    return gluon is not None


def gluon_forward_refusal(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    strides: list[tuple[int, int, int]] | None = None,
    *,
    causal_bottom_right: bool = False,
    windowed: bool = False,
    softcap: bool = False,
    packed: bool = False,
    group: int = 1,
) -> str | None:
    """Why the Gluon forward cannot run this call, or None when it can. q, k, v are
    `(..., heads, n, d)` views; `strides` their (batch, head, row) strides as the kernels read
    them (`fa2.triton.launch.read_layouts`; None: read off the tensors, which must then be
    4-D). The device is read through `configs.device_capability`, which the sm_90 screen
    stands in for to compile on a CPU."""
    from fa2.triton import configs

    if configs.INTERPRET or configs.device_capability(q.device) != (9, 0):
        return f"it runs on sm_90 (Hopper) GPUs only, got {q.device}"
    if not gluon_importable():
        return "this Triton's Gluon is not the one fa2's Gluon kernels are written for (3.6's)"
    if q.dtype not in (torch.bfloat16, torch.float16) or k.dtype != q.dtype or v.dtype != q.dtype:
        return f"it takes bf16 or fp16 q, k, v of one dtype, got {q.dtype}, {k.dtype}, {v.dtype}"
    d = q.shape[-1]
    if d not in GLUON_HEAD_DIMS or k.shape[-1] != d or v.shape[-1] != d:
        return f"it takes head dims {GLUON_HEAD_DIMS}, got {d}"
    if group != 1:
        return "it takes one key/value head per query head (no grouped heads)"
    if causal_bottom_right or windowed or softcap or packed:
        return (
            "it takes plain or top-left causal attention (no bottom-right diagonal, window, "
            "softcap or packed sequences)"
        )
    if q.shape[-2] == 0 or k.shape[-2] == 0:
        return "it takes at least one query and one key"
    if strides is None:
        strides = [(t.stride(0), t.stride(1), t.stride(2)) for t in (q, k, v)]
    for t, layout in zip((q, k, v), strides, strict=True):
        # TMA: 16-byte aligned row starts (every stride a whole number of 16 bytes) and rows
        # that are not repeated; the data pointers' alignment is checked on every call.
        if any(s * t.element_size() % 16 for s in layout) or layout[2] == 0:
            return "TMA needs every stride a whole number of 16 bytes and rows not repeated"
        if t.stride(-1) != 1:
            return "TMA needs the head dim contiguous"
    return None


def gluon_forward_available(q: torch.Tensor) -> bool:
    """Whether the Gluon forward can run on q's device for q's dtype and head dim: an sm_90
    GPU, Gluon importable, bf16/fp16, d 64 or 128, q's strides TMA-aligned (the full check of
    a call, k and v and the options included, is `gluon_forward_refusal`)."""
    if q.dim() != 4:
        return False
    return gluon_forward_refusal(q, q, q) is None and q.data_ptr() % 16 == 0


def gluon_launch_options() -> dict[str, int]:
    """num_warps and num_stages of a launch: the default partition's warps (the first
    consumer warpgroup; the workers add their own), and 1 stage (Gluon does not pipeline
    loops itself; the ring is written out)."""
    return dict(num_warps=CONSUMER_WARPS, num_stages=1)


def _jit(fn):
    return fn if gluon is None else gluon.jit(fn)


def _constexpr(value):
    """`value` as the kernels may read a module global (only constexprs)."""
    return value if gl is None else gl.constexpr(value)


half_m = _constexpr(BLOCK_M // 2)
ln2 = _constexpr(_LN2)
warps = _constexpr([CONSUMER_WARPS, PRODUCER_WARPS])
regs = _constexpr([CONSUMER_REGS, PRODUCER_REGS])


@_jit
def _softmax(
    s, m_i, l_i, tile, n_full, rows, N_K, qk_scale,
    s_layout: gl.constexpr, p_layout: gl.constexpr, BLOCK_N: gl.constexpr,
    IS_CAUSAL: gl.constexpr, DTYPE: gl.constexpr,
):  # fmt: skip
    """One key tile's step of the online softmax: (P in the PV wgmma's register layout, new
    row max, new row sum, alpha, the factor that rescales the rows of O).

    m_i is in scaled log2 units: the max of the raw scores times qk_scale (= scale · log2 e,
    positive), so each exponent is one FMA, s · qk_scale - m. Tiles from `n_full` on are
    masked: keys past N_K and, causal, keys past the row are -inf. Every row sees at least one
    key of every tile it visits (key 0 of the first; a causal tile t < n_tiles starts at
    t · 128 <= the program's first row), so m is finite from the first tile on, and alpha =
    exp2(-inf) = 0 there (O starts at 0 anyway)."""
    if tile >= n_full:
        cols = tile * BLOCK_N + gl.arange(0, BLOCK_N, layout=gl.SliceLayout(0, s_layout))
        keep = cols[None, :] < N_K
        if IS_CAUSAL:
            keep = keep & (cols[None, :] <= rows[:, None])
        s = gl.where(keep, s, float("-inf"))
    m_new = gl.maximum(m_i, gl.max(s, axis=1) * qk_scale)
    p = gl.exp2(s * qk_scale - m_new[:, None])
    alpha = gl.exp2(m_i - m_new)
    l_i = l_i * alpha + gl.sum(p, axis=1)
    return gl.convert_layout(p.to(DTYPE), p_layout), m_new, l_i, alpha


@_jit
def _issue_scores(q_tile, k_ring, k_ready, i, s_zero, STAGES: gl.constexpr):
    """Issue S(i) = Q K(i)ᵀ once K(i) has landed: (S's pending wgmma, K(i)'s slot). Tile i is
    ring slot i % STAGES in its (i // STAGES)-th use, whose "ready" phase has that parity."""
    k_tile = k_ring.index(i % STAGES)
    mbarrier.wait(k_ready.index(i % STAGES), (i // STAGES) & 1)
    s = warpgroup_mma(q_tile, k_tile.permute((1, 0)), s_zero, use_acc=False, is_async=True)
    return s, k_tile


@_jit
def _issue_pv(p, v_ring, v_ready, j, acc, STAGES: gl.constexpr):
    """Issue O += P(j) V(j) once V(j) has landed: (O's pending wgmma, V(j)'s slot)."""
    v_tile = v_ring.index(j % STAGES)
    mbarrier.wait(v_ready.index(j % STAGES), (j // STAGES) & 1)
    return warpgroup_mma(p, v_tile, acc, is_async=True), v_tile


@_jit
def _item(j, n_m, batch_heads, group_heads, IS_CAUSAL: gl.constexpr, PERSISTENT: gl.constexpr):
    """(first query row, batch x head) of the program's j-th work item: 128 query rows of one
    (batch, head). One item per program, from its ids, unless PERSISTENT: then the items are
    numbered group by group of `group_heads` (batch, head)s, whose keys and values fit in L2
    together, heaviest first within a group (causal: the last rows of each of its heads,
    then the rows before them), and dealt to the programs in rounds, item t to program
    t mod programs in even rounds and to the programs in reverse order in odd ones (a snake:
    a program that drew a heavy item draws a light one next), so that every program's items
    add up to about the same time and the grid's tail is short."""
    if PERSISTENT:
        programs = gl.num_programs(0)
        pid = gl.program_id(0)
        t = j * programs + gl.where(j % 2 == 0, pid, programs - 1 - pid)
        per_group = group_heads * n_m
        g = t // per_group
        u = t % per_group
        heads_here = gl.minimum(group_heads, batch_heads - g * group_heads)
        pid_m = u // heads_here
        bh = (g * group_heads + u % heads_here).to(gl.int64)
    else:
        pid_m = gl.program_id(0)
        bh = gl.program_id(1).to(gl.int64)
    if IS_CAUSAL:
        pid_m = n_m - 1 - pid_m
    return pid_m * (2 * half_m), bh


@_jit
def _key_tiles(off_m, N_Q, N_K, BLOCK_N: gl.constexpr, IS_CAUSAL: gl.constexpr):
    """Key tiles the rows off_m ... off_m + 127 see: causal, up to the last row (and the
    sequence)."""
    hi = N_K
    if IS_CAUSAL:
        hi = gl.minimum(gl.minimum(off_m + 2 * half_m, N_Q), N_K)
    return gl.cdiv(hi, BLOCK_N)


@_jit
def _n_items(n_m, batch_heads, PERSISTENT: gl.constexpr):
    """Work items of this program (`_item`): one, or its share of every head's row tiles:
    one per whole round, and one of the last round's where its place in that round is
    among the items left."""
    if PERSISTENT:
        programs = gl.num_programs(0)
        pid = gl.program_id(0)
        total = n_m * batch_heads
        rounds = total // programs
        place = gl.where(rounds % 2 == 0, pid, programs - 1 - pid)
        return rounds + (place < total % programs).to(gl.int32)
    return 1


@_jit
def _consume_item(
    half, q_tile, o_tile, k_ring, v_ring, q_ready, k_ready, v_ready, k_free, v_free, q_free,
    turn, o_desc, L, bh, off_m, o_row0, n_tiles, base, j, N_Q, N_K, qk_scale,
    HEAD_DIM: gl.constexpr, BLOCK_N: gl.constexpr, STAGES: gl.constexpr,
    IS_CAUSAL: gl.constexpr, OVERLAP: gl.constexpr, PINGPONG: gl.constexpr,
    PERSISTENT: gl.constexpr,
):  # fmt: skip
    """One consumer warpgroup's share of one work item: rows off_m + half · 64 ... + 63 of
    one (batch, head), whose o rows start at o_row0 in `o_desc` and whose L row is bh.

    The item's key tile i is the ring's tile c = base + i (base: the tiles of the program's
    earlier items), in slot c % STAGES, filled for the (c // STAGES)-th time: its ready
    barriers complete phase (c // STAGES) & 1 when the copy lands (mbarrier parity); the
    consumer arrives once on the slot's free barriers when its wgmmas are done reading it.
    Q (the item's j-th) completes phase j & 1 of `q_ready`.
    P runs one tile behind S (FA3's order): iteration i issues S(i) = Q K(i)ᵀ and
    O += P(i-1) V(i-1). OVERLAP (FA3's intra-warpgroup overlap): both are issued before
    either is waited for, and the softmax of S(i) runs while the tensor cores still work on
    P(i-1) V(i-1); without it each wgmma is waited for before anything else is issued or
    computed (the plain order, which needs S(i) and P(i-1) in registers at different times,
    not together).

    PINGPONG (FA3's inter-warpgroup ping-pong, with OVERLAP, one item per program): the two
    consumers take turns issuing their wgmmas, so that one's softmax runs while the other's
    matmuls do. Step k (k = 0: S(0); 1 ... n_tiles - 1: the loop's iterations; n_tiles: the
    last PV) waits for phase k of this consumer's `turn` barrier and, once its wgmmas are
    issued, arrives on the other's. The second consumer's arrival before its first step
    completes phase 0 of the first's, so the first goes first; phase k of the first's then
    completes when the second has issued step k - 1, and phase k of the second's when the
    first has issued step k. A barrier is never a phase ahead of its waiter: each arrival
    needs the waiter's previous step.

    The output: one item per program, o goes out through Q's slot (read no more) and the
    TMA store is waited for; PERSISTENT, Q's slot is handed back (`q_free`) once the last
    S(i) is done, so that the producer loads the next item's Q during this one's last PV,
    and o goes out through `o_tile`, whose previous store is waited for first."""
    gl.static_assert(OVERLAP or not PINGPONG, "ping-pong takes turns at overlapped steps")
    gl.static_assert(not (PINGPONG and PERSISTENT), "ping-pong counts one item's steps")
    if PINGPONG:  # noqa: SIM102 (a constexpr test, then a runtime one: two `if`s compile so)
        if half == 1:
            mbarrier.arrive(turn.index(0), count=1)
    s_layout: gl.constexpr = gl.NVMMADistributedLayout(
        version=[3, 0], warps_per_cta=[4, 1], instr_shape=[16, BLOCK_N, 16]
    )
    o_layout: gl.constexpr = gl.NVMMADistributedLayout(
        version=[3, 0], warps_per_cta=[4, 1], instr_shape=[16, HEAD_DIM, 16]
    )
    # P as the A operand of the PV wgmma, from registers (2 16-bit values per 32-bit register)
    p_layout: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=o_layout, k_width=2)
    row0 = off_m + half * half_m
    rows = row0 + gl.arange(0, half_m, layout=gl.SliceLayout(1, s_layout))
    m_i = gl.full([half_m], float("-inf"), gl.float32, gl.SliceLayout(1, s_layout))
    l_i = gl.zeros([half_m], gl.float32, gl.SliceLayout(1, s_layout))
    acc = gl.zeros([half_m, HEAD_DIM], gl.float32, o_layout)
    s_zero = gl.zeros([half_m, BLOCK_N], gl.float32, s_layout)  # ignored (use_acc=False)
    # Key tiles every row of this consumer sees in full, which need no mask: tile t's last
    # key t · BLOCK_N + BLOCK_N - 1 is below N_K and, causal, at most the first row.
    n_full = N_K // BLOCK_N
    if IS_CAUSAL:
        n_full = gl.minimum(n_full, (row0 + 1) // BLOCK_N)

    # Tile 0: S(0) and its softmax; O is still 0, so alpha is not applied.
    mbarrier.wait(q_ready.index(half), j & 1)
    if PINGPONG:
        mbarrier.wait(turn.index(half), 0)
    s, k_tile = _issue_scores(q_tile, k_ring, k_ready, base, s_zero, STAGES)
    if PINGPONG:
        mbarrier.arrive(turn.index(1 - half), count=1)
    # The operands go through the waits too: a wgmma reads them until it completes.
    s, _, _ = warpgroup_mma_wait(num_outstanding=0, deps=(s, q_tile, k_tile))
    mbarrier.arrive(k_free.index(base % STAGES), count=1)
    p, m_i, l_i, alpha = _softmax(
        s, m_i, l_i, 0, n_full, rows, N_K, qk_scale, s_layout, p_layout, BLOCK_N, IS_CAUSAL,
        q_tile.dtype,
    )  # fmt: skip
    for i in range(1, n_tiles):
        c = base + i
        if OVERLAP:
            if PINGPONG:
                mbarrier.wait(turn.index(half), i & 1)
            s, k_tile = _issue_scores(q_tile, k_ring, k_ready, c, s_zero, STAGES)
            acc, v_prev = _issue_pv(p, v_ring, v_ready, c - 1, acc, STAGES)
            if PINGPONG:
                mbarrier.arrive(turn.index(1 - half), count=1)
            # wgmma groups complete in issue order: with one left in flight, S(i) is done.
            s, _, _ = warpgroup_mma_wait(num_outstanding=1, deps=(s, q_tile, k_tile))
        else:
            acc, v_prev = _issue_pv(p, v_ring, v_ready, c - 1, acc, STAGES)
            acc, _, _ = warpgroup_mma_wait(num_outstanding=0, deps=(acc, p, v_prev))
            mbarrier.arrive(v_free.index((c - 1) % STAGES), count=1)
            s, k_tile = _issue_scores(q_tile, k_ring, k_ready, c, s_zero, STAGES)
            s, _, _ = warpgroup_mma_wait(num_outstanding=0, deps=(s, q_tile, k_tile))
        mbarrier.arrive(k_free.index(c % STAGES), count=1)
        p_next, m_i, l_i, alpha = _softmax(
            s, m_i, l_i, i, n_full, rows, N_K, qk_scale, s_layout, p_layout, BLOCK_N,
            IS_CAUSAL, q_tile.dtype,
        )  # fmt: skip
        if OVERLAP:  # the PV wgmma ran beside the softmax
            acc, _, _ = warpgroup_mma_wait(num_outstanding=0, deps=(acc, p, v_prev))
            mbarrier.arrive(v_free.index((c - 1) % STAGES), count=1)
        # O holds the tiles up to i - 1 at the old max; tile i's P is at the new one.
        acc = acc * gl.convert_layout(alpha, gl.SliceLayout(1, o_layout))[:, None]
        p = p_next
    if PERSISTENT:  # every S(i) is done: Q's slot may take the next item's rows
        mbarrier.arrive(q_free, count=1)
    last = base + n_tiles - 1
    if PINGPONG:
        mbarrier.wait(turn.index(half), n_tiles & 1)
    acc, v_last = _issue_pv(p, v_ring, v_ready, last, acc, STAGES)
    if PINGPONG:
        mbarrier.arrive(turn.index(1 - half), count=1)
    acc, _, _ = warpgroup_mma_wait(num_outstanding=0, deps=(acc, p, v_last))
    mbarrier.arrive(v_free.index(last % STAGES), count=1)

    # Every row saw key 0 (top-left causal or none, N_K >= 1): l_i >= 1, no division by 0.
    o = acc / gl.convert_layout(l_i, gl.SliceLayout(1, o_layout))[:, None]
    if PERSISTENT:
        tma.store_wait(pendings=0)  # the previous item's o has left o_tile
    # One item per program: Q's slot is free now (the last wgmma that read it was waited
    # for), and o_tile is that slot. The TMA store drops rows past the descriptor's end.
    o_tile.store(o.to(o_tile.dtype))
    fence_async_shared()
    tma.async_copy_shared_to_global(o_desc, [o_row0 + half * half_m, 0], o_tile)
    lse = (m_i + gl.log2(l_i)) * ln2  # natural log, as fa2's backward reads it
    gl.store(L + bh * N_Q + rows, lse, mask=rows < N_Q)
    if not PERSISTENT:
        tma.store_wait(pendings=0)


@_jit
def _consumer(
    half, q_ring, o_ring, k_ring, v_ring, q_ready, k_ready, v_ready, k_free, v_free, q_free,
    turn, o_desc, L, batch_heads, group_heads, N_Q, N_K, qk_scale,
    HEAD_DIM: gl.constexpr, BLOCK_N: gl.constexpr, STAGES: gl.constexpr,
    IS_CAUSAL: gl.constexpr, OVERLAP: gl.constexpr, PINGPONG: gl.constexpr,
    PERSISTENT: gl.constexpr,
):  # fmt: skip
    """One consumer warpgroup (`half`: the first, the kernel's default partition, or the
    second, a worker) over the program's work items (`_consume_item`)."""
    n_m = gl.cdiv(N_Q, 2 * half_m)
    q_tile = q_ring.index(half)
    o_tile = q_tile
    if PERSISTENT:
        o_tile = o_ring.index(half)
    base = 0
    for j in range(_n_items(n_m, batch_heads, PERSISTENT)):
        off_m, bh = _item(j, n_m, batch_heads, group_heads, IS_CAUSAL, PERSISTENT)
        n_tiles = _key_tiles(off_m, N_Q, N_K, BLOCK_N, IS_CAUSAL)
        o_row0 = off_m
        if PERSISTENT:  # one descriptor over every head's rows
            o_row0 = bh * N_Q + off_m
        _consume_item(
            half, q_tile, o_tile, k_ring, v_ring, q_ready, k_ready, v_ready, k_free, v_free,
            q_free, turn, o_desc, L, bh, off_m, o_row0.to(gl.int32), n_tiles, base, j, N_Q, N_K,
            qk_scale, HEAD_DIM, BLOCK_N, STAGES, IS_CAUSAL, OVERLAP, PINGPONG, PERSISTENT,
        )  # fmt: skip
        base += n_tiles
    if PERSISTENT:
        tma.store_wait(pendings=0)


@_jit
def _consumer_worker(
    q_ring, o_ring, k_ring, v_ring, q_ready, k_ready, v_ready, k_free, v_free, q_free, turn,
    o_desc, L, batch_heads, group_heads, N_Q, N_K, qk_scale,
    HEAD_DIM: gl.constexpr, BLOCK_N: gl.constexpr, STAGES: gl.constexpr,
    IS_CAUSAL: gl.constexpr, OVERLAP: gl.constexpr, PINGPONG: gl.constexpr,
    PERSISTENT: gl.constexpr,
):  # fmt: skip
    """The second consumer (the rows 64-127 of each item), run by a worker partition."""
    _consumer(
        1, q_ring, o_ring, k_ring, v_ring, q_ready, k_ready, v_ready, k_free, v_free, q_free,
        turn, o_desc, L, batch_heads, group_heads, N_Q, N_K, qk_scale, HEAD_DIM, BLOCK_N,
        STAGES, IS_CAUSAL, OVERLAP, PINGPONG, PERSISTENT,
    )  # fmt: skip


@_jit
def _producer(
    q_desc, k_desc, v_desc, q_ring, k_ring, v_ring, q_ready, k_ready, v_ready, k_free,
    v_free, q_free, batch_heads, group_heads, N_Q, N_K,
    BLOCK_N: gl.constexpr, STAGES: gl.constexpr, IS_CAUSAL: gl.constexpr,
    PERSISTENT: gl.constexpr,
):  # fmt: skip
    """The TMA warp: per work item, Q's two halves, then K and V tile by tile into the ring.

    Before filling slot c % STAGES with the ring's c-th tile (counted over the program's
    items) for the (c // STAGES)-th time it waits until both consumers released that slot's
    previous tile: the free barrier's phase (c // STAGES - 1) & 1. On the first pass
    (c < STAGES) that is parity 1, which a freshly initialised barrier (in phase 0) reports
    complete at once. Q of item j waits likewise for phase j - 1 of `q_free` (both
    consumers done with item j - 1's Q), which only PERSISTENT programs reach."""
    n_m = gl.cdiv(N_Q, 2 * half_m)
    c = 0
    for j in range(_n_items(n_m, batch_heads, PERSISTENT)):
        off_m, bh = _item(j, n_m, batch_heads, group_heads, IS_CAUSAL, PERSISTENT)
        n_tiles = _key_tiles(off_m, N_Q, N_K, BLOCK_N, IS_CAUSAL)
        q_row0 = off_m
        kv_row0 = 0
        if PERSISTENT:  # one descriptor over every head's rows
            q_row0 = (bh * N_Q + off_m).to(gl.int32)
            kv_row0 = (bh * N_K).to(gl.int32)
        mbarrier.wait(q_free, (j & 1) ^ 1)
        for half in gl.static_range(2):
            mbarrier.expect(q_ready.index(half), q_desc.block_type.nbytes)
            tma.async_copy_global_to_shared(
                q_desc, [q_row0 + half * half_m, 0], q_ready.index(half), q_ring.index(half)
            )
        for i in range(n_tiles):
            slot = c % STAGES
            free_phase = ((c // STAGES) & 1) ^ 1
            mbarrier.wait(k_free.index(slot), free_phase)
            mbarrier.expect(k_ready.index(slot), k_desc.block_type.nbytes)
            tma.async_copy_global_to_shared(
                k_desc, [kv_row0 + i * BLOCK_N, 0], k_ready.index(slot), k_ring.index(slot)
            )
            mbarrier.wait(v_free.index(slot), free_phase)
            mbarrier.expect(v_ready.index(slot), v_desc.block_type.nbytes)
            tma.async_copy_global_to_shared(
                v_desc, [kv_row0 + i * BLOCK_N, 0], v_ready.index(slot), v_ring.index(slot)
            )
            c += 1


@_jit
def _rows(X, n, stride_n, BLOCK: gl.constexpr, HEAD_DIM: gl.constexpr):
    """A TMA descriptor of n rows of X at stride_n, read or written BLOCK rows at a time into
    the swizzled shared-memory layout wgmma reads. Rows past n are out of bounds: TMA fills
    them with zeros on loads and drops them on stores."""
    layout: gl.constexpr = gl.NVMMASharedLayout.get_default_for(
        [BLOCK, HEAD_DIM], X.dtype.element_ty
    )
    return tma.make_tensor_descriptor(X, [n, HEAD_DIM], [stride_n, 1], [BLOCK, HEAD_DIM], layout)


@_jit
def _gluon_fwd_kernel(
    Q, K, V, O, L, CU_Q, CU_K,
    stride_qb, stride_qh, stride_qn, stride_kb, stride_kh, stride_kn,
    stride_vb, stride_vh, stride_vn, stride_ob, stride_oh, stride_on,
    HEADS, N_Q, N_K, qk_scale, cap_scale, BATCH_HEADS, GROUP_HEADS,
    HEAD_DIM: gl.constexpr, BLOCK_N: gl.constexpr, STAGES: gl.constexpr,
    IS_CAUSAL: gl.constexpr, OVERLAP: gl.constexpr, PINGPONG: gl.constexpr,
    PERSISTENT: gl.constexpr,
):  # fmt: skip
    """o and L of 128 query rows of one (batch, head) per program, or, PERSISTENT, of every
    (batch, head)'s row tiles dealt over a grid of one program per multiprocessor (`_item`),
    whose producer loads the next item's Q and keys while the consumers finish the last.
    The arguments of fa2's Triton forward (`fa2.triton.forward._fwd_kernel`), so one launch
    plan serves both, then BATCH_HEADS (batch x heads) and GROUP_HEADS (how many of them a
    persistent grid takes together: `persistent_group`); CU_Q, CU_K (packed sequences) and
    cap_scale (softcap) are not used here."""
    dtype: gl.constexpr = Q.dtype.element_ty
    if PERSISTENT:
        # Every head's rows, batch x heads x n at the row stride (`persistent_refusal`: the rows
        # of consecutive heads follow each other in whole tiles, so no tile crosses a head).
        q_desc = _rows(Q, BATCH_HEADS * N_Q, stride_qn, half_m, HEAD_DIM)
        o_desc = _rows(O, BATCH_HEADS * N_Q, stride_on, half_m, HEAD_DIM)
        k_desc = _rows(K, BATCH_HEADS * N_K, stride_kn, BLOCK_N, HEAD_DIM)
        v_desc = _rows(V, BATCH_HEADS * N_K, stride_vn, BLOCK_N, HEAD_DIM)
    else:  # the program's (batch, head)'s rows
        bh = gl.program_id(1).to(gl.int64)
        b = bh // HEADS
        h = bh % HEADS
        q_desc = _rows(Q + b * stride_qb + h * stride_qh, N_Q, stride_qn, half_m, HEAD_DIM)
        o_desc = _rows(O + b * stride_ob + h * stride_oh, N_Q, stride_on, half_m, HEAD_DIM)
        k_desc = _rows(K + b * stride_kb + h * stride_kh, N_K, stride_kn, BLOCK_N, HEAD_DIM)
        v_desc = _rows(V + b * stride_vb + h * stride_vh, N_K, stride_vn, BLOCK_N, HEAD_DIM)

    q_ring = gl.allocate_shared_memory(dtype, [2, half_m, HEAD_DIM], q_desc.layout)
    # o's own staging buffers where a program takes several items (else Q's slots serve).
    o_ring = q_ring
    if PERSISTENT:
        o_ring = gl.allocate_shared_memory(dtype, [2, half_m, HEAD_DIM], o_desc.layout)
    k_ring = gl.allocate_shared_memory(dtype, [STAGES, BLOCK_N, HEAD_DIM], k_desc.layout)
    v_ring = gl.allocate_shared_memory(dtype, [STAGES, BLOCK_N, HEAD_DIM], v_desc.layout)
    bar_layout: gl.constexpr = mbarrier.MBarrierLayout()
    q_ready = gl.allocate_shared_memory(gl.int64, [2, 1], bar_layout)
    q_free = gl.allocate_shared_memory(gl.int64, [1], bar_layout)
    k_ready = gl.allocate_shared_memory(gl.int64, [STAGES, 1], bar_layout)
    v_ready = gl.allocate_shared_memory(gl.int64, [STAGES, 1], bar_layout)
    k_free = gl.allocate_shared_memory(gl.int64, [STAGES, 1], bar_layout)
    v_free = gl.allocate_shared_memory(gl.int64, [STAGES, 1], bar_layout)
    turn = gl.allocate_shared_memory(gl.int64, [2, 1], bar_layout)  # ping-pong, per consumer
    for half in gl.static_range(2):
        mbarrier.init(q_ready.index(half), count=1)  # the producer's expect-tx arrival
        mbarrier.init(turn.index(half), count=1)  # the other consumer's arrival
    mbarrier.init(q_free, count=2)  # one arrival per consumer and item (PERSISTENT)
    for slot in gl.static_range(STAGES):
        mbarrier.init(k_ready.index(slot), count=1)
        mbarrier.init(v_ready.index(slot), count=1)
        mbarrier.init(k_free.index(slot), count=2)  # one arrival per consumer
        mbarrier.init(v_free.index(slot), count=2)
    fence_async_shared()  # the initialised barriers, before TMA (async proxy) signals them

    gl.warp_specialize(
        [
            (
                _consumer,
                (0, q_ring, o_ring, k_ring, v_ring, q_ready, k_ready, v_ready, k_free, v_free,
                 q_free, turn, o_desc, L, BATCH_HEADS, GROUP_HEADS, N_Q, N_K, qk_scale,
                 HEAD_DIM, BLOCK_N, STAGES, IS_CAUSAL, OVERLAP, PINGPONG, PERSISTENT),
            ),
            (
                _consumer_worker,
                (q_ring, o_ring, k_ring, v_ring, q_ready, k_ready, v_ready, k_free, v_free,
                 q_free, turn, o_desc, L, BATCH_HEADS, GROUP_HEADS, N_Q, N_K, qk_scale,
                 HEAD_DIM, BLOCK_N, STAGES, IS_CAUSAL, OVERLAP, PINGPONG, PERSISTENT),
            ),
            (
                _producer,
                (q_desc, k_desc, v_desc, q_ring, k_ring, v_ring, q_ready, k_ready, v_ready,
                 k_free, v_free, q_free, BATCH_HEADS, GROUP_HEADS, N_Q, N_K, BLOCK_N, STAGES,
                 IS_CAUSAL, PERSISTENT),
            ),
        ],
        warps,
        regs,
    )  # fmt: skip


def gluon_forward_kernel():
    """The Gluon kernel. Its runtime arguments are those of fa2's Triton forward, then
    BATCH_HEADS; its constexprs HEAD_DIM, BLOCK_N, STAGES, IS_CAUSAL, OVERLAP, PINGPONG and
    PERSISTENT (`gluon_constexprs`)."""
    if gluon is None:
        raise RuntimeError("this Triton has no Gluon: install Triton 3.6")
    return _gluon_fwd_kernel


def gluon_constexprs(head_dim: int, causal: bool, *, mode: str = "overlap") -> dict[str, object]:
    """The kernel's constexpr arguments for a head dim, causality and one of GLUON_MODES
    (`_consume_item`): "overlap", FA3's intra-warpgroup overlap; "pingpong", that and FA3's
    inter-warpgroup ping-pong; "plain", neither, the order they are measured against;
    "persistent", overlap in a grid of one program per multiprocessor (`_item`), where
    `persistent_refusal` allows it."""
    if mode not in GLUON_MODES:
        raise ValueError(f"mode must be one of {GLUON_MODES}, got {mode!r}")
    return dict(
        HEAD_DIM=head_dim,
        BLOCK_N=BLOCK_N,
        STAGES=STAGES[head_dim],
        IS_CAUSAL=causal,
        OVERLAP=mode != "plain",
        PINGPONG=mode == "pingpong",
        PERSISTENT=mode == "persistent",
    )


def persistent_refusal(
    shapes: Sequence[tuple[int, ...]], strides: Sequence[tuple[int, int, int]]
) -> str | None:
    """Why the persistent grid (`gluon_constexprs(mode="persistent")`) cannot take a call
    whose q, k, v and o are `shapes` (`(batch, heads, n, d)`) read with (batch, head, row)
    `strides`, or None when it can: its programs read every head's rows through one
    descriptor, so the rows of consecutive (batch, head)s must follow each other, and each
    length must be a whole number of tiles, so that no tile reaches into the next head."""
    for shape, (stride_b, stride_h, stride_n) in zip(shapes, strides, strict=True):
        batch, heads, n = shape[:3]
        if n % BLOCK_M or n % BLOCK_N:
            return f"it takes lengths that are multiples of {max(BLOCK_M, BLOCK_N)}, got {n}"
        if (heads > 1 and stride_h != n * stride_n) or (
            batch > 1 and stride_b != heads * n * stride_n
        ):
            return "it reads (batch, heads, n, d) rows that follow each other, head after head"
        if batch * heads * n >= 2**31:
            return "it addresses rows with 32-bit coordinates"
    return None


# The bytes of keys and values a group of (batch, head)s may take in a persistent grid: half
# an H100's 50 MB L2, the rest for queries, outputs and what else runs.
PERSISTENT_GROUP_BYTES = 24 * 2**20


def persistent_group(n_k: int, head_dim: int, element_size: int) -> int:
    """How many (batch, head)s a persistent grid works on together (`_item`): as many as
    keep their keys and values within PERSISTENT_GROUP_BYTES, at least one."""
    return max(1, PERSISTENT_GROUP_BYTES // (2 * n_k * head_dim * element_size))


def persistent_grid(device: torch.device, items: int) -> tuple[int]:
    """The persistent grid: one program per multiprocessor (a program takes one), at most one
    per work item. Where the device is not a GPU (compiling for sm_90 on a CPU), an H100's
    132."""
    count = 132
    if device.type == "cuda":
        count = torch.cuda.get_device_properties(device).multi_processor_count
    return (max(1, min(count, items)),)
