"""Tile helpers shared by the forward and backward kernels: masked loads, stores and the mask."""

from __future__ import annotations

import triton
import triton.language as tl

__all__ = [
    "add_tile",
    "load_row_pair",
    "load_tile",
    "row_offsets",
    "row_source",
    "store_tile",
    "visible",
]


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
def visible(rows, cols, n_rows, n_cols, CHECK_ROWS: tl.constexpr, IS_CAUSAL: tl.constexpr):
    """(len(rows), len(cols)) mask: query row i may see key col j (in range; j <= i if causal).

    Rows past n_rows are only excluded with CHECK_ROWS, where their values would otherwise leak
    into a reduction over rows."""
    keep = cols[None, :] < n_cols
    if CHECK_ROWS:
        keep = keep & (rows[:, None] < n_rows)
    if IS_CAUSAL:
        keep = keep & (cols[None, :] <= rows[:, None])
    return keep
