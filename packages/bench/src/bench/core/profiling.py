"""Collectives beside compute, read off a profile: how much of a collective's kernel time ran
while a compute kernel ran too.

`collective_overlap(events, collective=...)` is pure: it takes the profiler's events
(`prof.events()`, or any objects with the same attributes) and returns the share of a
collective's kernel time (NCCL's all-gathers, say) spent beside compute, from the kernels'
device-side start and end times, so it is tested without a GPU. `traced_step` profiles one step
on rank 0 and returns that share (bench-ddp and bench-zero); `merged_spans`, `covered`,
`shared_time` and `overlap_share` are its interval arithmetic, which bench-report applies to a
recorded trace. `device_time(kernels, window=...)` splits a stretch of wall time (a phase of a
step) into compute, communication, the communication no compute hid (exposed) and idle time
(bench-step's `--profile`). bench-model's kernel tables, which read the same events, are
`bench.tools.model.profile`.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from bench.core.timing import elapsed_ms

__all__ = [
    "COLLECTIVE_OPS",
    "COPY_KERNELS",
    "NCCL_KERNELS",
    "DeviceTime",
    "collective_overlap",
    "covered",
    "device_kernels",
    "device_time",
    "is_communication",
    "is_range",
    "merged_spans",
    "on_cpu",
    "overlap_share",
    "profiler_activities",
    "shared_time",
    "traced_step",
]

# NCCL names its kernels `ncclDevKernel_AllGather_RING_LL(...)` (older: `ncclKernel_...`);
# copies and fills are the copy engines' or trivial, neither communication nor compute.
NCCL_KERNELS = re.compile(r"^nccl", re.IGNORECASE)
COPY_KERNELS = re.compile(r"^(memcpy|memset)", re.IGNORECASE)
# CPU operators of a collective: c10d's calls that enqueue or wait for one, the profiler's mark
# of each (`record_param_comms`), NCCL's and gloo's own ranges (gloo runs the collective on its
# threads: on a CPU these are the communication).
COLLECTIVE_OPS = re.compile(r"^(c10d::|record_param_comms|nccl:|gloo:)")

Span = tuple[float, float]


def is_range(event: Any) -> bool:
    """Whether a profiler event is a `record_function` range (not work)."""
    return bool(getattr(event, "is_user_annotation", False))


def on_cpu(event: Any) -> bool:
    """Whether a profiler event is the CPU side of an event (not its device-side copy)."""
    return str(getattr(event, "device_type", "CPU")).rsplit(".", 1)[-1] == "CPU"


def profiler_activities(device: torch.device) -> list[torch.profiler.ProfilerActivity]:
    """What `torch.profiler` records for a step on `device`: the CPU, and CUDA's kernels."""
    activities = [torch.profiler.ProfilerActivity.CPU]
    if device.type == "cuda":
        activities.append(torch.profiler.ProfilerActivity.CUDA)
    return activities


def is_communication(name: str) -> bool:
    """Whether a kernel (NCCL's) or a CPU operator (c10d's, gloo's) is communication."""
    return bool(NCCL_KERNELS.match(name) or COLLECTIVE_OPS.match(name))


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
        if NCCL_KERNELS.match(e.name):
            if collective.lower() in e.name.lower():
                comm.append(span)
        elif not COPY_KERNELS.match(e.name):
            compute.append(span)
    return overlap_share(comm, compute)


def covered(spans: Iterable[Span]) -> float:
    """The time `spans` cover, overlapping ones counted once."""
    return sum(end - start for start, end in merged_spans(spans))


def shared_time(a: Iterable[Span], b: Iterable[Span]) -> float:
    """The time covered by some interval of `a` and some interval of `b` at once (each set
    merged first): one sweep over both sorted lists."""
    a, b = merged_spans(a), merged_spans(b)
    shared, i, j = 0.0, 0, 0
    while i < len(a) and j < len(b):
        shared += max(0.0, min(a[i][1], b[j][1]) - max(a[i][0], b[j][0]))
        if a[i][1] <= b[j][1]:
            i += 1
        else:
            j += 1
    return shared


