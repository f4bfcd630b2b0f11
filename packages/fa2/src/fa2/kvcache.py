"""`flash_attn_with_kvcache`: decoding against a contiguous key/value cache, as flash-attn's.

Each step appends the new keys and values to the cache in place, at `cache_seqlens`, and
attends the new queries to everything the cache then holds, with flash-attn's bottom-right
alignment (the last query sees the last key). Sequences of a batch may hold different
lengths: the cache is read in place as packed sequences, no copy of it is made. Viewed as
`(batch_cache * seqlen_cache, kv_heads, head_dim)`, row b's keys are one sequence
(`cache_leftpad[b]` up to `cache_seqlens[b] + seqlen_new`), and the unused slots before and
after it are sequences of their own without queries, which the kernels skip; so
`flash_attn_varlen_func`'s kernels (Triton on CUDA, the tiled PyTorch code elsewhere) serve
every call with one launch plan, whatever the lengths.

No backward (as flash-attn's): the call runs without autograd.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence

import torch

from fa2.api import attend
from fa2.checks import vouch_for_offsets
from fa2.dropin import refuse_unsupported
from fa2.masks import NO_WINDOW, make_band

__all__ = ["flash_attn_with_kvcache"]

_INDEX_DTYPES = (torch.int32, torch.int64)


def _check_index(name: str, t: object, batch: int, device: torch.device) -> None:
    if not isinstance(t, torch.Tensor) or t.dtype not in _INDEX_DTYPES or t.shape != (batch,):
        raise ValueError(
            f"{name} must be a ({batch},) int32 tensor (one entry per sequence of q), got "
            f"{getattr(t, 'dtype', type(t).__name__)} of shape {tuple(getattr(t, 'shape', ()))}"
        )
    if t.device != device:
        raise ValueError(f"{name} must be on q's device {device}, got {t.device}")


def _check_shapes(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    k: torch.Tensor | None,
    v: torch.Tensor | None,
) -> None:
    """Raise naming what is wrong with the tensors' ranks and shapes (dtypes, devices and head
    counts are checked where attention is computed, as for every other entry point)."""
    for name, t in (("q", q), ("k_cache", k_cache), ("v_cache", v_cache)):
        if not isinstance(t, torch.Tensor) or t.dim() != 4:
            raise ValueError(
                f"{name} must be a 4-D tensor (batch, seqlen, heads, head_dim), got "
                f"{getattr(t, 'shape', type(t).__name__)}"
            )
    if k_cache.shape != v_cache.shape:
        raise ValueError(
            f"k_cache and v_cache must have one shape, got {tuple(k_cache.shape)} and "
            f"{tuple(v_cache.shape)}"
        )
    if (k is None) != (v is None):
        raise ValueError("pass both k and v (the keys and values to append), or neither")
    if k is None:
        return
    for name, t, cache in (("k", k, k_cache), ("v", v, v_cache)):
        fits = (
            isinstance(t, torch.Tensor)
            and t.dim() == 4
            and t.shape[0] == q.shape[0]
            and t.shape[2:] == k_cache.shape[2:]
            and t.shape == k.shape
        )
        if not fits:
            raise ValueError(
                f"{name} must be (batch, seqlen_new, kv_heads, head_dim) = ({q.shape[0]}, "
                f"seqlen_new, {k_cache.shape[2]}, {k_cache.shape[3]}), k and v alike, got "
                f"{tuple(getattr(t, 'shape', ()))}"
            )
        if t.dtype != cache.dtype:
            raise TypeError(f"{name} has dtype {t.dtype}, its cache {cache.dtype}; cast one")


def _seqlens(cache_seqlens: int | torch.Tensor | None, q: torch.Tensor) -> torch.Tensor | None:
    """`cache_seqlens` as a `(batch,)` int64 tensor on q's device (None stays None)."""
    if cache_seqlens is None:
        return None
    if isinstance(cache_seqlens, int) and not isinstance(cache_seqlens, bool):
        return torch.full((q.shape[0],), cache_seqlens, dtype=torch.int64, device=q.device)
    _check_index("cache_seqlens", cache_seqlens, q.shape[0], q.device)
    return cache_seqlens.long()


