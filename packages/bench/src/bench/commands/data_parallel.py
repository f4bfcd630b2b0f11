"""bench-ddp: time per training step and time spent communicating, for every `ddp` wrapper beside
torch's DistributedDataParallel (the handout's §2.2 to §2.3).

`lmcore.TransformerLM` (XL by default), fp32, context 128, batch 4 per rank, AdamW, on
`--nproc` ranks (2 by default; one process per GPU with NCCL, launched by the tool itself,
or under torchrun), in these variants, all in one launch so that they share the machine's state:

- `single`: the model alone on each rank, no communication: the compute-only baseline.
- `ddp:naive`, `ddp:flat`, `ddp:individual`: `ddp.NaiveDDP`, `ddp.FlatDDP`,
  `ddp.DDPIndividualParameters`.
- `ddp`: `ddp.DDPBucketed`, a row per `--bucket-mb` (1, 10, 100, 1000 MB; `none`: one
  bucket).
- `ddp:torch`: torch's `DistributedDataParallel`, a row per `--torch-bucket-mb` (its default
  `bucket_cap_mb`, 25 MB, and 100 MB). The default-cap row is the baseline of `vs_torch`.
- `all-reduce`: no training: one all-reduce of a flat fp32 buffer as large as all the model's
  gradients, alone on the machine: the communication cost the wrappers try to hide.

Every step is `bench.core.step.train_step` (forward, cross-entropy, backward,
`finish_gradient_synchronization()` for the `ddp` wrappers, `optimizer.step()`,
`zero_grad(set_to_none=False)`), timed between
device synchronisations; a step takes as long as its slowest rank, and the table shows medians
over the timed steps. Per variant:

- `step_ms` (and its spread), `overhead_ms` (beyond `single`), `vs_torch`;
- `wait_ms`: how long `finish_gradient_synchronization()` held training up (CUDA events around
  it): all of the communication for `naive` and `flat`, the exposed part of it for the
  overlapped wrappers;
- `comm_ms`: the summed time of the step's all-reduces, from NCCL's own timing (the ranks run
  with ``TORCH_NCCL_ENABLE_TIMING=1``; gloo does not time its collectives);
- `hidden`: the share of the all-reduce time overlapped with backward, `1 - wait_ms / comm_ms`.
  Collectives measured while they overlap backward run slower (they share the GPU with it), so
  this flatters the wrappers;
- `hidden_e2e`: the end-to-end figure, `1 - overhead_ms / all-reduce alone`: the share of a
  standalone all-reduce of the same gradient bytes (the `all-reduce` row, same run) that the
  step does not pay for. 1 is perfect overlap, 0 a step that pays the whole all-reduce on top of
  `single`, below 0 one that pays more than that.

`--trace DIR` runs one more step of every training row under torch.profiler and writes rank
0's Chrome trace to `DIR/<variant>.pt.trace.json` (a colon written as `-`, a bucket size after
the variant); on CUDA the row's `comm_overlap` is the share of its all-reduce kernel time that ran
beside compute kernels (bench-report draws each trace as a timeline of the two).

torch DDP waits inside backward, so only its step time and overhead are shown. The notes judge
DDPBucketed's best bucket size against torch DDP (step time <= 1.05x) and its most-hidden one
against the end-to-end targets (`hidden_e2e` >= 75 %, stretch 85 %). Without a GPU a tiny model
runs on 2 gloo CPU ranks (and says so).

Examples::

    bench-ddp --json ddp.json --plot ddp.png
    bench-ddp --variants single ddp ddp:torch --bucket-mb 1 10 100 1000
    bench-ddp --variants ddp:naive ddp:individual --trace traces/   # + Chrome traces
    torchrun --nproc-per-node 2 -m bench ddp --json ddp.json        # ranks started by torchrun
"""

from __future__ import annotations

import argparse
import math
from dataclasses import dataclass
from typing import ClassVar

import ddp
import lmcore
from bench.core.cli import Command, add_timeout_arg, bucket_size_mb
from bench.core.layouts import parse_name
from bench.core.options import option
from bench.core.training_bench import RUN, TrainingBenchConfig

