"""Kill points: a run that kills itself at a named moment, so that tests can interrupt it exactly
there and check that `--resume` loses nothing (never set outside tests).

`BENCH_TRAIN_KILL_AT=POINT` or `POINT:STEP` makes the process that reaches `POINT` (at `STEP`,
when given) send itself SIGKILL: no `finally`, no flush, no clean-up, as a crash or `kill -9`
ends a run. The points, in the order a run meets them:

- `step`: step N has run (its optimizer step included), before it is logged;
- `metrics`: step N's line is in `metrics.jsonl`;
- `checkpoint`: the checkpoint of step N is written (every rank's file, rank 0's under a
  temporary name), before rank 0 commits it;
- `outputs`: the final checkpoint is committed, before the sample and the summary.
"""

from __future__ import annotations

import os
import signal

__all__ = ["KILL_AT", "POINTS", "kill_point"]

KILL_AT = "BENCH_TRAIN_KILL_AT"
POINTS = ("step", "metrics", "checkpoint", "outputs")


def kill_point(point: str, step: int | None = None) -> None:
    """Kill this process now if `BENCH_TRAIN_KILL_AT` names `point` (and `step`, if it gives one).

    Raises:
        ValueError: the variable names no point of `POINTS` (a test's typo must not pass).
    """
    wanted = os.environ.get(KILL_AT)
    if not wanted:
        return
    name, _, at = wanted.partition(":")
    if name not in POINTS:
        raise ValueError(f"{KILL_AT}={wanted!r}: the points are {', '.join(POINTS)}")
    if name == point and (not at or (step is not None and int(at) == step)):
        os.kill(os.getpid(), signal.SIGKILL)
