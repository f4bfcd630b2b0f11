"""Device memory: peak and current allocation on CUDA; `None` on devices that do not track it.

Numbers are bytes allocated by PyTorch's caching allocator for tensors (what
`torch.cuda.max_memory_allocated` reports), not the larger amount the allocator has reserved
from the driver. On the CPU PyTorch keeps no such counters, so every reading is `None` and tables
show an empty cell rather than a made-up number.

Example::

    reset_peak_memory(device)
    loss = model(x).sum()
    loss.backward()
    print(to_mib(peak_memory(device)))
"""

from __future__ import annotations

import contextlib
import gc
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

import torch
from torch.utils._python_dispatch import is_traceable_wrapper_subclass

__all__ = [
    "GIB",
    "MIB",
    "free_memory",
    "memory_in_use",
    "peak_memory",
    "recording_memory",
    "reset_peak_memory",
    "tensor_bytes",
    "to_mib",
]

MIB = 1 << 20  # bytes per mebibyte; tables report MiB
GIB = 1 << 30  # bytes per gibibyte
# Allocator events kept while recording a memory snapshot: enough for several training steps
# of the largest model (each step allocates a few thousand blocks per layer).
SNAPSHOT_MAX_ENTRIES = 1_000_000


def _is_cuda(device: torch.device | str) -> bool:
    return torch.device(device).type == "cuda"


def reset_peak_memory(device: torch.device | str) -> None:
    """Start a new peak-memory window on `device` (a no-op where memory is not tracked)."""
    if _is_cuda(device):
        torch.cuda.synchronize(device)
        torch.cuda.reset_peak_memory_stats(device)


def peak_memory(device: torch.device | str) -> int | None:
    """Most bytes allocated at once since the last `reset_peak_memory`; None off CUDA."""
    if not _is_cuda(device):
        return None
    torch.cuda.synchronize(device)
    return torch.cuda.max_memory_allocated(device)


@contextlib.contextmanager
def recording_memory(path: Path | None, device: torch.device) -> Iterator[None]:
    """Record the CUDA allocator's history inside the block and dump its snapshot to `path`.

    The pickle opens in https://pytorch.org/memory_viz (every allocation and free, with the
    Python stack that made it, and the blocks alive at any moment, the peak included). A no-op
    when `path` is None or off CUDA.
    """
    if path is None or not _is_cuda(device):
        yield
        return
    # Python frames only: they name the forward's and the optimizer's allocations; C++ stacks
    # would name the backward's too (autograd runs it on a thread without Python frames), but
    # symbolising them makes dumping a large model's snapshot take minutes.
    torch.cuda.memory._record_memory_history(
        max_entries=SNAPSHOT_MAX_ENTRIES, context="all", stacks="python"
    )
    try:
        yield
        path.parent.mkdir(parents=True, exist_ok=True)
        torch.cuda.memory._dump_snapshot(str(path))
    finally:
        torch.cuda.memory._record_memory_history(enabled=None)


def memory_in_use(device: torch.device | str) -> int | None:
    """Bytes held by live tensors on `device` right now; None off CUDA."""
    if not _is_cuda(device):
        return None
    return torch.cuda.memory_allocated(device)


def free_memory(device: torch.device | str) -> None:
    """Collect garbage and hand cached blocks back, so the next measurement starts clean.

    Call it after dropping references (e.g. after an out-of-memory error, whose traceback holds
    frames that hold tensors).
    """
    gc.collect()
    if _is_cuda(device):
        torch.cuda.synchronize(device)
        torch.cuda.empty_cache()


def to_mib(num_bytes: int | None) -> float | None:
    """Bytes to MiB, passing None through (so CPU rows stay empty instead of failing)."""
    return None if num_bytes is None else num_bytes / MIB


def tensor_bytes(tensors: Iterable[Any], device: torch.device | str) -> int:
    """Bytes of the distinct tensors among `tensors` that live on `device` (shared storage once).

    A DTensor (torch FSDP2's parameters, gradients and optimizer state) counts its local shard;
    anything that is not a tensor (None, a step count kept as a number) counts nothing.
    """
    device = torch.device(device)
    seen: dict[int, int] = {}
    for t in tensors:
        if is_traceable_wrapper_subclass(t) and hasattr(t, "to_local"):
            t = t.to_local()
        on_device = isinstance(t, torch.Tensor) and t.device.type == device.type
        if on_device and device.index in (None, t.device.index):
            seen[t.untyped_storage().data_ptr()] = t.untyped_storage().nbytes()
    return sum(seen.values())
