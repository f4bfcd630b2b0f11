"""bench-allreduce's measurement: time and bandwidth of all-reduce, gloo on the CPU and NCCL on
GPUs (§2.1), as `run_allreduce(config)`, and the `TOOL` its command runs.

The command line and what each option does: `bench.commands.allreduce` (`bench-allreduce --help`).
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import asdict
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from bench.commands.allreduce import AllReduceConfig
from bench.core.distributed import guarded_on_all_ranks, slowest_rank
from bench.core.launch import (
    DEFAULT_TIMEOUT_S,
    launch,
    rank_device,
    torchrun_world_size,
)
from bench.core.memory import free_memory
from bench.core.oom import OK, OOM, skipped
from bench.core.plots import line_plot
from bench.core.results import Keys, Run
from bench.core.timing import elapsed_ms, synchronize
from bench.core.tool import Invocation, Tool, as_device, config_or_default, progress

__all__ = [
    "COLUMNS",
    "KEYS",
    "TOOL",
    "AllReduceConfig",
    "bus_bandwidth_factor",
    "plot_allreduce",
    "run_allreduce",
]

BYTES_PER_MB = 10**6  # sizes and bandwidths in decimal units, as nccl-tests reports them
FLOAT32_BYTES = 4
# gloo above this is opt-in (`--full`): 1 GB per rank on up to 6 ranks is several GB of host
# memory, and each all-reduce takes seconds.
GLOO_DEFAULT_MAX_MB = 100.0
COLUMNS = (
    "backend",
    "world_size",
    "size_mb",
    "ms",
    "ms_std",
    "ms_min",
    "algbw_gbps",
    "busbw_gbps",
    "status",
)
# Every key of a row, for readers (bench-report).
KEYS = Keys(*COLUMNS)


def bus_bandwidth_factor(world_size: int) -> float:
    """nccl-tests' all-reduce bus-bandwidth factor `2 (n - 1) / n`."""
    return 2 * (world_size - 1) / world_size


def _skip_reason(config: AllReduceConfig, backend: str, world_size: int, size_mb: float):
    """Why a cell of the grid does not run on this machine, or None when it does."""
    if backend == "nccl":
        gpus = torch.cuda.device_count()
        return None if world_size <= gpus else f"needs {world_size} GPUs, found {gpus}"
    if config.full:
        return None
    cores = os.cpu_count() or 1
    if world_size > cores:
        return f"{world_size} gloo ranks on {cores} CPU cores (--full runs it)"
    if size_mb > GLOO_DEFAULT_MAX_MB:
        return f"gloo above {GLOO_DEFAULT_MAX_MB:g} MB is opt-in (--full)"
    return None


def _time_all_reduce(
    tensor: torch.Tensor, *, warmup: int, steps: int, device: torch.device
) -> list[float]:
    """`steps` timed in-place all-reduces (sum) of `tensor` after `warmup` untimed ones (ms)."""
    for _ in range(warmup):
        dist.all_reduce(tensor)
    samples = []
    for _ in range(steps):
        synchronize(device)
        dist.barrier()  # start together: time the collective, not the ranks' skew
        samples.append(elapsed_ms(lambda: dist.all_reduce(tensor), device=device)[1])
    return samples


def _rank_worker(
    rank: int,
    world_size: int,
    sizes_mb: tuple[float, ...],
    warmup: int,
    steps: int,
    backend: str,
) -> list[dict[str, Any]]:
    """This rank's samples for every size; a size any rank cannot allocate is `OOM` everywhere."""
    device = rank_device(backend)
    results = []
    for size_mb in sizes_mb:
        numel = int(size_mb * BYTES_PER_MB) // FLOAT32_BYTES
        # Only the allocation is guarded: a collective that failed on one rank alone would
        # leave the others waiting in it.
        outcome = guarded_on_all_ranks(lambda n=numel: torch.randn(n, device=device), device=device)
        if not outcome.ok:
            results.append({"status": OOM})
            continue
        times = _time_all_reduce(outcome.value, warmup=warmup, steps=steps, device=device)
        results.append({"status": OK, "times": times})
        del outcome
        free_memory(device)
    return results


