"""Cross-entropy over rows of logits, with the gradient written over the logits in the same call.

One program per row. With `V` the row length (the vocabulary):

- pass 1 reads the row once, keeping a running maximum `m` and sum `s = Σ exp(x − m)` (the
  online softmax), so `lse = m + log s`; the row's loss is `lse − x[target]`;
- pass 2 reads it again and stores `(exp(x − lse) − [j = target]) · scale` over it, the gradient
  of `scale · loss` with respect to the logits.

When the row fits one block (`V ≤ MAX_BLOCK`) it is loaded once and both passes run on the
registers. Arithmetic is in the dtype of `losses`: float32 for bf16, fp16 and fp32 logits,
float64 for float64 ones. A row whose target is
`ignore_index` gets loss 0 and gradient 0; a target outside `[0, V)` gets a NaN loss and a NaN
gradient (no host synchronisation is spent checking targets on the GPU, and a NaN cannot go
unnoticed).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

__all__ = ["MAX_BLOCK", "cross_entropy_rows_"]

# Elements of a row one loop step loads: 16,384 float32 values are 32 per thread at 16 warps,
# as much as a program holds in registers without spilling, and a vocabulary up to this size
# (the handout's 10,000) is read from memory once instead of twice.
MAX_BLOCK = 16_384


def _warps(block: int) -> int:
    # 32 elements per thread at the largest block, fewer warps for short rows.
    return max(1, min(16, block // 1024))


@triton.jit
def _cross_entropy_rows_kernel(
    logits_ptr,
    row_stride,
    targets_ptr,
    losses_ptr,
    scale_ptr,
    n_cols,
    ignore_index,
    COMPUTE_GRAD: tl.constexpr,
    SINGLE_BLOCK: tl.constexpr,
    BLOCK: tl.constexpr,
):
    acc = losses_ptr.dtype.element_ty  # float32 (float64 for float64 logits)
    row = tl.program_id(0).to(tl.int64)
    logits_ptr += row * row_stride
    target = tl.load(targets_ptr + row).to(tl.int64)
    ignored = target == ignore_index
    in_range = (target >= 0) & (target < n_cols)
    cols = tl.arange(0, BLOCK)

    if SINGLE_BLOCK:
        x = tl.load(logits_ptr + cols, mask=cols < n_cols, other=float("-inf")).to(acc)
        m = tl.max(x, 0)
        lse = m + tl.log(tl.sum(tl.exp(x - m), 0))
    else:
        m = tl.cast(float("-inf"), acc)
        s = tl.cast(0.0, acc)
        for start in range(0, n_cols, BLOCK):
            mask = start + cols < n_cols
            x = tl.load(logits_ptr + start + cols, mask=mask, other=float("-inf"))
            x = x.to(acc)
            m_new = tl.maximum(m, tl.max(x, 0))
            s = s * tl.exp(m - m_new) + tl.sum(tl.exp(x - m_new), 0)
            m = m_new
        lse = m + tl.log(s)

    safe_target = tl.where(in_range, target, 0)
    target_logit = tl.load(logits_ptr + safe_target).to(acc)
    loss = tl.where(in_range, lse - target_logit, float("nan"))
    tl.store(losses_ptr + row, tl.where(ignored, 0.0, loss))

    if COMPUTE_GRAD:
        scale = tl.load(scale_ptr).to(acc)
        scale = tl.where(ignored, 0.0, tl.where(in_range, scale, float("nan")))
        if SINGLE_BLOCK:
            grad = tl.exp(x - lse) * scale - tl.where(cols == target, scale, 0.0)
            tl.store(logits_ptr + cols, grad.to(logits_ptr.dtype.element_ty), mask=cols < n_cols)
        else:
            for start in range(0, n_cols, BLOCK):
                mask = start + cols < n_cols
                x = tl.load(logits_ptr + start + cols, mask=mask).to(acc)
                grad = tl.exp(x - lse) * scale - tl.where(start + cols == target, scale, 0.0)
                tl.store(logits_ptr + start + cols, grad.to(logits_ptr.dtype.element_ty), mask=mask)


def cross_entropy_rows_(
    logits: torch.Tensor,
    targets: torch.Tensor,
    losses: torch.Tensor,
    scale: torch.Tensor,
    *,
    ignore_index: int,
    compute_grad: bool,
    max_block: int = MAX_BLOCK,
) -> None:
    """Write each row's loss into `losses` and, with `compute_grad`, its gradient over `logits`.

    Args:
        logits: `(rows, V)` with unit column stride (any row stride); overwritten with the
            gradient of `scale · Σ loss` when `compute_grad`.
        targets: `(rows,)` integer class ids (or `ignore_index`).
        losses: `(rows,)` float32 (float64 for float64 logits), written.
        scale: a one-element tensor on the device: the gradient's factor (1 / the
            number of counted rows for a mean, 1 for a sum), read by the kernel so that no
            value has to come back to the host.
        ignore_index: target value whose row counts for nothing.
        compute_grad: overwrite `logits` with the gradient.
        max_block: the most elements a loop step loads (a power of two); smaller values make
            the tests run the several-block path on small rows.
    """
    rows, n_cols = logits.shape
    block = min(max_block, triton.next_power_of_2(n_cols))
    _cross_entropy_rows_kernel[(rows,)](
        logits,
        logits.stride(0),
        targets,
        losses,
        scale,
        n_cols,
        ignore_index,
        COMPUTE_GRAD=compute_grad,
        SINGLE_BLOCK=n_cols <= block,
        BLOCK=block,
        num_warps=_warps(block),
    )
