"""bench-ddp: time per training step and time spent communicating, for every `ddp` wrapper beside
torch's DistributedDataParallel (the handout's §2.2 to §2.3).

`lmcore.TransformerLM` (XL by default), fp32, context 128, batch 4 per rank, AdamW, on
`--world-size` ranks (2 by default; one process per GPU with NCCL, launched by the tool itself,
or under torchrun), in these variants, all in one launch so that they share the machine's state:

- `single`: the model alone on each rank, no communication: the compute-only baseline.
- `naive`, `flat`, `individual`: `ddp.NaiveDDP`, `ddp.FlatDDP`, `ddp.DDPIndividualParameters`.
- `bucketed`: `ddp.DDPBucketed`, a row per `--bucket-mb` (1, 10, 100, 1000 MB).
- `torch-ddp`: torch's `DistributedDataParallel`, a row per `--torch-bucket-mb` (its default
  `bucket_cap_mb`, 25 MB, and 100 MB). The default-cap row is the baseline of `vs_torch`.

Every step is the same loop (`zero_grad(set_to_none=False)`, forward, cross-entropy, backward,
`finish_gradient_synchronization()` for the `ddp` wrappers, `optimizer.step()`), timed between
device synchronisations; a step takes as long as its slowest rank, and the table shows medians
over the timed steps. Per variant:

- `step_ms` (and its spread), `overhead_ms` (beyond `single`), `vs_torch`;
- `wait_ms`: how long `finish_gradient_synchronization()` held training up (CUDA events around
  it): all of the communication for `naive` and `flat`, the exposed part of it for the
  overlapped wrappers;
- `comm_ms`: the summed time of the step's all-reduces, from NCCL's own timing (the ranks run
  with ``TORCH_NCCL_ENABLE_TIMING=1``; gloo does not time its collectives);
- `hidden`: the share of the all-reduce time overlapped with backward, `1 - wait_ms / comm_ms`.

torch DDP waits inside backward, so only its step time and overhead are shown. Without a GPU a
tiny model runs on 2 gloo CPU ranks (and says so).
"""

from __future__ import annotations

from collections.abc import Sequence
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
from bench.memory import free_memory
from bench.model import TINY, ModelShape
from bench.nvtx import nvtx_range
from bench.oom import OK, OOM, guarded
from bench.plots import hbar_plot
from bench.results import Run
from bench.timing import elapsed_ms, summarize

__all__ = [
    "COLUMNS",
    "VARIANTS",
    "DDPBenchConfig",
    "default_ddp_config",
    "main",
    "plot_ddp",
    "run_ddp",
]

VARIANTS = ("single", "naive", "flat", "individual", "bucketed", "torch-ddp")
_WRAPPERS: dict[str, type[ddp.DataParallelBase]] = {
    "naive": ddp.NaiveDDP,
    "flat": ddp.FlatDDP,
    "individual": ddp.DDPIndividualParameters,
}
# The training recipe does not matter for timing beyond AdamW's two moments per parameter.
ADAMW_OPTIONS = {"lr": 1e-4, "weight_decay": 0.01}
# torch DDP's `bucket_cap_mb` when left unset (None).
TORCH_DEFAULT_BUCKET_MB = 25.0
# Issue 4's target: DDPBucketed at its best bucket size within 5% of torch DDP's step time.
TARGET_VS_TORCH = 1.05
COLUMNS = (
    "case",
    "step_ms",
    "step_ms_std",
    "overhead_ms",
    "wait_ms",
    "comm_ms",
    "hidden",
    "collectives",
    "vs_torch",
    "status",
)
_RANK_ENV = {"TORCH_NCCL_ENABLE_TIMING": "1"}  # NCCL times each collective: `comm_ms`


