"""Activation checkpointing applied to a `TransformerLM` from outside (the model knows nothing).

A policy says which runs of blocks are recomputed in the backward pass instead of keeping
their activations. It is written as a spec string, parsed in one place
(`ActivationCheckpointing.parse`):

==============  ==========================================================================
`none`          nothing is recomputed
`blocks`        one checkpoint around every block (the same as `segments:1` and `every:1`)
`every:K`       one checkpoint around every K-th block (blocks K−1, 2K−1, …); the others keep
                their activations
`segments:K`    one checkpoint around each run of K consecutive blocks (the handout's
                `two_blocks` example is `segments:2`)
`nested:K`      a checkpoint around each run of K blocks, holding one checkpoint per block
                (a checkpoint of checkpoints)
`nested`        `nested:K` with the K of least peak memory, about √N for N blocks
==============  ==========================================================================

Memory, in the handout's model (its §3.2 problem `gradient_checkpointing`): let `A` be the
bytes one block saves for backward and `b` the bytes of one block's input (the residual stream;
`A` includes it). Backward of the j-th checkpoint (counted from the first) holds the j − 1
inputs of the checkpoints before it plus whatever that checkpoint recomputes:

- `none`: `N·A`;
- `segments:k` (segments of sizes `s_j`): `max_j ((j − 1)·b + s_j·A)` ≈ `(N/k)·b + k·A`, least
  at `k* = √(N·b / A)`: the checkpoints' inputs grow as k shrinks, the recomputed segment as
  it grows. `memory_optimal_segment_size` finds the best integer k exactly. Every k
  recomputes each block once (one extra forward pass in all).
- `nested:K`: `max_j ((j − 1) + (s_j − 1))·b + A` ≈ `(N/K + K)·b + A`, least at `K ≈ √N`:
  O(√N) checkpoint inputs and one block's activations, for a second recomputation (two extra
  forward passes). Deeper nesting (halving the range at each level) would hold O(log N) inputs
  for O(log N) extra forward passes.

`peak_activation_bytes` evaluates these formulas for any policy, and `saved_activation_bytes`
measures `A` and `b` for a real block (with the handout's `saved_tensors_hooks`; on the meta
device it needs no memory at all). The design note `docs/design/lmcore.md` works the handout's
example through.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, ClassVar, Union

import torch
from torch import nn
from torch.utils.checkpoint import checkpoint

from lmcore.model import BlockStack

__all__ = [
    "ActivationCheckpointing",
    "CheckpointedBlockStack",
    "apply_activation_checkpointing",
    "memory_optimal_segment_size",
    "peak_activation_bytes",
    "saved_activation_bytes",
]

# The forms a spec string takes, for help texts and error messages.
SPEC_FORMS = ("none", "blocks", "every:K", "segments:K", "nested", "nested:K")
_MODES = ("none", "blocks", "every", "segments", "nested")
_MODES_WITH_K = ("every", "segments", "nested")

# A plan: block indices run as they are, tuples are checkpoints around what they hold.
Plan = tuple[Union[int, "Plan"], ...]


@dataclass(frozen=True)
class ActivationCheckpointing:
    """Which blocks are recomputed in backward: a parsed spec string (see the module docstring).

    Attributes:
        mode: `none`, `blocks`, `every`, `segments` or `nested`.
        k: K of `every:K`, `segments:K` and `nested:K`; None for the other modes and for
            `nested` (chosen from the number of blocks).

    Example::

        >>> ActivationCheckpointing.parse("segments:2").plan(5)
        ((0, 1), (2, 3), (4,))
        >>> str(ActivationCheckpointing.parse("nested"))
        'nested'
    """

    mode: str
    k: int | None = None

    FORMS: ClassVar[tuple[str, ...]] = SPEC_FORMS  # for a tool's --help

    def __post_init__(self) -> None:
        if self.mode not in _MODES:
            raise ValueError(
                f"unknown activation checkpointing mode {self.mode!r}; the spec is one of "
                f"{', '.join(SPEC_FORMS)}"
            )
        if self.k is not None and (
            self.mode not in _MODES_WITH_K
            or isinstance(self.k, bool)
            or not isinstance(self.k, int)
            or self.k < 1
        ):
            raise ValueError(
                f"K must be a positive integer, and only every:K, segments:K and nested:K take "
                f"one; got mode {self.mode!r} with K={self.k!r}"
            )
        if self.k is None and self.mode in ("every", "segments"):
            raise ValueError(f"{self.mode}:K needs K, e.g. {self.mode}:2")

    @classmethod
    def parse(cls, spec: str | ActivationCheckpointing) -> ActivationCheckpointing:
        """The policy a spec string names (a policy passes through unchanged).

        Raises:
            ValueError: the string is not one of the forms in `SPEC_FORMS`, or K is not a
                positive integer.
        """
        if isinstance(spec, ActivationCheckpointing):
            return spec
        if not isinstance(spec, str):
            raise TypeError(f"an activation checkpointing spec is a string, got {spec!r}")
        mode, colon, k = spec.strip().partition(":")
        if not colon:
            return cls(mode)
        if not k.isdigit():
            raise ValueError(
                f"activation checkpointing spec {spec!r}: K must be a positive integer; the "
                f"spec is one of {', '.join(SPEC_FORMS)}"
            )
        return cls(mode, int(k))

    def __str__(self) -> str:
        return self.mode if self.k is None else f"{self.mode}:{self.k}"

    def nested_segment_size(self, num_blocks: int) -> int:
        """K of the outer segments of `nested`: its own K, or the one whose backward holds the
        fewest checkpoint inputs at once (of those, the nearest to √N)."""
        if self.k is not None:
            return self.k
        return min(
            range(1, num_blocks + 1),
            key=lambda k: (
                _peak(_nested_plan(num_blocks, k), input_bytes=1, saved_bytes=0),
                abs(k - math.sqrt(num_blocks)),
            ),
        )

    def plan(self, num_blocks: int) -> Plan:
        """The nesting of checkpoints over `num_blocks` blocks (tuples are checkpoints)."""
        if self.mode == "none":
            return tuple(range(num_blocks))
        if self.mode == "blocks":
            return _segments_plan(num_blocks, 1)
        if self.mode == "every":
            assert self.k is not None
            return tuple((i,) if i % self.k == self.k - 1 else i for i in range(num_blocks))
        if self.mode == "segments":
            assert self.k is not None
            return _segments_plan(num_blocks, self.k)
        return _nested_plan(num_blocks, self.nested_segment_size(num_blocks))


def _segments_plan(num_blocks: int, k: int) -> Plan:
    return tuple(tuple(range(s, min(s + k, num_blocks))) for s in range(0, num_blocks, k))


def _nested_plan(num_blocks: int, k: int) -> Plan:
    return tuple(tuple((i,) for i in segment) for segment in _segments_plan(num_blocks, k))


def _peak(plan: Plan, *, input_bytes: int, saved_bytes: int) -> int:
    """Peak activation bytes of backward through `plan` (the model in the module docstring)."""
    held = 0  # what the items before this one keep until their own backward
    peak = 0
    for item in plan:
        inner = (
            saved_bytes
            if isinstance(item, int)
            else _peak(item, input_bytes=input_bytes, saved_bytes=saved_bytes)
        )
        peak = max(peak, held + inner)
        held += saved_bytes if isinstance(item, int) else input_bytes
    return peak


def peak_activation_bytes(
    policy: str | ActivationCheckpointing, num_blocks: int, *, input_bytes: int, saved_bytes: int
) -> int:
    """The peak activation memory of backward through `num_blocks` blocks under `policy`.

    The model of the handout's problem (see the module docstring): each block saves
    `saved_bytes` for backward (its input included), each checkpoint keeps its input of
    `input_bytes`, and the backward of a checkpoint holds the inputs of the checkpoints before
    it plus what it recomputes. Everything else (weights, gradients, the tensors outside the
    blocks) is left out.

    Raises:
        ValueError: a bad spec, or `num_blocks` not positive.
    """
    if num_blocks < 1:
        raise ValueError(f"num_blocks must be positive, got {num_blocks}")
    plan = ActivationCheckpointing.parse(policy).plan(num_blocks)
    return _peak(plan, input_bytes=input_bytes, saved_bytes=saved_bytes)


def memory_optimal_segment_size(num_blocks: int, *, input_bytes: int, saved_bytes: int) -> int:
    """The K of `segments:K` with the least peak activation memory (`peak_activation_bytes`).

    The continuous optimum is `√(num_blocks · input_bytes / saved_bytes)`; this compares every
    integer K, so a shorter last segment is accounted for, and among Ks of equal peak (the peak
    is flat near its minimum) takes the one nearest that optimum.

    Example (the handout's §3.2 figures for `xl`, 32 blocks, batch 4, context 2048, float32:
    3,651.31 MiB saved per compiled block, 80 MiB per checkpoint input)::

        >>> memory_optimal_segment_size(
        ...     32, input_bytes=80 * 2**20, saved_bytes=int(3651.31 * 2**20)
        ... )
        1

    Raises:
        ValueError: `num_blocks` not positive, or the byte counts not positive.
    """
    if num_blocks < 1 or input_bytes <= 0 or saved_bytes <= 0:
        raise ValueError(
            "num_blocks, input_bytes and saved_bytes must be positive, got "
            f"{num_blocks}, {input_bytes}, {saved_bytes}"
        )
    optimum = math.sqrt(num_blocks * input_bytes / saved_bytes)
    return min(
        range(1, num_blocks + 1),
        key=lambda k: (
            peak_activation_bytes(
                ActivationCheckpointing("segments", k),
                num_blocks,
                input_bytes=input_bytes,
                saved_bytes=saved_bytes,
            ),
            abs(k - optimum),
        ),
    )


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
    only its input and runs its blocks' forward again when backward reaches them.

    Args:
        blocks: the blocks (taken over, not copied).
        policy: the policy or its spec string.
    """

    def __init__(self, blocks: BlockStack, policy: str | ActivationCheckpointing) -> None:
        super().__init__(list(blocks))
        self.policy = ActivationCheckpointing.parse(policy)
        self.plan = self.policy.plan(len(blocks))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Run the blocks on `x` `(batch, seq, d_model)` through the policy's checkpoints."""
        return self._run(self.plan, x)

    def _run(self, plan: Plan, x: torch.Tensor) -> torch.Tensor:
        for item in plan:
            if isinstance(item, int):
                x = self[item](x)
            else:
                x = checkpoint(self._run, item, x, use_reentrant=False)
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
            `nested:K`; see the module docstring) or a parsed `ActivationCheckpointing`.
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
