"""`flash_attention`: the front door that picks the best implementation for the inputs."""

from __future__ import annotations

import functools

import torch

from fa2.checks import MAX_HEAD_DIM
from fa2.pytorch import FlashAttention2PyTorch
from fa2.triton import FlashAttention2Triton

__all__ = ["flash_attention"]


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
    return_lse: bool = False,
    precision: str | None = None,
    deterministic: bool = True,
) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
    """Exact softmax attention, softmax(q kᵀ · scale) v, in O(n) memory; differentiable.

    Runs the Triton kernels for fp16/bf16/fp32 CUDA tensors with d <= 256 and a positive
    scale, and the tiled PyTorch implementation otherwise (CPU tensors, fp64, larger head
    dims, no Triton).

    Args:
        q: `(..., heads, n_queries, d)`.
        k: `(..., kv_heads, n_keys, d)`: the same dims before the heads as q (no
            broadcasting); `heads` a multiple of `kv_heads`. With fewer key/value heads
            (grouped-query or multi-query attention) query head h reads key/value head
            h // (heads // kv_heads), without copying k and v; their gradients sum over the
            query heads that share them.
        v: `(..., kv_heads, n_keys, d)`.
        causal: mask future keys. Query i sees key j iff j <= i, indices from 0 for both, so the
            mask is aligned to the top-left corner; with n_queries=3, n_keys=5 (1 = seen)::

                1 0 0 0 0
                1 1 0 0 0
                1 1 1 0 0

            Keys no query sees get zero gradient. (flash-attn aligns to the bottom-right
            corner instead; the two agree when n_queries == n_keys.)
        is_causal: the same as `causal`, in `scaled_dot_product_attention`'s spelling; give
            one or the other (both only if they agree).
        scale: softmax scale; default 1/sqrt(d).
        return_lse: also return the logsumexp of each score row (natural log, fp32 or fp64),
            e.g. to merge attention computed over separate key blocks. Not differentiable.
        precision: fp32 on the Triton path only: "tf32x3" (default; tensor cores with an
            error-compensated split, about fp32's accuracy), "ieee" (exact fp32 FMA, slower)
            or "tf32" (the default where `torch.backends.cuda.matmul.allow_tf32` is set).
        deterministic: the Triton backward gives the same bits on every run (default). False
            lets fp32 inputs take its single-pass form, which adds dQ atomically: fewer
            matmuls and faster (see `FlashAttention2Triton`), but dQ's last bits vary between
            runs. 16-bit inputs and the PyTorch path are deterministic either way.

    Returns:
        o, `(..., heads, n_queries, d)` in the dtype of q; with `return_lse`, `(o, lse)` with
        lse of shape `(..., heads, n_queries)`.

    Raises:
        TypeError: non-tensor, non-floating-point or mismatched dtypes.
        ValueError: shapes that do not line up, mixed devices, fewer than 2 dims, no keys,
            `causal` and `is_causal` disagreeing, an unknown `precision`.

    Example::

        >>> q, k, v = (torch.randn(2, 8, 128, 64) for _ in range(3))  # (batch, heads, seq, d)
        >>> flash_attention(q, k, v, causal=True).shape
        torch.Size([2, 8, 128, 64])
        >>> k, v = (torch.randn(2, 2, 128, 64) for _ in range(2))  # 4 query heads per kv head
        >>> o, lse = flash_attention(q, k, v, is_causal=True, return_lse=True)
        >>> lse.shape
        torch.Size([2, 8, 128])
    """
    if is_causal is not None:
        if causal and not is_causal:
            raise ValueError(
                "causal=True and is_causal=False disagree; pass only one of them "
                "(is_causal is scaled_dot_product_attention's name for causal)"
            )
        causal = is_causal
    if (
        isinstance(q, torch.Tensor)
        and q.is_cuda
        and q.dtype in (torch.float16, torch.bfloat16, torch.float32)
        and q.shape[-1] <= MAX_HEAD_DIM
        and (scale is None or scale > 0)
        and _triton_available()
    ):
        return FlashAttention2Triton.apply(
            q, k, v, causal, scale, return_lse, precision, deterministic
        )
    if precision is not None:
        from fa2.triton.configs import dot_precision

        dot_precision(torch.float32, precision)  # the same error for an unknown name
    return FlashAttention2PyTorch.apply(q, k, v, causal, scale, return_lse)
