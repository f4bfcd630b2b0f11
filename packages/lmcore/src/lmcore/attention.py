"""Causal multi-head self-attention with RoPE, delegating the attention itself to a backend."""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch
from torch import nn

from lmcore.backends import get_attention
from lmcore.linear import Linear
from lmcore.rope import RotaryEmbedding

if TYPE_CHECKING:
    from lmcore.documents import Documents
    from lmcore.kv_cache import LayerKVCache

__all__ = ["CausalSelfAttention"]


class CausalSelfAttention(nn.Module):
    """Project to queries, keys and values, rotate queries and keys, attend causally, project out.

    Args:
        d_model: model width; split into `num_heads` heads of `d_model // num_heads` features.
        num_heads: number of query heads.
        rope: the rotary embedding applied to queries and keys (shared by all blocks).
        attention: name of a registered attention backend (see `lmcore.ATTENTION_BACKENDS`).
        num_kv_heads: key/value heads, each shared by `num_heads // num_kv_heads` query heads
            (grouped-query attention); None gives every query head its own.

    Raises:
        ValueError: `attention` names no registered backend.
    """

    def __init__(
        self,
        d_model: int,
        num_heads: int,
        *,
        rope: RotaryEmbedding,
        attention: str,
        num_kv_heads: int | None = None,
    ) -> None:
        super().__init__()
        self.num_heads = num_heads
        self.num_kv_heads = num_heads if num_kv_heads is None else num_kv_heads
        self.head_dim = d_model // num_heads
        self.attention = attention
        self.attend = get_attention(attention)
        self.rope = rope
        kv_dim = self.num_kv_heads * self.head_dim
        self.q_proj = Linear(d_model, d_model)
        self.k_proj = Linear(d_model, kv_dim)
        self.v_proj = Linear(d_model, kv_dim)
        self.output_proj = Linear(d_model, d_model)

    def _split_heads(self, x: torch.Tensor, heads: int) -> torch.Tensor:
        # (batch, seq, heads * head_dim) -> (batch, heads, seq, head_dim)
        return x.unflatten(-1, (heads, self.head_dim)).transpose(1, 2)

    def forward(
        self,
        x: torch.Tensor,
        *,
        kv_cache: LayerKVCache | None = None,
        documents: Documents | None = None,
    ) -> torch.Tensor:
        """Attend over `x` of shape `(batch, seq, d_model)`; returns the same shape.

        With `kv_cache` (decoding), `x` holds the tokens after the cached ones: their positions
        start at `kv_cache.offset`, and they attend to the cached tokens too. With `documents`
        (packed rows), each token has its position in its document and attends only there.
        """
        offset = 0 if kv_cache is None else kv_cache.offset
        positions = None if documents is None else documents.positions
        q = self._split_heads(self.q_proj(x), self.num_heads)
        k = self._split_heads(self.k_proj(x), self.num_kv_heads)
        q = self.rope(q, offset=offset, positions=positions)
        k = self.rope(k, offset=offset, positions=positions)
        v = self._split_heads(self.v_proj(x), self.num_kv_heads)
        if kv_cache is not None:
            o = kv_cache.attend(q, k, v)  # (batch, seq, heads, head_dim)
        elif documents is not None:
            o = documents.attend(q, k, v)  # (batch, seq, heads, head_dim)
        else:
            o = self.attend(q, k, v, causal=True).transpose(1, 2)  # (batch, seq, heads, head_dim)
        return self.output_proj(o.flatten(-2))  # (batch, seq, d_model)

    def extra_repr(self) -> str:
        return (
            f"num_heads={self.num_heads}, num_kv_heads={self.num_kv_heads}, "
            f"head_dim={self.head_dim}, attention={self.attention!r}"
        )
