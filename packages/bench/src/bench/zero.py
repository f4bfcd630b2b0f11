"""bench-zero: memory and time of optimizer-state sharding (ZeRO-1) beside plain data parallelism.

`lmcore.TransformerLM` (XL by default), fp32, trained with AdamW on `--world-size` ranks (2 by
default; one process per GPU with NCCL, launched by the tool itself), batch 4 per rank at
context 128, in these variants:

- `ddp`: torch `DistributedDataParallel` + the unsharded optimizer (the baseline).
- `sharded`: torch DDP + `zero.ShardedOptimizer`, one row per `--zero-bucket-mb` cap (the cap on
  the parameters one post-step broadcast carries: 0 is one broadcast per parameter).
- `torch-zero`: torch DDP + torch's `ZeroRedundancyOptimizer`.
- `bucketed-sharded` (on request): `ddp.DDPBucketed` + `zero.ShardedOptimizer`.

Per variant: peak memory (`torch.cuda.max_memory_allocated` after `reset_peak_memory_stats`)
after building the model, wrapper and optimizer; within a training step right before
`optimizer.step()` and right after it; the median step time over the timed steps (each step's
time is the slowest rank's); and a breakdown of the after-step peak into parameters, gradients
and optimizer state (the bytes of those tensors on the rank) and the rest (activations,
temporaries, DDP's communication buckets). Memory is the largest over the ranks. Ratios against
`ddp` are checked against the targets of ZeRO-1 at world size 2: optimizer state <= 0.55x, peak
<= 0.80x, step time <= 1.10x.

Without a GPU a tiny model runs on the CPU with gloo (and says so); memory is then the size of
the parameter, gradient and state tensors, since the CPU keeps no allocator statistics.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

import torch
from torch import nn
from torch.nn.parallel import DistributedDataParallel

import ddp
import lmcore
from bench.cli import (
    add_timing_args,
    command_line,
    cpu_default_notice,
    emit,
    make_parser,
    resolve_device,
)
from bench.launch import DEFAULT_TIMEOUT_S, all_ranks_ok, is_primary, launch
from bench.memory import MIB, free_memory, peak_memory, reset_peak_memory
from bench.model import TINY, ModelShape
from bench.oom import OK, OOM, guarded
from bench.plots import Bars, stacked_bar_plot
from bench.results import Run
from bench.timing import elapsed_ms, summarize
from zero import DEFAULT_BUCKET_MB, ShardedOptimizer

__all__ = [
    "OPTIMIZERS",
    "VARIANTS",
    "ZeroBenchConfig",
    "default_zero_config",
    "main",
    "plot_zero",
    "run_zero",
]

VARIANTS = ("ddp", "sharded", "torch-zero", "bucketed-sharded")
DEFAULT_VARIANTS = ("ddp", "sharded", "torch-zero")
BASELINE = "ddp"
OPTIMIZERS: Mapping[str, type[torch.optim.Optimizer]] = {
    "torch": torch.optim.AdamW,
    "lmcore": lmcore.AdamW,
}
# The training recipe only matters through the state AdamW keeps (two moments per parameter).
ADAMW_OPTIONS = {"lr": 1e-4, "weight_decay": 0.01}

# Issue 5's targets for ZeRO-1 at world size 2, as (column, largest acceptable ratio to `ddp`).
TARGETS = (("state_vs_ddp", 0.55), ("peak_vs_ddp", 0.80), ("time_vs_ddp", 1.10))

_BREAKDOWN = ("param_mib", "grad_mib", "state_mib", "other_mib")
COLUMNS = (
    "variant",
    "bucket_mb",
    "init_mib",
    "before_step_mib",
    "after_step_mib",
    *_BREAKDOWN,
    "step_ms",
    "step_ms_std",
    "state_vs_ddp",
    "peak_vs_ddp",
    "time_vs_ddp",
    "status",
)


@dataclass(frozen=True)
class ZeroBenchConfig:
    """What `run_zero` measures.

    Args:
        shape: the model's widths and depth (`ModelShape.of_size("xl")`, or `bench.model.TINY`).
        context_length: tokens per sequence.
        batch: sequences per rank per step.
        vocab_size: vocabulary size.
        world_size: ranks (one GPU each on CUDA).
        optimizer: `"torch"` (`torch.optim.AdamW`) or `"lmcore"` (`lmcore.AdamW`).
        variants: from `VARIANTS`; `ddp` is the baseline of the ratios.
        bucket_mbs: `ShardedOptimizer` broadcast caps in MB, one `sharded` row each.
        warmup: untimed steps first (the first one creates the optimizer state).
        steps: timed steps.
    """

    shape: ModelShape
    context_length: int = 128
    batch: int = 4
    vocab_size: int = lmcore.VOCAB_SIZE
    world_size: int = 2
    optimizer: str = "torch"
    variants: tuple[str, ...] = DEFAULT_VARIANTS
    bucket_mbs: tuple[float, ...] = (DEFAULT_BUCKET_MB,)
    warmup: int = 2
    steps: int = 10

    def __post_init__(self) -> None:
        if not self.variants or not set(self.variants) <= set(VARIANTS):
            raise ValueError(f"variants must be non-empty, from {VARIANTS}; got {self.variants}")
        if self.optimizer not in OPTIMIZERS:
            raise ValueError(
                f"optimizer must be one of {tuple(OPTIMIZERS)}, got {self.optimizer!r}"
            )
        if not self.bucket_mbs or any(not b >= 0 for b in self.bucket_mbs):
            raise ValueError(f"bucket_mbs must be non-empty and >= 0, got {self.bucket_mbs}")
        sizes = (self.context_length, self.batch, self.vocab_size, self.steps)
        if min(sizes) < 1 or self.warmup < 1 or self.world_size < 2:
            raise ValueError(
                "context_length, batch, vocab_size and steps must be positive, warmup at least 1 "
                f"(it creates the optimizer state) and world_size at least 2; got {self}"
            )


def default_zero_config(device: torch.device | str) -> ZeroBenchConfig:
    """XL at context 128, batch 4 per rank, on 2 GPUs; a tiny model on 2 CPU ranks otherwise."""
    if torch.device(device).type == "cuda":
        return ZeroBenchConfig(shape=ModelShape.of_size("xl"))
    return ZeroBenchConfig(shape=TINY, context_length=32, batch=2, warmup=1, steps=3)


@dataclass(frozen=True)
class _Case:
    """One measured row: a variant, and the broadcast cap for `ShardedOptimizer` variants."""

    variant: str
    bucket_mb: float | None = None


def _cases(config: ZeroBenchConfig) -> list[_Case]:
    cases = []
    for variant in config.variants:
        if variant.endswith("sharded"):
            cases += [_Case(variant, b) for b in config.bucket_mbs]
        else:
            cases.append(_Case(variant))
    return cases


def _wrap(case: _Case, model: nn.Module, device: torch.device) -> nn.Module:
    if case.variant == "bucketed-sharded":
        return ddp.DDPBucketed(model)
    return DistributedDataParallel(
        model, device_ids=[device.index] if device.type == "cuda" else None
    )


def _optimizer(case: _Case, params: Iterable[nn.Parameter], config: ZeroBenchConfig):
    """The variant's optimizer, and the dict of optimizer state this rank holds."""
    cls = OPTIMIZERS[config.optimizer]
    if case.variant == "ddp":
        optimizer = cls(params, **ADAMW_OPTIONS)
        return optimizer, lambda: optimizer.state
    if case.variant == "torch-zero":
        # imported on use: importing torch.distributed.optim scripts functional optimizers
        # (TorchScript deprecation warnings) in every process that merely imports this tool
        from torch.distributed.optim import ZeroRedundancyOptimizer

        optimizer = ZeroRedundancyOptimizer(params, optimizer_class=cls, **ADAMW_OPTIONS)
        return optimizer, lambda: optimizer.optim.state
    optimizer = ShardedOptimizer(params, cls, bucket_mb=case.bucket_mb, **ADAMW_OPTIONS)
    return optimizer, lambda: optimizer.local_optimizer.state


