"""Bias-free linear and embedding layers with the handout's truncated-normal initialisation."""

from __future__ import annotations

import math

import torch
from torch import nn

from lmcore.linear_cross_entropy import fused_linear_cross_entropy

__all__ = ["Embedding", "LMHead", "Linear"]

# Initial weights are drawn from a normal distribution truncated at three standard deviations,
# as the CS336 handout prescribes, so no weight starts far out in the tail.
TRUNCATE_AT_STD = 3.0


def _trunc_normal_(weight: torch.Tensor, std: float) -> None:
    if weight.is_meta:
        # A meta tensor has no values to draw; skipping also avoids loading torch's Python
        # decompositions (seconds of imports) just to build a model for counting or to_empty().
        return
    nn.init.trunc_normal_(weight, std=std, a=-TRUNCATE_AT_STD * std, b=TRUNCATE_AT_STD * std)


class Linear(nn.Linear):
    """`y = x W^T` without bias; `W` of shape `(out_features, in_features)`.

    Weights start from N(0, 2 / (in + out)) truncated at ±3σ (the handout's choice, which keeps
    the activation variance roughly constant in both the forward and the backward pass).
    """

    def __init__(
        self,
        in_features: int,
        out_features: int,
        *,
        device: torch.device | str | None = None,
        dtype: torch.dtype | None = None,
    ) -> None:
        super().__init__(in_features, out_features, bias=False, device=device, dtype=dtype)

    def reset_parameters(self) -> None:
        """Redraw the weight from the truncated normal."""
        _trunc_normal_(self.weight, std=math.sqrt(2.0 / (self.in_features + self.out_features)))


class Embedding(nn.Embedding):
    """Token embedding table of shape `(num_embeddings, embedding_dim)`, N(0, 1) truncated at ±3."""

    def __init__(
        self,
        num_embeddings: int,
        embedding_dim: int,
        *,
        device: torch.device | str | None = None,
        dtype: torch.dtype | None = None,
    ) -> None:
        super().__init__(num_embeddings, embedding_dim, device=device, dtype=dtype)

    def reset_parameters(self) -> None:
        """Redraw the table from the truncated unit normal."""
        _trunc_normal_(self.weight, std=1.0)


class LMHead(Linear):
    """The LM head: logits `x W^T`, or, given targets, their cross-entropy without the logits.

    With `targets` the forward returns `fused_linear_cross_entropy(x, W, targets)` (mean over
    the tokens whose target is not `ignore_index`). Computing the loss inside the head's own
    forward keeps it where wrappers look: FSDP and similar wrappers gather a module's weights
    around its forward call, so the fused loss sees the whole weight under them too.
    """

    def forward(
        self, x: torch.Tensor, targets: torch.Tensor | None = None, *, ignore_index: int = -100
    ) -> torch.Tensor:
        """Logits `(..., out_features)`, or the mean loss (0-dim float32) when given targets."""
        if targets is None:
            return super().forward(x)
        return fused_linear_cross_entropy(x, self.weight, targets, ignore_index=ignore_index)
