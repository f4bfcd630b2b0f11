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

import torch
import torch.nn.functional as F
from torch.autograd.function import once_differentiable

from fa2.checks import Call, check_call, group_heads
from fa2.layouts import as_bhsd
from fa2.masks import NO_WINDOW, Band, visible
from fa2.triton.configs import dot_precision

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


def _seen_by(
    band: Band, start: int, stop: int, n_queries: int, n_keys: int, n_tiles: int
) -> tuple[int, int]:
    """The query tiles [first, last) with a row that sees one of the keys [start, stop): query i
    sees key j iff i + lo <= j <= i + hi, so rows from start - hi to stop - 1 - lo."""
    lo, hi = band.bounds(n_queries, n_keys)
    first = max(start - hi, 0) // BLOCK_Q if hi is not None else 0
    last = min((stop - 1 - lo) // BLOCK_Q + 1, n_tiles) if lo is not None else n_tiles
    return first, last


def _tile_mask(
    band: Band, rows: torch.Tensor, start: int, stop: int, n_queries: int, n_keys: int
) -> torch.Tensor | None:
    """`visible` for tiled rows (tiles, BLOCK_Q) and the keys [start, stop): (tiles, BLOCK_Q,
    stop - start), or None where nothing is hidden."""
    cols = torch.arange(start, stop, device=rows.device)
    keep = visible(band, rows.flatten(), cols, n_queries, n_keys)
    return None if keep is None else keep.view(*rows.shape, stop - start)


def _scores(
    q: torch.Tensor, k: torch.Tensor, scale: float, softcap: float
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Scores of query tiles (batch, group, tiles, BLOCK_Q, d) against keys (batch, n, d), and
    with a softcap the tanh they were capped with (for the backward's chain rule)."""
    s = torch.einsum("bgtqd,bkd->bgtqk", q, k) * scale
    if not softcap:
        return s, None
    t = torch.tanh(s / softcap)
    return softcap * t, t


def _forward(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, band: Band, softcap: float, scale: float
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
        stop = min(start + BLOCK_K, n_keys)
        # Query tiles none of whose rows sees these keys are skipped.
        first, last = _seen_by(band, start, stop, n_queries, n_keys, rows.shape[0])
        if first >= last:
            continue
        kj = k[:, start:stop].to(acc_dtype)  # (batch, block_k, d)
        vj = v[:, start:stop].to(acc_dtype)
        s, _ = _scores(qt[:, :, first:last], kj, scale, softcap)
        keep = _tile_mask(band, rows[first:last], start, stop, n_queries, n_keys)
        if keep is not None:
            s = s.masked_fill(~keep, float("-inf"))
        m_old = m[:, :, first:last]
        m_new = torch.maximum(m_old, s.amax(dim=-1))
        # A row that has seen no key yet keeps m = -inf; exponents are then taken from 0.
        m_safe = m_new.masked_fill(m_new == float("-inf"), 0.0)
        p = torch.exp(s - m_safe[..., None])
        alpha = torch.exp(m_old - m_safe)  # rescales what was accumulated so far
        l[:, :, first:last] = alpha * l[:, :, first:last] + p.sum(dim=-1)
        acc[:, :, first:last] = alpha[..., None] * acc[:, :, first:last] + torch.einsum(
            "bgtqk,bkd->bgtqd", p, vj
        )
        m[:, :, first:last] = m_new

    seen = l > 0  # rows that saw no key get o = 0 and L = +inf (no gradient flows through them)
    o = acc / torch.where(seen, l, 1.0)[..., None]
    lse = torch.where(seen, m + torch.log(l), float("inf"))
    return _untile(o, n_queries).to(q.dtype), _untile(lse, n_queries)


def _backward(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    o: torch.Tensor,
    lse: torch.Tensor,
    do: torch.Tensor,
    band: Band,
    softcap: float,
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
    dk = torch.zeros(k.shape, dtype=acc_dtype, device=k.device)  # keys nobody sees keep 0
    dv = torch.zeros_like(dk)

    for start in range(0, n_keys, BLOCK_K):
        stop = min(start + BLOCK_K, n_keys)
        first, last = _seen_by(band, start, stop, n_queries, n_keys, rows.shape[0])
        if first >= last:
            continue
        kj, vj = k[:, start:stop].to(acc_dtype), v[:, start:stop].to(acc_dtype)
        q_seen, do_seen = qt[:, :, first:last], dot[:, :, first:last]
        s, capped = _scores(q_seen, kj, scale, softcap)
        p = torch.exp(s - lt[:, :, first:last, :, None])  # the forward's probabilities, recomputed
        keep = _tile_mask(band, rows[first:last], start, stop, n_queries, n_keys)
        if keep is not None:
            p = p.masked_fill(~keep, 0.0)
        dp = torch.einsum("bgtqd,bkd->bgtqk", do_seen, vj)
        ds = p * (dp - dt[:, :, first:last, :, None])  # gradient of the (capped) scores
        if capped is not None:  # d/ds of softcap * tanh(s / softcap) = 1 - tanh²
            ds = ds * (1 - capped * capped)
        dv[:, start:stop] = torch.einsum("bgtqk,bgtqd->bkd", p, do_seen)
        dk[:, start:stop] = torch.einsum("bgtqk,bgtqd->bkd", ds, q_seen) * scale
        dq[:, :, first:last] += torch.einsum("bgtqk,bkd->bgtqd", ds, kj) * scale

    return _untile(dq, n_queries).to(q.dtype), dk.to(k.dtype), dv.to(v.dtype)


def _sequences(call: Call, q: torch.Tensor, k: torch.Tensor, cu_q, cu_k):
    """(query rows, key rows) of each sequence: slices of the token dim of the bhsd views
    (packed sequences), or everything at once."""
    if call.layout != "thd":
        return [(slice(None), slice(None))]
    cq, ck = cu_q.tolist(), cu_k.tolist()
    return [(slice(a, b), slice(c, e)) for a, b, c, e in zip(cq, cq[1:], ck, ck[1:], strict=False)]


class FlashAttention2PyTorch(torch.autograd.Function):
    """FlashAttention-2 forward and backward in tiled PyTorch; no score matrix is materialised.

    Call as `FlashAttention2PyTorch.apply(q, k, v, is_causal=False, scale=None,
    return_lse=False, precision=None, deterministic=True, window_size=(-1, -1), softcap=0.0,
    layout="bhsd", cu_seqlens_q=None, cu_seqlens_k=None, max_seqlen_q=None,
    max_seqlen_k=None, bottom_right=False)` with the options passed positionally (autograd
    Functions take no keyword arguments), the same list as `FlashAttention2Triton`'s;
    `flash_attention`, `flash_attn_func` and `flash_attn_varlen_func` are the keyword-friendly
    front doors.

    Args:
        q: `(..., heads, n_queries, d)`; k, v: `(..., kv_heads, n_keys, d)`, same dtype and
            device, the same dims before the heads, `heads` a multiple of `kv_heads`
            (grouped-query attention, k and v not copied). fp16, bf16, fp32 or fp64; any
            device torch runs on. `layout` "bshd" swaps heads and sequence; "thd" is packed
            sequences `(total_tokens, heads, d)` described by the `cu_seqlens_*` (int32
            cumulative lengths) and `max_seqlen_*`.
        is_causal: hide keys after the diagonal. The diagonal starts at query 0, key 0 (top-left,
            as in the CS336 handout), or with `bottom_right` ends at the last query and key
            (flash-attn); see `fa2.masks`. Keys nobody sees get zero gradient; queries that see
            nothing get o = 0, lse = +inf.
        scale: softmax scale, default 1/sqrt(d).
        return_lse: also return the logsumexp L (not differentiable).
        precision, deterministic: options of the Triton kernels; this path multiplies fp32
            exactly and is deterministic whatever they say (`precision` must still be a known
            name).
        window_size: `(left, right)`: query i sees keys i - left ... i + right around the
            diagonal; -1: unbounded on that side. `is_causal` makes `right` 0.
        softcap: scores become `softcap * tanh(scores / softcap)` (Gemma 2); 0: off.

    Returns:
        o in q's layout and dtype, contiguous, or `(o, lse)` with `return_lse`, lse of shape
        `(..., heads, n_queries)` (packed sequences: `(heads, total_tokens)`). The backward
        pass uses q, k, v, o and one saved logsumexp tensor (fp32, or fp64 for fp64 inputs).
        The backward is itself not differentiable: a double backward raises instead of giving
        wrong second derivatives.
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
        precision: str | None = None,
        deterministic: bool = True,
        window_size: tuple[int, int] = NO_WINDOW,
        softcap: float = 0.0,
        layout: str = "bhsd",
        cu_seqlens_q: torch.Tensor | None = None,
        cu_seqlens_k: torch.Tensor | None = None,
        max_seqlen_q: int | None = None,
        max_seqlen_k: int | None = None,
        bottom_right: bool = False,
    ) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
        call = check_call(
            q, k, v, dtypes=_DTYPES, is_causal=is_causal, scale=scale, window_size=window_size,
            softcap=softcap, layout=layout, cu_seqlens_q=cu_seqlens_q, cu_seqlens_k=cu_seqlens_k,
            max_seqlen_q=max_seqlen_q, max_seqlen_k=max_seqlen_k, bottom_right=bottom_right,
        )  # fmt: skip
        dot_precision(torch.float32, precision)  # an unknown name fails here as on the GPU
        qb, kb, vb = (as_bhsd(t, call.layout) for t in (q, k, v))  # (..., heads, n, d) views
        o = torch.empty_like(q, memory_format=torch.contiguous_format)
        lse = q.new_empty(qb.shape[:-1], dtype=_accumulator_dtype(q.dtype))
        ob = as_bhsd(o, call.layout)
        for rows, cols in _sequences(call, q, k, cu_seqlens_q, cu_seqlens_k):
            qs, ks, vs = qb[..., rows, :], kb[..., cols, :], vb[..., cols, :]
            if ks.shape[-2] == 0:  # a packed sequence without keys: its queries see nothing
                ob[..., rows, :], lse[..., rows] = 0.0, float("inf")
                continue
            os_, lses = _forward(*group_heads(qs, ks, vs), call.band, call.softcap, call.scale)
            ob[..., rows, :], lse[..., rows] = os_.view(qs.shape), lses.view(qs.shape[:-1])
        # The offsets of packed sequences only when there are some: the tensors saved are then
        # q, k, v, o and the one logsumexp, as the course's tests look for (no None among them).
        packed = () if cu_seqlens_q is None else (cu_seqlens_q, cu_seqlens_k)
        ctx.save_for_backward(q, k, v, o, lse, *packed)
        ctx.call = call
        if return_lse:
            ctx.mark_non_differentiable(lse)
            return o, lse
        return o

    @staticmethod
    @once_differentiable
    def backward(ctx, do: torch.Tensor, *_):
        q, k, v, o, lse, *packed = ctx.saved_tensors
        cu_q, cu_k = packed or (None, None)
        call = ctx.call
        dq = torch.zeros_like(q, memory_format=torch.contiguous_format)
        dk = torch.zeros_like(k, memory_format=torch.contiguous_format)
        dv = torch.zeros_like(v, memory_format=torch.contiguous_format)
        qb, kb, vb, ob, dob, dqb, dkb, dvb = (
            as_bhsd(t, call.layout) for t in (q, k, v, o, do, dq, dk, dv)
        )  # (..., heads, n, d) views
        for rows, cols in _sequences(call, q, k, cu_q, cu_k):
            qs, ks, vs = qb[..., rows, :], kb[..., cols, :], vb[..., cols, :]
            if ks.shape[-2] == 0:
                continue
            qg, kg, vg = group_heads(qs, ks, vs)
            og, dog = ob[..., rows, :].reshape(qg.shape), dob[..., rows, :].reshape(qg.shape)
            lg = lse[..., rows].reshape(qg.shape[:-1])
            dqs, dks, dvs = _backward(qg, kg, vg, og, lg, dog, call.band, call.softcap, call.scale)
            dqb[..., rows, :] = dqs.view(qs.shape)
            dkb[..., cols, :], dvb[..., cols, :] = dks.view(ks.shape), dvs.view(vs.shape)
        return dq, dk, dv, *(None,) * 13
