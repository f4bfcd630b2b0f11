"""bench-plan: predict memory per device and communication per step of training, without a GPU.

For `lmcore.TransformerLM` of a named size or explicit dimensions, a batch and context, a
precision, a parallel layout (one device, DDP, ZeRO-1, FSDP, tensor parallelism, FSDP x TP),
activation checkpointing and a loss, bench-plan predicts the busiest device's memory at the
moment of its peak (parameters, gradients, optimizer state, activations, the loss's logits,
communication buffers, temporaries), whether it fits `--memory`, the largest batch and context
that would, and the bytes each device sends per step with their time beside the step's compute
time. Every number comes with the formula that gives it (the second table, per configuration).
Options with several values multiply. The model behind it is `bench.plan.memory` and
`bench.plan.traffic`; the assumptions are in their docstrings.

`--gpu NAME` (a GPU of `bench.core.hardware`: T4, L4, A10G, A100-40GB, A100-80GB, RTX-4090,
H100, H200, B200, ...) fits its memory and times compute at its data-sheet peak for the
precision's matmuls (what --memory and --tflops give, which win over it).

Three other modes:
  --check DIR          every bench-model, bench-zero (and bench-step) result row in DIR that the
                       model covers: predicted against measured, side by side, with the error
  --preset leaderboard-2026
                       the CS336 2026 leaderboard step (8B, context 32,768, batch 2, bf16, on 2
                       GPUs): which options fit in 80 GB and in 141 GB per GPU
  --preset t4x2        seed 003's Kaggle question: what trains on two 16 GB T4s in fp16, at
                       which batch and context, under DDP, ZeRO-1 and FSDP
  --section8           the handout's §8 FFN-layer answers (DP, FSDP, TP, FSDP + TP) for the
                       model's d_model and d_ff, B = global batch x context tokens, --dp / --tp
                       devices

Examples:
  bench-plan --size xl --context-length 2048 --batch 4 --precision fp32 bf16-autocast
  bench-plan --size 2.7B --context-length 512 --batch 4 --layout ddp zero1 fsdp --dp 2 \\
      --precision bf16-master --memory 80GB
  bench-plan --d-model 4096 --d-ff 11008 --num-layers 34 --num-heads 32 --vocab-size 151936 \\
      --context-length 32768 --global-batch 2 --precision bf16 --layout fsdp --dp 2 \\
      --attention fa2-triton --activation-checkpointing blocks nested --loss fused --memory 80GB
  bench-plan --preset leaderboard-2026 --json plan_leaderboard.json --plot plan_leaderboard.png
  bench-plan --preset t4x2 --json plan_t4x2.json --plot plan_t4x2.png
  bench-plan --size medium --context-length 1024 --batch 4 --precision fp16 --layout zero1 \\
      --gpu T4
  bench-plan --check docs/results --json check.json --markdown check.md --plot check.png
  bench-plan --section8 --size xl --context-length 128 --global-batch 8 --dp 8 --tp 4

Memory sizes read as `80GB` (10^9 bytes), `80GiB` (2^30) or `512MiB`. Bandwidth and FLOP rate
default to measured numbers (the run's notes say which).
"""

from __future__ import annotations

import argparse
import itertools
from dataclasses import dataclass, replace
from pathlib import Path

import lmcore
from bench.core.cli import Command
from bench.core.hardware import GPUS, gpu_named
from bench.core.layouts import LAYOUTS as ALL_LAYOUTS
from bench.core.layouts import PRECISIONS as ALL_PRECISIONS
from bench.core.layouts import parse_name
from bench.core.model_options import LOSSES, checkpointing_spec, positive_int
from bench.core.options import Group, option, positive_float
from bench.core.shapes import size_label
from bench.plan.activations import ATTENTION_KINDS
from bench.plan.collectives import MEASURED_BANDWIDTH_SOURCE
from bench.plan.fit import memory_argument
from bench.plan.memory import LAYOUTS, MODES, OPTIMIZERS, PRECISIONS, TrainingPlan

__all__ = ["COMMAND", "PRESETS", "PlanConfig", "add_options", "fastest_attention", "main"]

