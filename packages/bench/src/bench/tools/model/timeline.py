"""An offline view of a CUDA memory snapshot: allocated memory over time, and the largest blocks.

`torch.cuda.memory._dump_snapshot` writes a pickle that PyTorch's web viewer
(pytorch.org/memory_viz) draws. This module draws the part one needs most, without uploading
anything: a PNG timeline of the memory held by live tensors, built from the snapshot's allocator
trace, plus a list of the largest allocations with the code that made them.

The snapshot format (see `torch.cuda.memory._snapshot`): `{"segments": [...],
"device_traces": [[entry, ...] per device]}`, each trace entry a dict with `action` (`alloc`,
`free_requested`, `free_completed`, `segment_alloc`, `segment_free`, `oom`, `snapshot`), `addr`,
`size`, `frames` (`[{"filename", "line", "name"}]`, innermost first) and, in recent PyTorch,
`time_us`. Memory allocated before recording started is not in the trace; it is recovered from
the blocks still allocated at the end (`segments[*].blocks`, state `active_allocated`).

Example::

    torch.cuda.memory._record_memory_history(max_entries=1_000_000)
    train_step()
    torch.cuda.memory._dump_snapshot("step.pickle")
    summary = render_memory_snapshot("step.pickle", "step.png")
"""

from __future__ import annotations

import os
import pickle
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bench.core.memory import MIB

__all__ = ["Allocation", "SnapshotSummary", "memory_timeline", "render_memory_snapshot"]

_FREED = "free_completed"  # when the allocator can reuse a block: what `memory_allocated` counts
_TORCH_DIRS = ("/torch/", "\\torch\\")  # frames inside PyTorch say less than the caller's
# C++ frame names: an autograd node's `apply`, an ATen operator's entry, and the frames every
# allocation shares (the stack unwinder, the caching allocator, c10 helpers) that say nothing.
_AUTOGRAD_NODE = re.compile(r"torch::autograd::generated::(\w+)::apply")
_ATEN_OP = re.compile(r"at::_ops::(\w+)::")
# An allocation without frames: recorded with Python stacks only, that is the autograd engine's
# thread (backward) or C++ code called without Python on the stack.
_NO_FRAME = "no Python frame (backward, or C++)"
_INTERNAL = re.compile(r"unwind|CachingAllocator|c10::|^\?\?$|^$")


@dataclass(frozen=True)
class Allocation:
    """One allocation from the trace: its size in bytes and the code that asked for it."""

    size: int
    where: str


@dataclass(frozen=True)
class SnapshotSummary:
    """What `render_memory_snapshot` found.

    Attributes:
        device: the device index whose trace was drawn.
        num_events: allocator events in its trace.
        baseline_bytes: memory already allocated when recording started.
        peak_bytes: the most memory allocated at once during the trace.
        largest: the largest allocations, biggest first.
        path: the PNG written.
    """

    device: int
    num_events: int
    baseline_bytes: int
    peak_bytes: int
    largest: list[Allocation]
    path: Path


def _cpp_op(frames: Sequence[Mapping[str, Any]]) -> str | None:
    """The autograd node and ATen op that C++ frames name, e.g. `MmBackward0 (aten::mm)`."""
    names = [str(f.get("name", "")) for f in frames]
    node = next((m[1] for n in names if (m := _AUTOGRAD_NODE.search(n))), None)
    op = next((m[1] for n in names if (m := _ATEN_OP.search(n))), None)
    if node and op:
        return f"{node} (aten::{op})"
    return node or (f"aten::{op}" if op else None)


def _where(frames: Sequence[Mapping[str, Any]]) -> str:
    """The code that made an allocation, as a reader wants it.

    The innermost Python frame outside PyTorch (`file:line name`), else the innermost Python
    frame; for an allocation with no Python frame (the autograd engine runs backward on a C++
    thread), the autograd node and ATen op its C++ frames name; else the innermost C++ frame
    that is not the unwinder or the allocator itself; else `_NO_FRAME`.
    """
    python = [f for f in frames if str(f.get("filename", "")).endswith(".py")]
    outside = [f for f in python if not any(d in str(f["filename"]) for d in _TORCH_DIRS)]
    if outside or python:
        frame = (outside or python)[0]
        filename = Path(str(frame.get("filename", "?"))).name
        return f"{filename}:{frame.get('line', '?')} {frame.get('name', '?')}"
    op = _cpp_op(frames)
    if op is not None:
        return op
    own = [f for f in frames if not _INTERNAL.search(str(f.get("name", "")))]
    return str(own[0].get("name")) if own else _NO_FRAME


