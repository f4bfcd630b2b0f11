"""Root-mean-square layer normalisation (Zhang & Sennrich, 2019)."""

from __future__ import annotations

import torch
from torch import nn

__all__ = ["RMSNorm"]


class RMSNorm(nn.Module):
    """`y = x / sqrt(mean(x²) + eps) * g` over the last dimension, with a learned gain `g`.

    The statistics are computed in at least float32 whatever the input dtype (squares of
    bf16/fp16 activations overflow or lose precision), and the result is cast back to the input
    dtype.

    Args:
        d_model: size of the normalised (last) dimension.
        eps: added to the mean square; 1e-5 as in the handout.
    """

    def __init__(self, d_model: int, *, eps: float = 1e-5) -> None:
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.empty(d_model))
        self.reset_parameters()

    def reset_parameters(self) -> None:
        """Set the gain to one, so that the layer starts as a pure normalisation."""
        nn.init.ones_(self.weight)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Normalise `x` of shape `(..., d_model)`; returns the same shape and dtype."""
        compute_dtype = torch.promote_types(x.dtype, torch.float32)
        xc = x.to(compute_dtype)
        inv_rms = torch.rsqrt(xc.pow(2).mean(dim=-1, keepdim=True) + self.eps)
        return (xc * inv_rms * self.weight.to(compute_dtype)).to(x.dtype)

    def extra_repr(self) -> str:
        return f"{self.weight.shape[0]}, eps={self.eps}"