def _model(config: ZeroBenchConfig, device: torch.device) -> lmcore.TransformerLM:
    s = config.shape
    dims = (config.vocab_size, config.context_length, s.d_model, s.num_layers, s.num_heads, s.d_ff)
    torch.manual_seed(0)
    if device.type == "cpu":
        return lmcore.TransformerLM(*dims)
    with torch.device("meta"):  # skip the slow CPU initialisation of a large model
        model = lmcore.TransformerLM(*dims)
    model = model.to_empty(device=device)
    model.reset_parameters()
    return model


def _bytes(tensors: Iterable[Any], device: torch.device) -> int:
    """Bytes of the distinct tensors among `tensors` that live on `device` (shared storage once)."""
    seen: dict[int, int] = {}
    for t in tensors:
        if isinstance(t, torch.Tensor) and t.device == device:
            seen[t.untyped_storage().data_ptr()] = t.untyped_storage().nbytes()
    return sum(seen.values())


def _measure_case(
    case: _Case, config: ZeroBenchConfig, rank: int, device: torch.device
) -> dict[str, Any]:
    """One rank's numbers for one case: memory (bytes) and per-step times (ms)."""
    free_memory(device)
    reset_peak_memory(device)
    model = _model(config, device)
    wrapped = _wrap(case, model, device)
    optimizer, local_state = _optimizer(case, wrapped.parameters(), config)
    init_peak = peak_memory(device)

    g = torch.Generator().manual_seed(1000 + rank)  # fresh data on each rank, as in DDP
    shape = (config.batch, config.context_length + 1)

    def forward_backward() -> None:
        tokens = torch.randint(config.vocab_size, shape, generator=g).to(device)
        if isinstance(wrapped, ddp.DataParallelBase):
            wrapped.on_train_batch_start()
        loss = lmcore.cross_entropy(wrapped(tokens[:, :-1]), tokens[:, 1:])
        loss.backward()
        if isinstance(wrapped, ddp.DataParallelBase):
            wrapped.finish_gradient_synchronization()

    def step() -> None:
        optimizer.zero_grad(set_to_none=True)
        forward_backward()
        optimizer.step()

    for _ in range(config.warmup):
        step()
    times = [elapsed_ms(step, device=device)[1] for _ in range(config.steps)]

    # One more, instrumented, step for memory: the timed ones carry no synchronising probes.
    optimizer.zero_grad(set_to_none=True)
    reset_peak_memory(device)
    forward_backward()
    before_peak = peak_memory(device)
    grads = _bytes((p.grad for p in model.parameters()), device)
    optimizer.step()
    after_peak = peak_memory(device)
    state = _bytes((v for s in local_state().values() for v in s.values()), device)
    return {
        "init": init_peak,
        "before_step": before_peak,
        "after_step": after_peak,
        "param": _bytes(model.parameters(), device),
        "grad": grads,
        "state": state,
        "times": times,
    }


