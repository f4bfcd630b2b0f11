"""\
Train lmcore.TransformerLM on a text or token file with any attention backend, optimizer and
parallel mode. On CUDA the default run is the fast one: small, bf16, fa2-triton, compiled, fused
AdamW. Writes metrics.jsonl, summary.json, loss.png, sample.txt, checkpoint.pt and config.toml
(the resolved options) to --out. Options come from the command line and from --config FILE
(TOML or JSON, each option under its flag's name, e.g. context-length = 512); the command line
wins. See packages/bench/README.md for the outputs, resuming and the parallel modes.
"""

from __future__ import annotations

import argparse

from bench.core.cli import Command
from bench.core.options import add_options as add_config_options
from bench.train.config import CONFIG_FILE, TrainConfig

__all__ = ["COMMAND", "EXAMPLES", "add_options", "main"]

EXAMPLES = """\
examples:
  bench-train --data input.txt --size tiny --steps 300 --out runs/tiny         # a CPU
  bench-train --data input.txt --steps 500 --out runs/small                    # a GPU: fast
  bench-train --data input.txt --steps 500 --baseline torch --out runs/torch   # torch's step
  bench-train --data input.txt --time-budget 20m --steps 5000 --out runs/fast  # 20 minutes
  bench-train --config runs/small/config.toml --out runs/again                 # repeat a run
  bench-train --config runs/small/config.toml --resume                         # continue it
  bench-train --data input.txt --nproc 2 --parallel torch-fsdp --out runs/f2   # 2 GPUs, FSDP2
  torchrun --nproc-per-node 8 -m bench train --data input.txt --out runs/big    # torchrun
"""


def add_options(parser: argparse.ArgumentParser) -> None:
    """`--config FILE`, then every option of `TrainConfig` in its group (`bench.core.options`)."""
    parser.add_argument(
        "--config",
        metavar="FILE",
        help=f"options from a TOML or JSON file (a run's {CONFIG_FILE} repeats the run); "
        "options given on the command line win",
    )
    add_config_options(parser, TrainConfig)


COMMAND = Command(
    "bench-train",
    __doc__,
    add_options=add_options,
    run="bench.train.run:run_parsed",
    common=False,
    epilog=EXAMPLES,
)
main = COMMAND.main
