"""Run one measurement of a sweep so that running out of memory marks the row instead of ending it.

A sweep over sizes is expected to hit the memory limit at its large end (naive attention at
long sequences, say); the table should then say `OOM` for those cells and go on with the rest.
A measurement may also decline to run (a missing optional package, a size too slow for the
Triton interpreter) by raising `Unavailable("why")`; its row then says `skipped: why`. Any other
exception is a bug and propagates.

Example::

    outcome = guarded(lambda: time_fn(step, device=dev), device=dev)
    row = {"seq": 4096, "status": outcome.status,
           "ms": summarize(outcome.value).mean if outcome.ok else None}
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Generic, TypeVar

if TYPE_CHECKING:
    import torch

__all__ = ["OK", "OOM", "Outcome", "Unavailable", "guarded", "skipped"]

T = TypeVar("T")

OK = "ok"
"""Status of a row whose measurement completed."""

OOM = "OOM"
"""Status of a row whose measurement ran out of device memory."""


def skipped(reason: str) -> str:
    """Status of a row that was not measured, with the reason (`"skipped: <reason>"`)."""
    return f"skipped: {reason}"


class Unavailable(Exception):
    """Raise inside a guarded measurement to mark its row `skipped: <message>`."""


@dataclass(frozen=True)
class Outcome(Generic[T]):
    """What a guarded measurement produced: its value, or None with the reason in `status`."""

    value: T | None
    status: str

    @property
    def ok(self) -> bool:
        """True when the measurement completed and `value` holds its result."""
        return self.status == OK


def guarded(fn: Callable[[], T], *, device: torch.device | str) -> Outcome[T]:
    """Call `fn()`; turn out-of-memory and `Unavailable` into a status instead of an exception.

    After an out-of-memory error the exception (whose traceback keeps the failed call's tensors
    alive) is dropped and the device's cached memory released, so the next measurement starts
    from a clean allocator.

    Returns:
        `Outcome(value, "ok")`, `Outcome(None, "OOM")` or `Outcome(None, "skipped: <reason>")`.
    """
    import torch  # here, not at the top: results read the statuses without torch

    from bench.core.memory import free_memory

    try:
        return Outcome(fn(), OK)
    except (torch.OutOfMemoryError, MemoryError):
        pass
    except Unavailable as exc:
        return Outcome(None, skipped(str(exc)))
    free_memory(device)
    return Outcome(None, OOM)
