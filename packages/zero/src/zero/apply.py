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
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
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
            module.forward = torch.compile(module.forward, **options)
    return fsdp
