"""Learning-rate schedule: linear warm-up, then cosine annealing (the CS336 definition)."""

from __future__ import annotations

import math

__all__ = ["cosine_lr"]


def cosine_lr(step: int, max_lr: float, min_lr: float, warmup: int, total: int) -> float:
    """Learning rate at iteration `step`: linear warm-up, cosine decay, then constant `min_lr`.

    With `T_w = warmup` and `T_c = total`::

        step < T_w          →  step / T_w · max_lr
        T_w ≤ step ≤ T_c    →  min_lr + ½·(1 + cos(π·(step − T_w) / (T_c − T_w)))·(max_lr − min_lr)
        step > T_c          →  min_lr

    So the rate is 0 at step 0 (if there is a warm-up), `max_lr` at `warmup`, and `min_lr`
    from `total` on.

    Args:
        step: current iteration, from 0.
        max_lr: rate at the end of the warm-up.
        min_lr: rate at and after `total`.
        warmup: number of warm-up iterations `T_w` (0 for none).
        total: iteration `T_c` at which the cosine reaches `min_lr`; must exceed `warmup`.

    Raises:
        ValueError: `step` or `warmup` is negative, or `total <= warmup`.

    Example::

        >>> for group in optimizer.param_groups:
        ...     group["lr"] = cosine_lr(it, 3e-4, 3e-5, warmup=200, total=10_000)
    """
    if step < 0:
        raise ValueError(f"step must be >= 0, got {step}")
    if warmup < 0 or total <= warmup:
        raise ValueError(
            f"need 0 <= warmup < total, got warmup={warmup}, total={total}; "
            "the cosine phase must last at least one step"
        )
    if step < warmup:
        return step / warmup * max_lr
    if step > total:
        return min_lr
    progress = (step - warmup) / (total - warmup)
    return min_lr + 0.5 * (1.0 + math.cos(math.pi * progress)) * (max_lr - min_lr)
