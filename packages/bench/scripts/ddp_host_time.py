"""Host time of bench-train's step under `ddp.DDPBucketed` and torch's DDP, phase by phase.

A one-GPU bench-train `small` step runs at 11.7 % MFU
(`docs/results/train_scaling_4xh200_2026-11-28.md`), which may mean that its steps are bound by
the host's work; then what each data-parallel wrapper adds to the host's time per step decides
its tokens/s. This script measures that host time, phase by phase, beside the step's time, so
that the two can be compared.

Every case runs bench-train's own step, `bench.core.step.train_step`, as the trainer calls it
(bf16 autocast, gradient clipping at `--grad-clip`'s default, torch's fused AdamW over
bench-train's two parameter groups, one micro-batch, `optimizer.zero_grad()`), on a model
wrapped by `bench.core.parallel.Parallel` as bench-train wraps it, on 2 ranks:

- `single`: no wrapper (each rank trains alone): the step without data parallelism;
- `ddp`: `ddp.DDPBucketed`; `ddp:torch`: torch's DistributedDataParallel, each with bench-train's
  buckets at the real width (25 MB; torch's default, which starts with a bucket of 1 MB), and
  at a tiny width with buckets holding the share of the model that 25 MB holds of the real one
  (so about as many buckets; torch's `bucket_cap_mb`, once given, caps its first bucket too);
- `ddp 1 bucket`, `ddp:torch 1 bucket`: every gradient in one bucket, reduced after backward,
  so that backward's extra time over `single` is the wrappers' per-gradient work alone;
- each again as `... keep`: `optimizer.zero_grad(set_to_none=False)`, gradients kept
  allocated (and kept as views of DDPBucketed's buckets) from step to step.

On the CPU (2 gloo ranks) the model is lmcore's `small` or `xl` in depth (so as many parameter
tensors: 111, 291) at a tiny width (`--d-model`, d_ff twice it), where the host's work is all
there is; host time is the main thread's CPU time (`time.thread_time`), so the gloo threads'
work and the waits for the other rank are left out. On CUDA (2 NCCL ranks, `--device cuda`) the
model is the real size at the GPU runs' batch per rank, and host time is the wall time until
each call returns, before the device finishes (the time to issue the work).

Each case is built, warmed up, timed and freed in turn, `--rounds` times (a fresh model each
round), so that a change in the machine's load falls on every case alike; each number is the
median over all timed steps of the slower rank. The ranks start each step together (a
barrier). The phases are timed by wrapping, in the ranks only, the calls `train_step` makes: the
wrapper's `forward`, `torch.autograd.backward`, `finish_gradient_synchronization`,
`bench.core.step.clip_grad_norm`, `optimizer.step` and `optimizer.zero_grad`; `other` is the
rest of the step's host time. `torch.profiler` then counts the ATen operations of two more steps
per case (CPU activity only): on a GPU each is a kernel launch or more of host work (on the CPU
`torch._foreach_*` runs as one operation per tensor; on CUDA as one launch per group).

`hook_us` is backward's host time over `single`'s, per parameter tensor: under `... 1 bucket`
the cost of each wrapper's work per gradient (DDPBucketed's post-accumulate-grad hook in Python,
torch's reducer hook in C++); with buckets it also holds the launches of the all-reduces.

Usage, from the repository root::

    export PYTHONPATH=$(ls -d $PWD/packages/*/src | paste -sd:)
    python3 packages/bench/scripts/ddp_host_time.py --out docs/results          # CPU, both shapes
    python3 packages/bench/scripts/ddp_host_time.py --device cuda --shapes small --rounds 2 \
        --out "$OUT"                                                            # 2 GPUs

The CPU run takes about 3 minutes on 2 cores. On 2 H200s, an estimate from the GPU runs'
tokens/s (a `small` step about 0.07 s, an `xl` step 0.25 s) and a few seconds to build each
model: `--shapes small --rounds 2` about 2 minutes, `--shapes xl --rounds 2` about 5, plus the
ranks' start and Triton's compilation of fa2's kernels. Each writes
`ddp_host_time[_<shapes>]_<device>_<date>.{json,md}` (the shapes named unless they are the
default pair; rows, device, versions, date, command, git revision) and prints the table last.
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import dataclasses
import functools
import gc
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

import bench.core.step
import ddp
import lmcore
from bench.core.distributed import measure_cases, slowest_rank
from bench.core.env import command_line
from bench.core.oom import OK, OOM
from bench.core.options import device_defaults
from bench.core.parallel import Parallel
from bench.core.results import Run, result_stem, save_json
from bench.core.step import build_lm, train_step
from bench.core.timing import synchronize
from bench.train import lm
from bench.train.config import TrainConfig

TOPIC = "ddp_host_time"
PHASES = ("forward", "backward", "finish", "clip", "optimizer", "zero_grad")
COLUMNS = [
    "shape",
    "case",
    "tensors",
    "buckets",
    "step_ms",
    "step_iqr_ms",
    "host_ms",
    "host_iqr_ms",
    *(f"{phase}_ms" for phase in PHASES),
    "other_ms",
    "host_vs_torch",
    "step_vs_torch",
    "hook_us",
    "aten_ops",
    "copy_",
    "add_",
    "zero_",
]
BRIEF = {
    "shape": "shape",
    "case": "case",
    "buckets": "buckets",
    "step_ms": "step ms",
    "host_ms": "host ms",
    "backward_ms": "bwd",
    "finish_ms": "finish",
    "host_vs_torch": "host/torch",
    "hook_us": "hook us",
    "aten_ops": "ops",
    "copy_": "copy_",
}
PRECISION = "bf16-autocast"  # the GPU runs' (bench-train's default with CUDA)
REAL_BUCKET_MB = ddp.DEFAULT_BUCKET_SIZE_MB  # 25: bench-train's, torch DDP's bucket_cap_mb
VOCAB = 256  # the byte tokenizer of the GPU runs
CONTEXT = 256  # the GPU runs' context length
# The GPU runs' sequences per rank on 2 GPUs: global batch 32 (small) and 8 (xl) over 2 ranks.
GPU_BATCH = {"small": 16, "xl": 4}
# On the CPU, a step whose arithmetic is small next to the host's work per operation:
# 2 rows of 32 tokens a rank, 32 wide (bench-ddp's CPU batch and context).
CPU_BATCH = 2
CPU_CONTEXT = 32
CPU_D_MODEL = 32
SEED = 0
_PROFILED_STEPS = 2  # steps whose operations torch.profiler counts (their mean is kept)


@dataclass(frozen=True)
class Case:
    """One measured configuration: a layout of `bench.core.layouts`, whether its buckets are
    the scaled default (False: one bucket), and `optimizer.zero_grad`'s `set_to_none`."""

    layout: str
    scaled_buckets: bool = True
    set_to_none: bool = True

    @property
    def name(self) -> str:
        name = self.layout + ("" if self.scaled_buckets else " 1 bucket")
        return name + ("" if self.set_to_none else " keep")