PRESETS = ("leaderboard-2026", "t4x2")
# The sequence length of a sweep that names none, for a size without a context of its own.
DEFAULT_CONTEXT = 512
# The batch of a sweep that names none: sequences per step in all.
DEFAULT_GLOBAL_BATCH = 4
MODEL = Group("model")
STEP = Group("training step")
HARDWARE = Group("hardware")


@dataclass(frozen=True)
class PlanConfig:
    """What `bench.tools.plan.run_plan` predicts; every tuple is a sweep dimension (all
    combinations). Each field is the option of its name, but `models`.

    Attributes:
        models: (label, `lmcore.ModelConfig`) pairs, given in Python in place of the sizes and
            dimensions; the config's context length is the sequence length and its `attention`
            is replaced by each of `attentions` (or `fastest_attention`).

    Raises:
        ValueError: both batch options, an empty sweep, or dimensions given in part.
    """

    models: tuple[tuple[str, lmcore.ModelConfig], ...] = ()
    sizes: tuple[str, ...] = option(
        (), "named sizes", group=MODEL, flag="size", choices=lambda: list(lmcore.MODEL_SIZES),
        default_text="none",
    )  # fmt: skip
    d_model: int | None = option(None, "explicit width (with the three below)", group=MODEL)
    d_ff: int | None = option(None, "explicit feed-forward width", group=MODEL)
    num_layers: int | None = option(None, "explicit depth", group=MODEL)
    num_heads: int | None = option(None, "explicit head count", group=MODEL)
    num_kv_heads: int | None = option(
        None, "key/value heads (grouped-query attention)", group=MODEL, default_text="one per head"
    )
    name: str = option("custom", "table name of explicit dimensions", group=MODEL)
    vocab_size: int | None = option(
        None, "vocabulary", group=MODEL, parse=positive_int,
        default_text=f"a size's own (leaderboard-8b's 151,936); {lmcore.VOCAB_SIZE:,} for "
        "explicit dimensions",
    )  # fmt: skip
    context_lengths: tuple[int, ...] = option(
        (), "sequence lengths (each also the context length)", group=MODEL,
        flag="context-length",
        default_text=f"a size's own (leaderboard-8b's 32,768), else {DEFAULT_CONTEXT}",
    )  # fmt: skip
    attentions: tuple[str, ...] = option(
        (), "attention backends (naive: materialises the scores)", group=MODEL,
        flag="attention", choices=list(ATTENTION_KINDS),
        default_text="the fastest the model can use: fa2-triton, or sdpa past fa2's head dims",
    )  # fmt: skip
    batches: tuple[int, ...] = option(
        (), "sequences per data-parallel rank", group=STEP, flag="batch",
        default_text=f"a global batch of {DEFAULT_GLOBAL_BATCH}",
    )  # fmt: skip
    global_batches: tuple[int, ...] = option(
        (), "sequences per step in all, split over the data-parallel ranks (in place of --batch)",
        group=STEP, flag="global-batch", default_text=str(DEFAULT_GLOBAL_BATCH),
    )  # fmt: skip
    precisions: tuple[str, ...] = option(
        ("fp32",), "; ".join(f"{p.name}: {p.description}" for p in PRECISIONS.values()),
        group=STEP, flag="precision", choices=list(PRECISIONS),
    )  # fmt: skip
    layouts: tuple[str, ...] = option(
        ("single",), "parallel layouts; ddp, zero1: DDPBucketed's gradient views; ddp:torch, "
        "zero1:torch-ddp: torch DDP's gradient buckets", group=STEP, flag="layout",
        choices=LAYOUTS, parse=parse_name(command="bench-plan", offered=LAYOUTS),
    )  # fmt: skip
    dp: int = option(2, "data-parallel ranks of the layouts that have them", group=STEP)
    tp: int = option(2, "tensor-parallel ranks of tp, fsdp-tp", group=STEP)
    checkpointing: tuple[str, ...] = option(
        ("none",), "checkpointing forms: " + " | ".join(lmcore.ActivationCheckpointing.FORMS),
        group=STEP, flag="activation-checkpointing", parse=checkpointing_spec, metavar="SPEC",
    )  # fmt: skip
    losses: tuple[str, ...] = option(
        ("materialized",), "materialized or fused", group=STEP, flag="loss", choices=LOSSES
    )
    optimizers: tuple[str, ...] = option(
        ("lmcore",), "lmcore (foreach), lmcore-fused, torch-fused, torch (foreach)", group=STEP,
        flag="optimizer", choices=list(OPTIMIZERS),
    )  # fmt: skip
    mode: str = option(
        "train-step", "train-step, forward-backward, or forward (inference)", group=STEP,
        choices=MODES,
    )  # fmt: skip
    hold_logits: bool = option(
        True, "the step keeps the logits through backward (bench-model's does not)", group=STEP
    )
    memory_bytes: int | None = option(
        None, "device memory to fit, e.g. 80GB, 141GB, 80GiB", group=HARDWARE, flag="memory",
        parse=memory_argument, default_text="none", metavar="SIZE",
    )  # fmt: skip
    bandwidth_gbps: float | None = option(
        None, "egress per device in GB/s", group=HARDWARE, flag="bandwidth", metavar="GBPS",
        parse=positive_float, default_text=f"the {MEASURED_BANDWIDTH_SOURCE}",
    )  # fmt: skip
    tflops: float | None = option(
        None, "matmul rate in TFLOP/s", group=HARDWARE, parse=positive_float,
        default_text="--gpu's data-sheet peak; without it the measured bf16 ceiling of an H100, "
        "the data sheet's fp32 peak for fp32",
    )  # fmt: skip
    gpu: str | None = option(
        None, "a known GPU: its memory (unless --memory) and data-sheet peak (unless --tflops)",
        group=HARDWARE, choices=lambda: [g.name for g in GPUS], default_text="none",
    )  # fmt: skip

    def __post_init__(self) -> None:
        if self.batches and self.global_batches:
            raise ValueError("give --batch (per rank) or --global-batch, not both")
        named = {
            "precisions": self.precisions,
            "layouts": self.layouts,
            "checkpointing": self.checkpointing,
            "losses": self.losses,
            "optimizers": self.optimizers,
        }
        empty = [name for name, values in named.items() if not values]
        if empty:
            raise ValueError(f"{', '.join(empty)} must not be empty")
        dims = (self.d_model, self.d_ff, self.num_layers, self.num_heads)
        if any(d is not None for d in dims) and any(d is None for d in dims):
            raise ValueError(
                "explicit dimensions need all of --d-model --d-ff --num-layers --num-heads"
            )

    @property
    def memory(self) -> int | None:
        """The memory to fit, in bytes: `--memory`, else `--gpu`'s; None for neither."""
        if self.memory_bytes is not None or self.gpu is None:
            return self.memory_bytes
        return gpu_named(self.gpu).memory_bytes

    def rate(self, precision: str) -> float | None:
        """The matmul TFLOP/s of a step in `precision`: `--tflops`, else `--gpu`'s data-sheet
        peak for the precision's matmuls (fp32 without TF32); None: bench-plan's default.

        Raises:
            ValueError: `--gpu` lacks the precision's format (the T4 has no bf16).
        """
        if self.tflops is not None or self.gpu is None:
            return self.tflops
        return gpu_named(self.gpu).tflops(ALL_PRECISIONS[precision].compute)

    @property
    def global_batch(self) -> int:
        """One global batch, for the handout's §8: `--global-batch`, else `--batch` per rank
        times `--dp`, else the default."""
        if self.global_batches:
            return self.global_batches[0]
        return self.batches[0] * self.dp if self.batches else DEFAULT_GLOBAL_BATCH

    def model_configs(self) -> tuple[tuple[str, lmcore.ModelConfig], ...]:
        """`models`, or the named sizes and the explicit dimensions at each context length.

        Raises:
            ValueError: no model.
        """
        if self.models:
            return self.models
        out = []
        dims = (self.d_model, self.d_ff, self.num_layers, self.num_heads)
        for ctx in self.context_lengths or (None,):
            for name in self.sizes:
                size = lmcore.MODEL_SIZES[name]  # its own vocabulary and context, unless given
                config = size.config(context_length=ctx or size.context_length or DEFAULT_CONTEXT,
                                     vocab_size=self.vocab_size,
                                     num_kv_heads=self.num_kv_heads)  # fmt: skip
                shape = (size.d_model, size.d_ff, size.num_layers, size.num_heads)
                out.append((size_label(name, shape), config))
            if dims[0] is not None:
                config = lmcore.ModelConfig(
                    vocab_size=self.vocab_size or lmcore.VOCAB_SIZE,
                    context_length=ctx or DEFAULT_CONTEXT,
                    d_model=dims[0], d_ff=dims[1], num_layers=dims[2], num_heads=dims[3],
                    num_kv_heads=self.num_kv_heads,
                )  # fmt: skip
                out.append((size_label(self.name, dims), config))
        if not out:
            raise ValueError(
                "name a model: --size NAME, or --d-model --d-ff --num-layers --num-heads"
            )
        return tuple(out)

    def plans(self) -> list[tuple[str, TrainingPlan]]:
        """Every combination as a validated `TrainingPlan` with its model's label.

        Raises:
            ValueError: no model, or a combination the plan refuses (the message names it).
        """
        out = []
        per_rank = bool(self.batches)
        combos = itertools.product(
            self.model_configs(), self.attentions or (None,),
            self.batches or self.global_batches or (DEFAULT_GLOBAL_BATCH,), self.precisions,
            self.layouts, self.checkpointing, self.losses, self.optimizers,
        )  # fmt: skip
        for (label, model), attention, batch, precision, layout, ckpt, loss, opt in combos:
            attention = attention or fastest_attention(model)
            dp = self.dp if ALL_LAYOUTS[layout].data_parallel else 1
            tp = self.tp if ALL_LAYOUTS[layout].tensor_parallel else 1
            plan = TrainingPlan(
                replace(model, attention=attention), batch=batch * dp if per_rank else batch,
                precision=precision, layout=layout, dp=dp, tp=tp, activation_checkpointing=ckpt,
                loss=loss, optimizer=opt, mode=self.mode, hold_logits=self.hold_logits,
            )  # fmt: skip
            out.append((label, plan))
        return out


