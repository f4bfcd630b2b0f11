"""Timing that waits for the device: CUDA events on the GPU, `perf_counter` on the CPU.

CUDA kernels run asynchronously, so a host clock read right after a launch measures the launch,
not the work. Every function here synchronises the device around the timed region. All times are
in milliseconds.

Example::

    samples = time_fn(lambda: model(x), device="cuda", warmup=5, repeats=10)
    s = summarize(samples)
    print(f"{s.mean:.2f} ± {s.std:.2f} ms")
"""

from __future__ import annotations

import math
import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from typing import Any, TypeVar

import torch

__all__ = [
    "Summary",
    "do_bench",
    "elapsed_ms",
    "summarize",
    "synchronize",
    "time_fn",
]

T = TypeVar("T")

# `do_bench` off CUDA times at most this many calls whatever `rep_ms` asks for (so a function
# taking microseconds does not loop a hundred thousand times), and at least enough calls that
# the median survives one outlier.
_MAX_CPU_REPEATS = 1000
_MIN_CPU_REPEATS = 3


def synchronize(device: torch.device | str) -> None:
    """Wait until all queued work on `device` has finished (a no-op on the CPU)."""
    device = torch.device(device)
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def elapsed_ms(fn: Callable[[], T], *, device: torch.device | str) -> tuple[T, float]:
    """Run `fn()` once and return `(its result, milliseconds it took on the device)`.

    The device is synchronised before the call (earlier work is not counted) and after it (the
    call's own work is). On CUDA the time comes from a pair of CUDA events on the current stream.
    """
    device = torch.device(device)
    synchronize(device)
    if device.type == "cuda":
        start = torch.cuda.Event(enable_timing=True)
        end = torch.cuda.Event(enable_timing=True)
        start.record()
        result = fn()
        end.record()
        end.synchronize()
        return result, start.elapsed_time(end)
    t0 = time.perf_counter()
    result = fn()
    return result, (time.perf_counter() - t0) * 1e3


def time_fn(
    fn: Callable[[], Any],
    *,
    device: torch.device | str,
    warmup: int = 3,
    repeats: int = 10,
) -> list[float]:
    """Call `fn` `warmup` times untimed, then `repeats` times timed; return every sample in ms.

    Args:
        fn: the work to time, called with no arguments.
        device: where the work runs (decides how to synchronise and which clock to use).
        warmup: untimed calls first (kernel compilation, autotuning, allocator growth).
        repeats: timed calls; each is synchronised on both sides.

    Raises:
        ValueError: if `warmup < 0` or `repeats < 1`.
    """
    if warmup < 0 or repeats < 1:
        raise ValueError(f"need warmup >= 0 and repeats >= 1, got {warmup=} {repeats=}")
    for _ in range(warmup):
        fn()
    synchronize(device)
    return [elapsed_ms(fn, device=device)[1] for _ in range(repeats)]


@dataclass(frozen=True)
class Summary:
    """Summary statistics of timing samples, in the samples' unit (ms here).

    `std` is the sample standard deviation (n - 1 in the denominator), 0.0 for one sample;
    `iqr` the interquartile range (third quartile minus first, numpy's linear interpolation),
    0.0 for one sample: with the median, the spread one slow call does not move.
    """

    n: int
    mean: float
    std: float
    median: float
    min: float
    max: float
    iqr: float

    def as_dict(self, prefix: str = "") -> dict[str, float | int]:
        """The fields as a flat dict, keys prefixed (`as_dict("fwd_ms_")` → `fwd_ms_mean`, ...)."""
        return {f"{prefix}{k}": v for k, v in asdict(self).items()}


def summarize(samples: Sequence[float]) -> Summary:
    """Mean, standard deviation, median, min, max and interquartile range of `samples`.

    Raises:
        ValueError: if `samples` is empty or holds a non-finite value.
    """
    if not samples:
        raise ValueError("cannot summarise an empty list of samples")
    if not all(math.isfinite(s) for s in samples):
        raise ValueError(f"samples must be finite numbers, got {list(samples)}")
    return Summary(
        n=len(samples),
        mean=statistics.fmean(samples),
        std=statistics.stdev(samples) if len(samples) > 1 else 0.0,
        median=statistics.median(samples),
        min=min(samples),
        max=max(samples),
        iqr=_iqr(samples),
    )


def _iqr(samples: Sequence[float]) -> float:
    if len(samples) < 2:
        return 0.0
    first, _, third = statistics.quantiles(samples, n=4, method="inclusive")
    return third - first


def _triton_do_bench() -> Callable[..., Any] | None:
    try:
        from triton.testing import do_bench as triton_do_bench
    except ImportError:
        return None
    return triton_do_bench


def do_bench(
    fn: Callable[[], Any],
    *,
    device: torch.device | str,
    warmup_ms: float = 25.0,
    rep_ms: float = 100.0,
    grad_to_none: Sequence[torch.Tensor] | None = None,
) -> list[float]:
    """Time `fn` for about `rep_ms` after about `warmup_ms` of warm-up; return all samples (ms).

    On CUDA with Triton installed this is `triton.testing.do_bench(..., return_mode="all")`, which
    also flushes the L2 cache between calls; summarise with `summarize(...).median`, the statistic
    Triton's own benchmarks report. Elsewhere a similar time-budgeted loop runs on
    `perf_counter` (3 to 1000 timed calls).

    Args:
        fn: the work to time, called with no arguments.
        device: where the work runs.
        warmup_ms: warm-up budget in milliseconds (at least one call).
        rep_ms: measurement budget in milliseconds (at least one call).
        grad_to_none: tensors whose `.grad` is set to None before every call, so a function that
            runs a backward pass does not time gradient accumulation.
    """
    device = torch.device(device)
    triton_do_bench = _triton_do_bench() if device.type == "cuda" else None
    if triton_do_bench is not None:
        with torch.cuda.device(device):
            return list(
                triton_do_bench(
                    fn,
                    warmup=warmup_ms,
                    rep=rep_ms,
                    grad_to_none=grad_to_none,
                    return_mode="all",
                )
            )

    def reset_grads() -> None:
        for t in grad_to_none or ():
            t.grad = None

    def timed_call() -> float:
        reset_grads()
        return elapsed_ms(fn, device=device)[1]

    # Warm up for the warm-up budget (at least one call); the median warm-up call sizes the
    # measurement, so one slow first call (compilation, a descheduled thread) does not.
    warmup_samples = [timed_call()]
    while sum(warmup_samples) < warmup_ms:
        warmup_samples.append(timed_call())
    estimate = max(statistics.median(warmup_samples), 1e-3)
    repeats = min(_MAX_CPU_REPEATS, max(_MIN_CPU_REPEATS, int(rep_ms / estimate)))
    return [timed_call() for _ in range(repeats)]
