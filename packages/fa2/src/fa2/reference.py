"""Plain softmax attention that materialises the score matrix: the oracle for the kernels."""

from __future__ import annotations

import math

import torch

__all__ = ["attention_reference"]


def attention_reference(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    *,
    causal: bool = False,
    scale: float | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Return `(o, lse)`: softmax(q kᵀ · scale) v and the logsumexp of each score row.

    Computed in the inputs' dtype (pass float64 tensors for an exact oracle). With `causal`, query
    i sees key j iff j <= i, indices from 0 for both (top-left aligned). Memory is
    O(n_queries · n_keys): for tests and small problems only.
    """
    scale = 1.0 / math.sqrt(q.shape[-1]) if scale is None else scale
    s = (q @ k.transpose(-1, -2)) * scale  # (..., n_queries, n_keys)
    if causal:
        i = torch.arange(q.shape[-2], device=q.device)[:, None]
        j = torch.arange(k.shape[-2], device=q.device)[None, :]
        s = s.masked_fill(j > i, float("-inf"))
    lse = torch.logsumexp(s, dim=-1)
    return torch.softmax(s, dim=-1) @ v, lse
