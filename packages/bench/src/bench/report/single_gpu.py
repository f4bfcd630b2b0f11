"""§2 and §3 of the 2026 handout: benchmarking, profiling, mixed precision, memory, checkpointing.

Each `answer_*` function reads the results and returns the blocks of one problem's answer; every
paragraph that quotes a number ends with the files (and revisions) the number came from.
"""

from __future__ import annotations

import re
from typing import Any

from bench.report.claims import SAME, STABLE, ratio_word, relation, speed, spread_word
from bench.report.document import Block, Paragraph, Table
from bench.report.results import (
    SOURCE,
    Record,
    Results,
    Rows,
    fmt,
    grouped,
    num,
    ok,
    pairs,
    size_label,
    span,
)
from bench.report.runs import PROFILES
from bench.tools import model, precision
from bench.tools.model.profile import PROFILE_KEYS as profile_keys

__all__ = [
    "answer_accumulation",
    "answer_benchmarking",
    "answer_mixed_precision",
    "answer_profile",
    "answer_warmup",
    "is_memory",
    "is_model_study",
    "is_profile",
]

model_keys, precision_keys = model.KEYS, precision.KEYS
MIB = 2**20
SAME_TEXT = f"{SAME:.0%}"
# The profiler's forward time "matches" the plain timing within this share: the profiler adds
# a cost of its own to every launch, so the bar is wider than `claims.SAME`.
_PROFILER_MATCH = 0.10


def said(res: Results, text: str, rows: Rows) -> Paragraph:
    """A paragraph of prose followed by the sources of its numbers."""
    return Paragraph(f"{text} {res.cite(rows)}".strip())


def _model_study(record: Record) -> str | None:
    """What a bench-model run was for (its rows' `study`), None for another tool's."""
    run = record.run
    return run.rows[0].get(model_keys.study) if run.tool == "model" and run.rows else None


def is_memory(record: Record) -> bool:
    """A model run that recorded allocator snapshots, or a residuals study."""
    return _model_study(record) == "memory" or record.run.tool == "residuals"


def is_profile(record: Record) -> bool:
    """A profile run, or the timing of the steps it profiled."""
    return record.run.tool == "profile" or _model_study(record) == "profile"


def is_model_study(record: Record) -> bool:
    """A plain bench-model timing run (not memory, profile or torch.compile)."""
    run = record.run
    return (
        run.tool == "model"
        and not is_memory(record)
        and not is_profile(record)
        and not any(r.get(model_keys.compiled) for r in run.rows)
    )


def _study_rows(res: Results) -> Rows:
    return [r for r in res.rows("model") if is_model_study(res.record_of(r))]


# ---------------------------------------------------------------- §2.1.3 benchmarking_script


