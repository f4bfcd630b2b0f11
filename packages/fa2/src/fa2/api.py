"""`flash_attention`: the front door that picks the best implementation for the inputs."""

from __future__ import annotations

import functools
from collections.abc import Sequence
from typing import Any

import torch

from fa2.checks import MAX_HEAD_DIM
from fa2.masks import NO_WINDOW
from fa2.pytorch import FlashAttention2PyTorch
from fa2.triton import FlashAttention2Triton

__all__ = ["IMPLEMENTATIONS", "attend", "flash_attention"]

# `implementation=` of the front doors: "auto" picks by device and dtype (see `attend`).
IMPLEMENTATIONS = ("auto", "triton", "pytorch")
_TRITON_DTYPES = (torch.float16, torch.bfloat16, torch.float32)


@functools.cache
def _triton_available() -> bool:
    try:
        import triton  # noqa: F401
    except ImportError:
        return False
    return True


def flash_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    *,
    causal: bool = False,
    is_causal: bool | None = None,
    scale: float | None = None,
    window_size: Sequence[int] = NO_WINDOW,
    softcap: float = 0.0,
    layout: str = "bhsd",
    return_lse: bool = False,
    precision: str | None = None,
    deterministic: bool = True,
    implementation: str = "auto",
) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
    """Exact softmax attention, softmax(q kᵀ · scale) v, in O(n) memory; differentiable.

    Runs the Triton kernels for fp16/bf16/fp32 CUDA tensors with d <= 256 and a positive
    scale, and the tiled PyTorch implementation otherwise (CPU tensors, fp64, larger head
    dims, no Triton); `implementation` can name one.

    Args:
        q: `(..., heads, n_queries, d)`, or with `layout="bshd"` `(..., n_queries, heads, d)`.
        k: `(..., kv_heads, n_keys, d)` (or `(..., n_keys, kv_heads, d)`): the same dims before
            these as q (no broadcasting); `heads` a multiple of `kv_heads`. With fewer
            key/value heads (grouped-query or multi-query attention) query head h reads
            key/value head h // (heads // kv_heads), without copying k and v; their gradients
            sum over the query heads that share them.
        v: shaped as k.
        causal: mask future keys. Query i sees key j iff j <= i, indices from 0 for both, so the
            mask is aligned to the top-left corner; with n_queries=3, n_keys=5 (1 = seen)::

                1 0 0 0 0
                1 1 0 0 0
                1 1 1 0 0

            Keys no query sees get zero gradient. (flash-attn aligns to the bottom-right
            corner instead, and so does `fa2.flash_attn_func`; the two agree when
            n_queries == n_keys.)
        is_causal: the same as `causal`, in `scaled_dot_product_attention`'s spelling; give
            one or the other (both only if they agree).
        scale: softmax scale; default 1/sqrt(d).
        window_size: `(left, right)`, a sliding window: query i sees keys i - left ... i +
            right (same top-left alignment); -1 leaves a side unbounded. With `causal` the
            right side is 0: `window_size=(W - 1, -1)` with `causal=True` is a causal window
            of the last W keys (Mistral's sliding window of W). Tiles outside the window cost
            nothing. A query whose window holds no key gets o = 0.
        softcap: cap the scores to `softcap * tanh(scores / softcap)` before the softmax
            (Gemma 2's attention logit softcapping); 0 (default) leaves them.
        layout: "bhsd" (default, SDPA's) or "bshd" (flash-attn's, and a Transformer's
            projections before any transpose), read in place either way. Shapes cannot always
            tell the two apart (e.g. q (2, 16, 4, 8) with k (2, 16, 2, 8) is valid in both),
            so fa2 never guesses: without `layout` the tensors are "bhsd"; where they are
            invalid as that but valid as "bshd", the error says so.
        return_lse: also return the logsumexp of each score row (natural log, fp32 or fp64),
            e.g. to merge attention computed over separate key blocks. Not differentiable.
        precision: fp32 on the Triton path only: "tf32x3" (default; tensor cores with an
            error-compensated split, about fp32's accuracy), "ieee" (exact fp32 FMA, slower)
            or "tf32" (the default where `torch.backends.cuda.matmul.allow_tf32` is set).
        deterministic: the Triton backward gives the same bits on every run (default). False
            lets dQ's additions land in any order where that is faster (fp32 inputs' single
            pass; Hopper's Gluon single pass at head dim 128; see `FlashAttention2Triton`),
            and dQ's last bits then vary between runs. The PyTorch path is deterministic
            either way.
        implementation: "auto" (default, as above), "triton" or "pytorch".

    Returns:
        o in q's layout and dtype, contiguous; with `return_lse`, `(o, lse)` with lse of shape
        `(..., heads, n_queries)` (+inf for a query that sees no key).

    Raises:
        TypeError: non-tensor, non-floating-point or mismatched dtypes.
        ValueError: shapes that do not line up (naming `layout="bshd"` where that reading
            would fit), mixed devices, fewer than 2 dims, no keys, `causal` and `is_causal`
            disagreeing, an unknown `precision`, `layout` or `implementation`, a bad window or
            softcap.

    Example::

        >>> q, k, v = (torch.randn(2, 8, 128, 64) for _ in range(3))  # (batch, heads, seq, d)
        >>> flash_attention(q, k, v, causal=True).shape
        torch.Size([2, 8, 128, 64])
        >>> k, v = (torch.randn(2, 2, 128, 64) for _ in range(2))  # 4 query heads per kv head
        >>> o, lse = flash_attention(q, k, v, is_causal=True, return_lse=True)
        >>> lse.shape
        torch.Size([2, 8, 128])
        >>> q = torch.randn(2, 128, 8, 64)  # (batch, seq, heads, d), a sliding window of 32
        >>> flash_attention(q, q, q, causal=True, window_size=(31, -1), layout="bshd").shape
        torch.Size([2, 128, 8, 64])
    """
    if is_causal is not None:
        if causal and not is_causal:
            raise ValueError(
                "causal=True and is_causal=False disagree; pass only one of them "
                "(is_causal is scaled_dot_product_attention's name for causal)"
            )
        causal = is_causal
    return attend(
        q, k, v, causal=causal, scale=scale, window_size=window_size, softcap=softcap,
        layout=layout, return_lse=return_lse, precision=precision, deterministic=deterministic,
        implementation=implementation,
    )  # fmt: skip


