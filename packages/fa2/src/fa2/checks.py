"""Input validation shared by every entry point: one place that says what is wrong."""

from __future__ import annotations

import math
import weakref
from collections.abc import Sequence
from typing import NamedTuple

import torch

from fa2.layouts import LAYOUTS, as_bhsd
from fa2.masks import Band, check_softcap, make_band

__all__ = [
    "MAX_HEAD_DIM",
    "Call",
    "check_attention_inputs",
    "check_call",
    "check_varlen",
    "group_heads",
    "longest_sequence",
    "same_offsets",
    "softmax_scale",
    "vouch_for_offsets",
]

# Head dims up to this size run in the Triton kernels (padded internally to a power of two
# of at least 16). Beyond it a (BLOCK_M, head_dim) fp32 accumulator no longer fits in registers.
MAX_HEAD_DIM = 256

_BSHD_HINT = (
    "; read as (batch, seq, heads, head_dim) these shapes would be valid: pass layout='bshd' "
    "(or call fa2.flash_attn_func, which takes flash-attn's layout)"
)


def check_attention_inputs(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    *,
    dtypes: tuple[torch.dtype, ...],
    max_head_dim: int | None = None,
    layout: str = "bhsd",
) -> None:
    """Raise `TypeError`/`ValueError` naming the problem if q, k, v are not a valid attention call.

    In the default layout "bhsd", q is `(..., heads, n_queries, d)` and k, v are
    `(..., kv_heads, n_keys, d)` with identical dims before the heads and `heads` a multiple
    of `kv_heads` (grouped-query attention; for 2-D inputs there is one head); "bshd" swaps
    the heads and the sequence, `(..., seq, heads, d)`; "thd" is `(tokens, heads, d)`. All
    three share a device and one of `dtypes`. Where shapes are invalid as "bhsd" but would be
    valid as "bshd", the message says so.
    """
    min_dims = 2 if layout == "bhsd" else 3
    for name, t in (("q", q), ("k", k), ("v", v)):
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
        if not t.is_floating_point():
            raise TypeError(f"{name} must be a floating-point tensor, got {t.dtype}")
        if t.dtype not in dtypes:
            names = ", ".join(str(d).removeprefix("torch.") for d in dtypes)
            raise TypeError(f"{name} has dtype {t.dtype}; supported here: {names}")
        if t.dim() < min_dims or (layout == "thd" and t.dim() != 3):
            form = {
                "bhsd": "at least 2 dims (..., seq, d)",
                "bshd": "at least 3 dims (..., seq, heads, d)",
            }.get(layout, "exactly 3 dims (total_tokens, heads, d)")
            raise ValueError(f"{name} must have {form}, got shape {tuple(t.shape)}")
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
    problem = _shape_problem(*(as_bhsd(t, layout) for t in (q, k)))
    if problem is not None:
        as_bshd = (as_bhsd(t, "bshd") for t in (q, k))
        if layout == "bhsd" and q.dim() >= 3 and _shape_problem(*as_bshd) is None:
            problem += _BSHD_HINT
        raise ValueError(problem)
    if q.shape[-1] == 0:
        raise ValueError("head dim must be at least 1")
    if max_head_dim is not None and q.shape[-1] > max_head_dim:
        raise ValueError(
            f"head dim {q.shape[-1]} is not supported by the Triton kernels (at most "
            f"{max_head_dim}); use FlashAttention2PyTorch or split the head dim"
        )


def _shape_problem(q: torch.Tensor, k: torch.Tensor) -> str | None:
    """What is wrong with q `(..., heads, n_q, d)` and k `(..., kv_heads, n_k, d)`, or None."""
    heads_ok = q.dim() < 3 or (q.shape[-3] % k.shape[-3] == 0 if k.shape[-3] else q.shape[-3] == 0)
    if q.shape[:-3] != k.shape[:-3] or not heads_ok:
        return (
            f"q and k must have the same leading (batch/head) dims, got {tuple(q.shape[:-2])} "
            f"and {tuple(k.shape[:-2])} (as (..., heads) before (seq, head_dim)), except that q "
            "may have a multiple of k's heads (grouped-query attention); broadcasting is not "
            "supported, expand them first"
        )
    if q.shape[-1] != k.shape[-1]:
        return f"q and k must have the same head dim, got {q.shape[-1]} and {k.shape[-1]}"
    if k.shape[-2] == 0 and q.shape[-2] > 0:
        return "attention needs at least one key (n_keys = 0)"
    return None


