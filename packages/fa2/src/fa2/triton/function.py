"""`FlashAttention2Triton`: the autograd Function that launches the kernels.

In eager mode the Function calls the launch plans directly (`fa2.triton.launch`): a
`torch.library` op's dispatch alone costs more host time than the kernels take at small sizes
(about 70 µs a call on an H100 host, measured). Under `torch.compile` the launches go through two
`torch.library.triton_op`s (`fa2::triton_forward`, `fa2::triton_backward`) whose bodies launch
through `wrap_triton`, so the compiler sees the kernels themselves and launches them from its
generated code, without a Python op in between. Under Triton's CPU interpreter they are opaque
custom ops instead (`wrap_triton` cannot take interpreted kernels). Triton itself is imported
on the first call, so `import fa2` works where Triton is not installed (macOS, Windows) and the
PyTorch path stays usable there.
"""

from __future__ import annotations

import importlib.util
import math

import torch

from fa2.checks import MAX_HEAD_DIM, check_attention_inputs
from fa2.triton.configs import INTERPRET

__all__ = ["FlashAttention2Triton", "interpreting"]

_DTYPES = (torch.float16, torch.bfloat16, torch.float32)


def interpreting() -> bool:
    """True when Triton runs kernels in its CPU interpreter: TRITON_INTERPRET=1 when fa2 was
    imported (Triton, too, decides when the kernels are defined)."""
    return INTERPRET


# torch.compile traces into the kernels through `triton_op`s, except where it cannot: under
# Triton's interpreter (`wrap_triton` does not take interpreted kernels) and without Triton.
_TRACEABLE = not INTERPRET and importlib.util.find_spec("triton") is not None


def _forward(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    causal: bool,
    scale: float,
    traced: bool = False,
) -> tuple[torch.Tensor, torch.Tensor]:
    """o and the logsumexp L for inputs of any leading dims."""
    if q.numel() == 0:
        return torch.empty_like(q), q.new_empty(q.shape[:-1], dtype=torch.float32)
    from fa2.triton.forward import flash_forward

    return flash_forward(q, k, v, causal, scale, traced=traced)


def _forward_traced(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool, scale: float
) -> tuple[torch.Tensor, torch.Tensor]:
    return _forward(q, k, v, causal, scale, traced=_TRACEABLE)


def _forward_fake(q, k, v, causal, scale):
    o = torch.empty(q.shape, dtype=q.dtype, device=q.device)
    return o, torch.empty(q.shape[:-1], dtype=torch.float32, device=q.device)


def _backward(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    o: torch.Tensor,
    lse: torch.Tensor,
    do: torch.Tensor,
    causal: bool,
    scale: float,
    traced: bool = False,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """dq, dk, dv for inputs of any leading dims."""
    if q.numel() == 0 or k.numel() == 0:
        return torch.zeros_like(q), torch.zeros_like(k), torch.zeros_like(v)
    from fa2.triton.backward import flash_backward

    return flash_backward(q, k, v, o, lse, do, causal, scale, traced=traced)


def _backward_traced(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    o: torch.Tensor,
    lse: torch.Tensor,
    do: torch.Tensor,
    causal: bool,
    scale: float,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    return _backward(q, k, v, o, lse, do, causal, scale, traced=_TRACEABLE)


def _backward_fake(q, k, v, o, lse, do, causal, scale):
    return tuple(torch.empty(t.shape, dtype=t.dtype, device=t.device) for t in (q, k, v))


def _define_op(name: str, fn, fake):
    """The op torch.compile sees: a `triton_op` it traces into where it can (`_TRACEABLE`),
    else an opaque `custom_op` with a shape function."""
    if _TRACEABLE:
        return torch.library.triton_op(name, fn, mutates_args=())
    op = torch.library.custom_op(name, fn, mutates_args=())
    op.register_fake(fake)
    return op


_forward_op = _define_op("fa2::triton_forward", _forward_traced, _forward_fake)
_backward_op = _define_op("fa2::triton_backward", _backward_traced, _backward_fake)


class FlashAttention2Triton(torch.autograd.Function):
    """FlashAttention-2 forward and backward as Triton kernels.

    Call as `FlashAttention2Triton.apply(q, k, v, is_causal=False, scale=None)` with the options
    passed positionally (autograd Functions take no keyword arguments); `flash_attention` is the
    keyword-friendly front door. Works under `torch.compile`.

    Args:
        q: `(..., n_queries, d)`; k, v: `(..., n_keys, d)`, same leading dims, dtype and device.
            fp16, bf16 or fp32 CUDA tensors (CPU tensors only under TRITON_INTERPRET=1);
            any d up to 256 (tuned for 16, 32, 64, 128).
        is_causal: query i sees key j iff j <= i, both counted from 0 (top-left aligned). With
            n_queries < n_keys the trailing keys are seen by nobody and get zero gradient.
        scale: softmax scale, default 1/sqrt(d).

    Returns:
        o: `(..., n_queries, d)` in the input dtype. For backward, q, k, v, o and one fp32
        logsumexp tensor L of shape `(..., n_queries)` are saved; nothing of size n_q × n_k is.
        fp32 inputs use exact fp32 dot products unless `torch.backends.cuda.matmul.allow_tf32`.
    """

    @staticmethod
    def forward(
        ctx,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        is_causal: bool = False,
        scale: float | None = None,
    ) -> torch.Tensor:
        check_attention_inputs(q, k, v, dtypes=_DTYPES, max_head_dim=MAX_HEAD_DIM)
        if q.device.type != "cuda" and not interpreting():
            raise ValueError(
                f"FlashAttention2Triton needs CUDA tensors, got {q.device}. On the CPU use "
                "fa2.flash_attention or FlashAttention2PyTorch (or set TRITON_INTERPRET=1 "
                "before importing triton to run the kernels in Triton's interpreter)."
            )
        scale = 1.0 / math.sqrt(q.shape[-1]) if scale is None else float(scale)
        run = _forward_op if torch.compiler.is_compiling() else _forward
        o, lse = run(q, k, v, bool(is_causal), scale)
        ctx.save_for_backward(q, k, v, o, lse)
        ctx.is_causal, ctx.scale = bool(is_causal), scale
        return o

    @staticmethod
    def backward(ctx, do: torch.Tensor):
        q, k, v, o, lse = ctx.saved_tensors
        run = _backward_op if torch.compiler.is_compiling() else _backward
        dq, dk, dv = run(q, k, v, o, lse, do, ctx.is_causal, ctx.scale)
        return dq, dk, dv, None, None
