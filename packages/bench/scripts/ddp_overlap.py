"""How much of DDPBucketed's all-reduce each overlap lever hides end to end, in one 2-GPU call.

What a data-parallel step pays beyond one GPU's step has two parts: the communication left
after backward (the tail: what `finish_gradient_synchronization()` waits for), and what the
communication that overlaps backward takes from it (NCCL's kernels hold an SM per channel while
they run, and use memory bandwidth). `hidden_e2e` puts both in one number, as bench-ddp does:

    hidden_e2e = 1 - (step - single-GPU step) / (a standalone all-reduce of every gradient)

This script measures it for `ddp.DDPBucketed` with each lever of `ddp` alone and in
combination, at each bucket size, beside torch's DistributedDataParallel, in fp32 and in bf16
autocast, at the 2026 handout's `xl` with bench-ddp's context and batch:

- `tail`: `last_bucket_size_mb` (the last buckets of backward shrink, so little is left after it);
- `opt`: each bucket's AdamW step run from `register_reduced_hook` as the bucket lands, so the
  tail overlaps the optimizer;
- `ctasN`, `efficiency`, `comm-hi`: the all-reduces on a `ddp.comm_group` whose NCCL kernels
  use at most N CTAs (SMs), NCCL's `efficiency` CTA policy, or a high-priority stream;
- `compute-hi`: the training step itself on a high-priority stream (NCCL's stays normal);
- `bf16-wire` (bf16 autocast only): `grad_dtype=torch.bfloat16`, half the bytes, rounded.

Rows of combinations are chosen after the single levers ran (the best communicator lever with
`tail` and `opt`). Every row also gets `pred_tail_ms`: the tail a model predicts with no
contention at all (each bucket's all-reduce starts when its last gradient is ready, backward's
time spread over the parameters by size in reverse registration order, each bucket taking what
the standalone all-reduce of its size took on that row's communicator); `overhead_ms` well above
it is contention. Then one step of `single`, the default `DDPBucketed`, the best plain bucket
size and the best row is traced with `torch.profiler` (rank 0's trace under `$OUT/traces/`),
and each trace is summarised: compute and NCCL kernel time, their overlap, NCCL time with no
compute beside it (`exposed`), idle time, the compute time added over `single` (`inflation`:
contention), the CTAs of NCCL's kernels.

Usage, from the repository root, on a machine with 2 GPUs (the first two visible ones;
`CUDA_VISIBLE_DEVICES=2,3` picks others). It starts no new work `--budget-s` (330) seconds
after it started its ranks, and kills them 25 s later, keeping what they measured::

    export PYTHONPATH=$(ls -d $PWD/packages/*/src | paste -sd:)
    python3 packages/bench/scripts/ddp_overlap.py --out "$OUT"

On a CPU, `--tiny` rehearses everything on 2 gloo ranks with the `tiny` model in seconds
(NCCL-only and CUDA-only levers are reported as skipped). Results: `ddp_overlap.json` (rows,
trace summaries, device, versions, git revision, date, command; rewritten after every row, so
a run cut short keeps what it measured), `ddp_overlap.md`, and the traces; the table is printed
last.
"""

from __future__ import annotations

import argparse
import bisect
import contextlib
import datetime
import gc
import gzip
import json
import math
import os
import platform
import shlex
import socket
import statistics
import sys
import time
import traceback
import weakref
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch import nn
from torch.nn.parallel import DistributedDataParallel

import ddp
import lmcore
from bench.core.env import code_version

ROOT = Path(__file__).resolve().parents[3]
WORLD_SIZE = 2
# bench-ddp's defaults (`bench.core.training_bench.TrainingBenchConfig`), so that rows
# compare with its results: the 2026 `xl` at context 128, batch 4 per rank; on a CPU, `tiny`.
GPU_SHAPE = {"size": "xl", "context_length": 128, "batch": 4}
CPU_SHAPE = {"size": "tiny", "context_length": 32, "batch": 2}
# bench's AdamW settings (`bench.core.training_bench.ADAMW_OPTIONS`): only the state AdamW keeps
# matters for timing.
ADAMW_OPTIONS = {"lr": 1e-4, "weight_decay": 0.01}
BUCKET_SIZES_MB = (25.0, 100.0, 1000.0)  # DDPBucketed's default, and bench-ddp's two largest
DEFAULT_BUCKET_MB = ddp.DEFAULT_BUCKET_SIZE_MB
# The shrinking buckets stop at torch DDP's default bucket size; xl's smallest weight matrices
# are that size (2560 x 2560 x 4 B = 25 MiB), so its last buckets are single tensors, the
# embedding (10,000 x 2560 x 4 B) the very last.
LAST_BUCKET_MB = 25.0
# `tiny`'s fp32 gradients: 10,000 x 64 x 4 B = 2.56 MB for each of the embedding and the LM head,
# and 65,664 x 4 B = 0.26 MB per block; these sizes give it many buckets, a few, and two.
TINY_BUCKET_SIZES_MB = (0.25, 1.0, 4.0)
TINY_LAST_BUCKET_MB = 0.1
# Communicators: CTA caps around NCCL's own choice (which the traces' `nccl_ctas` shows), its
# efficiency policy, and a high-priority NCCL stream; `default` is the world group.
COMMS: dict[str, dict[str, Any]] = {
    "default": {},
    "ctas16": {"max_ctas": 16},
    "ctas8": {"max_ctas": 8},
    "ctas4": {"max_ctas": 4},
    "efficiency": {"cta_policy": "efficiency"},
    "comm-hi": {"high_priority_stream": True},
}
# Standalone all-reduce sizes (bytes) for `pred_tail_ms`'s curve, besides the whole gradient.
SWEEP_BYTES = (10**6, 10**7, 10**8, 10**9)
DTYPES = {"fp32": None, "bf16": torch.bfloat16}  # autocast dtype of each precision
# Seconds from the start by which each part stops starting rows (scaled to --budget-s): start-up
# and the all-reduce sweep, fp32 rows, bf16 rows, traces, torch DDP. A part that ends early
# leaves its time to the next.
PART_DEADLINES = {"allreduce": 0.2, "fp32": 0.53, "bf16": 0.75, "traces": 0.9, "torch": 1.0}
DEFAULT_BUDGET_S = 330.0  # a 6-minute GPU call, less 30 s for start-up and shut-down
HARD_MARGIN_S = 25.0  # the parent kills ranks this long after the budget
ROW_MARGIN = 1.2  # a row starts only if 1.2x the last row's duration fits before the deadline