def answer_benchmarking(res: Results) -> list[Block]:
    """(a) the script; (b) forward and backward times per size, and their spread."""
    out: list[Block] = [
        Paragraph(
            "(a) `bench-model` (`packages/bench/src/bench/tools/model.py`) builds a "
            "`TransformerLM` of a named size or explicit dimensions with random weights, draws "
            "a random batch, runs `--warmup` untimed steps and times `--steps` steps of "
            "`--mode forward`, `forward-backward` or `train-step` (AdamW), synchronising the "
            "device around each timed region; e.g. `bench-model --size small medium large xl "
            "10B --context-length 512 --warmup 5 --steps 10`."
        )
    ]
    rows = [r for r in ok(_study_rows(res)) if r.get(model_keys.dtype) == "fp32"]
    if not rows:
        return out
    ctx = max((r[model_keys.ctx] for r in rows), key=lambda c: (c == 512, c))
    rows = [r for r in rows if r[model_keys.ctx] == ctx]
    table = []
    for (label,), group in grouped([dict(r, label=size_label(r)) for r in rows], "label").items():
        by_mode = {r[model_keys.mode]: r for r in group}
        full = by_mode.get("train-step") or by_mode.get("forward-backward") or {}
        fwd = by_mode.get("forward", full)
        table.append(
            {
                "size": label,
                "forward_ms": fwd.get(model_keys.fwd_ms),
                "forward_std": fwd.get(model_keys.fwd_std),
                "backward_ms": full.get(model_keys.bwd_ms),
                "backward_std": full.get(model_keys.bwd_std),
                "optimizer_ms": full.get(model_keys.opt_ms),
            }
        )
    spread = [
        r[model_keys.step_std] / r[model_keys.step_ms]
        for r in rows
        if num(r, model_keys.step_ms) and num(r, model_keys.step_std) is not None
    ]
    ratio = [
        r[model_keys.bwd_ms] / r[model_keys.fwd_ms]
        for r in rows
        if num(r, model_keys.bwd_ms) and num(r, model_keys.fwd_ms)
    ]
    biggest = max(table, key=lambda t: t["forward_ms"] or 0)
    text = (
        f"(b) At context {ctx}, fp32, batch {rows[0].get(model_keys.batch, 4)}: a forward pass "
        "takes "
        f"from {fmt(min(t['forward_ms'] for t in table if t['forward_ms']))} ms to "
        f"{fmt(biggest['forward_ms'])} ms ({biggest['size']}); backward takes "
        + (f"{span(ratio)} the forward's time" if ratio else "(not measured)")
        + (f". {_spread_sentence(spread)}" if spread else ".")
    )
    out += [said(res, text, rows), Table(table, list(table[0]), caption="ms, mean and std")]
    if ctx != 512 or not any(r.get(model_keys.d_model) == 4608 for r in rows):
        out.append(
            Paragraph(
                "The 2026 handout asks for context 512 and its five sizes (10B included): "
                "`handout_gpu.sh part1` runs them; until then the table shows the committed "
                "runs."
            )
        )
    return out


def _spread_sentence(spread: list[float]) -> str:
    """Whether the timings vary: the largest standard deviation as a share of the mean step,
    judged against `claims.STABLE`."""
    largest = max(spread)
    verdict = (
        "so the timings are stable"
        if spread_word(largest) == "small"
        else f"above the {STABLE:.0%} a stable timing shows, so some configurations vary "
        "from step to step (clocks, other work on the machine) and need more steps"
    )
    return (
        f"The standard deviation is at most {largest:.1%} of the mean step after warm-up, "
        f"{verdict}."
    )


def answer_warmup(res: Results) -> list[Block]:
    """(c) no, one, two and five warm-up steps: what the cold mean pays, and where one or two
    warm-up steps land against the fully warm mean (each clause chosen by `claims`)."""
    rows = ok(res.rows("warmup"))
    out: list[Block] = []
    studies = []
    for (_, _, ctx, mode, dtype), group in grouped(
        rows, SOURCE, model_keys.size, model_keys.ctx, model_keys.mode, model_keys.dtype
    ).items():
        group.sort(key=lambda r: r[model_keys.warmup])
        parts = "; ".join(
            f"{r[model_keys.warmup]} warm-up: {fmt(r[model_keys.step_ms])} ± "
            f"{fmt(r[model_keys.step_std])} ms "
            f"(first step {fmt(r[model_keys.first_step_ms])} ms)"
            for r in group
        )
        env = res.record_of(group[0]).run.env
        text = (
            f"(c) {size_label(group[0])} context {ctx} {mode} {dtype} on one "
            f"{env.get('device_name')}: {parts}. "
        )
        cuda = env.get("device_type") == "cuda"
        out.append(said(res, text + _warmup_reading(group, cuda=cuda), group))
        studies.append(group)
    if len(studies) > 1:
        out += _warmup_together(res, studies)
    return out


