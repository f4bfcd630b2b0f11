"""What a run records while it trains: metrics lines, a progress bar or log lines, the interval
timer behind tokens/s and MFU, optional TensorBoard, and one step under torch.profiler.

Only rank 0 writes (`primary`); every rank keeps the same timer, so all agree on the intervals.
"""

from __future__ import annotations

import contextlib
import json
import os
import sys
import threading
import time
import warnings
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
from tqdm.auto import tqdm

import lmcore
from bench.core.env import device_name
from bench.core.hardware import matmul_format, peak_tflops
from bench.core.layouts import compute_dtype
from bench.core.profiling import profiler_activities
from bench.train.faults import kill_point

if TYPE_CHECKING:
    from bench.train.config import TrainConfig

__all__ = [
    "METRICS",
    "PROFILE",
    "PROFILE_TRACE",
    "TENSORBOARD",
    "Recorder",
    "logged_losses",
    "mfu_function",
    "profiled",
    "read_metrics",
]

METRICS = "metrics.jsonl"
PROFILE = "profile.txt"
PROFILE_TRACE = "profile.pt.trace.json"  # the profiled step's Chrome trace (Perfetto opens it)
TENSORBOARD = "tensorboard"  # the event files' folder in the run's output folder

MfuFn = Callable[[int, float], float]


def read_metrics(out: str | Path) -> list[dict[str, Any]]:
    """The records of a run's `metrics.jsonl`, in order.

    A last line that is not a whole record (the run was killed while appending it, or the disk
    filled) is left out, with a warning; a resumed run then rewrites the file without it.

    Raises:
        ValueError: a line before the last is not a record (the file is damaged).
    """
    path = Path(out) / METRICS
    lines = path.read_text().splitlines()
    records = []
    for number, line in enumerate(lines, 1):
        try:
            records.append(json.loads(line))
        except json.JSONDecodeError:
            if number < len(lines):
                raise ValueError(
                    f"{path}: line {number} is not a JSON record (the file is damaged); "
                    "remove that line, or start the run again in a new --out"
                ) from None
            warnings.warn(
                f"{path}: left out its last line, a partial record ({line[:40]!r}...): the run "
                "was killed while writing it",
                stacklevel=2,
            )
    return records


def logged_losses(out: str | Path) -> dict[int, float]:
    """A run's logged training losses by step (`read_metrics`' records that carry one)."""
    return {r["step"]: r["loss"] for r in read_metrics(out) if r.get("loss") is not None}


def mfu_function(
    config: TrainConfig, model_config: lmcore.ModelConfig, device: torch.device, world: int
) -> MfuFn | None:
    """(steps, seconds) → model FLOP utilisation; None off CUDA or where the peak is unknown.

    The model's training FLOPs per step (`lmcore.training_flops`: PaLM's count, 6·N_matmul +
    12·L·T·d per token, Chowdhery et al. 2022, appendix B) over the step time and the peak dense
    matmul FLOP/s of all the GPUs in use (`bench.core.hardware`).
    """
    if device.type != "cuda":
        return None
    dtype = compute_dtype(config.precision)
    peak = peak_tflops(device_name(device), matmul_format(dtype))
    if peak is None:
        return None
    flops = lmcore.training_flops(model_config, batch_size=config.batch_size)
    return lambda steps, seconds: flops * steps / seconds / (peak * 1e12 * world)


@contextlib.contextmanager
def profiled(config: TrainConfig, step: int, device: torch.device, primary: bool) -> Iterator[None]:
    """torch.profiler around `--profile-step`'s step; its table (by device time) and its
    Chrome trace (every kernel on its stream: what overlaps what) to files."""
    if step != config.profile_step or not primary:
        yield
        return
    with torch.profiler.profile(activities=profiler_activities(device)) as profiler:
        yield
        if device.type == "cuda":
            torch.cuda.synchronize(device)
    sort_by = "cuda_time_total" if device.type == "cuda" else "cpu_time_total"
    table = profiler.key_averages().table(sort_by=sort_by, row_limit=30, max_name_column_width=60)
    (Path(config.out) / PROFILE).write_text(f"step {step}, sorted by {sort_by}\n\n{table}\n")
    profiler.export_chrome_trace(str(Path(config.out) / PROFILE_TRACE))


