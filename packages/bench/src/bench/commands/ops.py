"""bench-ops: lmcore's fused LM-head loss and fused AdamW against torch's best, op by op.

Two studies, side by side in one run:

- `loss`: one forward and backward of the LM head and the cross-entropy, the hidden states and
  the head weight in bf16:
    - `fused`: `lmcore.fused_linear_cross_entropy` (chunks of tokens, a Triton row kernel, the
      full logits never held);
    - `compiled`: `torch.compile` of `F.cross_entropy(hidden @ W.T, y)`, the baseline of the
      ratios;
    - `eager`: the same, not compiled.
  At `small`'s shape (64 × 512 = 32,768 tokens, 768 features, vocabulary 10,000) and the
  leaderboard's (2 × 32,768 = 65,536 tokens, 4096 features, vocabulary 151,936; the logits
  alone are 19.9 GB in bf16). Reported: ms per call; the peak memory; the extra memory, the
  peak beyond the inputs and the two gradients every implementation returns; and that extra
  over the compiled baseline's and over the materialised logits' bytes (tokens × V × 2).
- `adamw`: one optimizer step over every parameter of `small` and the 2026 `xl`, float32
  parameters and random gradients: `lmcore` (lmcore.AdamW's multi-tensor path), `lmcore-fused`
  (`lmcore.AdamW(fused=True)`, one Triton launch per group) and `torch-fused`
  (`torch.optim.AdamW(fused=True)`, the baseline of the ratios).

Out of memory is a row (`OOM`), not the end of the run. The compiled baseline compiles during
its warm-up calls (untimed). On a GPU the default takes a few minutes, most of it the
leaderboard shape and the `xl` optimizer step (54 GB of parameters, gradients and moments).

Without a GPU a tiny CPU default runs instead and says so: `compiled` is left out (building CPU
code takes about a minute; ask for it with --loss-impls), the fused loss runs its torch row
step instead of the Triton kernel, and `lmcore-fused` runs only under Triton's interpreter
(TRITON_INTERPRET=1), slowly; otherwise its rows say why they were skipped.

Examples::

    bench-ops                                  # both studies, the default shapes
    bench-ops --study loss --loss-shapes leaderboard --json docs/results/ops.json --plot ops.png
    bench-ops --study adamw --adamw-sizes small xl --steps 20
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass

from bench.core.cli import Command, LazyChoices, add_timing_args
from lmcore import MODEL_SIZES

__all__ = [
    "ADAMW_IMPLS",
    "COMMAND",
    "DTYPES",
    "LOSS_IMPLS",
    "LOSS_SHAPES",
    "STUDIES",
    "LossShape",
    "add_options",
    "main",
]

STUDIES = ("loss", "adamw")
LOSS_IMPLS = ("fused", "compiled", "eager")
ADAMW_IMPLS = ("lmcore", "lmcore-fused", "torch-fused")
DTYPES = LazyChoices(bf16="torch:bfloat16", fp32="torch:float32")


@dataclass(frozen=True)
class LossShape:
    """A loss shape: the model size whose width and vocabulary it takes, and how many tokens."""

    size: str
    tokens: int
    about: str


LOSS_SHAPES = {
    "small": LossShape("small", 64 * 512, "batch 64 × context 512"),
    "leaderboard": LossShape("leaderboard-8b", 2 * 32_768, "batch 2 × context 32,768"),
    "tiny": LossShape("tiny", 96, "96 tokens"),
}


def add_options(parser: argparse.ArgumentParser) -> None:
    """bench-ops' options (the studies; `bench.tools.ops` maps them onto `OpsConfig`)."""
    parser.add_argument("--study", nargs="+", choices=STUDIES, help="loss, adamw (both)")
    parser.add_argument(
        "--loss-shapes", nargs="+", choices=list(LOSS_SHAPES), help="small, leaderboard (tiny)"
    )
    parser.add_argument("--loss-impls", nargs="+", choices=LOSS_IMPLS, help="implementations")
    parser.add_argument(
        "--adamw-sizes",
        nargs="+",
        choices=list(MODEL_SIZES),
        help="model sizes whose parameters AdamW steps (small xl)",
    )
    parser.add_argument("--adamw-impls", nargs="+", choices=ADAMW_IMPLS, help="implementations")
    parser.add_argument("--dtype", choices=list(DTYPES), help="the loss's dtype (bf16)")
    add_timing_args(parser, warmup=None, steps=None)


COMMAND = Command("bench-ops", __doc__, add_options=add_options, run="bench.tools.ops:TOOL")
main = COMMAND.main
