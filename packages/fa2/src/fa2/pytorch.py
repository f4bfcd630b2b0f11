"""FlashAttention-2 in plain PyTorch: tiled, online softmax, backward by recomputation.

This is the readable reference for the Triton kernels, and the path `flash_attention` takes on
the CPU. The algorithm is the one of Dao (2023), Algorithms 1 and 2, with one liberty that keeps
it fast in eager PyTorch: the query tiles, which a GPU runs as independent programs of a grid,
run here side by side as one batch dimension, while the key tiles are walked one at a time as in
each program's inner loop. Query heads that share a key/value head (grouped-query attention)
run side by side too, against the one k and v. Memory stays linear in the sequence length:
nothing larger than (batch, heads, n_queries, BLOCK_K) is ever materialised.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch.autograd.function import once_differentiable

from fa2.checks import check_attention_inputs, group_heads

__all__ = ["BLOCK_K", "BLOCK_Q", "FlashAttention2PyTorch"]

# Tile sizes. The handout asks for tiles of at least 16 x 16; 64 x 64 keeps the per-tile Python
# overhead low without letting the (batch, n_queries, BLOCK_K) score slab grow large.
BLOCK_Q = 64
BLOCK_K = 64

_DTYPES = (torch.float16, torch.bfloat16, torch.float32, torch.float64)


def _accumulator_dtype(dtype: torch.dtype) -> torch.dtype:
    """fp32 for the 16-bit and fp32 inputs, fp64 for fp64 inputs (so gradcheck can work)."""
    return torch.promote_types(dtype, torch.float32)


def _query_tiles(x: torch.Tensor) -> torch.Tensor:
    """(batch, group, n, ...) -> (batch, group, n_tiles, BLOCK_Q, ...), zero-padding n up to a
    whole tile."""
    n = x.shape[2]
    n_tiles = -(-n // BLOCK_Q)
    pad = [0, 0] * (x.dim() - 3) + [0, n_tiles * BLOCK_Q - n]
    return F.pad(x, pad).unflatten(2, (n_tiles, BLOCK_Q))


def _untile(x: torch.Tensor, n: int) -> torch.Tensor:
    """Inverse of `_query_tiles`: (batch, group, n_tiles, BLOCK_Q, ...) -> (batch, group, n,
    ...)."""
    return x.flatten(2, 3)[:, :, :n]


def _rows(n_queries: int, device: torch.device) -> torch.Tensor:
    """The query index of each tiled row: (q_tiles, BLOCK_Q)."""
    return _query_tiles(torch.arange(n_queries, device=device)[None, None])[0, 0]


def _visible(rows: torch.Tensor, key_start: int, n_keys: int) -> torch.Tensor:
    """Causal mask of one key tile: True where query `rows[t, r]` may see key `key_start + c`."""
    cols = torch.arange(key_start, key_start + n_keys, device=rows.device)
    return cols <= rows[..., None]  # (q_tiles, BLOCK_Q, n_keys)


def _forward(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool, scale: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """Tiled forward over q `(batch, group, n_q, d)` and k, v `(batch, n_k, d)` (the `group`
    query heads share one key/value head); returns o and L (in the accumulator dtype)."""
    n_queries, n_keys = q.shape[2], k.shape[1]
    acc_dtype = _accumulator_dtype(q.dtype)
    qt = _query_tiles(q.to(acc_dtype))  # (batch, group, q_tiles, BLOCK_Q, d)
    rows = _rows(n_queries, q.device)  # (q_tiles, BLOCK_Q)
    m = torch.full(qt.shape[:-1], float("-inf"), dtype=acc_dtype, device=q.device)
    l = torch.zeros_like(m)  # (batch, group, q_tiles, BLOCK_Q): running max and running sum
    acc = torch.zeros_like(qt)  # (batch, group, q_tiles, BLOCK_Q, d): unnormalised output

    for start in range(0, n_keys, BLOCK_K):
        # Causal: query tiles that end before `start` see none of these keys; skip them.
        # Key 0 is visible to every query, so every row's running max is finite after tile 0.
        first = start // BLOCK_Q if causal else 0
        kj = k[:, start : start + BLOCK_K].to(acc_dtype)  # (batch, block_k, d)
        vj = v[:, start : start + BLOCK_K].to(acc_dtype)
        s = torch.einsum("bgtqd,bkd->bgtqk", qt[:, :, first:], kj) * scale
        if causal:
            s = s.masked_fill(~_visible(rows[first:], start, kj.shape[1]), float("-inf"))
        m_old = m[:, :, first:]
        m_new = torch.maximum(m_old, s.amax(dim=-1))
        p = torch.exp(s - m_new[..., None])
        alpha = torch.exp(m_old - m_new)  # rescales what was accumulated so far
        l[:, :, first:] = alpha * l[:, :, first:] + p.sum(dim=-1)
        acc[:, :, first:] = alpha[..., None] * acc[:, :, first:] + torch.einsum(
            "bgtqk,bkd->bgtqd", p, vj
        )
        m[:, :, first:] = m_new

    o = _untile(acc / l[..., None], n_queries).to(q.dtype)
    return o, _untile(m + torch.log(l), n_queries)


def _backward(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    o: torch.Tensor,
    lse: torch.Tensor,
    do: torch.Tensor,
    causal: bool,
    scale: float,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Tiled backward over q, o, do `(batch, group, n_q, d)`, k, v `(batch, n_k, d)`, lse
    `(batch, group, n_q)`, recomputing P = exp(S - L) tile by tile. dK and dV sum over the
    group of query heads that share k and v."""
    n_queries, n_keys = q.shape[2], k.shape[1]
    acc_dtype = _accumulator_dtype(q.dtype)
    delta = (do.to(acc_dtype) * o.to(acc_dtype)).sum(dim=-1)  # D = rowsum(dO ∘ O)
    qt, dot = _query_tiles(q.to(acc_dtype)), _query_tiles(do.to(acc_dtype))
    lt, dt = _query_tiles(lse), _query_tiles(delta)  # (batch, group, q_tiles, BLOCK_Q)
    rows = _rows(n_queries, q.device)
    dq = torch.zeros_like(qt)
    dk = torch.empty(k.shape, dtype=acc_dtype, device=k.device)
    dv = torch.empty_like(dk)

    for start in range(0, n_keys, BLOCK_K):
        first = start // BLOCK_Q if causal else 0
        end = start + BLOCK_K
        kj, vj = k[:, start:end].to(acc_dtype), v[:, start:end].to(acc_dtype)
        q_seen, do_seen = qt[:, :, first:], dot[:, :, first:]
        s = torch.einsum("bgtqd,bkd->bgtqk", q_seen, kj) * scale
        p = torch.exp(s - lt[:, :, first:, :, None])  # the forward's probabilities, recomputed
        if causal:
            p = p.masked_fill(~_visible(rows[first:], start, kj.shape[1]), 0.0)
        dp = torch.einsum("bgtqd,bkd->bgtqk", do_seen, vj)
        ds = p * (dp - dt[:, :, first:, :, None])  # gradient of the scores
        dv[:, start:end] = torch.einsum("bgtqk,bgtqd->bkd", p, do_seen)
        dk[:, start:end] = torch.einsum("bgtqk,bgtqd->bkd", ds, q_seen) * scale
        dq[:, :, first:] += torch.einsum("bgtqk,bkd->bgtqd", ds, kj) * scale

    return _untile(dq, n_queries).to(q.dtype), dk.to(k.dtype), dv.to(v.dtype)


