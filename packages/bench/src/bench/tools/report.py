"""bench-report: the one document a CS336 student hands in, built from the results in a folder.

Every `*.json` a `bench-*` tool wrote (`--json`) in the folder (default `docs/results/`), and
the profile runs one level down (`bench-model --profile DIR` writes `DIR/<DIR>.json`), is read
back. The report opens with a summary (what was measured, where, the headline numbers and what
they mean), then answers the handout's questions in its order, each in prose computed from the
measured rows, followed by the tables and plots it rests on. Nothing in the answers is typed
in: a question without results says "Not measured."

Images are found by the result's own name: `<result>.png` and `<result>_*.png` beside
`<result>.json` (plus the plot paths the run recorded, where they still exist), so results and
their plots can be renamed together after a run.
"""

from __future__ import annotations

import argparse
import os
import re
import statistics
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bench.core.env import now_iso
from bench.core.oom import OK, OOM
from bench.core.results import Run, load_json, to_markdown
from bench.tools import allreduce, attn, data_parallel, flash, model, precision, sharding

__all__ = ["SECTIONS", "Section", "build_report", "collect_runs", "main", "report_links"]

# Row keys, imported from the tools that write them.
A, F, M, P = attn.KEYS, flash.KEYS, model.KEYS, precision.KEYS
R, D, Z, PR = allreduce.KEYS, data_parallel.KEYS, sharding.KEYS, model.PROFILE_KEYS
STATUS = M.status  # every tool's rows carry it

Rows = list[dict[str, Any]]

NOT_MEASURED = "Not measured."


def _ok(rows: Iterable[dict[str, Any]]) -> Rows:
    return [r for r in rows if r.get(STATUS, OK) == OK]


def _rows(runs: Sequence[Run], tool: str) -> Rows:
    return [r for run in runs if run.tool == tool for r in run.rows]


def _num(row: dict[str, Any], key: str) -> float | None:
    value = row.get(key)
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    return float(value)


def _best(rows: Rows, key: str) -> dict[str, Any] | None:
    """The row with the largest non-zero number under `key`; None when no row has one."""
    measured = [r for r in rows if _num(r, key)]
    return max(measured, key=lambda r: r[key]) if measured else None


def _grouped(rows: Rows, *keys: str) -> dict[tuple, Rows]:
    """`rows` grouped by their values of `keys`, groups and rows in first-seen order."""
    groups: dict[tuple, Rows] = {}
    for r in rows:
        groups.setdefault(tuple(r[k] for k in keys), []).append(r)
    return groups


def _fmt(value: float) -> str:
    return f"{value:,.0f}" if abs(value) >= 100 else f"{value:.3g}"


def _span(values: Sequence[float], unit: str = "×") -> str:
    """`median (min–max over n)` of `values`, e.g. `2.1× (1.9–2.4× over 5)`."""
    med = statistics.median(values)
    if len(values) == 1:
        return f"{_fmt(med)}{unit}"
    low, high = _fmt(min(values)), _fmt(max(values))
    return f"{_fmt(med)}{unit} (median; {low}–{high}{unit} over {len(values)})"


def _pairs(
    rows: Rows, *, vary: str, a: Any, b: Any, ignore: Sequence[str] = ()
) -> list[tuple[dict[str, Any], dict[str, Any]]]:
    """Rows that differ only in `vary` (value `a` vs `b`), matched on every non-metric key."""
    skip = {vary, STATUS, *ignore}

    def key(r: dict[str, Any]) -> tuple:
        return tuple(sorted((k, v) for k, v in r.items() if k not in skip and not _is_metric(k, v)))

    left = {key(r): r for r in rows if r.get(vary) == a}
    return [(left[key(r)], r) for r in rows if r.get(vary) == b and key(r) in left]


def _is_metric(key: str, value: Any) -> bool:
    """Measured values (floats, counts of timed steps) are not part of a row's identity."""
    return isinstance(value, float) or value is None or key in (M.n, M.first_step_ms)


# ----------------------------------------------------------------------------- answers