class Recorder:
    """A run's metrics: `metrics.jsonl` (and TensorBoard), the bar or log lines, the speed.

    tokens/s and MFU are summed over the logged intervals after each invocation's first (which
    holds compilation and warm-up); the totals (`state`) go into every checkpoint, so that a
    resumed run's summary covers the whole run.

    Args:
        config: the run.
        start: the step training starts after (0, or the resumed checkpoint's).
        primary: this rank writes and prints.
        mfu: (steps, seconds) → MFU, or None where it is not known.
        saved: the totals the resumed checkpoint holds (`state`); None for a new run.
    """

    def __init__(
        self,
        config: TrainConfig,
        *,
        start: int,
        primary: bool,
        mfu: MfuFn | None,
        saved: dict[str, Any] | None = None,
    ) -> None:
        self.config, self.primary, self.mfu = config, primary, mfu
        self.out = Path(config.out)
        self.records: list[dict[str, Any]] = []
        saved = saved or {}
        self.steady = list(saved.get("steady", (0, 0.0)))  # steps, seconds after the first
        self.first = list(saved.get("first", (0, 0.0)))  # each invocation's first interval
        self.first_step_s: float | None = saved.get("first_step_s")  # the latest invocation's
        self.intervals = 0
        self.excluded = False  # the current interval holds a profiled step: not a speed sample
        self.last_step, self.started = start, time.perf_counter()
        self.writer = None
        if primary:
            self.records = self._previous(start)
            tmp = self.out / (METRICS + ".tmp")  # replaced whole: a kill keeps the old file
            tmp.write_text("".join(json.dumps(r) + "\n" for r in self.records))
            os.replace(tmp, self.out / METRICS)
            if config.tensorboard:
                from torch.utils.tensorboard import SummaryWriter

                # purge_step: events a killed run logged after its checkpoint are dropped.
                purge = start if start else None
                self.writer = SummaryWriter(str(self.out / TENSORBOARD), purge_step=purge)
        show = primary and config.progress
        total = config.last_step - start
        # A thread lock for tqdm, not its default cross-process one: a rank would register
        # that semaphore with the launcher's resource tracker and end (os._exit) without
        # unregistering it, and the launcher would warn of leaked semaphores on exit.
        tqdm.set_lock(threading.RLock())
        self.bar = tqdm(total=total, desc="bench-train", file=sys.stderr, disable=not show)

    def _previous(self, start: int) -> list[dict[str, Any]]:
        if start == 0 or not (self.out / METRICS).is_file():
            return []
        return [r for r in read_metrics(self.out) if r["step"] <= start]

    def state(self) -> dict[str, Any]:
        """The totals a checkpoint keeps (see the class docstring)."""
        return {"first": self.first, "steady": self.steady, "first_step_s": self.first_step_s}

    def final(self) -> dict[str, Any]:
        """The last record (rank 0; empty elsewhere, or before any)."""
        return self.records[-1] if self.records else {}

    def say(self, text: str) -> None:
        """Print a line on rank 0 (above the progress bar, if there is one)."""
        if self.primary:
            tqdm.write(text, file=sys.stderr)

    def restart_clock(self) -> None:
        """Leave the time since the last log (evaluation, saving) out of the next interval."""
        self.started = time.perf_counter()

    def exclude_interval(self) -> None:
        """Leave the current interval out of the summary's speed (it ran under the profiler)."""
        self.excluded = True

    def elapsed(self) -> float:
        """Seconds since the last log: read it before an evaluation, which is not training."""
        return time.perf_counter() - self.started

    def log(
        self,
        step: int,
        loss: float,
        lr: float,
        val_loss: float | None,
        seconds: float,
        *,
        scaling: Mapping[str, float] | None = None,
    ) -> None:
        """Record `step`; `seconds` is the interval's training time (see `elapsed`); `scaling`:
        fp16's `loss_scale` and `skipped_steps` so far, recorded with it."""
        steps = step - self.last_step
        tokens_per_s = steps * self.config.batch_size * self.config.context_length / seconds
        record = {"step": step, "loss": loss, "lr": lr, "tokens_per_s": tokens_per_s}
        record["mfu"] = None if self.mfu is None else self.mfu(steps, seconds)
        if val_loss is not None:
            record["val_loss"] = val_loss
        record.update(scaling or {})
        if not self.excluded:
            bucket = self.first if self.intervals == 0 else self.steady
            bucket[0] += steps
            bucket[1] += seconds
        self.excluded = False
        self.intervals += 1
        self.last_step = step
        self.bar.update(steps)
        if not self.primary:
            return
        self.records.append(record)
        with open(self.out / METRICS, "a") as f:
            f.write(json.dumps(record) + "\n")
        kill_point("metrics", step)
        if self.writer is not None:
            for key, value in record.items():
                if key != "step" and value is not None:
                    self.writer.add_scalar(key, value, step)
        shown = f"loss {loss:.4f}" + ("" if val_loss is None else f" val {val_loss:.4f}")
        if scaling is not None:
            shown += f", scale {scaling['loss_scale']:g} ({scaling['skipped_steps']} skipped)"
        if self.config.progress:
            self.bar.set_postfix_str(f"{shown} {tokens_per_s:,.0f} tok/s")
        else:
            self.say(
                f"step {step}/{self.config.steps}: {shown}, lr {lr:.3g}, {tokens_per_s:,.0f} tok/s"
            )

    def speed(self) -> tuple[float | None, float | None]:
        """tokens/s and MFU over the intervals after the first (all of them if only one)."""
        steps, seconds = self.steady if self.steady[0] else self.first
        if not steps:
            return None, None
        tokens_per_s = steps * self.config.batch_size * self.config.context_length / seconds
        return tokens_per_s, None if self.mfu is None else self.mfu(steps, seconds)

    def close(self) -> None:
        """End the bar and flush TensorBoard's events."""
        self.bar.close()
        if self.writer is not None:
            self.writer.close()
