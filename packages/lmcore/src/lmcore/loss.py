"""Cross-entropy loss over next-token logits."""

from __future__ import annotations

import torch

__all__ = ["cross_entropy"]


def cross_entropy(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """Mean negative log-likelihood of `targets` under `softmax(logits)`.

    Uses `−log softmax(x)[y] = logsumexp(x − max x) − (x[y] − max x)`: subtracting the row
    maximum first keeps every exponent ≤ 0, so logits of any magnitude (1e4 and beyond) neither
    overflow nor lose the target's term. Half-precision logits are upcast to float32.

    Args:
        logits: `(..., vocab)` unnormalised scores.
        targets: `(...)` integer class ids in `[0, vocab)`.

    Returns:
        A 0-dim tensor: the mean over all leading positions (float32, or float64 for float64
        logits).

    Raises:
        ValueError: the shapes do not match or there are no positions.
        TypeError: `targets` is not an integer tensor.
    """
    if logits.dim() < 1 or targets.shape != logits.shape[:-1]:
        raise ValueError(
            f"targets must have the shape of logits without the last (vocab) dimension; got "
            f"logits {tuple(logits.shape)} and targets {tuple(targets.shape)}"
        )
    if targets.is_floating_point() or targets.is_complex() or targets.dtype == torch.bool:
        raise TypeError(f"targets must be integer class ids, got dtype {targets.dtype}")
    if targets.numel() == 0:
        raise ValueError("cross_entropy of an empty batch is undefined")
    if logits.dtype in (torch.float16, torch.bfloat16):
        logits = logits.float()
    shifted = logits - logits.amax(dim=-1, keepdim=True).detach()
    log_normaliser = shifted.exp().sum(dim=-1).log()  # (...)
    target_logit = shifted.gather(-1, targets.long().unsqueeze(-1)).squeeze(-1)  # (...)
    return (log_normaliser - target_logit).mean()
