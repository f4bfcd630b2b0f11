"""Activation checkpointing applied to a `TransformerLM` from outside (the model knows nothing).

A policy (`ActivationCheckpointing`, parsed from a spec string such as `segments:2` or `nested`;
`lmcore.checkpointing_policy` lists the forms and models their memory) says which runs of
blocks are recomputed in the backward pass instead of keeping their activations.
`apply_activation_checkpointing` puts a model's blocks under the policy's checkpoints
(`CheckpointedBlockStack`), and `saved_activation_bytes` measures what a block saves for
backward (the `A` and `b` of the memory model), with the handout's `saved_tensors_hooks`; on
the meta device it needs no memory at all.

`selective` checkpoints each block inside its own `forward` (`checkpoint_keeping_attention`),
with torch's selective checkpointing keeping the outputs of the attention ops in
`KEPT_ATTENTION_OPS`. Inside `forward`, the checkpoint is inside what `block.compile()` (or
`zero.apply_fsdp`'s per-unit compile) compiles, which is where torch.compile honours the
policy; a checkpoint around the compiled call would recompute attention anyway.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import torch
from torch import nn
from torch.utils.checkpoint import (
    CheckpointPolicy,
    checkpoint,
    create_selective_checkpoint_contexts,
)

from lmcore.checkpointing_policy import ActivationCheckpointing, Plan
from lmcore.model import BlockStack

if TYPE_CHECKING:
    from lmcore.documents import Documents
    from lmcore.kv_cache import KVCache

__all__ = [
    "KEPT_ATTENTION_OPS",
    "CheckpointedBlockStack",
    "apply_activation_checkpointing",
    "checkpoint_keeping_attention",
    "saved_activation_bytes",
]

# The ops whose outputs `selective` keeps: SDPA's fused kernels (the backend the `sdpa` backend
# dispatches to on each device) and fa2's forward (the `fa2-triton` backend: its custom op under
# torch.compile or a dispatch mode, and the Gluon forward's, which it hands over to on Hopper).
# Their outputs are the attention output and its
# logsumexp, which their backward reads; everything else in the block is recomputed.
KEPT_ATTENTION_OPS = frozenset(
    {
        "aten::_scaled_dot_product_flash_attention",
        "aten::_scaled_dot_product_cudnn_attention",
        "aten::_scaled_dot_product_efficient_attention",
        "aten::_scaled_dot_product_flash_attention_for_cpu",
        "fa2::triton_forward",
        "fa2::gluon_forward",
    }
)


def _keep_attention(ctx: Any, func: Any, *args: Any, **kwargs: Any) -> CheckpointPolicy:
    """Selective checkpointing's policy: keep what the attention ops return, recompute the
    rest."""
    name = func.name() if isinstance(func, torch._ops.OpOverload) else None
    if name in KEPT_ATTENTION_OPS:
        return CheckpointPolicy.MUST_SAVE
    return CheckpointPolicy.PREFER_RECOMPUTE


_KEEP_ATTENTION_CONTEXTS = functools.partial(create_selective_checkpoint_contexts, _keep_attention)


def checkpoint_keeping_attention(
    function: Callable[..., torch.Tensor], *args: Any, **kwargs: Any
) -> torch.Tensor:
    """`function(*args, **kwargs)` under a non-reentrant checkpoint that keeps the outputs of
    the attention ops (`KEPT_ATTENTION_OPS`) and recomputes everything else in backward.

    Under torch.compile the checkpoint must be inside the compiled code (compile the caller):
    the compiler then saves those ops' outputs for backward and recomputes the rest.
    """
    return checkpoint(
        function, *args, use_reentrant=False, context_fn=_KEEP_ATTENTION_CONTEXTS, **kwargs
    )


def _selective_forward(
    self: nn.Module,
    x: torch.Tensor,
    *,
    kv_cache: Any = None,
    documents: Documents | None = None,
) -> torch.Tensor:
    """A block's `forward` under `selective` (each block's `forward` is a partial of it over
    the block: compiling the block compiles the checkpoint with it, identical blocks share one
    graph, and a pickled model loads). Decoding and no-grad forwards run the block as it is."""
    forward = type(self).forward
    if kv_cache is not None or not torch.is_grad_enabled():
        return forward(self, x, kv_cache=kv_cache, documents=documents)
    return checkpoint_keeping_attention(forward, self, x, documents=documents)


def saved_activation_bytes(module: Callable[..., Any], *inputs: Any) -> int:
    """Bytes autograd saves for backward when `module(*inputs)` runs (the handout's measure).

    Every tensor autograd packs during the call is counted once per storage (a tensor saved by
    two operations, or views of one buffer, count once), except storages of the module's own
    parameters and buffers (the RoPE tables): those live anyway, as the handout's hook leaves
    out `nn.Parameter`s. Run it on the meta device to measure a block of any size without
    memory::

        >>> with torch.device("meta"):
        ...     block = TransformerLM.from_size("xl", context_length=2048).layers[0]
        ...     x = torch.empty(4, 2048, 2560, requires_grad=True)
        >>> saved_activation_bytes(block, x)  # A, one block's saved bytes

    Returns:
        The bytes; the output is dropped (so is the graph) before returning.
    """
    kept = [*module.parameters(), *module.buffers()] if isinstance(module, nn.Module) else []
    skip = {t.untyped_storage()._cdata for t in kept}
    seen: dict[int, int] = {}

    def pack(t: torch.Tensor) -> torch.Tensor:
        storage = t.untyped_storage()
        if storage._cdata not in skip:
            seen[storage._cdata] = storage.nbytes()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        module(*inputs)
    return sum(seen.values())


class CheckpointedBlockStack(BlockStack):
    """A `BlockStack` whose forward runs the blocks under the checkpoints of a policy.

    It holds the same block modules under the same indices, so parameter names and state-dict
    keys (`layers.i.…`) are unchanged and `layers[i]` is still the block. Checkpoints are
    torch's non-reentrant `torch.utils.checkpoint.checkpoint`, nested for `nested`: each saves
    only its input and runs its blocks' forward again when backward reaches them. Under
    `selective` each block checkpoints itself (its `forward` is replaced by one that calls
    `checkpoint_keeping_attention`), and the stack runs the blocks as they are.

    Args:
        blocks: the blocks (taken over, not copied).
        policy: the policy or its spec string.
    """

    def __init__(self, blocks: BlockStack, policy: str | ActivationCheckpointing) -> None:
        super().__init__(list(blocks))
        self.policy = ActivationCheckpointing.parse(policy)
        if self.policy.keeps_attention:
            for block in self:
                # a partial, not a bound method: a whole model pickles and loads with it
                block.forward = functools.partial(_selective_forward, block)
            self.plan: Plan = tuple(range(len(self)))
        else:
            self.plan = self.policy.plan(len(blocks))

    def forward(
        self,
        x: torch.Tensor,
        *,
        kv_cache: KVCache | None = None,
        documents: Documents | None = None,
    ) -> torch.Tensor:
        """Run the blocks on `x` `(batch, seq, d_model)` (with `documents` of packed rows)
        through the policy's checkpoints; with a `kv_cache` (decoding, nothing kept for
        backward) as a plain `BlockStack`."""
        if kv_cache is not None:
            return super().forward(x, kv_cache=kv_cache)
        return self._run(self.plan, x, documents)

    def _run(self, plan: Plan, x: torch.Tensor, documents: Documents | None) -> torch.Tensor:
        for item in plan:
            if isinstance(item, int):
                x = self[item](x) if documents is None else self[item](x, documents=documents)
            else:
                x = checkpoint(self._run, item, x, documents, use_reentrant=False)
        return x

    def extra_repr(self) -> str:
        return f"policy={self.policy}"


def apply_activation_checkpointing(
    model: nn.Module,
    *,
    policy: str | ActivationCheckpointing = "blocks",
    every: int | None = None,
) -> nn.Module:
    """Recompute blocks' activations in the backward pass instead of storing them.

    Replaces `model.layers` (a `BlockStack`, as `TransformerLM` has) with a
    `CheckpointedBlockStack` over the same blocks. Parameters, their names and state-dict keys
    are unchanged, so checkpoints load with or without it. Checkpoints are non-reentrant; the
    result composes with `torch.compile` (apply this first), the `ddp` wrappers, `zero.FSDP`
    (which gathers a recomputed unit's weights again and frees them after) and torch's FSDP.

    Args:
        model: the model to modify (in place); it must have a `layers` `BlockStack`.
        policy: a spec string (`none`, `blocks`, `every:K`, `segments:K`, `nested`,
            `nested:K`, `selective`; see `lmcore.checkpointing_policy`) or a parsed
            `ActivationCheckpointing`. Under `selective` the blocks' `forward` is replaced
            (an instance attribute; the class is untouched).
        every: `every=K` is `policy="every:K"` (the earlier signature); not with `policy`.

    Returns:
        The same model, for chaining.

    Raises:
        ValueError: a bad spec, or both `policy` (other than the default) and `every`.
        TypeError: `model.layers` is not a `BlockStack`.
        RuntimeError: the model's blocks are already checkpointed.

    Example::

        >>> model = TransformerLM.from_size("xl", context_length=2048)
        >>> apply_activation_checkpointing(model, policy="segments:2")
        >>> loss = model(x, targets=y)  # blocks 2j, 2j+1 recomputed together in backward
    """
    if every is not None:
        if policy != "blocks":
            raise ValueError("pass either policy= or every=, not both")
        if isinstance(every, bool) or not isinstance(every, int) or every < 1:
            raise ValueError(f"every must be a positive integer, got {every!r}")
        policy = ActivationCheckpointing("every", every)
    parsed = ActivationCheckpointing.parse(policy)
    layers = getattr(model, "layers", None)
    if isinstance(layers, CheckpointedBlockStack):
        raise RuntimeError("activation checkpointing is already applied to this model")
    if not isinstance(layers, BlockStack):
        raise TypeError(
            "apply_activation_checkpointing needs a model whose `layers` is an "
            f"lmcore.BlockStack (as TransformerLM's), got {type(layers).__name__}"
        )
    if parsed.mode != "none":
        model.layers = CheckpointedBlockStack(layers, parsed)
    return model