def attend(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    *,
    causal: bool,
    scale: float | None,
    window_size: Sequence[int],
    softcap: float,
    layout: str,
    return_lse: bool = False,
    precision: str | None = None,
    deterministic: bool = True,
    implementation: str = "auto",
    cu_seqlens_q: torch.Tensor | None = None,
    cu_seqlens_k: torch.Tensor | None = None,
    max_seqlen_q: int | None = None,
    max_seqlen_k: int | None = None,
    bottom_right: bool = False,
) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
    """What every front door calls: the implementation `implementation` names ("auto": the
    Triton kernels for fp16/bf16/fp32 CUDA tensors with d <= 256 and a positive or default
    scale, where Triton is installed; the tiled PyTorch code otherwise), with the arguments
    of the autograd Functions (which validate them)."""
    if implementation == "auto":
        use_triton = (
            isinstance(q, torch.Tensor)
            and q.is_cuda
            and q.dtype in _TRITON_DTYPES
            and q.shape[-1] <= MAX_HEAD_DIM
            and (scale is None or scale > 0)
            and _triton_available()
        )
    elif implementation in IMPLEMENTATIONS:
        use_triton = implementation == "triton"
    else:
        raise ValueError(
            f"implementation must be one of {', '.join(map(repr, IMPLEMENTATIONS))}, "
            f"got {implementation!r}"
        )
    function = FlashAttention2Triton if use_triton else FlashAttention2PyTorch
    q, k, v, cu_seqlens_q, cu_seqlens_k = _distinct(q, k, v, cu_seqlens_q, cu_seqlens_k)
    return function.apply(
        q, k, v, causal, scale, return_lse, precision, deterministic, window_size, softcap,
        layout, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, bottom_right,
    )  # fmt: skip


def _distinct(*tensors: Any) -> list[Any]:
    """`tensors`, each repeat of an earlier one replaced by a view of it.

    Dynamo refuses an autograd Function given one tensor twice (self-attention's
    `attend(x, x, x)`, one `cu_seqlens` for both sides); a view is a tensor of its own and
    costs nothing in a compiled graph. Gradients reach the shared tensor summed, as before.
    """
    kept: list[Any] = []
    for tensor in tensors:
        if isinstance(tensor, torch.Tensor) and any(tensor is seen for seen in kept):
            tensor = tensor.view(tensor.shape)
        kept.append(tensor)
    return kept
