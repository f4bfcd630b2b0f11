"""Collectives beside compute, read off a profile: how much of a collective's kernel time ran
while a compute kernel ran too.

`collective_overlap(events, collective=...)` is pure: it takes the profiler's events
(`prof.events()`, or any objects with the same attributes) and returns the share of a
collective's kernel time (NCCL's all-gathers, say) spent beside compute, from the kernels'
device-side start and end times, so it is tested without a GPU. `traced_step` profiles one step
on rank 0 and returns that share (bench-ddp and bench-zero); `merged_spans` and `overlap_share`
are its interval arithmetic, which bench-report applies to a recorded trace. bench-model's
kernel tables, which read the same events, are `bench.tools.model.profile`.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import Any

import torch

from bench.core.timing import elapsed_ms

__all__ = [
    "collective_overlap",
    "is_range",
    "merged_spans",
    "on_cpu",
    "overlap_share",
    "traced_step",
]

# NCCL names its kernels `ncclDevKernel_AllGather_RING_LL(...)` (older: `ncclKernel_...`);
# copies and fills are the copy engines' or trivial, neither communication nor compute.
_NCCL = re.compile(r"^nccl", re.IGNORECASE)
_NOT_COMPUTE = re.compile(r"^(memcpy|memset)", re.IGNORECASE)


def is_range(event: Any) -> bool:
    """Whether a profiler event is a `record_function` range (not work)."""
    return bool(getattr(event, "is_user_annotation", False))


def on_cpu(event: Any) -> bool:
    """Whether a profiler event is the CPU side of an event (not its device-side copy)."""
    return str(getattr(event, "device_type", "CPU")).rsplit(".", 1)[-1] == "CPU"


def merged_spans(spans: Iterable[tuple[float, float]]) -> list[tuple[float, float]]:
    """Disjoint intervals covering the same time as `spans`, in order."""
    out: list[tuple[float, float]] = []
    for start, end in sorted(spans):
        if out and start <= out[-1][1]:
            out[-1] = (out[-1][0], max(out[-1][1], end))
        else:
            out.append((start, end))
    return out


def collective_overlap(events: Sequence[Any], *, collective: str) -> float | None:
    """The share of `collective`'s kernel time during which a compute kernel ran as well.

    Kernels are the device-side events of `prof.events()` (`device_type` CUDA, not ranges):
    the collective's are the NCCL kernels whose name contains `collective` (`AllGather`,
    `ReduceScatter`, `AllReduce`); compute is every kernel that is neither NCCL's nor a copy or
    fill. 1 means the collective ran entirely beside compute (hidden if compute never waited
    for it), 0 entirely alone.

    Args:
        events: the profiler's events (objects with `name`, `device_type`,
            `is_user_annotation` and `time_range.start/.end` in µs).
        collective: part of the NCCL kernel's name, e.g. `AllGather`.

    Returns:
        The share in [0, 1]; None when no such collective kernel ran (a CPU profile, gloo).

    Example::

        share = collective_overlap(prof.events(), collective="AllGather")
    """
    comm, compute = [], []
    for e in events:
        if on_cpu(e) or is_range(e):
            continue
        span = (e.time_range.start, e.time_range.end)
        if _NCCL.match(e.name):
            if collective.lower() in e.name.lower():
                comm.append(span)
        elif not _NOT_COMPUTE.match(e.name):
            compute.append(span)
    return overlap_share(comm, compute)


def overlap_share(
    comm: Iterable[tuple[float, float]], compute: Iterable[tuple[float, float]]
) -> float | None:
    """The share of the time covered by the `comm` intervals during which some `compute`
    interval runs as well (intervals `(start, end)` in one unit, overlapping ones merged); None
    when `comm` covers no time."""
    comm, compute = merged_spans(comm), merged_spans(compute)
    total = sum(end - start for start, end in comm)
    if not total:
        return None
    shared = 0.0
    for start, end in comm:
        for c_start, c_end in compute:
            shared += max(0.0, min(end, c_end) - max(start, c_start))
    return shared / total


def traced_step(
    step: Callable[[], Any], path: Path, *, rank: int, device: torch.device, collective: str
) -> float | None:
    """One more step, under torch.profiler on rank 0 (the others just step): its Chrome trace
    goes to `path`; the share of `collective`'s kernel time beside compute comes back (see
    `collective_overlap`; None on the other ranks and off CUDA)."""
    if rank != 0:
        elapsed_ms(step, device=device)
        return None
    activities = [torch.profiler.ProfilerActivity.CPU]
    if device.type == "cuda":
        activities.append(torch.profiler.ProfilerActivity.CUDA)
    with torch.profiler.profile(activities=activities) as prof:
        elapsed_ms(step, device=device)  # synchronises: every kernel is in the trace
    path.parent.mkdir(parents=True, exist_ok=True)
    prof.export_chrome_trace(str(path))
    return collective_overlap(prof.events(), collective=collective)