def _rank_worker(
    rank: int, world_size: int, config: ZeroBenchConfig, device_type: str
) -> list[dict[str, Any]]:
    """Every case on this rank, in order; a case that runs out of memory gives `{"status": OOM}`."""
    if device_type == "cuda":
        device = torch.device("cuda", torch.cuda.current_device())
    else:
        device = torch.device("cpu")
    results = []
    for case in _cases(config):
        outcome = guarded(lambda c=case: _measure_case(c, config, rank, device), device=device)
        if all_ranks_ok(outcome.ok, device=device):
            results.append({**outcome.value, "status": OK})
        else:
            results.append({"status": OOM})
    return results


def _mib(values: Sequence[int | None]) -> float | None:
    """The largest of the ranks' byte counts, in MiB; None when not measured."""
    return None if any(v is None for v in values) else max(values) / MIB


def _row(case: _Case, per_rank: Sequence[dict[str, Any]]) -> dict[str, Any]:
    row: dict[str, Any] = {"variant": case.variant, "bucket_mb": case.bucket_mb}
    if any(r["status"] != OK for r in per_rank):
        return {**row, **dict.fromkeys(COLUMNS[2:-1]), "status": OOM}
    for key in ("init", "before_step", "after_step", "param", "grad", "state"):
        row[f"{key}_mib"] = _mib([r[key] for r in per_rank])
    breakdown = sum(row[k] for k in _BREAKDOWN[:3])
    after = row["after_step_mib"]
    row["other_mib"] = None if after is None else after - breakdown
    # A step takes as long as its slowest rank.
    slowest = [max(ts) for ts in zip(*(r["times"] for r in per_rank), strict=True)]
    summary = summarize(slowest)
    row["step_ms"], row["step_ms_std"] = summary.median, summary.std
    row["status"] = OK
    return row


