"""`FlashAttention2Triton`: the autograd Function that launches the kernels.

In eager mode the Function runs the launch plans directly (`run_forward`, `run_backward`): a
`torch.library` op's dispatch alone costs more host time than the kernels take at small sizes
(about 70 µs a call on an H100 host, measured). A call's plan is looked up by everything
that fixes it (shapes, strides, dtypes, devices, options); the inputs are validated when a
plan is built, so a call like an earlier one pays only for what the key leaves out and is
checked on every call: the packed sequences' offsets and max_seqlen (`check_varlen`, host
checks and, on a GPU, device-side assertions once per offsets tensor), a scale given
explicitly, and the inputs' 16-byte alignment (`CachedLaunch`). Under `torch.compile` the
Function validates the call and calls the custom ops of `fa2.triton.ops` instead, which that
module defines when it is first imported, from inside the compiled function: defining them
imports torch's compiler stack, which `import fa2` must not pay for. Triton itself is imported
on the first call too, so `import fa2` works where Triton is not installed (macOS, Windows)
and the PyTorch path stays usable there.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch.autograd.function import once_differentiable

from fa2.checks import (
    MAX_HEAD_DIM,
    Call,
    check_call,
    check_varlen,
    longest_sequence,
    same_offsets,
    softmax_scale,
)
from fa2.layouts import as_bhsd
from fa2.masks import NO_WINDOW
from fa2.triton.configs import INTERPRET, SHORT_SEQ, dot_precision

__all__ = ["FlashAttention2Triton", "interpreting", "run_backward", "run_forward"]

_DTYPES = (torch.float16, torch.bfloat16, torch.float32)
# The longest sequence a causal mask or window may cover. The kernels compute a tile's key range
# in int32 from a query row (< n_q), the diagonal's offset (|n_k - n_q| < longest) and a window
# side (< longest once `make_band` has made longer sides unbounded): sums below 3 * longest
# plus a tile of 256 rows, which stay below 2**31 up to longest = 2**29.
MAX_MASKED_SEQ = 2**29


def interpreting() -> bool:
    """True when Triton runs kernels in its CPU interpreter: TRITON_INTERPRET=1 when fa2 was
    imported (Triton, too, decides when the kernels are defined)."""
    return INTERPRET


def _check(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    *,
    precision: str | None,
    cu_seqlens_q: torch.Tensor | None,
    cu_seqlens_k: torch.Tensor | None,
    **options,
) -> tuple[Call, str, bool]:
    """Validate a call of the Triton path: (the call's options, the dot precision, whether each
    sequence has as many queries as keys)."""
    call = check_call(
        q, k, v, dtypes=_DTYPES, max_head_dim=MAX_HEAD_DIM, cu_seqlens_q=cu_seqlens_q,
        cu_seqlens_k=cu_seqlens_k, **options,
    )  # fmt: skip
    if q.device.type != "cuda" and not interpreting():
        raise ValueError(
            f"FlashAttention2Triton needs CUDA tensors, got {q.device}. On the CPU use "
            "fa2.flash_attention or FlashAttention2PyTorch (or set TRITON_INTERPRET=1 "
            "before importing triton to run the kernels in Triton's interpreter)."
        )
    _check_scale(call.scale)
    longest = longest_sequence(q, k, call.layout)
    if call.band.masked and longest > MAX_MASKED_SEQ:
        raise ValueError(
            f"a causal mask or window over sequences of up to {longest} tokens: the Triton "
            f"kernels place masks with int32 row arithmetic, exact up to {MAX_MASKED_SEQ} "
            "tokens; split the sequences or use FlashAttention2PyTorch"
        )
    if call.layout == "thd":
        same_lengths = same_offsets(cu_seqlens_q, cu_seqlens_k)  # packed self-attention
    else:
        same_lengths = as_bhsd(q, call.layout).shape[-2] == as_bhsd(k, call.layout).shape[-2]
    return call, dot_precision(q.dtype, precision), same_lengths


def _longest(max_seqlen_q: object, max_seqlen_k: object) -> int | None:
    """The longer of two max_seqlen, or None unless both are ints."""
    if isinstance(max_seqlen_q, int) and isinstance(max_seqlen_k, int):
        return max(max_seqlen_q, max_seqlen_k)
    return None


def _check_scale(scale: float) -> None:
    if not scale > 0:
        raise ValueError(
            f"the Triton kernels need a positive softmax scale, got {scale}; "
            "use FlashAttention2PyTorch for other scales"
        )


def run_forward(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    is_causal: bool = False,
    scale: float | None = None,
    precision: str | None = None,
    window_size: Sequence[int] = NO_WINDOW,
    softcap: float = 0.0,
    layout: str = "bhsd",
    cu_seqlens_q: torch.Tensor | None = None,
    cu_seqlens_k: torch.Tensor | None = None,
    max_seqlen_q: int | None = None,
    max_seqlen_k: int | None = None,
    bottom_right: bool = False,
):
    """The forward kernel alone (no autograd): `(o, lse, plan)`, the plan to hand to
    `run_backward`. Arguments as `FlashAttention2Triton`'s."""
    if isinstance(window_size, list):  # hashable, for the plan's key
        window_size = tuple(window_size)
    varlen = cu_seqlens_q is not None
    # The longest sequence, for the choice of tiles; packed sequences by their longest (None
    # where the max_seqlen are no ints: the check says so).
    longest = _longest(max_seqlen_q, max_seqlen_k) if varlen else None
    fp32 = getattr(q, "dtype", None) is torch.float32  # (not a tensor: the check says so)
    tf32 = precision is None and fp32 and dot_precision(torch.float32) == "tf32"
    # With q, k, v's shapes, strides, dtypes and devices, these make the plan's key: what
    # fixes the tiles, grids and kernels. Left out, and checked on every call below: the
    # packed sequences' offsets and max_seqlen (only whether the longest is short picks
    # tiles) and the scale; `deterministic` picks the backward plan.
    options = (
        is_causal, precision, tf32, window_size, softcap, layout, bottom_right,
        varlen and same_offsets(cu_seqlens_q, cu_seqlens_k),
        longest is not None and longest <= SHORT_SEQ,
    )  # fmt: skip
    from fa2.triton.forward import forward_plan

    checked = []  # whether `forward_plan` validated this call (it does when it builds a plan)

    def check() -> tuple[Call, str, bool]:
        checked.append(True)
        return _check(
            q, k, v, is_causal=is_causal, scale=scale, precision=precision,
            window_size=window_size, softcap=softcap, layout=layout, cu_seqlens_q=cu_seqlens_q,
            cu_seqlens_k=cu_seqlens_k, max_seqlen_q=max_seqlen_q, max_seqlen_k=max_seqlen_k,
            bottom_right=bottom_right,
        )  # fmt: skip

    plan = forward_plan(q, k, v, options, longest, check)
    if varlen and not checked:
        # A plan serves batches of any lengths: its key holds the shapes, not the offsets and
        # max_seqlen, which are checked here on every call instead (see `check_varlen`).
        check_varlen(q, k, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k)
    # Per call, like the offsets: a plan serves every scale (`plan.call.scale` is the scale of
    # the call that built it, not this one's).
    if scale is None:
        scale = softmax_scale(None, head_dim=q.shape[-1])
    else:
        _check_scale(scale)
    if varlen:
        cu, longest = (cu_seqlens_q, cu_seqlens_k), (max_seqlen_q, max_seqlen_k)
        o, lse = plan(q, k, v, scale, cu, longest, False)
    else:
        o, lse = plan(q, k, v, scale, None, None, False)
    return o, lse, plan


