"""bench-zero's measurement: memory and time of sharding (ZeRO-1 and FSDP) beside plain data
parallelism, as `run_zero(config)`, and the `TOOL` its command runs.

The variants, what is measured, the targets and the command line: `bench.commands.sharding`
(`bench-zero --help`).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import torch

from bench.commands.sharding import COMPUTE_DTYPES, OPTIMIZERS, VARIANTS, ZeroBenchConfig
from bench.core.distributed import measure_cases, slowest_rank
from bench.core.launch import DEFAULT_TIMEOUT_S
from bench.core.layouts import LAYOUTS
from bench.core.memory import (
    MIB,
    free_memory,
    peak_memory,
    recording_memory,
    reset_peak_memory,
    tensor_bytes,
)
from bench.core.oom import OK, OOM
from bench.core.parallel import Parallel
from bench.core.plots import Bars, stacked_bar_plot
from bench.core.profiling import traced_step
from bench.core.results import Keys, Run
from bench.core.step import forward_backward, train_step
from bench.core.timing import elapsed_ms
from bench.core.tool import Invocation, Tool, as_device, config_or_default
from bench.core.training_bench import ADAMW_OPTIONS, Case, build_model, token_batches

__all__ = [
    "COLUMNS",
    "COMPUTE_DTYPES",
    "KEYS",
    "OPTIMIZERS",
    "TOOL",
    "VARIANTS",
    "ZeroBenchConfig",
    "ZeroCase",
    "plot_zero",
    "run_zero",
]

# The baselines of the ratios: torch's DDP (`*_vs_ddp`), torch's FSDP2 (`*_vs_torch_fsdp`).
BASELINE = "ddp:torch"
FSDP_BASELINE = "fsdp:torch"
FSDP, FSDP_NO_PREFETCH = "fsdp", "fsdp:no-prefetch"

# Issue 5's targets for ZeRO-1 at world size 2, as (column, largest acceptable ratio to `ddp`).
TARGETS = (("state_vs_ddp", 0.55), ("peak_vs_ddp", 0.80), ("time_vs_ddp", 1.10))
# Targets for zero.FSDP at world size 2: (column, largest ratio, the rows' dtypes, `_dtypes`):
# issue 12's over float32 shards, issue 34's for bf16 storage (the 2026 `xl`).
FSDP_TARGETS = (
    ("peak_vs_torch_fsdp", 1.05, ("fp32", "bf16")),
    ("peak_vs_ddp", 0.60, ("fp32",)),
    ("time_vs_torch_fsdp", 1.10, ("fp32", "bf16")),
    ("peak_vs_torch_fsdp", 1.00, ("bf16-storage",)),
    ("time_vs_torch_fsdp", 0.80, ("bf16-storage",)),
)

_BREAKDOWN = ("param_mib", "grad_mib", "state_mib", "other_mib")
COLUMNS = (
    "variant",
    "bucket_mb",
    "compute_dtype",
    "storage_dtype",
    "init_mib",
    "before_step_mib",
    "after_step_mib",
    *_BREAKDOWN,
    "step_ms",
    "step_ms_std",
    "gather_overlap",
    "state_vs_ddp",
    "peak_vs_ddp",
    "time_vs_ddp",
    "peak_vs_torch_fsdp",
    "time_vs_torch_fsdp",
    "status",
)
# Every key of a row, for readers (bench-report, bench-plan --check): the columns, and the FSDP
# rows' units (`bench.core.layouts.Layout.units`).
KEYS = Keys(*COLUMNS, "fsdp_units")


@dataclass(frozen=True)
class ZeroCase(Case):
    """A row of bench-zero: a `Case` and, for the FSDP variants, the compute and storage
    dtypes."""

    compute_dtype: str | None = None
    storage_dtype: str | None = None


def _broadcasts(variant: str) -> bool:
    """Whether the variant's optimizer is `zero.ShardedOptimizer` (a row per broadcast cap)."""
    return LAYOUTS[variant].optimizer == "ShardedOptimizer"