def _model_answers(runs: Sequence[Run]) -> list[str]:
    rows = _ok(_rows(runs, "model"))
    out = []
    ratios = [
        r[M.bwd_ms] / r[M.fwd_ms]
        for r in rows
        if r.get(M.mode) != "forward" and _num(r, M.bwd_ms) and _num(r, M.fwd_ms)
    ]
    if ratios:
        out.append(f"Backward time / forward time: {_span(ratios)}.")
    for mode in ("forward", "forward-backward", "train-step"):
        per = [r for r in rows if r.get(M.mode) == mode and _num(r, M.step_ms)]
        if per:
            items = ", ".join(
                f"{r[M.size]} ctx {r[M.ctx]} {r[M.dtype]}: {_fmt(r[M.step_ms])} ± "
                f"{_fmt(r[M.step_std])} ms"
                for r in per
            )
            out.append(f"{mode} step (mean ± std): {items}.")
    spread = [
        r[M.step_std] / r[M.step_ms]
        for r in rows
        if _num(r, M.step_ms) and _num(r, M.step_std) is not None
    ]
    if spread:
        out.append(f"Run-to-run spread (std / mean) is at most {max(spread):.1%} after warm-up.")
    best = _best(rows, M.mfu)
    if best:
        out.append(
            f"Highest MFU {best[M.mfu]:.1%} ({best[M.size]}, {best[M.mode]}, {best[M.dtype]}, "
            f"peak assumed {_fmt(best[M.mfu_peak_tflops])} TFLOP/s)."
        )
    return out


def _warmup_answers(runs: Sequence[Run]) -> list[str]:
    groups = _grouped(_ok(_rows(runs, "warmup")), M.size, M.ctx, M.mode, M.dtype)
    out = []
    for (size, ctx, mode, dtype), group in groups.items():
        group.sort(key=lambda r: r[M.warmup])
        parts = [
            f"{r[M.warmup]} warm-up: {_fmt(r[M.step_ms])} ± {_fmt(r[M.step_std])} ms, "
            f"first step {_fmt(r[M.first_step_ms])} ms"
            for r in group
        ]
        cold, warm = group[0], group[-1]
        out.append(
            f"{size} ctx {ctx} {mode} {dtype}: " + "; ".join(parts) + ". "
            f"Without enough warm-up the mean is {cold[M.step_ms] / warm[M.step_ms]:.2f}× and "
            f"the std {_ratio(cold[M.step_std], warm[M.step_std])} those after "
            f"{warm[M.warmup]} warm-up steps."
        )
    return out


def _ratio(a: float, b: float) -> str:
    return f"{a / b:.1f}×" if b else "(no spread to compare)"


def _precision_answers(runs: Sequence[Run]) -> list[str]:
    rows = _rows(runs, "precision")
    out = []
    acc = {r[P.case]: r for r in rows if r.get(P.part) == "accumulation"}
    if acc:
        out.append(
            "Accumulating 0.01 a thousand times: "
            + "; ".join(f"{c}: {r[P.printed]} (error {r[P.abs_error]:.2g})" for c, r in acc.items())
            + "."
        )
        fp16, fp32 = acc.get("fp16 += fp16"), acc.get("fp32 += fp32")
        if fp16 and fp32 and fp32[P.abs_error]:
            out.append(
                f"An fp16 accumulator is {fp16[P.abs_error] / fp32[P.abs_error]:,.0f}× further "
                "off than an fp32 one; adding fp16 values into fp32 keeps only the rounding of "
                f"0.01 to fp16 (error {acc.get('fp32 += fp16', fp16)[P.abs_error]:.2g})."
            )
    dtypes: dict[str, list[str]] = {}
    for r in rows:
        if r.get(P.part) == "autocast":
            dtypes.setdefault(r[P.autocast], []).append(f"{r[P.tensor]} {r[P.dtype]}")
    out.extend(f"Under autocast ({label}): {', '.join(seen)}." for label, seen in dtypes.items())
    model = _ok(_rows(runs, "model"))
    speedups = [
        f"{a[M.size]} {a[M.mode]}: {a[M.step_ms] / b[M.step_ms]:.2f}×"
        for a, b in _pairs(model, vary=M.dtype, a="fp32", b="bf16")
        if _num(a, M.step_ms) and _num(b, M.step_ms)
    ]
    if speedups:
        out.append(f"bf16 autocast speed-up (fp32 step / bf16 step): {', '.join(speedups)}.")
    return out


