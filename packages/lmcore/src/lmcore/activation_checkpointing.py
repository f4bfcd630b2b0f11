"""Activation checkpointing applied to a `TransformerLM` from outside (the model knows nothing)."""

from __future__ import annotations

from torch import nn

from lmcore.model import TransformerLM

__all__ = ["apply_activation_checkpointing"]


def apply_activation_checkpointing(model: TransformerLM, *, every: int = 1) -> TransformerLM:
    """Recompute every `every`-th block's activations in the backward pass instead of storing them.

    Blocks `every − 1, 2·every − 1, …` are wrapped in place with non-reentrant
    `torch.utils.checkpoint` (through torch's `checkpoint_wrapper`, as torchtitan does): their
    forward keeps only the block's input, and backward runs the block's forward again. `every=1`
    checkpoints every block (least memory, about one extra forward of compute); larger values
    trade memory back for speed. Parameters, gradients and state-dict keys are unchanged, so
    checkpoints load with or without it (names from `named_parameters()` of a wrapped block
    gain a `_checkpoint_wrapped_module.` segment). Apply it before `torch.compile`.

    Args:
        model: the model to modify (in place).
        every: checkpoint one block in this many.

    Returns:
        The same model, for chaining.

    Raises:
        ValueError: `every` is not a positive integer.
        RuntimeError: the model's blocks are already wrapped.

    Example::

        >>> model = apply_activation_checkpointing(TransformerLM.from_size("xl", ...), every=2)
    """
    # Imported here, not at the top: torch builds without distributed support lack this module,
    # and lmcore must import on them.
    from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import (
        CheckpointImpl,
        CheckpointWrapper,
        checkpoint_wrapper,
    )

    if isinstance(every, bool) or not isinstance(every, int) or every < 1:
        raise ValueError(f"every must be a positive integer, got {every!r}")
    layers: nn.ModuleList = model.layers
    if any(isinstance(layer, CheckpointWrapper) for layer in layers):
        raise RuntimeError("activation checkpointing is already applied to this model")
    for index in range(every - 1, len(layers), every):
        layers[index] = checkpoint_wrapper(
            layers[index], checkpoint_impl=CheckpointImpl.NO_REENTRANT
        )
    return model