def _rotate(
    x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, positions: torch.Tensor,
    interleaved: bool,
) -> torch.Tensor:  # fmt: skip
    """Rotary embedding of x `(batch, seq, heads, d)`: the first `2 * cos.shape[1]` features
    rotated by the angles of rows `positions` `(batch, seq)` of the tables, in pairs
    (2i, 2i + 1) when `interleaved`, else (i, i + rotary_dim / 2) (GPT-NeoX); the rest kept.
    Computed in at least fp32 and rounded once to x's dtype."""
    half = cos.shape[-1]
    dtype = torch.promote_types(x.dtype, torch.float32)
    c = cos[positions].to(dtype)[:, :, None]  # (batch, seq, 1, rotary_dim / 2)
    s = sin[positions].to(dtype)[:, :, None]
    head = x[..., : 2 * half].to(dtype)
    x1, x2 = (head[..., 0::2], head[..., 1::2]) if interleaved else head.split(half, dim=-1)
    r1, r2 = x1 * c - x2 * s, x1 * s + x2 * c
    rotated = torch.stack((r1, r2), dim=-1).flatten(-2) if interleaved else torch.cat((r1, r2), -1)
    return torch.cat((rotated.to(x.dtype), x[..., 2 * half :]), dim=-1)


def _check_rotary(
    rotary_cos: torch.Tensor | None, rotary_sin: torch.Tensor | None, k: torch.Tensor | None,
    head_dim: int,
) -> bool:  # fmt: skip
    """Whether rotary embedding is asked for, or a ValueError naming what is wrong."""
    if rotary_cos is None and rotary_sin is None:
        return False
    if rotary_cos is None or rotary_sin is None:
        raise ValueError("pass both rotary_cos and rotary_sin, or neither")
    if k is None:
        raise ValueError(
            "rotary_cos and rotary_sin rotate the appended keys and the queries: pass k and v too"
        )
    ok = rotary_cos.dim() == 2 and rotary_cos.shape == rotary_sin.shape
    if not ok or 2 * rotary_cos.shape[1] > head_dim:
        raise ValueError(
            f"rotary_cos and rotary_sin must be (seqlen_ro, rotary_dim / 2) with rotary_dim <= "
            f"head_dim ({head_dim}), got {tuple(rotary_cos.shape)} and {tuple(rotary_sin.shape)}"
        )
    return True


def _check_values_on_cpu(
    seqlens: torch.Tensor | None, leftpad: torch.Tensor | None, rows: torch.Tensor | None,
    seqlen_new: int, k_cache: torch.Tensor, rotary_len: int | None,
) -> None:  # fmt: skip
    """Raise if the lengths do not fit the cache. Only for CPU tensors: reading a GPU tensor's
    values would stall every decoding step until the device caught up (flash-attn does not
    check them either)."""
    if k_cache.device.type != "cpu":
        return
    if rows is not None and ((rows < 0).any() or (rows >= k_cache.shape[0]).any()):
        raise ValueError(
            f"cache_batch_idx must index the cache's {k_cache.shape[0]} rows, got {rows.tolist()}"
        )
    if seqlens is None:
        return
    ends = seqlens + seqlen_new
    if (seqlens < 0).any() or (ends > k_cache.shape[1]).any():
        raise ValueError(
            f"cache_seqlens + seqlen_new must fit the cache's {k_cache.shape[1]} positions, got "
            f"cache_seqlens {seqlens.tolist()} with {seqlen_new} new tokens"
        )
    if leftpad is not None and ((leftpad < 0).any() or (leftpad > ends).any()):
        raise ValueError(
            f"cache_leftpad must lie between 0 and each sequence's end, got {leftpad.tolist()} "
            f"for ends {ends.tolist()}"
        )
    if rotary_len is not None and (ends > rotary_len).any():
        raise ValueError(
            f"rotary_cos and rotary_sin hold {rotary_len} positions; the keys reach position "
            f"{int(ends.max()) - 1}"
        )


