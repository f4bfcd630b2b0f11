"""Data-parallel training wrappers, small enough to read and exact enough to trust.

Four ways to average gradients over ranks, from the simplest to the one that hides most of the
communication behind backward; all share one contract (`DataParallelBase`):

- `NaiveDDP`: after backward, one blocking all-reduce per gradient.
- `FlatDDP`: after backward, one all-reduce of all gradients in one flat buffer.
- `DDPIndividualParameters`: each gradient's all-reduce launched from its hook during backward.
- `DDPBucketed`: gradients grouped into buckets (`assign_buckets`), each bucket's all-reduce
  launched during backward as soon as it is full.

`CommStats` records what a step communicated and how long it waited.
"""

from ddp.base import DataParallelBase, DataParallelOptions, UnusedGrads
from ddp.bucketed import DDPBucketed
from ddp.buckets import assign_buckets
from ddp.flat import FlatDDP
from ddp.individual import DDPIndividualParameters
from ddp.naive import NaiveDDP
from ddp.stats import CommStats

# The package version; pyproject.toml reads it from here (hatch's version source).
__version__ = "0.1.0"

__all__ = [
    "CommStats",
    "DDPBucketed",
    "DDPIndividualParameters",
    "DataParallelBase",
    "DataParallelOptions",
    "FlatDDP",
    "NaiveDDP",
    "UnusedGrads",
    "assign_buckets",
]