def run_backward(
    plan,
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    o: torch.Tensor,
    lse: torch.Tensor,
    do: torch.Tensor,
    scale: float,
    deterministic: bool = True,
    cu_seqlens: tuple[torch.Tensor, torch.Tensor] | None = None,
    max_seqlens: tuple[int, int] | None = None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The backward kernels alone (no autograd): dq, dk, dv of the outputs of `run_forward`
    (`plan` is its third return value)."""
    from fa2.triton.backward import backward_plan

    bwd = backward_plan(plan, q, k, v, o, lse, do, deterministic)
    return bwd(q, k, v, o, lse, do, scale, cu_seqlens, max_seqlens, False)


def _under_dispatch_mode() -> bool:
    """Whether a TorchDispatchMode is active (selective activation checkpointing, a FLOP or
    debug mode): the call then goes through fa2's registered ops, so the mode sees attention
    as one op (and selective checkpointing can keep its output) instead of bare launches."""
    return torch._C._len_torch_dispatch_stack() > 0


class FlashAttention2Triton(torch.autograd.Function):
    """FlashAttention-2 forward and backward as Triton kernels.

    Call as `FlashAttention2Triton.apply(q, k, v, is_causal=False, scale=None,
    return_lse=False, precision=None, deterministic=True, window_size=(-1, -1), softcap=0.0,
    layout="bhsd", cu_seqlens_q=None, cu_seqlens_k=None, max_seqlen_q=None,
    max_seqlen_k=None, bottom_right=False)` with the options passed positionally (autograd
    Functions take no keyword arguments; `FlashAttention2PyTorch` takes the same list);
    `flash_attention`, `flash_attn_func` and `flash_attn_varlen_func` are the keyword-friendly
    front doors. Works under `torch.compile`, with any strides the eager path takes.

    Args:
        q: `(..., heads, n_queries, d)`; k, v: `(..., kv_heads, n_keys, d)`, same dtype and
            device, the same dims before the heads; `heads` a multiple of `kv_heads`
            (grouped-query attention: query head h reads key/value head
            h // (heads // kv_heads); k and v are not copied). fp16, bf16 or fp32 CUDA
            tensors (CPU tensors only under TRITON_INTERPRET=1); any d up to 256 (tuned for
            16, 32, 64, 128). `layout` "bshd" swaps heads and sequence, `(..., seq, heads,
            d)`; "thd" is packed sequences `(total_tokens, heads, d)`, sequence b being the
            rows `cu_seqlens[b]:cu_seqlens[b + 1]` (int32 cumulative lengths on q's device,
            as many for k as for q), none longer than `max_seqlen_q` (`max_seqlen_k`).
            Inputs are read in place when the feature dim is contiguous and the dims before
            the heads merge into one stride; others are copied.
        is_causal: hide keys after the diagonal: query i sees key j iff j <= i, both counted
            from 0 (top-left aligned), or with `bottom_right` iff j <= i + n_keys - n_queries
            (flash-attn's alignment; per sequence when packed). See `fa2.masks`.
        scale: softmax scale, default 1/sqrt(d); must be positive.
        return_lse: also return the logsumexp L (not differentiable).
        precision: how fp32 inputs are multiplied, "tf32x3" (default: about fp32's accuracy
            on the tensor cores), "ieee" (exact fp32 FMA on the CUDA cores) or "tf32" (the
            default where `torch.backends.cuda.matmul.allow_tf32` is set). 16-bit inputs
            ignore it.
        deterministic: True (default): the backward gives the same bits on every run. False
            lets dQ's additions land in any order (its last bits then vary from run to run),
            which some backwards use to go faster. On Hopper, 16-bit inputs at head dim 128
            take the Gluon single pass (`fa2.triton.gluon_backward`, FA2_BACKWARD): one pass
            computes dK, dV and dQ with 5 matmuls per tile pair, adding dQ into an fp32
            buffer, in a fixed order when deterministic. Elsewhere, deterministic runs two
            passes (dQ, then dK/dV; 7 matmuls), and False allows the Triton single pass
            where it is faster: for fp32 inputs (on an H100, 0.58-0.91x the two-pass
            backward's time at d=64, about equal at d=128 with "tf32x3";
            docs/results/fa2_single_pass_h100_2026-11-23.md).
        window_size: `(left, right)`: query i sees only keys from `left` before to `right`
            after its diagonal position; -1: unbounded on that side; `is_causal` makes `right`
            0. Tiles wholly outside the window are never visited.
        softcap: scores become `softcap * tanh(scores / softcap)` before the softmax (Gemma 2);
            0: off.

    Returns:
        o in q's layout and dtype (contiguous), or `(o, lse)` with `return_lse`, lse of shape
        `(..., heads, n_queries)` (packed: `(heads, total_tokens)`) in fp32; +inf (and o = 0)
        for a query that sees no key. For backward, q, k, v, o and lse are saved; nothing of
        size n_q × n_k is. The backward is itself not differentiable: a double backward
        (e.g. `create_graph=True` then differentiating the gradients) raises instead of giving
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
        window_size: Sequence[int] = NO_WINDOW,
        softcap: float = 0.0,
        layout: str = "bhsd",
        cu_seqlens_q: torch.Tensor | None = None,
        cu_seqlens_k: torch.Tensor | None = None,
        max_seqlen_q: int | None = None,
        max_seqlen_k: int | None = None,
        bottom_right: bool = False,
    ) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
        if torch.compiler.is_compiling() or _under_dispatch_mode():
            call, precision, same_lengths = _check(
                q, k, v, is_causal=is_causal, scale=scale, precision=precision,
                window_size=window_size, softcap=softcap, layout=layout,
                cu_seqlens_q=cu_seqlens_q, cu_seqlens_k=cu_seqlens_k, max_seqlen_q=max_seqlen_q,
                max_seqlen_k=max_seqlen_k, bottom_right=bottom_right,
            )  # fmt: skip
            from fa2.triton.ops import forward_op, op_options

            ctx.op_options = op_options(call, precision, same_lengths, max_seqlen_q, max_seqlen_k)
            o, lse = forward_op(q, k, v, cu_seqlens_q, cu_seqlens_k, *ctx.op_options)
            ctx.plan = None
        else:
            o, lse, ctx.plan = run_forward(
                q, k, v, is_causal, scale, precision, window_size, softcap, layout,
                cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, bottom_right,
            )  # fmt: skip
        # The offsets of packed sequences only when there are some: the tensors saved are then
        # q, k, v, o and the one logsumexp, as the course's tests look for (no None among them).
        packed = () if cu_seqlens_q is None else (cu_seqlens_q, cu_seqlens_k)
        ctx.save_for_backward(q, k, v, o, lse, *packed)
        ctx.scale = softmax_scale(scale, head_dim=q.shape[-1])
        ctx.max_seqlens = (max_seqlen_q, max_seqlen_k)
        ctx.deterministic = bool(deterministic)
        if return_lse:
            ctx.mark_non_differentiable(lse)
            return o, lse
        return o

    @staticmethod
    @once_differentiable
    def backward(ctx, do: torch.Tensor, *_):
        q, k, v, o, lse, *packed = ctx.saved_tensors
        cu_q, cu_k = packed or (None, None)
        if ctx.plan is None:  # traced by torch.compile, or under a dispatch mode
            from fa2.triton.ops import backward_op

            dq, dk, dv = backward_op(
                q, k, v, o, lse, do, cu_q, cu_k, *ctx.op_options, ctx.deterministic
            )
        else:
            cu = None if cu_q is None else (cu_q, cu_k)
            dq, dk, dv = run_backward(
                ctx.plan, q, k, v, o, lse, do, ctx.scale, ctx.deterministic, cu, ctx.max_seqlens
            )
        return dq, dk, dv, *(None,) * 13
