"""bench-allreduce: time and bandwidth of all-reduce, gloo on the CPU and NCCL on GPUs (§2.1).

float32 tensors of 1 MB, 10 MB, 100 MB and 1 GB (MB = 10^6 bytes), filled with fresh random
values, are summed over 2, 4 and 6 ranks. Each (backend, world size) is one launch of that many
processes (`bench.core.launch`); inside it every size gets `--warmup` untimed all-reduces, then
`--steps` timed ones, each after a barrier so that the ranks start together: NCCL calls are timed
with CUDA events around the call, gloo calls (which block) with the host clock. Every rank's
times come back; an iteration takes as long as its slowest rank (a collective ends when its last
rank does), and the table shows the median over iterations with its spread, and:

- algorithm bandwidth `algbw = bytes / time`;
- bus bandwidth `busbw = algbw * 2 (n - 1) / n`, nccl-tests' convention for all-reduce (a ring
  all-reduce moves `2 (n - 1) / n` of the data over every link; NVIDIA/nccl-tests,
  doc/PERFORMANCE.md), which makes world sizes comparable with each other and with the link's
  speed. GB/s are 10^9 bytes per second.

Defaults: NCCL on each world size the GPUs allow, every size; gloo on each world size the CPU
cores allow, up to 100 MB (`--full` adds 1 GB and every world size: 1 GB on 6 gloo ranks takes
several GB of host memory and minutes). Without a GPU: gloo only, 1 MB and 10 MB on 2 ranks
(and says so). Under `torchrun` the world size is torchrun's.

Examples::

    bench-allreduce --json allreduce.json --plot allreduce.png
    bench-allreduce --backend gloo --sizes-mb 1 10 100 1000 --nproc 2 4 6 --full
    torchrun --nproc-per-node 4 -m bench allreduce --backend nccl   # ranks started by torchrun
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass

from bench.core.cli import Command, add_timeout_arg
from bench.core.options import Group, option
from bench.core.ranks import BACKENDS

__all__ = ["COMMAND", "AllReduceConfig", "add_options", "main"]

GRID = Group("grid")


@dataclass(frozen=True)
class AllReduceConfig:
    """What `bench.tools.allreduce.run_allreduce` measures: every backend × rank count × size;
    each field is the option of its name.

    Raises:
        ValueError: an unknown backend, an empty or non-positive size or rank count.
    """

    backends: tuple[str, ...] = option(
        BACKENDS,
        "gloo runs on the CPU, nccl one GPU per rank",
        group=GRID,
        flag="backend",
        choices=BACKENDS,
        cpu=("gloo",),
    )
    sizes_mb: tuple[float, ...] = option(
        (1.0, 10.0, 100.0, 1000.0),
        "tensor sizes in MB (10^6 bytes) of float32",
        group=GRID,
        cpu=(1.0, 10.0),
        metavar="MB",
    )
    world_sizes: tuple[int, ...] = option(
        (2, 4, 6), "numbers of ranks", group=GRID, flag="nproc", aliases=("world-sizes",), cpu=(2,)
    )
    warmup: int = option(
        5, "untimed all-reduces per size (connection set-up, NCCL's first-call tuning)", cpu=2
    )
    steps: int = option(20, "timed all-reduces per size", cpu=5)
    full: bool = option(False, "gloo at every size and rank count too (opt-in: slow)", group=GRID)

    def __post_init__(self) -> None:
        if not self.backends or not set(self.backends) <= set(BACKENDS):
            raise ValueError(f"backends must be non-empty, from {BACKENDS}; got {self.backends}")
        if not self.sizes_mb or any(not s > 0 for s in self.sizes_mb):
            raise ValueError(f"sizes_mb must be non-empty and positive, got {self.sizes_mb}")
        if not self.world_sizes or min(self.world_sizes) < 2:
            raise ValueError(f"world_sizes must be non-empty and >= 2, got {self.world_sizes}")
        if self.warmup < 0 or self.steps < 1:
            raise ValueError(f"need warmup >= 0 and steps >= 1, got {self.warmup}, {self.steps}")


def add_options(parser: argparse.ArgumentParser) -> None:
    """`--timeout`, the option that is no field of `AllReduceConfig`."""
    add_timeout_arg(parser, scope="per launch")


COMMAND = Command(
    "bench-allreduce",
    __doc__,
    config=AllReduceConfig,
    add_options=add_options,
    run="bench.tools.allreduce:TOOL",
)
main = COMMAND.main