def check_varlen(
    q: torch.Tensor,
    k: torch.Tensor,
    cu_seqlens_q: torch.Tensor,
    cu_seqlens_k: torch.Tensor,
    max_seqlen_q: int,
    max_seqlen_k: int,
) -> None:
    """Raise `TypeError`/`ValueError` if the packed-sequence description does not fit q `(total_q,
    heads, d)` and k `(total_k, kv_heads, d)`; both implementations call it on every call.

    cu_seqlens_q and cu_seqlens_k: int32, 1-D, on q's device, one entry more than there are
    sequences, starting at 0, non-decreasing, ending at total_q (total_k), no sequence longer
    than max_seqlen_q (max_seqlen_k). A sequence may have no queries or no keys (its queries
    then see nothing and get 0).

    What each check costs:

    - the offsets' dtype, shape and device and the two max_seqlen ints: attribute reads on
      the host, no device work;
    - the offsets' values, by where they live:
      - CPU tensors: a handful of small tensor operations on the host, raising ValueError;
      - under torch.compile: device-side assertions traced into the graph
        (`torch._assert_async`, which Inductor fuses into the graph's kernels), so every run of
        the graph checks them without waiting for the device; a bad value stops the graph
        with a RuntimeError (on a GPU a device-side assert, which ends the process's CUDA
        context);
      - CUDA tensors in eager mode: the same device-side assertions, about ten tiny kernels
        and no synchronisation, once per offsets tensor: an offsets tensor that passed is
        not checked again while it is the same object with the same version counter (which
        every in-place change through torch bumps) and the same totals and max_seqlen. A
        training step passes the same offsets to every layer, so it pays once per step
        (once in all for self-attention: the same memory for both sides is checked once).
        Writes that torch does not see (through `.data`, numpy, DLPack or a kernel of
        another library) are not noticed; flash-attn checks no values at all.
    """
    for name, cu in (("cu_seqlens_q", cu_seqlens_q), ("cu_seqlens_k", cu_seqlens_k)):
        if not isinstance(cu, torch.Tensor):
            raise TypeError(f"{name} must be a torch.Tensor, got {type(cu).__name__}")
        if cu.dtype != torch.int32 or cu.dim() != 1 or cu.shape[0] < 2:
            raise ValueError(
                f"{name} must be a 1-D int32 tensor of (number of sequences + 1) cumulative "
                f"lengths starting at 0, got {cu.dtype} of shape {tuple(cu.shape)}"
            )
        if cu.device != q.device:
            raise ValueError(f"{name} must be on q's device {q.device}, got {cu.device}")
    if cu_seqlens_q.shape != cu_seqlens_k.shape:
        raise ValueError(
            "cu_seqlens_q and cu_seqlens_k must describe the same number of sequences, got "
            f"{cu_seqlens_q.shape[0] - 1} and {cu_seqlens_k.shape[0] - 1}"
        )
    for name, m in (("max_seqlen_q", max_seqlen_q), ("max_seqlen_k", max_seqlen_k)):
        if isinstance(m, bool) or not isinstance(m, int) or m < 0:
            raise TypeError(f"{name} must be a non-negative int, got {m!r}")
    sides = (
        ("cu_seqlens_q", cu_seqlens_q, q.shape[0], max_seqlen_q),
        ("cu_seqlens_k", cu_seqlens_k, k.shape[0], max_seqlen_k),
    )
    if torch.compiler.is_compiling():
        for side in sides:
            _assert_offsets(*side)
        return
    if sides[0][2:] == sides[1][2:] and same_offsets(cu_seqlens_q, cu_seqlens_k):
        sides = sides[:1]  # self-attention: one tensor (or a view of it, see fa2.api) for both
    if cu_seqlens_q.device.type == "cuda":
        for side in sides:
            _assert_offsets_once(*side)
    else:  # the CPU; other devices read the values to the host (a sync) but say what is wrong
        for side in sides:
            _raise_on_bad_offsets(*side)


def same_offsets(a: object, b: object) -> bool:
    """Whether the offsets `a` and `b` are the same elements of the same memory (equal values,
    always: each packed sequence then has as many queries as keys).

    The same object, or in eager mode a view of the same memory: the front doors hand k's
    offsets on as a view of q's when one tensor is given for both (`fa2.api._distinct`).
    Under torch.compile only the same object counts: traced tensors have no data pointers.
    """
    if a is b:
        return True
    if torch.compiler.is_compiling():
        return False
    if not isinstance(a, torch.Tensor) or not isinstance(b, torch.Tensor):
        return False
    return a.data_ptr() == b.data_ptr() and a.shape == b.shape and a.stride() == b.stride()


def _raise_on_bad_offsets(name: str, cu: torch.Tensor, total: int, longest: int) -> None:
    """ValueError naming what is wrong with the values of CPU offsets `cu`."""
    lengths = cu.diff()
    if cu[0] != 0 or cu[-1] != total or (lengths < 0).any():
        raise ValueError(
            f"{name} must start at 0, never decrease and end at the number of tokens "
            f"({total}), got {cu.tolist()}"
        )
    if lengths.max() > longest:
        raise ValueError(
            f"{name} has a sequence of {int(lengths.max())} tokens, longer than "
            f"max_seqlen_{name[-1]} = {longest}"
        )


def _assert_offsets(name: str, cu: torch.Tensor, total: int, longest: int) -> None:
    """Device-side assertions that the offsets `cu` are valid: no host synchronisation."""
    lengths = cu.diff()
    shortest, longest_seen = torch.aminmax(lengths)
    valid = (cu[0] == 0) & (cu[-1] == total) & (shortest >= 0) & (longest_seen <= longest)
    torch._assert_async(
        valid,
        f"fa2: {name} must start at 0, never decrease, end at the number of tokens ({total}) "
        f"and hold no sequence longer than max_seqlen_{name[-1]} ({longest})",
    )


