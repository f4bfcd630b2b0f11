"""The data-parallel training benchmark bench-ddp and bench-zero share: its configuration, its
rows, its model and its data. Light at import (torch is imported by the functions that build),
so that both commands declare their options from `TrainingBenchConfig`.

- `TrainingBenchConfig`: the model (size, context, vocabulary), batch per rank, ranks, variants,
  warm-up and timed steps, each an option (`bench.core.options`), validated once; the device's
  default is the handout's XL at context 128, batch 4 per rank, on 2 GPUs, or a tiny model on 2
  CPU ranks without a GPU. Each tool subclasses it with its own fields (and its `variants`).
- `Case`: one measured row, a variant and its bucket size.
- On each rank: `build_model` (an XL model materialised from the meta device on the GPU),
  `token_batches` (each rank its own data), `ADAMW_OPTIONS`.

The step is `bench.core.step.train_step`; the ranks are run by
`bench.core.distributed.measure_cases`.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, ClassVar

import lmcore
from bench.core.options import Group, option
from bench.core.shapes import CPU_SIZE, shape_named

if TYPE_CHECKING:
    import torch

__all__ = [
    "ADAMW_OPTIONS",
    "MODEL",
    "RUN",
    "Case",
    "TrainingBenchConfig",
    "build_model",
    "token_batches",
]

# The training recipe does not matter for timing or memory beyond the state AdamW keeps (two
# moments per parameter); these are the usual values.
ADAMW_OPTIONS = {"lr": 1e-4, "weight_decay": 0.01}
_DATA_SEED = 1000  # rank r draws its batches from seed 1000 + r: each rank its own data
MODEL = Group("model")
RUN = Group("run")


@dataclass(frozen=True)
class TrainingBenchConfig:
    """The model, data and run bench-ddp and bench-zero share; each tool adds its own fields
    and declares its `variants` (the names of its `VARIANTS`). Each field is its option.

    Raises:
        ValueError: an unknown size or variant, a size that is not positive, no warm-up step
            (the first creates the optimizer state), or fewer than 2 ranks.
    """

    VARIANTS: ClassVar[tuple[str, ...]] = ()

    size: str = option(
        "xl", "model size", group=MODEL, choices=lambda: list(lmcore.MODEL_SIZES), cpu=CPU_SIZE
    )
    context_length: int = option(128, "tokens per sequence", group=MODEL, cpu=32)
    batch: int = option(4, "sequences per rank", group=MODEL, cpu=2)
    vocab_size: int | None = option(None, "vocabulary", group=MODEL, default_text="the size's own")
    nproc: int = option(2, "ranks, one GPU each on CUDA", group=RUN, aliases=("world-size",))
    variants: tuple[str, ...] = ()
    warmup: int = option(
        2, "untimed steps first (the first creates the optimizer state)", group=RUN, cpu=1
    )
    steps: int = option(10, "timed steps", group=RUN, cpu=3)

    def __post_init__(self) -> None:
        shape_named(self.size)  # raises on an unknown size, listing the known ones
        if not self.variants or not set(self.variants) <= set(self.VARIANTS):
            raise ValueError(
                f"variants must be non-empty, from {self.VARIANTS}; got {self.variants}"
            )
        sizes = (self.context_length, self.batch, self.vocabulary, self.steps)
        if min(sizes) < 1 or self.warmup < 1 or self.nproc < 2:
            raise ValueError(
                "context_length, batch, vocab_size and steps must be positive, warmup at least 1 "
                f"(it creates the optimizer state) and nproc at least 2; got {self}"
            )

    def cpu_summary(self) -> str:
        """The model and run in words, for the notice that the CPU default ran."""
        s = self.model_size
        return (
            f"{s.num_layers} layers of width {s.d_model}, context {self.context_length}, "
            f"batch {self.batch} per rank, {self.nproc} gloo ranks"
        )

    @property
    def model_size(self) -> lmcore.ModelSize:
        """The widths and depth of `size`."""
        return lmcore.MODEL_SIZES[self.size]

    @property
    def vocabulary(self) -> int:
        """The model's vocabulary: `vocab_size`, else the size's own (leaderboard-8b's 151,936,
        the handout's 10,000 for the others)."""
        return self.vocab_size or self.model_size.vocab_size

    def summary(self) -> str:
        """The run in words, for a title: ranks, batch, context, warm-up and timed steps."""
        return (
            f"{self.nproc} ranks, batch {self.batch} per rank, context {self.context_length}, "
            f"{self.warmup} warm-up + {self.steps} timed steps"
        )


@dataclass(frozen=True)
class Case:
    """One measured row of a training benchmark: a variant, and its bucket size where it has one
    (in ddp's vocabulary, `None` = one bucket, for the variants that take a size)."""

    variant: str
    bucket_size_mb: float | None = None


def build_model(
    config: TrainingBenchConfig,
    device: torch.device,
    *,
    seed: int,
    attention: str = lmcore.DEFAULT_ATTENTION,
) -> lmcore.TransformerLM:
    """`config`'s `lmcore.TransformerLM` on `device`, initialised from `seed`
    (`bench.core.step.build_lm`)."""
    from bench.core.step import build_lm

    model_config = config.model_size.config(
        context_length=config.context_length, vocab_size=config.vocab_size, attention=attention
    )
    return build_lm(model_config, device, seed=seed)


def token_batches(
    config: TrainingBenchConfig, *, rank: int, device: torch.device
) -> Iterator[torch.Tensor]:
    """Endless random token batches `(batch, context_length + 1)` on `device`, one stream per rank.

    Each rank draws its own data, as in data-parallel training; inputs are `[:, :-1]` and the
    next-token targets `[:, 1:]`.
    """
    import torch

    g = torch.Generator().manual_seed(_DATA_SEED + rank)
    shape = (config.batch, config.context_length + 1)  # (batch, seq + 1)
    while True:
        yield torch.randint(config.vocabulary, shape, generator=g).to(device)
