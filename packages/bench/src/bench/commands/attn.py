"""bench-attn: attention alone, implementation beside implementation (the handout's §1.2 study).

Single-head attention (batch 8, no head dimension) over a grid of head sizes d and sequence
lengths: the time of a forward call, the time of a backward call, the memory in use before the
backward (inputs, output and everything autograd saved), and the peak. Implementations:

- `naive`: plain PyTorch, the full score matrix materialised (`lmcore` backend `naive`).
- `compiled`: the same function through `torch.compile` (one static compilation per shape).
- `fa2-pytorch`, `fa2-triton`: FlashAttention-2 from the `fa2` package.
- `sdpa`: `torch.nn.functional.scaled_dot_product_attention`, the baseline of the ratios.

`--seq-k` makes the shapes rectangular: each query length (`--seq`) runs against keys and values
of each of these lengths (a decode step, a prefill against a cache), top-left aligned when
causal, as SDPA's `is_causal` (query i sees keys 0..i). The forward is timed with autograd
recording, as in training. The backward is timed alone: each
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
    bench-attn --seq 128 1024 4096 --seq-k 128 1024 4096 --impls fa2-triton sdpa --plot attn.png
                                                # a rectangular grid, and its fa2/SDPA heatmap
"""

from __future__ import annotations

import argparse
from dataclasses import asdict, dataclass
from typing import Any

from bench.core.cli import Command, LazyChoices
from bench.core.options import Group, option

__all__ = [
    "COMMAND",
    "DTYPES",
    "GRIDS",
    "HANDOUT_GRID",
    "IMPLS",
    "AttnConfig",
    "add_options",
    "grid_fields",
    "main",
]

IMPLS = ("naive", "compiled", "fa2-pytorch", "fa2-triton", "sdpa")
DTYPES = LazyChoices(fp32="torch:float32", bf16="torch:bfloat16", fp16="torch:float16")
GRIDS = ("default", "handout")

# The GPU default: the cells that tell the story (fa2 against SDPA and naive) in about a minute.
GPU_D_VALUES = (64, 128)
GPU_SEQS = (1024, 4096, 16384)
GPU_IMPLS = ("naive", "fa2-triton", "sdpa")
# The handout's grid (§1.2.1): batch 8, d in {16, 32, 64, 128}, seq in {256, ..., 16384}.
HANDOUT_D_VALUES = (16, 32, 64, 128)
HANDOUT_SEQS = (256, 1024, 4096, 8192, 16384)
# The CPU default: small enough that the whole grid runs in seconds on two cores.
CPU_D_VALUES = (16, 32)
CPU_SEQS = (64, 128)
CPU_IMPLS = ("naive", "fa2-pytorch", "fa2-triton", "sdpa")
# Time a cell takes beyond its timed calls, for the estimate printed up front: warm-up calls and
# the first call's build (a Triton kernel or a compiled graph per shape). An allowance, not a
# measurement: the estimate is an order of magnitude.
CELL_OVERHEAD_S = 1.0

GRID = Group("grid", "the cells measured")
TIMING = Group("timing", "how long each cell is timed")