def _row(
    backend: str, world_size: int, size_mb: float, per_rank: Sequence[dict[str, Any]] | None
) -> dict[str, Any]:
    row: dict[str, Any] = {"backend": backend, "world_size": world_size, "size_mb": size_mb}
    if per_rank is None or any(r["status"] != OK for r in per_rank):
        return {**row, "status": OOM}
    summary = slowest_rank([r["times"] for r in per_rank])
    num_bytes = int(size_mb * BYTES_PER_MB) // FLOAT32_BYTES * FLOAT32_BYTES
    algbw = num_bytes / (summary.median * 1e-3) / 1e9
    return {
        **row,
        "bytes": num_bytes,
        "ms": summary.median,
        "ms_std": summary.std,
        "ms_min": summary.min,
        "algbw_gbps": algbw,
        "busbw_gbps": algbw * bus_bandwidth_factor(world_size),
        "status": OK,
    }


def run_allreduce(
    config: AllReduceConfig | None = None,
    *,
    device: torch.device | str | None = None,
    command: str | None = None,
    timeout: float | None = DEFAULT_TIMEOUT_S,
    show_progress: bool = True,
) -> Run:
    """Measure every cell of `config`, one launch per (backend, world size).

    Args:
        config: what to run; the device's default (`AllReduceConfig`) when None.
        device: decides the default (CUDA when available when None); nccl cells always run on
            GPUs and gloo cells on the CPU.
        command: the command line to record; the process's own when None.
        timeout: seconds each launch may take.
        show_progress: a progress bar over the launches.

    Returns:
        A `Run` (tool `"allreduce"`): one row per backend × world size × size with the median
        time (ms), spread, algorithm and bus bandwidth (GB/s) and `status` (`ok`, `OOM`, or
        `skipped: <why>` for cells this machine cannot or by default does not run).
    """
    device = as_device(device)
    config, notes = config_or_default(
        config,
        device,
        cls=AllReduceConfig,
        tool="bench-allreduce",
        describe=lambda c: (
            f"gloo, {', '.join(f'{s:g}' for s in c.sizes_mb)} MB, world size "
            f"{', '.join(map(str, c.world_sizes))}"
        ),
    )
    world_sizes = config.world_sizes
    if torchrun_world_size() is not None:
        world_sizes = (torchrun_world_size(),)
        notes.append(f"Run under torchrun: world size {world_sizes[0]} only.")
    groups = [(b, n) for b in config.backends for n in world_sizes]
    rows = []
    for backend, world_size in progress(groups, desc="all-reduce", enabled=show_progress):
        reasons = [_skip_reason(config, backend, world_size, s) for s in config.sizes_mb]
        runnable = tuple(s for s, why in zip(config.sizes_mb, reasons, strict=True) if why is None)
        per_rank = []
        if runnable:
            per_rank = launch(
                _rank_worker,
                world_size=world_size,
                backend=backend,
                args=(runnable, config.warmup, config.steps, backend),
                timeout=timeout,
            )
        measured = iter(zip(*per_rank, strict=True))
        for size_mb, why in zip(config.sizes_mb, reasons, strict=True):
            if why is not None:
                row = {"backend": backend, "world_size": world_size, "size_mb": size_mb}
                rows.append({**row, "status": skipped(why)})
            else:
                rows.append(_row(backend, world_size, size_mb, next(measured)))
    notes.append(
        "Time: median over iterations of the slowest rank; busbw = algbw * 2(n-1)/n "
        "(nccl-tests); MB and GB/s are decimal."
    )
    return Run.create(
        "allreduce",
        rows,
        device=device,
        config=asdict(config),
        command=command,
        title=f"All-reduce of float32 tensors ({config.warmup} warm-up + {config.steps} timed "
        "iterations per size)",
        columns=list(COLUMNS),
        notes=notes,
    )


def plot_allreduce(run: Run, path: str | Path) -> Path:
    """Bus bandwidth against size, a line per world size, a panel per backend.

    Raises:
        ValueError: if no cell completed.
    """
    return line_plot(
        run.ok_rows,
        x="size_mb",
        y="busbw_gbps",
        series="world_size",
        panels="backend",
        path=path,
        title=f"all-reduce of float32 (median of the slowest rank), {run.env.get('device_name')}",
        xlabel="size (MB)",
        ylabel="bus bandwidth (GB/s)",
        logx=True,
    )


def _run(config: AllReduceConfig | None, cli: Invocation) -> Run:
    return run_allreduce(
        config,
        device=cli.device,
        command=cli.command,
        timeout=cli.args.timeout,
        show_progress=cli.show_progress,
    )


TOOL = Tool(run=_run, config=AllReduceConfig, plot=plot_allreduce)