def _device_with_trace(snapshot: Mapping[str, Any], device: int | None) -> int:
    traces = snapshot.get("device_traces")
    if not isinstance(traces, list) or "segments" not in snapshot:
        raise ValueError("not a CUDA memory snapshot: expected 'segments' and 'device_traces'")
    if device is not None:
        if not 0 <= device < len(traces):
            raise ValueError(f"snapshot has traces for devices 0..{len(traces) - 1}, not {device}")
        return device
    for index, trace in enumerate(traces):
        if any(e.get("action") == "alloc" for e in trace):
            return index
    raise ValueError(
        "the snapshot's trace holds no allocations; record with "
        "torch.cuda.memory._record_memory_history() before the code of interest"
    )


def memory_timeline(
    snapshot: Mapping[str, Any], *, device: int | None = None
) -> tuple[list[float], list[int], int]:
    """Allocated bytes after each allocator event of one device's trace.

    Args:
        snapshot: a snapshot dict (see the module docstring).
        device: which device's trace; the first with allocations when None.

    Returns:
        `(times, allocated, baseline)`: event times in ms from the first event (event indices
        when the trace has no `time_us`), bytes allocated after each event, and the bytes
        allocated before the trace began.

    Raises:
        ValueError: the dict is not a snapshot, or the trace has no allocations.
    """
    device = _device_with_trace(snapshot, device)
    trace = [e for e in snapshot["device_traces"][device] if e.get("action") in ("alloc", _FREED)]
    net = sum(e["size"] if e["action"] == "alloc" else -e["size"] for e in trace)
    at_end = sum(
        block["size"]
        for segment in snapshot["segments"]
        if segment.get("device", device) == device
        for block in segment.get("blocks", ())
        if block.get("state") == "active_allocated"
    )
    baseline = max(at_end - net, 0)
    allocated, current = [], baseline
    for e in trace:
        current += e["size"] if e["action"] == "alloc" else -e["size"]
        allocated.append(current)
    if trace and all("time_us" in e for e in trace):
        t0 = trace[0]["time_us"]
        times = [(e["time_us"] - t0) / 1e3 for e in trace]
    else:
        times = [float(i) for i in range(len(trace))]
    return times, allocated, baseline


def _load(snapshot: Mapping[str, Any] | str | os.PathLike[str]) -> Mapping[str, Any]:
    if isinstance(snapshot, Mapping):
        return snapshot
    with open(snapshot, "rb") as f:
        return pickle.load(f)


def render_memory_snapshot(
    snapshot: Mapping[str, Any] | str | os.PathLike[str],
    path: str | os.PathLike[str],
    *,
    device: int | None = None,
    title: str | None = None,
    num_largest: int = 10,
) -> SnapshotSummary:
    """Draw a snapshot's allocated-memory timeline and its largest allocations to a PNG.

    Args:
        snapshot: a snapshot dict, or the path of a pickle from `_dump_snapshot`. Only load
            pickles you wrote yourself: unpickling runs code.
        path: the PNG to write (folders are created).
        device: which device's trace; the first with allocations when None.
        title: the figure's title.
        num_largest: how many of the largest allocations to list.

    Returns:
        A `SnapshotSummary` (peak, baseline, largest allocations, the path).

    Raises:
        ValueError: the data is not a snapshot, or its trace has no allocations.
    """
    data = _load(snapshot)
    device = _device_with_trace(data, device)
    times, allocated, baseline = memory_timeline(data, device=device)
    allocs = [e for e in data["device_traces"][device] if e.get("action") == "alloc"]
    largest = [
        Allocation(e["size"], _where(e.get("frames", ())))
        for e in sorted(allocs, key=lambda e: e["size"], reverse=True)[:num_largest]
    ]
    timed = all("time_us" in e for e in allocs)

    from matplotlib.figure import Figure  # imported on first use, as in `bench.core.plots`

    fig = Figure(figsize=(11, 4.2), layout="constrained")
    line_ax, bar_ax = fig.subplots(1, 2, width_ratios=[3, 2])
    line_ax.step(times, [a / MIB for a in allocated], where="post", lw=1)
    line_ax.axhline(baseline / MIB, color="grey", ls=":", lw=1, label="before recording")
    line_ax.set_xlabel("time (ms)" if timed else "allocator event")
    line_ax.set_ylabel("allocated (MiB)")
    line_ax.legend(fontsize="small", loc="upper left")
    line_ax.grid(True, alpha=0.3)
    labels = [f"{a.where}"[:48] for a in reversed(largest)]
    bar_ax.barh(range(len(largest)), [a.size / MIB for a in reversed(largest)])
    bar_ax.set_yticks(range(len(largest)), labels, fontsize="x-small")
    bar_ax.set_xlabel("size (MiB)")
    bar_ax.set_title(f"{len(largest)} largest allocations", fontsize="small")
    fig.suptitle(title or f"CUDA memory, device {device}")
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    return SnapshotSummary(
        device=device,
        num_events=len(data["device_traces"][device]),
        baseline_bytes=baseline,
        peak_bytes=max(allocated, default=baseline),
        largest=largest,
        path=path,
    )
