"""ZeRO: optimizer-state sharding (ZeRO-1) and fully sharded data parallelism (FSDP).

:class:`ShardedOptimizer` wraps an optimizer class so that each data-parallel rank keeps optimizer
state for its shard of the parameters only, steps that shard, and broadcasts the result;
:func:`partition_by_numel` is the balanced assignment of parameters to ranks it uses.
:class:`FSDP` wraps a module so that weights, gradients and optimizer state are all sharded, in
the dtypes a :class:`MixedPrecision` policy names; :func:`apply_fsdp` wraps a model and compiles
each of its units' forward, with FSDP's hooks outside the compiled code.
"""

from zero.apply import apply_fsdp
from zero.broadcast import DEFAULT_BUCKET_SIZE_MB
from zero.fsdp import FSDP
from zero.mixed_precision import MixedPrecision
from zero.partition import partition_by_numel
from zero.sharded_optimizer import ShardedOptimizer

# The package version; pyproject.toml reads it from here (hatch's version source).
__version__ = "0.1.0"

__all__ = [
    "DEFAULT_BUCKET_SIZE_MB",
    "FSDP",
    "MixedPrecision",
    "ShardedOptimizer",
    "apply_fsdp",
    "partition_by_numel",
]
