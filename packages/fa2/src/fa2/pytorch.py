"""FlashAttention-2 in plain PyTorch: tiled, online softmax, backward by recomputation.

This is the readable reference for the Triton kernels, and the path `flash_attention` takes on
the CPU. The algorithm is the one of Dao (2023), Algorithms 1 and 2, with one liberty that keeps
it fast in eager PyTorch: the query tiles, which a GPU runs as independent programs of a grid,
run here side by side as one batch dimension, while the key tiles are walked one at a time as in
each program's inner loop. Memory stays linear in the sequence length: nothing larger than
(batch, n_queries, BLOCK_K) is ever materialised.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from fa2.checks import check_attention_inputs, flatten_batch

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
    """(batch, n, ...) -> (batch, n_tiles, BLOCK_Q, ...), zero-padding n up to a whole tile."""
    n = x.shape[1]
    n_tiles = -(-n // BLOCK_Q)
    pad = [0, 0] * (x.dim() - 2) + [0, n_tiles * BLOCK_Q - n]
    return F.pad(x, pad).unflatten(1, (n_tiles, BLOCK_Q))


def _untile(x: torch.Tensor, n: int) -> torch.Tensor:
    """Inverse of `_query_tiles`: (batch, n_tiles, BLOCK_Q, ...) -> (batch, n, ...)."""
    return x.flatten(1, 2)[:, :n]


def _visible(rows: torch.Tensor, key_start: int, n_keys: int) -> torch.Tensor:
    """Causal mask of one key tile: True where query `rows[t, r]` may see key `key_start + c`."""
    cols = torch.arange(key_start, key_start + n_keys, device=rows.device)
    return cols <= rows[..., None]  # (q_tiles, BLOCK_Q, n_keys)


def _forward(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool, scale: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """Tiled forward over (batch, n, d) tensors; returns o and L (in the accumulator dtype)."""
    n_queries, n_keys = q.shape[1], k.shape[1]
    acc_dtype = _accumulator_dtype(q.dtype)
    qt = _query_tiles(q.to(acc_dtype))  # (batch, q_tiles, BLOCK_Q, d)
    rows = _query_tiles(torch.arange(n_queries, device=q.device)[None])[0]  # (q_tiles, BLOCK_Q)
    m = torch.full(qt.shape[:-1], float("-inf"), dtype=acc_dtype, device=q.device)
    l = torch.zeros_like(m)  # (batch, q_tiles, BLOCK_Q): running max and running sum
    acc = torch.zeros_like(qt)  # (batch, q_tiles, BLOCK_Q, d): unnormalised output

    for start in range(0, n_keys, BLOCK_K):
        # Causal: query tiles that end before `start` see none of these keys; skip them.
        # Key 0 is visible to every query, so every row's running max is finite after tile 0.
        first = start // BLOCK_Q if causal else 0
        kj = k[:, start : start + BLOCK_K].to(acc_dtype)  # (batch, block_k, d)
        vj = v[:, start : start + BLOCK_K].to(acc_dtype)
        s = torch.einsum("btqd,bkd->btqk", qt[:, first:], kj) * scale
        if causal:
            s = s.masked_fill(~_visible(rows[first:], start, kj.shape[1]), float("-inf"))
        m_new = torch.maximum(m[:, first:], s.amax(dim=-1))
        p = torch.exp(s - m_new[..., None])
        alpha = torch.exp(m[:, first:] - m_new)  # rescales what was accumulated so far
        l[:, first:] = alpha * l[:, first:] + p.sum(dim=-1)
        acc[:, first:] = alpha[..., None] * acc[:, first:] + torch.einsum("btqk,bkd->btqd", p, vj)
        m[:, first:] = m_new

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
    """Tiled backward over (batch, n, d) tensors, recomputing P = exp(S - L) tile by tile."""
    n_queries, n_keys = q.shape[1], k.shape[1]
    acc_dtype = _accumulator_dtype(q.dtype)
    delta = (do.to(acc_dtype) * o.to(acc_dtype)).sum(dim=-1)  # D = rowsum(dO ∘ O): (batch, n_q)
    qt, dot = _query_tiles(q.to(acc_dtype)), _query_tiles(do.to(acc_dtype))
    lt, dt = _query_tiles(lse), _query_tiles(delta)  # (batch, q_tiles, BLOCK_Q)
    rows = _query_tiles(torch.arange(n_queries, device=q.device)[None])[0]
    dq = torch.zeros_like(qt)
    dk = torch.empty(k.shape, dtype=acc_dtype, device=k.device)
    dv = torch.empty_like(dk)

    for start in range(0, n_keys, BLOCK_K):
        first = start // BLOCK_Q if causal else 0
        end = start + BLOCK_K
        kj, vj = k[:, start:end].to(acc_dtype), v[:, start:end].to(acc_dtype)
        s = torch.einsum("btqd,bkd->btqk", qt[:, first:], kj) * scale
        p = torch.exp(s - lt[:, first:, :, None])  # the forward's probabilities, recomputed
        if causal:
            p = p.masked_fill(~_visible(rows[first:], start, kj.shape[1]), 0.0)
        dp = torch.einsum("btqd,bkd->btqk", dot[:, first:], vj)
        ds = p * (dp - dt[:, first:, :, None])  # gradient of the scores
        dv[:, start:end] = torch.einsum("btqk,btqd->bkd", p, dot[:, first:])
        dk[:, start:end] = torch.einsum("btqk,btqd->bkd", ds, qt[:, first:]) * scale
        dq[:, first:] += torch.einsum("btqk,bkd->btqd", ds, kj) * scale

    return _untile(dq, n_queries).to(q.dtype), dk.to(k.dtype), dv.to(v.dtype)


class FlashAttention2PyTorch(torch.autograd.Function):
    """FlashAttention-2 forward and backward in tiled PyTorch; no score matrix is materialised.

    Call as `FlashAttention2PyTorch.apply(q, k, v, is_causal=False, scale=None)` with the options
    passed positionally (autograd Functions take no keyword arguments); `flash_attention` is the
    keyword-friendly front door.

    Args:
        q: `(..., n_queries, d)`; k, v: `(..., n_keys, d)`, same leading dims, dtype and device.
            fp16, bf16, fp32 or fp64; any device torch runs on.
        is_causal: query i sees key j iff j <= i, both counted from 0 (top-left aligned, as in the
            CS336 handout). With n_queries > n_keys the last queries see every key; with
            n_queries < n_keys the trailing keys are seen by nobody and get zero gradient.
        scale: softmax scale, default 1/sqrt(d).

    Returns:
        o: `(..., n_queries, d)` in the input dtype. The backward pass uses q, k, v, o and one
        saved logsumexp tensor L of shape `(..., n_queries)` (fp32, or fp64 for fp64 inputs).
    """

    @staticmethod
    def forward(
        ctx,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        is_causal: bool = False,
        scale: float | None = None,
    ) -> torch.Tensor:
        check_attention_inputs(q, k, v, dtypes=_DTYPES)
        scale = 1.0 / math.sqrt(q.shape[-1]) if scale is None else float(scale)
        o, lse = _forward(*flatten_batch(q, k, v), bool(is_causal), scale)
        o, lse = o.view(q.shape), lse.view(q.shape[:-1])
        ctx.save_for_backward(q, k, v, o, lse)
        ctx.is_causal, ctx.scale = bool(is_causal), scale
        return o

    @staticmethod
    def backward(ctx, do: torch.Tensor):
        q, k, v, o, lse = ctx.saved_tensors
        q3, k3, v3, o3, do3 = flatten_batch(q, k, v, o, do)
        lse2 = lse.reshape(q3.shape[:-1])
        dq, dk, dv = _backward(q3, k3, v3, o3, lse2, do3, ctx.is_causal, ctx.scale)
        return dq.view(q.shape), dk.view(k.shape), dv.view(v.shape), None, None
