"""Data-parallel training wrappers, small enough to read and exact enough to trust.

Four ways to average gradients over ranks, from the simplest to the one that hides most of the
communication behind backward; all share one contract (`DataParallelBase`):

- `NaiveDDP`: after backward, one blocking all-reduce per gradient.
- `FlatDDP`: after backward, one all-reduce of all gradients in one flat buffer.
- `DDPIndividualParameters`: each gradient's all-reduce launched from its hook during backward.
- `DDPBucketed`: gradients grouped into buckets (`assign_buckets`), each bucket's all-reduce
  launched during backward as soon as it is full.

Bucket sizes speak one vocabulary (shared with `zero.ShardedOptimizer`): `bucket_size_mb` in MiB,
`None` for one bucket, `0` for one per parameter, `DEFAULT_BUCKET_SIZE_MB` (25) by default;
`bucket_bytes` validates a size and `assign_buckets` is the greedy plan.

`CommStats` records what a step communicated and how long it waited; `nvtx_range` marks the
wrappers' (and the benchmarks') regions on profiler timelines.
"""

from ddp.base import DataParallelBase, DataParallelOptions, UnusedGrads
from ddp.bucketed import DDPBucketed
from ddp.buckets import DEFAULT_BUCKET_SIZE_MB, assign_buckets, bucket_bytes
from ddp.flat import FlatDDP
from ddp.individual import DDPIndividualParameters
from ddp.naive import NaiveDDP
from ddp.stats import CommStats, nvtx_range

# The package version; pyproject.toml reads it from here (hatch's version source).
__version__ = "0.1.0"

__all__ = [
    "DEFAULT_BUCKET_SIZE_MB",
    "CommStats",
    "DDPBucketed",
    "DDPIndividualParameters",
    "DataParallelBase",
    "DataParallelOptions",
    "FlatDDP",
    "NaiveDDP",
    "UnusedGrads",
    "assign_buckets",
    "bucket_bytes",
    "nvtx_range",
]
