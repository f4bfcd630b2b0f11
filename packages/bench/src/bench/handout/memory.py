"""§2.1.6 and §3 of the 2026 handout: memory profiling, residuals and gradient checkpointing."""

from __future__ import annotations

import math
import re
import statistics
from typing import Any

from bench.core.document import Block, Paragraph, Table
from bench.core.saved_tensors import RESIDUAL_KEYS as RK
from bench.handout.results import OOM, Results, fmt, num, ok, pairs, size_label, span
from bench.handout.single_gpu import is_memory, said
from bench.tools import model

__all__ = ["answer_checkpointing", "answer_memory"]

M = model.KEYS
MIB = 2**20
_LARGEST = re.compile(r"_snapshot_(\S+?)\.pickle.*largest allocation ([\d.,]+) MiB at (.+?)\.$")


# ---------------------------------------------------------------- §2.1.6 memory_profiling


def answer_memory(res: Results) -> list[Block]:
    """(a)–(f): timelines, peaks, bf16, activation size, largest allocations, residuals."""
    out: list[Block] = []
    rows = [r for r in res.rows("model") if is_memory(res.record_of(r))]
    measured = [r for r in rows if num(r, M.peak_mib) or r.get(M.status) == OOM]
    if measured:
        peaks = {
            m: [r[M.peak_mib] for r in ok(measured) if r[M.mode] == m and num(r, M.peak_mib)]
            for m in ("forward", "train-step")
        }
        forward, step = peaks["forward"], peaks["train-step"]
        numbers = (
            f" Here a forward peaks at {fmt(min(forward))}–{fmt(max(forward))} MiB and a "
            f"training step at {fmt(min(step))}–{fmt(max(step))} MiB."
            if forward and step
            else ""
        )
        out.append(
            said(
                res,
                "(a) The allocator timelines (below, one per context, dtype and mode) rise "
                "through the forward as each layer's activations are kept, fall through the "
                "backward as they are freed and gradients appear, and in a training step end "
                "with the optimizer's state and update; a forward alone under `no_grad` keeps "
                "only about a layer's activations at a time above the weights." + numbers,
                measured,
            )
        )
        table = [
            {
                "size": size_label(r),
                "ctx": r[M.ctx],
                "dtype": r[M.dtype],
                "mode": r[M.mode],
                "peak_mib": r.get(M.peak_mib),
                "status": r.get(M.status),
            }
            for r in measured
        ]
        out += [
            said(res, "(b) Peak memory (MiB) over the timed step(s):", measured),
            Table(table, list(table[0])),
        ]
        ratios = [
            b[M.peak_mib] / a[M.peak_mib]
            for a, b in pairs(
                ok(measured), vary=M.dtype, a="fp32", b="bf16", match=(M.size, M.ctx, M.mode)
            )
            if num(a, M.peak_mib) and num(b, M.peak_mib)
        ]
        if ratios:
            effect = (
                "raises it: the fp32 weights, gradients and optimizer state stay, autocast "
                "adds bf16 copies of the weights, and the activations it saves in bf16 do not "
                "make up for them at these lengths"
                if statistics.median(ratios) > 1
                else "lowers it: the activations saved in bf16 take half the bytes, more than "
                "autocast's bf16 copies of the weights add, while the fp32 weights, gradients "
                "and optimizer state stay"
            )
            out.append(
                said(
                    res,
                    f"(c) bf16 autocast's peak is {span(ratios)} the fp32 peak: mixed "
                    f"precision {effect}.",
                    measured,
                )
            )
        largest = [
            f"{m[1]}: {m[2]} MiB at {m[3]}"
            for rec in res.records
            if is_memory(rec)
            for note in rec.run.notes
            if (m := _LARGEST.search(note))
        ]
        if largest:
            out.append(
                said(
                    res,
                    "(e) The largest allocations: " + "; ".join(largest) + ". In the forward "
                    "they are activations of the widest layers (the feed-forward's d_ff-wide "
                    "hidden state, and at long contexts the attention scores); in a step, "
                    "gradients and optimizer state of the largest weights.",
                    measured,
                )
            )
    shapes = {(r[M.batch], r[M.d_model], r[M.size]) for r in rows if r.get(M.d_model)}
    for batch, d_model, size in sorted(shapes):
        ctxs = sorted({r[M.ctx] for r in rows if r.get(M.d_model) == d_model})
        sizes = ", ".join(f"{fmt(batch * c * d_model * 4 / MIB)} MiB at context {c}" for c in ctxs)
        out.append(
            said(
                res,
                f"(d) One residual-stream activation of {size} in fp32 is batch × context × "
                f"d_model × 4 bytes = {batch} × context × {d_model} × 4: {sizes}.",
                [r for r in rows if r.get(M.d_model) == d_model],
            )
        )
    out += _residual_answers(res)
    return out


