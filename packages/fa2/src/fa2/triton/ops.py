"""The custom ops torch.compile sees in place of the Triton launches (imported on first use).

`fa2::triton_forward` and `fa2::triton_backward` are `torch.library.triton_op`s: the compiler
traces their bodies, which launch through `wrap_triton`, so the compiled graph contains the
kernels themselves and launches them from its own generated code. Where it cannot trace them
(Triton's CPU interpreter: `wrap_triton` does not take interpreted kernels; no Triton at all)
they are opaque `custom_op`s with a shape function instead. Defining either kind imports
torch's compiler stack, which is why this module is imported only by a Function running under
torch.compile, never by `import fa2`. It builds its launch plans from `fa2.triton.forward` and
`fa2.triton.backward`; the Function validates the call before it gets here.

The ops take a call's options as flat arguments (custom ops take tensors and scalars only):
`op_options` turns a validated call into them, in the order both ops take them.
"""

from __future__ import annotations

import importlib.util

import torch

from fa2.checks import Call
from fa2.layouts import as_bhsd
from fa2.masks import Band
from fa2.triton.configs import INTERPRET

__all__ = ["TRACEABLE", "backward_op", "forward_op", "op_options"]

TRACEABLE = not INTERPRET and importlib.util.find_spec("triton") is not None


def op_options(
    call: Call,
    precision: str,
    same_lengths: bool,
    max_seqlen_q: int | None,
    max_seqlen_k: int | None,
) -> tuple:
    """A validated call's options as the ops take them, after the tensors."""
    band = call.band
    return (
        call.scale, precision, band.left, band.right, band.bottom_right, call.softcap,
        call.layout, max_seqlen_q or 0, max_seqlen_k or 0, same_lengths,
    )  # fmt: skip


def _plan(q, k, v, scale, precision, left, right, bottom_right, softcap, layout, max_q, max_k,
          same_lengths):  # fmt: skip
    """The forward plan of an op's arguments, built afresh (shapes may be symbolic when traced,
    and tracing happens once)."""
    from fa2.triton.forward import ForwardPlan

    call = Call(Band(left, right, bottom_right), softcap, scale, layout)
    seq_len = max(max_q, max_k) if layout == "thd" else None
    return ForwardPlan(q, k, v, call, precision, same_lengths, TRACEABLE, seq_len)


def _packed(layout, cu_q, cu_k, max_q, max_k):
    """(cu_seqlens, max_seqlens) of packed sequences, else (None, None)."""
    return ((cu_q, cu_k), (max_q, max_k)) if layout == "thd" else (None, None)


def _forward(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    cu_seqlens_q: torch.Tensor | None,
    cu_seqlens_k: torch.Tensor | None,
    scale: float,
    precision: str,
    left: int,
    right: int,
    bottom_right: bool,
    softcap: float,
    layout: str,
    max_seqlen_q: int,
    max_seqlen_k: int,
    same_lengths: bool,
) -> tuple[torch.Tensor, torch.Tensor]:
    plan = _plan(q, k, v, scale, precision, left, right, bottom_right, softcap, layout,
                 max_seqlen_q, max_seqlen_k, same_lengths)  # fmt: skip
    cu, longest = _packed(layout, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k)
    return plan(q, k, v, scale, cu, longest, TRACEABLE)


def _forward_fake(q, k, v, cu_q, cu_k, scale, precision, left, right, bottom_right, softcap,
                  layout, max_q, max_k, same_lengths):  # fmt: skip
    o = torch.empty(q.shape, dtype=q.dtype, device=q.device)
    lse_shape = as_bhsd(q, layout).shape[:-1]
    return o, torch.empty(lse_shape, dtype=torch.float32, device=q.device)


def _backward(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    o: torch.Tensor,
    lse: torch.Tensor,
    do: torch.Tensor,
    cu_seqlens_q: torch.Tensor | None,
    cu_seqlens_k: torch.Tensor | None,
    scale: float,
    precision: str,
    left: int,
    right: int,
    bottom_right: bool,
    softcap: float,
    layout: str,
    max_seqlen_q: int,
    max_seqlen_k: int,
    same_lengths: bool,
    deterministic: bool,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    from fa2.triton.backward import BackwardPlan

    fwd = _plan(q, k, v, scale, precision, left, right, bottom_right, softcap, layout,
                max_seqlen_q, max_seqlen_k, same_lengths)  # fmt: skip
    plan = BackwardPlan(fwd, q, k, v, o, lse, do, deterministic, TRACEABLE)
    cu, longest = _packed(layout, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k)
    return plan(q, k, v, o, lse, do, scale, cu, longest, TRACEABLE)


def _backward_fake(q, k, v, o, lse, do, *options):
    return tuple(torch.empty(t.shape, dtype=t.dtype, device=t.device) for t in (q, k, v))


def _define_op(name: str, fn, fake):
    """A `triton_op` where torch.compile can trace into it (`TRACEABLE`), else an opaque
    `custom_op` with a shape function."""
    if TRACEABLE:
        return torch.library.triton_op(name, fn, mutates_args=())
    op = torch.library.custom_op(name, fn, mutates_args=())
    op.register_fake(fake)
    return op


forward_op = _define_op("fa2::triton_forward", _forward, _forward_fake)
backward_op = _define_op("fa2::triton_backward", _backward, _backward_fake)
