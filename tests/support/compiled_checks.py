"""Running a function eagerly and under torch.compile, as the compile tests compare them."""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch

__all__ = ["eager_and_compiled"]


def eager_and_compiled(
    fn: Callable[..., torch.Tensor], inputs: Sequence[torch.Tensor], grad_out: torch.Tensor
) -> tuple[tuple[torch.Tensor, ...], tuple[torch.Tensor, ...], list[str]]:
    """`fn(*inputs)`'s output and the inputs' gradients for `grad_out`, eagerly and compiled
    (`torch.compile(fullgraph=True)` after a fresh dynamo state), with the compiled code
    Inductor generated (forward and backward graphs), so a test can check what it calls."""
    from torch._inductor.utils import run_and_get_code

    def step(f):
        for t in inputs:
            t.grad = None
        out = f(*inputs)
        out.backward(grad_out)
        return out.detach(), *(t.grad.clone() for t in inputs)

    eager = step(fn)
    torch._dynamo.reset()
    compiled, codes = run_and_get_code(step, torch.compile(fn, fullgraph=True))
    return eager, compiled, codes
