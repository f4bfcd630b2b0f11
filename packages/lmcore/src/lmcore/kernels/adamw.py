"""AdamW over many tensors in one launch: a table of their addresses, one program per block.

The host writes, for the tensors of one launch, a table of four addresses each (parameter,
gradient, first and second moment) and their sizes, and splits every tensor into blocks of
`BLOCK` elements. Program `i` looks up which tensor its block belongs to (`block_tensor[i]`)
and where that tensor's blocks start (`first_block[t]`), casts the addresses to pointers, and
updates its block: one read of each of the four tensors and one write of the parameter and the
two moments, in float32 (the moments are float32 whatever the parameter's dtype), with torch's
fused AdamW's arithmetic and correctly rounded square root and division.

Addresses loaded from memory carry no alignment the compiler can see; when every tensor of the
launch starts on a 16-byte boundary (torch's allocator gives 512), the host says so
(`ALIGNED`) and the kernel declares it, so that each thread moves 16 bytes per load.
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence

import torch
import triton
import triton.language as tl

__all__ = ["BLOCK", "BlockTable", "adamw_step_"]

# Elements per program: 2,048 float32 values are 16 per thread at 4 warps, four 16-byte loads of
# each tensor in flight per thread, enough to keep the memory system busy on a streaming update
# (28 bytes per element, no reuse); the table costs 4 bytes per block, 1/14,000 of the traffic.
BLOCK = 2048
_NUM_WARPS = 4
_ALIGNMENT = 16  # bytes: one 128-bit load or store

_TRITON_DTYPES = {torch.float32: tl.float32, torch.bfloat16: tl.bfloat16, torch.float16: tl.float16}


@triton.jit
def _adamw_kernel(
    addresses_ptr,
    numels_ptr,
    block_tensor_ptr,
    first_block_ptr,
    lr_weight_decay,
    beta1,
    beta2,
    eps,
    step_size,
    bias_correction2_sqrt,
    PARAM: tl.constexpr,
    ALIGNED: tl.constexpr,
    BLOCK: tl.constexpr,
):
    pid = tl.program_id(0)
    t = tl.load(block_tensor_ptr + pid).to(tl.int64)
    start = (pid - tl.load(first_block_ptr + t)).to(tl.int64) * BLOCK
    offsets = start + tl.arange(0, BLOCK)
    mask = offsets < tl.load(numels_ptr + t)

    row = addresses_ptr + 4 * t
    param_address = tl.load(row)
    grad_address = tl.load(row + 1)
    exp_avg_address = tl.load(row + 2)
    exp_avg_sq_address = tl.load(row + 3)
    if ALIGNED:  # 16-byte aligned addresses: vector loads and stores
        param_address = tl.multiple_of(param_address, 16)
        grad_address = tl.multiple_of(grad_address, 16)
        exp_avg_address = tl.multiple_of(exp_avg_address, 16)
        exp_avg_sq_address = tl.multiple_of(exp_avg_sq_address, 16)
    param_ptr = param_address.to(tl.pointer_type(PARAM))
    grad_ptr = grad_address.to(tl.pointer_type(PARAM))
    exp_avg_ptr = exp_avg_address.to(tl.pointer_type(tl.float32))
    exp_avg_sq_ptr = exp_avg_sq_address.to(tl.pointer_type(tl.float32))

    param = tl.load(param_ptr + offsets, mask=mask).to(tl.float32)
    grad = tl.load(grad_ptr + offsets, mask=mask).to(tl.float32)
    exp_avg = tl.load(exp_avg_ptr + offsets, mask=mask)
    exp_avg_sq = tl.load(exp_avg_sq_ptr + offsets, mask=mask)

    param = param - lr_weight_decay * param  # decoupled weight decay
    exp_avg = beta1 * exp_avg + (1 - beta1) * grad
    exp_avg_sq = beta2 * exp_avg_sq + (1 - beta2) * grad * grad
    denom = tl.div_rn(tl.sqrt_rn(exp_avg_sq), bias_correction2_sqrt) + eps
    param = param - step_size * tl.div_rn(exp_avg, denom)

    tl.store(param_ptr + offsets, param.to(PARAM), mask=mask)
    tl.store(exp_avg_ptr + offsets, exp_avg, mask=mask)
    tl.store(exp_avg_sq_ptr + offsets, exp_avg_sq, mask=mask)


class BlockTable:
    """Which tensor each program's block belongs to, for one list of tensor sizes (on a device).

    Built once per list of sizes (the parameters do not change shape) and kept by `AdamW`.

    Attributes:
        numels: `(tensors,)` int64 sizes.
        block_tensor: `(blocks,)` int32, the tensor of each block.
        first_block: `(tensors,)` int32, the index of each tensor's first block.
        num_blocks: the grid size.
    """

    def __init__(self, numels: Sequence[int], device: torch.device) -> None:
        counts = [triton.cdiv(n, BLOCK) for n in numels]
        first = [0, *itertools.accumulate(counts)][:-1]
        self.num_blocks = sum(counts)
        self.numels = torch.tensor(numels, dtype=torch.int64).to(device)
        self.first_block = torch.tensor(first, dtype=torch.int32).to(device)
        owner = torch.repeat_interleave(torch.arange(len(counts)), torch.tensor(counts))
        self.block_tensor = owner.to(device=device, dtype=torch.int32)


def _addresses(tensors: Sequence[Sequence[torch.Tensor]], device: torch.device) -> torch.Tensor:
    """`(tensors, 4)` int64 addresses on `device`, copied without waiting for the device."""
    flat = [t.data_ptr() for group in zip(*tensors, strict=True) for t in group]
    table = torch.tensor(flat, dtype=torch.int64)
    if device.type == "cpu":
        return table
    # From pinned memory the copy is asynchronous, so the host never waits for the device here.
    return table.pin_memory().to(device, non_blocking=True)


def adamw_step_(
    params: Sequence[torch.Tensor],
    grads: Sequence[torch.Tensor],
    exp_avgs: Sequence[torch.Tensor],
    exp_avg_sqs: Sequence[torch.Tensor],
    table: BlockTable,
    *,
    lr: float,
    beta1: float,
    beta2: float,
    eps: float,
    weight_decay: float,
    step: int,
) -> None:
    """One AdamW step of every tensor in one launch (in place).

    Args:
        params: contiguous parameters, all of one dtype (float32, bfloat16 or float16).
        grads: their gradients, contiguous, of the parameters' dtype.
        exp_avgs, exp_avg_sqs: contiguous float32 moments.
        table: the `BlockTable` of the parameters' sizes on their device.
        lr, beta1, beta2, eps, weight_decay: the hyper-parameters.
        step: the step count after this step (1 for the first), shared by all the tensors.
    """
    tensors = (params, grads, exp_avgs, exp_avg_sqs)
    device = params[0].device
    aligned = all(t.data_ptr() % _ALIGNMENT == 0 for group in tensors for t in group)
    _adamw_kernel[(table.num_blocks,)](
        _addresses(tensors, device),
        table.numels,
        table.block_tensor,
        table.first_block,
        lr * weight_decay,
        beta1,
        beta2,
        eps,
        lr / (1 - beta1**step),
        (1 - beta2**step) ** 0.5,
        PARAM=_TRITON_DTYPES[params[0].dtype],
        ALIGNED=aligned,
        BLOCK=BLOCK,
        num_warps=_NUM_WARPS,
    )
