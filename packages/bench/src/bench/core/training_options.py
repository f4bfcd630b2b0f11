"""The command line of the training benchmarks (bench-ddp, bench-zero): the options of
`bench.core.training.TrainingBenchConfig`, and the fields they set. Light (no torch): their
commands import it before parsing.
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from typing import Any

import lmcore
from bench.core.cli import add_timeout_arg, add_timing_args, distinct
from bench.core.layouts import parse_name
from bench.core.shapes import CPU_SIZE

__all__ = ["add_training_args", "training_overrides"]


def add_training_args(
    parser: argparse.ArgumentParser, *, variants: Sequence[str], command: str
) -> tuple[argparse._ArgumentGroup, argparse._ArgumentGroup]:
    """Add the options of `TrainingBenchConfig`, `--timeout` and the timing options.

    Returns:
        The `model` and `run` option groups, for the tool's own options.
    """
    model = parser.add_argument_group("model")
    model.add_argument(
        "--size", choices=list(lmcore.MODEL_SIZES), help=f"model size (xl; {CPU_SIZE} on CPU)"
    )
    model.add_argument("--context-length", type=int, help="tokens per sequence (128)")
    model.add_argument("--batch", type=int, help="sequences per rank (4)")
    model.add_argument("--vocab-size", type=int, help=f"vocabulary ({lmcore.VOCAB_SIZE:,})")
    run = parser.add_argument_group("run")
    run.add_argument("--nproc", type=int, dest="world_size", help="ranks, one GPU each on CUDA (2)")
    # its name before one spelling per idea: read on, not shown
    run.add_argument("--world-size", type=int, dest="world_size", help=argparse.SUPPRESS)
    run.add_argument(
        "--variants",
        nargs="+",
        type=parse_name(command=command, offered=variants),
        choices=variants,
        help="what to compare",
    )
    add_timeout_arg(run, scope="for all ranks")
    add_timing_args(parser, warmup=None, steps=None)
    return model, run


def training_overrides(args: argparse.Namespace) -> dict[str, Any]:
    """The `TrainingBenchConfig` fields the options of `add_training_args` set (None: not given)."""
    return {
        "size": args.size,
        "context_length": args.context_length,
        "batch": args.batch,
        "vocab_size": args.vocab_size,
        "world_size": args.world_size,
        "variants": distinct(args.variants),
        "warmup": args.warmup,
        "steps": args.steps,
    }