# Cases and levers ------------------------------------------------------------------------------


@dataclass(frozen=True)
class Levers:
    """The overlap levers of one DDPBucketed row (all off: plain DDPBucketed)."""

    tail: bool = False
    opt: bool = False
    comm: str = "default"
    compute_hi: bool = False
    bf16_wire: bool = False

    def names(self) -> list[str]:
        names = [n for n, on in (("tail", self.tail), ("opt", self.opt)) if on]
        if self.comm != "default":
            names.append(self.comm)
        if self.compute_hi:
            names.append("compute-hi")
        if self.bf16_wire:
            names.append("bf16-wire")
        return names


@dataclass(frozen=True)
class Case:
    """One measured row: `single`, `bucketed` (with a size and levers) or `torch-ddp`."""

    variant: str
    dtype: str
    bucket_mb: float | None = None
    levers: Levers = field(default_factory=Levers)

    @property
    def label(self) -> str:
        if self.variant == "bucketed":
            extra = "".join(f" +{name}" for name in self.levers.names())
            return f"bucketed {self.bucket_mb:g} MB{extra}"
        if self.variant == "torch-ddp":
            return f"torch-ddp {DEFAULT_BUCKET_MB:g} MB (default)"
        return self.variant


def single_lever_cases(dtype: str, sizes: Sequence[float], *, cuda: bool) -> list[Case]:
    """Each lever alone at each size, largest sizes first (what the budget keeps if it ends)."""
    levers = [Levers(tail=True), Levers(opt=True)]
    levers += [Levers(comm=name) for name in COMMS if name != "default"]
    levers.append(Levers(compute_hi=True))
    if dtype == "bf16":
        levers.append(Levers(bf16_wire=True))
    if not cuda:
        levers = [lv for lv in levers if lv.comm == "default" and not lv.compute_hi]
    return [Case("bucketed", dtype, mb, lv) for mb in sorted(sizes, reverse=True) for lv in levers]


def combination_cases(
    dtype: str, sizes: Sequence[float], rows: Sequence[dict[str, Any]]
) -> list[Case]:
    """`tail` with `opt`, and both with the best communication lever of the single-lever rows
    (the lowest step time at any size); with `bf16-wire` too in bf16."""
    singles = [
        r for r in rows if r["dtype"] == dtype and r["status"] == "ok" and r.get("lever_count") == 1
    ]
    comm_rows = [
        r for r in singles if r["levers"]["comm"] != "default" or r["levers"]["compute_hi"]
    ]
    best = min(comm_rows, key=lambda r: r["step_ms"], default=None)
    plan = [Levers(tail=True, opt=True)]
    if best is not None:
        comm = Levers(comm=best["levers"]["comm"], compute_hi=best["levers"]["compute_hi"])
        plan += [
            replace(comm, tail=True),
            replace(comm, opt=True),
            replace(comm, tail=True, opt=True),
        ]
    if dtype == "bf16":
        plan += [replace(lv, bf16_wire=True) for lv in plan[-1:]]
    return [Case("bucketed", dtype, mb, lv) for mb in sorted(sizes, reverse=True) for lv in plan]


# Pure helpers: intervals, trace summaries, the all-reduce curve, the tail model ---------------


def union(intervals: Sequence[tuple[float, float]]) -> list[tuple[float, float]]:
    """The disjoint, sorted union of `(start, end)` intervals."""
    merged: list[tuple[float, float]] = []
    for start, end in sorted(intervals):
        if merged and start <= merged[-1][1]:
            merged[-1] = (merged[-1][0], max(merged[-1][1], end))
        else:
            merged.append((start, end))
    return merged


def total(intervals: Sequence[tuple[float, float]]) -> float:
    return sum(end - start for start, end in intervals)


def intersection(a: Sequence[tuple[float, float]], b: Sequence[tuple[float, float]]) -> float:
    """The length of the intersection of two disjoint, sorted interval lists."""
    i = j = 0
    length = 0.0
    while i < len(a) and j < len(b):
        length += max(0.0, min(a[i][1], b[j][1]) - max(a[i][0], b[j][0]))
        if a[i][1] < b[j][1]:
            i += 1
        else:
            j += 1
    return length


def is_nccl_kernel(name: str) -> bool:
    return "nccl" in name.lower()


