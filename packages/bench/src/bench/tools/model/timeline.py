"""An offline view of a CUDA memory snapshot: allocated memory over time, and the largest requests.

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

Which sizes: a trace entry's `size` is the tensor's request; an end-state block's `size` is the
allocator's block (the request rounded) and its `requested_size` the request
(`bench.tools.model.block_replay` gives the allocator source for each). The timeline draws
both kinds, each from records of its own kind: block bytes, what `max_memory_allocated` and so
bench's peak memory count, rebuilt by the allocator's rules where the trace determines them,
and requested bytes, always.

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
from bench.tools.model.block_replay import BlockReplay

__all__ = [
    "Allocation",
    "MemoryTimeline",
    "SnapshotSummary",
    "memory_timeline",
    "render_memory_snapshot",
]

# the events that change the memory held by tensors: `memory_allocated` drops at the free's
# request, not at its completion (when the block becomes reusable)
_CHANGES = ("alloc", "free_requested")
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
    """One allocation from the trace: the bytes it requested and the code that asked for them."""

    size: int
    where: str


@dataclass(frozen=True)
class SnapshotSummary:
    """What `render_memory_snapshot` found (`MemoryTimeline` says what each kind of bytes is).

    Attributes:
        device: the device index whose trace was drawn.
        num_events: allocator events in its trace.
        baseline_allocated_bytes: block bytes allocated when recording started; None when the
            trace does not determine block sizes (`problems` says why).
        peak_allocated_bytes: the most block bytes allocated at once during the trace, what
            `max_memory_allocated` reports after a reset at its start; None likewise.
        baseline_requested_bytes, peak_requested_bytes: the same in requested bytes.
        problems: why block sizes are not determined (empty when they are).
        largest: the largest allocations by request, biggest first.
        path: the PNG written.
    """

    device: int
    num_events: int
    baseline_allocated_bytes: int | None
    peak_allocated_bytes: int | None
    baseline_requested_bytes: int
    peak_requested_bytes: int
    problems: tuple[str, ...]
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


@dataclass(frozen=True)
class MemoryTimeline:
    """Memory held by live tensors after each allocation and free of one device's trace.

    Two kinds of bytes (`bench.tools.model.block_replay` says where a snapshot keeps each):
    `allocated`, the allocator's blocks, what `torch.cuda.memory_allocated` and
    `max_memory_allocated` count (bench's peak memory), rebuilt by the allocator's rules; and
    `requested`, the bytes the tensors asked for, read from the trace as it is. A tensor counts
    from its `alloc` to its `free_requested`, when `memory_allocated` drops.

    Attributes:
        times: ms since the first event, or event indices when the trace has no `time_us`.
        timed: whether `times` are ms.
        requested: requested bytes after each event; exact.
        baseline_requested: requested bytes before the first event.
        allocated: block bytes after each event; None when the trace does not determine them.
        baseline_allocated: block bytes before the first event; None likewise.
        problems: why block bytes are not determined, one sentence each (empty when they are).
    """

    times: list[float]
    timed: bool
    requested: list[int]
    baseline_requested: int
    allocated: list[int] | None
    baseline_allocated: int | None
    problems: tuple[str, ...]


def memory_timeline(snapshot: Mapping[str, Any], *, device: int | None = None) -> MemoryTimeline:
    """Allocated and requested bytes after each allocation and free of one device's trace.

    Memory allocated before recording started is not in the trace: it is recovered from the end
    state, in the same kind of bytes as the curve (block sizes for `allocated`, requests for
    `requested`), so that the baseline is not off by the allocator's rounding.

    Args:
        snapshot: a snapshot dict (see the module docstring).
        device: which device's trace; the first with allocations when None.

    Returns:
        A `MemoryTimeline`. Its `allocated` is None, and `problems` says why, where block sizes
        cannot be rebuilt (blocks allocated before recording and freed in it, expandable
        segments, allocator settings other than the defaults).

    Raises:
        ValueError: the dict is not a snapshot, or the trace has no allocations.
    """
    device = _device_with_trace(snapshot, device)
    replay = BlockReplay(snapshot, device=device)
    events, allocated, requested = [], [], []
    for e in replay.trace:
        replay.apply(e)
        if e.get("action") in _CHANGES:
            events.append(e)
            allocated.append(replay.allocated)
            requested.append(replay.requested)
    timed = bool(events) and all("time_us" in e for e in events)
    if timed:
        t0 = events[0]["time_us"]
        times = [(e["time_us"] - t0) / 1e3 for e in events]
    else:
        times = [float(i) for i in range(len(events))]
    problems = tuple(replay.problems)
    return MemoryTimeline(
        times=times,
        timed=timed,
        requested=requested,
        baseline_requested=replay.before_requested,
        allocated=None if problems else allocated,
        baseline_allocated=None if problems else replay.before_allocated,
        problems=problems,
    )


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
    """Draw a snapshot's memory timeline and its largest allocations to a PNG.

    The timeline draws block bytes (what `max_memory_allocated` counts) where the trace
    determines them, and requested bytes always (`memory_timeline`); the largest allocations
    are ranked by request, the size the trace records.

    Args:
        snapshot: a snapshot dict, or the path of a pickle from `_dump_snapshot`. Only load
            pickles you wrote yourself: unpickling runs code.
        path: the PNG to write (folders are created).
        device: which device's trace; the first with allocations when None.
        title: the figure's title.
        num_largest: how many of the largest allocations to list.

    Returns:
        A `SnapshotSummary` (peaks and baselines in both kinds of bytes, largest allocations,
        the path).

    Raises:
        ValueError: the data is not a snapshot, or its trace has no allocations.
    """
    data = _load(snapshot)
    device = _device_with_trace(data, device)
    timeline = memory_timeline(data, device=device)
    allocs = [e for e in data["device_traces"][device] if e.get("action") == "alloc"]
    largest = [
        Allocation(e["size"], _where(e.get("frames", ())))
        for e in sorted(allocs, key=lambda e: e["size"], reverse=True)[:num_largest]
    ]

    from matplotlib.figure import Figure  # imported on first use, as in `bench.core.plots`

    fig = Figure(figsize=(11, 4.2), layout="constrained")
    line_ax, bar_ax = fig.subplots(1, 2, width_ratios=[3, 2])
    if timeline.allocated is not None:
        line_ax.step(
            timeline.times, [a / MIB for a in timeline.allocated], where="post", lw=1,
            label="allocated (blocks, as max_memory_allocated)",
        )  # fmt: skip
    line_ax.step(
        timeline.times, [r / MIB for r in timeline.requested], where="post", lw=1,
        label="requested by the tensors",
    )  # fmt: skip
    baseline = timeline.baseline_allocated
    line_ax.axhline(
        (timeline.baseline_requested if baseline is None else baseline) / MIB,
        color="grey", ls=":", lw=1, label="before recording",
    )  # fmt: skip
    if timeline.problems:
        line_ax.set_title(
            "block sizes not determined: " + "; ".join(timeline.problems), fontsize="x-small",
            wrap=True,
        )  # fmt: skip
    line_ax.set_xlabel("time (ms)" if timeline.timed else "allocator event")
    line_ax.set_ylabel("memory held by tensors (MiB)")
    line_ax.legend(fontsize="small", loc="upper left")
    line_ax.grid(True, alpha=0.3)
    labels = [f"{a.where}"[:48] for a in reversed(largest)]
    bar_ax.barh(range(len(largest)), [a.size / MIB for a in reversed(largest)])
    bar_ax.set_yticks(range(len(largest)), labels, fontsize="x-small")
    bar_ax.set_xlabel("requested (MiB)")
    bar_ax.set_title(f"{len(largest)} largest allocations", fontsize="small")
    fig.suptitle(title or f"CUDA memory, device {device}")
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    return SnapshotSummary(
        device=device,
        num_events=len(data["device_traces"][device]),
        baseline_allocated_bytes=baseline,
        peak_allocated_bytes=(
            None if timeline.allocated is None else max(timeline.allocated, default=baseline)
        ),
        baseline_requested_bytes=timeline.baseline_requested,
        peak_requested_bytes=max(timeline.requested, default=timeline.baseline_requested),
        problems=timeline.problems,
        largest=largest,
        path=path,
    )
