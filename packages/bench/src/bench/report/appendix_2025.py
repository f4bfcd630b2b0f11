"""The 2025 handout's problems that the 2026 one dropped, as an appendix: the bucketed-DDP sweep
and the bucket-size equation (2025 §2.3.3), and the XXL accounting (2025 §2.4).

The sweep quotes bench-ddp's `ddp` rows (DDPBucketed, one per bucket size); the equation is
bench-plan's (`bench.plan.buckets`) with s, w and o read off the committed runs (the model the
sweep trained, the NCCL all-reduce study); the XXL answers are bench-plan's (`bench.plan.xxl`)
with the handout's own numbers.
"""

from __future__ import annotations

from typing import Any

import lmcore
from bench.plan import buckets, xxl
from bench.report.claims import SAME, relation
from bench.report.data_parallel import ddp_runs
from bench.report.document import Block, Paragraph, Table
from bench.report.parallel import run_dims, run_shape, run_world
from bench.report.results import Record, Results, Rows, fmt, num, ok
from bench.report.single_gpu import said
from bench.tools import allreduce, data_parallel

__all__ = ["answer_bucket_equation", "answer_bucket_sweep", "answer_xxl"]

ddp_keys, allreduce_keys = data_parallel.KEYS, allreduce.KEYS
_FP32 = 4  # bytes per gradient value: bench-ddp trains in fp32
# (a)'s activations for one batch, an illustration of the per-token figure (they grow linearly).
_EXAMPLE_TOKENS = 4096


def _bucketed(rows: Rows) -> Rows:
    """One run's DDPBucketed rows, smallest bucket first."""
    k = ddp_keys
    return sorted(
        (r for r in rows if r.get(k.variant) == "ddp" and num(r, k.bucket_mb) is not None),
        key=lambda r: r[k.bucket_mb],
    )


def _sweeps(res: Results) -> list[tuple[Record, Rows]]:
    """Each bench-ddp run that swept bucket sizes, with its DDPBucketed rows, fewest ranks first."""
    return [(rec, found) for rec, rows in ddp_runs(res) if (found := _bucketed(rows))]


def answer_bucket_sweep(res: Results) -> list[Block]:
    """(a) DDPBucketed's step time per bucket size, and which size is best (ties said so), one
    run (world size) at a time."""
    k = ddp_keys
    out: list[Block] = []
    for record, rows in _sweeps(res):
        table = [
            {
                "bucket_mb": r[k.bucket_mb],
                "buckets": r.get(k.collectives),
                "step_ms": r[k.step_ms],
                "overhead_ms": r.get(k.overhead_ms),
                "wait_ms": r.get(k.wait_ms),
                "hidden": r.get(k.hidden),
            }
            for r in rows
        ]
        best = min(rows, key=lambda r: r[k.step_ms])
        level = [
            r
            for r in rows
            if r is not best and relation(r[k.step_ms], best[k.step_ms]) == "level with"
        ]
        sizes = ", ".join(f"{fmt(r[k.bucket_mb])} MB" for r in level)
        text = (
            f"(a) DDPBucketed's step ({run_shape(record)}, {run_world(record)} ranks) is "
            f"shortest at {fmt(best[k.bucket_mb])} MB buckets, {fmt(best[k.step_ms])} ms"
            + (
                f"; {sizes} {'is' if len(level) == 1 else 'are'} within {SAME:.0%} of it, "
                "level at this precision"
                if level
                else ""
            )
            + f". The smallest buckets ({fmt(rows[0][k.bucket_mb])} MB, "
            f"{rows[0].get(k.collectives)} all-reduces) take {fmt(rows[0][k.step_ms])} ms: many "
            "calls, each paying its fixed cost; the largest "
            f"({fmt(rows[-1][k.bucket_mb])} MB, {rows[-1].get(k.collectives)} all-reduces) "
            f"{fmt(rows[-1][k.step_ms])} ms: few calls, but the last bucket's all-reduce starts "
            "only when the backward is nearly done."
        )
        out += [said(res, text, rows), Table(table, list(table[0]))]
    return out


def _link(res: Results) -> tuple[float, float, Rows] | None:
    """(w, o, rows): NCCL's algorithm bandwidth at its largest size on the fewest ranks, and the
    per-call cost, the smallest size's time less its transfer at that bandwidth."""
    k = allreduce_keys
    rows = [r for r in ok(res.rows("allreduce")) if r[k.backend] == "nccl" and num(r, k.ms)]
    if not rows:
        return None
    fewest = min(r[k.world_size] for r in rows)
    rows = sorted((r for r in rows if r[k.world_size] == fewest), key=lambda r: r[k.size_mb])
    small, large = rows[0], rows[-1]
    if small is large or not num(large, k.algbw_gbps):
        return None
    w = large[k.algbw_gbps] * 1e9
    o = small[k.ms] / 1e3 - small[k.size_mb] * 1e6 / w
    return (w, o, [small, large]) if o > 0 else None


