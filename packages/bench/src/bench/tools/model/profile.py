"""bench-model's profile tables: kernels ranked by their own time, ranges reported as ranges.

`torch.profiler`'s `key_averages()` puts three kinds of entries in one list: `record_function`
ranges (on the CPU, and again as GPU-side annotations whose "device time" is the whole span of
the range), aten operators (whose device time is that of the kernels they launched), and the
CUDA kernels themselves. Ranking that list by device time puts a range such as `forward` at the
top as if it were a kernel, and counts every kernel twice (once under its operator). This
module reads the profiler's raw events instead and keeps the kinds apart:

- **kernels** (on a CPU, operators by their own CPU time): each CUDA kernel once, attributed
  through its launch (the correlation the profiler records between a kernel and the operator
  that launched it) to the phase whose range was open on the CPU when the operator started:
  `forward`, `backward` (autograd's thread runs while the main thread waits inside the
  `backward` range) or `optimizer`;
- **categories**: each phase's kernel time split into matrix multiplications, fused attention
  kernels, softmax, elementwise (and other memory-bound) kernels, communication (NCCL's kernels;
  on a CPU c10d's and gloo's operators) and, for the rest of the `optimizer` phase, the
  optimizer (`kernel_category`; bench-step's `--profile` reads the same rows);
- **ranges**: each `record_function` range by name, with its wall time on the CPU (the tools
  synchronise the device at the end of each phase range, so it includes the GPU's work) and
  the kernel time launched inside it; the attention ranges (`attention: scores` / `softmax` /
  `output`, see `bench.tools.model.annotated`) carry their FLOPs, so softmax can be set against
  the two matmuls from the same profile.

`profile_rows(events, ...)` is pure: it takes the event objects (`prof.events()`, or any
objects with the same attributes) and returns rows, so the ranking is tested without a GPU;
`trace_events(path)` reads a recorded Chrome trace back into such events, so a GPU run's
tables can be rebuilt from its traces without a GPU.
"""

from __future__ import annotations

import bisect
import contextlib
import functools
import gzip
import json
import re
from collections import Counter, defaultdict
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import torch

from bench.core.env import device_name
from bench.core.profiling import (
    is_communication,
    is_range,
    merged_spans,
    on_cpu,
    profiler_activities,
)
from bench.core.results import Keys, Run, save_json, to_markdown

__all__ = [
    "CATEGORIES",
    "PHASES",
    "PROFILE_COLUMNS",
    "PROFILE_KEYS",
    "AttentionShape",
    "attention_flops",
    "kernel_category",
    "kernel_tables",
    "profile_rows",
    "profiled",
    "save_profile",
    "trace_events",
]

PHASES = ("forward", "backward", "optimizer")
CATEGORIES = (
    "matmul", "attention", "softmax", "elementwise", "communication", "optimizer", "other",
)  # fmt: skip

PROFILE_COLUMNS = ["cell", "kind", "phase", "name", "category", "calls", "total_ms", "share"]
# Every key of a profile row, for readers (bench-report).
PROFILE_KEYS = Keys(*PROFILE_COLUMNS, "kernel_ms", "flops")