def _warmup_together(res: Results, studies: list[Rows]) -> list[Block]:
    """Several warm-up studies read together: the cold mean against the warm one in each, and
    where the one- and two-step warm-ups land (words from `claims`), so that two runs which
    disagree say so instead of each reading as the rule."""
    cold_ratios, landed = [], {}
    for group in studies:
        cold, warm = group[0], group[-1]
        if cold[model_keys.warmup] != 0 or cold is warm:
            continue
        w_ms = warm[model_keys.step_ms]
        cold_ratios.append(cold[model_keys.step_ms] / w_ms)
        env = res.record_of(cold).run.env
        for r in group[1:-1]:
            if r[model_keys.warmup] in (1, 2):
                where = relation(r[model_keys.step_ms], w_ms)
                landed.setdefault(where, []).append(
                    f"{r[model_keys.warmup]} warm-up step{'s' if r[model_keys.warmup] > 1 else ''} "
                    f"on the {env.get('device_name')} at context "
                    f"{r[model_keys.ctx]}"
                )
    if not cold_ratios or not landed:
        return []
    total = sum(len(v) for v in landed.values())
    words = {"above": "above", "level with": f"within {SAME_TEXT} of", "below": "below"}
    clauses = [
        f"{words[where]} it in {len(cases)} of {total} ({'; '.join(cases)})"
        for where, cases in landed.items()
    ]
    text = (
        f"Read together, the {len(cold_ratios)} studies: without warm-up the mean is "
        f"{fmt(min(cold_ratios))}–{fmt(max(cold_ratios))}× the fully warm one; one or two "
        "warm-up steps land " + ", ".join(clauses) + "."
    )
    if "below" in landed:
        text += (
            " A mean below the fully warm one is no cost that warm-up removes: each count runs "
            "in its own process, whose speed varies a little from the next one's."
        )
    rows = [r for group in studies for r in group]
    return [said(res, text, rows)]


def _warmup_reading(group: Rows, *, cuda: bool) -> str:
    """What the rows of one warm-up study say (sorted by warm-up count): the cold mean against
    the warmest, then each short warm-up against the warmest, with the reason that fits."""
    cold, warm = group[0], group[-1]
    w_ms, w_label = warm[model_keys.step_ms], warm[model_keys.warmup]
    if cold[model_keys.warmup] != 0 or cold is warm:
        return ""
    ratio = cold[model_keys.step_ms] / w_ms
    if relation(cold[model_keys.step_ms], w_ms) == "above":
        costs = (
            "CUDA context and cuBLAS handle creation, kernel loading and the caching "
            "allocator's growth"
            if cuda
            else "lazy initialisation, the allocator's first requests and the kernels' first "
            "dispatch"
        )
        text = (
            f"Without warm-up the mean is {ratio:.2f}× the {w_label}-warm-up mean, because the "
            f"first steps pay for {costs} (the first timed step alone takes "
            f"{fmt(cold[model_keys.first_step_ms])} ms)."
        )
    else:
        text = (
            f"Without warm-up the mean is {ratio:.2f}× the {w_label}-warm-up mean: no one-time "
            "cost shows in these steps."
        )
    short = [r for r in group[1:-1] if r[model_keys.warmup] in (1, 2)]
    by_side: dict[str, list[dict[str, Any]]] = {}
    for r in short:
        by_side.setdefault(relation(r[model_keys.step_ms], w_ms), []).append(r)
    reasons = {
        "above": "still above it: allocator and autotuning decisions (cuBLAS heuristics, "
        "cudnn) settle over the next steps",
        "level with": f"within {SAME_TEXT} of it: one or two steps already pay the one-time costs",
        "below": "below it: each count runs in a fresh process, and process-to-process "
        "variation (clocks, memory placement) outweighs what longer warm-up still saves",
    }
    clauses = [
        f"{' and '.join(str(r[model_keys.warmup]) for r in side)} warm-up "
        f"({', '.join(fmt(r[model_keys.step_ms]) + ' ms' for r in side)}) "
        f"{'is' if len(side) == 1 else 'are'} {reasons[where]}"
        for where, side in by_side.items()
    ]
    if clauses:
        text += f" Against the {w_label}-warm-up mean ({fmt(w_ms)} ms): " + "; ".join(clauses) + "."
    return text


# ---------------------------------------------------------------- §2.1.4 nsys_profile


