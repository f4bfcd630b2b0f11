"""`FlashAttention2Triton`: the autograd Function that launches the kernels.

In eager mode the Function calls the launch plans directly (`fa2.triton.launch`): a
`torch.library` op's dispatch alone costs more host time than the kernels take at small sizes
(about 70 µs a call on an H100 host, measured). Under `torch.compile` it calls the custom ops
of `fa2.triton.ops` instead, which that module defines when it is first imported, from inside
the compiled function: defining them imports torch's compiler stack, which `import fa2` must
not pay for. Triton itself is imported on the first call too, so `import fa2` works where
Triton is not installed (macOS, Windows) and the PyTorch path stays usable there.
"""

from __future__ import annotations

import math

import torch
from torch.autograd.function import once_differentiable

from fa2.checks import MAX_HEAD_DIM, check_attention_inputs
from fa2.triton.configs import INTERPRET, dot_precision

__all__ = ["FlashAttention2Triton", "interpreting", "run_backward", "run_forward"]

_DTYPES = (torch.float16, torch.bfloat16, torch.float32)


def interpreting() -> bool:
    """True when Triton runs kernels in its CPU interpreter: TRITON_INTERPRET=1 when fa2 was
    imported (Triton, too, decides when the kernels are defined)."""
    return INTERPRET


def run_forward(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    causal: bool,
    scale: float,
    precision: str,
    *,
    traced: bool = False,
) -> tuple[torch.Tensor, torch.Tensor]:
    """o and the logsumexp L (fp32) for inputs of any leading dims."""
    if q.numel() == 0:
        return torch.empty_like(q), q.new_empty(q.shape[:-1], dtype=torch.float32)
    from fa2.triton.forward import flash_forward

    return flash_forward(q, k, v, causal, scale, precision, traced=traced)


def run_backward(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    o: torch.Tensor,
    lse: torch.Tensor,
    do: torch.Tensor,
    causal: bool,
    scale: float,
    precision: str,
    deterministic: bool = True,
    *,
    traced: bool = False,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """dq, dk, dv for inputs of any leading dims."""
    if q.numel() == 0 or k.numel() == 0:
        return torch.zeros_like(q), torch.zeros_like(k), torch.zeros_like(v)
    from fa2.triton.backward import flash_backward

    return flash_backward(
        q, k, v, o, lse, do, causal, scale, precision, deterministic=deterministic, traced=traced
    )


class FlashAttention2Triton(torch.autograd.Function):
    """FlashAttention-2 forward and backward as Triton kernels.

    Call as `FlashAttention2Triton.apply(q, k, v, is_causal=False, scale=None,
    return_lse=False, precision=None, deterministic=True)` with the options passed positionally
    (autograd Functions take no keyword arguments); `flash_attention` is the keyword-friendly
    front door.
    Works under `torch.compile`, with any strides the eager path takes.

    Args:
        q: `(..., heads, n_queries, d)`; k, v: `(..., kv_heads, n_keys, d)`, same dtype and
            device, the same dims before the heads; `heads` a multiple of `kv_heads`
            (grouped-query attention: query head h reads key/value head
            h // (heads // kv_heads); k and v are not copied). fp16, bf16 or fp32 CUDA
            tensors (CPU tensors only under TRITON_INTERPRET=1); any d up to 256 (tuned for
            16, 32, 64, 128). Inputs are read in place when the feature dim is contiguous
            and the dims before the heads merge into one stride (e.g. q, k, v transposed from
            (batch, seq, heads, d)); others are copied.
        is_causal: query i sees key j iff j <= i, both counted from 0 (top-left aligned). With
            n_queries < n_keys the trailing keys are seen by nobody and get zero gradient.
        scale: softmax scale, default 1/sqrt(d); must be positive.
        return_lse: also return the logsumexp L (not differentiable).
        precision: how fp32 inputs are multiplied, "tf32x3" (default: about fp32's accuracy
            on the tensor cores), "ieee" (exact fp32 FMA on the CUDA cores) or "tf32" (the
            default where `torch.backends.cuda.matmul.allow_tf32` is set). 16-bit inputs
            ignore it.
        deterministic: True (default): the backward gives the same bits on every run (dQ and
            dK/dV in two passes). False allows a single pass that computes all three and adds
            dQ atomically into an fp32 buffer, issuing 5 matmuls per tile pair instead of 7;
            dQ's last bits then vary from run to run. It is taken where it is faster: for
            fp32 inputs (on an H100, 0.58-0.91x the two-pass backward's time at d=64, about
            equal at d=128 with "tf32x3"; docs/results/fa2_single_pass_h100_2026-11-23.md);
            16-bit inputs keep the two passes, which are faster for them.

    Returns:
        o: `(..., heads, n_queries, d)` in the input dtype, or `(o, lse)` with `return_lse`,
        lse of shape `(..., heads, n_queries)` in fp32. For backward, q, k, v, o and lse are
        saved; nothing of size n_q × n_k is. The backward is deterministic and is itself not
        differentiable: a double backward (e.g. `create_graph=True` then differentiating the
        gradients) raises instead of giving wrong second derivatives.
    """

    @staticmethod
    def forward(
        ctx,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        is_causal: bool = False,
        scale: float | None = None,
        return_lse: bool = False,
        precision: str | None = None,
        deterministic: bool = True,
    ) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
        check_attention_inputs(q, k, v, dtypes=_DTYPES, max_head_dim=MAX_HEAD_DIM)
        if q.device.type != "cuda" and not interpreting():
            raise ValueError(
                f"FlashAttention2Triton needs CUDA tensors, got {q.device}. On the CPU use "
                "fa2.flash_attention or FlashAttention2PyTorch (or set TRITON_INTERPRET=1 "
                "before importing triton to run the kernels in Triton's interpreter)."
            )
        scale = 1.0 / math.sqrt(q.shape[-1]) if scale is None else float(scale)
        if not scale > 0:
            raise ValueError(
                f"the Triton kernels need a positive softmax scale, got {scale}; "
                "use FlashAttention2PyTorch for other scales"
            )
        precision = dot_precision(q.dtype, precision)
        if torch.compiler.is_compiling():
            from fa2.triton.ops import forward_op

            o, lse = forward_op(q, k, v, bool(is_causal), scale, precision)
        else:
            o, lse = run_forward(q, k, v, bool(is_causal), scale, precision)
        ctx.save_for_backward(q, k, v, o, lse)
        ctx.is_causal, ctx.scale, ctx.precision = bool(is_causal), scale, precision
        ctx.deterministic = bool(deterministic)
        if return_lse:
            ctx.mark_non_differentiable(lse)
            return o, lse
        return o

    @staticmethod
    @once_differentiable
    def backward(ctx, do: torch.Tensor, *_):
        q, k, v, o, lse = ctx.saved_tensors
        args = (q, k, v, o, lse, do, ctx.is_causal, ctx.scale, ctx.precision, ctx.deterministic)
        if torch.compiler.is_compiling():
            from fa2.triton.ops import backward_op

            dq, dk, dv = backward_op(*args)
        else:
            dq, dk, dv = run_backward(*args)
        return dq, dk, dv, None, None, None, None, None
