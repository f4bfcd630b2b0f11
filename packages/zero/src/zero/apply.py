"""`apply_fsdp`: shard a model with `zero.FSDP` and compile each unit's forward, torchtitan's way.

torchtitan applies parallelism to a model that knows nothing of it, in a fixed order: activation
checkpointing, then `torch.compile` of each block, then FSDP. The order matters for FSDP's hooks:
they gather and free weights, run collectives and keep state between calls, so they must run
outside compiled code, around each block's compiled computation. `torch.compile(model)` would
trace them (and compile the whole model, every block anew: a first step of minutes at 8B);
`block.compile()` compiles the module's call, hooks included. So this compiles each unit's
`forward` alone: the unit's call (its FSDP hooks) stays eager, its computation is one graph,
and units of one class share that graph (dynamo caches compiled code per code object, and with
`inline_inbuilt_nn_modules`, on in every torch this package supports, its guards do not pin the
module instance), so a model of N identical blocks compiles one.

Each unit class is compiled through a frame of its own (`_unit_frame`). `torch.compile` of a
forward dynamo cannot enter directly (torch's own `nn.Embedding.forward`, or the partial that
selective checkpointing installs) wraps it in one shared function of torch's, so every such
unit class shared one code object, and with it dynamo's record of the shapes it was called
with: the embedding's `(batch, seq)` ids and the blocks' `(batch, seq, d_model)` activations
differ in rank, so dynamo recompiled the blocks with a symbolic sequence length ("automatic
dynamic shapes"). fa2 then runs its Triton kernels instead of its Gluon ones on Hopper
(docs/results/step_profile_2xh200_2026-11-28: 1.27x cuDNN's attention time inside the
leaderboard step).
"""

from __future__ import annotations

import types
from collections.abc import Callable, Iterable, Mapping
from typing import Any

import torch
from torch import nn

from zero.fsdp import FSDP
from zero.mixed_precision import MixedPrecision

__all__ = ["COMPILE_OPTIONS", "apply_fsdp"]

# `torch.compile` options for each unit's forward: one graph per unit, or an error naming what
# breaks it (a graph break would split the unit silently, and each piece compile on its own).
COMPILE_OPTIONS: Mapping[str, Any] = {"fullgraph": True}


def apply_fsdp(
    model: nn.Module,
    *,
    units: Iterable[type[nn.Module]],
    mixed_precision: MixedPrecision | None = None,
    compile: bool = False,
    compile_options: Mapping[str, Any] | None = None,
    prefetch: bool = True,
) -> FSDP:
    """Shard `model` with `zero.FSDP` (a unit per instance of `units`) and compile each unit.

    Apply activation checkpointing first (`lmcore.apply_activation_checkpointing`): its
    checkpoints wrap the units' calls, so a recomputation runs the compiled forward again
    under FSDP's hooks, which gather the unit's weights for it.

    Args:
        model: the uncompiled model, the same on every rank (see `zero.FSDP`).
        units: the module classes that form units; for an `lmcore.TransformerLM`,
            `(TransformerBlock, Embedding, LMHead)`: the blocks one all-gather each, and the
            embedding and the head gathered only around their own forward and backward instead
            of from the start of the forward to the end of the backward in the root.
        mixed_precision: storage, compute, reduce and output dtypes (`zero.MixedPrecision`);
            None: the model's own dtype throughout.
        compile: `torch.compile` each unit's `forward` (not the root's), after wrapping.
        compile_options: options for `torch.compile`; None: `COMPILE_OPTIONS` (one graph per
            unit). Pass e.g. `{"backend": "aot_eager"}` to trace without generating kernels.
        prefetch: issue the next unit's all-gather one unit ahead (see `zero.FSDP`).

    Returns:
        The `zero.FSDP` wrapper (call it, build the optimizer on its parameters).

    Raises:
        ValueError: `compile_options` without `compile`, or whatever `zero.FSDP` refuses (a
            model already compiled as a whole among them).

    Example::

        >>> model = TransformerLM.from_size("xl", context_length=2048, attention="fa2-triton")
        >>> lmcore.apply_activation_checkpointing(model, policy="blocks")
        >>> fsdp = zero.apply_fsdp(
        ...     model.cuda().bfloat16(),
        ...     units=(TransformerBlock, Embedding, LMHead),
        ...     mixed_precision=zero.MixedPrecision(reduce_dtype=torch.float32),
        ...     compile=True,
        ... )
        >>> optimizer = lmcore.AdamW(fsdp.parameters(), fused=True, moment_dtype=torch.bfloat16)
    """
    if compile_options is not None and not compile:
        raise ValueError("compile_options are torch.compile's: pass compile=True with them")
    fsdp = FSDP(model, mixed_precision=mixed_precision, units=units, prefetch=prefetch)
    if compile:
        options = dict(COMPILE_OPTIONS if compile_options is None else compile_options)
        for module in fsdp.unit_modules:
            # An instance attribute: the module's call (its hooks) stays eager and calls it.
            module.forward = torch.compile(_unit_frame(module), **options)
    return fsdp


# One code object per unit class (`_unit_frame`); kept for the process, as a method's is, so
# that the models of one process share their compiled units as they would share methods.
_UNIT_CODES: dict[type, types.CodeType] = {}


def _forwarding(forward: Callable[..., Any]) -> Callable[..., Any]:
    def unit_forward(*args: Any, **kwargs: Any) -> Any:
        return forward(*args, **kwargs)

    return unit_forward


def _unit_frame(module: nn.Module) -> Callable[..., Any]:
    """`module.forward`, called from a function whose code object is its class's own.

    Dynamo keeps compiled code, guards and the history of input shapes per code object. This
    gives each unit class one (the instances' functions differ only in the forward they call,
    which the guards do not pin), so that the classes' shapes never mix and identical units
    still share one graph."""
    forward = _forwarding(module.forward)
    cls = type(module)
    code = _UNIT_CODES.get(cls)
    if code is None:
        name = f"{cls.__name__}_unit_forward"
        code = _UNIT_CODES[cls] = forward.__code__.replace(co_name=name, co_qualname=name)
    return types.FunctionType(code, forward.__globals__, code.co_name, None, forward.__closure__)