# Kernels (and, on a CPU, operators) by what they do, tried in this order (communication first,
# `bench.core.profiling.is_communication`). Inductor's fused pointwise and reduction kernels
# (`triton_poi_*`, `triton_red_*`, `triton_per_*`) are memory-bound whatever ops their names
# list: `triton_poi_fused__scaled_dot_product_cudnn_attention__to_copy_..._1` is the RoPE and
# layout copy fused in front of SDPA, `triton_red_fused__log_softmax_...` the loss's reduction;
# they are elementwise before any name-based match (Inductor's matmul templates, `triton_tem_*`,
# stay matmul). Fused attention: fa2's Triton and Gluon kernels
# (`_fwd_kernel`, `_dq_kernel`, `_dkdv_kernel`, `_delta_kernel`, `_gluon_fwd_kernel`,
# `_gluon_bwd_kernel`), torch's flash kernels (`pytorch_flash::flash_fwd_kernel`,
# `flash_bwd_dq_dk_dv_loop_*`), its memory-efficient ones (`fmha_cutlassF_*`), cuDNN's
# (`cudnn_generated_fort_native_sdpa_sm90_flash_fprop_*`; before the matmuls, whose patterns
# `cutlass` and `wgmma` these names hold too) and, on a CPU, SDPA's operators.
_ATTENTION = re.compile(
    r"^_(gluon_)?(fwd|bwd|dq|dkdv|delta)_kernel|flash|fmha|sdpa|scaled_dot_product|attention",
    re.IGNORECASE,
)
# cuBLAS names its Hopper kernels `nvjet_*`, older ones `*gemm*` / `*xmma*`; CUTLASS's carry
# `cutlass`; Inductor's matmul templates are `triton_tem_fused_mm_*` (`addmm`, `bmm`).
_MATMUL = re.compile(
    r"gemm|matmul|cutlass|xmma|nvjet|wgmma|cublas|aten::(mm|addmm|bmm|linear|baddbmm)\b|"
    r"^triton_tem_fused_\w*mm",
    re.IGNORECASE,
)
_SOFTMAX = re.compile(r"softmax", re.IGNORECASE)
_INDUCTOR_FUSED = re.compile(r"^triton_(poi|red|per)_")
# Memory-bound kernels: torch's elementwise and reduction kernels, lmcore's cross-entropy rows
# (`_cross_entropy_rows_kernel`: a log-sum-exp per row).
_ELEMENTWISE = re.compile(
    r"elementwise|vectorized|unrolled|reduce|copy|fill|cat|index|where|masked|pow|rsqrt|silu|"
    r"sigmoid|mul|add|div|sub|exp|neg|mean|sum|amax|max|min|norm|triu|tril|embedding|stack|clone|"
    r"to_copy|cross_entropy",
    re.IGNORECASE,
)

# The CUDA runtime's and driver's calls as the profiler names them on the CPU
# (`cudaLaunchKernel`, `cuLaunchKernelEx`, `cudaMemcpyAsync`); no operator is named so.
_CUDA_CALLS = re.compile(r"^cu(da)?[A-Z]")

_TOP_PER_PHASE = 15  # kernel rows kept per phase (the categories cover the rest)


@functools.cache  # a step launches each of its kernels many times: each name is looked up once
def kernel_category(name: str, *, phase: str | None = None) -> str:
    """The category of a kernel (or CPU operator): one of `CATEGORIES`.

    Communication (NCCL's kernels, c10d's and gloo's operators) is communication in any phase;
    everything else that runs inside the `optimizer` phase is the optimizer's; Inductor's fused
    pointwise and reduction kernels are elementwise whatever ops their names list; elsewhere the
    name decides (fused attention, matmul, softmax, elementwise and other memory-bound kernels,
    else `other`).
    """
    if is_communication(name):
        return "communication"
    if phase == "optimizer":
        return "optimizer"
    if _INDUCTOR_FUSED.match(name):
        return "elementwise"
    if _ATTENTION.search(name):
        return "attention"
    if _MATMUL.search(name):
        return "matmul"
    if _SOFTMAX.search(name):
        return "softmax"
    if _ELEMENTWISE.search(name):
        return "elementwise"
    return "other"


@dataclass(frozen=True)
class AttentionShape:
    """What one call of naive attention computes: for the FLOPs of its annotated stages."""

    batch: int
    heads: int
    seq: int
    head_dim: int


def attention_flops(shape: AttentionShape) -> dict[str, float]:
    """FLOPs of one call of each annotated attention stage (forward).

    `scores` is q·kᵀ (`2·B·H·S²·d`, the scale and mask are S²-sized elementwise work beside it),
    `output` is weights·v (`2·B·H·S²·d`), `softmax` is about five operations per score (max,
    subtract, exp, sum, divide): `5·B·H·S²`.
    """
    s2 = shape.batch * shape.heads * shape.seq * shape.seq
    return {
        "attention: scores": 2.0 * s2 * shape.head_dim,
        "attention: softmax": 5.0 * s2,
        "attention: output": 2.0 * s2 * shape.head_dim,
    }