CASES = tuple(
    Case(layout, scaled_buckets=scaled, set_to_none=set_to_none)
    for set_to_none in (True, False)
    for layout, scaled in (
        ("single", True),
        ("ddp", True),
        ("ddp", False),
        ("ddp:torch", True),
        ("ddp:torch", False),
    )
)


@dataclass(frozen=True)
class Options:
    """The measurement: device, shapes, width (None: the size's own), steps."""

    device: str
    shapes: tuple[str, ...]
    d_model: int | None
    context_length: int
    batch: int | None  # sequences per rank; None: the GPU runs' (`GPU_BATCH`)
    warmup: int
    steps: int
    rounds: int
    nproc: int = 2


def trainer_setting(name: str, device: torch.device) -> Any:
    """bench-train's default of option `name` on `device` (its CUDA default where the CPU's
    only makes a CPU run fast: the optimizer; the attention stays the device's own)."""
    cpu = device_defaults(TrainConfig, cuda=False) if device.type == "cpu" else {}
    if name == "attention" and name in cpu:
        return cpu[name]
    return TrainConfig.__dataclass_fields__[name].default


def model_config(shape: str, options: Options, device: torch.device) -> lmcore.ModelConfig:
    """`shape`'s size, at `--d-model` (two heads, d_ff twice it) where one is given."""
    size = lmcore.MODEL_SIZES[shape]
    if options.d_model is not None:
        d = options.d_model
        size = dataclasses.replace(size, d_model=d, d_ff=2 * d, num_heads=2)
    return size.config(
        context_length=options.context_length,
        vocab_size=VOCAB,
        attention=trainer_setting("attention", device),
    )


