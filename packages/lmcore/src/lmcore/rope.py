"""Rotary position embeddings (RoPE; Su et al., 2021, "RoFormer")."""

from __future__ import annotations

import torch
from torch import nn

__all__ = ["RotaryEmbedding"]


class RotaryEmbedding(nn.Module):
    """Rotate each adjacent feature pair `(x[2k], x[2k+1])` of a query or key by `i · θ^(-2k/d)`.

    Position `i` is the token's index in the sequence, so the dot product of a rotated query
    and key depends only on their distance. The cosine and sine tables are precomputed in
    float32 for `context_length` positions and kept as non-persistent buffers: they follow the
    module across devices but are not part of the state dict, and they stay float32 when the
    module is cast to a narrower dtype (`model.to(torch.bfloat16)` would otherwise round angles
    of up to `context_length` radians to 8 bits of mantissa); the rotation is computed in
    float32 and its result cast to the input's dtype.

    Args:
        head_dim: features per head `d`; must be even.
        context_length: number of positions to precompute.
        theta: base wavelength Θ.
    """

    cos: torch.Tensor
    sin: torch.Tensor

    def __init__(self, head_dim: int, context_length: int, *, theta: float) -> None:
        super().__init__()
        self.head_dim = head_dim
        self.context_length = context_length
        self.theta = theta
        shape = (context_length, head_dim // 2)
        self.register_buffer("cos", torch.empty(shape), persistent=False)
        self.register_buffer("sin", torch.empty(shape), persistent=False)
        self.reset_parameters()

    def reset_parameters(self) -> None:
        """Recompute the tables in place (e.g. after `to_empty()` from the meta device)."""
        # Angles reach context_length radians: computed in float64 on the CPU (every backend has
        # it there) and rounded once to float32 by the copy into the buffers.
        inv_freq = self.theta ** (
            -torch.arange(0, self.head_dim, 2, dtype=torch.float64, device="cpu") / self.head_dim
        )
        positions = torch.arange(self.context_length, dtype=torch.float64, device="cpu")
        angles = torch.outer(positions, inv_freq)  # (context_length, head_dim // 2)
        self.cos.copy_(angles.cos())
        self.sin.copy_(angles.sin())

    def _apply(self, fn, recurse=True):  # type: ignore[override]
        # `module.to(dtype)`, `.half()`, `.bfloat16()` reach buffers through `_apply`: let them
        # move the tables to another device, but keep them at least float32 by taking the
        # float32 values (moved) rather than the rounded ones.
        tables = {"cos": self.cos, "sin": self.sin}
        super()._apply(fn, recurse)
        for name, before in tables.items():
            after = self._buffers[name]
            if after.dtype in (torch.float16, torch.bfloat16):
                self._buffers[name] = before.to(device=after.device)
        return self

    def forward(
        self, x: torch.Tensor, *, offset: int = 0, positions: torch.Tensor | None = None
    ) -> torch.Tensor:
        """Rotate `x` `(..., seq, head_dim)` for positions `offset … offset+seq-1` (`offset`:
        tokens before these, as when decoding with a KV cache), or for `positions` `(batch,
        seq)` of `x` `(batch, heads, seq, head_dim)` (each token's own, as in packed
        documents); same shape and dtype."""
        seq = x.shape[-2]
        if positions is None:
            cos, sin = self.cos[offset : offset + seq], self.sin[offset : offset + seq]
        else:  # (batch, 1, seq, d // 2): the same angles for every head
            cos, sin = self.cos[positions].unsqueeze(1), self.sin[positions].unsqueeze(1)
        pairs = x.unflatten(-1, (-1, 2))  # (..., seq, head_dim // 2, 2)
        even, odd = pairs[..., 0], pairs[..., 1]
        rotated = torch.stack((even * cos - odd * sin, even * sin + odd * cos), dim=-1)
        return rotated.flatten(-2).to(x.dtype)

    def extra_repr(self) -> str:
        return f"head_dim={self.head_dim}, context_length={self.context_length}, theta={self.theta}"
