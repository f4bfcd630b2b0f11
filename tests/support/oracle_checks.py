"""Checking attention against a float64 oracle, as fa2's tests do: flash-attn's tolerance.

An implementation's error against the float64 oracle may be at most twice the error of plain
PyTorch computing the same thing in the inputs' dtype (flash-attn's test rule), plus a floor for
errors at the dtype's rounding level.
"""

from __future__ import annotations

import torch

__all__ = ["assert_within_twice_plain", "grads", "relative_error"]


def relative_error(x: torch.Tensor, ref: torch.Tensor) -> float:
    """‖x - ref‖ / ‖ref‖ in float64 (the norm of ref floored, for an all-zero ref)."""
    return ((x.double() - ref).norm() / ref.norm().clamp_min(1e-12)).item()


def grads(o: torch.Tensor, inputs, do: torch.Tensor) -> list[torch.Tensor]:
    """[o, then the gradient of each input] for the output gradient `do`."""
    return [o, *torch.autograd.grad(o, inputs, do)]


def assert_within_twice_plain(ours, oracle, plain, dtype: torch.dtype) -> None:
    """Each of o, dq, dk, dv: error vs float64 at most 2x plain PyTorch's in this dtype + a floor
    (1e-5 for fp32, 1e-3 for 16-bit). Where the oracle is 0, ours must be 0 up to fp32 rounding:
    a query that sees nothing gives exact zeros, but one whose gradient cancels (a query seeing a
    single key: dS = P ∘ (dP - D) with dP and D the same sum in two orders) leaves the rounding
    of dP - D, about 1e-6 with gradients of order 1 (measured 1.5e-6 for dq at d = 128)."""
    floor = 1e-5 if dtype == torch.float32 else 1e-3
    zero_atol = 1e-5  # 10x the rounding that cancellation leaves; garbage would be of order 1
    for name, x, ref, p in zip(("o", "dq", "dk", "dv"), ours, oracle, plain, strict=True):
        assert x.shape == ref.shape, name
        assert torch.isfinite(x).all(), f"{name} has non-finite values"
        if ref.norm() < 1e-9:
            torch.testing.assert_close(x.double(), ref, atol=zero_atol, rtol=0)
            continue
        err, budget = relative_error(x, ref), 2 * relative_error(p, ref) + floor
        assert err <= budget, f"{name}: error {err:.2e} > budget {budget:.2e}"