def _memory_answers(runs: Sequence[Run]) -> list[str]:
    rows = [r for r in _rows(runs, "model") if r.get(M.status) in (OK, OOM)]
    measured = [r for r in rows if _num(r, M.peak_mib) or r.get(M.status) == OOM]
    out = []
    if measured:
        table = [
            {key: r.get(key) for key in (M.size, M.ctx, M.dtype, M.mode, M.peak_mib, M.status)}
            for r in measured
        ]
        out.append("Peak memory (MiB) over the timed steps:\n\n" + to_markdown(table))
        ratios = [
            b[M.peak_mib] / a[M.peak_mib]
            for a, b in _pairs(_ok(measured), vary=M.dtype, a="fp32", b="bf16")
            if _num(a, M.peak_mib) and _num(b, M.peak_mib)
        ]
        if ratios:
            out.append(f"bf16 autocast peak / fp32 peak: {_span(ratios)}.")
    seen = {}
    for r in rows:
        if all(k in r for k in (M.batch, M.ctx, M.d_model)):
            seen[(r[M.size], r[M.batch], r[M.ctx], r[M.d_model])] = r
    for size, batch, ctx, d_model in seen:
        mib = batch * ctx * d_model * 4 / 2**20  # fp32 bytes
        out.append(
            f"One residual-stream activation of {size} (batch {batch} × ctx {ctx} × d_model "
            f"{d_model}, fp32) is {mib:,.2f} MiB."
        )
    return out


def _attention_answers(runs: Sequence[Run]) -> list[str]:
    rows = _rows(runs, "attn")
    out = []
    for d in sorted({r[A.d] for r in rows if r[A.impl] == "naive"}):
        naive = [r for r in rows if r[A.impl] == "naive" and r[A.d] == d]
        fits = [r[A.seq] for r in naive if r[A.status] == OK]
        ooms = [r[A.seq] for r in naive if r[A.status] == OOM]
        if fits or ooms:
            text = f"d={d}: naive attention fits up to seq {max(fits)}" if fits else f"d={d}:"
            out.append(text + (f", out of memory from seq {min(ooms)}." if ooms else " (no OOM)."))
    mem = [r for r in _ok(rows) if r[A.impl] == "naive" and _num(r, A.mem_before_bwd_mib)]
    if mem:
        big = max(mem, key=lambda r: (r[A.seq], r[A.d]))
        itemsize = 4 if big[A.dtype] == "fp32" else 2
        scores = big[A.batch] * big[A.seq] ** 2 * itemsize / 2**20
        out.append(
            f"Naive attention at seq {big[A.seq]}, d={big[A.d]} holds "
            f"{_fmt(big[A.mem_before_bwd_mib])} MiB before backward; the score matrix alone "
            f"(batch × seq²) is {_fmt(scores)} MiB, and softmax saves another of that size."
        )
    for impl in ("fa2-triton", "fa2-pytorch", "compiled"):
        for key, name in ((A.fwd_vs_sdpa, "forward"), (A.bwd_vs_sdpa, "backward")):
            vals = [r[key] for r in _ok(rows) if r[A.impl] == impl and _num(r, key)]
            if vals:
                out.append(f"{impl} {name} speed vs SDPA: {_span(vals)}.")
    return out


def _compile_answers(runs: Sequence[Run]) -> list[str]:
    out = []
    attn = _ok(_rows(runs, "attn"))
    for key, name in ((A.fwd_ms, "forward"), (A.bwd_ms, "backward")):
        vals = [
            a[key] / b[key]
            for a, b in _pairs(attn, vary=A.impl, a="naive", b="compiled")
            if _num(a, key) and _num(b, key)
        ]
        if vals:
            out.append(f"torch.compile'd attention {name} speed-up over eager: {_span(vals)}.")
    model = _ok(_rows(runs, "model"))
    vals = [
        f"{a[M.size]} {a[M.mode]} {a[M.dtype]}: {a[M.step_ms] / b[M.step_ms]:.2f}×"
        for a, b in _pairs(model, vary=M.compiled, a=False, b=True)
        if _num(a, M.step_ms) and _num(b, M.step_ms)
    ]
    if vals:
        out.append(
            f"torch.compile'd model speed-up (eager step / compiled step): {', '.join(vals)}."
        )
    return out


