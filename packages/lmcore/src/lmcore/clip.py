"""Gradient clipping by the global L2 norm."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable

import torch

__all__ = ["clip_grad_norm"]

# Added to the norm before dividing, as torch.nn.utils.clip_grad_norm_ does, so that a
# vanishing norm never divides by zero.
_EPS = 1e-6


@torch.no_grad()
def clip_grad_norm(params: Iterable[torch.Tensor] | torch.Tensor, max_norm: float) -> torch.Tensor:
    """Scale all gradients together so that their combined L2 norm is at most `max_norm`.

    The norm is taken over every gradient as one vector. If it exceeds `max_norm`, each gradient
    is multiplied by `max_norm / (norm + 1e-6)`; otherwise the gradients are left as they are.
    The comparison happens on the device (no host synchronisation). Parameters without a
    gradient are ignored. Same result as `torch.nn.utils.clip_grad_norm_`.

    Args:
        params: the parameters (or a single tensor) whose `.grad` to clip.
        max_norm: the largest allowed total norm.

    Returns:
        The total norm before clipping, a 0-dim tensor (0.0 if no parameter has a gradient).

    Raises:
        ValueError: `max_norm` is negative.
    """
    if not max_norm >= 0:
        raise ValueError(f"max_norm must be >= 0, got {max_norm}")
    if isinstance(params, torch.Tensor):
        params = [params]
    grads = [p.grad for p in params if p.grad is not None]
    if not grads:
        return torch.tensor(0.0)
    # Multi-tensor kernels need one device and dtype per call: group the gradients by both.
    groups: dict[tuple[torch.device, torch.dtype], list[torch.Tensor]] = defaultdict(list)
    for g in grads:
        groups[(g.device, g.dtype)].append(g)
    device = grads[0].device
    norms = [n.to(device) for group in groups.values() for n in torch._foreach_norm(group)]
    total = torch.linalg.vector_norm(torch.stack(norms))
    scale = (max_norm / (total + _EPS)).clamp(max=1.0)
    for (group_device, _), group in groups.items():
        torch._foreach_mul_(group, scale.to(group_device))
    return total