def answer_bucket_equation(res: Results) -> list[Block]:
    """(b) the overhead equation, its optimum, and both beside the sweep's measured overheads."""
    out: list[Block] = [
        Paragraph(
            "(b) With n_b buckets of a model of s bytes, all-reduced at algorithm bandwidth w "
            "with a fixed cost o per call, and a bucket's gradients computed in the time its "
            "bytes take to send (the handout's assumption), the transfers keep pace with the "
            "backward and only the calls' fixed costs fall behind it: DDP's overhead after the "
            "backward is overhead(n_b) = n_b·o + s/(n_b·w). Its minimum, where o = s/(n_b²·w), "
            "is at n_b* = √(s/(w·o)) buckets of b* = √(s·w·o) bytes, an overhead of "
            "2·√(s·o/w) (`bench.plan.buckets`)."
        )
    ]
    sweeps, link = _sweeps(res), _link(res)
    if not sweeps or link is None:
        return out
    w, o, link_rows = link
    record, rows = sweeps[0]  # the fewest ranks: the link numbers are the two-rank ones
    dims = run_dims(record)
    if dims is None:
        return out
    config = lmcore.ModelConfig(vocab_size=10_000, context_length=128, **dims)
    s = _FP32 * lmcore.count_parameters(config)
    best = buckets.optimal_bucket_bytes(s, w, o)
    k = ddp_keys
    table = [
        {
            "bucket_mb": r[k.bucket_mb],
            "buckets": r[k.collectives],
            "predicted_ms": buckets.ddp_overhead_seconds(s, w, o, r[k.collectives]).value * 1e3,
            "measured_ms": r.get(k.overhead_ms),
        }
        for r in rows
        if r.get(k.collectives)
    ]
    swept = [r[k.bucket_mb] for r in rows]
    below = max((m for m in swept if m * 1e6 <= best.value), default=None)
    above = min((m for m in swept if m * 1e6 > best.value), default=None)
    measured_best = min(rows, key=lambda r: r[k.step_ms])[k.bucket_mb]
    around = [m for m in (below, above) if m is not None]
    verdict = (
        "one of the two swept sizes around it"
        if measured_best in around
        else "not one of the swept sizes around it"
    )
    text = (
        f"With the sweep's model (s = {s / 1e9:.3g} GB of fp32 gradients) and the NCCL study's "
        f"two-rank numbers (w = {w / 1e9:.3g} GB/s, the algorithm bandwidth of its largest "
        f"all-reduce; o = {o * 1e3:.3g} ms, its smallest all-reduce's time less that size's "
        f"transfer), the optimum is b* = {best.value / 1e6:,.0f} MB; the sweep's fastest size, "
        f"{fmt(measured_best)} MB, is {verdict}"
        + (f" ({' and '.join(f'{fmt(m)} MB' for m in around)})" if around else "")
        + ". Per swept size, with the bucket count the run made (a parameter is never split, so "
        "small caps make fewer buckets than s over the cap), the equation's overhead beside the "
        "step time measured beyond one GPU:"
    )
    return [*out, said(res, text, [*rows, *link_rows]), Table(table, list(table[0]))]


def answer_xxl(res: Results) -> list[Block]:
    """(a)–(d) from `bench.plan.xxl` with the handout's numbers (no measurement needed)."""
    m, mesh = xxl.XXL, xxl.TPU_V5P
    state = xxl.state_bytes(m)
    acts = xxl.activation_bytes_per_token(m)
    n_fsdp = xxl.fsdp_devices(m, xxl.TPU_V5P_BYTES)
    batch = xxl.compute_bound_batch(m, mesh)
    per_device = batch.value
    rows: list[dict[str, Any]] = [
        {"part": "(a) parameters P", "answer": f"2·d_model·d_ff·num_blocks = {m.parameters:,}"},
        {
            "part": "(a) FP32 state",
            "answer": f"{state.formula} = {state.value / 1e12:.3g} TB "
            f"({state.value / xxl.H100_BYTES:.1f} H100s of 80 GB: "
            f"{-(-state.value // xxl.H100_BYTES):.0f})",
        },
        {
            "part": "(a) saved for backward",
            "answer": f"{acts.formula} = {acts.value / 1e6:.3g} MB per token: "
            f"{acts.value * _EXAMPLE_TOKENS / 1e9:.3g} GB for a batch of {_EXAMPLE_TOKENS:,} "
            "tokens",
        },
        {
            "part": "(b) per device",
            "answer": "(16·P + A/2)/N_FSDP + A/2, A the batch's activations",
        },
        {
            "part": "(b) N_FSDP for 95 GB",
            "answer": f"{n_fsdp.formula}: with A → 0, N_FSDP ≥ {n_fsdp.value:.0f}; every token "
            f"adds {acts.value / 2e6:.3g} MB unsharded per device",
        },
        {
            "part": "(c) per-device batch",
            "answer": f"{batch.formula} = {per_device:.4g} tokens ({batch.why})",
        },
        {
            "part": "(c) overall batch",
            "answer": f"N = X·Y = {mesh.devices} devices: B ≥ {per_device * mesh.devices:,.0f} "
            "tokens",
        },
    ]
    text = (
        "The XXL model of the 2025 handout (d_model 16,384, d_ff 53,248, 126 blocks of two "
        "linear layers; FP32 master weights, gradients and AdamW state, BF16 activations), "
        "from bench-plan's formulas (`bench.plan.xxl`) with the handout's own numbers: a TPU "
        "v5p's 95 GB, C = 4.6·10^14 FLOP/s, W_ici = 2·9·10^10 B/s, M_X = 2, M_Y = 1, X = 16, "
        "Y = 4."
    )
    tricks = (
        "(d) The bound B/N ≥ C/(W_ici·M_X·Y) falls as the TP axis Y grows (up to Y ≤ "
        "F·W_ici·M_Y/C, where TP's own traffic takes over) and as the bytes sent per weight "
        "fall: more model parallelism (TP within its bound, pipeline stages, which send "
        "activations instead of weights, or experts), weights all-gathered in 8 bits instead "
        "of 16 (half the bytes: half the bound), and overlapping each layer's gather with the "
        "previous layer's math all lower the per-device batch at which the step stays "
        "compute-bound (the TPU Scaling Book's sections on FSDP and on mixing it with model "
        "parallelism derive the same bound); activation checkpointing then pays for the "
        "memory the longer sequences need."
    )
    return [Paragraph(text), Table(rows, ["part", "answer"]), Paragraph(tricks)]