def scaled_bucket_mb(shape: str, model: torch.nn.Module) -> float:
    """A bucket size holding the share of `model` that 25 MB holds of `shape`'s real model."""
    config = lmcore.MODEL_SIZES[shape].config(context_length=CONTEXT, vocab_size=VOCAB)
    real = lmcore.count_parameters(config)
    return REAL_BUCKET_MB * sum(p.numel() for p in model.parameters()) / real


def bucket_sizes(
    case: Case, shape: str, model: torch.nn.Module, *, real_width: bool
) -> tuple[float | None, float | None]:
    """(DDPBucketed's `bucket_size_mb`, torch DDP's `bucket_cap_mb`) of `case` for `model`.

    At the real width, bench-train's own: 25 MB, and torch's default (None: 25 MB after a first
    bucket of 1 MB). Scaled, both the scaled size (torch's first bucket then takes it too).
    One bucket: None, and a cap above all the gradients' bytes (torch has no "one bucket").
    """
    if not case.scaled_buckets:
        model_mb = sum(p.numel() * p.element_size() for p in model.parameters()) / 2**20
        return None, 2 * model_mb
    if real_width:
        return REAL_BUCKET_MB, None
    scaled = scaled_bucket_mb(shape, model)
    return scaled, scaled


class _Clock:
    """Host time by phase for the step being measured, in seconds summed over calls: the main
    thread's CPU time on the CPU, the wall time of the calls on CUDA (see the docstring)."""

    def __init__(self, device: torch.device) -> None:
        self.now = time.thread_time if device.type == "cpu" else time.perf_counter
        self.seconds: collections.Counter[str] = collections.Counter()
        self.on = False

    def wrap(self, phase: str, fn: Callable[..., Any]) -> Callable[..., Any]:
        @functools.wraps(fn)
        def timed(*args: Any, **kwargs: Any) -> Any:
            if not self.on:
                return fn(*args, **kwargs)
            start = self.now()
            try:
                return fn(*args, **kwargs)
            finally:
                self.seconds[phase] += self.now() - start

        return timed


@contextlib.contextmanager
def _timing_calls(clock: _Clock) -> Iterator[None]:
    """Time `train_step`'s module-level calls: backward and clipping."""
    backward, clip = torch.autograd.backward, bench.core.step.clip_grad_norm
    torch.autograd.backward = clock.wrap("backward", backward)
    bench.core.step.clip_grad_norm = clock.wrap("clip", clip)
    try:
        yield
    finally:
        torch.autograd.backward, bench.core.step.clip_grad_norm = backward, clip


def _bucket_count(wrapped: torch.nn.Module) -> int | None:
    if hasattr(wrapped, "bucket_params"):
        return len(wrapped.bucket_params)
    if hasattr(wrapped, "_get_ddp_logging_data"):  # torch DDP, after its buckets' rebuild
        return wrapped._get_ddp_logging_data().get("num_buckets_reduced")
    return None


def _build(
    case: Case, shape: str, options: Options, device: torch.device, clock: _Clock
) -> tuple[Callable[[], torch.Tensor], torch.nn.Module]:
    """The case's step (its calls timed by `clock`) and wrapped model, as bench-train builds
    them."""
    raw = build_lm(model_config(shape, options, device), device, seed=SEED)
    ours_mb, torch_mb = bucket_sizes(case, shape, raw, real_width=options.d_model is None)
    parallel = Parallel(
        case.layout,
        device=device,
        precision=PRECISION,
        bucket_size_mb=ours_mb,
        torch_bucket_mb=torch_mb,
    )
    decayed = lm.decayed_names(raw)
    wrapped = parallel.wrap(raw)
    lr = trainer_setting("lr", device)
    cls, path = lm.optimizer_class(trainer_setting("optimizer", device), lr=lr)
    groups = lm.param_groups(raw, decayed, trainer_setting("weight_decay", device))
    optimizer = parallel.build_optimizer(groups, cls, path)
    wrapped.forward = clock.wrap("forward", wrapped.forward)
    if hasattr(wrapped, "finish_gradient_synchronization"):
        finish = wrapped.finish_gradient_synchronization
        wrapped.finish_gradient_synchronization = clock.wrap("finish", finish)
    optimizer.step = clock.wrap("optimizer", optimizer.step)
    optimizer.zero_grad = clock.wrap("zero_grad", optimizer.zero_grad)
    generator = torch.Generator(device=device).manual_seed(SEED + dist.get_rank())
    batch = options.batch or GPU_BATCH[shape]
    tokens = torch.randint(
        VOCAB, (batch, options.context_length + 1), generator=generator, device=device
    )
    step = functools.partial(
        train_step,
        wrapped,
        optimizer,
        [tokens],
        autocast_dtype=torch.bfloat16,
        max_grad_norm=trainer_setting("grad_clip", device),
        set_to_none=case.set_to_none,
    )
    return step, wrapped


