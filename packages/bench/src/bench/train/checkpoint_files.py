"""The names of a bench-train run's checkpoint files in its `--out`, their removal (what
`--keep-last` keeps, what a committed checkpoint no longer names, what `--overwrite` replaces),
and what to say when one cannot be written (`bench.train.checkpoint` writes and reads them)."""

from __future__ import annotations

import os
import re
import shutil
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

import torch

from bench.core.memory import MIB

__all__ = [
    "CHECKPOINT",
    "CheckpointWriteError",
    "kept_steps",
    "prune",
    "rank_file",
    "remove_checkpoints",
    "step_file",
    "write_error",
]

CHECKPOINT = "checkpoint.pt"
# The files of a checkpoint of one step: a kept copy of rank 0's (`step_file`) or another
# rank's (`rank_file`); group 1 is the step.
_OF_A_STEP = re.compile(r"checkpoint-(?:rank\d+-)?step(\d+)\.pt")


def rank_file(rank: int, step: int) -> str:
    """The name of rank `rank`'s file of the checkpoint of `step` in the run's folder."""
    return CHECKPOINT if rank == 0 else f"checkpoint-rank{rank}-step{step}.pt"


def step_file(step: int) -> str:
    """The name under which `--keep-last` keeps the checkpoint of `step` (rank 0's file)."""
    return f"checkpoint-step{step}.pt"


def remove_checkpoints(out: str | Path) -> None:
    """Remove every checkpoint file in `out`, committed or not (a run `--overwrite` replaces)."""
    prune(Path(out), steps=())
    (Path(out) / CHECKPOINT).unlink(missing_ok=True)


def kept_steps(out: Path, step: int, keep_last: int) -> set[int]:
    """Keep the committed `checkpoint.pt` (of `step`) as `step_file(step)` too, when more than
    one is kept; the steps of the newest `keep_last` checkpoints kept in `out`."""
    if keep_last == 1:
        return {step}
    kept = out / step_file(step)
    if not kept.exists():
        try:
            os.link(out / CHECKPOINT, kept)  # a second name: no copy, and whole at once
        except OSError:  # a file system without hard links
            shutil.copyfile(out / CHECKPOINT, kept.with_name(kept.name + ".tmp"))
            os.replace(kept.with_name(kept.name + ".tmp"), kept)
    steps = {
        int(m[1]) for p in out.glob("checkpoint-step*.pt") if (m := _OF_A_STEP.fullmatch(p.name))
    }
    return set(sorted(steps)[-keep_last:]) | {step}


def prune(out: Path, steps: Iterable[int]) -> None:
    """Remove the checkpoint files in `out` of steps other than `steps` (older checkpoints'
    rank files, copies past `--keep-last`), and what a killed save left."""
    steps = set(steps)
    for path in [*out.glob("checkpoint-*.pt"), *out.glob("checkpoint*.tmp")]:
        of_a_step = _OF_A_STEP.fullmatch(path.name)
        if of_a_step is None or int(of_a_step[1]) not in steps:
            path.unlink(missing_ok=True)


class CheckpointWriteError(OSError):
    """A checkpoint file could not be written (a full disk, most often); the committed
    checkpoint before it is intact, and the message says what the new one needs."""


def _tensor_bytes(obj: Any) -> int:
    """The bytes of the tensors in `obj` (nested dicts, lists and tuples): the least a
    checkpoint of it takes on disk."""
    if isinstance(obj, torch.Tensor):
        return obj.numel() * obj.element_size()
    if isinstance(obj, Mapping):
        return sum(_tensor_bytes(value) for value in obj.values())
    if isinstance(obj, list | tuple):
        return sum(_tensor_bytes(value) for value in obj)
    return 0


def write_error(
    step: int, path: Path, state: Any, error: BaseException, *, saved_step: int | None
) -> CheckpointWriteError:
    """What to say when a rank's file (`path`, holding `state`) of the checkpoint of `step` could
    not be written (a full disk, most often): what it needs, what is free, and what is kept (the
    checkpoint of `saved_step`, if any)."""
    need = _tensor_bytes(state) / MIB
    free = shutil.disk_usage(path.parent).free / MIB
    if saved_step:
        kept = (
            f"The previous checkpoint, of step {saved_step}, is intact: make room and "
            "continue from it with --resume"
        )
    else:
        kept = "This run wrote no checkpoint before: make room and start it again"
    return CheckpointWriteError(
        f"could not write the checkpoint of step {step} to {path} ({error}). It needs at "
        f"least {need:,.1f} MiB; the disk holding --out has {free:,.1f} MiB free. {kept}."
    )