@dataclass(frozen=True)
class _Timed:
    """One unit of measured work: a kernel (CUDA) or an operator's own CPU time."""

    name: str
    us: float
    cpu_start: float  # when the launching operator started on the CPU (us)
    phase: str | None = None  # the phase range open at `cpu_start`, if any


def _work(events: Sequence[Any], *, on_cuda: bool) -> list[_Timed]:
    """Kernels (through the operators that launched them) or operators' own CPU time.

    torch's profiler hangs a kernel (copy, fill) on the operator open on the CPU at its launch,
    through the launch's external correlation id. A range (`record_function`) sets none: a
    Triton kernel launched from Python with only ranges open (lmcore's `_adamw_kernel` inside
    `Optimizer.step#...`) hangs on nothing and shows only as a device-side event. Such a kernel
    is work too, placed at its launch: the CUDA call on the CPU (`cuLaunchKernelEx`) that shares
    its correlation id (`id`), else its own start on the device. A CUDA call never launches
    on an operator's behalf, yet torch hangs on it the kernels of an operator whose id equals
    its correlation id: those are left out (counted under their operator). On a CPU a range's
    own time is not work.
    """
    out = []
    hung: Counter[tuple[str, float]] = Counter()
    launches: dict[Any, float] = {}
    for e in events:
        if not on_cpu(e):
            continue  # GPU-side copies of events are not work
        start = e.time_range.start
        if not on_cuda:
            if e.self_cpu_time_total > 0 and not is_range(e):
                out.append(_Timed(e.name, float(e.self_cpu_time_total), start))
        elif _CUDA_CALLS.match(e.name):
            launches[getattr(e, "id", None)] = start
        else:
            out.extend(_Timed(k.name, float(k.duration), start) for k in e.kernels)
            hung.update((k.name, float(k.duration)) for k in e.kernels)
    for e in events if on_cuda else ():
        if on_cpu(e) or is_range(e):
            continue
        us = float(e.time_range.end - e.time_range.start)
        if hung[e.name, us] > 0:
            hung[e.name, us] -= 1
        else:
            start = launches.get(getattr(e, "id", None), e.time_range.start)
            out.append(_Timed(e.name, us, start))
    return out


def profile_rows(
    events: Sequence[Any],
    *,
    cell: str,
    on_cuda: bool,
    attention: AttentionShape | None = None,
    top: int = _TOP_PER_PHASE,
) -> list[dict[str, Any]]:
    """The profile of one configuration as rows (`PROFILE_COLUMNS`); times in ms.

    Args:
        events: the profiler's events, `prof.events()` (objects with `name`, `device_type`,
            `is_user_annotation`, `time_range.start/.end` in µs, `kernels` (each with `name`
            and `duration` in µs) and `self_cpu_time_total`).
        cell: the configuration's label, written in every row.
        on_cuda: rank CUDA kernels (True) or CPU operators by their own time (False).
        attention: the shape of one naive-attention call, to give the attention ranges FLOPs.
        top: kernel rows kept per phase.

    Returns:
        Rows of four kinds: `range` (each range name: calls, wall ms on the CPU, `kernel_ms`
        launched inside, `flops` for attention stages), `kernel` or `operator` (per phase and
        for the whole step, `phase="all"`: the `top` largest by total time with their share of
        the phase), and `category` (per phase: each of `CATEGORIES` with its number of kernels
        in `calls`, its time and its share of the phase's).

    Example::

        rows = profile_rows(prof.events(), cell="small_ctx256", on_cuda=True)
    """
    spans: dict[str, list[tuple[float, float]]] = defaultdict(list)
    for e in events:
        if is_range(e) and on_cpu(e):
            spans[e.name].append((e.time_range.start, e.time_range.end))
    work = sorted(_work(events, on_cuda=on_cuda), key=lambda w: w.cpu_start)
    starts = [w.cpu_start for w in work]
    kind = "kernel" if on_cuda else "operator"

    def inside(name: str) -> list[_Timed]:
        """The work launched while a range `name` was open: a slice of `work` per merged span
        (a step opens ranges per FSDP unit and per compiled graph: no scan of all work each)."""
        return [
            w
            for start, end in merged_spans(spans.get(name, ()))
            for w in work[bisect.bisect_left(starts, start) : bisect.bisect_right(starts, end)]
        ]

    by_phase = {p: inside(p) for p in PHASES if p in spans}
    phase_of = {id(w): p for p, items in by_phase.items() for w in items}
    work = [replace(w, phase=phase_of.get(id(w))) for w in work]
    by_phase = {p: [w for w in work if w.phase == p] for p in by_phase}
    flops = attention_flops(attention) if attention is not None else {}
    rows = [
        {
            "cell": cell,
            "kind": "range",
            "phase": name if name in PHASES else None,
            "name": name,
            "category": None,
            "calls": len(s),
            "total_ms": sum(end - start for start, end in s) / 1e3,
            "share": None,
            "kernel_ms": sum(w.us for w in inside(name)) / 1e3,
            "flops": flops[name] * len(s) if name in flops else None,
        }
        for name, s in spans.items()
    ]
    for phase, items in [*by_phase.items(), ("all", work)]:
        rows.extend(_ranked(items, cell=cell, kind=kind, phase=phase, top=top))
    return rows


