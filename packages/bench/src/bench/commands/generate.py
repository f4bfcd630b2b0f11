"""bench-generate: sample text from a saved bench-train run, on a CPU or a GPU, without training.

    bench-generate --run runs/small --prompt "ROMEO:" --generate 300
    bench-generate --run runs/small --device cpu --temperature 0      # greedy, on the CPU

It reads the run's `checkpoint.pt` (the weights and the model's configuration) and its tokenizer
(`tokenizer.json` for BPE), and prints the prompt and what follows it. The sampling options
default to the run's own (`--prompt`, `--generate`, `--temperature`, `--top-p`, `--seed`), so on
the run's device, with its attention backend and precision, it prints the run's `sample.txt`
again. The attention backend changes no weight: `--attention` may name any (the run's by
default; sdpa in place of fa2-triton off CUDA, whose kernels need a GPU).

It decodes with a KV cache (`lmcore.KVCache`: the prompt runs once, then each token against the
cached keys and values, through `fa2.flash_attn_with_kvcache`) and says on stderr how many
tokens per second that made; `--no-cache` runs the whole window for every token instead (the
same tokens in float32; in 16-bit a near tie may round the other way and part them).
"""

from __future__ import annotations

import argparse
from pathlib import Path

import lmcore
from bench.core.cli import Command
from bench.core.layouts import parse_name
from bench.core.options import add_options as add_config_options
from bench.train.choices import PRECISIONS, SAMPLING
from bench.train.config import TrainConfig

__all__ = ["COMMAND", "add_options", "main"]


def add_options(parser: argparse.ArgumentParser) -> None:
    """The run, the device, the attention and precision, and bench-train's sampling options."""
    parser.add_argument(
        "--run", required=True, type=Path, metavar="DIR", help="a bench-train --out folder"
    )
    parser.add_argument("--device", default="auto", help="auto, cpu, cuda (default: auto)")
    parser.add_argument(
        "--attention",
        choices=lmcore.attention_names(),
        help="attention backend (default: the run's)",
    )
    parser.add_argument(
        "--precision",
        type=parse_name(command="bench-generate", offered=PRECISIONS),
        choices=PRECISIONS,
        help="fp32, bf16-autocast, or bf16 (the model cast to bf16) (default: the run's on "
        "CUDA, fp32 on a CPU)",
    )
    parser.add_argument(
        "--no-cache",
        dest="use_cache",
        action="store_false",
        help="decode without the KV cache: the whole window for every token",
    )
    sampling = parser.add_argument_group("sampling", "bench-train's options (default: the run's)")
    add_config_options(parser, TrainConfig, names=SAMPLING, into=sampling, defaults=False)


COMMAND = Command(
    "bench-generate",
    __doc__,
    add_options=add_options,
    run="bench.train.generate:run_parsed",
    common=False,
)
main = COMMAND.main
