"""bench-precision: what low-precision arithmetic does to a sum, and which dtypes autocast picks.

Two demonstrations from the handout's §1.1.5:

1. Accumulation: add 0.01 a thousand times (the exact answer is 10) four ways: fp32 into fp32,
   fp16 into fp16, fp16 into an fp32 accumulator (promoted on each add), and fp16 explicitly cast
   to fp32 first. The value and its error show that the accumulator's precision, not the addend's,
   decides how far the sum drifts: fp16 has 10 mantissa bits, so once the sum passes 8 its spacing
   (2⁻⁷ ≈ 0.0078) is comparable to the 0.01 being added.
2. Autocast: the handout's toy model (Linear 20→10, ReLU, LayerNorm, Linear 10→5) run under
   `torch.autocast`, reporting the dtype of the parameters, the first layer's output, the
   LayerNorm's output, the logits, the loss (`torch.nn.functional.cross_entropy`) and the
   gradients. On CUDA with bf16 and fp16; on the CPU with bf16.

Example::

    bench-precision --json precision.json --plot precision.png
"""

from __future__ import annotations

import argparse

from bench.core.cli import Command

__all__ = ["COMMAND", "add_options", "main"]


def add_options(parser: argparse.ArgumentParser) -> None:
    """None of its own: the common options (`--device`, `--json`, ...) only."""


COMMAND = Command(
    "bench-precision", __doc__, add_options=add_options, run="bench.tools.precision:TOOL"
)
main = COMMAND.main