def _flash_answers(runs: Sequence[Run]) -> list[str]:
    rows = _ok(_rows(runs, "flash"))
    out = []
    cases = dict.fromkeys(r[F.case] for r in rows)
    for case in cases:
        crows = [r for r in rows if r[F.case] == case]
        if len({r[F.seq] for r in crows}) == 1:
            for r in crows:
                if r[F.impl] == r[F.baseline]:
                    continue
                sp = [
                    f"{name} {r[key]:.2f}×"
                    for name, key in (
                        ("fwd", F.fwd_speedup),
                        ("bwd", F.bwd_speedup),
                        ("fwd_bwd", F.fwd_bwd_speedup),
                    )
                    if _num(r, key)
                ]
                out.append(
                    f"{case} ({r[F.batch]}×{r[F.seq]}×{r[F.d]} {r[F.dtype]}): {r[F.impl]} "
                    f"forward+backward {_fmt(r[F.fwd_bwd_ms])} ms"
                    + (f"; vs {r[F.baseline]}: {', '.join(sp)}" if sp else "")
                    + "."
                )
            continue
        baseline = crows[0][F.baseline]
        for impl in dict.fromkeys(r[F.impl] for r in crows if r[F.impl] != baseline):
            mine = [r for r in crows if r[F.impl] == impl]
            vals = [r[F.fwd_bwd_speedup] for r in mine if _num(r, F.fwd_bwd_speedup)]
            if vals:
                out.append(f"{case}: {impl} forward+backward vs {baseline}: {_span(vals)}.")
            best = _best(mine, F.fwd_bwd_tflops)
            if best:
                out.append(
                    f"{case}: {impl} peaks at {_fmt(best[F.fwd_bwd_tflops])} TFLOP/s "
                    f"forward+backward (seq {best[F.seq]}, d {best[F.d]}, {best[F.dtype]})."
                )
    return out


def _allreduce_answers(runs: Sequence[Run]) -> list[str]:
    rows = [r for r in _ok(_rows(runs, "allreduce")) if _num(r, R.ms)]
    out = []
    for (backend, world), group in _grouped(rows, R.backend, R.world_size).items():
        group.sort(key=lambda r: r[R.size_mb])
        items = ", ".join(
            f"{_fmt(r[R.size_mb])} MB {_fmt(r[R.ms])} ms"
            + (f" ({_fmt(r[R.busbw_gbps])} GB/s bus)" if _num(r, R.busbw_gbps) else "")
            for r in group
        )
        out.append(f"{backend}, {world} ranks (median): {items}.")
    return out


def _bucket(row: dict[str, Any]) -> str:
    if _num(row, D.bucket_mb) is not None:
        return f" {_fmt(row[D.bucket_mb])} MB"
    # a sharded row without a size broadcasts one bucket per owner (ddp's vocabulary: None)
    return " one bucket" if str(row.get(Z.variant, "")).endswith("sharded") else ""


def _ddp_answers(runs: Sequence[Run]) -> list[str]:
    rows = [r for r in _ok(_rows(runs, "ddp")) if _num(r, D.step_ms)]
    if not rows:
        return []
    items = ", ".join(
        f"{r[D.case]}: {_fmt(r[D.step_ms])} ms"
        + (f" ({_fmt(r[D.comm_ms])} ms communicating)" if _num(r, D.comm_ms) else "")
        for r in rows
    )
    parallel = [r for r in rows if r.get(D.variant) != "single"]
    out = [f"Time per step: {items}."]
    if parallel:
        out.append(
            f"Fastest data-parallel variant: {min(parallel, key=lambda r: r[D.step_ms])[D.case]}."
        )
    bucketed = sorted(
        (r for r in rows if r.get(D.variant) == "bucketed" and _num(r, D.bucket_mb)),
        key=lambda r: r[D.bucket_mb],
    )
    if len(bucketed) > 1:
        out.append(
            "Bucket size vs step time: "
            + ", ".join(f"{_fmt(r[D.bucket_mb])} MB → {_fmt(r[D.step_ms])} ms" for r in bucketed)
            + "."
        )
    return out


