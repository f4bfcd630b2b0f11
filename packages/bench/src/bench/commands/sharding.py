"""bench-zero: memory and time of sharding (ZeRO-1 and FSDP) beside plain data parallelism.

`lmcore.TransformerLM` (XL by default), fp32, trained with AdamW on `--world-size` ranks (2 by
default; one process per GPU with NCCL, launched by the tool itself), batch 4 per rank at
context 128, in these variants:

- `ddp`: torch `DistributedDataParallel` + the unsharded optimizer (the baseline).
- `sharded`: torch DDP + `zero.ShardedOptimizer`, one row per `--zero-bucket-mb` cap (the cap on
  the parameters one post-step broadcast carries: 0 is one broadcast per parameter, `none` one
  per owner).
- `torch-zero`: torch DDP + torch's `ZeroRedundancyOptimizer`.
- `bucketed-sharded` (on request): `ddp.DDPBucketed` + `zero.ShardedOptimizer`.
- `fsdp`: `zero.FSDP` with one unit per `TransformerBlock` + the unsharded optimizer over the
  shards, one row per `--fsdp-dtypes` compute dtype (fp32; bf16: weights cast to bf16 before the
  all-gather, gradients reduced in bf16, fp32 masters and optimizer state).
- `fsdp-no-prefetch` (on request): `fsdp` gathering each unit only when needed, to measure
  what issuing the next unit's all-gather one unit ahead buys.
- `torch-fsdp`: torch's FSDP2, `fully_shard` on every `TransformerBlock` and at the root, one row
  per compute dtype (bf16: `MixedPrecisionPolicy(param_dtype=torch.bfloat16)`, whose gradients
  are reduced in bf16 too).

Per variant: peak memory (`torch.cuda.max_memory_allocated` after `reset_peak_memory_stats`)
after building the model, wrapper and optimizer; within a training step right before
`optimizer.step()` and right after it; the median step time over the timed steps (each step's
time is the slowest rank's); and a breakdown of the after-step peak into parameters, gradients
and optimizer state (the bytes of those tensors on the rank) and the rest (activations,
temporaries, DDP's communication buckets). Memory is the largest over the ranks. Ratios against
`ddp` are checked against the targets of ZeRO-1 at world size 2: optimizer state <= 0.55x, peak
<= 0.80x, step time <= 1.10x. `fsdp` rows are also compared with the `torch-fsdp` row of the same
compute dtype and checked against FSDP's targets: peak <= 1.05x torch-fsdp and (fp32) <= 0.60x
ddp, step time <= 1.10x torch-fsdp. For the FSDP variants, parameters and gradients are the
shards (gathered weights count as `other`).

With `fsdp-no-prefetch` beside `fsdp`, the notes say what prefetching buys: the step time and
peak of each compute dtype with and without it. `--trace DIR` runs one more step of every FSDP
row under torch.profiler and writes rank 0's Chrome trace (open it in Perfetto or
chrome://tracing) to `DIR/<variant>_<dtype>.pt.trace.json`; on CUDA the row's `gather_overlap`
is then the share of rank 0's all-gather kernel time during which a compute kernel ran too
(1: every all-gather beside compute; 0: none).

Without a GPU a tiny model runs on the CPU with gloo (and says so); memory is then the size of
the parameter, gradient and state tensors, since the CPU keeps no allocator statistics.

Examples::

    bench-zero --json zero.json --plot zero.png
    bench-zero --variants ddp sharded --zero-bucket-mb 0 25 none
    bench-zero --variants fsdp torch-fsdp --fsdp-dtypes fp32 bf16 --world-size 4
    bench-zero --variants fsdp fsdp-no-prefetch torch-fsdp --trace traces/   # + Chrome traces
"""

from __future__ import annotations

import argparse
from pathlib import Path

from bench.core.cli import Command, LazyChoices, bucket_size_mb
from bench.core.layouts import layout_names
from bench.core.training_options import add_training_args
from ddp import DEFAULT_BUCKET_SIZE_MB

__all__ = [
    "COMMAND",
    "COMPUTE_DTYPES",
    "DEFAULT_VARIANTS",
    "OPTIMIZERS",
    "VARIANTS",
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
OPTIMIZERS = LazyChoices(torch="torch.optim:AdamW", lmcore="lmcore:AdamW")


def add_options(parser: argparse.ArgumentParser) -> None:
    """bench-zero's options: the model and run of the training benchmarks, and the sharding."""
    _, run = add_training_args(parser, variants=VARIANTS, command="bench-zero")
    run.add_argument("--optimizer", choices=list(OPTIMIZERS), help="AdamW implementation (torch)")
    run.add_argument(
        "--zero-bucket-mb",
        type=bucket_size_mb,
        nargs="+",
        metavar="MB",
        help=f"ShardedOptimizer broadcast caps, a row each ({DEFAULT_BUCKET_SIZE_MB:g}; 0: one "
        "broadcast per parameter; none: one per rank)",
    )
    run.add_argument(
        "--fsdp-dtypes",
        nargs="+",
        choices=list(COMPUTE_DTYPES),
        help="compute dtypes of the fsdp and torch-fsdp rows, a row each (fp32 bf16)",
    )
    run.add_argument(
        "--trace",
        type=Path,
        metavar="DIR",
        help="a torch.profiler Chrome trace of one step of each FSDP row (rank 0's) in DIR",
    )


COMMAND = Command("bench-zero", __doc__, add_options=add_options, run="bench.tools.sharding:TOOL")
main = COMMAND.main
