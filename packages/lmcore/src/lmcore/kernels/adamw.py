"""AdamW over many tensors in one launch: a table of their addresses, one program per block.

The host writes, for the tensors of one launch, a table of four addresses each (parameter,
gradient, first and second moment) and their sizes, and splits every tensor into blocks of
`BLOCK` elements (`Launch`, kept between steps). Program `i` looks up which tensor its block
belongs to (`block_tensor[i]`) and where that tensor's blocks start (`first_block[t]`), casts
the addresses to pointers, and updates its block: one read of each of the four tensors and one
write of the parameter and the two moments, in float32 whatever the tensors' dtypes (the
parameter and the moments are each rounded once to their own dtype when stored), with torch's
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

__all__ = ["BLOCK", "MOMENT_DTYPES", "Launch", "adamw_step_"]

# Elements per program: 2,048 float32 values are 16 per thread at 4 warps, four 16-byte loads of
# each tensor in flight per thread, enough to keep the memory system busy on a streaming update
# (28 bytes per element, no reuse); the table costs 4 bytes per block, 1/14,000 of the traffic.
BLOCK = 2048
_NUM_WARPS = 4
_ALIGNMENT = 16  # bytes: one 128-bit load or store

_TRITON_DTYPES = {torch.float32: tl.float32, torch.bfloat16: tl.bfloat16, torch.float16: tl.float16}
# The dtypes the moments may be kept in: float32, or bfloat16 (half the bytes, torch's choice for
# bf16 parameters). Not float16: the second moment, g², leaves its range (a gradient below about
# 2.4e-4 squares to zero, fp16's smallest value being about 6e-8; one above 256 to infinity).
MOMENT_DTYPES = (torch.float32, torch.bfloat16)


@triton.jit
def _load(ptr, offsets, numel, MASKED: tl.constexpr):
    if MASKED:
        x = tl.load(ptr + offsets, mask=offsets < numel)
    else:
        x = tl.load(ptr + offsets)
    return x


@triton.jit
def _store(ptr, offsets, x, numel, MASKED: tl.constexpr):
    if MASKED:
        tl.store(ptr + offsets, x, mask=offsets < numel)
    else:
        tl.store(ptr + offsets, x)


@triton.jit
def _update(
    param_ptr,
    grad_ptr,
    exp_avg_ptr,
    exp_avg_sq_ptr,
    offsets,
    numel,
    lr_weight_decay,
    beta1,
    beta2,
    eps,
    step_size,
    bias_correction2_sqrt,
    MASKED: tl.constexpr,
):
    """AdamW on one block (torch's fused arithmetic, in float32)."""
    param = _load(param_ptr, offsets, numel, MASKED).to(tl.float32)
    grad = _load(grad_ptr, offsets, numel, MASKED).to(tl.float32)
    exp_avg = _load(exp_avg_ptr, offsets, numel, MASKED).to(tl.float32)
    exp_avg_sq = _load(exp_avg_sq_ptr, offsets, numel, MASKED).to(tl.float32)

    param = param - lr_weight_decay * param  # decoupled weight decay
    exp_avg = beta1 * exp_avg + (1 - beta1) * grad
    exp_avg_sq = beta2 * exp_avg_sq + (1 - beta2) * grad * grad
    denom = tl.div_rn(tl.sqrt_rn(exp_avg_sq), bias_correction2_sqrt) + eps
    param = param - step_size * tl.div_rn(exp_avg, denom)

    _store(param_ptr, offsets, param.to(param_ptr.dtype.element_ty), numel, MASKED)
    _store(exp_avg_ptr, offsets, exp_avg.to(exp_avg_ptr.dtype.element_ty), numel, MASKED)
    _store(exp_avg_sq_ptr, offsets, exp_avg_sq.to(exp_avg_sq_ptr.dtype.element_ty), numel, MASKED)


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
    MOMENT: tl.constexpr,
    ALIGNED: tl.constexpr,
    BLOCK: tl.constexpr,
):
    pid = tl.program_id(0)
    t = tl.load(block_tensor_ptr + pid).to(tl.int64)
    start = (pid - tl.load(first_block_ptr + t)).to(tl.int64) * BLOCK
    offsets = start + tl.arange(0, BLOCK)
    numel = tl.load(numels_ptr + t)

    row = addresses_ptr + 4 * t
    param_ptr = tl.load(row).to(tl.pointer_type(PARAM))
    grad_ptr = tl.load(row + 1).to(tl.pointer_type(PARAM))
    exp_avg_ptr = tl.load(row + 2).to(tl.pointer_type(MOMENT))
    exp_avg_sq_ptr = tl.load(row + 3).to(tl.pointer_type(MOMENT))
    if ALIGNED:  # 16-byte aligned pointers (declared on the pointers: vector loads and stores)
        param_ptr = tl.multiple_of(param_ptr, 16)
        grad_ptr = tl.multiple_of(grad_ptr, 16)
        exp_avg_ptr = tl.multiple_of(exp_avg_ptr, 16)
        exp_avg_sq_ptr = tl.multiple_of(exp_avg_sq_ptr, 16)

    # Every block but a tensor's last is whole: no mask, so that loads stay 16 bytes wide (a
    # mask compared with a size read from memory would split them into single elements).
    if start + BLOCK <= numel:
        _update(param_ptr, grad_ptr, exp_avg_ptr, exp_avg_sq_ptr, offsets, numel,
                lr_weight_decay, beta1, beta2, eps, step_size, bias_correction2_sqrt,
                MASKED=False)  # fmt: skip
    else:
        _update(param_ptr, grad_ptr, exp_avg_ptr, exp_avg_sq_ptr, offsets, numel,
                lr_weight_decay, beta1, beta2, eps, step_size, bias_correction2_sqrt,
                MASKED=True)  # fmt: skip


