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

from dataclasses import dataclass

import lmcore
from bench.core.cli import Command, LazyChoices
from bench.core.options import option

__all__ = [
    "ADAMW_IMPLS",
    "COMMAND",
    "DTYPES",
    "LOSS_IMPLS",
    "LOSS_SHAPES",
    "STUDIES",
    "LossShape",
    "OpsConfig",
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


# The CPU default: seconds on two cores.
CPU_LOSS_IMPLS = ("fused", "eager")


@dataclass(frozen=True)
class OpsConfig:
    """What `bench.tools.ops.run_ops` measures; each field is the option of its name.

    Raises:
        ValueError: an unknown or empty list of names, an unknown dtype, or too few steps.
    """

    studies: tuple[str, ...] = option(STUDIES, "the studies", flag="study", choices=STUDIES)
    loss_shapes: tuple[str, ...] = option(
        ("small", "leaderboard"), "the loss's shapes", choices=list(LOSS_SHAPES), cpu=("tiny",)
    )
    loss_impls: tuple[str, ...] = option(
        LOSS_IMPLS, "the loss's implementations", choices=LOSS_IMPLS, cpu=CPU_LOSS_IMPLS
    )
    adamw_sizes: tuple[str, ...] = option(
        ("small", "xl"),
        "model sizes whose parameters AdamW steps",
        choices=lambda: list(lmcore.MODEL_SIZES),
        cpu=("tiny",),
    )
    adamw_impls: tuple[str, ...] = option(
        ADAMW_IMPLS, "AdamW's implementations", choices=ADAMW_IMPLS
    )
    # The CPU's: bf16 matmuls there are emulated and slow; they are not what is measured.
    dtype: str = option(
        "bf16",
        "dtype of the loss's hidden states and head weight",
        choices=list(DTYPES),
        cpu="fp32",
    )
    steps: int = option(10, "timed calls per row", cpu=3)
    warmup: int = option(
        3, "untimed calls first (compilation, autotuning, allocator growth)", cpu=1
    )

    def __post_init__(self) -> None:
        choices = {
            "studies": (self.studies, STUDIES),
            "loss_shapes": (self.loss_shapes, tuple(LOSS_SHAPES)),
            "loss_impls": (self.loss_impls, LOSS_IMPLS),
            "adamw_sizes": (self.adamw_sizes, tuple(lmcore.MODEL_SIZES)),
            "adamw_impls": (self.adamw_impls, ADAMW_IMPLS),
        }
        for name, (given, allowed) in choices.items():
            unknown = [v for v in given if v not in allowed]
            if unknown or not given:
                raise ValueError(f"{name} must be names from {list(allowed)}, got {list(given)}")
        if self.dtype not in DTYPES:
            raise ValueError(f"dtype must be one of {list(DTYPES)}, got {self.dtype!r}")
        if self.steps < 1 or self.warmup < 0:
            raise ValueError(f"steps must be positive and warmup >= 0, got {self}")


COMMAND = Command("bench-ops", __doc__, config=OpsConfig, run="bench.tools.ops:TOOL")
main = COMMAND.main
