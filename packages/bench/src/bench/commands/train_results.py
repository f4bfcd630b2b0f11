"""bench-train-results: result files (Markdown, JSON, PNG; CSV of the speed and scaling tables)
for `docs/results/` from finished bench-train run folders (`bench.train.results` says what each
holds).

    bench-train-results --out docs/results --text RUN --text-baseline RUN_UNDER_BASELINE \\
        --speed default=RUN_A torch-baseline=RUN_B --baseline torch-baseline
    bench-train-results --out docs/results --scaling none-1=RUN_A fsdp-2=RUN_B torch-fsdp-2=RUN_C
    bench-train-results --out docs/results --precision bf16=RUN_A fp16=RUN_B

--scaling sets runs of the same training on one rank and on several side by side
(train_scaling_*): tokens/s, speed-up and scaling efficiency against the one-rank run of the
same model, the busiest rank's peak memory, and the losses against the one-rank run's.
--precision sets runs of the same training in other precisions side by side, the first the
reference (train_precision_*): losses against its, fp16's skipped steps and loss scale, and
both runs' loss curves.

Everything is read from the run folders, so the files can be built on any machine from folders
copied off the GPU; only --measure-ceiling needs CUDA.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from bench.core.cli import Command

__all__ = ["COMMAND", "add_options", "check", "main"]


def _labelled(value: str) -> tuple[str, str]:
    label, sep, folder = value.partition("=")
    if not sep or not label or not folder:
        raise argparse.ArgumentTypeError(f"expected LABEL=RUN_FOLDER, got {value!r}")
    return label, folder


def add_options(parser: argparse.ArgumentParser) -> None:
    """The results folder, the runs and the speed table's baseline."""
    parser.add_argument("--out", type=Path, required=True, help="results folder")
    parser.add_argument("--text", type=Path, help="a real-text run's folder: train_text_*")
    parser.add_argument(
        "--text-baseline", type=Path, help="the --text run's command under --baseline torch"
    )
    parser.add_argument(
        "--speed", nargs="+", type=_labelled, default=[], metavar="LABEL=RUN",
        help="runs for the speed table, in order: train_speed_*",
    )  # fmt: skip
    parser.add_argument("--baseline", help="the --speed label the ratios divide by")
    parser.add_argument(
        "--speed-topic", default="train_speed", metavar="NAME",
        help="the speed table's file name before device and date (default: train_speed)",
    )  # fmt: skip
    parser.add_argument(
        "--scaling", nargs="+", type=_labelled, default=[], metavar="LABEL=RUN",
        help="runs on one and on several ranks, in order: train_scaling_*",
    )  # fmt: skip
    parser.add_argument(
        "--precision", nargs="+", type=_labelled, default=[], metavar="LABEL=RUN",
        help="runs in other precisions, the reference first: train_precision_*",
    )  # fmt: skip
    parser.add_argument(
        "--measure-ceiling", action="store_true", help="time a bf16 matmul here (needs CUDA)"
    )
    parser.add_argument(
        "--note", action="append", default=[], help="a sentence for the result (repeatable)"
    )


def check(args: argparse.Namespace) -> None:
    """The options that need each other (before anything heavy is imported)."""
    if args.speed and args.baseline is None:
        raise ValueError("--speed needs --baseline LABEL")
    if args.text_baseline is not None and args.text is None:
        raise ValueError("--text-baseline needs --text RUN")


COMMAND = Command(
    "bench-train-results",
    __doc__,
    add_options=add_options,
    run="bench.train.results:run_parsed",
    common=False,
    check=check,
)
main = COMMAND.main
