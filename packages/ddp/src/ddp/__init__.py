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

Levers for overlap beyond the bucket size: `DDPBucketed`'s `last_bucket_size_mb` (buckets that
shrink towards the end of backward), `register_reduced_hook` on the overlapped wrappers (work,
such as each bucket's optimizer step, run as each bucket lands) and `comm_group` (a process group
whose NCCL kernels take fewer SMs or a high-priority stream).

`CommStats` records what a step communicated and how long it waited; `nvtx_range` marks the
wrappers' (and the benchmarks') regions on profiler timelines.

`import ddp` imports no torch: the bucket vocabulary is plain Python, and each wrapper imports its
module (and torch) when first used.
"""

import importlib
from typing import Any

# Pure Python (no torch): imported with the package, so that a command line can read the bucket
# vocabulary without importing torch.
from ddp.buckets import DEFAULT_BUCKET_SIZE_MB, assign_buckets, bucket_bytes

# The wrappers need torch: each name is imported from its module on first use (PEP 562).
_LAZY: dict[str, tuple[str, ...]] = {
    "ddp.base": ("DataParallelBase", "DataParallelOptions", "UnusedGrads"),
    "ddp.bucketed": ("DDPBucketed",),
    "ddp.comm_group": ("CTA_POLICIES", "comm_group"),
    "ddp.flat": ("FlatDDP",),
    "ddp.individual": ("DDPIndividualParameters",),
    "ddp.naive": ("NaiveDDP",),
    "ddp.stats": ("CommStats", "nvtx_range"),
}
_MODULE_OF = {name: module for module, names in _LAZY.items() for name in names}


def __getattr__(name: str) -> Any:
    """Import a torch-backed name from its module the first time it is used, and keep it."""
    module = _MODULE_OF.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *_MODULE_OF})


# The package version; pyproject.toml reads it from here (hatch's version source).
__version__ = "0.1.0"

__all__ = [
    "CTA_POLICIES",
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
    "comm_group",
    "nvtx_range",
]
