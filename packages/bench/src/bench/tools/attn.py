"""bench-attn: attention alone, implementation beside implementation (the handout's §1.2 study).

Single-head attention (batch 8, no head dimension) over a grid of head sizes d and sequence
lengths: the time of a forward call, the time of a backward call, the memory in use before the
backward (inputs, output and everything autograd saved), and the peak. Implementations:

- `naive`: plain PyTorch, the full score matrix materialised (`lmcore` backend `naive`).
- `compiled`: the same function through `torch.compile` (one static compilation per shape).
- `fa2-pytorch`, `fa2-triton`: FlashAttention-2 from the `fa2` package.
- `sdpa`: `torch.nn.functional.scaled_dot_product_attention`, the baseline of the ratios.

The forward is timed with autograd recording, as in training. The backward is timed alone: each
timed call follows an untimed fresh forward (no `retain_graph`). Each cell gets `--warmup` calls
and then `--steps` timed calls (100 by default, as in the handout), fewer when one call is so slow
that `--steps` of them would exceed `--max-seconds`; the row's `n` says how many ran.

Without a GPU a small CPU default runs instead (and says so): fa2-triton is skipped (Triton's
CPU interpreter is far too slow to benchmark) and `compiled` is left out (building the CPU code
takes about a minute); ask for it with `--impls`.
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import torch

from bench.core.attention_impls import attention_impl
from bench.core.cli import (
    Invocation,
    Tool,
    add_timing_args,
    as_device,
    config_or_default,
    distinct,
    progress,
)
from bench.core.memory import free_memory, memory_in_use, peak_memory, reset_peak_memory, to_mib
from bench.core.oom import OK, guarded
from bench.core.plots import line_plot
from bench.core.results import Run
from bench.core.timing import summarize, time_fn, time_with_setup

__all__ = [
    "IMPLS",
    "TOOL",
    "AttnConfig",
    "default_attn_config",
    "main",
    "plot_attention",
    "run_attention",
]

IMPLS = ("naive", "compiled", "fa2-pytorch", "fa2-triton", "sdpa")
BASELINE = "sdpa"

DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}

# The handout's grid (§1.2.1): batch 8, d in {16, 32, 64, 128}, seq in {256, ..., 16384}.
GPU_D_VALUES = (16, 32, 64, 128)
GPU_SEQS = (256, 1024, 4096, 8192, 16384)
# The CPU default: small enough that the whole grid runs in seconds on two cores.
CPU_D_VALUES = (16, 32)
CPU_SEQS = (64, 128)
CPU_IMPLS = ("naive", "fa2-pytorch", "fa2-triton", "sdpa")

# Fewest timed calls a cell gets even when one call is slower than its time budget allows.
MIN_STEPS = 3


@dataclass(frozen=True)
class AttnConfig:
    """What `run_attention` measures.

    Args:
        batch: batch size (the handout's 8).
        d_values: head sizes d.
        seqs: sequence lengths.
        impls: implementations, from `IMPLS`.
        steps: timed forward calls and timed backward calls per cell (the handout's 100).
        warmup: untimed calls first (compilation, autotuning, allocator growth).
        dtype: `fp32` (the handout's), `bf16` or `fp16`.
        causal: causal masking (the handout's study is not causal).
        max_seconds: time budget of one cell's timed forward calls (and again of its backward
            calls); `steps` is cut down to fit, to no fewer than 3 calls.
    """

    batch: int = 8
    d_values: tuple[int, ...] = GPU_D_VALUES
    seqs: tuple[int, ...] = GPU_SEQS
    impls: tuple[str, ...] = IMPLS
    steps: int = 100
    warmup: int = 10
    dtype: str = "fp32"
    causal: bool = False
    max_seconds: float = 20.0

    def __post_init__(self) -> None:
        unknown = sorted(set(self.impls) - set(IMPLS))
        if unknown or len(set(self.impls)) != len(self.impls):
            raise ValueError(
                f"impls must be distinct names from {list(IMPLS)}, got {list(self.impls)}"
            )
        if self.dtype not in DTYPES:
            raise ValueError(f"dtype must be one of {list(DTYPES)}, got {self.dtype!r}")
        positive = {"batch": self.batch, "steps": self.steps, "max_seconds": self.max_seconds}
        positive.update({f"d={d}": d for d in self.d_values})
        positive.update({f"seq={s}": s for s in self.seqs})
        bad = [name for name, value in positive.items() if not value > 0]
        if bad or self.warmup < 0 or not self.d_values or not self.seqs or not self.impls:
            raise ValueError(
                "batch, steps, max_seconds, every d and seq must be positive, warmup >= 0, and "
                f"d_values, seqs, impls non-empty; got {self}"
            )


def default_attn_config(device: torch.device | str) -> AttnConfig:
    """The handout's grid on CUDA; on the CPU a small grid that runs in seconds."""
    if torch.device(device).type == "cuda":
        return AttnConfig()
    return AttnConfig(
        d_values=CPU_D_VALUES, seqs=CPU_SEQS, impls=CPU_IMPLS, steps=5, warmup=1, max_seconds=2.0
    )


def _steps_within(budget_s: float, one_call_ms: float, steps: int) -> int:
    """How many calls of `one_call_ms` fit in `budget_s`, between MIN_STEPS and `steps`."""
    fit = int(budget_s * 1e3 / max(one_call_ms, 1e-6))
    return max(min(steps, fit), min(MIN_STEPS, steps))


def _measure_cell(
    impl: str, d: int, seq: int, config: AttnConfig, device: torch.device
) -> dict[str, Any]:
    """Time one implementation at one (d, seq); raises OOM / Unavailable for `guarded`."""
    attend = attention_impl(impl, device=device)
    dtype = DTYPES[config.dtype]
    # (batch, seq, d): the handout's attention without a head dimension.
    q, k, v = (
        torch.randn(config.batch, seq, d, device=device, dtype=dtype, requires_grad=True)
        for _ in range(3)
    )
    grad_out = torch.randn(config.batch, seq, d, device=device, dtype=dtype)

    def forward() -> torch.Tensor:
        for t in (q, k, v):
            t.grad = None
        return attend(q, k, v, config.causal)

    def forward_noting_memory() -> torch.Tensor:
        out = forward()
        in_use.append(memory_in_use(device))
        return out

    in_use: list[int | None] = []
    reset_peak_memory(device)
    # The warm-up's last call (at least one) sizes the cell: how many timed calls fit the budget.
    (one_call,) = time_fn(
        lambda: forward().backward(grad_out),
        device=device,
        warmup=max(config.warmup - 1, 0),
        repeats=1,
    )
    steps = _steps_within(config.max_seconds, one_call, config.steps)
    fwd = summarize(time_fn(forward, device=device, warmup=0, repeats=steps))
    bwd = summarize(
        time_with_setup(
            forward_noting_memory,
            lambda out: out.backward(grad_out),
            device=device,
            warmup=0,
            repeats=steps,
        )
    )
    return {
        "fwd_ms": fwd.mean,
        "fwd_std": fwd.std,
        "bwd_ms": bwd.mean,
        "bwd_std": bwd.std,
        "mem_before_bwd_mib": to_mib(in_use[-1]),
        "peak_mib": to_mib(peak_memory(device)),
        "n": steps,
    }


def _add_ratios(rows: list[dict[str, Any]]) -> None:
    """`fwd_vs_sdpa` / `bwd_vs_sdpa`: SDPA's time over this row's (above 1: faster than SDPA)."""
    base = {(r["d"], r["seq"]): r for r in rows if r["impl"] == BASELINE and r["status"] == OK}
    for row in rows:
        ref = base.get((row["d"], row["seq"]))
        for key in ("fwd", "bwd"):
            mine = row.get(f"{key}_ms")
            ok = ref is not None and mine and ref.get(f"{key}_ms")
            row[f"{key}_vs_sdpa"] = ref[f"{key}_ms"] / mine if ok else None


COLUMNS = [
    "impl",
    "d",
    "seq",
    "fwd_ms",
    "fwd_std",
    "bwd_ms",
    "bwd_std",
    "fwd_vs_sdpa",
    "bwd_vs_sdpa",
    "mem_before_bwd_mib",
    "peak_mib",
    "n",
    "status",
]

_METRICS = [c for c in COLUMNS if c not in ("impl", "d", "seq", "status")]


def run_attention(
    config: AttnConfig | None = None,
    *,
    device: torch.device | str | None = None,
    command: str | None = None,
    show_progress: bool = True,
) -> Run:
    """Measure every (d, seq, implementation) of `config` on `device` and return the run.

    Args:
        config: the grid; `default_attn_config(device)` when None.
        device: where to run; CUDA when available, else the CPU, when None.
        command: the command line to record; the process's own when None.
        show_progress: draw a progress bar on stderr.

    Returns:
        A `Run` (tool `"attn"`) whose rows have `impl, d, seq`, the metrics of `COLUMNS` (ms per
        call, MiB; memory `None` off CUDA) and `status` (`ok`, `OOM`, `skipped: why`).

    Example::

        >>> config = AttnConfig(d_values=(16,), seqs=(64,), impls=("naive", "sdpa"), steps=2)
        >>> run = run_attention(config, device="cpu", show_progress=False)
        >>> [(r["impl"], r["status"]) for r in run.rows]
        [('naive', 'ok'), ('sdpa', 'ok')]
    """
    device = as_device(device)
    config, notes = config_or_default(
        config,
        device,
        default=default_attn_config,
        tool="bench-attn",
        describe=lambda c: (
            f"d in {c.d_values}, seq in {c.seqs}, {c.steps} steps; the handout's grid needs a GPU"
        ),
    )
    notes.append(
        "Times are ms per call (mean and std over n timed calls). fwd_vs_sdpa, bwd_vs_sdpa: "
        "SDPA's time / this time (above 1: faster than SDPA). Memory in MiB: in use before "
        "backward, and peak."
    )
    cells = [(d, s, impl) for d in config.d_values for s in config.seqs for impl in config.impls]
    rows = []
    for d, seq, impl in progress(cells, desc="bench-attn", enabled=show_progress):
        outcome = guarded(
            lambda impl=impl, d=d, seq=seq: _measure_cell(impl, d, seq, config, device),
            device=device,
        )
        metrics = outcome.value if outcome.ok else dict.fromkeys(_METRICS)
        rows.append(
            {
                "impl": impl,
                "batch": config.batch,
                "d": d,
                "seq": seq,
                "dtype": config.dtype,
                "causal": config.causal,
                **metrics,
                "status": outcome.status,
            }
        )
        free_memory(device)
    _add_ratios(rows)
    return Run.create(
        "attn",
        rows,
        device=device,
        config=asdict(config),
        command=command,
        title=f"Attention forward/backward, batch {config.batch}, {config.dtype}"
        + (", causal" if config.causal else ""),
        columns=COLUMNS,
        notes=notes,
    )


def plot_attention(run: Run, path: Path) -> list[Path]:
    """Forward (at `path`) and backward (`<stem>_bwd.png`) time against seq, a panel per d."""
    common = {"x": "seq", "series": "impl", "panels": "d", "logx": True, "logy": True}
    return [
        line_plot(run.rows, y="fwd_ms", path=path, ylabel="forward (ms)", **common),
        line_plot(
            run.rows,
            y="bwd_ms",
            path=path.with_name(f"{path.stem}_bwd{path.suffix or '.png'}"),
            ylabel="backward (ms)",
            **common,
        ),
    ]


def _add_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--d", type=int, nargs="+", help="head sizes (default: the grid's)")
    parser.add_argument("--seq", type=int, nargs="+", help="sequence lengths")
    parser.add_argument("--impls", nargs="+", choices=IMPLS, help="implementations")
    parser.add_argument("--batch", type=int, help="batch size (8)")
    parser.add_argument("--dtype", choices=list(DTYPES), help="fp32 (default), bf16 or fp16")
    parser.add_argument("--causal", action="store_true", help="causal masking")
    parser.add_argument("--max-seconds", type=float, help="time budget per cell and pass")
    add_timing_args(parser, warmup=None, steps=None)


def _overrides(args: argparse.Namespace) -> dict[str, Any]:
    return {
        "d_values": distinct(args.d),
        "seqs": distinct(args.seq),
        "impls": distinct(args.impls),
        "batch": args.batch,
        "dtype": args.dtype,
        "causal": args.causal or None,
        "max_seconds": args.max_seconds,
        "steps": args.steps,
        "warmup": args.warmup,
    }


def _run(config: AttnConfig | None, cli: Invocation) -> Run:
    return run_attention(
        config, device=cli.device, command=cli.command, show_progress=cli.show_progress
    )


TOOL = Tool(
    "bench-attn",
    __doc__,
    add_options=_add_options,
    run=_run,
    default=default_attn_config,
    overrides=_overrides,
    plot=plot_attention,
)


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of `bench-attn` (see the module docstring)."""
    return TOOL.main(argv)
