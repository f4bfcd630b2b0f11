"""The SwiGLU feed-forward network (Shazeer, 2020), as used in LLaMA."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from lmcore.linear import Linear

__all__ = ["SwiGLU"]


class SwiGLU(nn.Module):
    """`FFN(x) = W2 (SiLU(W1 x) ⊙ W3 x)`, bias-free.

    Args:
        d_model: input and output width.
        d_ff: hidden width (the handout's sizes use `4 * d_model`).
    """

    def __init__(self, d_model: int, d_ff: int) -> None:
        super().__init__()
        self.w1 = Linear(d_model, d_ff)
        self.w2 = Linear(d_ff, d_model)
        self.w3 = Linear(d_model, d_ff)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Map `x` of shape `(..., d_model)` to the same shape."""
        return self.w2(F.silu(self.w1(x)) * self.w3(x))
