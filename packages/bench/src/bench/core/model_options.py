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
- `--num-kv-heads N`: grouped-query attention (key/value heads shared by query heads).
- `--num-layers N`: the size's depth overridden, a depth-reduced model (`with_depth`).

`add_model_options` adds them to an argparse parser (a value each, or several that multiply);
bench-train declares the same options as fields of its `TrainConfig` with the vocabulary, help
and parsers below. This module imports no torch, so that the commands offer the options before
anything heavy is imported; what they select is built at run time by `bench.core.model_runtime`
(`build_optimizer`, `loss_function`, `next_token_loss`).

Example::

    parser = argparse.ArgumentParser()
    add_model_options(parser, several=True, optimizer=True)
    args = parser.parse_args(["--loss", "fused", "--activation-checkpointing", "segments:2"])
    model = lmcore.apply_activation_checkpointing(model, policy=args.activation_checkpointing[0])
    loss = model_runtime.next_token_loss(model, x, y, fused=args.loss[0] == "fused")
"""

from __future__ import annotations

import argparse
import dataclasses
from collections.abc import Mapping

import lmcore

__all__ = [
    "CHECKPOINTING_FORMS",
    "DEFAULT_CHECKPOINTING",
    "DEFAULT_LOSS",
    "HELP",
    "LOSSES",
    "OPTIMIZERS",
    "add_model_options",
    "checkpointing_spec",
    "positive_int",
    "with_depth",
]

# The optimizers a tool offers, by the name tools and bench-plan share.
OPTIMIZERS = ("lmcore", "lmcore-fused", "torch-fused")
# The next-token losses: the full logits, or lmcore's fused LM head + cross-entropy.
LOSSES = ("materialized", "fused")
CHECKPOINTING_FORMS = lmcore.ActivationCheckpointing.FORMS
# What a model gets when the option is not given: nothing recomputed, the full logits (the
# handout's model, as every tool measured it before the options existed).
DEFAULT_CHECKPOINTING = "none"
DEFAULT_LOSS = "materialized"
# One help text per option, for argparse (`add_model_options`) and bench-train's fields.
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
        "AdamW: lmcore (multi-tensor), lmcore-fused (one Triton launch per group, float32 "
        "moments), torch-fused (torch.optim.AdamW(fused=True))"
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
    """An integer of at least 1 (the type of `--num-layers` and `--num-kv-heads`).

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


def add_model_options(
    container: argparse.ArgumentParser | argparse._ArgumentGroup,
    *,
    several: bool,
    optimizer: bool,
    defaults: Mapping[str, str] | None = None,
    num_layers: bool = True,
) -> None:
    """Add `--activation-checkpointing`, `--loss`, `--optimizer` (if `optimizer`),
    `--num-kv-heads` and `--num-layers` (if `num_layers`) to a parser or group.

    Every option's argparse default is None (not given), so that the tool supplies its own.

    Args:
        container: the parser or option group.
        several: the first three take several values (a sweep dimension each; lists), else one.
        optimizer: add `--optimizer` (tools that step an optimizer).
        defaults: each option's default in words, for its help (`{"loss": "fused"}`).
        num_layers: add `--num-layers` (a tool may declare its own, with more to say).
    """
    shown = dict(defaults or {})
    nargs = "+" if several else None

    def text(name: str) -> str:
        return HELP[name] + (f" (default: {shown[name]})" if name in shown else "")

    container.add_argument(
        "--activation-checkpointing",
        type=checkpointing_spec,
        nargs=nargs,
        metavar="SPEC",
        help=text("activation_checkpointing"),
    )
    container.add_argument("--loss", choices=LOSSES, nargs=nargs, help=text("loss"))
    if optimizer:
        container.add_argument(
            "--optimizer", choices=OPTIMIZERS, nargs=nargs, help=text("optimizer")
        )
    container.add_argument(
        "--num-kv-heads", type=positive_int, metavar="N", help=text("num_kv_heads")
    )
    if num_layers:
        container.add_argument(
            "--num-layers", type=positive_int, metavar="N", help=text("num_layers")
        )


def with_depth(size: lmcore.ModelSize, num_layers: int | None) -> lmcore.ModelSize:
    """`size` with `num_layers` blocks (a depth-reduced model); `size` itself when None."""
    return size if num_layers is None else dataclasses.replace(size, num_layers=num_layers)
