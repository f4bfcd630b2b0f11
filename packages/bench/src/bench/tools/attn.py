"""bench-attn's measurement: attention alone, implementation beside implementation (the
handout's §1.2 study), as `run_attention(config)`, and the `TOOL` its command runs.

The command line and what each option does: `bench.commands.attn` (`bench-attn --help`).
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from dataclasses import asdict
from pathlib import Path
from typing import Any, TypeVar

import torch

from bench.commands.attn import DTYPES, HANDOUT_GRID, IMPLS, AttnConfig, grid_fields
from bench.core.attention_impls import attention_impl
from bench.core.env import device_name
from bench.core.memory import free_memory, memory_in_use, peak_memory, reset_peak_memory, to_mib
from bench.core.oom import OK, guarded
from bench.core.plots import line_plot, ratio_heatmaps
from bench.core.results import NOISY, Keys, Run
from bench.core.timing import elapsed_ms, summarize, time_fn
from bench.core.tool import (
    Invocation,
    Tool,
    as_device,
    config_or_default,
    live_rows,
    progress,
)

__all__ = [
    "HANDOUT_GRID",
    "IMPLS",
    "KEYS",
    "TOOL",
    "AttnConfig",
    "plot_attention",
    "run_attention",
    "time_with_setup",
]

BASELINE = "sdpa"
# Fewest timed calls a cell gets even when one call is slower than its time budget allows.
MIN_STEPS = 3


S = TypeVar("S")


def time_with_setup(
    setup: Callable[[], S],
    fn: Callable[[S], Any],
    *,
    device: torch.device | str,
    warmup: int = 3,
    repeats: int = 10,
) -> list[float]:
    """Like `time_fn`, but each call runs `state = setup()` untimed, then times `fn(state)`.

    For work that consumes its input, e.g. timing only the backward pass: `setup` runs a fresh
    forward, `fn` runs `backward` on its output (no `retain_graph`, which compiled graphs with
    donated buffers refuse).

    Raises:
        ValueError: if `warmup < 0` or `repeats < 1`.
    """
    if warmup < 0 or repeats < 1:
        raise ValueError(f"need warmup >= 0 and repeats >= 1, got {warmup=} {repeats=}")
    for _ in range(warmup):
        fn(setup())
    samples = []
    for _ in range(repeats):
        state = setup()
        samples.append(elapsed_ms(lambda s=state: fn(s), device=device)[1])
    return samples


def _duration(seconds: float) -> str:
    return f"{seconds:.0f} s" if seconds < 120 else f"{seconds / 60:.0f} min"


def _steps_within(budget_s: float, one_call_ms: float, steps: int) -> int:
    """How many calls of `one_call_ms` fit in `budget_s`, between MIN_STEPS and `steps`."""
    fit = int(budget_s * 1e3 / max(one_call_ms, 1e-6))
    return max(min(steps, fit), min(MIN_STEPS, steps))


def _measure_cell(
    impl: str, d: int, seq: int, seq_k: int, config: AttnConfig, device: torch.device
) -> dict[str, Any]:
    """Time one implementation at one (d, seq, seq_k); raises OOM / Unavailable for
    `guarded`."""
    attend = attention_impl(impl, device=device)
    dtype = DTYPES[config.dtype]
    # (batch, seq, d) queries, (batch, seq_k, d) keys and values: the handout's attention
    # without a head dimension.
    q, k, v = (
        torch.randn(config.batch, n, d, device=device, dtype=dtype, requires_grad=True)
        for n in (seq, seq_k, seq_k)
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

    def step() -> None:
        forward().backward(grad_out)

    in_use: list[int | None] = []
    reset_peak_memory(device)
    # The first call (always run: it builds kernels) sizes the warm-up: as many more calls as
    # fit a quarter of the budget, up to `warmup` in all, and at least one, since a call that
    # compiled says nothing about the calls after it. The last warm-up call sizes the timing.
    (one_call,) = time_fn(step, device=device, warmup=0, repeats=1)
    more = min(config.warmup - 1, int(config.max_seconds / 4 * 1e3 / max(one_call, 1e-6)))
    (one_call,) = time_fn(step, device=device, warmup=max(more, 1) - 1, repeats=1)
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
        "fwd_ms": fwd.median,
        "fwd_iqr": fwd.iqr,
        "bwd_ms": bwd.median,
        "bwd_iqr": bwd.iqr,
        # a pass whose calls disagree by more than their typical time (a busy CPU)
        NOISY: [f"{key}_ms" for key, s in (("fwd", fwd), ("bwd", bwd)) if s.iqr > s.median],
        "mem_before_bwd_mib": to_mib(in_use[-1]),
        "peak_mib": to_mib(peak_memory(device)),
        "n": steps,
        "note": None
        if steps == config.steps
        else f"{steps} of {config.steps} calls: one fwd+bwd takes {one_call:,.0f} ms, "
        f"budget {config.max_seconds:g} s per pass",
    }


def _add_ratios(rows: list[dict[str, Any]]) -> None:
    """`fwd_vs_sdpa` / `bwd_vs_sdpa`: SDPA's time over this row's (above 1: faster than SDPA),
    noisy where either time is."""

    def cell(r: dict[str, Any]) -> tuple[int, int, int]:
        return r["d"], r["seq"], r["seq_k"]

    base = {cell(r): r for r in rows if r["impl"] == BASELINE and r["status"] == OK}
    for row in rows:
        ref = base.get(cell(row))
        for key in ("fwd", "bwd"):
            mine = row.get(f"{key}_ms")
            ok = ref is not None and mine and ref.get(f"{key}_ms")
            row[f"{key}_vs_sdpa"] = ref[f"{key}_ms"] / mine if ok else None
            if ok and f"{key}_ms" in (*row[NOISY], *ref[NOISY]):
                row[NOISY] = [*row[NOISY], f"{key}_vs_sdpa"]


COLUMNS = [
    "impl",
    "d",
    "seq",
    "seq_k",
    "fwd_ms",
    "fwd_iqr",
    "bwd_ms",
    "bwd_iqr",
    "fwd_vs_sdpa",
    "bwd_vs_sdpa",
    "mem_before_bwd_mib",
    "peak_mib",
    "n",
    NOISY,
    "status",
    "note",
]
# The printed table (`--wide`: every column), most telling first: the cell, its times and
# ratios, its status, the peak.
BRIEF = {
    "impl": "impl",
    "d": "d",
    "seq": "seq",
    "seq_k": "seq_k",
    "fwd_ms": "fwd_ms",
    "bwd_ms": "bwd_ms",
    "fwd_vs_sdpa": "fwd_vs_sdpa",
    "bwd_vs_sdpa": "bwd_vs_sdpa",
    "status": "status",
    "peak_mib": "peak_mib",
    "n": "n",
}
# What a CPU's times are for, said once, first.
CPU_TIMES = (
    "On a CPU these times check that every implementation runs, not how fast it runs: the "
    "kernels are written for GPUs, and a shared CPU's calls vary more than they take."
)
_LIVE_COLUMNS = ["impl", "d", "seq", "seq_k", "fwd_ms", "bwd_ms", "peak_mib", "n", "status"]

_METRICS = [c for c in COLUMNS if c not in ("impl", "d", "seq", "seq_k", "status")]
# Every key of a row, for readers (bench-report).
KEYS = Keys(*COLUMNS, "batch", "dtype", "causal")


def run_attention(
    config: AttnConfig | None = None,
    *,
    device: torch.device | str | None = None,
    command: str | None = None,
    show_progress: bool = True,
) -> Run:
    """Measure every (d, seq, implementation) of `config` on `device` and return the run.

    Args:
        config: the grid; the device's default (`AttnConfig`) when None.
        device: where to run; CUDA when available, else the CPU, when None.
        command: the command line to record; the process's own when None.
        show_progress: draw a progress bar on stderr.

    Prints (stderr) the cell count and an estimate of the time first, then each row as it
    completes, with or without the bar.

    Returns:
        A `Run` (tool `"attn"`) whose rows have `impl, d, seq, seq_k` (queries, keys), the
        metrics of `COLUMNS` (ms per call, MiB; memory `None` off CUDA), `status` (`ok`, `OOM`,
        `skipped: why`) and `note` (why a cell timed fewer than `steps` calls).

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
        cls=AttnConfig,
        tool="bench-attn",
        describe=lambda c: (
            f"d in {c.d_values}, seq in {c.seqs}, {c.steps} steps; the handout's grid needs a GPU"
        ),
    )
    if device.type == "cpu":
        notes.insert(0, CPU_TIMES)
        print(f"bench-attn: {CPU_TIMES}", file=sys.stderr)
    notes.append(
        "Times are ms per call (the median of n timed calls; fwd_iqr, bwd_iqr: their "
        "interquartile range). fwd_vs_sdpa, bwd_vs_sdpa: SDPA's time / this time (above 1: "
        "faster than SDPA). noisy: the times (and the ratios of them) whose interquartile range "
        "exceeds their median, printed as noisy. Memory in MiB: in use before backward, and peak."
    )
    cells = [
        (d, s, k, impl)
        for d in config.d_values
        for s in config.seqs
        for k in config.key_lengths(s)
        for impl in config.impls
    ]
    keys = f" × {len(config.seq_ks)} seq_k" if config.seq_ks else ""
    plan = (
        f"bench-attn: {len(cells)} cells ({len(config.d_values)} d × {len(config.seqs)} seq"
        f"{keys} × {len(config.impls)} implementations), at most {config.steps} timed calls and "
        f"{config.max_seconds:g} s per pass each: about {_duration(config.estimate_s())} or less."
    )
    notes.append(plan)
    show = live_rows(_LIVE_COLUMNS, title=plan)
    rows = []
    for d, seq, seq_k, impl in progress(cells, desc="bench-attn", enabled=show_progress):
        outcome = guarded(
            lambda impl=impl, d=d, seq=seq, k=seq_k: _measure_cell(impl, d, seq, k, config, device),
            device=device,
        )
        metrics = outcome.value if outcome.ok else {**dict.fromkeys(_METRICS), NOISY: []}
        rows.append(
            {
                "impl": impl,
                "batch": config.batch,
                "d": d,
                "seq": seq,
                "seq_k": seq_k,
                "dtype": config.dtype,
                "causal": config.causal,
                **metrics,
                "status": outcome.status,
            }
        )
        show(rows[-1])
        free_memory(device)
    _add_ratios(rows)
    return Run.create(
        "attn",
        rows,
        device=device,
        config=asdict(config),
        command=command,
        title=f"Attention forward/backward, batch {config.batch}, {config.dtype}"
        + (", causal" if config.causal else "")
        + f", {device_name(device)}",
        columns=COLUMNS,
        notes=notes,
        brief=BRIEF,
    )