def _timed_steps(
    step: Callable[[], torch.Tensor], clock: _Clock, options: Options, device: torch.device
) -> list[dict[str, float]]:
    """`options.steps` steps: each one's wall time (device included), host time and phases."""
    samples = []
    for _ in range(options.steps):
        dist.barrier()  # the ranks start the step together
        clock.seconds.clear()
        clock.on = True
        start, host_start = time.perf_counter(), clock.now()
        step()
        host = 1e3 * (clock.now() - host_start)
        clock.on = False
        synchronize(device)
        wall = 1e3 * (time.perf_counter() - start)
        phases = {phase: 1e3 * clock.seconds[phase] for phase in PHASES}
        other = host - sum(phases.values())
        samples.append({"step": wall, "host": host, **phases, "other": other})
    return samples


def _op_counts(step: Callable[[], torch.Tensor]) -> dict[str, float]:
    """ATen operations per step (CPU activity), by name."""
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as profile:
        for _ in range(_PROFILED_STEPS):
            step()
    return {
        event.key: event.count / _PROFILED_STEPS
        for event in profile.key_averages()
        if event.key.startswith("aten::")
    }


def measure(shape: str, options: Options, rank: int, device: torch.device) -> dict[str, Any]:
    """Every case of `CASES` at `shape` on this rank: its steps' times, operations, sizes."""
    clock = _Clock(device)
    results: dict[str, dict[str, Any]] = {case.name: {"samples": []} for case in CASES}
    with _timing_calls(clock):
        for round_ in range(options.rounds):
            for case in CASES:
                step, wrapped = _build(case, shape, options, device, clock)
                for _ in range(options.warmup):
                    step()
                result = results[case.name]
                result["samples"] += _timed_steps(step, clock, options, device)
                if round_ == 0:
                    result["ops"] = _op_counts(step)
                    result["buckets"] = _bucket_count(wrapped)
                    result["tensors"] = sum(1 for p in wrapped.parameters() if p.requires_grad)
                del step, wrapped
                gc.collect()  # the wrapper's hooks go with it; free the model's memory
                if device.type == "cuda":
                    torch.cuda.empty_cache()
    return results


