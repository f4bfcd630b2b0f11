"""bench-attn: attention alone, implementation beside implementation (the handout's §1.2 study).

Single-head attention (batch 8, no head dimension) over a grid of head sizes d and sequence
lengths: the time of a forward call, the time of a backward call, the memory in use before the
backward (inputs, output and everything autograd saved), and the peak. Implementations:

- `naive`: plain PyTorch, the full score matrix materialised (`lmcore` backend `naive`).
- `compiled`: the same function through `torch.compile` (one static compilation per shape).
- `fa2-pytorch`, `fa2-triton`: FlashAttention-2 from the `fa2` package.
- `sdpa`: `torch.nn.functional.scaled_dot_product_attention`, the baseline of the ratios.

The forward is timed with autograd recording, as in training. The backward is timed alone: each
timed call follows an untimed fresh forward (no `retain_graph`). Each cell gets up to `--warmup`
calls and then `--steps` timed calls, fewer when one call is so slow that `--steps` of them would
exceed `--max-seconds` per pass; the row's `n` says how many ran and its `note` why.

The default on a GPU is the story in about a minute: fa2-triton against SDPA and naive at
d in {64, 128} and seq in {1024, 4096, 16384}, 20 timed calls per pass, at most 1 s per pass.
`--grid handout` runs the handout's whole grid (all five implementations, d in {16, 32, 64,
128}, seq in {256, ..., 16384}, 100 timed calls, at most 2 s per pass: the slow paths time
fewer calls). Options after `--grid` change that grid. The run says up front how many cells it
has and how long they may take, and prints each row as it completes.

Without a GPU a small CPU default runs instead (and says so): fa2-triton is skipped (Triton's
CPU interpreter is far too slow to benchmark) and `compiled` is left out (building the CPU code
takes about a minute); ask for it with `--impls`.

Examples::

    bench-attn                                  # the story in about a minute on a GPU
    bench-attn --grid handout                   # the handout's whole grid
    bench-attn --d 64 128 --seq 4096 --impls naive compiled sdpa --json attn.json --plot attn.png
"""

from __future__ import annotations

import argparse

from bench.core.cli import Command, LazyChoices, add_timing_args

__all__ = ["COMMAND", "DTYPES", "GRIDS", "IMPLS", "add_options", "main"]

IMPLS = ("naive", "compiled", "fa2-pytorch", "fa2-triton", "sdpa")
DTYPES = LazyChoices(fp32="torch:float32", bf16="torch:bfloat16", fp16="torch:float16")
GRIDS = ("default", "handout")


def add_options(parser: argparse.ArgumentParser) -> None:
    """bench-attn's options (the grid; `bench.tools.attn` maps them onto `AttnConfig`)."""
    parser.add_argument(
        "--grid",
        choices=GRIDS,
        help="default: the story in about a minute on a GPU; handout: the handout's whole grid",
    )
    parser.add_argument("--d", type=int, nargs="+", help="head sizes (default: the grid's)")
    parser.add_argument("--seq", type=int, nargs="+", help="sequence lengths")
    parser.add_argument("--impls", nargs="+", choices=IMPLS, help="implementations")
    parser.add_argument("--batch", type=int, help="batch size (8)")
    parser.add_argument("--dtype", choices=list(DTYPES), help="fp32 (default), bf16 or fp16")
    parser.add_argument("--causal", action="store_true", help="causal masking")
    parser.add_argument("--max-seconds", type=float, help="time budget per cell and pass")
    add_timing_args(parser, warmup=None, steps=None)


COMMAND = Command("bench-attn", __doc__, add_options=add_options, run="bench.tools.attn:TOOL")
main = COMMAND.main