@dataclass(frozen=True)
class AttnConfig:
    """What `bench.tools.attn.run_attention` measures; each field is the option of its name.

    Raises:
        ValueError: an unknown implementation or dtype, a repeated implementation, a size that
            is not positive, or an empty grid.
    """

    batch: int = option(8, "batch size (the handout's)", group=GRID)
    d_values: tuple[int, ...] = option(
        GPU_D_VALUES, "head sizes", group=GRID, flag="d", cpu=CPU_D_VALUES
    )
    seqs: tuple[int, ...] = option(
        GPU_SEQS, "sequence lengths (of the queries, with --seq-k)", group=GRID, flag="seq",
        cpu=CPU_SEQS,
    )  # fmt: skip
    seq_ks: tuple[int, ...] = option(
        (), "key/value lengths: each query length against each", group=GRID, flag="seq-k",
        default_text="each query length's own (square)",
    )  # fmt: skip
    impls: tuple[str, ...] = option(
        GPU_IMPLS, "implementations", group=GRID, choices=IMPLS, cpu=CPU_IMPLS
    )
    dtype: str = option(
        "fp32", "the inputs' dtype (the handout's fp32)", group=GRID, choices=list(DTYPES)
    )
    causal: bool = option(False, "causal masking (the handout's study is not)", group=GRID)
    steps: int = option(
        20, "timed forward calls and timed backward calls per cell", group=TIMING, cpu=5
    )
    warmup: int = option(
        3,
        "untimed calls first (compilation, autotuning, allocator growth)",
        group=TIMING,
        cpu=1,
    )
    max_seconds: float = option(
        1.0,
        "time budget of one cell's timed forward calls (and again of its backward calls); "
        "--steps is cut to fit, to no fewer than 3 calls, and so are the warm-up calls (to a "
        "quarter of it)",
        group=TIMING,
        cpu=2.0,
        metavar="S",
    )

    def __post_init__(self) -> None:
        unknown = sorted(set(self.impls) - set(IMPLS))
        if unknown or len(set(self.impls)) != len(self.impls):
            raise ValueError(
                f"impls must be distinct names from {list(IMPLS)}, got {list(self.impls)}"
            )
        if self.dtype not in DTYPES:
            raise ValueError(f"dtype must be one of {list(DTYPES)}, got {self.dtype!r}")
        positive = {"batch": self.batch, "steps": self.steps, "max_seconds": self.max_seconds}
        positive.update({f"d={d}": d for d in self.d_values})
        positive.update({f"seq={s}": s for s in (*self.seqs, *self.seq_ks)})
        bad = [name for name, value in positive.items() if not value > 0]
        if bad or self.warmup < 0 or not self.d_values or not self.seqs or not self.impls:
            raise ValueError(
                "batch, steps, max_seconds, every d and seq must be positive, warmup >= 0, and "
                f"d_values, seqs, impls non-empty; got {self}"
            )

    def key_lengths(self, seq: int) -> tuple[int, ...]:
        """The key lengths a query length runs against: `seq_ks`, or its own length."""
        return self.seq_ks or (seq,)

    @property
    def num_cells(self) -> int:
        """Measurements in the grid: d values × query lengths × key lengths × implementations."""
        return len(self.d_values) * len(self.seqs) * len(self.seq_ks or (1,)) * len(self.impls)

    def estimate_s(self) -> float:
        """An upper estimate of the run's time in seconds: per cell, both passes' budgets and
        `CELL_OVERHEAD_S` for warm-up and building."""
        return self.num_cells * (2 * self.max_seconds + CELL_OVERHEAD_S)


# The handout's whole grid (`--grid handout`): its five implementations and 100 timed calls;
# 2 s per pass keeps a cell's timing under 4 s (naive fp32 at 16k times fewer calls).
HANDOUT_GRID = AttnConfig(
    d_values=HANDOUT_D_VALUES, seqs=HANDOUT_SEQS, impls=IMPLS, steps=100, warmup=10, max_seconds=2.0
)


def grid_fields(args: argparse.Namespace, given: dict[str, Any]) -> dict[str, Any]:
    """The fields `--grid` sets, the options `given` applied over them."""
    return {**(asdict(HANDOUT_GRID) if args.grid == "handout" else {}), **given}


def add_options(parser: argparse.ArgumentParser) -> None:
    """`--grid`, the option that is no field of `AttnConfig`."""
    parser.add_argument(
        "--grid",
        choices=GRIDS,
        help="default: the story in about a minute on a GPU; handout: the handout's whole grid",
    )


COMMAND = Command(
    "bench-attn", __doc__, config=AttnConfig, add_options=add_options, run="bench.tools.attn:TOOL"
)
main = COMMAND.main
