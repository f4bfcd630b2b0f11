"""bench-flash's measurement: FlashAttention-2 against PyTorch attention and SDPA, timed with
`do_bench`, as `run_flash(cases)`, and the `TOOL` its command runs; `host_ms`, the host's
time to issue a call, which it reports beside its device times.

The cases (`FlashCase`, the presets) and the command line: `bench.commands.flash`
(`bench-flash --help`).
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import asdict
from pathlib import Path
from typing import Any, TypeVar

import torch

from bench.commands.flash import DTYPES, PRESETS, FlashCase, FlashOptions
from bench.core.attention_impls import attention_impl
from bench.core.memory import free_memory
from bench.core.oom import OK, guarded
from bench.core.plots import bar_plot, line_plot, ratio_heatmaps
from bench.core.results import Keys, Run
from bench.core.timing import do_bench, summarize
from bench.core.tool import Invocation, Tool, as_device, cpu_default_notice, progress

__all__ = [
    "KEYS",
    "PRESETS",
    "TOOL",
    "FlashCase",
    "attention_flops",
    "cpu_case",
    "default_cases",
    "host_calls",
    "host_ms",
    "plot_flash",
    "run_flash",
]

# do_bench budgets (ms): Triton's defaults on CUDA; on the CPU just enough for a tiny case.
CUDA_BUDGET_MS = (25.0, 100.0)
CPU_BUDGET_MS = (5.0, 20.0)
# Timings of each implementation at a shape, interleaved (`serpentine`); the measurement budget
# is split among them. On an H200, two kernels timed one after the other swapped their order of
# merit when they swapped places (a drift of 1-3% over a run: docs/results/
# fa2_gluon_bwd_variants_h200_2026-11-29_sleep_a.md, _sleep_b.md).
CUDA_ROUNDS = 2
CPU_ROUNDS = 1
# `host_calls`: a host time averages over as many calls as take about this long on the device
# (3 to 20), since their kernels all run after the host has issued them.
HOST_SPAN_MS = 200.0

T = TypeVar("T")

# GPU clock cycles `host_ms` holds the GPU busy for (`torch.cuda._sleep`) while it issues its
# calls: about 50 ms at an H100's or H200's clocks, more than the host takes to issue 20 calls of
# anything bench times.
_HOLD_CYCLES = 100_000_000


def cpu_case() -> FlashCase:
    """The tiny case run without a GPU: fa2's PyTorch path in place of its Triton kernels."""
    return FlashCase(
        "cpu",
        1,
        (64, 128),
        (16, 32),
        ("fp32",),
        True,
        ("fa2-pytorch", "fa2-triton", "naive", "sdpa"),
        "sdpa",
    )


def default_cases(device: torch.device | str) -> list[FlashCase]:
    """Every preset on CUDA; `cpu_case()` elsewhere."""
    return list(PRESETS.values()) if torch.device(device).type == "cuda" else [cpu_case()]


def attention_flops(
    *, batch: int, seq: int, d: int, causal: bool, seq_k: int | None = None
) -> dict[str, float]:
    """FLOPs of one attention call over `batch` heads: `fwd`, `bwd` (2.5× fwd) and `fwd_bwd`.

    The forward is two matmuls of `2·d` FLOPs per visible (query, key) pair: all `seq·seq_k`
    (`seq_k` is `seq` when None), or when causal (top-left: query i sees keys 0..i) the area
    under the diagonal, `seq²/2` while the queries are no more than the keys and
    `seq_k²/2 + (seq − seq_k)·seq_k` beyond (half the scores of a square shape).
    """
    n_k = seq if seq_k is None else seq_k
    if not causal:
        pairs = seq * n_k
    elif seq <= n_k:
        pairs = seq * seq / 2
    else:
        pairs = n_k * n_k / 2 + (seq - n_k) * n_k
    fwd = batch * 4 * pairs * d
    return {"fwd": fwd, "bwd": 2.5 * fwd, "fwd_bwd": 3.5 * fwd}


