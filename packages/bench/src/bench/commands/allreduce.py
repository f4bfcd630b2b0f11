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
    bench-allreduce --backend gloo --sizes-mb 1 10 100 1000 --world-sizes 2 4 6 --full
    torchrun --nproc-per-node 4 -m bench allreduce --backend nccl   # ranks started by torchrun
"""

from __future__ import annotations

import argparse

from bench.core.cli import Command, add_timeout_arg, add_timing_args
from bench.core.ranks import BACKENDS

__all__ = ["COMMAND", "add_options", "main"]


def add_options(parser: argparse.ArgumentParser) -> None:
    """bench-allreduce's options: the grid, the time limit and the timing."""
    grid = parser.add_argument_group("grid")
    grid.add_argument("--backend", nargs="+", choices=BACKENDS, help="gloo, nccl (both on GPUs)")
    grid.add_argument("--sizes-mb", type=float, nargs="+", metavar="MB", help="1 10 100 1000")
    grid.add_argument("--world-sizes", type=int, nargs="+", metavar="N", help="2 4 6")
    grid.add_argument(
        "--full", action="store_true", help="gloo at every size and world size (opt-in: slow)"
    )
    add_timeout_arg(parser, scope="per launch")
    add_timing_args(parser, warmup=None, steps=None)


COMMAND = Command(
    "bench-allreduce", __doc__, add_options=add_options, run="bench.tools.allreduce:TOOL"
)
main = COMMAND.main
