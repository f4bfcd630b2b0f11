"""Which rank this process is (read from `torchrun`'s environment), how long ranks may run, and
which device each process-group backend's ranks run on.

Plain Python (no torch), so that command lines and configurations can ask before anything heavy
is imported; `bench.core.launch`, which starts the ranks, re-exports all of it.
"""

from __future__ import annotations

import os

__all__ = [
    "BACKENDS",
    "DEFAULT_TIMEOUT_S",
    "DEVICE_TYPES",
    "is_primary",
    "torchrun_world_size",
    "under_torchrun",
]

# The device type each backend's ranks run on: gloo ranks share the CPU, nccl ranks own a GPU.
DEVICE_TYPES = {"gloo": "cpu", "nccl": "cuda"}
BACKENDS = tuple(DEVICE_TYPES)

# A launch runs until its ranks end: a training run may take hours, and a rank that hangs in a
# collective is already stopped by the process group's own timeout. A caller that wants a bound
# passes `timeout`.
DEFAULT_TIMEOUT_S: float | None = None
_TORCHRUN_VARS = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT")


def under_torchrun() -> bool:
    """True when this process was started by `torchrun` (its rendezvous variables are set)."""
    return all(name in os.environ for name in _TORCHRUN_VARS)


def torchrun_world_size() -> int | None:
    """The world size `torchrun` started, or None when not under torchrun."""
    return int(os.environ["WORLD_SIZE"]) if under_torchrun() else None


def is_primary() -> bool:
    """False only on the non-zero ranks of a `torchrun` launch: they should not print or write."""
    return not under_torchrun() or int(os.environ["RANK"]) == 0