def host_calls(device_ms: float) -> int:
    """How many calls `host_ms` should issue of a call taking `device_ms` on the device: as many
    as take about `HOST_SPAN_MS` there, from 3 to 20."""
    return max(3, min(20, int(HOST_SPAN_MS / max(device_ms, 1e-3))))


def host_ms(
    fn: Callable[[], Any],
    *,
    device: torch.device | str,
    calls: int = 20,
    grad_to_none: Sequence[torch.Tensor] | None = None,
) -> float | None:
    """The host's time to issue one call of `fn` (ms), measured while the GPU is held busy, so
    that nothing the calls issue waits for a kernel: the least a call can take however fast its
    kernels. Where a device time (`do_bench`) comes out near it, that time is the host's, not
    the kernels'. A call that synchronises shows as the hold's length (about 50 ms).

    None off CUDA, where the host's time is all a timing measures.

    Args:
        fn: the work, called with no arguments (once first, untimed, to warm caches).
        device: where the work runs.
        calls: how many calls to issue and average over; each call's kernels run after the hold,
            so this many times the call's device time is spent waiting at the end.
        grad_to_none: tensors whose `.grad` is set to None before every call (as in `do_bench`).
    """
    device = torch.device(device)
    if device.type != "cuda":
        return None
    if calls < 1:
        raise ValueError(f"calls must be at least 1, got {calls}")

    def call() -> None:
        for t in grad_to_none or ():
            t.grad = None
        fn()

    with torch.cuda.device(device):
        call()
        torch.cuda.synchronize()
        torch.cuda._sleep(_HOLD_CYCLES)
        start = time.perf_counter()
        for _ in range(calls):
            call()
        elapsed = time.perf_counter() - start
        torch.cuda.synchronize()
    return elapsed / calls * 1e3


_PASSES = ("fwd", "bwd", "fwd_bwd")


Inputs = tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor | None]


def _inputs(
    case: FlashCase, dtype: str, seq: int, seq_k: int, d: int, *, device: torch.device
) -> Inputs:
    """One shape's (batch, seq, d) queries and (batch, seq_k, d) keys and values (one head per
    batch entry, as in the handout), shared by every implementation, and the output gradient
    (None: `o.sum()`'s)."""
    q, k, v = (
        torch.randn((case.batch, n, d), device=device, dtype=DTYPES[dtype], requires_grad=True)
        for n in (seq, seq_k, seq_k)
    )
    return q, k, v, (None if case.grad == "sum" else torch.randn_like(q))


def _passes(case: FlashCase, impl: str, inputs: Inputs, *, device: torch.device):
    """(forward, forward+backward) of `impl` on `inputs`, as calls to time."""
    attend = attention_impl(impl, device=device)
    q, k, v, grad_out = inputs

    def forward() -> torch.Tensor:
        return attend(q, k, v, case.causal)

    def both() -> None:
        o = forward()
        if grad_out is None:
            o.sum().backward()
        else:
            o.backward(grad_out)

    return forward, both


def _time(passes, inputs: Inputs, *, device: torch.device, budget_ms) -> tuple[float, float]:
    """Median ms of the forward and of the forward+backward (`do_bench`)."""
    forward, both = passes
    timed = {"warmup_ms": budget_ms[0], "rep_ms": budget_ms[1], "device": device}
    fwd = summarize(do_bench(forward, **timed)).median
    fwd_bwd = summarize(do_bench(both, grad_to_none=list(inputs[:3]), **timed)).median
    return fwd, fwd_bwd