def fastest_attention(model: lmcore.ModelConfig) -> str:
    """The attention `--attention` defaults to: fa2's Triton kernels (bench-train's backend on a
    GPU; in memory, like SDPA, no score matrix), or SDPA for head dims past the kernels' (a
    run-time import: fa2 imports torch, which `--help` must not)."""
    from fa2.checks import MAX_HEAD_DIM

    return "fa2-triton" if model.head_dim <= MAX_HEAD_DIM else "sdpa"


def add_options(parser: argparse.ArgumentParser) -> None:
    """The modes, which are no field of `PlanConfig`."""
    what = parser.add_argument_group("mode (default: predict the configurations above)")
    what.add_argument("--check", type=Path, metavar="DIR",
                      help="predict every bench-model/bench-zero/bench-step row of the results in "
                      "DIR beside its measurement")  # fmt: skip
    what.add_argument("--preset", choices=PRESETS,
                      help="leaderboard-2026: what fits the CS336 2026 leaderboard step on 2 GPUs "
                      "of 80 GB and of 141 GB; t4x2: what trains on two T4s in fp16")  # fmt: skip
    what.add_argument(
        "--section8",
        action="store_true",
        help="the handout's §8 FFN answers (B = global batch x context, D, F of the model)",
    )
    # Before the one vocabulary the bucket kind was an option of its own; the layout's name
    # says it now (`ddp:torch`), and the option reads on for old command lines.
    what.add_argument("--ddp-buckets", choices=("torch", "views"), help=argparse.SUPPRESS)


COMMAND = Command(
    "bench-plan", __doc__, config=PlanConfig, add_options=add_options, run="bench.tools.plan:TOOL"
)
main = COMMAND.main