def overlap_share(comm: Iterable[Span], compute: Iterable[Span]) -> float | None:
    """The share of the time covered by the `comm` intervals during which some `compute`
    interval runs as well (intervals `(start, end)` in one unit, overlapping ones merged); None
    when `comm` covers no time."""
    comm = merged_spans(comm)
    total = covered(comm)
    return shared_time(comm, compute) / total if total else None


@dataclass(frozen=True)
class DeviceTime:
    """How a stretch of wall time (a phase of a step) was spent on the device, in ms.

    Attributes:
        wall_ms: the stretch itself.
        kernel_ms: the compute kernels' summed durations (every kernel but NCCL's, copies and
            fills), on whatever stream: more than `busy_ms` where streams ran side by side.
        busy_ms: the time some compute kernel ran (their intervals' union).
        comm_ms: the time some communication kernel ran (their union).
        exposed_comm_ms: the communication no compute ran beside: `comm_ms` less its
            intersection with the compute kernels' union.
        idle_ms: the time no kernel at all ran (compute, communication, copy or fill): the
            device waiting for the host.
    """

    wall_ms: float
    kernel_ms: float
    busy_ms: float
    comm_ms: float
    exposed_comm_ms: float
    idle_ms: float


def device_kernels(events: Sequence[Any]) -> list[tuple[str, float, float]]:
    """`(name, start, end)` (µs) of every device-side kernel, copy and fill in `prof.events()`
    (the device-side copies of ranges left out)."""
    return [
        (e.name, e.time_range.start, e.time_range.end)
        for e in events
        if not on_cpu(e) and not is_range(e)
    ]


def device_time(kernels: Iterable[tuple[str, float, float]], *, window: Span) -> DeviceTime:
    """How the device spent `window`, from its kernels' `(name, start, end)` (µs).

    A kernel belongs to the window when it starts inside it and is cut at its end: a window
    whose end synchronised the device (bench-step's phases) holds exactly the kernels launched
    in it. Compute is every kernel but NCCL's (`NCCL_KERNELS`) and copies and fills
    (`COPY_KERNELS`); see `DeviceTime` for each number.

    Example::

        t = device_time([("gemm", 0, 60), ("ncclDevKernel_AllGather", 40, 100)],
                        window=(0, 120))
        t.exposed_comm_ms  # 0.04: 60-100 µs ran beside no compute
    """
    start, end = window
    compute: list[Span] = []
    comm: list[Span] = []
    other: list[Span] = []
    for name, k_start, k_end in kernels:
        if not start <= k_start < end:
            continue
        span = (k_start, min(k_end, end))
        if NCCL_KERNELS.match(name):
            comm.append(span)
        elif COPY_KERNELS.match(name):
            other.append(span)
        else:
            compute.append(span)
    busy, communicating = covered(compute), covered(comm)
    return DeviceTime(
        wall_ms=(end - start) / 1e3,
        kernel_ms=sum(e - s for s, e in compute) / 1e3,
        busy_ms=busy / 1e3,
        comm_ms=communicating / 1e3,
        exposed_comm_ms=(communicating - shared_time(comm, compute)) / 1e3,
        idle_ms=(end - start - covered(compute + comm + other)) / 1e3,
    )


def traced_step(
    step: Callable[[], Any], path: Path, *, rank: int, device: torch.device, collective: str
) -> float | None:
    """One more step, under torch.profiler on rank 0 (the others just step): its Chrome trace
    goes to `path`; the share of `collective`'s kernel time beside compute comes back (see
    `collective_overlap`; None on the other ranks and off CUDA)."""
    if rank != 0:
        elapsed_ms(step, device=device)
        return None
    with torch.profiler.profile(activities=profiler_activities(device)) as prof:
        elapsed_ms(step, device=device)  # synchronises: every kernel is in the trace
    path.parent.mkdir(parents=True, exist_ok=True)
    prof.export_chrome_trace(str(path))
    return collective_overlap(prof.events(), collective=collective)