class Launch:
    """What one launch needs that follows from its tensors, kept between steps.

    The block map follows from the tensors' sizes, which never change; the address table from
    where the tensors live, which changes only when a gradient is allocated elsewhere (or a
    parameter's data or a moment is replaced). Each step compares the addresses (4 per tensor,
    host integers) and rebuilds and copies the table only when one moved, so a steady training
    loop pays one Python pass over the tensors and one kernel launch per step.

    Args:
        params: the launch's parameters, all of one dtype, on one device.
    """

    def __init__(self, params: Sequence[torch.Tensor]) -> None:
        device = params[0].device
        counts = [triton.cdiv(p.numel(), BLOCK) for p in params]
        first = [0, *itertools.accumulate(counts)][:-1]
        self.num_blocks = sum(counts)
        self.numels = torch.tensor([p.numel() for p in params], dtype=torch.int64).to(device)
        self.first_block = torch.tensor(first, dtype=torch.int32).to(device)
        owner = torch.repeat_interleave(torch.arange(len(counts)), torch.tensor(counts))
        self.block_tensor = owner.to(device=device, dtype=torch.int32)  # (blocks,)
        self.param_dtype = _TRITON_DTYPES[params[0].dtype]
        self.device = device
        self._pointers: list[int] = []
        self._addresses: torch.Tensor | None = None
        self.aligned = False

    def addresses(self, tensors: Sequence[Sequence[torch.Tensor]]) -> torch.Tensor:
        """`(tensors, 4)` int64 addresses of (param, grad, exp_avg, exp_avg_sq), on the device.

        Raises:
            ValueError: a rebuilt table finds a gradient that is not contiguous or not of its
                parameter's dtype, a gradient or moment of another size than its parameter or
                on another device than the launch's (the kernel would write past it), or
                moments of several dtypes or of one the kernel does not keep.
        """
        pointers = [t.data_ptr() for row in zip(*tensors, strict=True) for t in row]
        if pointers != self._pointers or self._addresses is None:
            for param, grad, *moments in zip(*tensors, strict=True):
                if not (grad.is_contiguous() and grad.dtype == param.dtype):
                    raise ValueError(
                        "fused AdamW needs contiguous gradients of the parameters' dtype; got "
                        f"{grad.dtype} of strides {grad.stride()} for a {param.dtype} parameter"
                    )
                for t in (param, grad, *moments):
                    if t.numel() != param.numel() or t.device != self.device:
                        raise ValueError(
                            f"fused AdamW needs each parameter's gradient and moments of its "
                            f"size on one device; got {t.numel()} elements on {t.device} for "
                            f"a parameter of {param.numel()} on {param.device}, updated on "
                            f"{self.device}. Was a parameter replaced or moved after the "
                            "optimizer's state was made? Build the optimizer after moving or "
                            "resizing the model"
                        )
            moment_dtypes = {m.dtype for m in (*tensors[2], *tensors[3])}
            if len(moment_dtypes) != 1 or not moment_dtypes <= set(MOMENT_DTYPES):
                raise ValueError(
                    "fused AdamW needs the moments of one launch in one dtype of "
                    f"{[str(d) for d in MOMENT_DTYPES]}, got {sorted(map(str, moment_dtypes))}"
                )
            table = torch.tensor(pointers, dtype=torch.int64)
            device = tensors[0][0].device
            if device.type != "cpu":
                # from pinned memory the copy is asynchronous: the host does not wait here
                table = table.pin_memory().to(device, non_blocking=True)
            self._pointers, self._addresses = pointers, table
            self.aligned = all(ptr % _ALIGNMENT == 0 for ptr in pointers)
        return self._addresses


def adamw_step_(
    launch: Launch,
    tensors: Sequence[Sequence[torch.Tensor]],
    *,
    lr: float,
    beta1: float,
    beta2: float,
    eps: float,
    weight_decay: float,
    step: int,
) -> None:
    """One AdamW step of every tensor of `launch` in one kernel launch (in place).

    Args:
        launch: the `Launch` of these parameters.
        tensors: `(params, grads, exp_avgs, exp_avg_sqs)`: contiguous parameters of one dtype
            (float32, bfloat16 or float16), their gradients (same dtype, contiguous) and
            contiguous moments, all of one dtype of `MOMENT_DTYPES`.
        lr, beta1, beta2, eps, weight_decay: the hyper-parameters.
        step: the step count after this step (1 for the first), shared by all the tensors.
    """
    addresses = launch.addresses(tensors)
    _adamw_kernel[(launch.num_blocks,)](
        addresses,
        launch.numels,
        launch.block_tensor,
        launch.first_block,
        lr * weight_decay,
        beta1,
        beta2,
        eps,
        lr / (1 - beta1**step),
        (1 - beta2**step) ** 0.5,
        PARAM=launch.param_dtype,
        MOMENT=_TRITON_DTYPES[tensors[2][0].dtype],
        ALIGNED=launch.aligned,
        BLOCK=BLOCK,
        num_warps=_NUM_WARPS,
    )
