"""Causal multi-head self-attention with RoPE, delegating the attention itself to a backend."""

from __future__ import annotations

import torch
from torch import nn

from lmcore.backends import get_attention
from lmcore.linear import Linear
from lmcore.rope import RotaryEmbedding

__all__ = ["CausalSelfAttention"]


class CausalSelfAttention(nn.Module):
    """Project to queries, keys and values, rotate queries and keys, attend causally, project out.

    Args:
        d_model: model width; split into `num_heads` heads of `d_model // num_heads` features.
        num_heads: number of heads.
        rope: the rotary embedding applied to queries and keys (shared by all blocks).
        attention: name of a registered attention backend (see `lmcore.ATTENTION_BACKENDS`).

    Raises:
        ValueError: `attention` names no registered backend.
    """

    def __init__(
        self, d_model: int, num_heads: int, *, rope: RotaryEmbedding, attention: str
    ) -> None:
        super().__init__()
        self.num_heads = num_heads
        self.head_dim = d_model // num_heads
        self.attention = attention
        self.attend = get_attention(attention)
        self.rope = rope
        self.q_proj = Linear(d_model, d_model)
        self.k_proj = Linear(d_model, d_model)
        self.v_proj = Linear(d_model, d_model)
        self.output_proj = Linear(d_model, d_model)

    def _split_heads(self, x: torch.Tensor) -> torch.Tensor:
        # (batch, seq, d_model) -> (batch, heads, seq, head_dim)
        return x.unflatten(-1, (self.num_heads, self.head_dim)).transpose(1, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Attend over `x` of shape `(batch, seq, d_model)`; returns the same shape."""
        q = self.rope(self._split_heads(self.q_proj(x)))
        k = self.rope(self._split_heads(self.k_proj(x)))
        v = self._split_heads(self.v_proj(x))
        o = self.attend(q, k, v, causal=True)  # (batch, heads, seq, head_dim)
        o = o.transpose(1, 2).flatten(-2)  # (batch, seq, d_model)
        return self.output_proj(o)

    def extra_repr(self) -> str:
        return f"num_heads={self.num_heads}, head_dim={self.head_dim}, attention={self.attention!r}"