def _packed_cache_offsets(
    starts: torch.Tensor, ends: torch.Tensor, seqlen_q: int, seqlen_cache: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """(cu_seqlens_q, cu_seqlens_k) that read row b of a `(batch, seqlen_cache, ...)` cache,
    flattened, as sequence 3b + 1 (keys `starts[b]:ends[b]`, the queries of row b), between
    sequences 3b and 3b + 2 that hold the unused slots before and after it and no queries."""
    batch = starts.shape[0]
    row = torch.arange(batch, device=starts.device)
    base_k = row * seqlen_cache  # where each cache row begins
    cu_k = torch.stack((base_k, base_k + starts, base_k + ends), dim=1).flatten()
    base_q = row * seqlen_q
    cu_q = torch.stack((base_q, base_q, base_q + seqlen_q), dim=1).flatten()
    close_k = cu_k.new_full((1,), batch * seqlen_cache)
    close_q = cu_q.new_full((1,), batch * seqlen_q)
    return torch.cat((cu_q, close_q)).int(), torch.cat((cu_k, close_k)).int()


def _check_uniform(
    cache_seqlens: int, seqlen_new: int, seqlen_cache: int, rotary_len: int | None
) -> None:
    """`_check_values_on_cpu` for one length given as an int: checked on every device (free)."""
    end = cache_seqlens + seqlen_new
    if cache_seqlens < 0 or end > seqlen_cache:
        raise ValueError(
            f"cache_seqlens + seqlen_new must fit the cache's {seqlen_cache} positions, got "
            f"cache_seqlens {cache_seqlens} with {seqlen_new} new tokens"
        )
    if rotary_len is not None and end > rotary_len:
        raise ValueError(
            f"rotary_cos and rotary_sin hold {rotary_len} positions; the keys reach position "
            f"{end - 1}"
        )


@functools.lru_cache(maxsize=64)
def _uniform_tables(
    batch: int, seqlen_q: int, seqlen_cache: int, device: torch.device
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(cu_seqlens_q, base, step) with which `_packed_cache_offsets` of rows that all end at
    `end` and start at 0 is `cu_seqlens_k = base + end * step`: one addition per call."""
    zeros = torch.zeros(batch, dtype=torch.long, device=device)
    cu_q, base = _packed_cache_offsets(zeros, zeros, seqlen_q, seqlen_cache)
    _, ones = _packed_cache_offsets(zeros, zeros + 1, seqlen_q, seqlen_cache)
    return cu_q, base, ones - base


def _uniform_offsets(
    batch: int, seqlen_q: int, seqlen_cache: int, end: int, device: torch.device
) -> tuple[torch.Tensor, torch.Tensor]:
    """`_packed_cache_offsets` for rows that all hold keys 0 ... end - 1, vouched for (`end`
    was checked on the host, so the values are right by construction: no device-side check)."""
    cu_q, base, step = _uniform_tables(batch, seqlen_q, seqlen_cache, device)
    return (
        vouch_for_offsets(cu_q, total=batch * seqlen_q, max_seqlen=seqlen_q),
        vouch_for_offsets(
            torch.add(base, step, alpha=end), total=batch * seqlen_cache, max_seqlen=seqlen_cache
        ),
    )


def flash_attn_with_kvcache(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    k: torch.Tensor | None = None,
    v: torch.Tensor | None = None,
    rotary_cos: torch.Tensor | None = None,
    rotary_sin: torch.Tensor | None = None,
    cache_seqlens: int | torch.Tensor | None = None,
    cache_batch_idx: torch.Tensor | None = None,
    cache_leftpad: torch.Tensor | None = None,
    block_table: torch.Tensor | None = None,
    softmax_scale: float | None = None,
    causal: bool = False,
    window_size: Sequence[int] = NO_WINDOW,
    softcap: float = 0.0,
    rotary_interleaved: bool = True,
    alibi_slopes: torch.Tensor | None = None,
    num_splits: int = 0,
    return_softmax_lse: bool = False,
) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
    """Attention of new queries to a key/value cache, appending new keys and values to it in
    place first, as flash-attn's `flash_attn_with_kvcache` (without paging).

    Sequence b attends to the keys `cache_leftpad[b] : cache_seqlens[b] + seqlen_new` of its
    cache row (after k and v were written at `cache_seqlens[b]`), with the masks, window,
    softcap and grouped-query heads of `flash_attn_func` aligned to that sequence's last key:
    with `causal=True` new query i (of seqlen_q) sees the keys up to position
    `cache_seqlens[b] + seqlen_new - seqlen_q + i`. A typical decoding loop::

        k_cache = torch.zeros(batch, max_len, kv_heads, head_dim, ...)  # and v_cache
        out = flash_attn_with_kvcache(q, k_cache, v_cache, k, v, cache_seqlens=0, causal=True)
        ...  # then one token at a time, cache_seqlens = tokens so far

    Args:
        q: `(batch, seqlen_q, heads, head_dim)`.
        k_cache: `(batch_cache, seqlen_cache, kv_heads, head_dim)`, `heads` a multiple of
            `kv_heads`; updated in place when k is given. v_cache likewise.
        k: `(batch, seqlen_new, kv_heads, head_dim)` keys to append, or None; v likewise
            (both or neither), in the caches' dtype.
        rotary_cos, rotary_sin: `(seqlen_ro, rotary_dim / 2)` tables, rotary_dim <= head_dim,
            or None: rotate the first rotary_dim features of k (and q) before k is written,
            k's token i by row `cache_seqlens[b] + i`; q's tokens likewise with `causal` or a
            window, else all by row `cache_seqlens[b]`. Needs k and v.
        cache_seqlens: an int (every row) or a `(batch,)` int32 tensor: the tokens each cache
            row holds before this call (where k is written). None: the whole cache, and no k.
        cache_batch_idx: `(batch,)` int32 rows of the cache that q's sequences use; None:
            rows 0 ... batch - 1. (The selected rows are copied for reading: without it the
            cache is read in place.)
        cache_leftpad: `(batch,)` int32, where each row's keys begin (0 when None).
        block_table: must be None (no paged caches).
        softmax_scale, causal, window_size, softcap: as `flash_attn_func`.
        rotary_interleaved: rotate pairs (0, 1), (2, 3), ... (True, default) or
            (0, rotary_dim / 2), ... (False, GPT-NeoX's and Hugging Face's rotate-half).
        alibi_slopes: must be None (no ALiBi).
        num_splits: flash-attn's split of the keys across thread blocks, a scheduling choice
            that does not change the result; fa2's kernels do not split, so any value >= 0
            gives the same output.
        return_softmax_lse: also return the logsumexp.

    Returns:
        out `(batch, seqlen_q, heads, head_dim)` in q's dtype; with `return_softmax_lse`,
        `(out, softmax_lse)`, softmax_lse `(batch, heads, seqlen_q)` fp32 (fp64 for fp64
        inputs), +inf for a query that sees no key.

    Raises:
        NotImplementedError: block_table, alibi_slopes.
        ValueError, TypeError: shapes, dtypes or devices that do not fit; on the CPU also
            lengths that overflow the cache or the rotary tables (on a GPU they are not
            checked: reading them would stall every step).
    """
    refuse_unsupported(0.0, alibi_slopes, block_table)
    _check_shapes(q, k_cache, v_cache, k, v)
    if isinstance(num_splits, bool) or not isinstance(num_splits, int) or num_splits < 0:
        raise ValueError(f"num_splits must be an int >= 0 (0: automatic), got {num_splits!r}")
    if k is not None and cache_seqlens is None:
        raise ValueError("appending k and v needs cache_seqlens: where in each row to write them")
    rotary = _check_rotary(rotary_cos, rotary_sin, k, q.shape[-1])
    batch, seqlen_q = q.shape[:2]
    seqlen_new = 0 if k is None else k.shape[1]
    rows = None
    if cache_batch_idx is not None:
        _check_index("cache_batch_idx", cache_batch_idx, batch, q.device)
        rows = cache_batch_idx.long()
    elif k_cache.shape[0] < batch:
        raise ValueError(
            f"the cache holds {k_cache.shape[0]} rows for {batch} sequences of q; pass "
            "cache_batch_idx or a cache with a row per sequence"
        )
    leftpad = None
    if cache_leftpad is not None:
        _check_index("cache_leftpad", cache_leftpad, batch, q.device)
        leftpad = cache_leftpad.long()
    # Every row at one length (an int), read from row 0 on: the decoding loop's common case,
    # served by slices and one precomputed offset table instead of per-row index arithmetic.
    uniform = type(cache_seqlens) is int and rows is None and leftpad is None
    seqlens = _seqlens(cache_seqlens, q) if rotary or not uniform else None
    rotary_len = rotary_cos.shape[0] if rotary else None
    if uniform:
        _check_uniform(cache_seqlens, seqlen_new, k_cache.shape[1], rotary_len)
    else:
        _check_values_on_cpu(seqlens, leftpad, rows, seqlen_new, k_cache, rotary_len)
    options = dict(
        causal=causal, scale=softmax_scale, window_size=window_size, softcap=softcap,
        return_lse=True, bottom_right=True,
    )  # fmt: skip
    with torch.no_grad():
        if k is not None:
            if rotary:
                positions = seqlens[:, None] + torch.arange(seqlen_new, device=q.device)
                k = _rotate(k, rotary_cos, rotary_sin, positions, rotary_interleaved)
                local = make_band(causal=causal, window_size=window_size).masked
                at = seqlens[:, None] + (torch.arange(seqlen_q, device=q.device) if local else 0)
                q = _rotate(q, rotary_cos, rotary_sin, at.expand(batch, seqlen_q),
                            rotary_interleaved)  # fmt: skip
            if uniform:  # (batch, seqlen_new) slices of the caches
                end = cache_seqlens + seqlen_new
                k_cache[:batch, cache_seqlens:end] = k
                v_cache[:batch, cache_seqlens:end] = v
            else:
                positions = seqlens[:, None] + torch.arange(seqlen_new, device=q.device)
                cache_rows = (torch.arange(batch, device=q.device) if rows is None else rows)[
                    :, None
                ]
                k_cache.index_put_((cache_rows, positions), k)
                v_cache.index_put_((cache_rows, positions), v)
        if rows is None:
            keys, values = k_cache[:batch], v_cache[:batch]  # views
        else:
            keys, values = k_cache.index_select(0, rows), v_cache.index_select(0, rows)
        seqlen_cache = keys.shape[1]
        if cache_seqlens is None and leftpad is None:  # the whole cache: plain bottom-right
            out, lse = attend(q, keys, values, layout="bshd", **options)
            return (out, lse) if return_softmax_lse else out
        if uniform:
            cu_q, cu_k = _uniform_offsets(
                batch, seqlen_q, seqlen_cache, cache_seqlens + seqlen_new, q.device
            )
        else:
            ends = keys.new_full((batch,), seqlen_cache, dtype=torch.long) if seqlens is None \
                else seqlens + seqlen_new  # fmt: skip
            starts = torch.zeros_like(ends) if leftpad is None else leftpad
            cu_q, cu_k = _packed_cache_offsets(starts, ends, seqlen_q, seqlen_cache)
        out, lse = attend(
            q.reshape(batch * seqlen_q, *q.shape[2:]),
            keys.reshape(batch * seqlen_cache, *keys.shape[2:]),  # a view when contiguous
            values.reshape(batch * seqlen_cache, *values.shape[2:]),
            layout="thd", cu_seqlens_q=cu_q, cu_seqlens_k=cu_k, max_seqlen_q=seqlen_q,
            max_seqlen_k=seqlen_cache, **options,
        )  # fmt: skip
    out = out.view(batch, seqlen_q, *out.shape[1:])
    if not return_softmax_lse:
        return out
    return out, lse.view(lse.shape[0], batch, seqlen_q).transpose(0, 1).contiguous()