class FlashAttention2PyTorch(torch.autograd.Function):
    """FlashAttention-2 forward and backward in tiled PyTorch; no score matrix is materialised.

    Call as `FlashAttention2PyTorch.apply(q, k, v, is_causal=False, scale=None,
    return_lse=False)` with the options passed positionally (autograd Functions take no
    keyword arguments); `flash_attention` is the keyword-friendly front door.

    Args:
        q: `(..., heads, n_queries, d)`; k, v: `(..., kv_heads, n_keys, d)`, same dtype and
            device, the same dims before the heads, `heads` a multiple of `kv_heads`
            (grouped-query attention, k and v not copied). fp16, bf16, fp32 or fp64; any
            device torch runs on.
        is_causal: query i sees key j iff j <= i, both counted from 0 (top-left aligned, as in the
            CS336 handout). With n_queries > n_keys the last queries see every key; with
            n_queries < n_keys the trailing keys are seen by nobody and get zero gradient.
        scale: softmax scale, default 1/sqrt(d).
        return_lse: also return the logsumexp L (not differentiable).

    Returns:
        o: `(..., heads, n_queries, d)` in the input dtype, or `(o, lse)` with `return_lse`.
        The backward pass uses q, k, v, o and one saved logsumexp tensor L of shape
        `(..., heads, n_queries)` (fp32, or fp64 for fp64 inputs). The backward is itself not
        differentiable: a double backward raises instead of giving wrong second derivatives.
    """

    @staticmethod
    def forward(
        ctx,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        is_causal: bool = False,
        scale: float | None = None,
        return_lse: bool = False,
    ) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
        check_attention_inputs(q, k, v, dtypes=_DTYPES)
        scale = 1.0 / math.sqrt(q.shape[-1]) if scale is None else float(scale)
        o, lse = _forward(*group_heads(q, k, v), bool(is_causal), scale)
        o, lse = o.view(q.shape), lse.view(q.shape[:-1])
        ctx.save_for_backward(q, k, v, o, lse)
        ctx.is_causal, ctx.scale = bool(is_causal), scale
        if return_lse:
            ctx.mark_non_differentiable(lse)
            return o, lse
        return o

    @staticmethod
    @once_differentiable
    def backward(ctx, do: torch.Tensor, *_):
        q, k, v, o, lse = ctx.saved_tensors
        qg, kg, vg = group_heads(q, k, v)
        og, dog = o.reshape(qg.shape), do.reshape(qg.shape)
        dq, dk, dv = _backward(
            qg, kg, vg, og, lse.reshape(qg.shape[:-1]), dog, ctx.is_causal, ctx.scale
        )
        return dq.view(q.shape), dk.view(k.shape), dv.view(v.shape), None, None, None