def _cases(config: ZeroBenchConfig) -> list[ZeroCase]:
    """The rows: a ZeRO-1 variant's per broadcast cap; an FSDP variant's per compute dtype
    over float32 shards, and one of bf16 shards computing in bf16; the others one each."""
    cases = []
    for variant in config.variants:
        if _broadcasts(variant):
            cases += [ZeroCase(variant, b) for b in config.bucket_sizes_mb]
        elif LAYOUTS[variant].shards_weights:
            for storage in config.fsdp_storage:
                computes = config.fsdp_dtypes if storage == "fp32" else (storage,)
                cases += [ZeroCase(variant, compute_dtype=d, storage_dtype=storage)
                          for d in computes]  # fmt: skip
        else:
            cases.append(ZeroCase(variant))
    return cases


def _precision(case: ZeroCase) -> str:
    """The case's precision (`bench.core.layouts.PRECISIONS`): bf16 storage is the model
    stored in bf16; a bf16 compute dtype over float32 shards is FSDP's mixed precision
    (`bf16-autocast`: float32 shards gathered and reduced in bf16)."""
    if case.storage_dtype == "bf16":
        return "bf16"
    return "bf16-autocast" if case.compute_dtype == "bf16" else "fp32"


def _dtypes(row: Mapping[str, Any]) -> str | None:
    """An FSDP row's dtypes in a word: its compute dtype over float32 shards, `bf16-storage`
    for bf16 shards; None for the other variants."""
    if row.get("storage_dtype") == "bf16":
        return "bf16-storage"
    return row.get("compute_dtype")


def _parallel(case: ZeroCase, device: torch.device) -> Parallel:
    """The case's layout (`bench.core.parallel`): an FSDP row's dtypes as its precision, a
    ZeRO-1 row's broadcast cap."""
    return Parallel(
        case.variant, device=device, precision=_precision(case), broadcast_mb=case.bucket_size_mb
    )


def _measure_case(
    case: ZeroCase, config: ZeroBenchConfig, rank: int, device: torch.device
) -> dict[str, Any]:
    """One rank's numbers for one case: memory (bytes) and per-step times (ms)."""
    free_memory(device)
    reset_peak_memory(device)
    model = build_model(config, device, seed=0)
    parallel = _parallel(case, device)
    wrapped = parallel.wrap(model)
    optimizer = parallel.build_optimizer(
        wrapped.parameters(), OPTIMIZERS[config.optimizer], ADAMW_OPTIONS
    )
    init_peak = peak_memory(device)
    batches = token_batches(config, rank=rank, device=device)

    def step() -> None:
        train_step(wrapped, optimizer, [next(batches)])

    for _ in range(config.warmup):
        step()
    times = [elapsed_ms(step, device=device)[1] for _ in range(config.steps)]
    overlap = None
    sharded = LAYOUTS[case.variant].shards_weights
    if config.trace_dir is not None and sharded:
        trace = Path(config.trace_dir) / _case_file(case, ".pt.trace.json")
        overlap = traced_step(step, trace, rank=rank, device=device, collective="AllGather")
    snapshot = None
    if config.memory_snapshot_dir is not None and sharded:
        snapshot = Path(config.memory_snapshot_dir) / _case_file(case, f"_rank{rank}.pickle")

    # One more, instrumented, step for memory: the timed ones carry no synchronising probes.
    with recording_memory(snapshot, device):
        reset_peak_memory(device)
        forward_backward(wrapped, [next(batches)])
        before_peak = peak_memory(device)
        grads = tensor_bytes((p.grad for p in model.parameters()), device)
        optimizer.step()
        after_peak = peak_memory(device)
    local = parallel.local_state(optimizer)
    state = tensor_bytes((v for s in local.values() for v in s.values()), device)
    return {
        "init": init_peak,
        "before_step": before_peak,
        "after_step": after_peak,
        "param": tensor_bytes(model.parameters(), device),
        "grad": grads,
        "state": state,
        "times": times,
        "gather_overlap": overlap,
    }