def plot_attention(run: Run, path: Path) -> list[Path]:
    """Forward (at `path`) and backward (`<stem>_bwd.png`) time against seq, a panel per d (the
    square cells); and where fa2 ran beside SDPA, heatmaps of its speed-up over (Nq, Nk)
    (`<stem>_ratio_nq_nk.png`, a rectangular grid) and over (seq, d) (`<stem>_ratio_seq_d.png`,
    square cells)."""
    square = [r for r in run.rows if r.get("seq_k", r["seq"]) == r["seq"]]
    common = {
        "x": "seq",
        "series": "impl",
        "panels": "d",
        "logx": True,
        "logy": True,
        "title": run.plot_title,
    }
    written = []
    if square:
        written = [
            line_plot(square, y="fwd_ms", path=path, ylabel="forward (ms)", **common),
            line_plot(
                square,
                y="bwd_ms",
                path=path.with_name(f"{path.stem}_bwd{path.suffix or '.png'}"),
                ylabel="backward (ms)",
                **common,
            ),
        ]
    return written + ratio_heatmaps(
        run.rows, path, impls=("fa2-triton", "fa2-pytorch"), ratio="fwd_vs_sdpa",
        title=f"{run.plot_title}: forward, SDPA's time / fa2's",
    )  # fmt: skip


def _run(config: AttnConfig | None, cli: Invocation) -> Run:
    return run_attention(
        config, device=cli.device, command=cli.command, show_progress=cli.show_progress
    )


TOOL = Tool(run=_run, config=AttnConfig, preset=grid_fields, plot=plot_attention)