def rows_of(shape: str, per_rank: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The shape's rows: medians over steps of the slower rank, ratios and op counts."""

    def median(results: list[dict[str, Any]], key: str) -> tuple[float, float]:
        summary = slowest_rank([[s[key] for s in r["samples"]] for r in results])
        return summary.median, summary.iqr

    rows = {}
    for case in CASES:
        results = [r[case.name] for r in per_rank]
        row: dict[str, Any] = {"shape": shape, "case": case.name}
        row["tensors"], row["buckets"] = results[0]["tensors"], results[0]["buckets"]
        row["step_ms"], row["step_iqr_ms"] = median(results, "step")
        row["host_ms"], row["host_iqr_ms"] = median(results, "host")
        for phase in (*PHASES, "other"):
            value = median(results, phase)[0]
            row[f"{phase}_ms"] = value if value > 0 or phase == "other" else None
        ops = results[0]["ops"]
        row["aten_ops"] = sum(ops.values())
        for op in ("copy_", "add_", "zero_"):
            row[op] = ops.get(f"aten::{op}", 0.0)
        rows[case] = row
    for case, row in rows.items():
        torch_row = rows[Case("ddp:torch", case.scaled_buckets, case.set_to_none)]
        row["host_vs_torch"] = row["host_ms"] / torch_row["host_ms"]
        row["step_vs_torch"] = row["step_ms"] / torch_row["step_ms"]
        if case.layout != "single":
            single = rows[Case("single", set_to_none=case.set_to_none)]
            row["hook_us"] = 1e3 * (row["backward_ms"] - single["backward_ms"]) / row["tensors"]
    return list(rows.values())


def notes_for(options: Options) -> list[str]:
    """The sentences that travel with the rows."""
    cpu = options.device == "cpu"
    host = (
        "the main thread's CPU time (gloo's threads and the waits for the other rank left out)"
        if cpu
        else "the wall time until each call returns, before the device finishes"
    )
    return [
        f"step_ms: the step's wall time, device work included; host_ms and the phases: {host}. "
        "Medians over the timed steps of the slower rank; other: the rest of host_ms.",
        "backward: the hooks' work, and under torch DDP its reducer's (the all-reduces' launches "
        "and their wait, which it does inside backward); finish: DDPBucketed's "
        "finish_gradient_synchronization (launches left, waits, .grad set to the averages).",
        "host_vs_torch, step_vs_torch: over ddp:torch's with the same buckets and set_to_none "
        "(single: over ddp:torch with the scaled buckets). hook_us: backward's host time over "
        "single's (same set_to_none), per parameter tensor.",
        "aten_ops, copy_, add_, zero_: ATen operations per step (torch.profiler, nested ones "
        "included)" + ("; on the CPU torch._foreach_* runs one per tensor." if cpu else "."),
        "keep: optimizer.zero_grad(set_to_none=False); otherwise bench-train's "
        "optimizer.zero_grad() (set_to_none=True).",
    ]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--device", choices=("cpu", "cuda"), default="cpu", help="(cpu)")
    parser.add_argument("--shapes", nargs="+", default=list(GPU_BATCH), help="(small xl)")
    parser.add_argument("--d-model", type=int, help=f"width (CPU: {CPU_D_MODEL}; CUDA: own)")
    parser.add_argument("--real-width", action="store_true", help="the size's own width")
    parser.add_argument("--context-length", type=int, help=f"(CPU: {CPU_CONTEXT}; {CONTEXT})")
    parser.add_argument("--batch", type=int, help=f"rows a rank (CPU: {CPU_BATCH}; GPU runs')")
    parser.add_argument("--warmup", type=int, default=3, help="untimed steps a build (3)")
    parser.add_argument("--steps", type=int, default=10, help="timed steps a build (10)")
    parser.add_argument("--rounds", type=int, default=3, help="builds of each case (3)")
    parser.add_argument("--out", type=Path, help="write <topic>_<device>_<date>.{json,md} here")
    args = parser.parse_args(argv)
    cpu = args.device == "cpu"
    options = Options(
        device=args.device,
        shapes=tuple(args.shapes),
        d_model=None if args.real_width else args.d_model or (CPU_D_MODEL if cpu else None),
        context_length=args.context_length or (CPU_CONTEXT if cpu else CONTEXT),
        batch=args.batch or (CPU_BATCH if cpu else None),
        warmup=args.warmup,
        steps=args.steps,
        rounds=args.rounds,
    )
    device = torch.device(args.device)
    rows = []
    for shape in options.shapes:
        ((_, per_rank),) = measure_cases(measure, [shape], options, device=device)
        if any(result["status"] != OK for result in per_rank):  # out of memory on a rank
            rows.append({"shape": shape, "status": OOM})
            continue
        rows += rows_of(shape, per_rank)
    width = "the real width" if options.d_model is None else f"d_model {options.d_model}"
    run = Run.create(
        TOPIC,
        rows,
        device=device,
        config=dataclasses.asdict(options),
        command=command_line(prog="python3 packages/bench/scripts/ddp_host_time.py"),
        title=(
            f"Host time of bench-train's step, ddp.DDPBucketed beside torch DDP: "
            f"{', '.join(options.shapes)} in depth at {width}, context "
            f"{options.context_length}, {PRECISION}, {options.nproc} ranks"
        ),
        columns=COLUMNS,
        notes=notes_for(options),
        brief=BRIEF,
    )
    if args.out is not None:
        default = options.shapes == tuple(GPU_BATCH)
        topic = TOPIC if default else "_".join((TOPIC, *options.shapes))
        stem = args.out / result_stem(topic, run.env, num_devices=options.nproc)
        save_json(run, stem.with_suffix(".json"))
        stem.with_suffix(".md").write_text(run.to_markdown() + "\n")
    print(run.to_markdown(wide=False))
    return 0


if __name__ == "__main__":
    sys.exit(main())
