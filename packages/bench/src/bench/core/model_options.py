"""The model options every tool that builds `lmcore.TransformerLM` shares: written once here, read
by bench-model, bench-train and bench-step.

- `--activation-checkpointing SPEC`: lmcore's forms (`none`, `blocks`, `every:K`, `segments:K`,
  `nested`, `nested:K`), parsed by `lmcore.ActivationCheckpointing.parse` (`checkpointing_spec`)
  and applied with `lmcore.apply_activation_checkpointing`.
- `--loss {materialized,fused}`: `lmcore.cross_entropy` of the full logits, or the model's own
  fused LM head + cross-entropy, `model(inputs, targets=targets)`, which never holds the
  `[tokens, vocabulary]` logits.
- `--optimizer {lmcore,lmcore-fused,torch-fused}` (tools with an optimizer): `lmcore.AdamW`'s
  multi-tensor path, `lmcore.AdamW(fused=True)` (one Triton launch per group; float32 moments
  also for bf16 parameters), or `torch.optim.AdamW(fused=True)`.
- `--compile-backend NAME`: the backend `torch.compile` generates code with (`inductor`, what
  runs fast; `aot_eager`, which traces the same graphs, guards and saved tensors without
  generating kernels: a compiled run's behaviour checked cheaply, e.g. on a CPU).
- `--num-kv-heads N`: grouped-query attention (key/value heads shared by query heads).
- `--num-layers N`: the size's depth overridden, a depth-reduced model (`with_depth`).

Each tool declares them as fields of its configuration (`bench.core.options.option`), a value
each or several that multiply, with the vocabulary, help and parsers below. This module imports
no torch, so that the commands offer the options before anything heavy is imported; what they
select is built at run time by `bench.core.model_runtime` (`build_optimizer`, `loss_function`,
`next_token_loss`).

Example::

    @dataclass(frozen=True)
    class ToolConfig:
        loss: tuple[str, ...] = option(("materialized",), HELP["loss"], choices=LOSSES)
        activation_checkpointing: tuple[str, ...] = option(
            ("none",), HELP["activation_checkpointing"], parse=checkpointing_spec)
"""

from __future__ import annotations

import argparse
import dataclasses
from collections.abc import Mapping

import lmcore

__all__ = [
    "CHECKPOINTING_FORMS",
    "COMPILE_BACKENDS",
    "DEFAULT_CHECKPOINTING",
    "DEFAULT_COMPILE_BACKEND",
    "DEFAULT_LOSS",
    "HELP",
    "LOSSES",
    "OPTIMIZERS",
    "checkpointing_spec",
    "positive_int",
    "with_depth",
]

# The optimizers a tool offers, by the name tools and bench-plan share.
OPTIMIZERS = ("lmcore", "lmcore-fused", "torch-fused")
# The next-token losses: the full logits, or lmcore's fused LM head + cross-entropy.
LOSSES = ("materialized", "fused")
CHECKPOINTING_FORMS = lmcore.ActivationCheckpointing.FORMS
# `torch.compile`'s backends a tool offers (torchtitan's `compile.backend`): inductor generates
# the kernels; aot_eager traces the same graphs and partitions forward from backward but runs
# them eagerly (seconds instead of minutes on a CPU: the tests' choice); eager only traces.
COMPILE_BACKENDS = ("inductor", "aot_eager", "eager")
DEFAULT_COMPILE_BACKEND = "inductor"
# What a model gets when the option is not given: nothing recomputed, the full logits (the
# handout's model, as every tool measured it before the options existed).
DEFAULT_CHECKPOINTING = "none"
DEFAULT_LOSS = "materialized"
# One help text per option, for every tool's fields.
HELP: Mapping[str, str] = {
    "activation_checkpointing": (
        "recompute blocks in backward instead of keeping their activations: "
        + ", ".join(CHECKPOINTING_FORMS)
        + " (every:K checkpoints every K-th block, segments:K each run of K blocks, nested a "
        "checkpoint of per-block checkpoints with K ≈ √layers)"
    ),
    "loss": (
        "materialized: cross-entropy of the full logits; fused: lmcore's LM head + "
        "cross-entropy in chunks, never holding the [tokens, vocabulary] logits"
    ),
    "optimizer": (
        "AdamW: lmcore (multi-tensor), lmcore-fused (one Triton launch per group), torch-fused "
        "(torch.optim.AdamW(fused=True)); each keeps its moments in the parameters' dtype (bf16 "
        "for a model stored in bf16, as torch's AdamW does)"
    ),
    "compile_backend": (
        "torch.compile's backend: inductor (generated kernels); aot_eager or eager to check a "
        "compiled run's graphs cheaply"
    ),
    "num_kv_heads": (
        "key/value heads, each shared by num_heads / num_kv_heads query heads (grouped-query "
        "attention; 1: multi-query)"
    ),
    "num_layers": "blocks, overriding the size's (a depth-reduced model)",
}


def checkpointing_spec(text: str) -> str:
    """The activation-checkpointing spec `text` names, written the canonical way.

    The type of `--activation-checkpointing`: `segments: 2` reads as `segments:2`.

    Raises:
        argparse.ArgumentTypeError: not one of lmcore's forms (`CHECKPOINTING_FORMS`); argparse
            shows the message as it is.
    """
    try:
        return str(lmcore.ActivationCheckpointing.parse(text.replace(" ", "")))
    except (TypeError, ValueError) as error:
        raise argparse.ArgumentTypeError(str(error)) from None


def positive_int(text: str) -> int:
    """An integer of at least 1 (the type of `--num-layers`, `--num-kv-heads`, ...).

    Raises:
        argparse.ArgumentTypeError: not a positive integer.
    """
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        raise argparse.ArgumentTypeError(f"{text!r} is not a positive integer")
    return value


def with_depth(size: lmcore.ModelSize, num_layers: int | None) -> lmcore.ModelSize:
    """`size` with `num_layers` blocks (a depth-reduced model); `size` itself when None."""
    return size if num_layers is None else dataclasses.replace(size, num_layers=num_layers)