def _case_file(case: ZeroCase, suffix: str) -> str:
    """`<variant>_<dtypes><suffix>`: the case's trace or snapshot file name."""
    variant = case.variant.replace(":", "-")  # a file name without a colon
    return f"{variant}_{_dtypes(asdict(case))}{suffix}"


def _mib(values: Sequence[int | None]) -> float | None:
    """The largest of the ranks' byte counts, in MiB; None when not measured."""
    return None if any(v is None for v in values) else max(values) / MIB


def _row(case: ZeroCase, per_rank: Sequence[dict[str, Any]]) -> dict[str, Any]:
    row: dict[str, Any] = {
        "variant": case.variant,
        "bucket_mb": case.bucket_size_mb,
        "compute_dtype": case.compute_dtype,
        "storage_dtype": case.storage_dtype,
    }
    if LAYOUTS[case.variant].shards_weights:
        row["fsdp_units"] = list(LAYOUTS[case.variant].units)
    if any(r["status"] != OK for r in per_rank):
        return {**row, **dict.fromkeys(COLUMNS[4:-1]), "status": OOM}
    for key in ("init", "before_step", "after_step", "param", "grad", "state"):
        row[f"{key}_mib"] = _mib([r[key] for r in per_rank])
    breakdown = sum(row[k] for k in _BREAKDOWN[:3])
    after = row["after_step_mib"]
    row["other_mib"] = None if after is None else after - breakdown
    step = slowest_rank([r["times"] for r in per_rank])
    row["step_ms"], row["step_ms_std"] = step.median, step.std
    row["gather_overlap"] = per_rank[0]["gather_overlap"]  # traced on rank 0
    row["status"] = OK
    return row


def _ratio(value: float | None, baseline: float | None) -> float | None:
    if value is None or not baseline:
        return None
    return value / baseline


def _add_ratios(rows: list[dict[str, Any]]) -> None:
    """Ratios of each row to the `ddp:torch` row (optimizer state, peak, step time), and of each
    `fsdp` row to the `fsdp:torch` row of its storage and compute dtypes (peak, step time)."""
    ok = [r for r in rows if r["status"] == OK]
    base = next((r for r in ok if r["variant"] == BASELINE), {})
    torch_fsdp = {_dtypes(r): r for r in ok if r["variant"] == FSDP_BASELINE}
    for row in rows:
        row["state_vs_ddp"] = _ratio(row.get("state_mib"), base.get("state_mib"))
        row["peak_vs_ddp"] = _ratio(row.get("after_step_mib"), base.get("after_step_mib"))
        row["time_vs_ddp"] = _ratio(row.get("step_ms"), base.get("step_ms"))
        theirs = torch_fsdp.get(_dtypes(row)) if row["variant"] == FSDP else None
        theirs = theirs or {}
        row["peak_vs_torch_fsdp"] = _ratio(row.get("after_step_mib"), theirs.get("after_step_mib"))
        row["time_vs_torch_fsdp"] = _ratio(row.get("step_ms"), theirs.get("step_ms"))


def _verdict(row: Mapping[str, Any], column: str, limit: float, label: str) -> str:
    """Whether the ratio in `row[column]` meets its target `limit`, in words."""
    if row.get(column) is None:
        return f"{label} not measured here"
    met = "meets" if row[column] <= limit else "MISSES"
    return f"{label} {row[column]:.2f}x {met}"


def _target_notes(rows: Sequence[dict[str, Any]], world_size: int) -> list[str]:
    """One sentence per `ShardedOptimizer` row: which of issue 5's targets it meets."""
    targets = ", ".join(f"{col.removesuffix('_vs_ddp')} <= {limit}x" for col, limit in TARGETS)
    notes = [f"Targets for ZeRO-1 at world size 2, as ratios to `{BASELINE}`: {targets}."]
    if world_size != 2:
        notes.append(f"This run has world size {world_size}; the targets assume 2.")
    for row in rows:
        if not _broadcasts(row["variant"]) or row["status"] != OK:
            continue
        verdicts = [
            _verdict(row, col, limit, col.removesuffix("_vs_ddp")) for col, limit in TARGETS
        ]
        notes.append(f"{row['variant']} ({_bucket_text(row, 'bucket ')}): {'; '.join(verdicts)}.")
    return notes