def _zero_answers(runs: Sequence[Run]) -> list[str]:
    out = []
    for r in _ok(_rows(runs, "zero")):
        memory = [
            f"{k.removesuffix('_mib')} {_fmt(v)} MiB"
            for k, v in r.items()
            if k in (Z.param_mib, Z.grad_mib, Z.state_mib, Z.other_mib, Z.after_step_mib)
            and _num(r, k)
        ]
        versus = [
            f"{k.removesuffix('_vs_ddp')} {r[k]:.2f}×"
            for k in (Z.state_vs_ddp, Z.peak_vs_ddp, Z.time_vs_ddp)
            if _num(r, k)
        ]
        label = f"{r.get(Z.variant)}{_bucket(r)}"
        if r.get(Z.compute_dtype):
            label += f" ({r[Z.compute_dtype]})"
        text = f"{label}: {', '.join(memory)}"
        if _num(r, Z.step_ms):
            text += f"; step {_fmt(r[Z.step_ms])} ms"
        if versus and r.get(Z.variant) != "ddp":
            text += f"; relative to ddp: {', '.join(versus)}"
        out.append(text + ".")
    return out


def _profile_answers(runs: Sequence[Run]) -> list[str]:
    """§1.1.4 (a)–(e) from `bench-model --profile` runs: ranges and top kernels per cell."""
    rows = _rows(runs, "profile")
    out = []
    for cell, group in _grouped(rows, PR.cell).items():
        (cell,) = cell
        ranges = {r[PR.name]: r for r in group if r[PR.kind] == "range"}
        kernels = [r for r in group if r[PR.kind] != "range" and _num(r, PR.self_ms)]
        what = "kernel" if any(r[PR.kind] == "kernel" for r in kernels) else "operator"
        timed = [
            f"{name} {_fmt(ranges[name][PR.total_ms] / ranges[name][PR.calls])} ms per call"
            for name in ("forward", "backward", "optimizer")
            if name in ranges and ranges[name][PR.calls]
        ]
        if timed:
            out.append(f"{cell}: under the profiler, {', '.join(timed)}.")
        if kernels:
            top = kernels[0]
            matmul = sum(r[PR.share] for r in kernels if _MATMUL.search(r[PR.name]))
            out.append(
                f"{cell}: the most expensive {what} is `{top[PR.name][:80]}` "
                f"({top[PR.share]:.0%} of {what} time, {top[PR.calls]} calls); matrix "
                f"multiplications make up {matmul:.0%} of it among the top {len(kernels)}, "
                f"everything else (element-wise, softmax, norms, the optimizer) the rest."
            )
        softmax, scores, output = (
            ranges.get(f"attention: {part}") for part in ("softmax", "scores", "output")
        )
        if softmax and scores and output:
            mm = scores[PR.total_ms] + output[PR.total_ms]
            out.append(
                f"{cell}: inside naive attention, softmax takes {_fmt(softmax[PR.total_ms])} ms "
                f"against {_fmt(mm)} ms for the two matmuls (scores and output), "
                f"{softmax[PR.total_ms] / mm:.2f}× their time, though it does a small fraction "
                "of their FLOPs: it is memory-bound."
            )
    return out


def _ddp_hidden_answers(rows: Rows) -> list[str]:
    """§2.3: overlap as the wrappers report it (1 - wait/comm) beside the end-to-end figure."""
    out = []
    alone = next((r for r in rows if r.get(D.variant) == "all-reduce"), None)
    if alone is not None:
        out.append(
            f"A standalone all-reduce of all gradient bytes ({alone[D.case]}) takes "
            f"{_fmt(alone[D.step_ms])} ms."
        )
    for r in rows:
        if not _num(r, D.hidden_e2e):
            continue
        reported = (
            f"; the wrapper's own figure, 1 − wait/comm, says {r[D.hidden]:.0%}"
            if _num(r, D.hidden) is not None
            else ""
        )
        out.append(
            f"{r[D.case]}: {_fmt(r[D.overhead_ms])} ms beyond one GPU, so it hides "
            f"{r[D.hidden_e2e]:.0%} of that all-reduce end to end{reported}."
        )
    return out


# ----------------------------------------------------------------------------- sections

_MATMUL = re.compile(r"gemm|matmul|cutlass|xmma|aten::(mm|addmm|bmm|linear)\b", re.IGNORECASE)


@dataclass(frozen=True)
class Section:
    """A report section: the handout's question, the results it shows and how it answers.

    Attributes:
        key: the topic results are filed under (see `_topic`).
        title: the heading.
        handout: where the handout asks it.
        question: what the handout asks, in a sentence.
        answers: sentences computed from all the runs' rows.
    """

    key: str
    title: str
    handout: str
    question: str
    answers: Callable[[Sequence[Run]], list[str]]


