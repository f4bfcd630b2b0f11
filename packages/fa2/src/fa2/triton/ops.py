"""The custom ops torch.compile sees in place of the Triton launches (imported on first use).

`fa2::triton_forward` and `fa2::triton_backward` are `torch.library.triton_op`s: the compiler
traces their bodies, which launch through `wrap_triton`, so the compiled graph contains the
kernels themselves and launches them from its own generated code. Where it cannot trace them
(Triton's CPU interpreter: `wrap_triton` does not take interpreted kernels; no Triton at all)
they are opaque `custom_op`s with a shape function instead. Defining either kind imports
torch's compiler stack, which is why this module is imported only by a Function running under
torch.compile or a TorchDispatchMode (selective activation checkpointing keeps
`fa2::triton_forward`'s outputs), never by `import fa2`. It builds its launch plans from
`fa2.triton.forward` and `fa2.triton.backward`; the Function validates the call before it gets
here.

The ops take a call's options as flat arguments (custom ops take tensors and scalars only):
`op_options` turns a validated call into them (`OpOptions`), in the order both ops take them.
Where a forward plan takes the Gluon forward (`fa2.triton.gluon_forward`, Hopper's long
sequences by default), `fa2::triton_forward` hands the call to `fa2::gluon_forward`, an opaque
`custom_op` on every device: Inductor generates launchers for Triton kernels, not Gluon ones, so
the compiled graph calls that op as it is. It has the forward's schema and shape function.
Likewise `fa2::triton_backward` hands a backward whose plan takes the Gluon backward
(`fa2.triton.gluon_backward`, Hopper's head dim 128 by default) to `fa2::gluon_backward`.

Each op's schema is inferred from its function's signature, which `_typed` spells from the
tensors' names and `OpOptions`' fields: one list, read by both kinds of op.
"""

from __future__ import annotations

import importlib.util
import inspect
from collections.abc import Callable
from typing import NamedTuple, Optional, get_type_hints

import torch

from fa2.checks import Call
from fa2.layouts import as_bhsd
from fa2.masks import Band
from fa2.triton.configs import INTERPRET

__all__ = [
    "TRACEABLE",
    "OpOptions",
    "backward_op",
    "forward_op",
    "gluon_backward_op",
    "gluon_forward_op",
    "op_options",
]

TRACEABLE = not INTERPRET and importlib.util.find_spec("triton") is not None


class OpOptions(NamedTuple):
    """A validated call's options, the scalars both ops take after their tensors (custom ops
    take tensors and scalars only); ints are SymInts in the schema (the longest sequence may be
    symbolic while torch.compile traces with dynamic shapes)."""

    scale: float
    precision: str
    left: int
    right: int
    bottom_right: bool
    softcap: float
    layout: str
    max_seqlen_q: int
    max_seqlen_k: int
    same_lengths: bool


def op_options(
    call: Call,
    precision: str,
    same_lengths: bool,
    max_seqlen_q: int | None,
    max_seqlen_k: int | None,
) -> OpOptions:
    """A validated call's options as the ops take them, after the tensors."""
    band = call.band
    return OpOptions(
        call.scale, precision, band.left, band.right, band.bottom_right, call.softcap,
        call.layout, max_seqlen_q or 0, max_seqlen_k or 0, same_lengths,
    )  # fmt: skip


def _call(o: OpOptions) -> Call:
    """The validated call an op's options describe."""
    return Call(Band(o.left, o.right, o.bottom_right), o.softcap, o.scale, o.layout)


def _plan(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, options: OpOptions):
    """The forward plan of an op's arguments, built afresh (shapes may be symbolic when traced,
    and tracing happens once); with (cu_seqlens, max_seqlens) for packed sequences."""
    from fa2.triton.forward import ForwardPlan

    o = options
    seq_len = max(o.max_seqlen_q, o.max_seqlen_k) if o.layout == "thd" else None
    return ForwardPlan(q, k, v, _call(o), o.precision, o.same_lengths, TRACEABLE, seq_len)


def _packed(options: OpOptions, cu_q: torch.Tensor | None, cu_k: torch.Tensor | None):
    """(cu_seqlens, max_seqlens) of packed sequences, else (None, None)."""
    if options.layout != "thd":
        return None, None
    return (cu_q, cu_k), (options.max_seqlen_q, options.max_seqlen_k)


def _forward(q, k, v, cu_seqlens_q, cu_seqlens_k, *options):
    op_options = OpOptions(*options)
    plan = _plan(q, k, v, op_options)
    if plan.gluon:  # Inductor launches Triton kernels, not Gluon ones: an opaque op runs it
        return gluon_forward_op(q, k, v, cu_seqlens_q, cu_seqlens_k, *options)
    cu, longest = _packed(op_options, cu_seqlens_q, cu_seqlens_k)
    return plan(q, k, v, op_options.scale, cu, longest, TRACEABLE)


def _eager_plan(op: str, q, k, v, o: OpOptions):
    """The forward plan an opaque op runs from, in the Function's plan cache
    (`forward.forward_plan`) under keys tagged with the op's name; never packed sequences,
    which the Gluon kernels do not take."""
    from fa2.triton.forward import forward_plan

    return forward_plan(
        q, k, v, (op, *o[1:]), None, lambda: (_call(o), o.precision, o.same_lengths)
    )


