"""Instrumentation of gradient communication: per-step counts and timings, and NVTX ranges.

The wrappers call into this module at three points of a step (each collective launched, the
start and the end of `finish_gradient_synchronization`), so tools that measure communication
read `wrapper.comm_stats` and profiler timelines instead of reaching into the wrappers.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass

import torch
import torch.distributed as dist

__all__ = ["CommStats", "nvtx_range"]


@dataclass(frozen=True)
class CommStats:
    """What one synchronised step communicated, and how long it held training up.

    Attributes:
        num_collectives: all-reduces issued since the previous synchronisation (hooks included).
        num_bytes: bytes those all-reduces reduced, in the communication dtype.
        wait_ms: how long `finish_gradient_synchronization()` held training up. On CUDA this is
            the device time between the current stream reaching the call and the call's last
            kernel (CUDA events), which is the exposed, un-overlapped communication; on the CPU
            it is host wall time, since gloo's waits block the calling thread. Work that
            reduced hooks (`register_reduced_hook`) queue inside the call counts too.
        comm_ms: the summed device time of the step's collectives, when the backend reports it
            (NCCL with ``TORCH_NCCL_ENABLE_TIMING=1`` set before the process group is created);
            `None` otherwise. With `wait_ms` it gives the share of communication hidden behind
            backward: ``1 - wait_ms / comm_ms``.
    """

    num_collectives: int
    num_bytes: int
    wait_ms: float
    comm_ms: float | None


@contextmanager
def nvtx_range(name: str, *, enabled: bool = True) -> Iterator[None]:
    """A range called `name` around the block, when `enabled`: an NVTX range (for Nsight
    Systems, when CUDA is available) and, while a `torch.profiler` records, a `record_function`
    range (for its traces, on any device). `enabled=False` makes it a no-op, so code keeps its
    ranges on any machine.

    The profiler range is opened only while a profiler records: `record_function` costs tens of
    µs of host time even when none does, and the wrappers open a range per collective.
    """
    if not enabled:
        yield
        return
    with ExitStack() as stack:
        if torch._C._autograd._profiler_enabled():  # torch.profiler is recording
            stack.enter_context(torch.profiler.record_function(name))
        if not torch.cuda.is_available():
            yield
            return
        torch.cuda.nvtx.range_push(name)
        try:
            yield
        finally:
            torch.cuda.nvtx.range_pop()


def _summed_duration_ms(works: list[dist.Work]) -> float | None:
    total = 0.0
    for work in works:
        try:
            total += work._get_duration()
        except RuntimeError:  # the backend does not time its collectives
            return None
    return total


class _PendingStats:
    """A finished step whose timings may still be running on the device; read lazily."""

    def __init__(
        self,
        num_collectives: int,
        num_bytes: int,
        works: list[dist.Work],
        start: torch.cuda.Event | float,
        end: torch.cuda.Event | float,
    ) -> None:
        self._args = (num_collectives, num_bytes)
        self._works = works
        self._start, self._end = start, end
        self._stats: CommStats | None = None

    def resolve(self) -> CommStats:
        if self._stats is None:
            if isinstance(self._end, torch.cuda.Event):
                self._end.synchronize()
                wait_ms = self._start.elapsed_time(self._end)
            else:
                wait_ms = (self._end - self._start) * 1e3
            self._stats = CommStats(*self._args, wait_ms, _summed_duration_ms(self._works))
            self._works = []
        return self._stats


class CommRecorder:
    """Counts the collectives of the current step and times the synchronisation that ends it.

    Cheap by design: two integer additions per collective, two CUDA events (or two host clock
    reads) per step. The device is only synchronised when the stats are read.
    """

    def __init__(self, device: torch.device) -> None:
        self._cuda = device.type == "cuda"
        self._num_collectives = 0
        self._num_bytes = 0
        self._works: list[dist.Work] = []
        self._start: torch.cuda.Event | float = 0.0
        self._last: _PendingStats | None = None

    def record(self, tensor: torch.Tensor, work: dist.Work) -> None:
        self._num_collectives += 1
        self._num_bytes += tensor.numel() * tensor.element_size()
        self._works.append(work)

    def _now(self) -> torch.cuda.Event | float:
        if not self._cuda:
            return time.perf_counter()
        event = torch.cuda.Event(enable_timing=True)
        event.record()
        return event

    def begin_wait(self) -> None:
        self._start = self._now()

    def end_step(self) -> None:
        self._last = _PendingStats(
            self._num_collectives, self._num_bytes, self._works, self._start, self._now()
        )
        self._num_collectives = self._num_bytes = 0
        self._works = []

    @property
    def last(self) -> CommStats | None:
        return None if self._last is None else self._last.resolve()
