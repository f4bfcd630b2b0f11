"""AdamW (Loshchilov & Hutter, 2019) written out, numerically equal to `torch.optim.AdamW`."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

import torch

__all__ = ["AdamW"]


def _step_dtype() -> torch.dtype:
    # torch.optim keeps `step` as a float32 CPU scalar (float64 when that is the default dtype);
    # doing the same keeps state dicts interchangeable with torch's AdamW.
    return torch.float64 if torch.get_default_dtype() == torch.float64 else torch.float32


class AdamW(torch.optim.Optimizer):
    """Adam with decoupled weight decay, step for step the same arithmetic as `torch.optim.AdamW`.

    For each parameter θ with gradient g, at step t (counted from 1)::

        θ ← θ · (1 − lr·λ)                          decoupled weight decay
        m ← β₁·m + (1 − β₁)·g                       first moment
        v ← β₂·v + (1 − β₂)·g²                      second moment
        θ ← θ − lr / (1 − β₁ᵗ) · m / (√v / √(1 − β₂ᵗ) + ε)

    The per-parameter state is `step` (a float CPU scalar tensor), `exp_avg` (m) and `exp_avg_sq`
    (v), with the names and layout torch uses, so state dicts load in either direction.
    Parameters whose `grad` is None are skipped (their step count does not advance).

    Two implementations of the same arithmetic, chosen by `foreach`:

    - multi-tensor: `torch._foreach_*` operations over each parameter group, which on a GPU
      launch a handful of kernels per group instead of a handful per parameter. The operations
      and their order are those of torch's own foreach AdamW.
    - per-parameter: a loop over the parameters, torch's single-tensor AdamW written out; the
      readable one, and the reference the multi-tensor path is tested against.

    By default (`foreach=None`) a group whose parameters are all on CUDA takes the multi-tensor
    path and any other the per-parameter one, torch's own rule: on the CPU the `_foreach_`
    operations run as a loop over the tensors anyway and save nothing.

    Both give bit-for-bit the results of `torch.optim.AdamW` (either of its paths) in fp32 and
    fp64: every elementwise operation is the same IEEE operation in the same order, and the bias
    corrections are the same Python-float expressions.

    Args:
        params: parameters or parameter groups (dicts), as for any `torch.optim.Optimizer`.
        lr: learning rate.
        betas: (β₁, β₂), decay rates of the moment estimates.
        eps: added to the denominator for numerical stability.
        weight_decay: decoupled weight decay λ (multiplied by `lr`).
        foreach: True for the multi-tensor path, False for the per-parameter loop, None (the
            default) for multi-tensor on CUDA and per-parameter elsewhere.

    Raises:
        ValueError: a hyper-parameter is out of range.

    Example::

        >>> optimizer = AdamW(model.parameters(), lr=3e-4, weight_decay=0.1)
        >>> loss.backward()
        >>> optimizer.step()
        >>> optimizer.zero_grad()
    """

    def __init__(
        self,
        params: Iterable[torch.Tensor] | Iterable[dict[str, Any]],
        lr: float = 1e-3,
        betas: tuple[float, float] = (0.9, 0.999),
        eps: float = 1e-8,
        weight_decay: float = 1e-2,
        *,
        foreach: bool | None = None,
    ) -> None:
        if not lr >= 0.0:
            raise ValueError(f"learning rate must be >= 0, got {lr}")
        if len(betas) != 2 or not all(0.0 <= beta < 1.0 for beta in betas):
            raise ValueError(f"betas must be two numbers in [0, 1), got {betas}")
        if not eps >= 0.0:
            raise ValueError(f"eps must be >= 0, got {eps}")
        if not weight_decay >= 0.0:
            raise ValueError(f"weight_decay must be >= 0, got {weight_decay}")
        defaults = {
            "lr": lr,
            "betas": tuple(betas),
            "eps": eps,
            "weight_decay": weight_decay,
            "foreach": foreach,
        }
        super().__init__(params, defaults)

    def _init_state(self, param: torch.Tensor) -> dict[str, torch.Tensor]:
        state = self.state[param]
        if not state:
            state["step"] = torch.tensor(0.0, dtype=_step_dtype())
            state["exp_avg"] = torch.zeros_like(param, memory_format=torch.preserve_format)
            state["exp_avg_sq"] = torch.zeros_like(param, memory_format=torch.preserve_format)
        return state

    @torch.no_grad()
    def step(self, closure: Callable[[], float] | None = None) -> float | None:
        """Update every parameter that has a gradient; returns the closure's loss if one is given.

        Raises:
            RuntimeError: a gradient is sparse (not supported).
        """
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        for group in self.param_groups:
            self._step_group(group)
        return loss

    def _step_group(self, group: dict[str, Any]) -> None:
        params = [p for p in group["params"] if p.grad is not None]
        if not params:
            return
        if any(p.grad.is_sparse for p in params):
            raise RuntimeError(
                "AdamW does not support sparse gradients; use torch.optim.SparseAdam"
            )
        foreach = group.get("foreach")
        if foreach is None:
            foreach = all(p.is_cuda for p in params)
        if foreach:
            self._step_foreach(params, group)
        else:
            for param in params:
                self._step_one(param, group)

    def _step_one(self, param: torch.Tensor, group: dict[str, Any]) -> None:
        """The per-parameter update (torch's single-tensor AdamW)."""
        state = self._init_state(param)
        grad, exp_avg, exp_avg_sq = param.grad, state["exp_avg"], state["exp_avg_sq"]
        lr, eps, weight_decay = group["lr"], group["eps"], group["weight_decay"]
        beta1, beta2 = group["betas"]

        state["step"] += 1
        if weight_decay != 0:
            param.mul_(1 - lr * weight_decay)
        exp_avg.lerp_(grad, 1 - beta1)
        exp_avg_sq.mul_(beta2).addcmul_(grad, grad, value=1 - beta2)

        t = state["step"].item()
        step_size = lr / (1 - beta1**t)
        denom = (exp_avg_sq.sqrt() / (1 - beta2**t) ** 0.5).add_(eps)
        param.addcdiv_(exp_avg, denom, value=-step_size)

    def _step_foreach(self, params: list[torch.Tensor], group: dict[str, Any]) -> None:
        """The multi-tensor update of one group's `params` (torch's foreach AdamW)."""
        grads = [p.grad for p in params]
        states = [self._init_state(p) for p in params]
        exp_avgs = [s["exp_avg"] for s in states]
        exp_avg_sqs = [s["exp_avg_sq"] for s in states]
        steps = [s["step"] for s in states]
        lr, eps, weight_decay = group["lr"], group["eps"], group["weight_decay"]
        beta1, beta2 = group["betas"]

        torch._foreach_add_(steps, 1)
        if weight_decay != 0:
            torch._foreach_mul_(params, 1 - lr * weight_decay)
        torch._foreach_lerp_(exp_avgs, grads, 1 - beta1)
        torch._foreach_mul_(exp_avg_sqs, beta2)
        torch._foreach_addcmul_(exp_avg_sqs, grads, grads, 1 - beta2)

        # Bias corrections are Python floats: the step counters live on the CPU, so reading
        # them never waits for the device.
        counts = [s.item() for s in steps]
        neg_step_sizes = [-(lr / (1 - beta1**t)) for t in counts]
        bias_correction2_sqrt = [(1 - beta2**t) ** 0.5 for t in counts]
        denom = torch._foreach_sqrt(exp_avg_sqs)
        torch._foreach_div_(denom, bias_correction2_sqrt)
        torch._foreach_add_(denom, eps)
        torch._foreach_addcdiv_(params, exp_avgs, denom, neg_step_sizes)