def _ratio(value: float | None, baseline: float | None) -> float | None:
    if value is None or not baseline:
        return None
    return value / baseline


def _add_ratios(rows: list[dict[str, Any]]) -> None:
    """Ratios of each row to the `ddp` row: optimizer state, after-step peak, step time."""
    base = next((r for r in rows if r["variant"] == BASELINE and r["status"] == OK), {})
    for row in rows:
        row["state_vs_ddp"] = _ratio(row.get("state_mib"), base.get("state_mib"))
        row["peak_vs_ddp"] = _ratio(row.get("after_step_mib"), base.get("after_step_mib"))
        row["time_vs_ddp"] = _ratio(row.get("step_ms"), base.get("step_ms"))


def _target_notes(rows: Sequence[dict[str, Any]], world_size: int) -> list[str]:
    """One sentence per `ShardedOptimizer` row: which of issue 5's targets it meets."""
    targets = ", ".join(f"{col.removesuffix('_vs_ddp')} <= {limit}x" for col, limit in TARGETS)
    notes = [f"Targets for ZeRO-1 at world size 2, as ratios to `ddp`: {targets}."]
    if world_size != 2:
        notes.append(f"This run has world size {world_size}; the targets assume 2.")
    for row in rows:
        if not row["variant"].endswith("sharded") or row["status"] != OK:
            continue
        verdicts = []
        for col, limit in TARGETS:
            if row.get(col) is None:
                verdicts.append(f"{col.removesuffix('_vs_ddp')} not measured here")
            else:
                met = "meets" if row[col] <= limit else "MISSES"
                verdicts.append(f"{col.removesuffix('_vs_ddp')} {row[col]:.2f}x {met}")
        notes.append(f"{row['variant']} (bucket {row['bucket_mb']:g} MB): {'; '.join(verdicts)}.")
    return notes


def run_zero(
    config: ZeroBenchConfig | None = None,
    *,
    device: torch.device | str | None = None,
    command: str | None = None,
    timeout: float = DEFAULT_TIMEOUT_S,
) -> Run:
    """Measure every variant of `config` on `config.world_size` ranks.

    Args:
        config: what to run; `default_zero_config(device)` when None.
        device: `cuda` (NCCL, one GPU per rank) or `cpu` (gloo); CUDA when available when None.
        command: the command line to record; the process's own when None.
        timeout: seconds the ranks may take in all before they are stopped.

    Returns:
        A `Run` (tool `"zero"`): one row per variant (and broadcast cap) with memory in MiB
        (`init`, `before_step`, `after_step` peaks; `param`, `grad`, `state`, `other` breakdown),
        step time in ms, ratios to `ddp` and `status`.

    Raises:
        ValueError: CUDA with fewer GPUs than `config.world_size`.
    """
    device = torch.device(device) if device is not None else resolve_device("auto")
    notes: list[str] = []
    if config is None:
        config = default_zero_config(device)
        if device.type != "cuda":
            s = config.shape
            notes.append(
                cpu_default_notice(
                    "bench-zero",
                    f"{s.num_layers} layers of width {s.d_model}, context {config.context_length}, "
                    f"batch {config.batch} per rank, {config.world_size} gloo ranks",
                )
            )
    on_gpu = device.type == "cuda"
    if on_gpu and torch.cuda.device_count() < config.world_size:
        raise ValueError(
            f"world size {config.world_size} needs as many GPUs, found "
            f"{torch.cuda.device_count()}; pass --world-size or --device cpu"
        )
    per_rank = launch(
        _rank_worker,
        world_size=config.world_size,
        backend="nccl" if on_gpu else "gloo",
        args=(config, device.type),
        timeout=timeout,
    )
    cases = _cases(config)
    rows = [_row(case, [r[i] for r in per_rank]) for i, case in enumerate(cases)]
    _add_ratios(rows)
    rows = [{column: row.get(column) for column in COLUMNS} for row in rows]
    if not on_gpu:
        notes.append(
            "CPU: no allocator statistics, so peaks and `other` are empty; parameter, gradient "
            "and state memory are the sizes of those tensors."
        )
    notes.append(
        "Memory is the largest over the ranks; `other` = after-step peak - parameters - "
        "gradients - optimizer state (activations, temporaries, DDP's gradient buckets)."
    )
    notes += _target_notes(rows, config.world_size)
    s = config.shape
    return Run.create(
        "zero",
        rows,
        device=device,
        config=asdict(config),
        command=command,
        title=f"Optimizer-state sharding: {s.name} ({config.optimizer} AdamW, fp32), "
        f"{config.world_size} ranks, batch {config.batch} per rank, context "
        f"{config.context_length}, {config.warmup} warm-up + {config.steps} timed steps",
        columns=list(COLUMNS),
        notes=notes,
    )


