"""Helpers shared by the forward and backward kernels: masked loads and stores, the mask, the
tile ranges a band of visible keys allows, packed sequences, and the softcap."""

from __future__ import annotations

import triton
import triton.language as tl

from fa2.triton import configs

__all__ = [
    "LOG2E",
    "add_tile",
    "at_row",
    "band",
    "key_range",
    "load_row_pair",
    "load_rows",
    "load_tile",
    "program_ids",
    "query_range",
    "row_offsets",
    "row_source",
    "sequence",
    "softcapped",
    "store_tile",
    "visible",
]

# log2(e), for the kernels (which read only constexpr globals): exp(x) = exp2(x * LOG2E).
LOG2E = tl.constexpr(configs.LOG2E)


@triton.jit
def row_offsets(rows, stride, LARGE: tl.constexpr):
    """Element offsets `rows * stride` of a tile's rows. In int32 (Triton's default for a stride
    below 2**31) unless LARGE, set by the host when (n_rows - 1) * stride + d could pass
    2**31 - 1, as for q, k, v read in place from a packed QKV tensor of many tokens."""
    if LARGE:
        rows = rows.to(tl.int64)
    return rows * stride


@triton.jit
def load_tile(
    base,
    rows,
    stride,
    offs_d,
    n_rows,
    HEAD_DIM: tl.constexpr,
    BLOCK_D: tl.constexpr,
    MASK_ROWS: tl.constexpr,
    UPCAST: tl.constexpr,
    LARGE: tl.constexpr,
):
    """Load a (len(rows), BLOCK_D) tile of a row-major matrix; rows >= n_rows and padded columns
    read as 0. Without masks when the rows are known in range and HEAD_DIM == BLOCK_D, so the
    loads stay fully vectorised on the hot path. LARGE: row offsets in int64 (see `row_offsets`)."""
    ptrs = base + row_offsets(rows, stride, LARGE)[:, None] + offs_d[None, :]
    if MASK_ROWS:
        mask = rows[:, None] < n_rows
        if HEAD_DIM != BLOCK_D:
            mask = mask & (offs_d[None, :] < HEAD_DIM)
        x = tl.load(ptrs, mask=mask, other=0.0)
    elif HEAD_DIM != BLOCK_D:
        x = tl.load(ptrs, mask=offs_d[None, :] < HEAD_DIM, other=0.0)
    else:
        x = tl.load(ptrs)
    if UPCAST:
        x = x.to(tl.float32)
    return x


@triton.jit
def row_source(
    base,
    n_rows,
    stride,
    HEAD_DIM: tl.constexpr,
    BLOCK_ROWS: tl.constexpr,
    BLOCK_D: tl.constexpr,
    TMA: tl.constexpr,
):
    """Where `load_row_pair` reads (BLOCK_ROWS, BLOCK_D) tiles of an (n_rows, HEAD_DIM) row-major
    matrix from: with TMA a tensor descriptor, so Hopper's copy unit fetches each tile with no
    per-thread address arithmetic and fills rows and columns out of range with 0 (the host
    checks the 16-byte alignment it needs); otherwise the base pointer itself."""
    if TMA:
        return tl.make_tensor_descriptor(
            base, [n_rows, HEAD_DIM], [stride, 1], block_shape=[BLOCK_ROWS, BLOCK_D]
        )
    else:
        return base