def summarize_trace(events: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """Numbers of one profiled step from its Chrome-trace events (times in ms).

    `compute_ms`/`nccl_ms`: time at least one compute/NCCL kernel runs; `overlap_ms`: both at
    once; `exposed_ms`: NCCL with no compute beside it; `idle_ms`: no kernel at all, within
    `window_ms` (first kernel start to last kernel end); `nccl_ctas`: the largest grid of an
    NCCL kernel; `streams`: per CUDA stream, its kind, busy time and kernel count;
    `launch_ms`: host time in the wrappers' ``ddp.all_reduce`` ranges. With no kernel (a CPU
    run) the kernel numbers are None.
    """
    kernels = [e for e in events if e.get("cat") == "kernel" and e.get("ph") == "X"]
    launches = [
        e["dur"]
        for e in events
        if e.get("name") == "ddp.all_reduce" and e.get("cat") == "user_annotation"
    ]
    summary: dict[str, Any] = {"launch_ms": sum(launches) / 1e3, "launches": len(launches)}
    if not kernels:
        return {**summary, "window_ms": None, "compute_ms": None, "nccl_ms": None}
    spans = [(e["ts"] / 1e3, (e["ts"] + e["dur"]) / 1e3, e) for e in kernels]
    nccl = union([(s, t) for s, t, e in spans if is_nccl_kernel(e["name"])])
    compute = union([(s, t) for s, t, e in spans if not is_nccl_kernel(e["name"])])
    busy = union([(s, t) for s, t, _ in spans])
    window = max(t for _, t, _ in spans) - min(s for s, _, _ in spans)
    overlap = intersection(nccl, compute)
    grids = [
        math.prod(e.get("args", {}).get("grid", [0]))
        for _, _, e in spans
        if is_nccl_kernel(e["name"])
    ]
    streams: dict[str, dict[str, Any]] = {}
    for stream in sorted({e.get("args", {}).get("stream") for _, _, e in spans}, key=str):
        mine = [(s, t, e) for s, t, e in spans if e.get("args", {}).get("stream") == stream]
        streams[str(stream)] = {
            "kind": "nccl" if any(is_nccl_kernel(e["name"]) for _, _, e in mine) else "compute",
            "busy_ms": total(union([(s, t) for s, t, _ in mine])),
            "kernels": len(mine),
        }
    return {
        **summary,
        "window_ms": window,
        "compute_ms": total(compute),
        "nccl_ms": total(nccl),
        "overlap_ms": overlap,
        "exposed_ms": total(nccl) - overlap,
        "idle_ms": window - total(busy),
        "nccl_kernels": len(grids),
        "nccl_ctas": max(grids, default=None),
        "streams": streams,
    }


def interpolate_ms(curve: Sequence[tuple[int, float]], num_bytes: int) -> float:
    """All-reduce time of `num_bytes` from measured `(bytes, ms)` points: log-log between
    points, the largest segment's bandwidth above them, the smallest time below them."""
    points = sorted(curve)
    sizes = [b for b, _ in points]
    if num_bytes <= sizes[0]:
        return points[0][1]
    if num_bytes >= sizes[-1]:
        (b0, t0), (b1, t1) = points[-2], points[-1]
        return t1 + (num_bytes - b1) * (t1 - t0) / (b1 - b0)
    k = bisect.bisect_left(sizes, num_bytes)
    (b0, t0), (b1, t1) = points[k - 1], points[k]
    f = (math.log(num_bytes) - math.log(b0)) / (math.log(b1) - math.log(b0))
    return math.exp(math.log(t0) + f * (math.log(t1) - math.log(t0)))


def predicted_tail_ms(
    bucket_numels: Sequence[Sequence[int]],
    bucket_bytes: Sequence[int],
    backward_ms: float,
    curve: Sequence[tuple[int, float]],
) -> float:
    """Communication left after backward if nothing contended (see the module docstring).

    `bucket_numels`: the parameters' sizes of each bucket in launch order (every parameter
    once, walked in reverse registration order); a parameter's gradient is ready when backward
    has done its share of the numbers up to and including it; buckets run one after another.
    """
    numel_total = sum(sum(b) for b in bucket_numels)
    done = 0
    end = 0.0
    for numels, num_bytes in zip(bucket_numels, bucket_bytes, strict=True):
        done += sum(numels)
        ready = backward_ms * done / numel_total
        end = max(end, ready) + interpolate_ms(curve, num_bytes)
    return max(0.0, end - backward_ms)


def slowest_median(per_rank: Sequence[Sequence[float]]) -> tuple[float, float]:
    """Median and standard deviation over steps of the slowest rank's time at each step."""
    worst = [max(times) for times in zip(*per_rank, strict=True)]
    spread = statistics.stdev(worst) if len(worst) > 1 else 0.0
    return statistics.median(worst), spread


# On each rank ----------------------------------------------------------------------------------


@dataclass
class Rank:
    """What a rank holds across rows: its device, groups, model, optimizer and batches."""

    rank: int
    device: torch.device
    shape: dict[str, Any]
    steps: int
    warmup: int
    deadlines: dict[str, float]
    start: float
    groups: dict[str, dist.ProcessGroup] = field(default_factory=dict)
    model: nn.Module | None = None
    optimizer: torch.optim.Optimizer | None = None
    batches: list[torch.Tensor] = field(default_factory=list)
    torch_ddp: nn.Module | None = None  # one for every precision: it keeps hooks on the model
    last_row_s: float = 0.0

    @property
    def cuda(self) -> bool:
        return self.device.type == "cuda"

    def synchronize(self) -> None:
        if self.cuda:
            torch.cuda.synchronize(self.device)

    def agree(self, go: bool) -> bool:
        """Rank 0's decision, on every rank (each must run the same collectives)."""
        flag = torch.tensor([int(go)], device=self.device)
        dist.broadcast(flag, src=0)
        return bool(flag.item())

    def fits(self, part: str) -> bool:
        left = self.deadlines[part] - (time.monotonic() - self.start)
        return self.agree(left > ROW_MARGIN * self.last_row_s)


def _model_config(shape: dict[str, Any]) -> lmcore.ModelConfig:
    return lmcore.model_config(shape["size"], context_length=shape["context_length"])


def _build_model(ctx: Rank) -> nn.Module:
    """The model on the device, from a seed per rank (the wrappers broadcast rank 0's)."""
    torch.manual_seed(ctx.rank)
    config = _model_config(ctx.shape)
    if not ctx.cuda:
        return lmcore.TransformerLM.from_config(config)
    with torch.device("meta"):  # skips the slow CPU initialisation of xl
        model = lmcore.TransformerLM.from_config(config)
    model = model.to_empty(device=ctx.device)
    model.reset_parameters()
    return model


def _batches(ctx: Rank, count: int) -> list[torch.Tensor]:
    """Token batches `(batch, context_length + 1)`, each rank its own (as bench-ddp's)."""
    g = torch.Generator().manual_seed(1000 + ctx.rank)
    shape = (ctx.shape["batch"], ctx.shape["context_length"] + 1)
    vocab = _model_config(ctx.shape).vocab_size
    return [torch.randint(vocab, shape, generator=g).to(ctx.device) for _ in range(count)]


class _HostEvent:
    """The two methods of a CUDA event that a step's marks use, on the host clock (CPU runs)."""

    def record(self) -> None:
        self.seconds = time.perf_counter()

    def elapsed_time(self, end: _HostEvent) -> float:
        return (end.seconds - self.seconds) * 1e3


def _event(ctx: Rank) -> torch.cuda.Event | _HostEvent:
    return torch.cuda.Event(enable_timing=True) if ctx.cuda else _HostEvent()


def _time_ms(ctx: Rank, fn: Callable[[], None], stream: torch.cuda.Stream | None) -> float:
    """Device time of `fn()` with the device idle before it (CUDA events on `stream`)."""
    ctx.synchronize()
    if not ctx.cuda:
        start = time.perf_counter()
        fn()
        return (time.perf_counter() - start) * 1e3
    begin, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    with torch.cuda.stream(stream) if stream is not None else contextlib.nullcontext():
        begin.record()
        fn()
        end.record()
    end.synchronize()
    return begin.elapsed_time(end)


def measure_allreduce(ctx: Rank, group_name: str, num_bytes: Sequence[int]) -> dict[int, float]:
    """Median ms (slowest rank) of an all-reduce of each size, alone, on one communicator."""
    group = ctx.groups[group_name]
    buffer = torch.randn(max(num_bytes) // 4, device=ctx.device)  # fp32, like the gradients
    result = {}
    for size in num_bytes:
        chunk = buffer[: size // 4]
        times = []
        for index in range(2 + ctx.steps):
            dist.barrier(group=group)
            ms = _time_ms(ctx, lambda c=chunk: dist.all_reduce(c, group=group), None)
            if index >= 2:
                times.append(ms)
        per_rank: list[Any] = [None] * WORLD_SIZE
        dist.all_gather_object(per_rank, times)
        result[size] = slowest_median(per_rank)[0]
    del buffer
    return result


def _train_step(
    model: nn.Module,
    tokens: torch.Tensor,
    *,
    autocast: torch.dtype | None,
    step: Sequence[torch.optim.Optimizer],
    zero: Sequence[torch.optim.Optimizer],
    marks: list[Any] | None = None,
) -> None:
    """bench's training step: forward, backward, synchronisation, the optimizers in `step`,
    `zero_grad(set_to_none=False)` of those in `zero` (gradients stay bucket views)."""
    if hasattr(model, "on_train_batch_start"):
        model.on_train_batch_start()
    device_type = tokens.device.type
    with torch.autocast(device_type, dtype=autocast, enabled=autocast is not None):
        loss = lmcore.cross_entropy(model(tokens[:, :-1]), tokens[:, 1:])  # logits (b, s, V)
    if marks is not None:
        marks[0].record()
    loss.backward()
    if hasattr(model, "finish_gradient_synchronization"):
        model.finish_gradient_synchronization()
    if marks is not None:
        marks[1].record()
    for optimizer in step:
        optimizer.step()
    for optimizer in zero:
        optimizer.zero_grad(set_to_none=False)


@dataclass
class Wrapped:
    """A case made ready to step: the module to call, what to step and zero, the stream."""

    model: nn.Module
    step: list[torch.optim.Optimizer]
    zero: list[torch.optim.Optimizer]
    stream: torch.cuda.Stream | None
    close: Callable[[], None]


def _bucket_optimizers(wrapper: ddp.DDPBucketed, whole: torch.optim.Optimizer) -> list[Any]:
    """One AdamW per bucket, stepped from a reduced hook. They share `whole`'s state dict: the
    same per-parameter moments, no second copy of them (8 bytes per parameter)."""
    optimizers = []
    for params in wrapper.bucket_params:
        optimizer = torch.optim.AdamW(params, **ADAMW_OPTIONS)
        optimizer.state = whole.state
        optimizers.append(optimizer)
    wrapper.register_reduced_hook(lambda bucket, params: optimizers[bucket].step())
    return optimizers


def wrap(ctx: Rank, case: Case) -> Wrapped:
    model, whole = ctx.model, ctx.optimizer
    assert model is not None and whole is not None
    if case.variant == "single":
        return Wrapped(model, [whole], [whole], None, lambda: None)
    if case.variant == "torch-ddp":
        if ctx.torch_ddp is None:
            device_ids = [ctx.device.index] if ctx.cuda else None
            ctx.torch_ddp = DistributedDataParallel(model, device_ids=device_ids)
        return Wrapped(ctx.torch_ddp, [whole], [whole], None, lambda: None)
    lv = case.levers
    last_mb = LAST_BUCKET_MB if ctx.cuda else TINY_LAST_BUCKET_MB
    wrapper = ddp.DDPBucketed(
        model,
        case.bucket_mb,
        last_bucket_size_mb=last_mb if lv.tail else None,
        process_group=ctx.groups[lv.comm],
        grad_dtype=torch.bfloat16 if lv.bf16_wire else None,
        record_comm_stats=True,
    )
    steps = _bucket_optimizers(wrapper, whole) if lv.opt else [whole]
    stream = torch.cuda.Stream(device=ctx.device, priority=-1) if lv.compute_hi else None
    ref = weakref.ref(wrapper)

    def close() -> None:
        # The wrapper must be gone before the next one: its gradient hooks would communicate.
        gc.collect()
        if ref() is not None:
            raise RuntimeError(f"{case.label}: the wrapper outlived its row")

    return Wrapped(wrapper, [] if lv.opt else steps, steps, stream, close)


def _grads_are_views(model: nn.Module) -> bool | None:
    """Whether every bucket's gradients share one storage (no copies into the buckets)."""
    if not isinstance(model, ddp.DDPBucketed):
        return None
    return all(
        len({p.grad.untyped_storage().data_ptr() for p in params}) == 1
        for params in model.bucket_params
    )


def run_case(ctx: Rank, case: Case) -> dict[str, Any]:
    """One rank's measurements of one case: step times, waits, communication, the split of the
    single step, and the bucket plan (for `pred_tail_ms`)."""
    wrapped = wrap(ctx, case)
    autocast = DTYPES[case.dtype]
    times, waits, comms, splits = [], [], [], []
    if ctx.cuda:
        torch.cuda.reset_peak_memory_stats(ctx.device)
    for index in range(ctx.warmup + ctx.steps):
        tokens = ctx.batches[index % len(ctx.batches)]
        marks = [_event(ctx), _event(ctx)] if case.variant == "single" else None

        def step(tokens=tokens, marks=marks) -> None:
            _train_step(
                wrapped.model,
                tokens,
                autocast=autocast,
                step=wrapped.step,
                zero=wrapped.zero,
                marks=marks,
            )

        ms = _time_ms(ctx, step, wrapped.stream)
        if index < ctx.warmup:
            continue
        times.append(ms)
        stats = getattr(wrapped.model, "comm_stats", None)
        if stats is not None:
            waits.append(stats.wait_ms)
            comms.append(stats.comm_ms)
        if marks is not None:
            splits.append(marks[0].elapsed_time(marks[1]))
    result: dict[str, Any] = {
        "times": times,
        "waits": waits or None,
        "comms": comms if comms and None not in comms else None,
        "backward_ms": statistics.median(splits) if splits else None,
        "peak_gib": torch.cuda.max_memory_allocated(ctx.device) / 2**30 if ctx.cuda else None,
        "grad_views": _grads_are_views(wrapped.model),
    }
    if isinstance(wrapped.model, ddp.DDPBucketed):
        plan = wrapped.model.bucket_params
        itemsize = 2 if case.levers.bf16_wire else 4
        result["bucket_numels"] = [[p.numel() for p in params] for params in plan]
        result["bucket_bytes"] = [sum(n) * itemsize for n in result["bucket_numels"]]
        result["collectives"] = wrapped.model.comm_stats.num_collectives
    del wrapped.model
    wrapped.close()
    return result


def profile_case(ctx: Rank, case: Case, path: Path) -> dict[str, Any]:
    """Trace two steps (the first warms the profiler up), rank 0's second step written to
    `path`; every rank returns the summary of its own trace."""
    wrapped = wrap(ctx, case)
    autocast = DTYPES[case.dtype]
    for tokens in ctx.batches[: ctx.warmup]:
        _time_ms(
            ctx,
            lambda t=tokens: _train_step(
                wrapped.model, t, autocast=autocast, step=wrapped.step, zero=wrapped.zero
            ),
            wrapped.stream,
        )
    activities = [torch.profiler.ProfilerActivity.CPU]
    if ctx.cuda:
        activities.append(torch.profiler.ProfilerActivity.CUDA)
    local = path.with_name(f"{path.name}.rank{ctx.rank}.json")
    with torch.profiler.profile(
        activities=activities,
        schedule=torch.profiler.schedule(wait=0, warmup=1, active=1, repeat=1),
        on_trace_ready=lambda p: p.export_chrome_trace(str(local)),
    ) as prof:
        for tokens in ctx.batches[:2]:
            _time_ms(
                ctx,
                lambda t=tokens: _train_step(
                    wrapped.model, t, autocast=autocast, step=wrapped.step, zero=wrapped.zero
                ),
                wrapped.stream,
            )
            prof.step()
    trace = json.loads(local.read_text())
    if ctx.rank == 0:
        with gzip.open(path, "wt", compresslevel=3) as f:  # tens of MB of JSON: fast, not small
            json.dump(trace, f)
    local.unlink()
    events = trace["traceEvents"]
    del wrapped.model
    wrapped.close()
    return summarize_trace(events)


# The run ---------------------------------------------------------------------------------------


class Recorder:
    """Rank 0's results: rows, all-reduce curves and trace summaries, rewritten after each."""

    def __init__(self, out: Path, meta: dict[str, Any]) -> None:
        self.out = out
        self.meta = meta
        self.rows: list[dict[str, Any]] = []
        self.curves: dict[str, dict[int, float]] = {}
        self.traces: list[dict[str, Any]] = []

    def save(self) -> None:
        payload = {
            **self.meta,
            "rows": self.rows,
            "allreduce_ms": {
                k: {str(b): ms for b, ms in v.items()} for k, v in self.curves.items()
            },
            "traces": self.traces,
        }
        (self.out / "ddp_overlap.json").write_text(json.dumps(payload, indent=1))


def _case_fields(case: Case) -> dict[str, Any]:
    return {
        "dtype": case.dtype,
        "case": case.label,
        "variant": case.variant,
        "bucket_mb": case.bucket_mb,
        "levers": asdict(case.levers),
        "lever_count": len(case.levers.names()),
    }


def _row(case: Case, per_rank: Sequence[dict[str, Any]]) -> dict[str, Any]:
    first = per_rank[0]
    step, std = slowest_median([r["times"] for r in per_rank])
    row: dict[str, Any] = {
        **_case_fields(case),
        "step_ms": step,
        "step_ms_std": std,
        "backward_ms": first["backward_ms"],
        "peak_gib": max((r["peak_gib"] or 0.0) for r in per_rank) or None,
        "grad_views": first["grad_views"],
        "collectives": first.get("collectives"),
        "status": "ok",
    }
    if first["waits"] is not None:
        row["wait_ms"] = slowest_median([r["waits"] for r in per_rank])[0]
    if all(r["comms"] is not None for r in per_rank):
        row["comm_ms"] = slowest_median([r["comms"] for r in per_rank])[0]
    for key in ("bucket_numels", "bucket_bytes"):
        if key in first:
            row[key] = first[key]
    return row


def _skipped(case: Case, why: str) -> dict[str, Any]:
    return {**_case_fields(case), "status": f"skipped: {why}"}


def run_rows(ctx: Rank, rec: Recorder | None, cases: Sequence[Case], part: str) -> list[dict]:
    """Measure `cases` in order while the part's deadline allows; every rank gets every row."""
    rows = []
    for case in cases:
        began = time.monotonic()
        if not ctx.fits(part):
            rows.append(_skipped(case, f"time budget ({part})"))
        else:
            try:
                mine: dict[str, Any] = {"ok": run_case(ctx, case)}
            except torch.OutOfMemoryError:
                mine = {"error": "out of memory"}
            except RuntimeError as e:  # reported, and the run goes on to the next row
                mine = {"error": f"{type(e).__name__}: {str(e)[:200]}"}
            per_rank: list[Any] = [None] * WORLD_SIZE
            dist.all_gather_object(per_rank, mine)
            if all("ok" in r for r in per_rank):
                rows.append(_row(case, [r["ok"] for r in per_rank]))
            else:
                rows.append(_skipped(case, next(r["error"] for r in per_rank if "error" in r)))
            ctx.last_row_s = time.monotonic() - began
        if rec is not None:
            rec.rows.append(rows[-1])
            add_comparisons(rec)
            rec.save()
    return rows


def add_comparisons(rec: Recorder) -> None:
    """`overhead_ms` over `single` (mean of its rows), `hidden_e2e` against the standalone
    all-reduce of every fp32 gradient on the default communicator, `vs_torch` against torch
    DDP's default, and `pred_tail_ms`, for every measured row."""
    full = rec.meta["grad_bytes"]["fp32"]
    alone = rec.curves.get("default", {}).get(full)
    for dtype in DTYPES:
        ok = [r for r in rec.rows if r["dtype"] == dtype and r["status"] == "ok"]
        singles = [r for r in ok if r["variant"] == "single"]
        torch_ddp = next((r for r in ok if r["variant"] == "torch-ddp"), None)
        if not singles:
            continue
        single_ms = statistics.mean(r["step_ms"] for r in singles)
        backward = [r["backward_ms"] for r in singles if r["backward_ms"] is not None]
        for row in ok:
            if row["variant"] == "single":
                continue
            row["overhead_ms"] = row["step_ms"] - single_ms
            if alone:
                row["hidden_e2e"] = 1.0 - row["overhead_ms"] / alone
            if torch_ddp is not None:
                row["vs_torch"] = row["step_ms"] / torch_ddp["step_ms"]
            curve = rec.curves.get(row["levers"]["comm"])
            if backward and curve and "bucket_bytes" in row:
                row["pred_tail_ms"] = predicted_tail_ms(
                    row["bucket_numels"],
                    row["bucket_bytes"],
                    statistics.mean(backward),
                    sorted(curve.items()),
                )


# The traces in the order the budget keeps them: the comparison first (single and the best of
# each precision), then the default DDPBucketed and the best plain bucket size.
TRACE_ROLES = ("single", "best", "default", "best-plain")


def best_rows(rows: Sequence[dict[str, Any]], dtype: str) -> list[tuple[str, dict]]:
    """The rows to trace: single, the default DDPBucketed, the best plain size, the best."""
    ok = [r for r in rows if r["dtype"] == dtype and r["status"] == "ok"]
    bucketed = [r for r in ok if r["variant"] == "bucketed"]
    plain = [r for r in bucketed if r["lever_count"] == 0]
    picks = [
        ("single", next((r for r in ok if r["variant"] == "single"), None)),
        ("default", next((r for r in plain if r["bucket_mb"] == DEFAULT_BUCKET_MB), None)),
        ("best-plain", min(plain, key=lambda r: r["step_ms"], default=None)),
        ("best", min(bucketed, key=lambda r: r["step_ms"], default=None)),
    ]
    chosen, seen = [], set()
    for role, row in picks:
        if row is not None and row["case"] not in seen:
            seen.add(row["case"])
            chosen.append((role, row))
    return chosen


def _case_of(row: dict[str, Any]) -> Case:
    return Case(row["variant"], row["dtype"], row["bucket_mb"], Levers(**row["levers"]))


def rank_main(rank: int, port: int, options: dict[str, Any]) -> None:
    """One rank: the process group, the groups, the model, then every part in order."""
    os.environ["NCCL_NVLS_ENABLE"] = "0"  # NVLink multicast off, as in bench's ranks
    cuda = not options["tiny"]
    if cuda:
        torch.cuda.set_device(rank)
    device = torch.device("cuda", rank) if cuda else torch.device("cpu")
    if not cuda:
        torch.set_num_threads(1)
    dist.init_process_group(
        "nccl" if cuda else "gloo",
        init_method=f"tcp://127.0.0.1:{port}",
        rank=rank,
        world_size=WORLD_SIZE,
        **({"device_id": device} if cuda else {}),
    )
    budget = options["budget_s"]
    ctx = Rank(
        rank=rank,
        device=device,
        shape=GPU_SHAPE if cuda else CPU_SHAPE,
        steps=options["steps"],
        warmup=options["warmup"],
        deadlines={part: f * budget for part, f in PART_DEADLINES.items()},
        start=options["start"],
    )
    out = Path(options["out"])
    rec = Recorder(out, options["meta"]) if rank == 0 else None
    try:
        _run_parts(ctx, rec, options)
    except Exception:
        if rec is not None:
            rec.meta["error"] = traceback.format_exc()
            rec.save()
        raise
    finally:
        if rec is not None:
            rec.save()
    # Results are saved: leave without tearing down six communicators and torch DDP's group
    # threads (see tests/support/spawn_ranks.py), which can take longer than the run's margin.
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


def _run_parts(ctx: Rank, rec: Recorder | None, options: dict[str, Any]) -> None:
    config = _model_config(ctx.shape)
    num_params = lmcore.count_parameters(config)
    grad_bytes = {"fp32": 4 * num_params, "bf16": 2 * num_params}
    if rec is not None:
        rec.meta["grad_bytes"] = grad_bytes
        rec.meta["num_params"] = num_params
    # The groups, on every rank in the same order.
    ctx.groups["default"] = dist.group.WORLD
    if ctx.cuda:
        for name, comm_options in COMMS.items():
            if name != "default":
                ctx.groups[name] = ddp.comm_group(**comm_options)
    # Standalone all-reduces: the whole fp32 gradient (and bf16's) on the default communicator,
    # a size sweep on every one, for hidden_e2e and pred_tail_ms.
    for name in list(ctx.groups):
        sizes = [*SWEEP_BYTES, grad_bytes["fp32"]]
        if name == "default":
            sizes.append(grad_bytes["bf16"])
        if not ctx.cuda:
            sizes = [b for b in sizes if b <= 10**7] + [grad_bytes["fp32"], grad_bytes["bf16"]]
        if not ctx.fits("allreduce"):
            continue
        began = time.monotonic()
        try:  # a communicator NCCL refuses fails the same way on every rank: drop it
            curve = measure_allreduce(ctx, name, sorted(set(sizes)))
        except RuntimeError as e:
            if name == "default":
                raise
            del ctx.groups[name]
            if rec is not None:
                rec.meta.setdefault("group_errors", {})[name] = str(e)[:300]
            continue
        ctx.last_row_s = time.monotonic() - began
        if rec is not None:
            rec.curves[name] = curve
            rec.save()
    if ctx.cuda:
        torch.cuda.empty_cache()
    ctx.model = _build_model(ctx)
    ctx.optimizer = torch.optim.AdamW(ctx.model.parameters(), **ADAMW_OPTIONS)
    ctx.batches = _batches(ctx, 4)
    sizes = options["sizes"]
    all_rows: list[dict[str, Any]] = []
    # Per precision: single and the plain sizes; the levers and their combinations at the large
    # sizes; single again (drift); then the smallest size's, which the budget cuts first.
    large = sorted((mb for mb in sizes if mb != min(sizes)), reverse=True) or list(sizes)
    small = [mb for mb in sizes if mb not in large]
    for dtype in options["dtypes"]:
        plain = [Case("bucketed", dtype, mb) for mb in sorted(sizes, reverse=True)]
        all_rows += run_rows(ctx, rec, [Case("single", dtype), *plain], dtype)
        for group in (large, small):
            if not group:
                continue
            levers = single_lever_cases(dtype, group, cuda=ctx.cuda)
            levers = [c for c in levers if c.levers.comm in ctx.groups]
            all_rows += run_rows(ctx, rec, levers, dtype)
            all_rows += run_rows(ctx, rec, combination_cases(dtype, group, all_rows), dtype)
            if group is large:
                all_rows += run_rows(ctx, rec, [Case("single", dtype)], dtype)
    # Traces of the chosen rows; then torch DDP last, since it keeps hooks on the parameters.
    traces = Path(options["out"]) / "traces"
    chosen = [(dtype, *pick) for dtype in options["dtypes"] for pick in best_rows(all_rows, dtype)]
    chosen.sort(key=lambda c: TRACE_ROLES.index(c[1]))
    for dtype, role, row in chosen:
        if not ctx.fits("traces"):
            break
        began = time.monotonic()
        name = f"{dtype}_{role}.json.gz"
        try:
            summary: dict[str, Any] = profile_case(ctx, _case_of(row), traces / name)
        except RuntimeError as e:  # reported, and the run goes on
            summary = {"error": f"{type(e).__name__}: {str(e)[:200]}"}
        per_rank: list[Any] = [None] * WORLD_SIZE
        dist.all_gather_object(per_rank, summary)
        ctx.last_row_s = time.monotonic() - began
        if rec is not None:
            rec.traces.append(
                {"dtype": dtype, "role": role, "case": row["case"], "file": f"traces/{name}"}
                | {f"rank{r}": s for r, s in enumerate(per_rank)}
            )
            add_inflation(rec.traces)
            rec.save()
    for dtype in options["dtypes"]:
        run_rows(ctx, rec, [Case("torch-ddp", dtype)], "torch")


# Tables ----------------------------------------------------------------------------------------

TABLE_COLUMNS = (
    ("dtype", "dtype", "{}"),
    ("case", "case", "{}"),
    ("step_ms", "step_ms", "{:.1f}"),
    ("step_ms_std", "±", "{:.1f}"),
    ("overhead_ms", "overhead_ms", "{:.1f}"),
    ("hidden_e2e", "hidden_e2e", "{:.0%}"),
    ("vs_torch", "vs_torch", "{:.3f}"),
    ("wait_ms", "wait_ms", "{:.1f}"),
    ("comm_ms", "comm_ms", "{:.1f}"),
    ("pred_tail_ms", "pred_tail_ms", "{:.1f}"),
    ("collectives", "coll", "{}"),
    ("status", "status", "{}"),
)
TRACE_COLUMNS = (
    "window_ms",
    "compute_ms",
    "nccl_ms",
    "overlap_ms",
    "exposed_ms",
    "idle_ms",
    "inflation_ms",
    "nccl_ctas",
    "launch_ms",
)


def _cell(value: Any, fmt: str) -> str:
    if value is None:
        return "—"
    return fmt.format(value)


def markdown_table(headers: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    lines = ["| " + " | ".join(headers) + " |", "|" + "---|" * len(headers)]
    lines += ["| " + " | ".join(row) + " |" for row in rows]
    return "\n".join(lines)


def add_inflation(traces: Sequence[dict[str, Any]]) -> None:
    """Each rank's `inflation_ms`: its compute kernel time beyond that of its `single` trace
    of the same precision (what the overlapped communication cost the computation)."""
    singles = {t["dtype"]: t for t in traces if t["role"] == "single"}
    for t in traces:
        base = singles.get(t["dtype"])
        for key in (k for k in t if k.startswith("rank")):
            mine, theirs = t[key].get("compute_ms"), base and base[key].get("compute_ms")
            if mine is not None and theirs is not None:
                t[key]["inflation_ms"] = mine - theirs


def trace_rows(payload: dict[str, Any]) -> list[list[str]]:
    """Rank 0's summary of each trace."""
    rows = []
    for t in payload["traces"]:
        summary = t["rank0"]
        cells = [t["dtype"], t["role"], t["case"]]
        for key in TRACE_COLUMNS:
            value = summary.get(key)
            cells.append(_cell(value, "{}" if key == "nccl_ctas" else "{:.1f}"))
        rows.append(cells)
    return rows


def render(payload: dict[str, Any]) -> str:
    """The Markdown report: what ran where, the rows, the trace summaries."""
    rows = [
        [_cell(r.get(key), fmt) for key, _, fmt in TABLE_COLUMNS] for r in payload.get("rows", [])
    ]
    full = payload.get("grad_bytes", {}).get("fp32")
    alone = payload.get("allreduce_ms", {}).get("default", {}).get(str(full))
    lines = [
        f"### DDPBucketed overlap levers: {payload['shape']}, {WORLD_SIZE} ranks",
        "",
        f"Device: {payload['device']}; torch {payload['torch']}, NCCL {payload['nccl']}, "
        f"python {payload['python']}; {payload['date']}; revision {payload['git_revision']}. "
        f"Command: `{payload['command']}`.",
        "",
        f"- Standalone all-reduce of every fp32 gradient ({_cell(full, '{:,}')} bytes), default "
        f"communicator: {_cell(alone, '{:.1f}')} ms. hidden_e2e = 1 - overhead_ms / that; "
        "overhead_ms: step beyond `single` (mean of its rows); medians over steps of the slowest "
        "rank. wait_ms: what finish_gradient_synchronization() held the step up (with `opt`, "
        "the optimizer steps run inside it); comm_ms: summed NCCL time; pred_tail_ms: the tail "
        "with no contention (module docstring).",
        "",
        markdown_table([h for _, h, _ in TABLE_COLUMNS], rows),
    ]
    curves = payload.get("allreduce_ms", {})
    if curves:
        sizes = sorted({int(b) for c in curves.values() for b in c})
        table = [
            [name] + [_cell(c.get(str(b)), "{:.2f}") for b in sizes] for name, c in curves.items()
        ]
        lines += ["", "Standalone all-reduce (ms) by size in bytes, per communicator:", ""]
        lines.append(markdown_table(["comm", *(f"{b:,}" for b in sizes)], table))
    if payload.get("traces"):
        lines += ["", "One traced step, rank 0 (ms): kernel time by kind and their overlap:", ""]
        lines.append(markdown_table(["dtype", "role", "case", *TRACE_COLUMNS], trace_rows(payload)))
    return "\n".join(lines) + "\n"


def print_table(payload: dict[str, Any]) -> None:
    """The compact table, printed last: dtype, case, step, overhead, hidden_e2e, vs torch."""
    keep = ("dtype", "case", "step_ms", "overhead_ms", "hidden_e2e", "vs_torch", "pred_tail_ms")
    columns = [c for c in TABLE_COLUMNS if c[0] in keep]
    cells = [[h for _, h, _ in columns]]
    for r in payload.get("rows", []):
        if r["status"] == "ok":
            cells.append([_cell(r.get(key), fmt) for key, _, fmt in columns])
    widths = [max(len(row[i]) for row in cells) for i in range(len(columns))]
    for row in cells:
        print("  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)))
    skipped = [r["case"] for r in payload.get("rows", []) if r["status"] != "ok"]
    if skipped:
        print(f"not measured: {len(skipped)} rows ({', '.join(skipped[:4])}, ...)")


# The parent ------------------------------------------------------------------------------------


def _meta(args: argparse.Namespace) -> dict[str, Any]:
    code = code_version()  # honours BENCH_GIT_REVISION, as every bench tool does
    cuda = not args.tiny
    shape = GPU_SHAPE if cuda else CPU_SHAPE
    names = [torch.cuda.get_device_name(i) for i in range(WORLD_SIZE)] if cuda else ["cpu"]
    return {
        "tool": "ddp_overlap",
        "shape": f"{lmcore.describe_size(shape['size'])}, context {shape['context_length']}, "
        f"batch {shape['batch']} per rank, {args.warmup} warm-up + {args.steps} timed steps",
        "device": ", ".join(sorted(set(names))) + f" x{WORLD_SIZE}",
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "nccl": ".".join(map(str, torch.cuda.nccl.version())) if cuda else None,
        "python": platform.python_version(),
        "host": socket.gethostname(),
        "git_revision": code["git_revision"],
        "git_dirty": code["git_dirty"],
        "date": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        "command": shlex.join([sys.executable, *sys.argv]),
        "env": {
            k: os.environ.get(k)
            for k in (
                "CUDA_VISIBLE_DEVICES",
                "NCCL_NVLS_ENABLE",
                "TORCH_NCCL_ENABLE_TIMING",
                "TORCH_NCCL_AVOID_RECORD_STREAMS",
            )
        },
        "options": {k: v for k, v in vars(args).items() if k != "out"},
    }


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", default=os.environ.get("OUT", "ddp_overlap_out"))
    parser.add_argument("--tiny", action="store_true", help="2 gloo ranks on the CPU, tiny model")
    parser.add_argument("--dtypes", nargs="+", choices=list(DTYPES), default=list(DTYPES))
    parser.add_argument(
        "--sizes", nargs="+", type=float, default=None, help="bucket MiB; 25 100 1000 on GPUs"
    )
    parser.add_argument("--warmup", type=int, default=2, help="untimed steps per row")
    parser.add_argument("--steps", type=int, default=5, help="timed steps per row")
    parser.add_argument("--budget-s", type=float, default=None, help="330 on GPUs, 150 tiny")
    args = parser.parse_args(argv)
    if args.sizes is None:
        args.sizes = list(TINY_BUCKET_SIZES_MB if args.tiny else BUCKET_SIZES_MB)
    if args.budget_s is None:
        # A CPU rehearsal's ranks take tens of seconds to import torch on a small machine.
        args.budget_s = 150.0 if args.tiny else DEFAULT_BUDGET_S
    if args.warmup < 1 or args.steps < 1:
        parser.error("--warmup and --steps must be at least 1 (the first step creates state)")
    if not args.tiny and torch.cuda.device_count() < WORLD_SIZE:
        parser.error(
            f"needs {WORLD_SIZE} visible GPUs, found {torch.cuda.device_count()}; "
            "use --tiny on a CPU"
        )
    return args


def _run_ranks(args: argparse.Namespace, out: Path, start: float) -> int:
    """Start the ranks; kill them once the budget and a margin have passed. 0 if they ended."""
    os.environ["NCCL_NVLS_ENABLE"] = "0"  # every rank inherits it
    os.environ.setdefault("TORCH_NCCL_ENABLE_TIMING", "1")  # comm_ms, as bench-ddp records it
    options = {
        "tiny": args.tiny,
        "budget_s": args.budget_s,
        "steps": args.steps,
        "warmup": args.warmup,
        "dtypes": args.dtypes,
        "sizes": args.sizes,
        "out": str(out),
        "meta": _meta(args),
        "start": start,
    }
    ctx = mp.start_processes(
        rank_main, args=(_free_port(), options), nprocs=WORLD_SIZE, join=False, start_method="spawn"
    )
    deadline = time.monotonic() + args.budget_s + HARD_MARGIN_S
    try:
        while not ctx.join(timeout=1.0):
            if time.monotonic() > deadline:
                for p in ctx.processes:
                    p.kill()
                print("ranks killed at the hard time limit; results so far follow", flush=True)
                return 1
    except mp.ProcessRaisedException as e:
        print(f"a rank failed:\n{e}", file=sys.stderr)
        return 1
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    out = Path(args.out)
    (out / "traces").mkdir(parents=True, exist_ok=True)
    # The ranks count their budget from now (CLOCK_MONOTONIC is one clock for every process).
    status = _run_ranks(args, out, time.monotonic())
    result = out / "ddp_overlap.json"
    if not result.is_file():
        print("no result written", file=sys.stderr)
        return 1
    payload = json.loads(result.read_text())
    (out / "ddp_overlap.md").write_text(render(payload))
    if payload.get("traces"):
        print(markdown_table(["dtype", "role", "case", *TRACE_COLUMNS], trace_rows(payload)))
        print()
    print_table(payload)
    return status


if __name__ == "__main__":
    sys.exit(main())