def _gluon_forward(q, k, v, cu_seqlens_q, cu_seqlens_k, *options):
    """`fa2::gluon_forward`: the forward `fa2::triton_forward` hands over where its plan takes
    the Gluon kernel, run eagerly (`_eager_plan`)."""
    o = OpOptions(*options)
    plan = _eager_plan("fa2::gluon_forward", q, k, v, o)
    return plan(q, k, v, o.scale, None, None, False)


def _forward_fake(q, k, v, cu_seqlens_q, cu_seqlens_k, *options):
    o = torch.empty(q.shape, dtype=q.dtype, device=q.device)
    lse_shape = as_bhsd(q, OpOptions(*options).layout).shape[:-1]
    return o, torch.empty(lse_shape, dtype=torch.float32, device=q.device)


def _backward(q, k, v, o, lse, do, cu_seqlens_q, cu_seqlens_k, *options_and_determinism):
    from fa2.triton.backward import BackwardPlan

    *options, deterministic = options_and_determinism
    options = OpOptions(*options)
    plan = BackwardPlan(_plan(q, k, v, options), q, k, v, o, lse, do, deterministic, TRACEABLE)
    if plan.gluon:  # as in `_forward`: an opaque op runs the Gluon kernel
        return gluon_backward_op(
            q, k, v, o, lse, do, cu_seqlens_q, cu_seqlens_k, *options_and_determinism
        )
    cu, longest = _packed(options, cu_seqlens_q, cu_seqlens_k)
    return plan(q, k, v, o, lse, do, options.scale, cu, longest, TRACEABLE)


def _gluon_backward(q, k, v, o, lse, do, cu_seqlens_q, cu_seqlens_k, *options_and_determinism):
    """`fa2::gluon_backward`: the backward `fa2::triton_backward` hands over where its plan
    takes the Gluon kernel, run eagerly from the plan cache (`_eager_plan`,
    `backward.backward_plan`)."""
    from fa2.triton.backward import backward_plan

    *options, deterministic = options_and_determinism
    options = OpOptions(*options)
    plan = backward_plan(
        _eager_plan("fa2::gluon_backward", q, k, v, options), q, k, v, o, lse, do, deterministic
    )
    return plan(q, k, v, o, lse, do, options.scale, None, None, False)


def _backward_fake(q, k, v, o, lse, do, *options):
    return tuple(torch.empty(t.shape, dtype=t.dtype, device=t.device) for t in (q, k, v))


def _typed(fn: Callable, tensors: str, outputs: int, *, last: tuple[str, ...] = ()) -> Callable:
    """`fn` (which takes its options as `*options`) given the signature its schema spells:
    `tensors` (names; a `?` marks an optional tensor), `OpOptions`' fields, then the bool flags
    `last`. The ops' schemas are inferred from it (torch 2.11's `triton_op` infers its schema
    from the annotations whatever `schema=` says)."""
    kind = inspect.Parameter.POSITIONAL_OR_KEYWORD
    params = [
        inspect.Parameter(
            name.rstrip("?"),
            kind,
            annotation=Optional[torch.Tensor] if "?" in name else torch.Tensor,  # noqa: UP045 (torch's schema inference reads typing.Optional)
        )
        for name in tensors.split()
    ]
    params += [
        inspect.Parameter(n, kind, annotation=t) for n, t in get_type_hints(OpOptions).items()
    ]
    params += [inspect.Parameter(n, kind, annotation=bool) for n in last]
    fn.__signature__ = inspect.Signature(params, return_annotation=tuple[(torch.Tensor,) * outputs])
    return fn


def _define_op(name: str, fn, fake):
    """A `triton_op` where torch.compile can trace into it (`TRACEABLE`), else an opaque
    `custom_op` with a shape function; both infer the schema from `fn`'s signature."""
    if TRACEABLE:
        return torch.library.triton_op(name, fn, mutates_args=())
    op = torch.library.custom_op(name, fn, mutates_args=())
    op.register_fake(fake)
    return op


forward_op = _define_op(
    "fa2::triton_forward",
    _typed(_forward, "q k v cu_seqlens_q? cu_seqlens_k?", 2),
    _forward_fake,
)
# Opaque on every device: where the Gluon forward runs (sm_90), torch.compile calls it as is.
gluon_forward_op = torch.library.custom_op(
    "fa2::gluon_forward",
    _typed(_gluon_forward, "q k v cu_seqlens_q? cu_seqlens_k?", 2),
    mutates_args=(),
)
gluon_forward_op.register_fake(_forward_fake)
_BACKWARD_TENSORS = "q k v o lse do cu_seqlens_q? cu_seqlens_k?"
backward_op = _define_op(
    "fa2::triton_backward",
    _typed(_backward, _BACKWARD_TENSORS, 3, last=("deterministic",)),
    _backward_fake,
)
gluon_backward_op = torch.library.custom_op(  # opaque on every device, as gluon_forward_op
    "fa2::gluon_backward",
    _typed(_gluon_backward, _BACKWARD_TENSORS, 3, last=("deterministic",)),
    mutates_args=(),
)
gluon_backward_op.register_fake(_backward_fake)