def _ranked(
    items: list[_Timed], *, cell: str, kind: str, phase: str, top: int
) -> list[dict[str, Any]]:
    """One phase's work: its share per category, then the `top` names by total time."""
    total = sum(w.us for w in items)
    if not total:
        return []
    by_category: dict[str, list[float]] = defaultdict(list)
    by_name: dict[str, list[float]] = defaultdict(list)
    for w in items:
        by_category[kernel_category(w.name, phase=w.phase)].append(w.us)
        by_name[w.name].append(w.us)
    base = {"cell": cell, "phase": phase, "kernel_ms": None, "flops": None}
    rows = [
        {
            **base,
            "kind": "category",
            "name": c,
            "category": c,
            "calls": len(by_category[c]),
            "total_ms": sum(by_category[c]) / 1e3,
            "share": sum(by_category[c]) / total,
        }
        for c in CATEGORIES
        if by_category.get(c)
    ]
    ranked = sorted(by_name.items(), key=lambda item: sum(item[1]), reverse=True)[:top]
    rows += [
        {
            **base,
            "kind": kind,
            "name": name,
            "category": kernel_category(name, phase=None if phase == "all" else phase),
            "calls": len(times),
            "total_ms": sum(times) / 1e3,
            "share": sum(times) / total,
        }
        for name, times in ranked
    ]
    return rows


@contextlib.contextmanager
def profiled(
    directory: Path | None,
    label: str,
    device: torch.device,
    rows: list[dict[str, Any]],
    *,
    attention: AttentionShape | None = None,
) -> Iterator[None]:
    """Run the block under `torch.profiler` (a no-op when `directory` is None).

    Writes `directory/<label>.pt.trace.json` (Chrome/Perfetto trace) and
    `directory/<label>_kernels.md` (the kernel tables per phase), and appends the block's
    `profile_rows` to `rows`.
    """
    if directory is None:
        yield
        return
    on_cuda = device.type == "cuda"
    with torch.profiler.profile(activities=profiler_activities(device)) as prof:
        yield
    directory.mkdir(parents=True, exist_ok=True)
    prof.export_chrome_trace(str(directory / f"{label}.pt.trace.json"))
    found = profile_rows(prof.events(), cell=label, on_cuda=on_cuda, attention=attention)
    (directory / f"{label}_kernels.md").write_text(kernel_tables(found, label) + "\n")
    rows.extend(found)


def kernel_tables(rows: Sequence[Mapping[str, Any]], label: str) -> str:
    """`profile_rows` of one configuration as Markdown: ranges, then each phase's categories
    and kernels."""
    columns = ["name", "category", "calls", "total_ms", "share"]
    parts = [
        f"# {label}",
        "## Ranges",
        to_markdown(
            [r for r in rows if r["kind"] == "range"],
            columns=["name", "calls", "total_ms", "kernel_ms", "flops"],
        ),
    ]
    for phase in dict.fromkeys(r["phase"] for r in rows if r["kind"] != "range"):
        mine = [r for r in rows if r["phase"] == phase and r["kind"] != "range"]
        parts.append(f"## {phase}: by category, then the largest by total time")
        parts.append(to_markdown(mine, columns=columns))
    return "\n\n".join(parts)


