"""Input validation shared by every entry point: one place that says what is wrong."""

from __future__ import annotations

import math

import torch

__all__ = ["MAX_HEAD_DIM", "check_attention_inputs", "group_heads"]

# Head dims up to this size run in the Triton kernels (padded internally to a power of two
# of at least 16). Beyond it a (BLOCK_M, head_dim) fp32 accumulator no longer fits in registers.
MAX_HEAD_DIM = 256


def check_attention_inputs(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    *,
    dtypes: tuple[torch.dtype, ...],
    max_head_dim: int | None = None,
) -> None:
    """Raise `TypeError`/`ValueError` naming the problem if q, k, v are not a valid attention call.

    q is `(..., heads, n_queries, d)`, k and v are `(..., kv_heads, n_keys, d)` with identical
    dims before the heads and `heads` a multiple of `kv_heads` (grouped-query attention; for
    3-D inputs the first dim plays the heads); all three share a device and one of `dtypes`.
    """
    for name, t in (("q", q), ("k", k), ("v", v)):
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
        if not t.is_floating_point():
            raise TypeError(f"{name} must be a floating-point tensor, got {t.dtype}")
        if t.dtype not in dtypes:
            names = ", ".join(str(d).removeprefix("torch.") for d in dtypes)
            raise TypeError(f"{name} has dtype {t.dtype}; supported here: {names}")
        if t.dim() < 2:
            raise ValueError(
                f"{name} must have at least 2 dims (..., seq, d), got shape {tuple(t.shape)}"
            )
    if not (q.dtype == k.dtype == v.dtype):
        raise TypeError(f"q, k, v must share a dtype, got {q.dtype}, {k.dtype}, {v.dtype}")
    if not (q.device == k.device == v.device):
        raise ValueError(f"q, k, v must be on one device, got {q.device}, {k.device}, {v.device}")
    if not (q.dim() == k.dim() == v.dim()):
        raise ValueError(
            f"q, k, v must have the same number of dims, got {tuple(q.shape)}, "
            f"{tuple(k.shape)}, {tuple(v.shape)}"
        )
    if k.shape != v.shape:
        raise ValueError(
            f"k and v must have the same shape, got {tuple(k.shape)} and {tuple(v.shape)}"
        )
    heads_ok = q.dim() < 3 or (q.shape[-3] % k.shape[-3] == 0 if k.shape[-3] else q.shape[-3] == 0)
    if q.shape[:-3] != k.shape[:-3] or not heads_ok:
        raise ValueError(
            f"q and k must have the same leading (batch/head) dims, got {tuple(q.shape[:-2])} "
            f"and {tuple(k.shape[:-2])}, except that q may have a multiple of k's heads "
            "(dim -3; grouped-query attention); broadcasting is not supported, expand them first"
        )
    if q.shape[-1] != k.shape[-1]:
        raise ValueError(
            f"q and k must have the same head dim, got {q.shape[-1]} and {k.shape[-1]}"
        )
    if q.shape[-1] == 0:
        raise ValueError("head dim must be at least 1")
    if k.shape[-2] == 0 and q.shape[-2] > 0:
        raise ValueError("attention needs at least one key (n_keys = 0)")
    if max_head_dim is not None and q.shape[-1] > max_head_dim:
        raise ValueError(
            f"head dim {q.shape[-1]} is not supported by the Triton kernels (at most "
            f"{max_head_dim}); use FlashAttention2PyTorch or split the head dim"
        )


def group_heads(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """q as `(batch, group, n_q, d)` and k, v as `(batch, n_k, d)`, where `batch` runs over the
    dims before the heads and the key/value heads, and `group` over the query heads sharing one
    key/value head (1 without grouped-query attention). k and v are viewed, never copied,
    when their leading dims merge; q is reshaped (a copy only where a view cannot be had)."""
    kv_heads = k.shape[-3] if k.dim() >= 3 else 1
    group = (q.shape[-3] if q.dim() >= 3 else 1) // max(kv_heads, 1)
    batch = math.prod(k.shape[:-2])
    return (
        q.reshape(batch, group, *q.shape[-2:]),
        k.reshape(batch, *k.shape[-2:]),
        v.reshape(batch, *v.shape[-2:]),
    )
