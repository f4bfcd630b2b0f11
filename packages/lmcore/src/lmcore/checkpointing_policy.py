"""Activation checkpointing policies: which runs of blocks are recomputed in the backward pass
instead of keeping their activations, and the peak memory each leaves. Plain Python (no torch),
so that a command line can parse a policy before anything heavy is imported;
`lmcore.activation_checkpointing` applies one to a model.

A policy is written as a spec string, parsed in one place (`ActivationCheckpointing.parse`):

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
`selective`     `blocks`, but each block's attention output (and its logsumexp) is kept, so
                backward recomputes the block without attention's forward (torchtitan's
                op-level selective checkpointing, for attention alone): fused attention
                only (SDPA, fa2); with other backends it recomputes as `blocks` does
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
- `selective`: as `blocks` with `b` grown by what each block keeps (`kept_bytes`: its
  attention output and logsumexp), `(N − 1)·(b + kept) + A`, for the same recomputation less
  attention's forward, the most expensive part of a block at long context.

`peak_activation_bytes` evaluates these formulas for any policy (and
`memory_optimal_segment_size` minimises them); `lmcore.saved_activation_bytes` measures `A` and
`b` for a real block. The design note `docs/design/lmcore.md` works the handout's example
through.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import ClassVar, Union

__all__ = [
    "SELECTIVE_KEEPS",
    "SPEC_FORMS",
    "ActivationCheckpointing",
    "Plan",
    "memory_optimal_segment_size",
    "peak_activation_bytes",
]

# The forms a spec string takes, for help texts and error messages.
SPEC_FORMS = ("none", "blocks", "every:K", "segments:K", "nested", "nested:K", "selective")
_MODES = ("none", "blocks", "every", "segments", "nested", "selective")
_MODES_WITH_K = ("every", "segments", "nested")
# The attention backends whose output `selective` keeps: their kernels are the ops
# `lmcore.KEPT_ATTENTION_OPS` names. Others' attention is recomputed, as under `blocks`.
SELECTIVE_KEEPS = frozenset({"sdpa", "fa2-triton"})

# A plan: block indices run as they are, tuples are checkpoints around what they hold.
Plan = tuple[Union[int, "Plan"], ...]


@dataclass(frozen=True)
class ActivationCheckpointing:
    """Which blocks are recomputed in backward: a parsed spec string (see the module docstring).

    Attributes:
        mode: `none`, `blocks`, `every`, `segments`, `nested` or `selective`.
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

    @property
    def keeps_attention(self) -> bool:
        """Whether each checkpoint keeps its block's attention output (`selective`)."""
        return self.mode == "selective"

    def plan(self, num_blocks: int) -> Plan:
        """The nesting of checkpoints over `num_blocks` blocks (tuples are checkpoints;
        `selective`'s are `blocks`' own)."""
        if self.mode == "none":
            return tuple(range(num_blocks))
        if self.mode in ("blocks", "selective"):
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
    policy: str | ActivationCheckpointing,
    num_blocks: int,
    *,
    input_bytes: int,
    saved_bytes: int,
    kept_bytes: int = 0,
) -> int:
    """The peak activation memory of backward through `num_blocks` blocks under `policy`.

    The model of the handout's problem (see the module docstring): each block saves
    `saved_bytes` for backward (its input included), each checkpoint keeps its input of
    `input_bytes` (and under `selective` the `kept_bytes` of its attention output and
    logsumexp, which `saved_bytes` includes too), and the backward of a checkpoint holds what
    the checkpoints before it keep plus what it recomputes. Everything else (weights,
    gradients, the tensors outside the blocks) is left out.

    Raises:
        ValueError: a bad spec, `num_blocks` not positive, or `kept_bytes` negative.
    """
    if num_blocks < 1:
        raise ValueError(f"num_blocks must be positive, got {num_blocks}")
    if kept_bytes < 0:
        raise ValueError(f"kept_bytes must not be negative, got {kept_bytes}")
    parsed = ActivationCheckpointing.parse(policy)
    if parsed.keeps_attention:
        input_bytes += kept_bytes
    return _peak(parsed.plan(num_blocks), input_bytes=input_bytes, saved_bytes=saved_bytes)


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
