"""bench-zero: memory and time of sharding (ZeRO-1 and FSDP) beside plain data parallelism.

`lmcore.TransformerLM` (XL by default), fp32, trained with AdamW on `--nproc` ranks (2 by
default; one process per GPU with NCCL, launched by the tool itself), batch 4 per rank at
context 128, in these variants:

- `ddp:torch`: torch `DistributedDataParallel` + the unsharded optimizer (the baseline).
- `zero1:torch-ddp`: torch DDP + `zero.ShardedOptimizer`, one row per `--zero-bucket-mb` cap
  (the cap on the parameters one post-step broadcast carries: 0 is one broadcast per parameter,
  `none` one per owner).
- `zero1:torch`: torch DDP + torch's `ZeroRedundancyOptimizer`.
- `zero1` and `ddp` (on request): `ddp.DDPBucketed` + `zero.ShardedOptimizer` (a row per cap),
  or + the unsharded optimizer.
- `fsdp`: `zero.apply_fsdp` with a unit per `TransformerBlock`, the embedding and the LM head +
  the unsharded optimizer over the shards, one row per `--fsdp-dtypes` compute dtype over float32
  shards (fp32; bf16: weights cast to bf16 before the all-gather, gradients reduced in bf16, fp32
  masters and optimizer state), and with `--fsdp-storage bf16` one row of bf16 shards (the model
  stored in bf16, as the leaderboard's: weights, gradients and AdamW's moments in bf16, gathered
  and reduced in bf16).
- `fsdp:no-prefetch` (on request): `fsdp` gathering each unit only when needed, to measure
  what issuing the next unit's all-gather one unit ahead buys.
- `fsdp:torch`: torch's FSDP2, `fully_shard` on every `TransformerBlock` and at the root, one row
  per compute dtype (bf16: `MixedPrecisionPolicy(param_dtype=torch.bfloat16)`, whose gradients
  are reduced in bf16 too) and per storage dtype (bf16: the model stored in bf16, FSDP2's
  default policy).

(Before the one vocabulary of layouts these were `ddp`, `sharded`, `torch-zero`,
`bucketed-sharded`, `fsdp`, `fsdp-no-prefetch` and `torch-fsdp`; the old names still read, and
`ddp` now names DDPBucketed as in every command.)

Per variant: peak memory (`torch.cuda.max_memory_allocated` after `reset_peak_memory_stats`) after
building the model, wrapper and optimizer; within a training step right before `optimizer.step()`
and right after it; the median step time over the timed steps (each step's time is the slowest
rank's); and a breakdown of the after-step peak into parameters, gradients and optimizer state (the
bytes of those tensors on the rank) and the rest (activations, temporaries, DDP's communication
buckets). Memory is the largest over the ranks. Ratios against `ddp:torch` are checked against the
targets of ZeRO-1 at world size 2: optimizer state <= 0.55x, peak <= 0.80x, step time <= 1.10x.
`fsdp` rows are also compared with the `fsdp:torch` row of the same storage and compute dtypes and
checked against FSDP's targets: peak <= 1.05x fsdp:torch and (fp32) <= 0.60x ddp:torch, step time <=
1.10x fsdp:torch; with bf16 storage peak <= 1.00x and step time <= 0.80x fsdp:torch. For the FSDP
variants, parameters and gradients are the shards (gathered weights count as `other`).

With `fsdp:no-prefetch` beside `fsdp`, the notes say what prefetching buys: the step time and peak
of each compute dtype with and without it. `--trace DIR` runs one more step of every FSDP row under
torch.profiler and writes rank 0's Chrome trace (open it in Perfetto or chrome://tracing) to
`DIR/<variant>_<dtypes>.pt.trace.json` (a colon in the variant written as `-`; dtypes `fp32`,
`bf16` or `bf16-storage`); on CUDA the row's
`gather_overlap` is then the share of rank 0's all-gather kernel time during which a compute kernel
ran too (1: every all-gather beside compute; 0: none). `--memory-snapshot DIR` records the CUDA
allocator through the memory step (forward, backward, optimizer step) of every FSDP row and dumps
each rank's snapshot to `DIR/<variant>_<dtypes>_rank<r>.pickle` (open it in
https://pytorch.org/memory_viz: the blocks alive at the peak, each with the Python stack that
allocated it; nothing on the CPU).

Without a GPU a tiny model runs on the CPU with gloo (and says so); memory is then the size of
the parameter, gradient and state tensors, since the CPU keeps no allocator statistics.

Examples::

    bench-zero --json zero.json --plot zero.png
    bench-zero --variants ddp:torch zero1:torch-ddp --zero-bucket-mb 0 25 none
    bench-zero --variants fsdp fsdp:torch --fsdp-dtypes fp32 bf16 --nproc 4
    bench-zero --variants fsdp fsdp:torch --fsdp-dtypes bf16 --fsdp-storage fp32 bf16
    bench-zero --variants fsdp fsdp:no-prefetch fsdp:torch --trace traces/   # + Chrome traces
    bench-zero --variants fsdp fsdp:torch --fsdp-dtypes bf16 --fsdp-storage bf16 \
        --memory-snapshot snapshots/   # + allocator snapshots of the memory step
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass
from typing import ClassVar

from bench.core.cli import Command, LazyChoices, add_timeout_arg, bucket_size_mb
from bench.core.layouts import layout_names, parse_name
from bench.core.options import option
from bench.core.training_bench import RUN, TrainingBenchConfig
from ddp import DEFAULT_BUCKET_SIZE_MB, bucket_bytes

__all__ = [
    "COMMAND",
    "COMPUTE_DTYPES",
    "DEFAULT_VARIANTS",
    "OPTIMIZERS",
    "STORAGE_DTYPES",
    "VARIANTS",
    "ZeroBenchConfig",
    "add_options",
    "main",
]

# Our DDP wrappers but DDPBucketed, which bench-ddp compares: their memory is torch DDP's.
_UNSHARDED_DDP = ("ddp:naive", "ddp:flat", "ddp:individual")
# The layouts compared (`bench.core.layouts`): torch's DDP (the baseline of the ratios), our
# DDPBucketed, the three ZeRO-1 pairings, and the three FSDPs.
VARIANTS = layout_names(family=("ddp", "zero1", "fsdp"), runs=True, exclude=_UNSHARDED_DDP)
DEFAULT_VARIANTS = ("ddp:torch", "zero1:torch-ddp", "zero1:torch", "fsdp", "fsdp:torch")
COMPUTE_DTYPES = LazyChoices(fp32="torch:float32", bf16="torch:bfloat16")
# The dtypes FSDP's shards are kept in: float32 masters, or the model stored in bf16.
STORAGE_DTYPES = ("fp32", "bf16")
OPTIMIZERS = LazyChoices(torch="torch.optim:AdamW", lmcore="lmcore:AdamW")


@dataclass(frozen=True)
class ZeroBenchConfig(TrainingBenchConfig):
    """What `bench.tools.sharding.run_zero` measures: the fields of
    `bench.core.training_bench.TrainingBenchConfig` and these, each the option of its name.

    Raises:
        ValueError: an unknown optimizer or compute dtype, a cap ddp refuses, or none of them.
    """

    VARIANTS: ClassVar[tuple[str, ...]] = VARIANTS

    variants: tuple[str, ...] = option(
        DEFAULT_VARIANTS,
        "what to compare; ddp:torch is the baseline of the ratios",
        group=RUN,
        choices=VARIANTS,
        parse=parse_name(command="bench-zero", offered=VARIANTS),
    )
    optimizer: str = option("torch", "AdamW implementation", group=RUN, choices=list(OPTIMIZERS))
    bucket_sizes_mb: tuple[float | None, ...] = option(
        (DEFAULT_BUCKET_SIZE_MB,),
        "ShardedOptimizer broadcast caps, a row each (0: one broadcast per parameter; none: one "
        "per rank)",
        group=RUN,
        flag="zero-bucket-mb",
        parse=bucket_size_mb,
        metavar="MB",
    )
    fsdp_dtypes: tuple[str, ...] = option(
        tuple(COMPUTE_DTYPES),
        "compute dtypes of the FSDP rows, a row each",
        group=RUN,
        flag="fsdp-dtypes",
        choices=list(COMPUTE_DTYPES),
    )
    fsdp_storage: tuple[str, ...] = option(
        ("fp32",),
        "storage dtypes of the FSDP rows: fp32 (a row per compute dtype), bf16 (one row: the "
        "model stored in bf16, computed and reduced in bf16)",
        group=RUN,
        flag="fsdp-storage",
        choices=STORAGE_DTYPES,
    )
    trace_dir: str | None = option(
        None,
        "a torch.profiler Chrome trace of one step of each FSDP row (rank 0's) in DIR",
        group=RUN,
        flag="trace",
        default_text="none",
        metavar="DIR",
    )
    memory_snapshot_dir: str | None = option(
        None,
        "a CUDA allocator snapshot of the memory step of each FSDP row (every rank's) in DIR",
        group=RUN,
        flag="memory-snapshot",
        default_text="none",
        metavar="DIR",
    )

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.optimizer not in OPTIMIZERS:
            raise ValueError(
                f"optimizer must be one of {tuple(OPTIMIZERS)}, got {self.optimizer!r}"
            )
        if not self.bucket_sizes_mb:
            raise ValueError("bucket_sizes_mb must be non-empty")
        for size in self.bucket_sizes_mb:
            bucket_bytes(size)  # finite and >= 0, or None
        if not self.fsdp_dtypes or not set(self.fsdp_dtypes) <= set(COMPUTE_DTYPES):
            raise ValueError(
                f"fsdp_dtypes must be non-empty, from {tuple(COMPUTE_DTYPES)}; "
                f"got {self.fsdp_dtypes}"
            )
        if not self.fsdp_storage or not set(self.fsdp_storage) <= set(STORAGE_DTYPES):
            raise ValueError(
                f"fsdp_storage must be non-empty, from {STORAGE_DTYPES}; got {self.fsdp_storage}"
            )


def add_options(parser: argparse.ArgumentParser) -> None:
    """`--timeout`, the option that is no field of `ZeroBenchConfig`."""
    add_timeout_arg(parser, scope="for all ranks")


COMMAND = Command(
    "bench-zero",
    __doc__,
    config=ZeroBenchConfig,
    add_options=add_options,
    run="bench.tools.sharding:TOOL",
)
main = COMMAND.main
