"""Where the heads and the sequence sit in q, k, v: the layouts fa2 accepts, and their views.

- "bhsd": `(..., heads, seq, head_dim)`, fa2's default and SDPA's layout.
- "bshd": `(..., seq, heads, head_dim)`, flash-attn's layout, and what a Transformer's
  projections give before any transpose.
- "thd": `(total_tokens, heads, head_dim)`, variable-length sequences packed one after another
  (flash-attn's `flash_attn_varlen_func`); which tokens form a sequence is given separately.

The kernels and the tiled PyTorch code index `(..., heads, seq, head_dim)`: "bshd" and "thd"
are read through a transposed view of the same memory, never copied for it, and outputs are
allocated contiguous in the caller's layout.
"""

from __future__ import annotations

import torch

__all__ = ["LAYOUTS", "as_bhsd"]

# The layouts a caller may name (the front door's `layout=`); "thd" comes with cu_seqlens.
LAYOUTS = ("bhsd", "bshd")


def as_bhsd(t: torch.Tensor, layout: str) -> torch.Tensor:
    """`t` seen as `(..., heads, seq, head_dim)`: itself for "bhsd", a transposed view for
    "bshd" and "thd"."""
    return t if layout == "bhsd" else t.transpose(-3, -2)