# What a CUDA kernel's templated name says it computes, most specific first: the ATen kernel it
# wraps (`masked_fill_kernel(...)`), a binary functor's operation (`MulFunctor`, `CUDAFunctor_add`),
# a reduction's (`MeanOps`, `sum_functor`), a foreach operation's (`std::multiplies`), any other
# functor (`CompareFunctor`, `LerpFunctor`).
_KERNEL_OP = (
    re.compile(r"(\w+?)_kernel(?:_cuda|_impl)?(?:<[^>]*>)?\("),
    re.compile(r"binary_internal::(\w+)Functor"),
    re.compile(r"CUDAFunctor_(\w+)"),
    re.compile(r"(\w+)(?:Ops|_functor)<"),
    re.compile(r"std::(multiplies|plus|divides|minus)\b"),
    re.compile(r"::(?!Binary|Unary|AUnary|Ternary|Pointwise)(\w+?)Functor<"),
    re.compile(r"::(Sqrt|Exp|Log)<"),
)
# Kernel names in prose are cut after this many characters: cuBLAS's run to about 120 and say
# what they are (tile, layout) all along.
_KERNEL_CHARS = 130


def kernel_label(name: str) -> str:
    """A CUDA kernel's name as prose quotes it: its own name without namespaces or template
    arguments, then what its arguments say it computes (`elementwise_kernel (masked_fill)`,
    `vectorized_elementwise_kernel (Mul)`); a name without arguments (cuBLAS's) as it is, cut
    to `_KERNEL_CHARS`, as a CPU operator's (`aten::mm`)."""
    name = name.removeprefix("void ").replace("(anonymous namespace)::", "")
    cut = min((i for i in (name.find("<"), name.find("(")) if i > 0), default=len(name))
    if cut == len(name):  # no arguments: a cuBLAS kernel, or a CPU operator (`aten::mm`)
        return name if len(name) <= _KERNEL_CHARS else name[: _KERNEL_CHARS - 1] + "…"
    base, rest = re.sub(r"^.*::", "", name[:cut]).strip(), name[cut:]
    plain = re.match(r"<(\w+)>", rest)  # a generic kernel named by its one argument (CUTLASS's)
    if plain:
        return f"{base}<{plain[1]}>"
    op = next((found[1] for pattern in _KERNEL_OP if (found := pattern.search(rest))), None)
    label = f"{base} ({op})" if op and op != base else base
    return label if len(label) <= _KERNEL_CHARS else label[: _KERNEL_CHARS - 1] + "…"


def _top(rows: Rows, phase: str) -> dict[str, Any] | None:
    kernels = [
        r
        for r in rows
        if r[profile_keys.kind] in ("kernel", "operator") and r[profile_keys.phase] == phase
    ]
    return max(kernels, key=lambda r: r[profile_keys.total_ms]) if kernels else None


def _share(rows: Rows, phase: str, category: str) -> float | None:
    found = [
        r[profile_keys.share]
        for r in rows
        if r[profile_keys.kind] == "category"
        and r[profile_keys.phase] == phase
        and r[profile_keys.name] == category
    ]
    return found[0] if found else 0.0 if any(r[profile_keys.phase] == phase for r in rows) else None


# What stands in for Nsight Systems, said before the answers it gives.
_NO_NSYS = (
    "Nsight Systems (`nsys`) was not installed on the GPU machines these runs used, so "
    "torch.profiler stands in for it: its kernel tables (every CUDA kernel with its calls "
    "and time, per phase of one profiled training step) and its Chrome trace of that step take "
    "the place of nsys's CUDA kernel summary and timeline, and the `record_function` ranges "
    "(forward, backward, optimizer, the attention stages) the place of its NVTX ranges. "
    "`bench-model --nvtx` marks the same ranges for `nsys profile` where it is installed."
)


def _per_call(calls: float) -> str:
    """Calls per forward as prose gives them: whole, or to one decimal where the profiled
    forwards launched a kernel a different number of times (`about 129.7`)."""
    return f"{calls:.0f}" if calls == round(calls) else f"about {calls:.1f}"


