"""bench-matrix's options, each written once as a field of `MatrixConfig` (the command line is
generated from it, as bench-train's from `TrainConfig`): which cells, and the bench-train run
each cell makes. Plain Python (no torch), so that the command line is built before anything
heavy is imported; what the matrix does with them: `bench.commands.matrix` (its help) and
`bench.train.matrix`.
"""

from __future__ import annotations

from dataclasses import dataclass

import lmcore
from bench.core.layouts import parse_name
from bench.core.options import Group, option, option_of
from bench.core.shapes import CPU_SIZE
from bench.train.choices import PARALLEL_MODES, PRECISIONS
from bench.train.config import TrainConfig

__all__ = ["DEFAULT_LOSS_TOLERANCE", "MatrixConfig"]

# How far a cell's final training loss may lie from its reference cell's, relative. A choice,
# not a measurement: the modes add the same gradients in another order (float32's rounding is
# 2^-24 relative per value) or reduce them in bf16 (2^-8, about 0.4%, per value); 1% leaves room
# for a few steps of such rounding to compound. The spread a GPU run measured is in its result.
DEFAULT_LOSS_TOLERANCE = 0.01
CELLS = Group("cells", "the matrix: every size x attention x parallel mode")
TRAINING = Group("training", "each cell's bench-train run (the same for all)")


@dataclass(frozen=True)
class MatrixConfig:
    """What `bench.train.matrix.run_matrix` runs; each field is the option of its name.

    Raises:
        ValueError: no --data, an empty or repeated dimension, a size that is not positive.
    """

    data: str | None = option(
        None, "UTF-8 text or token file every cell trains on (required)", group=TRAINING,
        metavar="FILE",
    )  # fmt: skip
    out: str = option("runs/bench-matrix", "the matrix's folder", group=TRAINING, metavar="DIR")
    sizes: tuple[str, ...] = option(
        ("small",), "model sizes", group=CELLS, flag="size",
        choices=lambda: list(lmcore.MODEL_SIZES), cpu=(CPU_SIZE,),
    )  # fmt: skip
    attentions: tuple[str, ...] = option(
        ("sdpa", "fa2-triton"), "attention kernels", group=CELLS, flag="attention",
        choices=lmcore.attention_names, cpu=("naive", "sdpa"),
    )  # fmt: skip
    parallels: tuple[str, ...] = option(
        ("single", "ddp", "fsdp"), "parallel modes (single: one rank; the others --nproc)",
        group=CELLS, flag="parallel", choices=PARALLEL_MODES,
        parse=parse_name(command="bench-matrix", offered=PARALLEL_MODES), cpu=("single", "ddp"),
    )  # fmt: skip
    nproc: int = option(2, "ranks of every mode but single", group=CELLS)
    steps: int = option(50, "optimizer steps per cell", group=TRAINING, cpu=4)
    batch_size: int = option(32, "global batch (sequences per step)", group=TRAINING, cpu=8)
    context_length: int = option(256, "tokens per sequence", group=TRAINING, cpu=32)
    precision: str = option(
        "bf16-autocast", "precision of every cell", group=TRAINING, choices=PRECISIONS,
        parse=parse_name(command="bench-train", offered=PRECISIONS), cpu="fp32",
    )  # fmt: skip
    tokenizer: str = option(
        "bpe", "how text becomes tokens", group=TRAINING,
        choices=lambda: option_of(TrainConfig, "tokenizer").allowed(),
    )  # fmt: skip
    seed: int = option(0, "every cell's seed", group=TRAINING)
    compile: bool = option(
        False, "torch.compile every cell (bench-train --compile)", group=TRAINING
    )
    loss_tolerance: float = option(
        DEFAULT_LOSS_TOLERANCE, "relative difference of a cell's final loss from its reference "
        "cell's that is flagged", group=TRAINING,
    )  # fmt: skip

    def __post_init__(self) -> None:
        dims = {"size": self.sizes, "attention": self.attentions, "parallel": self.parallels}
        for name, values in dims.items():
            if not values or len(set(values)) != len(values):
                raise ValueError(f"--{name} takes distinct values, at least one")
        positive = ("nproc", "steps", "batch_size", "context_length")
        bad = [name for name in positive if getattr(self, name) < 1]
        if bad or not self.loss_tolerance > 0:
            raise ValueError(f"{', '.join(bad) or 'loss_tolerance'} must be positive")
        if self.nproc < 2 and any(p != "single" for p in self.parallels):
            raise ValueError("--nproc must be at least 2 for the parallel modes but single")

    @property
    def cells(self) -> list[tuple[str, str, str]]:
        """(size, attention, parallel) of every cell, in the order they run."""
        return [(s, a, p) for s in self.sizes for a in self.attentions for p in self.parallels]
