"""What a training step's peak memory is made of, from allocator readings at its phase boundaries
(bench-step's memory columns).

A step runs in three phases: forward (with the loss), backward, optimizer step. `PhaseMeter`
reads the caching allocator at each boundary (bytes in use now, and the peak since the last
boundary) and the phase's time, synchronising the device: an instrumented step, not a timed one.
`breakdown` then splits the step's peak into

- **parameters**, **gradients**, **optimizer state**: the bytes of those tensors on this device
  (`bench.core.memory.tensor_bytes`; a DTensor's local shard), read off the tensors themselves;
- **activations**: what the forward left allocated for the backward (in use after the forward
  minus in use at its start: saved tensors, checkpoint inputs, the loss), counted in full when
  the peak falls in the forward or the backward (the backward frees them as it goes, so this is
  at most what is alive at a backward peak), none when the peak is the optimizer step's;
- gradients at a backward peak: as many of the step's gradients as fit below the peak beside the
  above (all of them when the peak is late in the backward, few when it is early, as happens
  without checkpointing, where the saved activations dominate);
- **rest**: the remainder: buffers (RoPE tables), the batch, and transients (a recomputed
  segment, a block's backward working set, the loss's chunk of logits, FSDP's gathered weights,
  communication buffers, the optimizer's temporaries).

Off CUDA nothing is read (PyTorch keeps no allocator statistics on the CPU): the peak and its
split are None; the tensor sizes are still known.

Example::

    meter = PhaseMeter(device)
    meter.start()
    loss = model(x, targets=y); meter.mark("forward")
    loss.backward();            meter.mark("backward")
    optimizer.step();           meter.mark("optimizer")
    split = breakdown(meter.readings(), params=p_bytes, grads=g_bytes, state=s_bytes)

`capped_memory` is `--memory`'s cap on a rank's allocator, where a larger GPU stands in for a
smaller one.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass

import torch

from bench.core.memory import memory_in_use, peak_memory, reset_peak_memory
from bench.core.timing import synchronize

__all__ = [
    "PHASES",
    "MemoryBreakdown",
    "PhaseMeter",
    "PhaseReadings",
    "breakdown",
    "capped_memory",
]

PHASES = ("forward", "backward", "optimizer")


@dataclass(frozen=True)
class PhaseReadings:
    """The allocator at a step's boundaries (bytes) and each phase's time (ms).

    Attributes:
        start: in use when the step began (after `zero_grad`).
        after: in use at the end of each phase, by phase name.
        peaks: the most in use during each phase.
        times_ms: each phase's wall time, the device synchronised at both ends.
    """

    start: int | None
    after: Mapping[str, int | None]
    peaks: Mapping[str, int | None]
    times_ms: Mapping[str, float]


class PhaseMeter:
    """Reads memory and time at the boundaries of a step's phases (see the module docstring).

    Args:
        device: the device the step runs on.
    """

    def __init__(self, device: torch.device | str) -> None:
        self.device = torch.device(device)
        self._start: int | None = None
        self._after: dict[str, int | None] = {}
        self._peaks: dict[str, int | None] = {}
        self._times: dict[str, float] = {}
        self._clock = 0.0

    def start(self) -> None:
        """Open the first phase: a new peak window, the bytes in use now, the clock."""
        reset_peak_memory(self.device)
        self._start = memory_in_use(self.device)
        self._clock = time.perf_counter()

    def mark(self, phase: str) -> None:
        """Close `phase`: its time, its peak and the bytes in use at its end; open the next."""
        synchronize(self.device)
        now = time.perf_counter()
        self._times[phase] = (now - self._clock) * 1e3
        self._peaks[phase] = peak_memory(self.device)
        self._after[phase] = memory_in_use(self.device)
        reset_peak_memory(self.device)
        self._clock = time.perf_counter()

    def readings(self) -> PhaseReadings:
        """What was read since `start`."""
        return PhaseReadings(self._start, dict(self._after), dict(self._peaks), dict(self._times))


@dataclass(frozen=True)
class MemoryBreakdown:
    """A step's peak and its parts (bytes; None where the device keeps no statistics).

    `params + grads + state + activations + rest == peak`; `grads` and `activations` are what
    is attributed to the peak (see the module docstring), `phase` the phase it fell in.
    """

    peak: int | None
    phase: str | None
    params: int
    grads: int | None
    state: int
    activations: int | None
    rest: int | None


def breakdown(readings: PhaseReadings, *, params: int, grads: int, state: int) -> MemoryBreakdown:
    """Split the step's peak into parameters, gradients, optimizer state, activations and rest.

    Args:
        readings: `PhaseMeter.readings()` of one step whose phases are `PHASES`.
        params: bytes of the parameters on the device.
        grads: bytes of all the step's gradients (at the end of its backward).
        state: bytes of the optimizer state on the device.

    Returns:
        The split (see the module docstring); only the tensor sizes when nothing was read.
    """
    peaks = {p: readings.peaks.get(p) for p in PHASES if readings.peaks.get(p) is not None}
    after_forward = readings.after.get("forward")
    if not peaks or readings.start is None or after_forward is None:
        return MemoryBreakdown(None, None, params, grads, state, None, None)
    phase = max(peaks, key=lambda p: peaks[p])
    peak = peaks[phase]
    saved = max(0, after_forward - readings.start)
    base = params + state
    if phase == "forward":
        grads_at, activations = 0, saved
    elif phase == "backward":
        activations = saved
        grads_at = min(grads, max(0, peak - base - activations))
    else:
        grads_at, activations = grads, 0
    rest = peak - base - activations - grads_at
    return MemoryBreakdown(peak, phase, params, grads_at, state, activations, rest)


@contextlib.contextmanager
def capped_memory(limit_bytes: int | None, device: torch.device | str) -> Iterator[None]:
    """Inside the block, the caching allocator on `device` holds at most `limit_bytes` (an
    allocation beyond it raises `torch.OutOfMemoryError`, as on a GPU of that size), so that a
    larger GPU stands in for a smaller one. Only the allocator is capped: the CUDA context and
    what libraries allocate outside it (NCCL's buffers) come on top, as they do on the smaller
    GPU. A no-op when `limit_bytes` is None, at least the GPU's memory, or off CUDA."""
    if limit_bytes is None or torch.device(device).type != "cuda":
        yield
        return
    total = torch.cuda.get_device_properties(device).total_memory
    if limit_bytes >= total:
        yield
        return
    torch.cuda.set_per_process_memory_fraction(limit_bytes / total, device)
    try:
        yield
    finally:
        torch.cuda.set_per_process_memory_fraction(1.0, device)