def _profile_cells(rows: Rows) -> dict[str, Rows]:
    """Each profiled cell's rows, from the newest file that profiled it (two runs' kernels are
    never mixed); a forward-only cell is left out where a training step of the same shape was
    profiled, whose forward phase answers the same questions."""
    newest: dict[str, int] = {}
    for r in rows:  # rows come oldest file first
        newest[r[profile_keys.cell]] = r[SOURCE]
    cells: dict[str, Rows] = {}
    for r in rows:
        if r[SOURCE] == newest[r[profile_keys.cell]]:
            cells.setdefault(r[profile_keys.cell], []).append(r)
    return {
        cell: group
        for cell, group in cells.items()
        if "_forward_" not in cell or cell.replace("_forward_", "_train-step_") not in cells
    }


def answer_profile(res: Results) -> list[Block]:
    """(a)–(e) from `bench-model --profile` runs (kernels per phase, ranges apart)."""
    rows = [r for r in res.rows("profile") if profile_keys.phase in r]
    out: list[Block] = []
    if any(profile_keys.phase not in r for r in res.rows("profile")):
        out.append(
            Paragraph(
                "Profiles written before the kernel tables ranked kernels only (their tables "
                "put `record_function` ranges beside kernels) are listed below without their "
                "tables and are not quoted."
            )
        )
    if not rows:
        runs = "; ".join(run.sentence() for run in PROFILES)
        out.append(
            Paragraph(
                "Not run: profiles of two sizes at three contexts above 128 with kernel-only "
                f"tables (ranges reported apart) have not been made. {runs}: one profiled "
                "training step per cell, whose forward, backward and optimizer phases answer "
                "(a) to (e). It writes a kernel table per phase, the softmax-against-matmul "
                "comparison inside "
                "attention and the Chrome traces; `bench-model --nvtx` under `nsys profile` "
                "marks the same ranges for Nsight Systems."
            )
        )
    if rows:
        out.append(Paragraph(_NO_NSYS))
    timing = {
        (r[model_keys.size], r[model_keys.ctx], r[model_keys.mode], r[model_keys.dtype]): r
        for r in ok(res.rows("model"))
        if is_profile(res.record_of(r))
    }
    cells = _profile_cells(rows)
    for cell, group in cells.items():
        ranges = {r[profile_keys.name]: r for r in group if r[profile_keys.kind] == "range"}
        what = "kernel" if any(r[profile_keys.kind] == "kernel" for r in group) else "operator"
        sentences = []
        fwd = ranges.get("forward")
        if fwd and fwd[profile_keys.calls]:
            per = fwd[profile_keys.total_ms] / fwd[profile_keys.calls]
            key = _cell_key(cell)
            timed = timing.get(key) if key else None
            sentences.append(f"(a) the forward pass takes {fmt(per)} ms under the profiler")
            plain = timed and (num(timed, model_keys.plain_fwd_ms) or num(timed, model_keys.fwd_ms))
            if plain:
                where = relation(per, plain, tolerance=_PROFILER_MATCH)
                how = (
                    "one more step timed with the standard library without the profiler"
                    if num(timed, model_keys.plain_fwd_ms)
                    else "the same profiled steps timed with the standard library"
                )
                sentences[-1] += f", against {fmt(plain)} ms for {how}: " + (
                    f"they match within {_PROFILER_MATCH:.0%}"
                    if where == "level with"
                    else f"{per / plain:.2f}× it, the profiler's own overhead"
                    if where == "above"
                    else f"{per / plain:.2f}× it, under the plain timing"
                )
        top_f, top_all = _top(group, "forward"), _top(group, "all")
        if top_f and fwd:
            calls = top_f[profile_keys.calls] / max(fwd[profile_keys.calls], 1)
            sentences.append(
                f"(b) the {what} with the most forward time is "
                f"`{kernel_label(top_f[profile_keys.name])}` "
                f"({top_f[profile_keys.share]:.0%} of the forward, "
                f"{_per_call(calls)} calls per forward)"
                + (
                    "; over the whole step it is "
                    + (
                        "the same"
                        if top_all[profile_keys.name] == top_f[profile_keys.name]
                        else f"`{kernel_label(top_all[profile_keys.name])}`"
                    )
                    if top_all and "backward" in ranges
                    else ""
                )
            )
        shares = {
            c: _share(group, "forward", c) for c in ("matmul", "softmax", "elementwise", "other")
        }
        if shares["matmul"] is not None:
            sentences.append(
                f"(c) in the forward, matmuls take {shares['matmul']:.0%} of {what} time, "
                f"elementwise and other memory-bound kernels {shares['elementwise']:.0%}, "
                f"softmax {shares['softmax']:.0%}, the rest {shares['other']:.0%}"
                + _largest_others(group)
            )
        if "optimizer" in ranges:
            mm, opt = _share(group, "all", "matmul"), _share(group, "all", "optimizer")
            sentences.append(
                f"(d) over a training step matmuls take {mm:.0%} and the optimizer {opt:.0%}"
                + (
                    f"; against the forward alone the matmuls' share "
                    f"{_share_move(shares['matmul'], mm)} ({shares['matmul']:.0%} to {mm:.0%}), "
                    f"the other kernels' {_share_move(1 - shares['matmul'], 1 - mm)} "
                    f"({1 - shares['matmul']:.0%} to {1 - mm:.0%}, the optimizer's included)"
                    if shares["matmul"] is not None
                    else ""
                )
            )
        soft, scores, output = (
            ranges.get(f"attention: {p}") for p in ("softmax", "scores", "output")
        )
        if (
            soft
            and scores
            and output
            and soft[profile_keys.kernel_ms]
            and soft.get(profile_keys.flops)
        ):
            mm = scores[profile_keys.kernel_ms] + output[profile_keys.kernel_ms]
            mm_flops = scores[profile_keys.flops] + output[profile_keys.flops]
            time_ratio = soft[profile_keys.kernel_ms] / mm
            flop_ratio = soft[profile_keys.flops] / mm_flops
            per_flop = time_ratio / flop_ratio
            sentences.append(
                f"(e) inside attention softmax takes {fmt(soft[profile_keys.kernel_ms])} ms "
                f"against {fmt(mm)} ms for the two matmuls ({time_ratio:.2f}× their time) while "
                f"doing {flop_ratio:.3f}× their FLOPs, so a softmax FLOP costs "
                f"{fmt(per_flop)}× a matmul FLOP"
                + ratio_word(
                    per_flop,
                    more=": softmax is memory-bound, the matmuls compute-bound",
                    less=": here softmax is not the slower per FLOP",
                    same=": here both run at the same rate per FLOP",
                )
            )
        if sentences:
            out.append(said(res, f"`{cell}`: " + "; ".join(sentences) + ".", group))
    return out


