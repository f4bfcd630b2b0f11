"""§2.1.6 of the 2026 handout: memory profiling (timelines, peaks, bf16, the residual stream,
the largest allocations) and the residuals of one block."""

from __future__ import annotations

import re
import statistics
from pathlib import Path

from bench.core.layouts import renamed_row
from bench.report.claims import direction, ratio_word, relation
from bench.report.document import Block, Image, Paragraph, Table
from bench.report.results import (
    DIM_KEYS,
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
from bench.report.runs import MEMORY_TIMELINES
from bench.report.single_gpu import is_memory, said
from bench.tools import model
from bench.tools.model.residuals import RESIDUAL_KEYS as residual_keys

__all__ = ["answer_memory"]

model_keys = model.KEYS
MIB = 2**20
_LARGEST = re.compile(r"_snapshot_(\S+?)\.pickle.*largest allocation ([\d.,]+) MiB at (.+?)\.$")
# A timeline image bench-model wrote for one cell: `<stem>_snapshot_<size>_ctx<n>_<mode>_...png`.
_TIMELINE = re.compile(r"_snapshot_.+_ctx(\d+)_(forward|train-step)_(fp32|bf16-autocast|bf16)_")

# ---------------------------------------------------------------- §2.1.6 memory_profiling


def answer_memory(res: Results) -> list[Block]:
    """(a)–(f): timelines, peaks, bf16, activation size, largest allocations, residuals."""
    out: list[Block] = []
    rows = [r for r in res.rows("model") if is_memory(res.record_of(r))]
    measured = [
        {**r, "device": _device(res, r)}
        for r in rows
        if num(r, model_keys.peak_mib) or r.get(model_keys.status) == OOM
    ]
    if measured:
        current = list({id(rec): rec for rec in map(res.record_of, measured)}.values())
        out += _timelines(res, current, measured)
        out += _peaks(res, measured)
    out += _activation_size(res, rows)
    if measured:
        out += _largest(res, current, measured)
    out += _residual_answers(res)
    return out


def _phase_sentence(row: dict) -> str | None:
    """How memory moves through one measured step, from the phase readings the memory study
    records (`bench.tools.model.PHASE_METRICS`); None for a row without them."""
    k = model_keys
    start, fwd = num(row, k.start_mib), num(row, k.fwd_end_mib)
    if start is None or fwd is None:
        return None
    cell = f"{size_label(row)} context {row[k.ctx]} {row[k.dtype]} {row[k.mode]}"
    if row[k.mode] == "forward":
        text = (
            f"{cell}: {fmt(start)} MiB allocated before the forward, {fmt(fwd)} MiB after it "
            f"(it {direction(start, fwd)}: under no_grad nothing is kept for a backward)"
        )
        if num(row, k.peak_mib) is not None:
            text += f", peaking at {fmt(row[k.peak_mib])} MiB while the layers run"
        return text
    bwd = num(row, k.bwd_end_mib)
    text = (
        f"{cell}: {fmt(start)} MiB before the step, {fmt(fwd)} MiB as the forward ends (it "
        f"{direction(start, fwd)} through the forward as each layer's activations are kept)"
    )
    if bwd is not None:
        text += (
            f", {fmt(bwd)} MiB as the backward ends (it {direction(fwd, bwd)} through the "
            "backward, which frees the activations and makes a gradient for every weight)"
        )
    opt = num(row, k.opt_end_mib)
    if opt is not None and bwd is not None:
        text += f", {fmt(opt)} MiB after the optimizer step (it {direction(bwd, opt)})"
    if row.get(k.peak_phase) and num(row, k.peak_mib) is not None:
        text += f"; the step's peak, {fmt(row[k.peak_mib])} MiB, falls in the {row[k.peak_phase]}"
    return text


def _timelines(res: Results, current: list[Record], measured: Rows) -> list[Block]:
    """(a): the timelines and what the phase readings say of them, the peaks in one sentence."""
    peaks = {
        m: [
            r[model_keys.peak_mib]
            for r in ok(measured)
            if r[model_keys.mode] == m and num(r, model_keys.peak_mib)
        ]
        for m in ("forward", "train-step")
    }
    forward, train = peaks["forward"], peaks["train-step"]
    numbers = (
        f" Here a forward peaks at {fmt(min(forward))}–{fmt(max(forward))} MiB and a "
        f"training step at {fmt(min(train))}–{fmt(max(train))} MiB."
        if forward and train
        else ""
    )
    if not any(_timeline_images(rec) for rec in current):
        return _no_timelines(res, current, numbers, measured)
    read = [text for r in ok(measured) if (text := _phase_sentence(r))]
    if read:
        shape = "Read from the allocator at the end of each phase of the first timed step: "
        text = f"(a) The timelines are below, one per run.{numbers} {shape}{'; '.join(read)}."
        return [said(res, text, measured)]
    text = f"(a) The timelines are below, one per run.{numbers} {_NO_PHASES}"
    return [said(res, text, measured)]


# Said where a memory run recorded no phase readings (results written before bench-model's
# memory study read them): the timelines are shown, their shape is not described.
_NO_PHASES = (
    "No memory by phase was recorded (bench-model's memory study now reads it at the end of "
    "each phase of its first timed step), so no sentence here describes the timelines' shape."
)


def _device(res: Results, row: dict) -> str:
    """The GPU a row was measured on, without its maker's name."""
    return str(res.record_of(row).run.env.get("device_name", "?")).removeprefix("NVIDIA ")


def _peaks(res: Results, measured: Rows) -> list[Block]:
    """(b) the peaks, forward and training step per context (and GPU, where several were
    measured); (c) bf16 against fp32 on the same GPU."""
    several = len({r["device"] for r in measured}) > 1
    table = [
        {
            **({"device": group[0]["device"]} if several else {}),
            "size": size_label(group[0]),
            "ctx": ctx,
            "dtype": dtype,
            **{
                f"{mode}_peak_mib": next(
                    (
                        r.get(model_keys.peak_mib) or r.get(model_keys.status)
                        for r in group
                        if r[model_keys.mode] == mode
                    ),
                    None,
                )
                for mode in ("forward", "train-step")
            },
        }
        for (_, _, _, ctx, dtype), group in grouped(
            measured,
            "device",
            model_keys.size,
            model_keys.d_model,
            model_keys.ctx,
            model_keys.dtype,
        ).items()
    ]
    out: list[Block] = [
        said(
            res,
            "(b) Peak memory (MiB) over the timed step, forward and full training step "
            "(OOM: out of memory on the GPU measured):",
            measured,
        ),
        Table(table, list(table[0])),
    ]
    ratios = [
        b[model_keys.peak_mib] / a[model_keys.peak_mib]
        for a, b in pairs(
            ok(measured),
            vary=model_keys.dtype,
            a="fp32",
            b="bf16-autocast",
            match=("device", model_keys.size, model_keys.d_model, model_keys.ctx, model_keys.mode),
            same_file=False,
        )
        if num(a, model_keys.peak_mib) and num(b, model_keys.peak_mib)
    ]
    if ratios:
        effect = ratio_word(
            statistics.median(ratios),
            more="raises it: the fp32 weights, gradients and optimizer state stay, autocast "
            "adds bf16 copies of the weights, and the activations it saves in bf16 do not "
            "make up for them at these lengths",
            less="lowers it: the activations saved in bf16 take half the bytes, more than "
            "autocast's bf16 copies of the weights add, while the fp32 weights, gradients "
            "and optimizer state stay",
            same="leaves it about where it was: autocast's bf16 copies of the weights and the "
            "activations it saves in half the bytes about cancel, and the fp32 weights, "
            "gradients and optimizer state stay",
        )
        out.append(
            said(
                res,
                f"(c) bf16 autocast's peak is {span(ratios)} the fp32 peak: mixed "
                f"precision {effect}.",
                measured,
            )
        )
    return out


def _activation_size(res: Results, rows: Rows) -> list[Block]:
    """(d) one residual-stream activation, from the dimensions the runs recorded."""
    out: list[Block] = []
    shapes = {
        (r[model_keys.batch], r[model_keys.d_model], size_label(r))
        for r in rows
        if r.get(model_keys.d_model)
    }
    for batch, d_model, size in sorted(shapes):
        ctxs = sorted({r[model_keys.ctx] for r in rows if r.get(model_keys.d_model) == d_model})
        sizes = ", ".join(f"{fmt(batch * c * d_model * 4 / MIB)} MiB at context {c}" for c in ctxs)
        out.append(
            said(
                res,
                f"(d) One residual-stream activation of {size} in fp32 is batch × context × "
                f"d_model × 4 bytes = {batch} × context × {d_model} × 4: {sizes}.",
                [r for r in rows if r.get(model_keys.d_model) == d_model],
            )
        )
    return out


def _largest(res: Results, current: list[Record], measured: Rows) -> list[Block]:
    """(e) the largest allocation of each cell, as the runs noted it from their snapshots."""
    largest = [
        f"{m[1]}: {m[2]} MiB at {m[3]}"
        for rec in current
        for note in rec.run.notes
        if (m := _LARGEST.search(note))
    ]
    if not largest:
        return []
    text = (
        "(e) The largest allocation of each run, as bench-model read it from the snapshot "
        "when it took it: " + "; ".join(largest) + ". In the forward they are activations of "
        "the widest layers (the feed-forward's d_ff-wide hidden state, and at long contexts "
        "the attention scores); in a step, gradients and optimizer state of the largest "
        "weights."
    )
    return [said(res, text, measured)]


def _timeline_images(record: Record) -> list[Path]:
    """The per-cell timeline images bench-model wrote beside a memory result."""
    folder, stem = record.path.parent, record.path.stem
    return sorted(folder.glob(f"{stem}_snapshot_*.png"))


def _dims_of(row: dict) -> tuple:
    return tuple(row.get(k) for k in DIM_KEYS)


def _dims(rows: Rows) -> set[tuple]:
    return {_dims_of(r) for r in rows}


def _no_timelines(res: Results, current: list[Record], numbers: str, measured: Rows) -> list[Block]:
    """(a) for results that kept no timeline: say so and which command makes them, and show an
    earlier run's timelines where one measured the same dimensions."""
    names = ", ".join(f"`{r.path.name}`" for r in current)
    out: list[Block] = [
        said(
            res,
            f"(a) Not run with timelines: the allocator snapshots (pickles) of the memory runs "
            f"({names}) were not kept, and no timeline image of them is committed. "
            f"{MEMORY_TIMELINES.sentence()}; bench-model draws a timeline PNG beside each "
            "pickle and reads the memory at the end of each phase, and the script moves the "
            f"timelines next to the results, where this report shows them.{numbers}",
            measured,
        )
    ]
    mine = [r for rec in current for r in rec.run.rows]
    dims = _dims(mine)
    for rec in res.records:
        if res.current(rec) or not is_memory(rec) or not (_dims(rec.run.rows) & dims):
            continue
        cells: dict[tuple[int, str], dict[str, Path]] = {}
        for image in _timeline_images(rec):
            match = _TIMELINE.search(image.stem)
            if match:  # images named before the one vocabulary say bf16 for autocast
                dtype = renamed_row("model", {"dtype": match[3]})["dtype"]
                cells.setdefault((int(match[1]), dtype), {})[match[2]] = image
        both = sorted(k for k, modes in cells.items() if len(modes) == 2)
        if not both:
            continue
        ctx, dtype = both[0]
        row = next(r for r in rec.run.rows if _dims_of(r) in dims)
        label = size_label(row)
        same = next(r for r in mine if _dims_of(r) == _dims_of(row))
        out.append(
            Paragraph(
                f"An earlier run measured the same dimensions as {size_label(same)}, recorded "
                f"as {label}, and kept its timelines; its forward and "
                f"training step at context {ctx}, {dtype}, are below (its other numbers are "
                f"replaced by the runs above). {_NO_PHASES} {res.cite_records([rec])}"
            )
        )
        out += [
            Image(str(cells[(ctx, dtype)][mode].resolve()), f"{label}, context {ctx}, {mode}")
            for mode in ("forward", "train-step")
        ]
        break
    return out


def _residual_answers(res: Results) -> list[Block]:
    rows = res.rows("residuals")
    blocks = [
        r
        for r in ok(rows)
        if r[residual_keys.kind] == "block" and r[residual_keys.checkpointing] == "none"
    ]
    out: list[Block] = []
    for b in blocks:
        ops = [
            r
            for r in rows
            if r[residual_keys.kind] == "operation"
            and r.get(residual_keys.cell) == b.get(residual_keys.cell)
        ]
        top = ", ".join(
            f"{r[residual_keys.operation]} {fmt(r[residual_keys.mib])} MiB "
            f"({r[residual_keys.share]:.0%})"
            for r in ops
        )
        kept = [
            r
            for r in ok(rows)
            if r[residual_keys.kind] == "block"
            and r[residual_keys.checkpointing] == "block"
            and (r[residual_keys.size], r[residual_keys.ctx], r[residual_keys.dtype])
            == (b[residual_keys.size], b[residual_keys.ctx], b[residual_keys.dtype])
        ]
        d, f = b[residual_keys.d_model], b[residual_keys.d_ff]
        expected = (2 * d + 4 * d * d + 3 * d * f) * 4 / MIB
        text = (
            f"(f) One {size_label(b)} block at context {b[residual_keys.ctx]} "
            f"({b[residual_keys.dtype]}, batch "
            f"{b[residual_keys.batch]}) keeps {fmt(b[residual_keys.mib])} MiB for backward "
            f"({fmt(b[residual_keys.saved_mib])} "
            f"MiB counting every save, as a saved-tensor hook adds them); the five largest "
            f"contributors: {top}. Its backward produces {fmt(b[residual_keys.grad_mib])} MiB of "
            f"gradients: {fmt(b[residual_keys.param_grad_mib])} MiB for its weights, "
            + ratio_word(
                b[residual_keys.param_grad_mib] / expected,
                more="more than",
                less="less than",
                same="as expected from",
                tolerance=0.01,
            )
            + f" its (2·d + 4·d² + 3·d·d_ff) fp32 parameters = {fmt(expected)} MiB, and "
            f"{fmt(b[residual_keys.input_grad_mib])} MiB for its input"
        )
        from_memory = num(b, residual_keys.grad_from_memory_mib)
        if from_memory is not None:
            where = relation(from_memory, b[residual_keys.grad_mib])
            text += (
                f"; read from the allocator (change over the backward plus the freed "
                f"residuals) it is {fmt(from_memory)} MiB, "
                + {
                    "above": "above the gradients' own bytes: the allocator also counts the "
                    "backward's temporaries still alive when it ends",
                    "level with": "matching the gradients' own bytes",
                    "below": "below the gradients' own bytes: some were freed or reused "
                    "before the backward ended",
                }[where]
            )
        if kept:
            text += (
                f". Under activation checkpointing the block keeps only "
                f"{fmt(kept[0][residual_keys.mib])} MiB (its input) and recomputes the rest in "
                "backward"
            )
        out.append(said(res, text + ".", [b, *ops, *kept]))
    if out:
        out.append(Paragraph(_NO_NSIGHT_F))
    return out


# (f) asks for Nsight Systems screenshots; the machines measured had no Nsight Systems.
_NO_NSIGHT_F = (
    "(f) Nsight Systems was not available on the GPU machines these runs used, so there are no "
    "Nsight screenshots: the saved-tensor hook's tables (what each operation saved, below) and "
    "the allocator's readings stand in for them."
)