def save_profile(
    directory: Path,
    rows: list[dict[str, Any]],
    *,
    device: torch.device,
    command: str | None,
    config: Mapping[str, Any],
    steps: int,
    batch: int,
) -> Path:
    """`directory/<directory name>.json`: the rows as a run of tool `profile`."""
    what = "CUDA kernels" if device.type == "cuda" else "CPU operators (own time)"
    run = Run.create(
        "profile",
        rows,
        device=device,
        config=config,
        command=command,
        title=f"torch.profiler: ranges and {what} per phase, {steps} profiled steps, "
        f"batch {batch}, {device_name(device)}",
        columns=PROFILE_COLUMNS,
        group_by="cell",
        notes=[
            f"kernel rows: {what}, each once, attributed to the phase (forward, backward, "
            "optimizer) whose range was open when its operator was launched; `all` is the "
            "whole step; share = of the phase's time. category rows: the phase's time split "
            f"into {', '.join(CATEGORIES)}. range rows: record_function ranges, reported as "
            "ranges (never as kernels): wall time on the CPU (the device is synchronised at "
            "the end of each phase, so it includes the GPU's work), the kernel time launched "
            "inside (kernel_ms) and, for the attention stages, their FLOPs.",
        ],
    )
    return save_json(run, directory / f"{directory.name}.json")


# A Chrome trace's categories: the CPU's operators and ranges, the CUDA calls, the device's work.
_CPU_TRACE = {"cpu_op": False, "user_annotation": True}
_CUDA_CALL_TRACE = ("cuda_runtime", "cuda_driver")
_DEVICE_TRACE = {"kernel": False, "gpu_memcpy": False, "gpu_memset": False,
                 "gpu_user_annotation": True}  # fmt: skip


def _event(e: Mapping[str, Any], *, ident: Any, device: str, annotation: bool) -> Any:
    start = float(e["ts"])
    return SimpleNamespace(
        id=ident,
        name=e["name"],
        device_type=f"DeviceType.{device}",
        is_user_annotation=annotation,
        time_range=SimpleNamespace(start=start, end=start + float(e["dur"])),
        kernels=[],
        self_cpu_time_total=0.0,
    )


def trace_events(path: Path) -> list[Any]:
    """A Chrome trace written by `prof.export_chrome_trace` (gzipped or not) as events of
    `prof.events()`'s shape (`name`, `id`, `device_type`, `is_user_annotation`, `time_range`
    in µs, `kernels`), for `bench.tools.model.profile.profile_rows` and `device_kernels`.

    As torch links them: an operator's or range's `id` is its external id, a CUDA call's and a
    device event's their correlation id; a device event hangs on the operator or range whose id
    is its external id (a CUDA call without one is a CPU event with no kernels). CUDA-only
    traces: a CPU operator's own time is not recorded (`self_cpu_time_total` is 0).
    """
    opener = gzip.open if path.suffix == ".gz" else open
    with opener(path, "rt") as f:
        found = json.load(f)["traceEvents"]
    out: list[Any] = []
    operators: list[Any] = []
    hung: dict[Any, list[Any]] = defaultdict(list)
    for e in found:
        cat, args = e.get("cat"), e.get("args", {})
        if cat in _DEVICE_TRACE:
            ident = args.get("correlation", args.get("External id"))
            out.append(_event(e, ident=ident, device="CUDA", annotation=_DEVICE_TRACE[cat]))
            if not _DEVICE_TRACE[cat] and "External id" in args:
                span = out[-1].time_range
                hung[args["External id"]].append(
                    SimpleNamespace(name=e["name"], duration=span.end - span.start)
                )
        elif cat in _CPU_TRACE:
            ident = args.get("External id")
            out.append(_event(e, ident=ident, device="CPU", annotation=_CPU_TRACE[cat]))
            operators.append(out[-1])
        elif cat in _CUDA_CALL_TRACE:
            out.append(_event(e, ident=args.get("correlation"), device="CPU", annotation=False))
    for e in operators:
        e.kernels = hung.get(e.id, [])
    return out
