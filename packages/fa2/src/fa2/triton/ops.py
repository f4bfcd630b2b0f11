"""The custom ops torch.compile sees in place of the Triton launches (imported on first use).

`fa2::triton_forward` and `fa2::triton_backward` are `torch.library.triton_op`s: the compiler
traces their bodies, which launch through `wrap_triton`, so the compiled graph contains the
kernels themselves and launches them from its own generated code. Where it cannot trace them
(Triton's CPU interpreter: `wrap_triton` does not take interpreted kernels; no Triton at all)
they are opaque `custom_op`s with a shape function instead. Defining either kind imports
torch's compiler stack, which is why this module is imported only by a Function running under
torch.compile, never by `import fa2`.
"""

from __future__ import annotations

import importlib.util

import torch

from fa2.triton.configs import INTERPRET

__all__ = ["TRACEABLE", "backward_op", "forward_op"]

TRACEABLE = not INTERPRET and importlib.util.find_spec("triton") is not None


def _forward(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool, scale: float, precision: str
) -> tuple[torch.Tensor, torch.Tensor]:
    from fa2.triton.function import run_forward

    return run_forward(q, k, v, causal, scale, precision, traced=TRACEABLE)


def _forward_fake(q, k, v, causal, scale, precision):
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
    precision: str,
    deterministic: bool,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    from fa2.triton.function import run_backward

    return run_backward(
        q, k, v, o, lse, do, causal, scale, precision, deterministic, traced=TRACEABLE
    )


def _backward_fake(q, k, v, o, lse, do, causal, scale, precision, deterministic):
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
