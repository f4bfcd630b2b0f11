"""Rank workers that fail on purpose, for tests of the launchers (importable by spawned ranks)."""

from __future__ import annotations

import atexit
import os
import signal
import time
from pathlib import Path

import torch
import torch.distributed as dist

__all__ = [
    "rank0_fails_and_lingers",
    "rank1_is_killed",
    "sleeps",
    "writes_its_pid_and_appends",
    "writes_its_pid_and_sleeps",
]


def rank0_fails_and_lingers(rank: int, world_size: int) -> None:
    """Rank 0 raises the real error; the other ranks then fail in a collective and exit first."""
    if rank == 0:
        # Keep rank 0's process alive after it raised, so that a peer's consequential failure
        # is the first to reach the parent: a launcher must still name rank 0.
        atexit.register(time.sleep, 3.0)
        raise ValueError("the real cause, on rank 0")
    dist.all_reduce(torch.ones(1))
    dist.all_reduce(torch.ones(1))


def rank1_is_killed(rank: int, world_size: int) -> None:
    """Rank 1 is killed by SIGKILL, as the OOM killer ends a process; rank 0 then fails in a
    collective with it ("Connection closed by peer") and lingers, so that either failure may
    reach the launcher first."""
    if rank == 1:
        os.kill(os.getpid(), signal.SIGKILL)
    atexit.register(time.sleep, 1.0)
    dist.all_reduce(torch.ones(1))


def sleeps(rank: int, world_size: int) -> None:
    """Outlasts any short timeout."""
    time.sleep(30)


def writes_its_pid_and_sleeps(rank: int, world_size: int, folder: str) -> None:
    """Leaves `rank<r>.pid` in `folder`, then outlasts any test, deaf to SIGINT (as a rank
    blocked in C++, a collective or a kernel, is until it returns: maybe never)."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    (Path(folder) / f"rank{rank}.pid").write_text(str(os.getpid()))
    time.sleep(300)


def writes_its_pid_and_appends(rank: int, world_size: int, folder: str) -> None:
    """Leaves `rank<r>.pid` in `folder`, then appends a line to `rank<r>.log` there every
    20 ms for a minute (a rank training into its output folder), deaf to SIGINT."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    (Path(folder) / f"rank{rank}.pid").write_text(str(os.getpid()))
    with open(Path(folder) / f"rank{rank}.log", "a") as log:
        for step in range(3000):
            log.write(f"step {step}\n")
            log.flush()
            time.sleep(0.02)