def _row_times(
    samples: list[tuple[float, float]], *, batch: int, seq: int, seq_k: int, d: int, causal: bool
) -> dict[str, float | None]:
    """Times (the medians of the rounds' medians) and TFLOP/s of one cell."""
    fwd = statistics.median(f for f, _ in samples)
    fwd_bwd = statistics.median(t for _, t in samples)
    # A difference of two medians: left empty where timing noise swamps it (only seen for
    # microsecond-sized calls on a busy CPU).
    bwd = fwd_bwd - fwd if fwd_bwd > fwd else None
    ms = {"fwd": fwd, "bwd": bwd, "fwd_bwd": fwd_bwd}
    flops = attention_flops(batch=batch, seq=seq, seq_k=seq_k, d=d, causal=causal)
    row: dict[str, float | None] = {f"{p}_ms": ms[p] for p in _PASSES}
    row.update({f"{p}_tflops": flops[p] / (t * 1e-3) / 1e12 if t else None for p, t in ms.items()})
    return row


def serpentine(items: list[T], rounds: int) -> list[T]:
    """The order of the timings at one shape: every item once a round, the rounds alternately
    forwards and backwards, so that a drift over the run (clocks, temperature) weighs on every
    implementation alike rather than on the ones timed last."""
    return [x for r in range(rounds) for x in (items if r % 2 == 0 else items[::-1])]


def _measure_shape(
    case: FlashCase, dtype: str, seq: int, seq_k: int, d: int, *, device: torch.device,
    budget_ms: tuple[float, float], rounds: int,
) -> dict[str, tuple[dict[str, float | None] | None, str]]:  # fmt: skip
    """Every implementation of `case` at one shape: each called once first (compiling what
    it compiles), then timed `rounds` times in `serpentine` order, `rep_ms / rounds` a
    timing; per implementation its row's times (None unless ok) and status."""
    made = guarded(lambda: _inputs(case, dtype, seq, seq_k, d, device=device), device=device)
    if not made.ok:
        return {impl: (None, made.status) for impl in case.impls}
    inputs = made.value
    passes, status = {}, {}
    for impl in case.impls:
        ready = guarded(lambda impl=impl: _passes(case, impl, inputs, device=device), device=device)
        if ready.ok:
            first = guarded(ready.value[1], device=device)  # compiles; an OOM shows here
            ready = ready if first.ok else first
        status[impl] = ready.status
        if ready.ok:
            passes[impl] = ready.value
    samples: dict[str, list[tuple[float, float]]] = {impl: [] for impl in passes}
    share = (budget_ms[0], budget_ms[1] / rounds)
    for impl in serpentine(list(passes), rounds):
        if status[impl] != OK:
            continue
        taken = guarded(
            lambda impl=impl: _time(passes[impl], inputs, device=device, budget_ms=share),
            device=device,
        )
        status[impl] = taken.status
        if taken.ok:
            samples[impl].append(taken.value)
    shape = {"batch": case.batch, "seq": seq, "seq_k": seq_k, "d": d, "causal": case.causal}
    rows = {impl: _row_times(samples[impl], **shape) for impl in passes if status[impl] == OK}
    for impl, row in rows.items():
        calls = host_calls(row["fwd_bwd_ms"])
        issued = guarded(
            lambda impl=impl, calls=calls: host_ms(
                passes[impl][1], device=device, calls=calls, grad_to_none=list(inputs[:3])
            ),
            device=device,
        )
        row["fwd_bwd_host_ms"] = issued.value if issued.ok else None
    return {impl: (rows.get(impl), status[impl]) for impl in case.impls}


def _add_ratios(rows: list[dict[str, Any]]) -> None:
    """`<pass>_speedup`: the baseline's time over this row's (above 1: faster than baseline)."""

    def key(r: dict[str, Any]) -> tuple:
        return r["case"], r["dtype"], r["batch"], r["seq"], r["seq_k"], r["d"], r["causal"]

    base = {key(r): r for r in rows if r["impl"] == r["baseline"] and r["status"] == OK}
    for row in rows:
        ref = base.get(key(row))
        for p in _PASSES:
            mine, theirs = row.get(f"{p}_ms"), ref and ref.get(f"{p}_ms")
            ok = mine is not None and theirs is not None and mine > 0 and theirs > 0
            row[f"{p}_speedup"] = theirs / mine if ok else None