def _fsdp_target_notes(rows: Sequence[dict[str, Any]]) -> list[str]:
    """One sentence per `fsdp` row: which of FSDP's targets for its dtypes it meets."""
    targets = ", ".join(
        f"{col.replace('_vs_', ' <= ')} x{limit} ({', '.join(dts)})"
        for col, limit, dts in FSDP_TARGETS
    )
    notes = [f"Targets for zero.FSDP at world size 2: {targets}."]
    for row in rows:
        if row["variant"] != FSDP or row["status"] != OK:
            continue
        verdicts = [
            _verdict(row, col, limit, col)
            for col, limit, dtypes in FSDP_TARGETS
            if _dtypes(row) in dtypes
        ]
        notes.append(f"fsdp ({_dtypes(row)}): {'; '.join(verdicts)}.")
    return notes


def _prefetch_notes(rows: Sequence[dict[str, Any]]) -> list[str]:
    """What issuing the next unit's all-gather one unit ahead buys, per compute dtype: `fsdp`
    beside `fsdp-no-prefetch`."""
    ok = [r for r in rows if r["status"] == OK]
    without = {_dtypes(r): r for r in ok if r["variant"] == FSDP_NO_PREFETCH}
    notes = []
    for prefetch in (r for r in ok if r["variant"] == FSDP):
        alone = without.get(_dtypes(prefetch))
        if alone is None:
            continue
        peaks = ""
        if prefetch["after_step_mib"] is not None and alone["after_step_mib"] is not None:
            peaks = (
                f"; peak {prefetch['after_step_mib']:,.0f} against "
                f"{alone['after_step_mib']:,.0f} MiB"
            )
        notes.append(
            f"Prefetching ({_dtypes(prefetch)}): fsdp {prefetch['step_ms']:.4g} ms "
            f"per step against {alone['step_ms']:.4g} ms without it ({FSDP_NO_PREFETCH}), "
            f"{prefetch['step_ms'] / alone['step_ms']:.3f}x the time{peaks}."
        )
    return notes


