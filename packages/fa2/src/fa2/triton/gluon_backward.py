"""A single-pass, warp-specialised FlashAttention backward for Hopper (sm_90), written in Gluon.

fa2's default backward is deterministic and issues 7 matmuls per (query tile, key tile) pair: a
dQ pass and a dK/dV pass each recompute S and dP. FA3 and cuDNN issue 5: one pass over the key
tiles computes dK and dV and adds each key tile's share of dQ into an fp32 accumulator. fa2's
Triton single pass (`DKDV_ATOMIC` in `backward.py`) measured slower than the two passes in 16
bits (docs/results/fa2_single_pass_h100_2026-11-23.md) because, without warp specialisation,
the dQ additions and the fifth matmul wait in line behind the rest; Triton 3.6's automatic warp
specialisation does not compile that loop. This kernel does the specialisation by hand, after
FA3's Hopper backward (one program per 128 keys, 64-query tiles, a TMA producer, two MMA
warpgroups and warps that reduce dQ; at head dim 64, `launch(block_m=128)` steps 128 queries
at a time, FA3's hdim-64 tile):

- the default partition, 8 warps = two warpgroups of 64 keys each, computes per query tile
  Sᵀ = K Qᵀ, dPᵀ = V dOᵀ, Pᵀ = exp(Sᵀ·scale − L), dSᵀ = Pᵀ ∘ (dPᵀ − D), dV += Pᵀ dO,
  dK += dSᵀ Q and dQ_partial = dS K (dSᵀ goes through shared memory, read transposed), then
  hands the fp32 dQ partial over in shared memory and goes on to the next tile;
- a loader warp streams Q and dO (TMA, `STAGES` buffers) and L, D (plain loads into shared
  memory; L taken to log2 units, +inf past the last query so that those rows get P = 0);
- two dQ warps add each handed-over partial into the global fp32 dQ, overlapping the next
  tile's matmuls, with TMA bulk reductions of the whole 64-row partial straight from shared
  memory (`cp.reduce.async.bulk.tensor.2d ... .add`), as FA3 adds its dQ tiles. Triton lowers
  the op to boxes of 32 fp32 columns (the width of the buffer's 128-byte swizzle): 4 at
  d = 128, 2 at d = 64, shared between the two warps, each issuing its half from one elected
  thread. (A first form added dQ with 16-byte atomics from registers: 1.38x cuDNN's backward
  time at the leaderboard's shape on an H200, against 1.10x for the bulk form, in
  docs/results/fa2_gluon_bwd_variants_h200_2026-11-28.md.)

How the hand-over of `dq_smem` is ordered (a buffer that the compute warps write through the
generic proxy and the TMA unit reads through the async proxy):

1. the compute warps store their halves of dQ_partial into `dq_smem` (generic proxy);
2. each of them executes `fence.proxy.async.shared::cta` (`fence_async_shared`), which orders
   its own generic-proxy writes before later async-proxy reads of them;
3. a barrier of the 8 compute warps, then one arrival on `dq_ready` (release);
4. the reducer waits on `dq_ready` (acquire): every compute warp's fenced stores happen before;
5. one elected thread per reducer warp issues its boxes of the bulk reduction
   (`async_reduce_add`), then every reducer thread runs `cp.async.bulk.commit_group` (both
   emitted by Triton's lowering of the op; a bulk group belongs to the thread that issued it);
6. every reducer thread runs `cp.async.bulk.wait_group.read 0` (`tma.store_wait(0)`): its own
   group's reads of `dq_smem` are done. The additions into global memory may still be in
   flight; nothing in the kernel reads dQ, and the next kernel (dQ's cast) sees them, as
   Triton's and CUTLASS's TMA store epilogues rely on (the dK, dV stores below included);
7. a barrier of the two reducer warps (each warp's issuing thread has waited for its group;
   the arrival is made by one thread of the first warp), then one arrival on `dq_empty`: the
   compute warps may overwrite `dq_smem` (a write after the async-proxy reads, complete in 6).

Two orders of dQ's additions (`launch(deterministic=...)`):

- as they come (`deterministic=False`): dQ's last bits depend on the order the additions land
  in, which varies from run to run;
- fixed (`deterministic=True`, the ORDERED reducer): each query tile has a semaphore, and the
  key tiles add into it one at a time, the highest first, as FA3's deterministic backward does;
  a key tile waits for its turn (`ld.acquire` in a loop), adds, waits until its additions are
  complete (`cp.async.bulk.wait_group 0`), then counts itself (`red.release`). The first
  contributor (the highest key tile) stores its partial instead (a TMA store, one bulk group
  as the reduction is), so the pre-pass need not zero dQ: 5% less time at (4, 32, 2048, 128),
  1% at 16k tokens (docs/results/fa2_gluon_bwd_variants_h200_2026-11-29_dqfirst_a.md, _b.md).
  The launch starts the highest key tiles first, the order in which they reach each query
  tile, so the waits are short. The ordered form took as long as the unordered one at
  (4, 32, 2048, 128), 3-4% more at the leaderboard's shape and 6% more at (1, 16, 16384, 128),
  where each head's longest key tile, started last, weighs more (the same runs). Visiting the
  query tiles top-down instead, the lower key tiles adding first and the longest programs
  launched first, was 11-22% slower at 2,048 tokens and at head dim 64; alone it took 1-2%
  less at 16k and 32k tokens, and beside the forms kept (`_compute`) from 0.2% less to 2.6%
  more (_forms.md and the same runs), so it is not the order of every head.
- Most of the ordered form's extra time was its launch order, not its waits: the unordered form
  launched highest first took 4.8-5.2% more at 16k tokens (_launchorder.md). Launched so, the
  grid ends on each head's longest program. So the ordered launch, causal, ends on a reversed
  tail (`REVERSED_KEY_TILES`): its last heads take their key tiles lowest first, the ranks of all
  of them interleaved, visit their query tiles top-down and add dQ from the bottom up, which
  still only waits for programs launched before. The grid then ends on short programs: 2.8-6.6%
  less time at 16k tokens (head dim 64 and 128), at (1, 32, 8192, 64) and at (4, 32, 2048, 128),
  from 2.2% less to 0.4% more at the leaderboard's shape (the runs beside `REVERSED_KEY_TILES`).
  The tail's heads add dQ in the other order, so their bits differ from a launch without the
  tail, and repeat run to run.

fa2's backward plans choose this kernel on Hopper where it measured faster than the Triton
backward (`fa2.triton.configs.gluon_backward_default`), in the order the call asks for.
Supported: bf16/fp16, head dim 64 or 128, causal (top-left, fa2's convention) or not, any
sequence lengths (ragged last tiles: rows past the end read as zeros from TMA and are masked),
one key/value head per query head, (batch, heads, seq, d) tensors with unit stride along d and
16-byte aligned rows. `gluon_backward_available` says whether a call can run here.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch
import triton

from fa2.triton.configs import INTERPRET, LOG2E, block_d, cdiv, delta_rows, device_capability
from fa2.triton.gluon_api import (
    HAVE_GLUON,
    builtin,
    fence_async_shared,
    gl,
    gluon,
    ir,
    mbarrier,
    tma,
    warpgroup_mma,
    warpgroup_mma_wait,
)
from fa2.triton.launch import _scratch, head_strides, needs_int64

__all__ = [
    "BLOCK_M",
    "BLOCK_MS",
    "BLOCK_N",
    "GROUP_BYTES",
    "HAVE_GLUON",
    "HEAD_DIMS",
    "REVERSED_KEY_TILES",
    "STAGES",
    "gluon_backward",
    "gluon_backward_available",
    "interleaved_heads",
    "launch",
    "launch_order",
    "reversed_groups",
    "unsupported_reason",
]

# FA3's hdim-64/128 backward tile: 128 keys per program (two MMA warpgroups of 64 keys: a
# wgmma's M is 64 per warpgroup) and 64 queries per step (the smallest wgmma M, so dQ = dS K is
# one warpgroup-sized M across both warpgroups, which split its head-dim columns).
BLOCK_N = 128
BLOCK_M = 64
# The query tiles `launch(block_m=...)` takes per head dim. 128 queries per step (FA3's hdim-64
# tile, 128 x 128) only at d = 64: each wgmma of Sᵀ and dPᵀ then does twice the work per issue
# and each step per barrier round; at d = 128 the compute registers are full at 64 and Q, dO
# (2 stages) and the dQ partial would not fit the 227 KiB of shared memory at 128.
BLOCK_MS = {64: (64, 128), 128: (64,)}
# Q/dO buffers the loader may fill ahead of the compute warps: 2 (FA3's) keeps shared memory at
# K, V (64 KiB at d=128) + 2 x Q, dO (64 KiB) + dSᵀ (16 KiB) + the fp32 dQ partials (32 KiB
# each, DQ_SLOTS of them), 208 KiB with two of the 227 KiB a Hopper block may have.
STAGES = 2
# dQ partial buffers (`dq_smem` slots). One: the compute warps write tile i + 1's partial once
# the reducer has read tile i's. Two (32 KiB more at d = 128, 208 KiB in all) would let the
# reducer fall one step behind; in two runs on H200s they measured no steady gain
# (docs/results/fa2_gluon_bwd_variants_h200_2026-11-28_dqslots.md and _late.md: at
# (2, 32, 32768, 128) ordered 95.231 against 96.279 ms, then 94.289 against 94.290; unordered
# 90.488 against 90.846, then 93.070 against 90.773), so the plainer one stays; `launch(dq_slots=2)`
# measures the other.
DQ_SLOTS = 1
HEAD_DIMS = (64, 128)
# The launch interleaves the key tiles of as many (batch x head)s as keep their Q, dO, K and V
# within this many bytes (`interleaved_heads`), so that short heads' programs overlap each other's
# causal tails while what they read stays in L2. On an H200 (docs/results/
# fa2_gluon_bwd_variants_h200_2026-11-29_heads_a.md and _b.md), 4 heads of 2 MiB at
# (4, 32, 2048, 128) took 2.5-3.4% less time than one head at a time, 16 heads (32 MiB) 1-2%
# less and 64 heads 21-24% more; 4 heads of 8 MiB at (1, 16, 16384, 64) took 1-3% more, and
# of 16 MiB at (1, 16, 16384, 128) 10-11% more.
GROUP_BYTES = 8 * 1024 * 1024
# Ordered, each head's longest key tile is launched last (it waits for the higher ones), so the
# grid ended on long programs: launched highest first, the unordered form took 4.8-5.2% more time
# at (1, 16, 16384, 128) and (1, 16, 16384, 64), about what the ordered form costs there
# (docs/results/fa2_gluon_bwd_variants_h200_2026-11-29_launchorder.md). So the ordered launch
# (causal: otherwise every program is as long) ends on a reversed tail of heads (rounded up to
# whole groups) that take their key tiles lowest first and visit their query tiles top-down
# (`_gluon_bwd_kernel`): as many heads as hold this many key tiles, so that the tail's work lasts
# about as long as the longest program before it (a head of T key tiles does about T² steps, its
# longest program 2T, over 132 multiprocessors). On an H200, against the same launch without the
# tail (_reversed_a.md, _b.md, _c.md, _d64_a.md, _d64_b.md, _final.md): 2 heads at (1, 16, 16384,
# 128) took 3.3-5.0% less time in four runs (4 heads 2.3-3.0% less, 8 heads 8-11% more); 16 heads
# at (4, 32, 2048, 128) 2.8-6.6% less in three; 2 heads at (1, 16, 16384, 64) 4.6-6.1% less; 4
# heads at (1, 32, 8192, 64) 4.2-6.1% less (2 heads 1.2-2.7%); at (2, 32, 32768, 128) 1 head 2.2%
# less in one run, 2 heads from 1.4% less to 0.4% more in three.
REVERSED_KEY_TILES = 256
COMPUTE_WARPS = 8  # the default partition: two warpgroups
# Worker partitions, together one warpgroup with a spare warp (as FA3's producer warpgroup):
# the loader (TMA issue and two 64-float row loads per tile), one warp, and the dQ reducer, two
# warps, each issuing half of a partial's TMA boxes. Their register cap, 32, is the least at
# which neither spilled when compiled for sm_90 (24 spilled a few loop values); Triton gives the
# compute warpgroups what the 64K-register file has left (232 each).
LOADER_WARPS, LOADER_REGS = 1, 32
REDUCER_WARPS, REDUCER_REGS = 2, 32


if HAVE_GLUON:
    _LOG2E = gl.constexpr(LOG2E)  # the logsumexp to log2 units, for exp2

    @builtin
    def async_reduce_add(tensor_desc, coord, src, _semantic=None):
        """Add the shared-memory tile `src` into the global tensor of `tensor_desc` at `coord`
        with one TMA bulk reduction (`cp.reduce.async.bulk.tensor.{rank}d.global.shared::cta
        .add`, issued by one thread, then `cp.async.bulk.commit_group`); box elements past the
        tensor's bounds are not added. Wait with `tma.store_wait` before reusing `src`. Triton
        3.6's Gluon builds this op (`ttng.async_tma_reduce`, what `tl.tensor_descriptor
        .atomic_add` becomes) but its `tma` module does not wrap it; this is that wrapper, shaped
        as `tma.async_copy_shared_to_global` is."""
        coord = _semantic._convert_to_ir_values(coord, require_i64=False)
        _semantic.builder.create_async_tma_reduce(
            ir.DESCRIPTOR_REDUCE_KIND.ADD, tensor_desc.handle, coord, src.handle
        )

    @gluon.jit
    def _loader(
        q_desc,
        do_desc,
        k_desc,
        v_desc,
        l_rows,
        d_rows,
        k_smem,
        v_smem,
        q_smem,
        do_smem,
        lse_smem,
        delta_smem,
        kv_ready,
        ready,
        empty,
        n0,
        start_m,
        n_tiles,
        descend,
        n_q,
        BLOCK_M: gl.constexpr,
        STAGES: gl.constexpr,
    ):
        """The TMA producer: this program's K and V once, then per query tile i (buffer i %
        STAGES) Q and dO by TMA and L·log2(e), D by plain loads into shared memory. `ready`
        completes when both the TMA bytes and this warp's arrival are in (count 2), `empty`
        when the compute warps have finished reading the buffer."""
        mbarrier.expect(kv_ready, k_desc.block_type.nbytes + v_desc.block_type.nbytes)
        tma.async_copy_global_to_shared(k_desc, [n0, 0], kv_ready, k_smem)
        tma.async_copy_global_to_shared(v_desc, [n0, 0], kv_ready, v_smem)
        # BLOCK_M rows over the warp's 32 lanes (2 each at 64 rows, 4 at 128)
        row_layout: gl.constexpr = gl.BlockedLayout([BLOCK_M // 32], [32], [1], [0])
        for i in range(n_tiles):
            s = i % STAGES
            # The buffer's previous use (tile i - STAGES) must be released: parity of that
            # use's phase; the first STAGES waits pass on the fresh barriers (parity 1).
            mbarrier.wait(empty.index(s), ((i // STAGES) & 1) ^ 1)
            m0 = start_m + _step_tile(i, n_tiles, descend) * BLOCK_M
            bar = ready.index(s)
            mbarrier.expect(bar, q_desc.block_type.nbytes + do_desc.block_type.nbytes)
            tma.async_copy_global_to_shared(q_desc, [m0, 0], bar, q_smem.index(s))
            tma.async_copy_global_to_shared(do_desc, [m0, 0], bar, do_smem.index(s))
            rows = m0 + gl.arange(0, BLOCK_M, row_layout)
            inside = rows < n_q
            # Rows past the last query: L = +inf gives P = exp2(-inf) = 0, D = 0 gives dS = 0.
            lse2 = gl.load(l_rows + rows, mask=inside, other=float("inf")) * _LOG2E
            delta = gl.load(d_rows + rows, mask=inside, other=0.0)
            lse_smem.index(s).store(lse2)
            delta_smem.index(s).store(delta)
            gl.thread_barrier()  # every lane's stores before the (one-thread) arrival
            mbarrier.arrive(bar, count=1)

    @gluon.jit
    def _step_tile(i, n_tiles, descend):
        """The query tile (counted from the program's first) that step i visits: upwards, or
        from the last down where `descend` (0 or 1, a head of the launch's reversed tail)."""
        return i + descend * (n_tiles - 1 - 2 * i)

    @gluon.jit
    def _keep(keys, m0, n_k, BLOCK_M: gl.constexpr, IS_CAUSAL: gl.constexpr, layout: gl.constexpr):
        """Which of Pᵀ's entries count, keys by queries from m0: keys before n_k (TMA read
        zeros past it, but exp2 of a zero score can overflow where the logsumexp is very
        negative) and, causal (top-left), keys at or before their query."""
        keep = keys[:, None] < n_k
        if IS_CAUSAL:
            queries = m0 + gl.arange(0, BLOCK_M, layout)
            keep = keep & (keys[:, None] <= queries[None, :])
        return keep

    @gluon.jit
    def _bulk_writes_done():
        """`cp.async.bulk.wait_group 0` (no `.read`): this thread's bulk operations have
        completed, their writes visible to it, then `fence.proxy.async.global`, which orders
        them before its later generic-proxy accesses (the release that follows)."""
        gl.inline_asm_elementwise(
            "cp.async.bulk.wait_group 0;\nfence.proxy.async.global;\nmov.u32 $0, 0;",
            "=r",
            [],
            dtype=gl.int32,
            is_pure=False,
            pack=1,
        )

    @gluon.jit
    def _wait_for_count(counters, count):
        """Spin until each lane's `counters` (int32 in global memory) holds `count` (acquire,
        GPU scope), then `fence.proxy.async.global`, which orders what was acquired before
        this thread's later async-proxy (TMA) accesses of global memory. One PTX loop (its
        label scoped by the braces): a loop written in Gluon here made ptxas spill the compute
        warps' registers."""
        gl.inline_asm_elementwise(
            "{\n.reg .pred p;\n.reg .b32 seen;\nWAIT:\n"
            "ld.acquire.gpu.global.b32 seen, [$1];\nsetp.ne.s32 p, seen, $2;\n@p bra WAIT;\n}\n"
            "fence.proxy.async.global;\nmov.u32 $0, 0;",
            "=r,l,r", [counters, count], dtype=gl.int32, is_pure=False, pack=1,
        )  # fmt: skip

    @gluon.jit
    def _reducer(
        dq_desc,
        dq_smem,
        dq_ready,
        dq_empty,
        dq_sem,
        bh,
        n0,
        start_m,
        n_tiles,
        descend,
        n_q,
        n_k,
        BLOCK_M: gl.constexpr,
        BLOCK_N: gl.constexpr,
        REDUCER_WARPS: gl.constexpr,
        IS_CAUSAL: gl.constexpr,
        ORDERED: gl.constexpr,
        DROP: gl.constexpr,
        DQ_SLOTS: gl.constexpr,
    ):
        """The dQ warps: per query tile, wait for the compute warps' fp32 partial
        sm_scale·dS K in `dq_smem`, add it into this head's global fp32 dQ rows with TMA
        bulk reductions straight from shared memory (steps 4 to 7 of the module docstring),
        and release the buffer. The descriptor's rows end at the last query, so the TMA unit
        drops the ragged last tile's rows past it.

        ORDERED (the deterministic form): the key tiles that add into one query tile do so one
        at a time, the highest first (FA3's order), counted by that tile's semaphore in
        `dq_sem` (int32, zeroed, one per (batch x head, query tile)): key tile n adds query
        tile m once the semaphore says every higher contributor has, waits until its own
        writes are complete, then counts itself. Highest first is the order in which the key
        tiles reach m when they run side by side (key tile n starts at its diagonal, query
        tile n·BLOCK_N/BLOCK_M, so a higher one reaches m in fewer steps), and the launch
        starts the higher ones first (`_gluon_bwd_kernel`), so a tile seldom waits long. In
        the heads of the launch's reversed tail (`descend` 1), each key tile visits its query
        tiles from the last down, the lower key tiles adding first and launched first.

        DROP, a timing probe only (`launch(drop_dq=True)`): each partial is released unread,
        so a run measures the backward without dQ's additions; its dQ stays zero."""
        if DROP:
            for i in range(n_tiles):
                mbarrier.wait(dq_ready.index(i % DQ_SLOTS), (i // DQ_SLOTS) & 1)
                mbarrier.arrive(dq_empty.index(i % DQ_SLOTS), count=1)
        else:
            lanes: gl.constexpr = gl.BlockedLayout([1], [32], [REDUCER_WARPS], [0])
            lane = gl.arange(0, 32 * REDUCER_WARPS, lanes)
            none = lane * 0  # a zero per lane: the atomics and the wait take tensors
            key_tile = n0 // BLOCK_N
            last_key_tile = gl.cdiv(n_k, BLOCK_N) - 1
            # This (batch x head)'s semaphores, computed here rather than before the
            # partitions split, so that the compute warps (registers full) hold nothing more.
            sem_rows = dq_sem + bh * gl.cdiv(n_q, BLOCK_M)
            first_m = start_m // BLOCK_M
            for i in range(n_tiles):
                m = first_m + _step_tile(i, n_tiles, descend)
                sem = sem_rows + m + none
                t = i % DQ_SLOTS  # the partial's slot
                # Tile m's contributors: key tiles 0 .. top (causal: those at or left of its
                # diagonal); ordered, they add from the top down (top - key_tile before this
                # one), or from the bottom up where `descend` (key_tile before it).
                if IS_CAUSAL:
                    top = gl.minimum((m * BLOCK_M) // BLOCK_N, last_key_tile)
                else:
                    top = last_key_tile
                before = top - key_tile + descend * (2 * key_tile - top)
                if ORDERED:  # this tile's turn, waited for while the partial is computed
                    _wait_for_count(sem, none + before)
                mbarrier.wait(dq_ready.index(t), (i // DQ_SLOTS) & 1)  # 4: the partial is in
                if ORDERED and before == 0:  # the first to add: stores, nothing zeroes dQ
                    tma.async_copy_shared_to_global(dq_desc, [m * BLOCK_M, 0], dq_smem.index(t))
                else:
                    async_reduce_add(dq_desc, [m * BLOCK_M, 0], dq_smem.index(t))  # 5
                tma.store_wait(0)  # 6: cp.async.bulk.wait_group.read 0, the slot read
                gl.thread_barrier()  # 7: both warps' waits before the one arrival
                mbarrier.arrive(dq_empty.index(t), count=1)
                if ORDERED:
                    _bulk_writes_done()  # each issuing thread: its additions complete
                    gl.thread_barrier()  # both warps' additions before the one release
                    gl.atomic_add(sem, none + 1, mask=lane == 0, sem="release", scope="gpu")

    @gluon.jit
    def _compute(
        dk_desc,
        dv_desc,
        k_smem,
        v_smem,
        q_smem,
        do_smem,
        lse_smem,
        delta_smem,
        ds_smem,
        dq_smem,
        kv_ready,
        ready,
        empty,
        dq_ready,
        dq_empty,
        n0,
        start_m,
        n_tiles,
        descend,
        n_k,
        qk_scale,
        sm_scale,
        HEAD_DIM: gl.constexpr,
        BLOCK_M: gl.constexpr,
        BLOCK_N: gl.constexpr,
        STAGES: gl.constexpr,
        IS_CAUSAL: gl.constexpr,
        DQ_SLOTS: gl.constexpr,
    ):
        """The two MMA warpgroups (the default partition, 8 warps): each owns 64 of the
        program's 128 keys in Sᵀ, dPᵀ, dK and dV (warps_per_cta [8, 1]); dQ's BLOCK_M x
        HEAD_DIM tile is split between them, by columns at 64 rows ([4, 2]), by rows at 128
        ([8, 1]), each reading the dSᵀ columns it needs from shared memory. Stores dK·sm_scale
        and dV at the end (TMA, which clips keys past n_k)."""
        dtype: gl.constexpr = k_smem.dtype
        # wgmma instruction shapes [m, n, k]: m = 16 rows per warp, k = 16 for 16-bit inputs,
        # n the accumulator's full width per warpgroup.
        s_layout: gl.constexpr = gl.NVMMADistributedLayout([3, 0], [8, 1], [16, BLOCK_M, 16])
        kv_layout: gl.constexpr = gl.NVMMADistributedLayout([3, 0], [8, 1], [16, HEAD_DIM, 16])
        # dQ = dS K, BLOCK_M x HEAD_DIM over the 8 warps: a wgmma's M is 64 per warpgroup, so
        # 64 query rows leave one warpgroup-sized M whose head-dim columns the two warpgroups
        # split ([4, 2] warps, n = HEAD_DIM / 2), and 128 rows give each warpgroup 64 rows of
        # the whole head dim ([8, 1], n = HEAD_DIM).
        dq_col_groups: gl.constexpr = 128 // BLOCK_M
        dq_layout: gl.constexpr = gl.NVMMADistributedLayout(
            [3, 0], [8 // dq_col_groups, dq_col_groups], [16, HEAD_DIM // dq_col_groups, 16]
        )
        # Pᵀ as the register (A) operand of dV += Pᵀ dO; k_width 2: two 16-bit values per
        # 32-bit register.
        a_layout: gl.constexpr = gl.DotOperandLayout(0, kv_layout, 2)
        # dV += Pᵀ dO issued before dPᵀ is waited for (at 64 queries a step), or after dSᵀ is
        # computed (at 128: Sᵀ and dPᵀ take 64 registers each, and Pᵀ's 16-bit copy held for
        # the early wgmma beside its fp32 values made ptxas spill inside the loop; late, its
        # few spills sit outside it:
        # docs/results/fa2_gluon_bwd_sm90_compile_cpu_2026-11-28_m128.md).
        DV_EARLY: gl.constexpr = BLOCK_M == 64
        # Two forms that measured faster at one query tile and slower at the other, on an H200
        # (docs/results/fa2_gluon_bwd_variants_h200_2026-11-29_forms.md, _dqfirst_a.md and
        # _dqfirst_b.md), so each is taken where it helped:
        # - at 64 queries, dQ = dS K issued before dK += dSᵀ Q and its partial stored while dK
        #   runs (FA3's order): 2-3% less time at (2, 32, 32768, 128), 0-3% at
        #   (4, 32, 2048, 128) and (1, 16, 16384, 128); at 128 queries it was 1-4% slower;
        # - at 128 queries, Pᵀ masked only on the steps the causal diagonal crosses and on a
        #   ragged last key tile's (a branch; elsewhere no key is masked): 3-5% less time at
        #   (1, 16, 16384, 64); at 64 queries the branch was 3-5% slower.
        DQ_FIRST: gl.constexpr = BLOCK_M == 64
        MASK_WHERE_NEEDED: gl.constexpr = BLOCK_M == 128 and IS_CAUSAL
        key_layout: gl.constexpr = gl.SliceLayout(1, s_layout)
        query_layout: gl.constexpr = gl.SliceLayout(0, s_layout)

        keys = n0 + gl.arange(0, BLOCK_N, key_layout)
        zero_s = gl.zeros([BLOCK_N, BLOCK_M], gl.float32, s_layout)
        zero_dq = gl.zeros([BLOCK_M, HEAD_DIM], gl.float32, dq_layout)
        dk = gl.zeros([BLOCK_N, HEAD_DIM], gl.float32, kv_layout)
        dv = gl.zeros([BLOCK_N, HEAD_DIM], gl.float32, kv_layout)
        ragged = n0 + BLOCK_N > n_k
        mbarrier.wait(kv_ready, 0)
        for i in range(n_tiles):
            s = i % STAGES
            mbarrier.wait(ready.index(s), (i // STAGES) & 1)
            q_s = q_smem.index(s)
            do_s = do_smem.index(s)
            s_t = warpgroup_mma(k_smem, q_s.permute((1, 0)), zero_s, use_acc=False, is_async=True)
            dp_t = warpgroup_mma(v_smem, do_s.permute((1, 0)), zero_s, use_acc=False, is_async=True)
            s_t = warpgroup_mma_wait(1, deps=(s_t,))  # Sᵀ done, dPᵀ may still run
            # One fused multiply-add per exponent (L is already in log2 units). L and D are
            # read from shared memory where they are used, not ahead: registers are tight.
            lse2 = lse_smem.index(s).load(query_layout)
            p_t = gl.exp2(s_t * qk_scale - lse2[None, :])
            mi = _step_tile(i, n_tiles, descend)
            m0 = start_m + mi * BLOCK_M
            if MASK_WHERE_NEEDED:
                # Masks only where they change something: the steps the causal diagonal
                # crosses, and every step of a ragged last key tile.
                if ragged | (mi < BLOCK_N // BLOCK_M):
                    p_t = gl.where(_keep(keys, m0, n_k, BLOCK_M, IS_CAUSAL, query_layout), p_t, 0.0)
            else:
                p_t = gl.where(_keep(keys, m0, n_k, BLOCK_M, IS_CAUSAL, query_layout), p_t, 0.0)
            if DV_EARLY:
                # dV += Pᵀ dO needs no dP: issued now, it runs while dSᵀ is computed.
                dv = warpgroup_mma(
                    gl.convert_layout(p_t.to(dtype), a_layout), do_s, dv, is_async=True
                )
                dp_t = warpgroup_mma_wait(1, deps=(dp_t,))  # in issue order: dPᵀ done, dV runs
            else:
                dp_t = warpgroup_mma_wait(0, deps=(dp_t,))
            delta = delta_smem.index(s).load(query_layout)
            ds_t = (p_t * (dp_t - delta[None, :])).to(dtype)
            if not DV_EARLY:  # Pᵀ's fp32 registers free as its 16-bit operand is made
                dv = warpgroup_mma(
                    gl.convert_layout(p_t.to(dtype), a_layout), do_s, dv, is_async=True
                )
            # dSᵀ through shared memory: the A operand of dK += dSᵀ Q as it stands (no copy in
            # registers, which are tight) and, transposed, of dQ = dS K, which needs both
            # warpgroups' halves.
            ds_smem.store(ds_t)
            fence_async_shared()  # the generic-proxy stores before the wgmmas read them
            gl.thread_barrier()
            # The reducer has read the slot's last partial (tile i - DQ_SLOTS); the first
            # DQ_SLOTS waits pass on the fresh barriers (parity 1).
            t = i % DQ_SLOTS
            if DQ_FIRST:  # dQ's partial is stored while dK += dSᵀ Q runs
                # The slot's wait comes first, so that only the store sits between the
                # wgmmas' issue and their last wait; and the proxy fence after that wait (one
                # between a wgmma's issue and its wait crashed ptxas 3.6's).
                mbarrier.wait(dq_empty.index(t), ((i // DQ_SLOTS) & 1) ^ 1)
                dq = warpgroup_mma(
                    ds_smem.permute((1, 0)), k_smem, zero_dq, use_acc=False, is_async=True
                )
                dk = warpgroup_mma(ds_smem, q_s, dk, is_async=True)
                dv, dq = warpgroup_mma_wait(1, deps=(dv, dq))
                dq_smem.index(t).store(dq * sm_scale)
                dk = warpgroup_mma_wait(0, deps=(dk,))
                fence_async_shared()  # the TMA unit reads the partial: steps 1-3 of the docstring
            else:
                dk = warpgroup_mma(ds_smem, q_s, dk, is_async=True)
                dq = warpgroup_mma(
                    ds_smem.permute((1, 0)), k_smem, zero_dq, use_acc=False, is_async=True
                )
                dv, dk, dq = warpgroup_mma_wait(0, deps=(dv, dk, dq))
                mbarrier.wait(dq_empty.index(t), ((i // DQ_SLOTS) & 1) ^ 1)
                dq_smem.index(t).store(dq * sm_scale)  # here: the reducer's registers are few
                fence_async_shared()  # the TMA unit reads the partial: steps 1-3 of the docstring
            # One barrier for both hand-overs: both warpgroups are done with Q, dO and dSᵀ
            # (their wgmmas waited for) and have stored their halves of the partial.
            gl.thread_barrier()
            mbarrier.arrive(empty.index(s), count=1)
            mbarrier.arrive(dq_ready.index(t), count=1)

        # K and V are read no more: their buffers hold dK and dV on the way out.
        k_smem.store((dk * sm_scale).to(dtype))
        v_smem.store(dv.to(dtype))
        fence_async_shared()
        gl.thread_barrier()
        tma.async_copy_shared_to_global(dk_desc, [n0, 0], k_smem)
        tma.async_copy_shared_to_global(dv_desc, [n0, 0], v_smem)
        tma.store_wait(0)

    @gluon.jit
    def _rows(
        base, n_rows, row_stride, BLOCK: gl.constexpr, HEAD_DIM: gl.constexpr, layout: gl.constexpr
    ):
        """A TMA descriptor of `n_rows` rows of one head (unit stride along d), BLOCK rows at a
        time into shared memory of `layout`."""
        return tma.make_tensor_descriptor(
            base, [n_rows, HEAD_DIM], [row_stride, 1], [BLOCK, HEAD_DIM], layout
        )

    @gluon.jit
    def _gluon_bwd_kernel(
        Q,
        K,
        V,
        DO,
        L,
        Delta,
        DK,
        DV,
        DQ,
        DQ_SEM,
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
        HEADS,
        N_Q,
        N_K,
        qk_scale,
        sm_scale,
        REVERSED,
        HEAD_DIM: gl.constexpr,
        BLOCK_M: gl.constexpr,
        BLOCK_N: gl.constexpr,
        STAGES: gl.constexpr,
        IS_CAUSAL: gl.constexpr,
        LOADER_WARPS: gl.constexpr,
        LOADER_REGS: gl.constexpr,
        REDUCER_WARPS: gl.constexpr,
        REDUCER_REGS: gl.constexpr,
        DQ_ORDERED: gl.constexpr,
        DQ_DROP: gl.constexpr,
        DQ_SLOTS: gl.constexpr,
        HIGHEST_FIRST: gl.constexpr,
    ):
        """dK, dV of BLOCK_N keys of one (batch, head), and their share of dQ added into DQ
        (fp32, zeroed, contiguous (batch, heads, N_Q, HEAD_DIM)). dK and dV share their
        (batch, head, row) strides. L: the forward's natural-log logsumexp, Delta: rowsum(dO ∘
        O), both contiguous (batch, heads, N_Q). DQ_SEM: int32, zeroed, a semaphore per (batch
        x head, query tile) where DQ_ORDERED (else unread). REVERSED: how many of the grid's
        last groups launch in the reversed order (below). Grid: see the launch order below."""
        gl.static_assert(BLOCK_N % BLOCK_M == 0, "the causal diagonal must start on a query tile")
        qk_scale = qk_scale.to(gl.float32)
        sm_scale = sm_scale.to(gl.float32)
        # The launch order, on a grid (group's heads, key tiles, groups): the (batch x head)s
        # in groups of the grid's first size, one rank of key tiles of every head of the
        # group after another. HIGHEST_FIRST (always where ordered): the highest key tiles
        # first, the order they add dQ in (`_reducer`), so that a key tile only ever waits for
        # programs launched before it (module docstring). The last REVERSED groups (the
        # reversed tail) take their key tiles lowest first, one rank of every head of the tail
        # after another, and visit their query tiles from the last down (`descend`), so that
        # the grid ends on short programs rather than on each head's longest.
        tiles = gl.num_programs(1)
        z = gl.program_id(2)
        pid_n = gl.program_id(1)
        descend = pid_n * 0
        if HIGHEST_FIRST:
            pid_n = tiles - 1 - pid_n
            first_reversed = gl.num_programs(2) - REVERSED
            if z >= first_reversed:
                rank = gl.program_id(1) + tiles * (z - first_reversed)
                z = first_reversed + rank % REVERSED
                pid_n = rank // REVERSED
                descend = descend + 1
        bh = z.to(gl.int64) * gl.num_programs(0) + gl.program_id(0)
        b, h = bh // HEADS, bh % HEADS
        n0 = pid_n * BLOCK_N
        dtype: gl.constexpr = Q.dtype.element_ty
        q_layout: gl.constexpr = gl.NVMMASharedLayout.get_default_for([BLOCK_M, HEAD_DIM], dtype)
        kv_layout: gl.constexpr = gl.NVMMASharedLayout.get_default_for([BLOCK_N, HEAD_DIM], dtype)
        ds_layout: gl.constexpr = gl.NVMMASharedLayout.get_default_for([BLOCK_N, BLOCK_M], dtype)
        # The fp32 dQ partial as the TMA unit reads it: the NVMMA layout (rows of 128 bytes
        # swizzled over 8 rows, the TMA unit undoing the swizzle as it reads; 128 fp32 columns
        # go out as 4 boxes of 32), so the compute warps' stores stay spread over the banks.
        # The non-tensor bulk reduction (FA3's) would need the rows unswizzled and contiguous:
        # not reachable here (Gluon gives no shared-memory address to inline assembly), and
        # the tensor form clips the ragged last tile.
        dq_layout: gl.constexpr = gl.NVMMASharedLayout.get_default_for(
            [BLOCK_M, HEAD_DIM], gl.float32
        )
        vec_layout: gl.constexpr = gl.SwizzledSharedLayout(1, 1, 1, [0])
        # In-kernel descriptors of this (batch, head)'s rows: TMA reads zeros past the last row
        # and clips stores there, which masks the ragged last tiles.
        q_base = Q + b * stride_qb + h * stride_qh
        do_base = DO + b * stride_dob + h * stride_doh
        k_base = K + b * stride_kb + h * stride_kh
        v_base = V + b * stride_vb + h * stride_vh
        dk_base = DK + b * stride_dkb + h * stride_dkh
        dv_base = DV + b * stride_dkb + h * stride_dkh
        q_desc = _rows(q_base, N_Q, stride_qn, BLOCK_M, HEAD_DIM, q_layout)
        do_desc = _rows(do_base, N_Q, stride_don, BLOCK_M, HEAD_DIM, q_layout)
        k_desc = _rows(k_base, N_K, stride_kn, BLOCK_N, HEAD_DIM, kv_layout)
        v_desc = _rows(v_base, N_K, stride_vn, BLOCK_N, HEAD_DIM, kv_layout)
        dk_desc = _rows(dk_base, N_K, stride_dkn, BLOCK_N, HEAD_DIM, kv_layout)
        dv_desc = _rows(dv_base, N_K, stride_dkn, BLOCK_N, HEAD_DIM, kv_layout)

        k_smem = gl.allocate_shared_memory(dtype, [BLOCK_N, HEAD_DIM], kv_layout)
        v_smem = gl.allocate_shared_memory(dtype, [BLOCK_N, HEAD_DIM], kv_layout)
        q_smem = gl.allocate_shared_memory(dtype, [STAGES, BLOCK_M, HEAD_DIM], q_layout)
        do_smem = gl.allocate_shared_memory(dtype, [STAGES, BLOCK_M, HEAD_DIM], q_layout)
        lse_smem = gl.allocate_shared_memory(gl.float32, [STAGES, BLOCK_M], vec_layout)
        delta_smem = gl.allocate_shared_memory(gl.float32, [STAGES, BLOCK_M], vec_layout)
        ds_smem = gl.allocate_shared_memory(dtype, [BLOCK_N, BLOCK_M], ds_layout)
        dq_smem = gl.allocate_shared_memory(gl.float32, [DQ_SLOTS, BLOCK_M, HEAD_DIM], dq_layout)

        bar_layout: gl.constexpr = mbarrier.MBarrierLayout()
        kv_ready = gl.allocate_shared_memory(gl.int64, [1], bar_layout)
        ready = gl.allocate_shared_memory(gl.int64, [STAGES, 1], bar_layout)
        empty = gl.allocate_shared_memory(gl.int64, [STAGES, 1], bar_layout)
        dq_ready = gl.allocate_shared_memory(gl.int64, [DQ_SLOTS, 1], bar_layout)
        dq_empty = gl.allocate_shared_memory(gl.int64, [DQ_SLOTS, 1], bar_layout)
        mbarrier.init(kv_ready, count=1)
        for s in gl.static_range(STAGES):
            mbarrier.init(ready.index(s), count=2)  # the TMA bytes' arrival + the loader's
            mbarrier.init(empty.index(s), count=1)
        for t in gl.static_range(DQ_SLOTS):
            mbarrier.init(dq_ready.index(t), count=1)
            mbarrier.init(dq_empty.index(t), count=1)
        fence_async_shared()  # the initialised barriers visible to the TMA unit

        # Query tiles that see this key tile: from its diagonal on when causal (BLOCK_N is a
        # multiple of BLOCK_M, so that is a tile boundary), from the first otherwise.
        if IS_CAUSAL:
            start_m = n0
        else:
            start_m = 0
        n_tiles = gl.maximum(gl.cdiv(N_Q - start_m, BLOCK_M), 0)
        rows_base = bh * N_Q
        # This head's (N_Q, HEAD_DIM) fp32 dQ rows; rows past N_Q clipped, so the ragged last
        # tile adds only real rows.
        dq_desc = _rows(DQ + rows_base * HEAD_DIM, N_Q, HEAD_DIM, BLOCK_M, HEAD_DIM, dq_layout)
        gl.warp_specialize(
            [
                (
                    _compute,
                    (
                        dk_desc, dv_desc, k_smem, v_smem, q_smem, do_smem, lse_smem, delta_smem,
                        ds_smem, dq_smem, kv_ready, ready, empty, dq_ready, dq_empty, n0,
                        start_m, n_tiles, descend, N_K, qk_scale, sm_scale, HEAD_DIM, BLOCK_M,
                        BLOCK_N, STAGES, IS_CAUSAL, DQ_SLOTS,
                    ),
                ),
                (
                    _loader,
                    (
                        q_desc, do_desc, k_desc, v_desc, L + rows_base, Delta + rows_base,
                        k_smem, v_smem, q_smem, do_smem, lse_smem, delta_smem, kv_ready, ready,
                        empty, n0, start_m, n_tiles, descend, N_Q, BLOCK_M, STAGES,
                    ),
                ),
                (
                    _reducer,
                    (
                        dq_desc, dq_smem, dq_ready, dq_empty, DQ_SEM, bh, n0, start_m, n_tiles,
                        descend, N_Q, N_K, BLOCK_M, BLOCK_N, REDUCER_WARPS, IS_CAUSAL,
                        DQ_ORDERED, DQ_DROP, DQ_SLOTS,
                    ),
                ),
            ],
            [LOADER_WARPS, REDUCER_WARPS],
            [LOADER_REGS, REDUCER_REGS],
        )  # fmt: skip


def interleaved_heads(
    batch_heads: int, n_q: int, n_k: int, head_dim: int, element_size: int
) -> int:
    """How many (batch x head)s' key tiles the launch interleaves: the largest power of two
    that divides `batch_heads` and keeps their Q, dO, K and V within GROUP_BYTES, at least 1."""
    fit = GROUP_BYTES // max(1, 2 * (n_q + n_k) * head_dim * element_size)
    group = 1
    while group * 2 <= fit and batch_heads % (group * 2) == 0:
        group *= 2
    return group


def reversed_groups(
    batch_heads: int,
    n_k: int,
    group: int,
    reversed_heads: int | None = None,
    *,
    causal: bool = True,
) -> int:
    """How many of the launch's last groups of `group` heads form the ordered launch's reversed
    tail: enough for `reversed_heads` heads, at most every group. None: where causal, as many
    as hold REVERSED_KEY_TILES key tiles of BLOCK_N keys; otherwise none (every program visits
    every query tile, so the grid's end is even without a tail, and none was measured there)."""
    if reversed_heads is None:
        reversed_heads = cdiv(REVERSED_KEY_TILES, max(cdiv(n_k, BLOCK_N), 1)) if causal else 0
    return min(cdiv(max(reversed_heads, 0), group), batch_heads // group)


def launch_order(
    batch_heads: int, key_tiles: int, *, group: int, reversed: int, highest_first: bool
) -> list[tuple[int, int, bool]]:
    """(batch x head, key tile, whether it visits its query tiles top-down) of each program of
    the kernel's grid, in the order the grid launches them (its first axis fastest): the
    kernel's mapping of program ids (`_gluon_bwd_kernel`) written again in Python, for the
    launch model (`packages/fa2/scripts/launch_tail_model.py`) and the tests, since Gluon
    kernels do not run on a CPU. `reversed`: the tail's groups (`reversed_groups`)."""
    groups = batch_heads // group
    order = []
    for z in range(groups):
        for y in range(key_tiles):
            for x in range(group):
                pid_n, zz, descend = y, z, False
                if highest_first:
                    pid_n = key_tiles - 1 - y
                    first_reversed = groups - reversed
                    if z >= first_reversed:
                        rank = y + key_tiles * (z - first_reversed)
                        zz, pid_n, descend = (
                            first_reversed + rank % reversed,
                            rank // reversed,
                            True,
                        )
                order.append((zz * group + x, pid_n, descend))
    return order


def unsupported_reason(
    q: torch.Tensor,
    *tensors: torch.Tensor,
    pointers: bool = True,
    strides: Sequence[tuple[int, int, int]] | None = None,
) -> str | None:
    """Why the Gluon backward cannot run for `q` (and the other tensors it would read through
    TMA descriptors, given by `tensors`) here, or None when it can: Gluon importable, outside
    Triton's interpreter, an sm_90 GPU (wgmma and setmaxnreg are sm_90a instructions: not on
    Ampere, nor on Blackwell), bf16 or fp16, a head dim of HEAD_DIMS, and every tensor 16-byte
    aligned with unit stride along d and 16-byte multiples for its other strides (TMA's
    rules). `pointers=False` leaves the alignment out (a plan built while torch.compile
    traces has no data pointers; it checks them per call). `strides`: the (batch, head, row)
    strides the kernel will read each tensor with, where a caller copies some first (default:
    each tensor's own, `head_strides`)."""
    if not HAVE_GLUON:
        return "this Triton's Gluon is not the one fa2's Gluon kernels are written for (3.6's)"
    if INTERPRET:
        return "Triton's interpreter does not run Gluon kernels"
    if q.device.type != "cuda" or device_capability(q.device) != (9, 0):
        return f"it needs an sm_90 GPU (H100, H200); this call is on {q.device}"
    if q.dtype not in (torch.bfloat16, torch.float16):
        return f"it takes bf16 or fp16 inputs, not {q.dtype}"
    if q.shape[-1] not in HEAD_DIMS:
        return f"it takes head dims {HEAD_DIMS}, not {q.shape[-1]}"
    tensors = (q, *tensors)
    if strides is None:
        strides = [head_strides(t) for t in tensors]
    for t, layout in zip(tensors, strides, strict=True):
        if layout is None or (pointers and t.data_ptr() % 16):
            return "a tensor is not 16-byte aligned or not contiguous along the head dim"
        if any(stride * t.element_size() % 16 for stride in layout):
            return "a tensor's batch, head or row stride is not a multiple of 16 bytes"
    return None


def gluon_backward_available(q: torch.Tensor, *tensors: torch.Tensor) -> bool:
    """Whether `gluon_backward` can run for these tensors here (`unsupported_reason`), so that
    a caller can fall back to fa2's Triton backward."""
    return unsupported_reason(q, *tensors) is None


def launch(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    o: torch.Tensor,
    lse: torch.Tensor,
    do: torch.Tensor,
    dk: torch.Tensor,
    dv: torch.Tensor,
    strides: tuple[tuple[int, int, int], ...],
    *,
    scale: float,
    causal: bool,
    deterministic: bool = False,
    dq_slots: int = DQ_SLOTS,
    drop_dq: bool = False,
    block_m: int = BLOCK_M,
    group_heads: int | None = None,
    highest_first: bool | None = None,
    reversed_heads: int | None = None,
) -> torch.Tensor:
    """Run the backward on `(..., heads, n, d)` views read with the (batch, head, row)
    `strides` of q, k, v, o, dO and dK (which dV shares), writing dk and dv; returns dQ as a
    contiguous fp32 `(..., heads, n_q, d)` tensor (the caller casts it). `deterministic`: the
    key tiles add into each dQ tile in a fixed order (`_reducer`), so dQ's bits repeat.
    `dq_slots`: dQ partial buffers (`DQ_SLOTS`; 1 to measure what the second buys).
    `drop_dq`: a timing probe that leaves dQ at zero (`_reducer`'s DROP); never for gradients.
    `block_m`: queries per step (`BLOCK_MS` lists what each head dim takes).
    `group_heads`: how many (batch x head)s' key tiles the launch interleaves (the largest
    divisor of batch x heads that divides it; 1: one head's key tiles after another's; None:
    `interleaved_heads`, by the heads' bytes).
    `highest_first`: launch each head's highest key tiles first (None: where `deterministic`,
    which needs it; True without it measures what that launch order costs by itself).
    `reversed_heads`: where the launch is highest first, how many of its last (batch x head)s
    (rounded up to whole groups) form the reversed tail (`_gluon_bwd_kernel`); 0: none; None:
    as many as hold REVERSED_KEY_TILES key tiles where causal, none otherwise.
    One key/value head per query head; `unsupported_reason` must have said None."""
    from fa2.triton.backward import _delta_kernel  # (backward.py imports this module)

    if highest_first is None:
        highest_first = deterministic
    elif deterministic and not highest_first:
        raise ValueError(
            "deterministic=True needs highest_first: a key tile waits for the higher ones, so "
            "launched lowest first it can wait for a program that never gets a multiprocessor "
            "(it hung at (2, 32, 32768, 128): docs/results/"
            "fa2_gluon_bwd_longest_first_h200_2026-11-28.md)"
        )

    sq, sk, sv, so, sdo, sdk = strides
    n_q, d = q.shape[-2:]
    if block_m not in BLOCK_MS.get(d, ()):
        raise ValueError(
            f"block_m={block_m} is not a query tile of head dim {d}: choose one of "
            f"{BLOCK_MS.get(d, ())} (BLOCK_MS)"
        )
    heads = q.shape[-3] if q.dim() >= 3 else 1
    n_k = k.shape[-2]
    batch_heads = lse.numel() // n_q if n_q else 0
    delta = lse.new_empty((batch_heads, n_q))
    dq = q.new_empty(q.shape, dtype=torch.float32)
    if batch_heads == 0 or n_q == 0 or n_k == 0:
        return dq.zero_()
    # D = rowsum(dO ∘ O) and the fp32 dQ accumulator zeroed: fa2's single-pass pre-pass.
    rows = delta_rows(d)
    large = needs_int64([o.shape, do.shape], [so, sdo])
    _delta_kernel[(cdiv(n_q, rows), batch_heads)](
        o, do, delta, dq, *so, *sdo, heads, n_q,
        HEAD_DIM=d, BLOCK_D=block_d(d), LARGE=large, BLOCK_M=rows,
        ZERO_DQ=not deterministic, num_warps=4, num_stages=1,
    )  # fmt: skip
    # One semaphore per (batch x head, query tile) where the additions are ordered; else one
    # int32 the kernel never reads (left unfilled: no kernel launched for it).
    if deterministic:
        sem = torch.zeros((batch_heads, cdiv(n_q, block_m)), dtype=torch.int32, device=q.device)
    else:
        sem = torch.empty(1, dtype=torch.int32, device=q.device)
    triton.set_allocator(_scratch)  # the kernel builds its TMA descriptors in global memory
    if group_heads is None:
        group = interleaved_heads(batch_heads, n_q, n_k, d, q.element_size())
    else:
        group = math.gcd(max(group_heads, 1), batch_heads)  # a divisor of batch x heads
    tail = reversed_groups(batch_heads, n_k, group, reversed_heads, causal=causal)
    tail = tail if highest_first else 0
    _gluon_bwd_kernel[(group, cdiv(n_k, BLOCK_N), batch_heads // group)](
        q, k, v, do, lse, delta, dk, dv, dq, sem, *sq, *sk, *sv, *sdo, *sdk, heads, n_q, n_k,
        scale * LOG2E, scale, tail, HEAD_DIM=d, BLOCK_M=block_m, BLOCK_N=BLOCK_N,
        STAGES=STAGES, IS_CAUSAL=causal, LOADER_WARPS=LOADER_WARPS, LOADER_REGS=LOADER_REGS,
        REDUCER_WARPS=REDUCER_WARPS, REDUCER_REGS=REDUCER_REGS, DQ_ORDERED=deterministic,
        DQ_DROP=drop_dq, DQ_SLOTS=dq_slots, HIGHEST_FIRST=highest_first,
        num_warps=COMPUTE_WARPS,
    )  # fmt: skip
    return dq


def gluon_backward(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    o: torch.Tensor,
    lse: torch.Tensor,
    do: torch.Tensor,
    *,
    scale: float,
    causal: bool,
    deterministic: bool = False,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """dq, dk, dv of attention over `(batch, heads, n, d)` tensors (any strides with unit
    stride along d), from the forward's output `o` and natural-log logsumexp `lse` (`(batch,
    heads, n_q)`, contiguous, as fa2's forward stores it). dq in q's dtype; dk, dv contiguous.
    `deterministic`: dQ's additions in a fixed order, so the bits repeat from run to run.
    Raises ValueError where `unsupported_reason` gives one, or for grouped heads."""
    if k.shape[:-2] != q.shape[:-2] or v.shape != k.shape:
        raise ValueError(
            "the Gluon backward takes one key/value head per query head (k, v shaped like q "
            f"up to the sequence length); got q {tuple(q.shape)}, k {tuple(k.shape)}, v "
            f"{tuple(v.shape)}: use fa2's Triton backward"
        )
    if q.dim() != 4 or o.shape != q.shape or do.shape != q.shape:
        raise ValueError("q, o and dO must be (batch, heads, n, d) tensors of one shape")
    if lse.shape != q.shape[:-1] or not lse.is_contiguous() or lse.dtype != torch.float32:
        raise ValueError("lse must be a contiguous fp32 (batch, heads, n_q) tensor")
    reason = unsupported_reason(q, k, v, do)
    if reason is not None:
        raise ValueError(f"the Gluon backward cannot run here: {reason}")
    dk = torch.empty_like(k, memory_format=torch.contiguous_format)
    dv = torch.empty_like(k, memory_format=torch.contiguous_format)
    strides = tuple(tuple(t.stride()[:3]) for t in (q, k, v, o, do, dk))
    dq = launch(
        q, k, v, o, lse, do, dk, dv, strides, scale=scale, causal=causal,
        deterministic=deterministic,
    )  # fmt: skip
    return dq.to(q.dtype), dk, dv
