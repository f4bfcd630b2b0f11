"""Plain softmax attention that materialises the score matrix: the oracle for the kernels."""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch

from fa2.masks import NO_WINDOW, check_softcap, make_band, visible

__all__ = ["attention_reference", "varlen_attention_reference"]


def attention_reference(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    *,
    causal: bool = False,
    scale: float | None = None,
    window_size: Sequence[int] = NO_WINDOW,
    softcap: float = 0.0,
    bottom_right: bool = False,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Return `(o, lse)`: softmax(scores) v and the logsumexp of each score row.

    q is `(..., heads, n_queries, d)`, k and v `(..., kv_heads, n_keys, d)` with `heads` a
    multiple of `kv_heads` (each key/value head is repeated for the query heads sharing it, so
    gradients sum over them). The scores are `q kᵀ · scale` (default scale 1/sqrt(d)), capped
    to `softcap · tanh(scores / softcap)` when `softcap > 0`. With `causal` and `window_size`,
    keys are hidden as `fa2.masks` describes, the diagonal aligned to the top-left corner or,
    with `bottom_right`, to the bottom-right one. A query that sees no key gets o = 0 and
    lse = +inf. Computed in the inputs' dtype (pass float64 tensors for an exact oracle);
    memory is O(n_queries · n_keys): for tests and small problems only.
    """
    scale = 1.0 / math.sqrt(q.shape[-1]) if scale is None else scale
    cap = check_softcap(softcap)
    band = make_band(causal=causal, window_size=window_size, bottom_right=bottom_right)
    if q.dim() >= 3 and k.shape[-3] != q.shape[-3]:
        group = q.shape[-3] // k.shape[-3]
        k, v = k.repeat_interleave(group, dim=-3), v.repeat_interleave(group, dim=-3)
    s = (q @ k.transpose(-1, -2)) * scale  # (..., n_queries, n_keys)
    if cap:
        s = cap * torch.tanh(s / cap)
    n_q, n_k = q.shape[-2], k.shape[-2]
    rows, cols = torch.arange(n_q, device=q.device), torch.arange(n_k, device=q.device)
    keep = visible(band, rows, cols, n_q, n_k)
    if keep is None:
        return torch.softmax(s, dim=-1) @ v, torch.logsumexp(s, dim=-1)
    seen = keep.any(dim=-1, keepdim=True)  # (n_queries, 1): rows that see at least one key
    # Rows that see nothing get finite scores and no weight, so no NaN reaches the gradients.
    s = torch.where(seen, s.masked_fill(~keep, float("-inf")), 0.0)
    lse = torch.logsumexp(s, dim=-1).masked_fill(~seen[:, 0], float("inf"))
    return (torch.softmax(s, dim=-1) * seen) @ v, lse


def varlen_attention_reference(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    cu_seqlens_q: torch.Tensor,
    cu_seqlens_k: torch.Tensor,
    **options,
) -> tuple[torch.Tensor, torch.Tensor]:
    """`attention_reference` of each packed sequence on its own: q `(total_q, heads, d)`, k and
    v `(total_k, kv_heads, d)`, sequence b the tokens `cu_seqlens[b]:cu_seqlens[b + 1]`.
    `options` are `attention_reference`'s. Returns `(o, lse)`, o `(total_q, heads, d)` and lse
    `(heads, total_q)` (flash-attn's layouts)."""
    outputs, lses = [], []
    bounds = zip(cu_seqlens_q.tolist(), cu_seqlens_q.tolist()[1:], cu_seqlens_k.tolist(),
                 cu_seqlens_k.tolist()[1:], strict=False)  # fmt: skip
    for q0, q1, k0, k1 in bounds:
        if k1 == k0:  # no keys: nothing seen
            outputs.append(q.new_zeros(q1 - q0, *q.shape[1:]))
            lses.append(q.new_full((q.shape[1], q1 - q0), float("inf")))
            continue
        o, lse = attention_reference(
            *(t[a:b].transpose(0, 1) for t, a, b in ((q, q0, q1), (k, k0, k1), (v, k0, k1))),
            **options,
        )
        outputs.append(o.transpose(0, 1))
        lses.append(lse)
    return torch.cat(outputs), torch.cat(lses, dim=-1)