COLUMNS = [
    "case",
    "impl",
    "dtype",
    "batch",
    "seq",
    "seq_k",
    "d",
    "fwd_ms",
    "bwd_ms",
    "fwd_bwd_ms",
    "fwd_tflops",
    "bwd_tflops",
    "fwd_bwd_tflops",
    "fwd_speedup",
    "bwd_speedup",
    "fwd_bwd_speedup",
    "fwd_bwd_host_ms",
    "status",
]
# Every key of a row, for readers (bench-report).
KEYS = Keys(*COLUMNS, "causal", "baseline", "grad")

_METRICS = [*(f"{p}_{m}" for m in ("ms", "tflops") for p in _PASSES), "fwd_bwd_host_ms"]


def _describe(case: FlashCase) -> str:
    return (
        f"batch {case.batch}, seq in {case.seqs}, d in {case.d_values}, {case.dtypes[0]}; "
        "fa2-pytorch stands in for the Triton kernels"
    )


def run_flash(
    cases: Iterable[FlashCase] | None = None,
    *,
    device: torch.device | str | None = None,
    budget_ms: tuple[float, float] | None = None,
    rounds: int | None = None,
    command: str | None = None,
    show_progress: bool = True,
) -> Run:
    """Time every cell of every case on `device`.

    Args:
        cases: what to run; every preset on CUDA and `cpu_case()` elsewhere when None.
        device: where to run; CUDA when available, else the CPU, when None.
        budget_ms: `(warmup_ms, rep_ms)` given to `do_bench` per measurement; Triton's defaults
            (25, 100) on CUDA, (5, 20) on the CPU, when None.
        rounds: timings of each implementation at a shape, interleaved with the others'
            (`serpentine`), the measurement budget split among them; its times are the medians
            of its rounds' medians. `CUDA_ROUNDS` (2) on CUDA, `CPU_ROUNDS` (1) on the CPU, when
            None.
        command: the command line to record; the process's own when None.
        show_progress: draw a progress bar on stderr.

    Returns:
        A `Run` (tool `"flash"`), rows per (case, impl, dtype, seq, seq_k, d) with times (ms),
        TFLOP/s,
        speed-ups against the case's baseline and `status`; one table per case.
    """
    device = as_device(device)
    notes: list[str] = []
    if cases is None:  # the device's default, announced off CUDA
        cases = default_cases(device)
        if device.type != "cuda":
            notes.append(cpu_default_notice("bench-flash", _describe(cases[0])))
    cases = list(cases)
    if budget_ms is None:
        budget_ms = CUDA_BUDGET_MS if device.type == "cuda" else CPU_BUDGET_MS
    if rounds is None:
        rounds = CUDA_ROUNDS if device.type == "cuda" else CPU_ROUNDS
    if rounds < 1:
        raise ValueError(f"rounds must be at least 1, got {rounds}")
    notes.append(
        "Median ms of triton.testing.do_bench (CUDA) or a timed loop (CPU); bwd = fwd_bwd − fwd. "
        f"At each shape every implementation is called once, then timed {rounds} time(s), the "
        "rounds interleaved (forwards, then backwards), a time the median of its rounds'. "
        "fwd_bwd_host_ms (CUDA): the host's time to issue one forward+backward while the GPU is "
        "held busy; where it is half of fwd_bwd_ms or more, that time may be the host's, not the "
        "kernels' (a host's time for one call can double from one process to the next). "
        "TFLOP/s from 4·S²·D per head for the forward (halved when causal), backward 2.5× that. "
        "speedup = baseline time / this time: baseline "
        + ", ".join(f"{c.baseline} for {c.name}" for c in cases)
        + "."
    )
    shapes = [
        (case, dtype, seq, seq_k, d)
        for case in cases
        for dtype in case.dtypes
        for d in case.d_values
        for seq in case.seqs
        for seq_k in case.key_lengths(seq)
    ]
    rows = []
    for case, dtype, seq, seq_k, d in progress(shapes, desc="bench-flash", enabled=show_progress):
        measured = _measure_shape(
            case, dtype, seq, seq_k, d, device=device, budget_ms=budget_ms, rounds=rounds
        )
        for impl in case.impls:
            times, status = measured[impl]
            rows.append(
                {
                    "case": case.name,
                    "impl": impl,
                    "dtype": dtype,
                    "batch": case.batch,
                    "seq": seq,
                    "seq_k": seq_k,
                    "d": d,
                    "causal": case.causal,
                    "grad": case.grad,
                    "baseline": case.baseline,
                    **(times if times is not None else dict.fromkeys(_METRICS)),
                    "status": status,
                }
            )
        free_memory(device)
    _add_ratios(rows)
    return Run.create(
        "flash",
        rows,
        device=device,
        config={"cases": [asdict(c) for c in cases], "budget_ms": budget_ms, "rounds": rounds},
        command=command,
        title="FlashAttention-2 vs PyTorch attention vs SDPA (do_bench medians)",
        columns=COLUMNS,
        group_by="case",
        notes=notes,
    )