def _ddp_section_answers(runs: Sequence[Run]) -> list[str]:
    rows = [r for r in _ok(_rows(runs, "ddp")) if _num(r, D.step_ms)]
    return _ddp_answers(runs) + _ddp_hidden_answers(rows)


SECTIONS: tuple[Section, ...] = (
    Section(
        "model",
        "End-to-end model timing",
        "§1.1.3 (a, b)",
        "How long do the forward and backward passes of each model size take, and how much do "
        "the timings vary?",
        _model_answers,
    ),
    Section(
        "warmup",
        "Warm-up",
        "§1.1.3 (c)",
        "What happens to the timings without warm-up steps, or with only one or two, and why?",
        _warmup_answers,
    ),
    Section(
        "profile",
        "Profiling",
        "§1.1.4 (a–e)",
        "Where does the time go: the forward pass under the profiler, the kernel that takes the "
        "most time, how much is not matrix multiplication, how a training step changes that, "
        "and softmax against the matmuls inside attention?",
        _profile_answers,
    ),
    Section(
        "precision",
        "Mixed precision",
        "§1.1.5",
        "How does accumulating in low precision lose accuracy, which dtypes does autocast "
        "produce, and what does bf16 buy in speed?",
        _precision_answers,
    ),
    Section(
        "memory",
        "Memory",
        "§1.1.6",
        "What is the peak memory of forward-only and of a full step at several context "
        "lengths, in fp32 and in bf16, and what are the largest allocations?",
        _memory_answers,
    ),
    Section(
        "attn",
        "Attention",
        "§1.2.1",
        "How do attention's forward and backward times and memory grow with sequence length "
        "and head size, where does naive attention run out of memory, and how do fa2 and SDPA "
        "compare?",
        _attention_answers,
    ),
    Section(
        "compile",
        "torch.compile",
        "§1.3.1",
        "What does torch.compile gain on attention alone and on the whole model?",
        _compile_answers,
    ),
    Section(
        "flash",
        "FlashAttention-2",
        "§1.3.2",
        "How fast is the Triton FlashAttention-2 against PyTorch attention and SDPA, forward, "
        "backward and end to end, across lengths, head sizes and dtypes?",
        _flash_answers,
    ),
    Section(
        "allreduce",
        "Communication: all-reduce",
        "§2.1",
        "How long does an all-reduce take, and what bandwidth does it reach, by backend, size "
        "and number of processes?",
        _allreduce_answers,
    ),
    Section(
        "ddp",
        "Data-parallel training",
        "§2.2–2.3",
        "How much does each data-parallel implementation cost per step, how much of the "
        "communication does overlapping hide, and which bucket size is best?",
        _ddp_section_answers,
    ),
    Section(
        "zero",
        "Optimizer-state sharding",
        "§2.4",
        "How much memory does sharding the optimizer state save, and at what cost in time?",
        _zero_answers,
    ),
)


def _topic(run: Run) -> str:
    """The section a result belongs to: its tool, or for model and attention runs the study
    their configuration shows (a memory snapshot, torch.compile)."""
    if run.tool == "model":
        if "--memory-snapshot" in (run.command or ""):
            return "memory"
        if any(r.get(M.compiled) for r in run.rows):
            return "compile"
    if run.tool == "attn" and {r.get(A.impl) for r in run.rows} <= {"naive", "compiled"}:
        return "compile"
    return run.tool


# ----------------------------------------------------------------------------- summary


def _median_of(rows: Rows, key: str) -> float | None:
    values = [r[key] for r in rows if _num(r, key)]
    return statistics.median(values) if values else None