@triton.jit
def load_rows(
    base,
    start,
    n_rows,
    stride,
    offs_d,
    HEAD_DIM: tl.constexpr,
    BLOCK_ROWS: tl.constexpr,
    BLOCK_D: tl.constexpr,
    UPCAST: tl.constexpr,
    LARGE: tl.constexpr,
    TMA: tl.constexpr,
):
    """`load_tile` of the rows [start, start + BLOCK_ROWS) of an (n_rows, HEAD_DIM) row-major
    matrix, with TMA through a descriptor of its own (`row_source`): a program's own tile,
    loaded once before its loop. Triton 3.6's Hopper warp specialisation fails to compile a
    loop whose matmul operand was loaded before it with plain loads, so the specialised
    kernels load such tiles this way.

    The TMA coordinate is `max(start, 0)` (start >= 0: the same row), a value of its own. That
    pass splits this load between its two consumer warpgroups and gives the second one the
    coordinate c + BLOCK_ROWS / 2 by replacing c everywhere in that consumer's code; where c
    was `start` itself, the rows the caller numbers from it (`start + tl.arange(...)`, which
    the pass splits too) moved by half a tile twice, so that consumer masked and stored the
    next tile's rows (sm_90 TTGIR: docs/design/fa2.md, "Warp specialisation on Hopper")."""
    if TMA:
        source = row_source(base, n_rows, stride, HEAD_DIM, BLOCK_ROWS, BLOCK_D, True)
        x = source.load([tl.maximum(start, 0), 0])
        if UPCAST:
            x = x.to(tl.float32)
    else:
        rows = start + tl.arange(0, BLOCK_ROWS)
        x = load_tile(base, rows, stride, offs_d, n_rows, HEAD_DIM, BLOCK_D, True, UPCAST, LARGE)
    return x


@triton.jit
def load_row_pair(
    source_a,
    stride_a,
    source_b,
    stride_b,
    start,
    offs_d,
    n_rows,
    HEAD_DIM: tl.constexpr,
    BLOCK_ROWS: tl.constexpr,
    BLOCK_D: tl.constexpr,
    MASK_ROWS: tl.constexpr,
    UPCAST: tl.constexpr,
    LARGE: tl.constexpr,
    TMA: tl.constexpr,
):
    """`load_tile` of the rows [start, start + BLOCK_ROWS) of two matrices (k and v, or q and
    dO, as every inner loop reads them), each from a `row_source`."""
    if TMA:
        a = source_a.load([start, 0])
        b = source_b.load([start, 0])
        if UPCAST:
            a, b = a.to(tl.float32), b.to(tl.float32)
    else:
        rows = start + tl.arange(0, BLOCK_ROWS)
        a = load_tile(
            source_a, rows, stride_a, offs_d, n_rows, HEAD_DIM, BLOCK_D, MASK_ROWS, UPCAST, LARGE
        )
        b = load_tile(
            source_b, rows, stride_b, offs_d, n_rows, HEAD_DIM, BLOCK_D, MASK_ROWS, UPCAST, LARGE
        )
    return a, b


@triton.jit
def store_tile(base, rows, stride, offs_d, n_rows, x, HEAD_DIM: tl.constexpr, LARGE: tl.constexpr):
    """Store a (len(rows), BLOCK_D) tile, skipping rows >= n_rows and padded columns."""
    mask = (rows[:, None] < n_rows) & (offs_d[None, :] < HEAD_DIM)
    ptrs = base + row_offsets(rows, stride, LARGE)[:, None] + offs_d[None, :]
    tl.store(ptrs, x.to(base.dtype.element_ty), mask=mask)


@triton.jit
def add_tile(
    base,
    rows,
    stride,
    offs_d,
    n_rows,
    x,
    MASK_ROWS: tl.constexpr,
    HEAD_DIM: tl.constexpr,
    BLOCK_D: tl.constexpr,
    LARGE: tl.constexpr,
):
    """Atomically add a (len(rows), BLOCK_D) fp32 tile into a row-major fp32 matrix, skipping
    rows >= n_rows (with MASK_ROWS) and padded columns. Relaxed ordering: only the sums matter,
    and their order (hence the last bits) varies from run to run."""
    ptrs = base + row_offsets(rows, stride, LARGE)[:, None] + offs_d[None, :]
    if MASK_ROWS:
        mask = rows[:, None] < n_rows
        if HEAD_DIM != BLOCK_D:
            mask = mask & (offs_d[None, :] < HEAD_DIM)
        tl.atomic_add(ptrs, x, mask=mask, sem="relaxed")
    elif HEAD_DIM != BLOCK_D:
        tl.atomic_add(ptrs, x, mask=offs_d[None, :] < HEAD_DIM, sem="relaxed")
    else:
        tl.atomic_add(ptrs, x, sem="relaxed")