@dataclass(frozen=True)
class DDPBenchConfig:
    """What `run_ddp` measures.

    Args:
        shape: the model's widths and depth (`ModelShape.of_size("xl")`, or `bench.model.TINY`).
        context_length: tokens per sequence.
        batch: sequences per rank per step.
        vocab_size: vocabulary size.
        attention: lmcore attention backend.
        world_size: ranks (one GPU each on CUDA).
        variants: from `VARIANTS`, in the order they run.
        bucket_mbs: `DDPBucketed` bucket sizes (MiB), a row each.
        torch_bucket_mbs: torch DDP `bucket_cap_mb` values, a row each; None is its default.
        warmup: untimed steps per variant (the first creates the optimizer state).
        steps: timed steps per variant.
    """

    shape: ModelShape
    context_length: int = 128
    batch: int = 4
    vocab_size: int = lmcore.VOCAB_SIZE
    attention: str = "naive"
    world_size: int = 2
    variants: tuple[str, ...] = VARIANTS
    bucket_mbs: tuple[float, ...] = (1.0, 10.0, 100.0, 1000.0)
    torch_bucket_mbs: tuple[float | None, ...] = (None, 100.0)
    warmup: int = 3
    steps: int = 10

    def __post_init__(self) -> None:
        if not self.variants or not set(self.variants) <= set(VARIANTS):
            raise ValueError(f"variants must be non-empty, from {VARIANTS}; got {self.variants}")
        if any(not b >= 0 for b in self.bucket_mbs) or any(
            b is not None and not b > 0 for b in self.torch_bucket_mbs
        ):
            raise ValueError(
                f"bucket sizes must be >= 0 (torch's > 0 or None), got {self.bucket_mbs} and "
                f"{self.torch_bucket_mbs}"
            )
        if "bucketed" in self.variants and not self.bucket_mbs:
            raise ValueError("the bucketed variant needs at least one bucket size")
        if "torch-ddp" in self.variants and not self.torch_bucket_mbs:
            raise ValueError("the torch-ddp variant needs at least one bucket_cap_mb")
        sizes = (self.context_length, self.batch, self.vocab_size, self.steps)
        if min(sizes) < 1 or self.warmup < 1 or self.world_size < 2:
            raise ValueError(
                "context_length, batch, vocab_size and steps must be positive, warmup at least 1 "
                f"(it creates the optimizer state) and world_size at least 2; got {self}"
            )


def default_ddp_config(device: torch.device | str) -> DDPBenchConfig:
    """XL at context 128, batch 4 per rank, on 2 GPUs; a tiny model on 2 CPU ranks otherwise."""
    if torch.device(device).type == "cuda":
        return DDPBenchConfig(shape=ModelShape.of_size("xl"))
    return DDPBenchConfig(shape=TINY, context_length=32, batch=2, warmup=1, steps=3)


@dataclass(frozen=True)
class _Case:
    """One measured row: a variant, and its bucket size where it has one."""

    variant: str
    bucket_mb: float | None = None

    @property
    def label(self) -> str:
        if self.variant == "bucketed":
            return f"bucketed {self.bucket_mb:g} MB"
        if self.variant == "torch-ddp":
            mb = TORCH_DEFAULT_BUCKET_MB if self.bucket_mb is None else self.bucket_mb
            return f"torch-ddp {mb:g} MB" + (" (default)" if self.bucket_mb is None else "")
        return self.variant


def _cases(config: DDPBenchConfig) -> list[_Case]:
    cases = []
    for variant in config.variants:
        if variant == "bucketed":
            cases += [_Case(variant, mb) for mb in config.bucket_mbs]
        elif variant == "torch-ddp":
            cases += [_Case(variant, mb) for mb in config.torch_bucket_mbs]
        else:
            cases.append(_Case(variant))
    return cases


def _wrap(case: _Case, model: nn.Module, device: torch.device) -> nn.Module:
    if case.variant == "single":
        return model
    if case.variant == "torch-ddp":
        device_ids = [device.index] if device.type == "cuda" else None
        return DistributedDataParallel(model, device_ids=device_ids, bucket_cap_mb=case.bucket_mb)
    if case.variant == "bucketed":
        return ddp.DDPBucketed(model, case.bucket_mb, record_comm_stats=True)
    return _WRAPPERS[case.variant](model, record_comm_stats=True)


def _measure_case(
    case: _Case, config: DDPBenchConfig, rank: int, device: torch.device
) -> dict[str, Any]:
    """One rank's per-step times (ms) and communication records for one case."""
    free_memory(device)
    torch.manual_seed(rank)  # ranks start apart; the wrappers broadcast rank 0's weights
    s = config.shape
    with torch.device(device):
        model = lmcore.TransformerLM(
            config.vocab_size,
            config.context_length,
            s.d_model,
            s.num_layers,
            s.num_heads,
            s.d_ff,
            attention=config.attention,
        )
    wrapped = _wrap(case, model, device)
    ours = isinstance(wrapped, ddp.DataParallelBase)
    optimizer = torch.optim.AdamW(wrapped.parameters(), **ADAMW_OPTIONS)
    g = torch.Generator().manual_seed(1000 + rank)  # each rank its own data, as in training
    shape = (config.batch, config.context_length + 1)

    def step(tokens: torch.Tensor) -> None:
        if ours:
            wrapped.on_train_batch_start()
        optimizer.zero_grad(set_to_none=False)
        loss = lmcore.cross_entropy(wrapped(tokens[:, :-1]), tokens[:, 1:])
        loss.backward()
        if ours:
            wrapped.finish_gradient_synchronization()
        optimizer.step()

    times, waits, comms = [], [], []
    for index in range(config.warmup + config.steps):
        tokens = torch.randint(config.vocab_size, shape, generator=g).to(device)
        with nvtx_range(f"{case.label}: step {index}"):
            ms = elapsed_ms(lambda t=tokens: step(t), device=device)[1]
        if index < config.warmup:
            continue
        times.append(ms)
        if ours:
            stats = wrapped.comm_stats
            waits.append(stats.wait_ms)
            comms.append(stats.comm_ms)
    return {
        "times": times,
        "waits": waits if ours else None,
        "comms": comms if ours and None not in comms else None,
        "collectives": wrapped.comm_stats.num_collectives if ours else None,
    }