def _headlines(runs: Sequence[Run]) -> list[str]:
    """The numbers a reader wants first, each with what it means; only those measured."""
    out = []
    attn_rows = _ok(_rows(runs, "attn"))
    fa2 = [r for r in attn_rows if r[A.impl] == "fa2-triton"]
    fwd, bwd = _median_of(fa2, A.fwd_vs_sdpa), _median_of(fa2, A.bwd_vs_sdpa)
    if fwd is not None and bwd is not None:
        out.append(
            f"Attention: the Triton FlashAttention-2 runs at {_fmt(fwd)}× SDPA's speed forward "
            f"and {_fmt(bwd)}× backward (medians over the grid; above 1 is faster than "
            "PyTorch's own fused attention)."
        )
    flash_rows = [r for r in _ok(_rows(runs, "flash")) if r[F.impl].startswith("fa2")]
    best = _best(flash_rows, F.fwd_bwd_tflops)
    if best is not None:
        out.append(
            f"FlashAttention-2 sweep: up to {_fmt(best[F.fwd_bwd_tflops])} TFLOP/s forward + "
            f"backward ({best[F.impl]}, seq {best[F.seq]}, d {best[F.d]}, {best[F.dtype]})."
        )
    model_rows = _ok(_rows(runs, "model"))
    top = _best(model_rows, M.mfu)
    if top is not None:
        out.append(
            f"Model: at best {top[M.mfu]:.0%} of the GPU's peak FLOP/s ({top[M.size]}, "
            f"{top[M.mode]}, {top[M.dtype]}); the rest goes to memory-bound kernels and launch "
            "overhead (§1.1.4)."
        )
    speedups = [
        a[M.step_ms] / b[M.step_ms]
        for a, b in _pairs(model_rows, vary=M.dtype, a="fp32", b="bf16")
        if _num(a, M.step_ms) and _num(b, M.step_ms)
    ]
    if speedups:
        out.append(f"bf16 autocast makes a model step {_span(speedups)} faster than fp32.")
    ddp_rows = [r for r in _ok(_rows(runs, "ddp")) if _num(r, D.vs_torch)]
    bucketed = [r for r in ddp_rows if r.get(D.variant) == "bucketed"]
    if bucketed:
        r = min(bucketed, key=lambda r: r[D.vs_torch])
        hidden = (
            f", hiding {r[D.hidden_e2e]:.0%} of a standalone all-reduce end to end"
            if _num(r, D.hidden_e2e) is not None
            else ""
        )
        out.append(
            f"Data parallel: the best bucketed DDP ({r[D.case]}) takes {r[D.vs_torch]:.2f}× "
            f"torch DDP's step time{hidden}."
        )
    sharded = [
        r
        for r in _ok(_rows(runs, "zero"))
        if r.get(Z.variant) == "sharded" and _num(r, Z.state_vs_ddp)
    ]
    if sharded:
        r = sharded[0]
        out.append(
            f"ZeRO-1: each rank keeps {r[Z.state_vs_ddp]:.2f}× the optimizer state of plain DDP"
            + (f" at {r[Z.time_vs_ddp]:.2f}× its step time" if _num(r, Z.time_vs_ddp) else "")
            + "."
        )
    return out


def _summary(runs: Sequence[tuple[Path, Run]], folder: Path) -> str:
    measured: dict[str, set[str]] = {}
    for _, run in runs:
        device = f"{run.env.get('device_name')} ({run.env.get('device_type')}, {run.date[:10]})"
        measured.setdefault(run.tool, set()).add(device)
    what = "; ".join(f"{tool} on {', '.join(sorted(d))}" for tool, d in measured.items())
    lines = [
        "## Summary",
        f"Built {now_iso()} from {len(runs)} result file(s) in `{folder.as_posix()}`"
        + (f": {what}." if what else ". Nothing measured yet."),
    ]
    headlines = _headlines([run for _, run in runs])
    if headlines:
        lines.append("\n".join(f"- {h}" for h in headlines))
    return "\n\n".join(lines)


# ----------------------------------------------------------------------------- files


def collect_runs(folder: str | os.PathLike[str]) -> tuple[list[tuple[Path, Run]], list[str]]:
    """Every bench result in `folder` and one level down, oldest first, and the files skipped.

    Chrome traces (`*.trace.json`) are not results and are passed over.

    Returns:
        `(runs, skipped)`: `(json path, Run)` pairs sorted by date, and `"name: reason"` for
        each JSON file that is not a bench result.

    Raises:
        FileNotFoundError: `folder` does not exist.
    """
    folder = Path(folder)
    if not folder.is_dir():
        raise FileNotFoundError(f"no results folder {folder}; write results there with --json")
    runs, skipped = [], []
    paths = sorted([*folder.glob("*.json"), *folder.glob("*/*.json")])
    for path in paths:
        if path.name.endswith(".trace.json"):
            continue
        try:
            runs.append((path, load_json(path)))
        except (ValueError, TypeError, KeyError) as exc:
            skipped.append(f"{path.relative_to(folder).as_posix()}: {exc}")
    runs.sort(key=lambda item: item[1].date)
    return runs, skipped


