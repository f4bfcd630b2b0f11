"""flash-attn's packed entry points: q, k and v stacked in one tensor (`qkvpacked`), or k and v
in one (`kvpacked`), for both the padded-batch and the variable-length layouts.

Each unpacks its tensor into views (no copy) and calls `flash_attn_func` or
`flash_attn_varlen_func`, so arguments, masks, return values and errors are theirs. A packed
tensor's gradient is assembled from the three (or two) gradients the kernels write, one copy of
its size that flash-attn's kernels avoid by writing into it directly.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from fa2.dropin import AttnProbsResult, flash_attn_func, flash_attn_varlen_func
from fa2.masks import NO_WINDOW

__all__ = [
    "flash_attn_kvpacked_func",
    "flash_attn_qkvpacked_func",
    "flash_attn_varlen_kvpacked_func",
    "flash_attn_varlen_qkvpacked_func",
]


def _unpack(packed: torch.Tensor, name: str, *, dims: int, count: int) -> tuple[torch.Tensor, ...]:
    """The `count` views stacked at dim -3 of `packed` (which has `dims` dims), or a ValueError
    that shows the expected shape."""
    if not isinstance(packed, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(packed).__name__}")
    if packed.dim() != dims or packed.shape[-3] != count:
        lead = "batch, seqlen" if dims == 5 else "total_tokens"
        heads = "heads" if count == 3 else "kv_heads"
        raise ValueError(
            f"{name} must have shape ({lead}, {count}, {heads}, head_dim), got "
            f"{tuple(packed.shape)}"
        )
    return packed.unbind(-3)


def flash_attn_qkvpacked_func(
    qkv: torch.Tensor,
    dropout_p: float = 0.0,
    softmax_scale: float | None = None,
    causal: bool = False,
    window_size: Sequence[int] = NO_WINDOW,
    softcap: float = 0.0,
    alibi_slopes: torch.Tensor | None = None,
    deterministic: bool = False,
    return_attn_probs: bool = False,
) -> torch.Tensor | AttnProbsResult:
    """Self-attention over q, k, v stacked in one tensor, as flash-attn's
    `flash_attn_qkvpacked_func`.

    Args:
        qkv: `(batch, seqlen, 3, heads, head_dim)`: q, k, v at index 0, 1, 2 of dim 2 (one
            head count for all three; grouped-query attention: `flash_attn_kvpacked_func`).
        dropout_p, softmax_scale, causal, window_size, softcap, alibi_slopes, deterministic,
            return_attn_probs: as `flash_attn_func` (query and key lengths are equal, so the
            causal mask is the usual lower triangle).

    Returns:
        out `(batch, seqlen, heads, head_dim)`, or with `return_attn_probs`
        `(out, softmax_lse, S_dmask)`, as `flash_attn_func`.

    Example::

        >>> qkv = torch.randn(2, 100, 3, 8, 64)  # (batch, seq, 3, heads, head_dim)
        >>> flash_attn_qkvpacked_func(qkv, causal=True).shape
        torch.Size([2, 100, 8, 64])
    """
    q, k, v = _unpack(qkv, "qkv", dims=5, count=3)
    return flash_attn_func(
        q, k, v, dropout_p, softmax_scale, causal, window_size, softcap, alibi_slopes,
        deterministic, return_attn_probs,
    )  # fmt: skip


def flash_attn_kvpacked_func(
    q: torch.Tensor,
    kv: torch.Tensor,
    dropout_p: float = 0.0,
    softmax_scale: float | None = None,
    causal: bool = False,
    window_size: Sequence[int] = NO_WINDOW,
    softcap: float = 0.0,
    alibi_slopes: torch.Tensor | None = None,
    deterministic: bool = False,
    return_attn_probs: bool = False,
) -> torch.Tensor | AttnProbsResult:
    """Attention with k and v stacked in one tensor, as flash-attn's `flash_attn_kvpacked_func`.

    Args:
        q: `(batch, seqlen_q, heads, head_dim)`.
        kv: `(batch, seqlen_k, 2, kv_heads, head_dim)`: k at index 0 of dim 2, v at 1;
            `heads` a multiple of `kv_heads` (grouped-query attention).
        dropout_p, softmax_scale, causal, window_size, softcap, alibi_slopes, deterministic,
            return_attn_probs: as `flash_attn_func` (causal aligned to the bottom-right corner
            when seqlen_q != seqlen_k).

    Returns:
        out `(batch, seqlen_q, heads, head_dim)`, or with `return_attn_probs`
        `(out, softmax_lse, S_dmask)`, as `flash_attn_func`.
    """
    k, v = _unpack(kv, "kv", dims=5, count=2)
    return flash_attn_func(
        q, k, v, dropout_p, softmax_scale, causal, window_size, softcap, alibi_slopes,
        deterministic, return_attn_probs,
    )  # fmt: skip


def flash_attn_varlen_qkvpacked_func(
    qkv: torch.Tensor,
    cu_seqlens: torch.Tensor,
    max_seqlen: int,
    dropout_p: float = 0.0,
    softmax_scale: float | None = None,
    causal: bool = False,
    window_size: Sequence[int] = NO_WINDOW,
    softcap: float = 0.0,
    alibi_slopes: torch.Tensor | None = None,
    deterministic: bool = False,
    return_attn_probs: bool = False,
) -> torch.Tensor | AttnProbsResult:
    """Self-attention within packed sequences, q, k, v stacked in one tensor, as flash-attn's
    `flash_attn_varlen_qkvpacked_func`.

    Args:
        qkv: `(total_tokens, 3, heads, head_dim)`.
        cu_seqlens: `(batch + 1,)` int32 cumulative sequence lengths (for queries and keys).
        max_seqlen: the longest sequence, an int.
        dropout_p, softmax_scale, causal, window_size, softcap, alibi_slopes, deterministic,
            return_attn_probs: as `flash_attn_varlen_func`.

    Returns:
        out `(total_tokens, heads, head_dim)`, or with `return_attn_probs`
        `(out, softmax_lse, S_dmask)`, softmax_lse `(heads, total_tokens)`.
    """
    q, k, v = _unpack(qkv, "qkv", dims=4, count=3)
    return flash_attn_varlen_func(
        q, k, v, cu_seqlens, cu_seqlens, max_seqlen, max_seqlen, dropout_p, softmax_scale,
        causal, window_size, softcap, alibi_slopes, deterministic, return_attn_probs,
    )  # fmt: skip


def flash_attn_varlen_kvpacked_func(
    q: torch.Tensor,
    kv: torch.Tensor,
    cu_seqlens_q: torch.Tensor,
    cu_seqlens_k: torch.Tensor,
    max_seqlen_q: int,
    max_seqlen_k: int,
    dropout_p: float = 0.0,
    softmax_scale: float | None = None,
    causal: bool = False,
    window_size: Sequence[int] = NO_WINDOW,
    softcap: float = 0.0,
    alibi_slopes: torch.Tensor | None = None,
    deterministic: bool = False,
    return_attn_probs: bool = False,
) -> torch.Tensor | AttnProbsResult:
    """Attention within packed sequences with k and v stacked in one tensor, as flash-attn's
    `flash_attn_varlen_kvpacked_func`.

    Args:
        q: `(total_q, heads, head_dim)`.
        kv: `(total_k, 2, kv_heads, head_dim)`: k at index 0 of dim 1, v at 1.
        cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, dropout_p, softmax_scale,
            causal, window_size, softcap, alibi_slopes, deterministic, return_attn_probs: as
            `flash_attn_varlen_func`.

    Returns:
        out `(total_q, heads, head_dim)`, or with `return_attn_probs`
        `(out, softmax_lse, S_dmask)`, softmax_lse `(heads, total_q)`.
    """
    k, v = _unpack(kv, "kv", dims=4, count=2)
    return flash_attn_varlen_func(
        q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, dropout_p,
        softmax_scale, causal, window_size, softcap, alibi_slopes, deterministic,
        return_attn_probs,
    )  # fmt: skip