__all__ = ["ALL_REDUCE", "COMMAND", "VARIANTS", "DDPBenchConfig", "add_options", "main"]

# The layouts compared (`bench.core.layouts`): the model alone on each rank, every ddp wrapper
# and torch's DDP; and the all-reduce of all gradients alone, which is no layout.
SINGLE, BUCKETED, TORCH_DDP = "single", "ddp", "ddp:torch"
ALL_REDUCE = "all-reduce"
LAYOUTS = (SINGLE, "ddp:naive", "ddp:flat", "ddp:individual", BUCKETED, TORCH_DDP)
VARIANTS = (*LAYOUTS, ALL_REDUCE)


def _torch_bucket_mb(text: str) -> float | None:
    """A `--torch-bucket-mb` value: torch DDP's `bucket_cap_mb`, `default` for its own."""
    if text == "default":
        return None
    value = bucket_size_mb(text)
    if value is None:  # torch DDP has no "one bucket"
        raise ValueError(text)
    return value


@dataclass(frozen=True)
class DDPBenchConfig(TrainingBenchConfig):
    """What `bench.tools.data_parallel.run_ddp` measures: the fields of
    `bench.core.training_bench.TrainingBenchConfig` and these, each the option of its name.

    Raises:
        ValueError: a bucket size ddp or torch refuses, or a variant without its sizes.
    """

    VARIANTS: ClassVar[tuple[str, ...]] = VARIANTS

    variants: tuple[str, ...] = option(
        VARIANTS,
        "what to compare, in the order they run",
        group=RUN,
        choices=VARIANTS,
        parse=parse_name(command="bench-ddp", offered=VARIANTS),
    )
    warmup: int = option(
        3, "untimed steps first (the first creates the optimizer state)", group=RUN, cpu=1
    )
    attention: str = option(
        lmcore.DEFAULT_ATTENTION, "lmcore attention backend", choices=lmcore.attention_names
    )
    bucket_sizes_mb: tuple[float | None, ...] = option(
        (1.0, 10.0, 100.0, 1000.0),
        "DDPBucketed bucket sizes, a row each (none: one bucket)",
        group=RUN,
        flag="bucket-mb",
        parse=bucket_size_mb,
        metavar="MB",
    )
    torch_bucket_mbs: tuple[float | None, ...] = option(
        (None, 100.0),
        "torch DDP bucket_cap_mb values, a row each; 'default' for its own",
        group=RUN,
        flag="torch-bucket-mb",
        parse=_torch_bucket_mb,
        default_text="default 100",
        metavar="MB",
    )
    trace_dir: str | None = option(
        None,
        "a torch.profiler Chrome trace of one step of each training row (rank 0's) in DIR",
        group=RUN,
        flag="trace",
        default_text="none",
        metavar="DIR",
    )

    def __post_init__(self) -> None:
        super().__post_init__()
        for size in self.bucket_sizes_mb:
            ddp.bucket_bytes(size)  # finite and >= 0, or None
        # torch turns the size into a whole number of bytes, so it must be finite.
        if any(b is not None and not 0 < b < math.inf for b in self.torch_bucket_mbs):
            raise ValueError(
                f"torch bucket sizes must be finite and > 0 or None, got {self.torch_bucket_mbs}"
            )
        if BUCKETED in self.variants and not self.bucket_sizes_mb:
            raise ValueError(f"the {BUCKETED} variant needs at least one bucket size")
        if TORCH_DDP in self.variants and not self.torch_bucket_mbs:
            raise ValueError(f"the {TORCH_DDP} variant needs at least one bucket_cap_mb")


def add_options(parser: argparse.ArgumentParser) -> None:
    """`--timeout`, the option that is no field of `DDPBenchConfig`."""
    add_timeout_arg(parser, scope="for all ranks")


COMMAND = Command(
    "bench-ddp",
    __doc__,
    config=DDPBenchConfig,
    add_options=add_options,
    run="bench.tools.data_parallel:TOOL",
)
main = COMMAND.main