def _label(row: Mapping[str, Any]) -> str:
    if row.get("bucket_mb") is None:
        return str(row["variant"])
    return f"{row['variant']}\n{row['bucket_mb']:g} MB"


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
    return stacked_bar_plot(rows, label="label", panels=(memory, time), path=path, title=run.title)


def _bucket_mb(text: str) -> float:
    value = float(text)
    if not value >= 0:  # rejects negatives and nan; inf is allowed (one bucket per owner)
        raise ValueError(text)
    return value


def build_parser():
    """The `bench-zero` command line."""
    parser = make_parser("bench-zero", __doc__)
    model = parser.add_argument_group("model")
    model.add_argument(
        "--size", choices=[*lmcore.MODEL_SIZES, TINY.name], help="model size (xl; tiny on CPU)"
    )
    model.add_argument("--context-length", type=int, help="tokens per sequence (128)")
    model.add_argument("--batch", type=int, help="sequences per rank (4)")
    model.add_argument("--vocab-size", type=int, help=f"vocabulary ({lmcore.VOCAB_SIZE:,})")
    run = parser.add_argument_group("run")
    run.add_argument("--world-size", type=int, help="ranks, one GPU each on CUDA (2)")
    run.add_argument("--optimizer", choices=list(OPTIMIZERS), help="AdamW implementation (torch)")
    run.add_argument("--variants", nargs="+", choices=VARIANTS, help="what to compare")
    run.add_argument(
        "--zero-bucket-mb",
        type=_bucket_mb,
        nargs="+",
        metavar="MB",
        help=f"ShardedOptimizer broadcast caps, a row each ({DEFAULT_BUCKET_MB:g}; 0: one "
        "broadcast per parameter; inf: one per rank)",
    )
    run.add_argument(
        "--timeout",
        type=float,
        default=DEFAULT_TIMEOUT_S,
        help=f"seconds for all ranks ({DEFAULT_TIMEOUT_S:g})",
    )
    add_timing_args(parser, warmup=None, steps=None)
    return parser


def config_from_args(args, parser, device: torch.device) -> ZeroBenchConfig | None:
    """The device's default with the options applied; None when no option changes it."""
    overrides = {
        "shape": None
        if args.size is None
        else (TINY if args.size == TINY.name else ModelShape.of_size(args.size)),
        "context_length": args.context_length,
        "batch": args.batch,
        "vocab_size": args.vocab_size,
        "world_size": args.world_size,
        "optimizer": args.optimizer,
        "variants": tuple(dict.fromkeys(args.variants)) if args.variants else None,
        "bucket_mbs": tuple(dict.fromkeys(args.zero_bucket_mb)) if args.zero_bucket_mb else None,
        "warmup": args.warmup,
        "steps": args.steps,
    }
    overrides = {k: v for k, v in overrides.items() if v is not None}
    if not overrides:
        return None
    try:
        return replace(default_zero_config(device), **overrides)
    except ValueError as exc:
        parser.error(str(exc))


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of `bench-zero` (see the module docstring)."""
    parser = build_parser()
    args = parser.parse_args(argv)
    device = resolve_device(args.device)
    config = config_from_args(args, parser, device)
    run = run_zero(
        config,
        device=device,
        command=command_line(argv, prog="bench-zero"),
        timeout=args.timeout,
    )
    if is_primary():  # under torchrun every rank has the results; one prints and writes
        emit(run, args, plot=lambda path: plot_zero(run, path))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
