"""flash-attn's interface: `flash_attn_func` and `flash_attn_varlen_func`, so that replacing
`from flash_attn import flash_attn_func` with `from fa2 import flash_attn_func` is the whole
change for these two (the packed variants: `fa2.packed`; the padding helpers:
`fa2.bert_padding`; decoding against a cache: `fa2.kvcache`).

The names, the argument order and defaults, the layouts (`(batch, seq, heads, head_dim)` and
packed `(total_tokens, heads, head_dim)`), the causal mask's bottom-right alignment, the
sliding window's meaning and the return values are flash-attn's (flash-attn 2.x's
`flash_attn_interface`), `return_attn_probs=True` included: `(out, softmax_lse, S_dmask)`, the
logsumexp in flash-attn's shape and alignment and `S_dmask` empty, as flash-attn returns it
without dropout. What fa2 does not implement raises `NotImplementedError` naming the argument:
attention dropout, ALiBi slopes, paged KV caches. Nothing passed is ignored. Beyond
flash-attn, fp32 inputs work too, and CPU tensors run the tiled PyTorch implementation.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from fa2.api import attend
from fa2.masks import NO_WINDOW

__all__ = ["AttnProbsResult", "flash_attn_func", "flash_attn_varlen_func", "refuse_unsupported"]


# What the functions return with `return_attn_probs=True`: the output, the logsumexp and
# `S_dmask`, which flash-attn fills only with dropout (empty otherwise, as here).
AttnProbsResult = tuple[torch.Tensor, torch.Tensor, torch.Tensor]


def refuse_unsupported(dropout_p: float, alibi_slopes: object, block_table: object = None) -> None:
    """NotImplementedError naming the first option fa2 does not implement, if one is asked for."""
    if dropout_p != 0.0:
        raise NotImplementedError(
            f"dropout_p={dropout_p}: fa2 has no attention dropout; pass dropout_p=0.0 (as in "
            "evaluation), or drop out elsewhere in the model"
        )
    if alibi_slopes is not None:
        raise NotImplementedError("alibi_slopes: fa2 does not implement ALiBi position biases")
    if block_table is not None:
        raise NotImplementedError(
            "block_table: fa2 has no paged key/value cache; keep each sequence's keys and "
            "values contiguous, (batch, seqlen_cache, kv_heads, head_dim), and pass "
            "cache_seqlens (fa2.flash_attn_with_kvcache)"
        )


def _attend_returning(
    return_attn_probs: bool, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, **options
) -> torch.Tensor | AttnProbsResult:
    """`attend(q, k, v, **options)`: the output, or with `return_attn_probs` flash-attn's
    `(out, softmax_lse, S_dmask)`, the logsumexp as `attend` gives it ((batch, heads, seqlen_q)
    or (heads, total_q), fp32; fp64 for fp64 inputs) and `S_dmask` empty (no dropout)."""
    if not return_attn_probs:
        return attend(q, k, v, **options)
    out, lse = attend(q, k, v, return_lse=True, **options)
    return out, lse, q.new_empty((0,))


def flash_attn_func(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    dropout_p: float = 0.0,
    softmax_scale: float | None = None,
    causal: bool = False,
    window_size: Sequence[int] = NO_WINDOW,
    softcap: float = 0.0,
    alibi_slopes: torch.Tensor | None = None,
    deterministic: bool = False,
    return_attn_probs: bool = False,
) -> torch.Tensor | AttnProbsResult:
    """Attention over `(batch, seq, heads, head_dim)` tensors, as flash-attn's `flash_attn_func`.

    k and v may have fewer heads than q (multi-query and grouped-query attention): with 6 query
    heads and 2 key/value heads, query heads 0, 1, 2 read key/value head 0 and 3, 4, 5 head 1.

    With `causal=True` the mask is aligned to the bottom-right corner of the score matrix: the
    last query sees the last key. For seqlen_q = 2, seqlen_k = 5 (1 = seen)::

        1 1 1 1 0
        1 1 1 1 1

    and for seqlen_q = 5, seqlen_k = 2::

        0 0
        0 0
        0 0
        1 0
        1 1

    A row that sees nothing gives an output of 0. (`fa2.flash_attention` aligns to the
    top-left instead, as SDPA does; the two agree when seqlen_q == seqlen_k.)

    With `window_size=(left, right)` query i sees only the keys j with
    i + seqlen_k - seqlen_q - left <= j <= i + seqlen_k - seqlen_q + right (inclusive; -1:
    unbounded on that side); `causal=True` makes `right` 0. Key tiles outside every window
    are skipped, so a window of W over n tokens costs about n·W, not n²/2.

    Args:
        q: `(batch, seqlen_q, heads, head_dim)`, fp16, bf16 or fp32 (fp64 on the CPU).
        k: `(batch, seqlen_k, kv_heads, head_dim)`; `heads` a multiple of `kv_heads`.
        v: `(batch, seqlen_k, kv_heads, head_dim)`.
        dropout_p: must be 0.0 (fa2 has no attention dropout).
        softmax_scale: scale of q kᵀ before the softmax; default 1/sqrt(head_dim).
        causal: the causal mask above.
        window_size: `(left, right)`, the sliding window above; (-1, -1) (default): none.
        softcap: scores become `softcap * tanh(scores / softcap)` (Gemma 2); 0.0: off.
        alibi_slopes: must be None (no ALiBi).
        deterministic: False (default, as flash-attn) lets dQ's additions land in any
            order where a backward is faster so (fp32 inputs' single pass; Hopper's Gluon
            single pass at head dim 128): dQ's last bits then vary between runs. True gives
            the same bits every run.
        return_attn_probs: also return the logsumexp and flash-attn's `S_dmask` (below).

    Returns:
        out: `(batch, seqlen_q, heads, head_dim)`, contiguous, in q's dtype. With
        `return_attn_probs=True`, `(out, softmax_lse, S_dmask)`: softmax_lse `(batch, heads,
        seqlen_q)` fp32 (fp64 for fp64 inputs), the logsumexp of each row of the scaled (and
        capped) scores under the bottom-right mask above, +inf for a row that sees no key, as
        flash-attn's; not differentiable (out stays differentiable). S_dmask is empty, `(0,)`
        in q's dtype, as flash-attn returns it when dropout_p == 0 (it fills it only with
        dropout, which fa2 does not have).

    Raises:
        NotImplementedError: dropout_p > 0, alibi_slopes.
        TypeError, ValueError: as `fa2.flash_attention`.

    Example::

        >>> q = torch.randn(2, 100, 8, 64)  # (batch, seq, heads, head_dim)
        >>> k, v = torch.randn(2, 100, 2, 64), torch.randn(2, 100, 2, 64)
        >>> flash_attn_func(q, k, v, causal=True, window_size=(31, 0)).shape
        torch.Size([2, 100, 8, 64])
    """
    refuse_unsupported(dropout_p, alibi_slopes)
    return _attend_returning(
        return_attn_probs, q, k, v, causal=causal, scale=softmax_scale, window_size=window_size,
        softcap=softcap, layout="bshd", deterministic=deterministic, bottom_right=True,
    )  # fmt: skip


def flash_attn_varlen_func(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
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
    block_table: torch.Tensor | None = None,
) -> torch.Tensor | AttnProbsResult:
    """Attention within each of several sequences packed one after another, as flash-attn's
    `flash_attn_varlen_func`: no padding, and no attention across sequence boundaries.

    Sequence b is the tokens `cu_seqlens_q[b]:cu_seqlens_q[b + 1]` of q and
    `cu_seqlens_k[b]:cu_seqlens_k[b + 1]` of k and v. Masks, windows, softcap and grouped
    heads as in `flash_attn_func`, per sequence (the causal diagonal ends at each sequence's
    last query and last key). Every length from 1 up works; a tile of the kernels never holds
    tokens of two sequences, and work past a sequence's end is skipped.

    Args:
        q: `(total_q, heads, head_dim)`: every sequence's queries, one after another.
        k: `(total_k, kv_heads, head_dim)`; v likewise.
        cu_seqlens_q: `(batch + 1,)` int32 on q's device: 0, then the cumulative lengths, so
            the last entry is total_q. cu_seqlens_k likewise (total_k); pass the same tensor
            for both in self-attention.
        max_seqlen_q: the longest query sequence, a Python int (a 0-dim tensor is read
            with a device sync); it sizes the kernels' grid, so it must not be too small.
            max_seqlen_k likewise. Both and the cumulative lengths are checked on every
            call: on the CPU raising ValueError; on a GPU by device-side assertions that
            never wait for the device, issued once per cumulative-lengths tensor (a failed
            one ends the CUDA context with the reason; see `fa2.checks.check_varlen`).
        dropout_p, softmax_scale, causal, window_size, softcap, alibi_slopes, deterministic,
            return_attn_probs: as `flash_attn_func`.
        block_table: must be None (fa2 has no paged KV cache).

    Returns:
        out: `(total_q, heads, head_dim)`, contiguous, in q's dtype; with
        `return_attn_probs=True`, `(out, softmax_lse, S_dmask)`, softmax_lse `(heads, total_q)`
        (flash-attn 2's varlen layout) and S_dmask empty, as in `flash_attn_func`.

    Example::

        >>> lengths = [5, 1, 12]  # three documents, 18 tokens
        >>> cu = torch.tensor([0, 5, 6, 18], dtype=torch.int32)
        >>> q, k, v = (torch.randn(18, 4, 32) for _ in range(3))
        >>> flash_attn_varlen_func(q, k, v, cu, cu, 12, 12, causal=True).shape
        torch.Size([18, 4, 32])
    """
    refuse_unsupported(dropout_p, alibi_slopes, block_table)
    if isinstance(max_seqlen_q, torch.Tensor):
        max_seqlen_q = int(max_seqlen_q)
    if isinstance(max_seqlen_k, torch.Tensor):
        max_seqlen_k = int(max_seqlen_k)
    return _attend_returning(
        return_attn_probs, q, k, v, causal=causal, scale=softmax_scale, window_size=window_size,
        softcap=softcap, layout="thd", deterministic=deterministic, cu_seqlens_q=cu_seqlens_q,
        cu_seqlens_k=cu_seqlens_k, max_seqlen_q=max_seqlen_q, max_seqlen_k=max_seqlen_k,
        bottom_right=True,
    )  # fmt: skip