def run_zero(
    config: ZeroBenchConfig | None = None,
    *,
    device: torch.device | str | None = None,
    command: str | None = None,
    timeout: float | None = DEFAULT_TIMEOUT_S,
) -> Run:
    """Measure every variant of `config` on `config.nproc` ranks.

    Args:
        config: what to run; the device's default (`ZeroBenchConfig`) when None.
        device: `cuda` (NCCL, one GPU per rank) or `cpu` (gloo); CUDA when available when None.
        command: the command line to record; the process's own when None.
        timeout: seconds the ranks may take in all before they are stopped.

    Returns:
        A `Run` (tool `"zero"`): one row per variant (and broadcast cap) with memory in MiB
        (`init`, `before_step`, `after_step` peaks; `param`, `grad`, `state`, `other` breakdown),
        step time in ms, ratios to `ddp` and `status`.

    Raises:
        ValueError: CUDA with fewer GPUs than `config.nproc`.
    """
    device = as_device(device)
    config, notes = config_or_default(
        config, device, cls=ZeroBenchConfig, tool="bench-zero", describe=ZeroBenchConfig.cpu_summary
    )
    measured = measure_cases(_measure_case, _cases(config), config, device=device, timeout=timeout)
    rows = [_row(case, results) for case, results in measured]
    _add_ratios(rows)
    rows = [
        {**{column: row.get(column) for column in COLUMNS},
         **({"fsdp_units": row["fsdp_units"]} if "fsdp_units" in row else {})}
        for row in rows
    ]  # fmt: skip
    if device.type != "cuda":
        notes.append(
            "CPU: no allocator statistics, so peaks and `other` are empty; parameter, gradient "
            "and state memory are the sizes of those tensors."
        )
    notes.append(
        "Memory is the largest over the ranks; `other` = after-step peak - parameters - "
        "gradients - optimizer state (activations, temporaries, DDP's gradient buckets, FSDP's "
        "gathered weights). The after-step peak covers the whole step (forward, backward and "
        "optimizer step): peak ratios use it."
    )
    notes += _target_notes(rows, config.nproc)
    if any(LAYOUTS[v].shards_weights for v in config.variants):
        notes.append(
            "FSDP rows: fsdp (zero.apply_fsdp) shards each block, the embedding and the LM head "
            "as units of their own; fsdp:torch (FSDP2) each block, the rest in its root unit "
            "(fsdp_units). storage_dtype bf16: the model stored in bf16 (weights, gradients and "
            "AdamW's moments), gathered and reduced in bf16, for both."
        )
    if FSDP in config.variants:
        notes += _fsdp_target_notes(rows)
    notes += _prefetch_notes(rows)
    if config.memory_snapshot_dir is not None and device.type == "cuda":
        notes.append(
            f"Memory snapshots: the CUDA allocator through each FSDP row's memory step, every "
            f"rank's, in {config.memory_snapshot_dir}/<variant>_<dtypes>_rank<r>.pickle (open "
            "in https://pytorch.org/memory_viz)."
        )
    if config.trace_dir is not None:
        notes.append(
            f"Traces: one more step of each FSDP row under torch.profiler, rank 0's Chrome trace "
            f"in {config.trace_dir}/<variant>_<dtypes>.pt.trace.json (a colon written as -); "
            "gather_overlap: the share "
            "of its all-gather kernel time during which a compute kernel ran too (CUDA only)."
        )
    return Run.create(
        "zero",
        rows,
        device=device,
        config=asdict(config),
        command=command,
        title=f"Sharding (ZeRO-1, FSDP): {config.size} ({config.optimizer} AdamW), "
        f"{config.summary()}",
        columns=list(COLUMNS),
        notes=notes,
    )


def _bucket_text(row: Mapping[str, Any], prefix: str = "") -> str:
    """A ZeRO-1 row's broadcast bucket size, in words (None: one bucket per owner)."""
    size = row.get("bucket_mb")
    return "one bucket per owner" if size is None else f"{prefix}{size:g} MB"


def _label(row: Mapping[str, Any]) -> str:
    if row.get("compute_dtype") is not None:
        return f"{row['variant']}\n{_dtypes(row)}"
    if not _broadcasts(str(row["variant"])):
        return str(row["variant"])
    return f"{row['variant']}\n{_bucket_text(row)}"


def plot_zero(run: Run, path: str | Path) -> Path:
    """Stacked bars of each variant's memory breakdown, and bars of its step time, in one PNG.

    Raises:
        ValueError: if no row completed.
    """
    rows = [dict(r, label=_label(r)) for r in run.ok_rows]
    measured_peak = any(r.get("other_mib") is not None for r in rows)
    memory = Bars(
        keys=tuple((key, key.removesuffix("_mib")) for key in _BREAKDOWN),
        ylabel="MiB per rank (largest rank)",
        title="after-step peak" if measured_peak else "tensor sizes (no peak on CPU)",
    )
    time = Bars(
        keys=(("step_ms", "step"),), ylabel="ms", title="median step time", err="step_ms_std"
    )
    return stacked_bar_plot(
        rows, label="label", panels=(memory, time), path=path, title=run.plot_title
    )


def _run(config: ZeroBenchConfig | None, cli: Invocation) -> Run:
    return run_zero(config, device=cli.device, command=cli.command, timeout=cli.args.timeout)


TOOL = Tool(run=_run, config=ZeroBenchConfig, plot=plot_zero)