# Non-matmul kernels (c) names, the largest by their share of the forward's kernel time.
_NAMED_OTHERS = 3


def _largest_others(rows: Rows) -> str:
    """(c)'s "which other kernels": the largest non-matmul kernels of the forward by share, the
    kernels of one `kernel_label` counted together; "" without kernel rows."""
    shares: dict[str, float] = {}
    for r in rows:
        if (
            r[profile_keys.kind] == "kernel"
            and r[profile_keys.phase] == "forward"
            and r.get(profile_keys.category) != "matmul"
        ):
            label = kernel_label(r[profile_keys.name])
            shares[label] = shares.get(label, 0.0) + r[profile_keys.share]
    top = sorted(shares.items(), key=lambda kv: -kv[1])[:_NAMED_OTHERS]
    if not top:
        return ""
    return "; the largest other kernels are " + ", ".join(
        f"`{label}` ({share:.1%})" for label, share in top
    )


def _share_move(before: float, after: float) -> str:
    """`rises`, `falls` or `stays level`: a share of kernel time, by 5 percentage points."""
    if after - before > SAME:
        return "rises"
    return "falls" if before - after > SAME else "stays level"


def _cell_key(cell: str) -> tuple[str, int, str, str] | None:
    """`(size, ctx, mode, dtype)` of a profile cell label `size_ctxN_mode_dtype_attention`."""
    match = re.match(r"(.+)_ctx(\d+)_(forward|forward-backward|train-step)_(\w+?)_", cell)
    return (match[1], int(match[2]), match[3], match[4]) if match else None


# ---------------------------------------------------------------- §2.1.5 mixed precision


