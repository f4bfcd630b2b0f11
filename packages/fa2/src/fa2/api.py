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
    causal: bool = False,
    scale: float | None = None,
) -> torch.Tensor:
    """Exact softmax attention, softmax(q kᵀ · scale) v, in O(n) memory; differentiable.

    Runs the Triton kernels for fp16/bf16/fp32 CUDA tensors with d <= 256, and the tiled
    PyTorch implementation otherwise (CPU tensors, fp64, larger head dims, no Triton).

    Args:
        q: `(..., n_queries, d)`.
        k: `(..., n_keys, d)`, the same leading dims as q (no broadcasting).
        v: `(..., n_keys, d)`.
        causal: mask future keys. Query i sees key j iff j <= i, indices from 0 for both, so the
            mask is aligned to the top-left corner; with n_queries=3, n_keys=5 (1 = seen)::

                1 0 0 0 0
                1 1 0 0 0
                1 1 1 0 0

            Keys no query sees get zero gradient. (flash-attn aligns to the bottom-right
            corner instead; the two agree when n_queries == n_keys.)
        scale: softmax scale; default 1/sqrt(d).

    Returns:
        `(..., n_queries, d)`, the dtype of q.

    Raises:
        TypeError: non-tensor, non-floating-point or mismatched dtypes.
        ValueError: shapes that do not line up, mixed devices, fewer than 2 dims, no keys.

    Example::

        >>> q, k, v = (torch.randn(2, 8, 128, 64) for _ in range(3))  # (batch, heads, seq, d)
        >>> flash_attention(q, k, v, causal=True).shape
        torch.Size([2, 8, 128, 64])
    """
    if (
        isinstance(q, torch.Tensor)
        and q.is_cuda
        and q.dtype in (torch.float16, torch.bfloat16, torch.float32)
        and q.shape[-1] <= MAX_HEAD_DIM
        and _triton_available()
    ):
        return FlashAttention2Triton.apply(q, k, v, causal, scale)
    return FlashAttention2PyTorch.apply(q, k, v, causal, scale)
