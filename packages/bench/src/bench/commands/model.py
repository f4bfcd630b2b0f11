"""bench-model: end-to-end timing of `lmcore.TransformerLM` (the handout's §1.1.3 to §1.1.6).

A model of a named size (Table 1: small … 2.7B) or of explicit dimensions, random weights, a
random batch (default 4 sequences, vocabulary 10,000), run in one or more modes:

- `forward`: the forward pass alone, under `torch.no_grad()` (inference).
- `forward-backward`: forward with the cross-entropy loss, then backward.
- `train-step`: forward, backward and an `lmcore.AdamW` step.

Each configuration gets `--warmup` untimed steps and `--steps` timed ones; the device is
synchronised around every timed region (forward, backward, optimizer), so each is timed on its
own and a step is their sum. Reported: mean ± std per region and per step, the first timed step,
tokens per second, peak memory (CUDA), and MFU where the device's peak is known (the assumed peak
is in the notes; FLOPs from `lmcore.forward_flops` / `training_flops`).

Options multiply: several `--size`, `--context-length`, `--mode`, `--precision` (fp32, or
bf16-autocast), `--attention`, `--compile both`, `--activation-checkpointing` (lmcore's forms: none,
blocks, every:K, segments:K, nested, nested:K), `--loss` (materialized or fused: lmcore's LM head +
cross-entropy without the logits) and `--optimizer` (lmcore, lmcore-fused, torch-fused; the
train step's AdamW) run every combination (the loss only in the training modes, the optimizer
only in the train step). `--num-layers N` overrides the sizes' depth (a depth-reduced model) and
`--num-kv-heads N` gives grouped-query attention; the vocabulary is the size's own (10,000, or
the leaderboard model's 151,936) unless `--vocab-size` says otherwise. `--nvtx` marks warm-up,
steps, forward/backward/optimizer and, inside attention, scores/softmax/output for Nsight
Systems. `--memory-snapshot PATH` records the allocator's history over the timed steps and writes
the pickle (for pytorch.org/memory_viz) and a PNG timeline made here. `--profile DIR` runs the
timed steps under `torch.profiler` and writes, per configuration, a Chrome/Perfetto trace
(`<configuration>.pt.trace.json`) and kernel tables (`<configuration>_kernels.md`), plus
`DIR/<DIR name>.json`, a run of tool `profile` that bench-report reads: CUDA kernels only (CPU
operators without a GPU), ranked by total time per phase (forward, backward, optimizer, whole
step) with the share of matmuls, softmax, elementwise kernels and the optimizer, and the
`record_function` ranges reported separately, as ranges: softmax against the two matmuls inside
naive attention comes from the same profile (see `bench.tools.model.profile`).
`--warmup-study` re-runs the configuration in fresh processes with 0, 1, 2 and 5 warm-up steps.
`--study residuals` measures what one TransformerBlock of each size saves for backward (the
handout's §2.1.6 (f) and §3.1): the bytes by operation, the five largest with their share, with
and without activation checkpointing, and the gradient bytes the block produces in backward
(`bench.tools.model.residuals`; no GPU or Nsight needed). Examples::

    bench-model --size small --context-length 128 256 --mode forward train-step \\
        --precision fp32 bf16-autocast
    bench-model --size xl --context-length 128 2048 --mode forward train-step --warmup 1 \\
        --steps 1 --memory-snapshot memory.pickle
    bench-model --size small --context-length 256 --mode forward train-step --profile profile
    bench-model --size xl --context-length 128 2048 --precision fp32 bf16-autocast \\
        --study residuals
    bench-model --size xl --context-length 2048 --batch 4 --precision bf16-autocast \\
        --mode train-step \\
        --attention fa2-triton --activation-checkpointing none blocks segments:2 nested \\
        --loss fused --optimizer lmcore-fused
    bench-model --size leaderboard-8b --num-layers 4 --context-length 8192 --batch 1 \\
        --precision bf16-autocast --attention fa2-triton --mode forward-backward \\
        --loss materialized fused

Without a GPU a tiny model runs on the CPU by default (and says so).
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bench.core.cli import Command
from bench.core.layouts import parse_name
from bench.core.model_options import (
    DEFAULT_CHECKPOINTING,
    DEFAULT_LOSS,
    HELP,
    LOSSES,
    OPTIMIZERS,
    checkpointing_spec,
    positive_int,
)
from bench.core.options import Group, option
from bench.core.shapes import CPU_SIZE, Shape, shape_named
from lmcore import (
    DEFAULT_ATTENTION,
    HANDOUT_SIZES,
    MODEL_SIZES,
    ActivationCheckpointing,
    ModelSize,
    attention_names,
)

__all__ = [
    "COMMAND",
    "MODES",
    "PRECISIONS",
    "STUDIES",
    "WARMUP_STUDY",
    "ModelBenchConfig",
    "add_options",
    "main",
    "shapes_given",
]

MODES = ("forward", "forward-backward", "train-step")
# float32 throughout, or float32 weights with the forward and loss under bf16 autocast
# (`bench.core.layouts` says what each keeps).
PRECISIONS = ("fp32", "bf16-autocast")
WARMUP_STUDY = (0, 1, 2, 5)  # the handout's §2.1.3 (c)
STUDIES = ("residuals",)
# `--compile`: eager, compiled, or both (a row each).
COMPILE = {"off": (False,), "on": (True,), "both": (False, True)}

MODEL = Group("model")
RUN = Group("run")
PROFILING = Group("profiling")


def _shape(text: str) -> Shape:
    """A `--size` value: a size of `lmcore.MODEL_SIZES` under its own name."""
    try:
        return shape_named(text)
    except ValueError as error:
        raise argparse.ArgumentTypeError(str(error)) from None


def _compile(text: str) -> tuple[bool, ...]:
    """A `--compile` value: off, on or both."""
    if text not in COMPILE:
        raise argparse.ArgumentTypeError(f"{text!r}: choose off, on or both")
    return COMPILE[text]


@dataclass(frozen=True)
class ModelBenchConfig:
    """What `bench.tools.model.run_model` measures; every tuple is a sweep dimension (all
    combinations run). Each field is the option of its name; explicit dimensions (`--d-model`,
    `--d-ff`, `--num-heads`, with `--num-layers` and `--name`) add a shape of their own
    (`shapes_given`).

    Raises:
        ValueError: an unknown name, an empty sweep, or a size that is not positive.
    """

    shapes: tuple[Shape, ...] = option(
        tuple(shape_named(n) for n in HANDOUT_SIZES),
        f"named sizes: {', '.join(MODEL_SIZES)}",
        group=MODEL,
        flag="size",
        parse=_shape,
        cpu=(shape_named(CPU_SIZE),),
        default_text=f"the handout's {' '.join(HANDOUT_SIZES)} with CUDA, {CPU_SIZE} on a CPU",
        metavar="SIZE",
    )
    context_lengths: tuple[int, ...] = option(
        (512,), "sequence lengths (each also the context length)", group=MODEL,
        flag="context-length", cpu=(64,),
    )  # fmt: skip
    batch: int = option(4, "sequences per batch", group=MODEL)
    vocab_size: int | None = option(
        None, "vocabulary", group=MODEL, default_text="the size's own: 10,000 for most"
    )
    attention: tuple[str, ...] = option(
        (DEFAULT_ATTENTION,), "attention backends", group=MODEL, choices=attention_names
    )
    activation_checkpointing: tuple[str, ...] = option(
        (DEFAULT_CHECKPOINTING,), HELP["activation_checkpointing"] + "; in the training modes",
        group=MODEL, parse=checkpointing_spec, metavar="SPEC",
    )  # fmt: skip
    loss: tuple[str, ...] = option(
        (DEFAULT_LOSS,), HELP["loss"] + "; in the training modes", group=MODEL, choices=LOSSES
    )
    optimizer: tuple[str, ...] = option(
        ("lmcore",), HELP["optimizer"] + "; the train step's", group=MODEL, choices=OPTIMIZERS
    )
    num_layers: int | None = option(
        None,
        HELP["num_layers"] + "; with explicit dimensions, that shape's depth",
        group=MODEL,
        parse=positive_int,
        default_text="the sizes' own",
    )
    num_kv_heads: int | None = option(
        None, HELP["num_kv_heads"], group=MODEL, parse=positive_int, default_text="one per head"
    )
    modes: tuple[str, ...] = option(MODES, "modes", group=RUN, flag="mode", choices=MODES)
    dtypes: tuple[str, ...] = option(
        ("fp32",), "precisions: fp32 and/or bf16-autocast", group=RUN, flag="precision",
        aliases=("dtype",), choices=PRECISIONS,
        parse=parse_name(command="bench-model", offered=PRECISIONS),
    )  # fmt: skip
    compile: tuple[bool, ...] = option(
        (False,), "torch.compile: off, on, or both (a row each)", group=RUN, parse=_compile,
        several=False, metavar="{off,on,both}",
    )  # fmt: skip
    warmup: int = option(5, "untimed steps first", group=RUN, cpu=1)
    steps: int = option(10, "timed steps", group=RUN, cpu=3)
    nvtx: bool = option(False, "NVTX ranges for Nsight Systems (CUDA)", group=PROFILING)

    def __post_init__(self) -> None:
        choices = (
            ("modes", MODES),
            ("dtypes", PRECISIONS),
            ("loss", LOSSES),
            ("optimizer", OPTIMIZERS),
        )
        for name, allowed in choices:
            values = getattr(self, name)
            if not values or not set(values) <= set(allowed):
                raise ValueError(f"{name} must be non-empty, from {allowed}; got {values}")
        if not self.activation_checkpointing:
            raise ValueError("activation_checkpointing must be non-empty (none: no recomputation)")
        for spec in self.activation_checkpointing:
            ActivationCheckpointing.parse(spec)
        optional = [
            v for v in (self.vocab_size, self.num_layers, self.num_kv_heads) if v is not None
        ]
        sizes = (self.batch, self.steps, *self.context_lengths, *optional)
        if not self.shapes or not self.context_lengths or not self.attention or min(sizes) < 1:
            raise ValueError(
                "shapes, context_lengths and attention must be non-empty; batch, vocab_size, "
                f"num_layers, num_kv_heads, steps and context lengths positive; got {self}"
            )
        if self.warmup < 0:
            raise ValueError(f"warmup must be >= 0, got {self.warmup}")


def shapes_given(args: argparse.Namespace, given: dict[str, Any]) -> dict[str, Any]:
    """The fields given, with the shape of explicit dimensions added to the named sizes
    (`--num-layers` is then its depth, not every size's).

    Raises:
        ValueError: explicit dimensions without all four.
    """
    dims = (args.d_model, args.d_ff, args.num_heads)
    if all(d is None for d in dims):
        return given
    given = dict(given)
    depth = given.pop("num_layers", None)
    if None in dims or depth is None:
        raise ValueError(
            "explicit dimensions need all of --d-model --d-ff --num-layers --num-heads"
        )
    d_model, d_ff, num_heads = dims
    custom = (args.name, ModelSize(d_model, d_ff, depth, num_heads))
    return {**given, "shapes": (*given.get("shapes", ()), custom)}


def add_options(parser: argparse.ArgumentParser) -> None:
    """The options that are no field of `ModelBenchConfig`: a shape's explicit dimensions, the
    files the profiling writes, and the studies."""
    model = parser.add_argument_group("explicit dimensions (with --num-layers)")
    model.add_argument("--d-model", type=positive_int, help="explicit width")
    model.add_argument("--d-ff", type=positive_int, help="explicit feed-forward width")
    model.add_argument("--num-heads", type=positive_int, help="explicit head count")
    model.add_argument("--name", default="custom", help="table name of explicit dimensions")
    tools = parser.add_argument_group("profiling and studies")
    tools.add_argument("--memory-snapshot", type=Path, metavar="PATH", help="allocator pickle")
    tools.add_argument(
        "--profile", type=Path, metavar="DIR", help="torch.profiler traces and kernel tables"
    )
    tools.add_argument(
        "--study",
        choices=STUDIES,
        help="residuals: what one block saves for backward, by operation (no timing)",
    )
    tools.add_argument(
        "--warmup-study",
        type=int,
        nargs="*",
        metavar="W",
        help="re-run in fresh processes with these warm-up counts "
        f"({' '.join(map(str, WARMUP_STUDY))} when none given)",
    )


COMMAND = Command(
    "bench-model",
    __doc__,
    config=ModelBenchConfig,
    add_options=add_options,
    run="bench.tools.model:TOOL",
)
main = COMMAND.main