def _images(path: Path, run: Run, stems: set[str]) -> list[Path]:
    """The result's images: `<stem>.png` and `<stem>_*.png` beside it (not those of a result
    whose name extends this one's), then the recorded plots that still exist."""
    stem = path.stem
    longer = [s for s in stems if s != stem and s.startswith(f"{stem}_")]
    found = [
        p
        for p in sorted(path.parent.glob(f"{stem}*.png"))
        if (p.stem == stem or p.stem.startswith(f"{stem}_"))
        and not any(p.stem == s or p.stem.startswith(f"{s}_") for s in longer)
    ]
    recorded = [path.parent / plot for plot in run.plots]
    found += [p for p in recorded if p.is_file() and p not in found]
    return found


def _run_block(path: Path, run: Run, report_dir: Path, stems: set[str]) -> str:
    parts = [run.to_markdown(), f"Source: `{path.name}`."]
    for image in _images(path, run, stems):
        link = Path(os.path.relpath(image.resolve(), report_dir.resolve())).as_posix()
        parts.append(f"![{image.stem}]({link})")
    return "\n\n".join(parts)


_LINK = re.compile(r"!?\[[^\]]*\]\(([^)\s]+)\)")


def report_links(text: str) -> list[str]:
    """Every link and image target in Markdown `text`, in order (web addresses included)."""
    return _LINK.findall(text)


def build_report(
    folder: str | os.PathLike[str] = "docs/results",
    *,
    output: str | os.PathLike[str] | None = None,
    title: str = "Benchmark report",
) -> str:
    """The report of every result in `folder`, as Markdown (written to `output` when given).

    Args:
        folder: where the `--json` results are.
        output: the Markdown file to write; image links are made relative to its folder (to
            `folder` when None).
        title: the report's top heading.

    Raises:
        FileNotFoundError: `folder` does not exist.
    """
    folder = Path(folder)
    runs, skipped = collect_runs(folder)
    report_dir = Path(output).parent if output is not None else folder
    all_runs = [run for _, run in runs]
    stems = {p.stem for p, _ in runs}
    lines = [f"# {title}", _summary(runs, folder)]
    for number, section in enumerate(SECTIONS, start=1):
        lines.append(f"## {number}. {section.title} ({section.handout})")
        lines.append(f"*Question.* {section.question}")
        try:
            answers = section.answers(all_runs)
        except (KeyError, AttributeError) as exc:  # a result written by an older tool version
            answers = [f"(No answer: a result file lacks {exc}; re-run its tool.)"]
        blocks = [_run_block(p, r, report_dir, stems) for p, r in runs if _topic(r) == section.key]
        if answers:
            lines.append("*Answer.* " + " ".join(a for a in answers if "\n" not in a))
            lines.extend(a for a in answers if "\n" in a)  # answers that carry a table
        if not blocks and not answers:
            lines.append(NOT_MEASURED)
        lines.extend(blocks)
    known = {s.key for s in SECTIONS}
    others = [(p, r) for p, r in runs if _topic(r) not in known]
    if others:
        lines.append("## Other results")
        lines.extend(_run_block(p, r, report_dir, stems) for p, r in others)
    if skipped:
        lines.append("Skipped files: " + "; ".join(skipped))
    text = "\n\n".join(lines) + "\n"
    if output is not None:
        Path(output).parent.mkdir(parents=True, exist_ok=True)
        Path(output).write_text(text)
    return text


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of `bench-report` (see the module docstring)."""
    parser = argparse.ArgumentParser(
        prog="bench-report",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("folder", nargs="?", default="docs/results", help="results folder")
    parser.add_argument("-o", "--output", type=Path, help="write the report here (else print)")
    parser.add_argument("--title", default="Benchmark report", help="top heading")
    args = parser.parse_args(argv)
    try:
        text = build_report(args.folder, output=args.output, title=args.title)
    except FileNotFoundError as exc:
        parser.error(str(exc))
    if args.output is None:
        print(text, end="")
    else:
        print(f"wrote {args.output}")
    return 0