def _residual_answers(res: Results) -> list[Block]:
    rows = res.rows("residuals")
    blocks = [r for r in ok(rows) if r[RK.kind] == "block" and r[RK.checkpointing] == "none"]
    out: list[Block] = []
    for b in blocks:
        ops = [r for r in rows if r[RK.kind] == "operation" and r.get(RK.cell) == b.get(RK.cell)]
        top = ", ".join(f"{r[RK.operation]} {fmt(r[RK.mib])} MiB ({r[RK.share]:.0%})" for r in ops)
        kept = [
            r
            for r in ok(rows)
            if r[RK.kind] == "block"
            and r[RK.checkpointing] == "block"
            and (r[RK.size], r[RK.ctx], r[RK.dtype]) == (b[RK.size], b[RK.ctx], b[RK.dtype])
        ]
        d, f = b[RK.d_model], b[RK.d_ff]
        expected = (2 * d + 4 * d * d + 3 * d * f) * 4 / MIB
        text = (
            f"(f) One {size_label(b)} block at context {b[RK.ctx]} ({b[RK.dtype]}, batch "
            f"{b[RK.batch]}) keeps {fmt(b[RK.mib])} MiB for backward ({fmt(b[RK.saved_mib])} "
            f"MiB counting every save, as a saved-tensor hook adds them); the five largest "
            f"contributors: {top}. Its backward produces {fmt(b[RK.grad_mib])} MiB of "
            f"gradients: {fmt(b[RK.param_grad_mib])} MiB for its weights, as expected from "
            f"its (2·d + 4·d² + 3·d·d_ff) fp32 parameters = {fmt(expected)} MiB, and "
            f"{fmt(b[RK.input_grad_mib])} MiB for its input"
        )
        if num(b, RK.grad_from_memory_mib) is not None:
            text += (
                f"; read from the allocator (change over the backward plus the freed "
                f"residuals) it is {fmt(b[RK.grad_from_memory_mib])} MiB"
            )
        if kept:
            text += (
                f". Under activation checkpointing the block keeps only "
                f"{fmt(kept[0][RK.mib])} MiB (its input) and recomputes the rest in backward"
            )
        out.append(said(res, text + ".", [b, *ops, *kept]))
    return out


# ---------------------------------------------------------------- §3.2 gradient_checkpointing

_SKETCH = """```python
def run(blocks, x):  # peak: O(log N) saved inputs + one block's residuals
    if len(blocks) == 1:
        (block,) = blocks
        return block(x)
    half = len(blocks) // 2
    x = checkpoint(run, blocks[:half], x, use_reentrant=False)
    return checkpoint(run, blocks[half:], x, use_reentrant=False)
```"""


def answer_checkpointing(res: Results) -> list[Block]:
    out: list[Block] = [
        Paragraph(
            "(a) Checkpoint recursively: split the N blocks in two halves, wrap each half in a "
            "checkpoint, and inside each half do the same until a single block remains. At any "
            "time the backward holds the inputs of the checkpoints on one root-to-leaf path, "
            "O(log N) activations, plus the residuals of the one block being differentiated, "
            "so peak activation memory is O(log N) (O(1) blocks' residuals); every block's "
            "forward is recomputed once per level of the recursion, O(N log N) compute in all "
            "(lmcore's `nested` activation-checkpointing spec builds this)."
        ),
        Paragraph(_SKETCH),
    ]
    rows = [
        r
        for r in ok(res.rows("residuals"))
        if r[RK.kind] == "block" and r[RK.dtype] == "fp32" and r[RK.ctx] == 2048
    ]
    plain = [r for r in rows if r[RK.checkpointing] == "none"]
    kept = [r for r in rows if r[RK.checkpointing] == "block"]
    if plain and kept:
        p, k = plain[0], kept[0]
        layers = model_layers(p)
        best = math.sqrt(layers * k[RK.mib] / p[RK.mib])
        choices = [s for s in range(1, layers + 1) if layers % s == 0]
        peak = {s: layers / s * k[RK.mib] + s * p[RK.mib] for s in choices}
        pick = min(peak, key=peak.get)
        text = (
            f"(b) With one level of recomputation and segments of K blocks, the backward holds "
            f"N/K segment inputs of {fmt(k[RK.mib])} MiB each and, while a segment is "
            f"recomputed, K blocks' residuals of {fmt(p[RK.mib])} MiB each ({size_label(p)}, "
            f"batch {p[RK.batch]}, context 2048, fp32): peak ≈ (N/K)·{fmt(k[RK.mib])} + "
            f"K·{fmt(p[RK.mib])} MiB, least at K = √(N·input/residuals) = {best:.2f}. Among "
            f"segment sizes dividing N = {layers}: "
            + ", ".join(f"K={s}: {fmt(v / 1024)} GiB" for s, v in peak.items())
            + f", so K = {pick} (one checkpoint per block when the residuals dwarf the inputs). "
            "Measuring the peaks needs an H100 and bench-model's activation-checkpointing "
            "option (`--activation-checkpointing segments:K`, from the lmcore and step "
            "branches); that run has not been made."
        )
        out.append(said(res, text, [p, k]))
    else:
        out.append(
            Paragraph(
                "(b) Not measured: the prediction needs the residuals of one xl block at "
                "context 2048 (`bench-model --size xl --context-length 2048 --study "
                "residuals`, `handout_gpu.sh part2`), the measured peaks an H100 and "
                "bench-model's `--activation-checkpointing segments:K` (lmcore and step "
                "branches); neither has run."
            )
        )
    return out


def model_layers(row: dict[str, Any]) -> int:
    """The number of blocks of the row's size (lmcore's table when the row does not say)."""
    from lmcore import MODEL_SIZES

    layers = row.get("num_layers")
    if layers:
        return int(layers)
    size = MODEL_SIZES.get(str(row.get("size")))
    return size.num_layers if size is not None else 1