def plot_flash(run: Run, path: Path) -> list[Path]:
    """Forward+backward TFLOP/s against seq (grids' square shapes) at `path`; presets' times
    beside it; for each grid case and dtype where fa2's Triton kernels ran beside the baseline,
    heatmaps of their speed-up over (Nq, Nk) and over (seq, d) (`plots.ratio_heatmaps`,
    `<stem>_<case>_<dtype>_ratio_*.png`)."""
    written = []
    seqs_per_case: dict[str, set[int]] = {}
    for r in run.rows:
        seqs_per_case.setdefault(r["case"], set()).add(r["seq"])
    grids = [r for r in run.rows if len(seqs_per_case[r["case"]]) > 1 and r["seq_k"] == r["seq"]]
    if grids:
        labelled = [dict(r, series=f"{r['impl']} {r['dtype']}") for r in grids]
        written.append(
            line_plot(
                labelled,
                x="seq",
                y="fwd_bwd_tflops",
                series="series",
                panels="d",
                path=path,
                logx=True,
                ylabel="forward+backward TFLOP/s",
                title=run.plot_title,
            )
        )
    groups: dict[tuple[str, str], list[dict[str, Any]]] = {}
    for r in run.rows:
        groups.setdefault((r["case"], r["dtype"]), []).append(r)
    for (case, dtype), rows in groups.items():
        written += ratio_heatmaps(
            rows, path.with_name(f"{path.stem}_{case}_{dtype}{path.suffix or '.png'}"),
            impls=("fa2-triton", "fa2-triton-compiled", "fa2-pytorch"), ratio="fwd_bwd_speedup",
            title=f"{run.plot_title}: {case}, {dtype}, forward+backward, baseline time / fa2's",
        )  # fmt: skip
    fixed = [r for r in run.rows if len(seqs_per_case[r["case"]]) == 1]
    if fixed:
        written.append(
            bar_plot(
                fixed,
                x="impl",
                y="fwd_bwd_tflops",
                panels="case",
                path=path if not grids else path.with_name(f"{path.stem}_presets{path.suffix}"),
                ylabel="forward+backward TFLOP/s",
                title=run.plot_title,
            )
        )
    return written


def _run(options: FlashOptions | None, cli: Invocation) -> Run:
    options = options or FlashOptions()
    cases = None
    if options.presets is not None or options.changes:
        cases = options.cases(default_cases(cli.device))
    return run_flash(
        cases,
        device=cli.device,
        budget_ms=options.budget_ms,
        rounds=options.rounds,
        command=cli.command,
        show_progress=cli.show_progress,
    )


TOOL = Tool(run=_run, config=FlashOptions, plot=plot_flash)