def answer_accumulation(res: Results) -> list[Block]:
    rows = [r for r in res.rows("precision") if r.get(precision_keys.part) == "accumulation"]
    if not rows:
        return []
    acc = {r[precision_keys.case]: r for r in rows}
    text = "Summing 0.01 a thousand times: " + "; ".join(
        f"{c}: {r[precision_keys.printed]} (error {r[precision_keys.abs_error]:.2g})"
        for c, r in acc.items()
    )
    fp16, fp32 = acc.get("fp16 += fp16"), acc.get("fp32 += fp32")
    if fp16 and fp32 and fp32[precision_keys.abs_error]:
        ratio = fp16[precision_keys.abs_error] / fp32[precision_keys.abs_error]
        text += ratio_word(
            ratio,
            more=f". An fp16 accumulator ends {ratio:,.0f}× further off than an fp32 one: once "
            "the sum is large, 0.01 is below half an fp16 step and additions round away; "
            "accumulating fp16 values in fp32 keeps only the error of rounding 0.01 to fp16 "
            "once, so accumulate in fp32",
            less=f". Here an fp16 accumulator ends {ratio:.2g}× as far off as an fp32 one, "
            "closer: these rows do not show fp16's rounding, so they cannot argue for fp32 "
            "accumulators",
            same=". Here fp16 and fp32 accumulators end equally far off: these rows do not "
            "show fp16's rounding",
        )
    return [said(res, text + ".", rows)]


def answer_mixed_precision(res: Results) -> list[Block]:
    out: list[Block] = []
    rows = [r for r in res.rows("precision") if r.get(precision_keys.part) == "autocast"]
    for (label,), group in grouped(rows, precision_keys.autocast).items():
        seen = ", ".join(f"{r[precision_keys.tensor]}: {r[precision_keys.dtype]}" for r in group)
        out.append(said(res, f"(a) ToyModel under autocast ({label}): {seen}.", group))
    out.append(
        Paragraph(
            "(b) Layer normalisation reduces: its mean and variance sum many squares, which "
            "overflow fp16's range (65,504) or lose the small terms to rounding, and the "
            "division by the standard deviation amplifies that error; autocast therefore runs "
            "it in fp32. bf16 has fp32's exponent range, so overflow is no longer the risk, but "
            "its 8-bit mantissa makes sums coarser still, so the reduction is still best kept "
            "in fp32 (as lmcore's RMSNorm does), though less critically than in fp16."
        )
    )
    model_rows = ok(_study_rows(res))
    found = pairs(
        model_rows,
        vary=model_keys.dtype,
        a="fp32",
        b="bf16-autocast",
        match=(model_keys.size, model_keys.ctx, model_keys.mode, model_keys.d_model),
    )
    found = [(a, b) for a, b in found if num(a, model_keys.step_ms) and num(b, model_keys.step_ms)]
    if found:
        table = [
            {
                "size": size_label(a),
                "ctx": a[model_keys.ctx],
                "mode": a[model_keys.mode],
                "fp32_ms": a[model_keys.step_ms],
                "bf16_ms": b[model_keys.step_ms],
                "speedup": a[model_keys.step_ms] / b[model_keys.step_ms],
            }
            for a, b in found
        ]
        small = min(table, key=lambda t: t["fp32_ms"])
        large = max(table, key=lambda t: t["fp32_ms"])
        trend = ratio_word(
            large["speedup"] / small["speedup"],
            more="the gain grows with size: small models are bound by launch overhead and "
            "memory-bound kernels that bf16 does not speed up (and autocast adds casts), large "
            "ones by matmuls, which bf16 tensor cores run many times faster",
            less="the gain shrinks with size here",
            same="the gain does not change with size here",
        )
        speedups = [t["speedup"] for t in table]
        text = (
            f"(c) bf16 autocast runs a step at {span(speedups)} fp32's speed "
            f"({speed(speedups)}), "
            f"{small['speedup']:.2f}× for the fastest configuration ({small['size']} "
            f"{small['mode']}) and {large['speedup']:.2f}× for the slowest ({large['size']} "
            f"{large['mode']}): {trend}."
        )
        out += [said(res, text, [r for pair in found for r in pair]), Table(table, list(table[0]))]
    return out
