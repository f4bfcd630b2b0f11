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

Three other modes:
  --check DIR          every bench-model, bench-zero (and bench-step) result row in DIR that the
                       model covers: predicted against measured, side by side, with the error
  --preset leaderboard-2026
                       the CS336 2026 leaderboard step (8B, context 32,768, batch 2, bf16, on 2
                       GPUs): which options fit in 80 GB and in 141 GB per GPU
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
  bench-plan --check docs/results --json check.json --markdown check.md --plot check.png
  bench-plan --section8 --size xl --context-length 128 --global-batch 8 --dp 8 --tp 4

Memory sizes read as `80GB` (10^9 bytes), `80GiB` (2^30) or `512MiB`. Bandwidth and FLOP rate
default to measured numbers (the run's notes say which).
"""

from __future__ import annotations

import argparse
from pathlib import Path

import lmcore
from bench.core.cli import Command
from bench.core.layouts import parse_name
from bench.core.model_options import LOSSES
from bench.plan.activations import ATTENTION_KINDS
from bench.plan.collectives import BANDWIDTH_SOURCE, DEFAULT_BANDWIDTH_GBPS
from bench.plan.fit import memory_argument
from bench.plan.memory import (
    CHECKPOINTING_FORMS,
    LAYOUTS,
    MODES,
    OPTIMIZERS,
    PRECISIONS,
)

__all__ = ["COMMAND", "PRESETS", "add_options", "main"]

PRESETS = ("leaderboard-2026",)


def add_options(parser: argparse.ArgumentParser) -> None:
    """bench-plan's options: the mode, the model, the training step and the hardware."""
    what = parser.add_argument_group("mode (default: predict the configurations below)")
    what.add_argument("--check", type=Path, metavar="DIR",
                      help="predict every bench-model/bench-zero/bench-step row of the results in "
                      "DIR beside its measurement")  # fmt: skip
    what.add_argument("--preset", choices=PRESETS,
                      help="leaderboard-2026: what fits the CS336 2026 leaderboard step on 2 GPUs "
                      "of 80 GB and of 141 GB")  # fmt: skip
    what.add_argument(
        "--section8",
        action="store_true",
        help="the handout's §8 FFN answers (B = batch x context, D, F of the model)",
    )
    model = parser.add_argument_group("model")
    model.add_argument("--size", nargs="+", choices=list(lmcore.MODEL_SIZES), help="named sizes")
    model.add_argument("--d-model", type=int, help="explicit width (with the three below)")
    model.add_argument("--d-ff", type=int, help="explicit feed-forward width")
    model.add_argument("--num-layers", type=int, help="explicit depth")
    model.add_argument("--num-heads", type=int, help="explicit head count")
    model.add_argument("--num-kv-heads", type=int, help="key/value heads (grouped-query attention)")
    model.add_argument("--name", default="custom", help="table name of explicit dimensions")
    model.add_argument("--vocab-size", type=int, help=f"vocabulary ({lmcore.VOCAB_SIZE:,})")
    model.add_argument(
        "--context-length",
        type=int,
        nargs="+",
        help="sequence lengths (each also the context length; 512)",
    )
    model.add_argument(
        "--attention",
        nargs="+",
        choices=list(ATTENTION_KINDS),
        help="attention backends (naive: materialises the scores)",
    )
    step = parser.add_argument_group("training step")
    batch = step.add_mutually_exclusive_group()
    batch.add_argument("--batch", type=int, nargs="+", help="sequences per data-parallel rank")
    batch.add_argument(
        "--global-batch",
        type=int,
        nargs="+",
        help="sequences per step in all, split over the data-parallel ranks (4)",
    )
    step.add_argument(
        "--precision",
        nargs="+",
        choices=list(PRECISIONS),
        help="; ".join(f"{p.name}: {p.description}" for p in PRECISIONS.values()),
    )
    step.add_argument(
        "--layout",
        nargs="+",
        type=parse_name(command="bench-plan", offered=LAYOUTS),
        choices=LAYOUTS,
        help="parallel layouts (single); ddp, zero1: DDPBucketed's gradient views; ddp:torch, "
        "zero1:torch-ddp: torch DDP's gradient buckets",
    )
    step.add_argument(
        "--dp", type=int, default=2, help="data-parallel ranks of ddp, zero1, fsdp (2)"
    )
    step.add_argument("--tp", type=int, default=2, help="tensor-parallel ranks of tp, fsdp-tp (2)")
    step.add_argument(
        "--activation-checkpointing",
        nargs="+",
        metavar="SPEC",
        help=f"checkpointing forms: {' | '.join(CHECKPOINTING_FORMS)} (none)",
    )
    step.add_argument("--loss", nargs="+", choices=LOSSES, help="materialized (default) or fused")
    step.add_argument(
        "--optimizer",
        nargs="+",
        choices=list(OPTIMIZERS),
        help="lmcore (foreach, default), lmcore-fused, torch-fused, torch (foreach)",
    )
    step.add_argument(
        "--mode",
        choices=MODES,
        default="train-step",
        help="train-step (default), forward-backward, or forward (inference)",
    )
    step.add_argument(
        "--no-hold-logits",
        action="store_true",
        help="the step does not keep the logits through backward (bench-model's)",
    )
    # Before the one vocabulary the bucket kind was an option of its own; the layout's name
    # says it now (`ddp:torch`), and the option reads on for old command lines.
    step.add_argument("--ddp-buckets", choices=("torch", "views"), help=argparse.SUPPRESS)
    hw = parser.add_argument_group("hardware")
    hw.add_argument(
        "--memory",
        type=memory_argument,
        metavar="SIZE",
        help="device memory to fit, e.g. 80GB, 141GB, 80GiB",
    )
    hw.add_argument("--bandwidth", type=float, default=DEFAULT_BANDWIDTH_GBPS, metavar="GBPS",
                    help=f"egress per device in GB/s ({DEFAULT_BANDWIDTH_GBPS:g}: "
                    f"{BANDWIDTH_SOURCE})")  # fmt: skip
    hw.add_argument("--tflops", type=float, help="matmul rate in TFLOP/s (default: measured bf16 "
                    "ceiling of an H100; the data sheet's fp32 peak for fp32)")  # fmt: skip


COMMAND = Command("bench-plan", __doc__, add_options=add_options, run="bench.tools.plan:TOOL")
main = COMMAND.main