def _rank_worker(
    rank: int, world_size: int, config: DDPBenchConfig, device_type: str
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


def _slowest_median(per_rank: Sequence[Sequence[float]]) -> tuple[float, float]:
    """Median and spread over steps of the slowest rank's value at each step."""
    summary = summarize([max(values) for values in zip(*per_rank, strict=True)])
    return summary.median, summary.std


def _row(case: _Case, per_rank: Sequence[dict[str, Any]]) -> dict[str, Any]:
    row: dict[str, Any] = {
        "case": case.label,
        "variant": case.variant,
        "bucket_mb": case.bucket_mb,
    }
    if any(r["status"] != OK for r in per_rank):
        return {**row, "status": OOM}
    row["step_ms"], row["step_ms_std"] = _slowest_median([r["times"] for r in per_rank])
    if per_rank[0]["waits"] is not None:
        row["wait_ms"] = _slowest_median([r["waits"] for r in per_rank])[0]
        row["collectives"] = per_rank[0]["collectives"]
    if all(r["comms"] is not None for r in per_rank):
        row["comm_ms"] = _slowest_median([r["comms"] for r in per_rank])[0]
        if row["comm_ms"] > 0:
            row["hidden"] = min(1.0, max(0.0, 1.0 - row["wait_ms"] / row["comm_ms"]))
    row["status"] = OK
    return row


def _add_comparisons(rows: list[dict[str, Any]]) -> None:
    """`overhead_ms` beyond `single` and `vs_torch` against torch DDP's default bucket cap."""
    ok = [r for r in rows if r["status"] == OK]
    single = next((r for r in ok if r["variant"] == "single"), None)
    torch_ddp = next(
        (r for r in ok if r["variant"] == "torch-ddp" and r["bucket_mb"] is None), None
    )
    for row in ok:
        if single is not None:
            row["overhead_ms"] = row["step_ms"] - single["step_ms"]
        if torch_ddp is not None:
            row["vs_torch"] = row["step_ms"] / torch_ddp["step_ms"]


def _target_note(rows: Sequence[dict[str, Any]]) -> list[str]:
    bucketed = [r for r in rows if r["variant"] == "bucketed" and r.get("vs_torch") is not None]
    if not bucketed:
        return []
    best = min(bucketed, key=lambda r: r["vs_torch"])
    verdict = "met" if best["vs_torch"] <= TARGET_VS_TORCH else "NOT met"
    hidden = best.get("hidden")
    hidden_text = "" if hidden is None else f", hiding {hidden:.0%} of its all-reduce time"
    return [
        f"Best DDPBucketed: {best['case']} at {best['vs_torch']:.3f}x torch DDP's step time "
        f"(target <= {TARGET_VS_TORCH}x: {verdict}){hidden_text}."
    ]


def run_ddp(
    config: DDPBenchConfig | None = None,
    *,
    device: torch.device | str | None = None,
    command: str | None = None,
    timeout: float = DEFAULT_TIMEOUT_S,
) -> Run:
    """Measure every variant of `config` on `config.world_size` ranks, in one launch.

    Args:
        config: what to run; `default_ddp_config(device)` when None.
        device: `cuda` (NCCL, one GPU per rank) or `cpu` (gloo); CUDA when available when None.
        command: the command line to record; the process's own when None.
        timeout: seconds the ranks may take in all.

    Returns:
        A `Run` (tool `"ddp"`): one row per variant and bucket size (see the module docstring
        for the columns; rows also carry `variant` and `bucket_mb`).

    Raises:
        ValueError: CUDA with fewer GPUs than `config.world_size`.
    """
    device = torch.device(device) if device is not None else resolve_device("auto")
    notes: list[str] = []
    if config is None:
        config = default_ddp_config(device)
        if device.type != "cuda":
            s = config.shape
            notes.append(
                cpu_default_notice(
                    "bench-ddp",
                    f"{s.num_layers} layers of width {s.d_model}, context {config.context_length}, "
                    f"batch {config.batch} per rank, {config.world_size} gloo ranks",
                )
            )
    on_gpu = device.type == "cuda"
    per_rank = launch(
        _rank_worker,
        world_size=config.world_size,
        backend="nccl" if on_gpu else "gloo",
        args=(config, device.type),
        env=_RANK_ENV,
        timeout=timeout,
    )
    cases = _cases(config)
    rows = [_row(case, [r[i] for r in per_rank]) for i, case in enumerate(cases)]
    _add_comparisons(rows)
    notes += _target_note(rows)
    notes.append(
        "Medians over steps of the slowest rank. wait_ms: time finish_gradient_synchronization() "
        "held training up; comm_ms: summed all-reduce time (NCCL timing); hidden = 1 - "
        "wait/comm; overhead_ms: step time beyond `single`."
    )
    s = config.shape
    return Run.create(
        "ddp",
        rows,
        device=device,
        config=asdict(config),
        command=command,
        title=f"Data-parallel training step: {s.name}, fp32, {config.world_size} ranks, batch "
        f"{config.batch} per rank, context {config.context_length}, {config.warmup} warm-up + "
        f"{config.steps} timed steps",
        columns=list(COLUMNS),
        notes=notes,
    )


def plot_ddp(run: Run, path: str | Path) -> Path:
    """Bars per variant: step time, the exposed wait, and the all-reduce time where measured.

    Raises:
        ValueError: if no variant completed.
    """
    return hbar_plot(
        run.ok_rows,
        label="case",
        values=(("step_ms", "step"), ("wait_ms", "wait in finish"), ("comm_ms", "all-reduce")),
        path=path,
        title=run.title,
        xlabel="ms per step (median, slowest rank)",
    )


def _bucket_mb(text: str) -> float:
    value = float(text)
    if not value >= 0:
        raise ValueError(text)
    return value


def _torch_bucket_mb(text: str) -> float | None:
    return None if text == "default" else _bucket_mb(text)


def build_parser():
    """The `bench-ddp` command line."""
    parser = make_parser("bench-ddp", __doc__)
    model = parser.add_argument_group("model")
    model.add_argument(
        "--size", choices=[*lmcore.MODEL_SIZES, TINY.name], help="model size (xl; tiny on CPU)"
    )
    model.add_argument("--context-length", type=int, help="tokens per sequence (128)")
    model.add_argument("--batch", type=int, help="sequences per rank (4)")
    model.add_argument("--vocab-size", type=int, help=f"vocabulary ({lmcore.VOCAB_SIZE:,})")
    model.add_argument("--attention", help="lmcore attention backend (naive)")
    run = parser.add_argument_group("run")
    run.add_argument("--world-size", type=int, help="ranks, one GPU each on CUDA (2)")
    run.add_argument("--variants", nargs="+", choices=VARIANTS, help="what to compare (all)")
    run.add_argument(
        "--bucket-mb", type=_bucket_mb, nargs="+", metavar="MB", help="DDPBucketed (1 10 100 1000)"
    )
    run.add_argument(
        "--torch-bucket-mb",
        type=_torch_bucket_mb,
        nargs="+",
        metavar="MB",
        help="torch DDP bucket_cap_mb values, 'default' for its own (default 100)",
    )
    run.add_argument(
        "--timeout", type=float, default=DEFAULT_TIMEOUT_S, help="seconds for all ranks (1800)"
    )
    add_timing_args(parser, warmup=None, steps=None)
    return parser


def config_from_args(args, parser, device: torch.device) -> DDPBenchConfig | None:
    """The device's default with the options applied; None when no option changes it."""
    overrides = {
        "shape": None
        if args.size is None
        else (TINY if args.size == TINY.name else ModelShape.of_size(args.size)),
        "context_length": args.context_length,
        "batch": args.batch,
        "vocab_size": args.vocab_size,
        "attention": args.attention,
        "world_size": args.world_size,
        "variants": tuple(dict.fromkeys(args.variants)) if args.variants else None,
        "bucket_mbs": tuple(dict.fromkeys(args.bucket_mb)) if args.bucket_mb else None,
        "torch_bucket_mbs": tuple(dict.fromkeys(args.torch_bucket_mb))
        if args.torch_bucket_mb
        else None,
        "warmup": args.warmup,
        "steps": args.steps,
    }
    overrides = {k: v for k, v in overrides.items() if v is not None}
    if not overrides:
        return None
    try:
        return replace(default_ddp_config(device), **overrides)
    except ValueError as exc:
        parser.error(str(exc))


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of `bench-ddp` (see the module docstring)."""
    parser = build_parser()
    args = parser.parse_args(argv)
    device = resolve_device(args.device)
    run = run_ddp(
        config_from_args(args, parser, device),
        device=device,
        command=command_line(argv, prog="bench-ddp"),
        timeout=args.timeout,
    )
    if is_primary():
        emit(run, args, plot=lambda path: plot_ddp(run, path))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
