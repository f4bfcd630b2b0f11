"""bench-train runs that kill themselves at a named point (`bench.train.faults`), each in a
process of its own, for tests of what `--resume` recovers.

Each run is forked from one server process that imported bench once (the forkserver that
`spawn_ranks` shares, started on the first call), so a kill costs a fork, not a Python start and the
import of torch (and of torch._dynamo, which the first optimizer imports). The server imports
but never computes, so the forks start without thread pools to inherit.

Example::

    run_killed(["--data", "text.txt", "--out", "runs/x", "--steps", "6"], "step:3")
    main([..., "--resume"])  # continues from the last checkpoint
"""

from __future__ import annotations

import os
import signal
from collections.abc import Sequence

import torch
from spawn_ranks import forkserver

from bench.commands.train import main
from bench.train.faults import KILL_AT

__all__ = ["run_killed"]


def _run(argv: list[str], point: str) -> None:
    os.environ[KILL_AT] = point
    torch.set_num_threads(1)  # as the tests' own process trains
    main(argv)


def run_killed(argv: Sequence[str], point: str, *, timeout: float = 300.0) -> None:
    """Run `bench-train argv` in a forked process that kills itself at `point` (`POINT[:STEP]`).

    Raises:
        AssertionError: the run ended otherwise than killed (its exit code says how).
        TimeoutError: it ran past `timeout` seconds (it is killed).
    """
    process = forkserver().Process(target=_run, args=(list(argv), point))
    process.start()
    process.join(timeout)
    if process.exitcode is None:
        process.kill()
        raise TimeoutError(f"bench-train did not reach {point} within {timeout:.0f} s")
    if process.exitcode != -signal.SIGKILL:
        raise AssertionError(f"bench-train exited with {process.exitcode}, not killed at {point}")
