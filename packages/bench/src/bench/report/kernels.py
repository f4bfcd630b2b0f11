"""§4 of the 2026 handout: attention benchmarks, torch.compile, FlashAttention-2."""

from __future__ import annotations

import statistics

from bench.report.claims import SAME, growth, growth_exponent, ratio_word, speed
from bench.report.document import Block, Paragraph, Table
from bench.report.results import (
    OOM,
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
from bench.report.runs import COMPILE_MODEL, FLASH_NAIVE
from bench.report.single_gpu import said
from bench.tools import attn, flash, model

__all__ = [
    "answer_attention",
    "answer_compile",
    "answer_flash_benchmarking",
    "answer_flash_tests",
    "is_compile",
]

attn_keys, flash_keys, model_keys = attn.KEYS, flash.KEYS, model.KEYS


def is_compile(record: Record) -> bool:
    """A torch.compile comparison: attention naive vs compiled only, or a compiled model run."""
    run = record.run
    if run.tool == "attn":
        return {r.get(attn_keys.impl) for r in run.rows} <= {"naive", "compiled"}
    return run.tool == "model" and any(r.get(model_keys.compiled) for r in run.rows)


def answer_attention(res: Results) -> list[Block]:
    """pytorch_attention: the grid, where it runs out of memory, the memory accounting."""
    rows = _newest_per_cell([r for r in res.rows("attn") if r[attn_keys.impl] == "naive"])
    if not rows:
        return []
    out: list[Block] = []
    cells = {(r[attn_keys.d], r[attn_keys.seq]) for r in rows}
    table = [
        {
            "d": r[attn_keys.d],
            "seq": r[attn_keys.seq],
            "fwd_ms": r.get(attn_keys.fwd_ms),
            "bwd_ms": r.get(attn_keys.bwd_ms),
            "mem_before_bwd_mib": r.get(attn_keys.mem_before_bwd_mib),
            "status": r[attn_keys.status],
        }
        for r in sorted(rows, key=lambda r: (r[attn_keys.d], r[attn_keys.seq]))
    ]
    out.append(
        said(
            res,
            f"Naive (PyTorch) attention, batch 8, one head, {len(cells)} of the handout's 20 "
            "(d, seq) cells measured; forward and backward ms per call and the memory in use "
            "before the backward:",
            rows,
        )
    )
    out.append(Table(table, list(table[0])))
    ooms = sorted(
        (r for r in rows if r[attn_keys.status] == OOM),
        key=lambda r: (r[attn_keys.seq], r[attn_keys.d]),
    )
    fits = [r for r in ok(rows) if num(r, attn_keys.mem_before_bwd_mib)]
    if ooms:
        first = ooms[0]
        b, s, d = first.get(attn_keys.batch, 8), first[attn_keys.seq], first[attn_keys.d]
        itemsize = 4 if first.get(attn_keys.dtype, "fp32") == "fp32" else 2
        scores = b * s * s * itemsize / 2**20
        text = (
            f"Out of memory from seq {s} (d={d}). Accounting for that cell: q, k, v and the "
            f"output are 4·{b}·{s}·{d}·{itemsize} bytes = {fmt(4 * b * s * d * itemsize / 2**20)} "
            f"MiB, but every seq × seq matrix is {b}·{s}²·{itemsize} bytes = {fmt(scores)} MiB, "
            "and the backward needs the softmax output saved (plus the scores, the mask and "
            f"the masked scores as the forward computes them): several of those, "
            f"{fmt(4 * scores / 1024)} GiB for four, beyond what the GPU holds with the "
            "backward's own seq × seq gradients."
        )
        out.append(said(res, text, [first]))
    elif fits:
        big = max(fits, key=lambda r: (r[attn_keys.seq], r[attn_keys.d]))
        b, s, d = big.get(attn_keys.batch, 8), big[attn_keys.seq], big[attn_keys.d]
        itemsize = 4 if big.get(attn_keys.dtype, "fp32") == "fp32" else 2
        scores = b * s * s * itemsize / 2**20
        device = res.record_of(big).run.env.get("device_name")
        text = (
            f"No cell ran out of memory on the {device}. Accounting for the largest, seq {s} "
            f"and d = {d}: q, k, v and the output are 4·{b}·{s}·{d}·{itemsize} bytes = "
            f"{fmt(4 * b * s * d * itemsize / 2**20)} MiB, but one seq × seq matrix is "
            f"{b}·{s}²·{itemsize} bytes = {fmt(scores)} MiB; the forward keeps the softmax "
            f"for backward, and {fmt(big[attn_keys.mem_before_bwd_mib])} MiB are in use before the "
            f"backward, about {big[attn_keys.mem_before_bwd_mib] / scores:.2f} such matrices. A "
            "GPU "
            "with less memory, a longer sequence or a larger batch runs out first."
        )
        out.append(said(res, text, [big]))
    if len(fits) >= 2:
        z = max(fits, key=lambda r: (r[attn_keys.seq], r[attn_keys.d]))
        same_d = sorted(
            (r for r in fits if r[attn_keys.d] == z[attn_keys.d]), key=lambda r: r[attn_keys.seq]
        )
        a = same_d[0]
        y = same_d[-2] if len(same_d) >= 2 else a
        mem = attn_keys.mem_before_bwd_mib
        growth_all = z[mem] / a[mem]
        text = (
            f"The memory in use before the backward goes from {fmt(a[mem])} MiB at seq "
            f"{a[attn_keys.seq]} to {fmt(z[mem])} MiB at seq {z[attn_keys.seq]} "
            f"({growth_all:,.0f}× for {z[attn_keys.seq] / a[attn_keys.seq]:g}× the length)"
        )
        if y[attn_keys.seq] != z[attn_keys.seq]:
            p = growth_exponent(y[attn_keys.seq], y[mem], z[attn_keys.seq], z[mem])
            text += (
                f"; between the two longest sequences ({y[attn_keys.seq]} and "
                f"{z[attn_keys.seq]}) it grows {growth(p)} (exponent {p:.2f})"
                + (
                    ", as the seq × seq matrices come to dominate it"
                    if growth(p) == "with its square"
                    else ""
                )
            )
        text += (
            ". FlashAttention removes the quadratic part: it never materialises the seq × seq "
            "matrices, saves only the output and the logsumexp (linear in seq) and recomputes "
            "the scores tile by tile in the backward."
        )
        out.append(said(res, text, [a, y, z]))
        fa2 = next(
            (
                r
                for r in _newest_per_cell(ok(res.rows("attn")))
                if r[attn_keys.impl] == "fa2-triton"
                and (r[attn_keys.d], r[attn_keys.seq], r.get(attn_keys.batch))
                == (z[attn_keys.d], z[attn_keys.seq], z.get(attn_keys.batch))
                and num(r, attn_keys.mem_before_bwd_mib)
            ),
            None,
        )
        if fa2 is not None:
            out.append(
                said(
                    res,
                    f"Measured: fa2-triton at the same cell (seq {z[attn_keys.seq]}, d = "
                    f"{z[attn_keys.d]}) has "
                    f"{fmt(fa2[attn_keys.mem_before_bwd_mib])} MiB in use before the backward "
                    "against "
                    f"the naive attention's {fmt(z[attn_keys.mem_before_bwd_mib])} MiB.",
                    [fa2, z],
                )
            )
    return out


def _newest_per_cell(rows: Rows) -> Rows:
    """One row per (implementation, batch, d, seq, dtype): the newest result's (rows come
    oldest result first)."""
    cells = {
        (
            r[attn_keys.impl],
            r.get(attn_keys.batch),
            r[attn_keys.d],
            r[attn_keys.seq],
            r.get(attn_keys.dtype),
        ): r
        for r in rows
    }
    return list(cells.values())


def answer_compile(res: Results) -> list[Block]:
    """torch_compile: (a) compiled attention vs eager, every head dim; (b) the whole model."""
    out: list[Block] = []
    rows = _newest_per_cell(ok(res.rows("attn")))
    found = pairs(
        rows,
        vary=attn_keys.impl,
        a="naive",
        b="compiled",
        match=(attn_keys.d, attn_keys.seq, attn_keys.batch),
    )
    if found:
        table = [
            {
                "d": a[attn_keys.d],
                "seq": a[attn_keys.seq],
                "eager_fwd_ms": a[attn_keys.fwd_ms],
                "compiled_fwd_ms": b[attn_keys.fwd_ms],
                "eager_bwd_ms": a[attn_keys.bwd_ms],
                "compiled_bwd_ms": b[attn_keys.bwd_ms],
            }
            for a, b in found
        ]
        fwd = [
            a[attn_keys.fwd_ms] / b[attn_keys.fwd_ms] for a, b in found if num(b, attn_keys.fwd_ms)
        ]
        bwd = [
            a[attn_keys.bwd_ms] / b[attn_keys.bwd_ms] for a, b in found if num(b, attn_keys.bwd_ms)
        ]
        ds = sorted({t["d"] for t in table})
        text = (
            f"(a) torch.compile'd attention against eager (eager's time / compiled's), head dims "
            f"{', '.join(map(str, ds))}: forward {span(fwd)} ({speed(fwd)}), backward "
            f"{span(bwd)} ({speed(bwd)}); compiled fuses the scale, mask and softmax into one "
            "kernel, but still writes the seq × seq matrix."
        )
        out += [said(res, text, [r for p in found for r in p]), Table(table, list(table[0]))]
    models = ok(r for r in res.rows("model") if is_compile(res.record_of(r)))
    with_forward = [r for r in models if r[model_keys.mode] == "forward"]
    if with_forward:  # the newest run that answers the whole question, alone
        newest = res.record_of(with_forward[-1])
        models = [r for r in models if res.record_of(r) is newest]
    found_m = pairs(
        models,
        vary=model_keys.compiled,
        a=False,
        b=True,
        match=(
            model_keys.size,
            model_keys.ctx,
            model_keys.mode,
            model_keys.dtype,
            model_keys.d_model,
        ),
    )
    if found_m:
        table = [
            {
                "size": size_label(a),
                "ctx": a[model_keys.ctx],
                "mode": a[model_keys.mode],
                "dtype": a[model_keys.dtype],
                "eager_ms": a[model_keys.step_ms],
                "compiled_ms": b[model_keys.step_ms],
                "speedup": a[model_keys.step_ms] / b[model_keys.step_ms],
            }
            for a, b in found_m
            if num(a, model_keys.step_ms) and num(b, model_keys.step_ms)
        ]
        by_mode = grouped(table, "mode")
        speedups = "; ".join(
            f"{mode}: {span([t['speedup'] for t in group])}" for (mode,), group in by_mode.items()
        )
        cited = [r for p in found_m for r in p]
        if "forward" in {t["mode"] for t in table}:
            text = (
                f"(b) The whole model compiled against eager (eager's time / compiled's): "
                f"{speedups}. {_compile_reading(by_mode)}"
            )
            out += [said(res, text, cited), Table(table, list(table[0]))]
            return out
        sizes = ", ".join(dict.fromkeys(t["size"] for t in table))
        text = (
            f"An earlier, partial run compiled the whole model for the training step only "
            f"({sizes}, context {', '.join(map(str, sorted({t['ctx'] for t in table})))}): "
            f"{speedups} faster than eager; it does not answer the forward or the forward + "
            "backward."
        )
        out += [_compile_not_run(), said(res, text, cited), Table(table, list(table[0]))]
    else:
        out.append(_compile_not_run())
    return out


def _flash_table(found: list[tuple[dict, dict]], impl: str) -> Table:
    """The deliverable: forward, backward and end-to-end ms of fa2-triton beside `impl`, per
    (dtype, seq, d)."""
    k = flash_keys
    name = "torch" if impl == "naive" else impl
    rows = [
        {
            "dtype": b[k.dtype],
            "seq": b[k.seq],
            "d": b[k.d],
            "fa2_fwd": b.get(k.fwd_ms),
            "fa2_bwd": b.get(k.bwd_ms),
            "fa2_e2e": b.get(k.fwd_bwd_ms),
            f"{name}_fwd": a.get(k.fwd_ms),
            f"{name}_bwd": a.get(k.bwd_ms),
            f"{name}_e2e": a.get(k.fwd_bwd_ms),
        }
        for a, b in sorted(found, key=lambda p: (p[1][k.dtype], p[1][k.d], p[1][k.seq]))
    ]
    # the handout asks for fa2 beside plain PyTorch attention; SDPA's table is ours
    return Table(
        rows,
        list(rows[0]),
        caption=f"ms, fa2-triton beside {name} ({impl})",
        beyond_handout=impl != "naive",
    )


def _compile_reading(by_mode: dict[tuple, list[dict]]) -> str:
    """Whether compiling speeds each mode up (the median speed-up per mode), and which gains
    more, with the reason that fits."""
    medians = {
        mode: statistics.median(t["speedup"] for t in group) for (mode,), group in by_mode.items()
    }
    text = "Compiled, " + ", ".join(f"the {mode} runs {speed([m])}" for mode, m in medians.items())
    forward, step = medians.get("forward"), medians.get("train-step")
    if forward is None or step is None:
        return text + "."
    if max(forward, step) <= 1 + SAME:
        return text + ": neither gains here."
    return text + ratio_word(
        forward / step,
        more=". The forward gains most: compiling fuses its elementwise work (norms, RoPE, "
        "SwiGLU, the attention mask and softmax), while a training step also runs the "
        "backward's matmuls and the optimizer, which compiling leaves as they were.",
        less=". The training step gains more than the forward: compiling also fuses the "
        "backward's elementwise work and the optimizer's update.",
        same=". The forward and the training step gain alike.",
    )


def _compile_not_run() -> Paragraph:
    return Paragraph(
        "(b) Not run for the 2026 question (the whole model compiled against eager, forward, "
        f"forward + backward and the training step): {COMPILE_MODEL.sentence()}."
    )


def _official(res: Results, prefix: str) -> Rows:
    return [
        r
        for r in res.rows("official_tests")
        if r.get("test", "").split("::")[-1].startswith(prefix)
    ]


def answer_flash_tests(prefix: str, what: str):
    """An answer that quotes the official suites' results for tests named `prefix*`, and the
    project's GPU test records."""

    def answer(res: Results) -> list[Block]:
        rows = _official(res, prefix)
        out: list[Block] = []
        if rows:
            counts = {
                o: sum(r["outcome"] == o for r in rows) for o in ("passed", "failed", "skipped")
            }
            suites = ", ".join(sorted({r["suite"] for r in rows}))
            text = (
                f"{what}: the official {suites} tests `{prefix}*` run against fa2 "
                f"(`tests/official`): {counts['passed']} passed, {counts['failed']} failed, "
                f"{counts['skipped']} skipped on a machine without a GPU (the Triton ones)."
            )
            out.append(said(res, text, rows))
        gpu = [r for r in res.rows("gpu_tests", earlier=True) if "fa2" in str(r.get("command", ""))]
        if gpu:
            # every run at the newest run's revision: the suite is often run in parts
            last = gpu[-1]
            runs = [r for r in gpu if r.get("revision") == last.get("revision")]
            passed = sum(r.get("passed", 0) for r in runs)
            failed = sum(r.get("failed", 0) for r in runs)
            device = res.record_of(last).run.env.get("device_name")
            out.append(
                said(
                    res,
                    f"On one {device} fa2's own GPU tests (the Triton forward and backward "
                    f"against a float64 oracle) last passed {passed} of {passed + failed} at "
                    f"`{str(last.get('revision'))[:12]}`"
                    + (f", in {len(runs)} runs." if len(runs) > 1 else "."),
                    runs,
                )
            )
        return out

    return answer


def answer_flash_benchmarking(res: Results) -> list[Block]:
    """flash_benchmarking: fa2-triton against PyTorch attention and SDPA over the sweep."""
    # the newest sweep of each dtype (one file per dtype), else every sweep row
    latest = [
        r
        for stem in ("flash_sweep_bf16", "flash_sweep_fp32", "flash_naive")
        for r in res.rows("flash", stem=stem, latest=True)
    ]
    rows = [r for r in ok(latest or res.rows("flash")) if r[flash_keys.case] == "sweep"]
    out: list[Block] = []
    for impl in ("naive", "sdpa"):
        found = pairs(
            rows,
            vary=flash_keys.impl,
            a=impl,
            b="fa2-triton",
            match=(flash_keys.dtype, flash_keys.seq, flash_keys.d, flash_keys.batch),
        )
        found = [
            (a, b)
            for a, b in found
            if num(a, flash_keys.fwd_bwd_ms) and num(b, flash_keys.fwd_bwd_ms)
        ]
        if not found:
            continue
        name = "plain PyTorch attention" if impl == "naive" else "SDPA"
        parts = []
        for key, label in (
            (flash_keys.fwd_ms, "forward"),
            (flash_keys.bwd_ms, "backward"),
            (flash_keys.fwd_bwd_ms, "end to end"),
        ):
            ratios = [a[key] / b[key] for a, b in found if num(a, key) and num(b, key)]
            if ratios:
                parts.append(f"{label} {span(ratios)}")
        text = (
            f"fa2-triton against {name} (their time / fa2's, batch 1, causal): "
            + ", ".join(parts)
            + "."
        )
        if impl == "naive":
            ooms = sorted(
                {
                    (r[flash_keys.dtype], r[flash_keys.seq])
                    for r in res.rows("flash")
                    if r.get(flash_keys.impl) == "naive" and r.get(flash_keys.status) == OOM
                }
            )
            if ooms:
                fa2_ooms = [
                    r
                    for r in res.rows("flash")
                    if r.get(flash_keys.impl) == "fa2-triton" and r.get(flash_keys.status) == OOM
                ]
                text += (
                    " Plain attention runs out of memory from "
                    + ", ".join(f"seq {s} in {d}" for d, s in ooms[:2])
                    + (
                        "; fa2 runs every length."
                        if not fa2_ooms
                        else f"; fa2 runs out too, in {len(fa2_ooms)} cells."
                    )
                )
        out.append(said(res, text, [r for p in found for r in p]))
        out.append(_flash_table(found, impl))
    best = [
        r for r in rows if r[flash_keys.impl] == "fa2-triton" and num(r, flash_keys.fwd_bwd_tflops)
    ]
    if best:
        top = max(best, key=lambda r: r[flash_keys.fwd_bwd_tflops])
        out.append(
            said(
                res,
                f"fa2-triton peaks at {fmt(top[flash_keys.fwd_bwd_tflops])} TFLOP/s forward + "
                f"backward (seq {top[flash_keys.seq]}, d {top[flash_keys.d]}, "
                f"{top[flash_keys.dtype]}); the full tables are below.",
                [top],
            )
        )
    if not any(r[flash_keys.impl] == "naive" for r in rows):
        out.append(
            Paragraph(
                "Not run: the comparison the handout asks for, fa2 against regular PyTorch "
                "attention (naive, which materialises the scores), over the same sweep; the "
                f"committed sweeps compare with SDPA only. {FLASH_NAIVE.sentence()}, on part of "
                "the sweep's grid (the handout asks for various powers of two)."
            )
        )
    return out