# Offsets tensors on a device whose values passed `_assert_offsets`: id -> (a weak reference to
# the tensor, (its version counter, total, max_seqlen) when checked). A hit needs the very same
# live tensor, unchanged, for the same totals; anything else is checked again. At this many
# entries the tensors that are gone, then the oldest half, are forgotten: a training step uses
# one or two offsets tensors, so this covers several steps' worth while never holding on to a
# tensor, and a pair vouched for together is never split.
_CHECKED_OFFSETS: dict[int, tuple[weakref.ref, tuple[int, int, int]]] = {}
_MAX_CHECKED_OFFSETS = 16


def _assert_offsets_once(name: str, cu: torch.Tensor, total: int, longest: int) -> None:
    """`_assert_offsets`, skipped for an offsets tensor already checked and unchanged since."""
    seen = _CHECKED_OFFSETS.get(id(cu))
    if seen is not None and seen[0]() is cu and seen[1] == (cu._version, total, longest):
        return
    _assert_offsets(name, cu, total, longest)
    _record_checked(cu, total, longest)


def _record_checked(cu: torch.Tensor, total: int, longest: int) -> None:
    """Remember `cu` as checked, as the newest entry (see `_CHECKED_OFFSETS`)."""
    if len(_CHECKED_OFFSETS) >= _MAX_CHECKED_OFFSETS:
        gone = [key for key, (ref, _) in _CHECKED_OFFSETS.items() if ref() is None]
        oldest = [key for key in _CHECKED_OFFSETS if key not in gone]
        for key in gone + oldest[: len(oldest) - _MAX_CHECKED_OFFSETS // 2]:
            del _CHECKED_OFFSETS[key]
    _CHECKED_OFFSETS.pop(id(cu), None)
    _CHECKED_OFFSETS[id(cu)] = (weakref.ref(cu), (cu._version, total, longest))


def vouch_for_offsets(cu: torch.Tensor, *, total: int, max_seqlen: int) -> torch.Tensor:
    """`cu`, recorded as valid cumulative lengths of `total` tokens with no sequence longer
    than `max_seqlen`: `check_varlen` then issues no device-side assertions for it while it
    is unchanged (and called with that total and max_seqlen). Nothing is checked.

    For offsets fa2 builds itself from lengths it checked on the host, where a new tensor each
    call would otherwise pay the assertions every time: `flash_attn_with_kvcache`'s rows at one
    length, which a decoding step reads in every layer."""
    _record_checked(cu, total, max_seqlen)
    return cu


class Call(NamedTuple):
    """A validated call's options, as the implementations use them."""

    band: Band  # which keys each query sees (fa2.masks)
    softcap: float  # 0: off
    scale: float  # softmax scale
    layout: str  # "bhsd", "bshd" or "thd" (packed sequences)


def check_call(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    *,
    dtypes: tuple[torch.dtype, ...],
    max_head_dim: int | None = None,
    is_causal: bool,
    scale: float | None,
    window_size: Sequence[int],
    softcap: float,
    layout: str,
    cu_seqlens_q: torch.Tensor | None,
    cu_seqlens_k: torch.Tensor | None,
    max_seqlen_q: int | None,
    max_seqlen_k: int | None,
    bottom_right: bool,
) -> Call:
    """Validate a call of either autograd Function (the arguments are theirs) and resolve its
    options: raises `TypeError`/`ValueError` naming what is wrong."""
    varlen = (cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k)
    if any(x is not None for x in varlen):
        if layout != "thd" or any(x is None for x in varlen):
            raise ValueError(
                "packed sequences need layout 'thd' (q: (total_tokens, heads, head_dim)) and all "
                "of cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k"
            )
    elif layout not in LAYOUTS:
        raise ValueError(
            f"layout must be one of {', '.join(map(repr, LAYOUTS))} ('thd' with cu_seqlens), "
            f"got {layout!r}"
        )
    check_attention_inputs(q, k, v, dtypes=dtypes, max_head_dim=max_head_dim, layout=layout)
    if layout == "thd":
        check_varlen(q, k, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k)
    scale = softmax_scale(scale, head_dim=q.shape[-1])
    band = make_band(
        causal=bool(is_causal), window_size=window_size, bottom_right=bottom_right,
        longest=longest_sequence(q, k, layout),
    )  # fmt: skip
    return Call(band, check_softcap(softcap), scale, layout)


def softmax_scale(scale: float | None, *, head_dim: int) -> float:
    """`scale` as a float, or the default 1/sqrt(head_dim) where it is None."""
    return 1.0 / math.sqrt(head_dim) if scale is None else float(scale)


def longest_sequence(q: torch.Tensor, k: torch.Tensor, layout: str) -> int:
    """An upper bound on any query or key sequence of a valid call: the longer of n_queries and
    n_keys, or for packed sequences ("thd") the more tokens (no sequence holds more)."""
    if layout == "thd":
        return max(q.shape[0], k.shape[0])
    return max(as_bhsd(q, layout).shape[-2], as_bhsd(k, layout).shape[-2])


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