@triton.jit
def visible(
    rows,
    cols,
    n_rows,
    n_cols,
    lo,
    hi,
    CHECK_ROWS: tl.constexpr,
    IS_CAUSAL: tl.constexpr,
    LOCAL: tl.constexpr,
):
    """(len(rows), len(cols)) mask: query row i may see key col j: j in range and, where the
    sides are bounded (see `fa2.masks`), i + lo <= j (LOCAL) and j <= i + hi (IS_CAUSAL).

    Rows past n_rows are only excluded with CHECK_ROWS, where their values would otherwise leak
    into a reduction over rows."""
    keep = cols[None, :] < n_cols
    if CHECK_ROWS:
        keep = keep & (rows[:, None] < n_rows)
    if IS_CAUSAL:
        keep = keep & (cols[None, :] <= rows[:, None] + hi)
    if LOCAL:
        keep = keep & (cols[None, :] >= rows[:, None] + lo)
    return keep


@triton.jit
def _floor_to(x, BLOCK: tl.constexpr):
    """x rounded down to a multiple of BLOCK, for x >= 0."""
    return (x // BLOCK) * BLOCK


@triton.jit
def key_range(
    pid_m,
    n_k,
    lo,
    hi,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    IS_CAUSAL: tl.constexpr,
    LOCAL: tl.constexpr,
    ALIGNED: tl.constexpr,
):
    """The key tiles the query rows [m0, m0 + BLOCK_M) (m0 = pid_m * BLOCK_M) visit, as (start,
    full_start, full_end, end): masked tiles [start, full_start), tiles every row sees whole
    [full_start, full_end) (no mask), masked tiles [full_end, end). Row i sees keys i + lo ...
    i + hi (`visible`). ALIGNED: the upper side is the top-left diagonal itself (hi = 0),
    which starts on a tile boundary (BLOCK_M % BLOCK_N == 0), so no rounding is needed there:
    the bounds the plain causal kernel always had, written as it wrote them (the same code)."""
    m0 = pid_m * BLOCK_M
    full_end = (n_k // BLOCK_N) * BLOCK_N
    end = n_k
    if IS_CAUSAL:
        if ALIGNED:
            full_end = tl.minimum(full_end, m0)
            end = tl.minimum(end, (pid_m + 1) * BLOCK_M)
        else:  # the first row's last key is m0 + hi, the last row's m0 + BLOCK_M - 1 + hi
            full_end = tl.minimum(full_end, _floor_to(tl.maximum(m0 + hi + 1, 0), BLOCK_N))
            end = tl.minimum(end, m0 + BLOCK_M + hi)
    start = 0
    full_start = 0
    if LOCAL:  # the first row's first key is m0 + lo, the last row's m0 + BLOCK_M - 1 + lo
        start = _floor_to(tl.maximum(m0 + lo, 0), BLOCK_N)
        whole = _floor_to(tl.maximum(m0 + BLOCK_M - 1 + lo, 0) + BLOCK_N - 1, BLOCK_N)
        full_start = tl.maximum(start, tl.minimum(whole, end))
        full_end = tl.maximum(full_end, full_start)
    return start, full_start, full_end, end


@triton.jit
def query_range(
    n0,
    n_q,
    lo,
    hi,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    IS_CAUSAL: tl.constexpr,
    LOCAL: tl.constexpr,
    ALIGNED: tl.constexpr,
):
    """The query tiles that see the keys [n0, n0 + BLOCK_N), as (start, masked_end, full_start,
    full_end, end): masked tiles [start, masked_end) that see part of it (the diagonal), tiles
    that see every key of it [full_start, full_end) (no mask), masked tiles [max(full_start,
    full_end), end) (a window's far edge, a ragged last tile). Key j is seen by rows j - hi
    ... j - lo. ALIGNED: as in `key_range` (here BLOCK_N % BLOCK_M == 0); the diagonal's
    tiles are then [n0, n0 + BLOCK_N), the bounds the plain causal kernel always had."""
    start = 0
    masked_end = 0
    full_start = 0
    full_end = (n_q // BLOCK_M) * BLOCK_M
    end = n_q
    if IS_CAUSAL:
        if ALIGNED:
            start = n0
            masked_end = tl.minimum(n0 + BLOCK_N, n_q)
            full_start = n0 + BLOCK_N
        else:  # key n0 is first seen by row n0 - hi, all the tile's keys from n0 + BLOCK_N - 1 - hi
            start = _floor_to(tl.maximum(n0 - hi, 0), BLOCK_M)
            whole = _floor_to(tl.maximum(n0 + BLOCK_N - 1 - hi, 0) + BLOCK_M - 1, BLOCK_M)
            full_start = tl.maximum(start, tl.minimum(whole, n_q))
            masked_end = full_start
    if LOCAL:  # key n0 is last seen by row n0 - lo, the tile's last key by n0 + BLOCK_N - 1 - lo
        end = tl.minimum(n_q, n0 + BLOCK_N - lo)
        full_end = tl.minimum(full_end, _floor_to(tl.maximum(n0 - lo + 1, 0), BLOCK_M))
    return start, masked_end, full_start, full_end, end


@triton.jit
def program_ids(L2_GROUP: tl.constexpr):
    """(tile, row of the grid's axis 1) of this program. With L2_GROUP == 1 the grid's own ids;
    else the launch order regrouped (`configs.l2_group`): programs start in order of their
    linear id (axis 0 fastest), which here walks groups of L2_GROUP axis-1 rows, and within a
    group tile 0 of every row, then tile 1 of every row, and so on (the last group may be
    smaller). The same grid, each program given other ids."""
    tile = tl.program_id(0)
    row = tl.program_id(1)
    if L2_GROUP > 1:
        n_tiles = tl.num_programs(0)
        linear = row * n_tiles + tile
        first = (linear // (L2_GROUP * n_tiles)) * L2_GROUP  # the group's first row
        rows = tl.minimum(L2_GROUP, tl.num_programs(1) - first)
        offset = linear - first * n_tiles
        tile = offset // rows
        row = first + offset % rows
    return tile, row


@triton.jit
def at_row(base, row, stride, VARLEN: tl.constexpr):
    """`base` moved to row `row` (the first of a packed sequence) with VARLEN; else `base`."""
    if VARLEN:
        return base + row * stride
    else:
        return base


@triton.jit
def sequence(CU_Q, CU_K, b, N_Q, N_K, VARLEN: tl.constexpr):
    """(first query row, first key row, n_q, n_k) of sequence b: with VARLEN a packed sequence,
    read from the cumulative lengths (the first rows in int64, as offsets into tensors of many
    tokens); otherwise the whole batch entry b, from row 0."""
    if VARLEN:
        q_start = tl.load(CU_Q + b)
        k_start = tl.load(CU_K + b)
        n_q = tl.load(CU_Q + b + 1) - q_start
        n_k = tl.load(CU_K + b + 1) - k_start
        return q_start.to(tl.int64), k_start.to(tl.int64), n_q, n_k
    else:
        return 0, 0, N_Q, N_K


@triton.jit
def band(n_q, n_k, WIN_LEFT: tl.constexpr, WIN_RIGHT: tl.constexpr, BOTTOM_RIGHT: tl.constexpr):
    """(lo, hi): query i sees key j iff i + lo <= j <= i + hi, where those sides are bounded
    (`fa2.masks`); the diagonal is aligned top-left, or with BOTTOM_RIGHT to the last query and
    key. Top-left, both are compile-time constants."""
    if BOTTOM_RIGHT:
        diag = n_k - n_q
    else:
        diag = 0
    return diag - WIN_LEFT, diag + WIN_RIGHT


@triton.jit
def softcapped(s, cap_scale):
    """tanh(s * cap_scale), written with exp2 (which every Triton backend and the interpreter
    have): the capped score is then softcap * tanh(raw * scale / softcap), in units the
    caller scales by softcap. Saturates to +-1 without overflow for large |s|."""
    e = tl.math.exp2(s * (cap_scale * (2 * LOG2E)))
    return 1.0 - 2.0 / (e + 1.0)
