"""§3.2 of the 2026 handout: memory-optimal gradient checkpointing.

(a) is the recursive strategy and its cost; (b) the best one-level segment size for xl at batch
4, context 2048, twice: predicted from the residual study (fp32 residuals, naive attention) and
measured by bench-step's checkpointing study (one block's saved bytes A and input b, the k
lmcore chooses, the peaks of segments of k − 1, k and k + 1 blocks and of the nested form), each
said for what it is.
"""

from __future__ import annotations

import math
import re
from typing import Any

from bench.report.document import Block, Paragraph
from bench.report.results import OOM, Results, Rows, fmt, num, ok, size_label
from bench.report.runs import CHECKPOINTING_STUDY
from bench.report.single_gpu import said
from bench.tools import step
from bench.tools.model.residuals import RESIDUAL_KEYS as residual_keys

__all__ = ["answer_checkpointing"]

step_keys = step.KEYS

# bench-step's checkpointing-study note: A, b, the depth and the k lmcore chose.
_STUDY = re.compile(
    r"A = ([\d,.]+) MiB .*?b = ([\d,.]+) MiB .*?memory_optimal_segment_size\((\d+), b, A\) = (\d+)"
)


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
    """(a) the recursive strategy with its sketch; (b) predicted, measured, and which is which."""
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
    predicted, pick, residual = _predicted_segments(res)
    measured, study = _measured_segments(res)
    out += predicted + measured
    if residual is not None and study is not None:
        k, saved, setting, rows = study
        agree = (
            f"both choose {k} block{'s' if k != 1 else ''} per segment"
            if pick == k
            else f"they choose K = {pick} and k = {k}"
        )
        text = (
            f"Which is which: the prediction reasons from fp32 residuals with the naive "
            f"attention ({fmt(residual[residual_keys.mib])} MiB per block); the measurement ran "
            f"{setting} "
            f"(A = {saved} MiB per block); {agree}."
        )
        out.append(said(res, text, [residual, *rows]))
    return out


def _predicted_segments(
    res: Results,
) -> tuple[list[Block], int | None, dict[str, Any] | None]:
    """(b) from the residual study: the one-level segment size that minimises the peak; the
    blocks, the size chosen and the residual row of one block."""
    rows = [
        r
        for r in ok(res.rows("residuals"))
        if r[residual_keys.kind] == "block"
        and r[residual_keys.dtype] == "fp32"
        and r[residual_keys.ctx] == 2048
    ]
    plain = [r for r in rows if r[residual_keys.checkpointing] == "none"]
    kept = [r for r in rows if r[residual_keys.checkpointing] == "block"]
    if not (plain and kept):
        blocks = [
            Paragraph(
                "(b) Predicted: not measured; the prediction needs the residuals of one xl "
                "block at context 2048 (`bench-model --size xl --context-length 2048 --study "
                "residuals`, `handout_gpu.sh part2`)."
            )
        ]
        return blocks, None, None
    p, k = plain[-1], kept[-1]  # the newest study's (rows come oldest first)
    layers = model_layers(p)
    best = math.sqrt(layers * k[residual_keys.mib] / p[residual_keys.mib])
    choices = [s for s in range(1, layers + 1) if layers % s == 0]
    peak = {s: layers / s * k[residual_keys.mib] + s * p[residual_keys.mib] for s in choices}
    pick = min(peak, key=peak.get)
    text = (
        f"(b) Predicted from the residual study of §2.1.6 (fp32 residuals with the naive "
        f"attention, which saves the seq × seq softmax): with one level of recomputation and "
        "segments of K blocks, the backward holds N/K segment inputs of "
        f"{fmt(k[residual_keys.mib])} MiB "
        "each and, while a segment is recomputed, K blocks' residuals of "
        f"{fmt(p[residual_keys.mib])} "
        f"MiB each ({size_label(p)}, batch {p[residual_keys.batch]}, context 2048, fp32): "
        "activation peak ≈ "
        f"(N/K)·{fmt(k[residual_keys.mib])} + K·{fmt(p[residual_keys.mib])} MiB, least at K = "
        "√(N·input/residuals) "
        f"= {best:.2f}. Among segment sizes dividing N = {layers}: "
        + ", ".join(f"K={s}: {fmt(v / 1024)} GiB" for s, v in peak.items())
        + f", so K = {pick} (one checkpoint per block when the residuals dwarf the inputs)."
    )
    return [said(res, text, [p, k])], pick, p


def _describe_form(spec: str) -> str:
    if spec == "none":
        return "no checkpointing"
    if spec == "nested":
        return "nested, part (a)"
    blocks = spec.partition(":")[2]
    return f"segments of {blocks} block{'s' if blocks != '1' else ''}"


def _measured_segments(
    res: Results,
) -> tuple[list[Block], tuple[int, str, str, Rows] | None]:
    """(b) measured: bench-step's checkpointing study (A and b measured, k chosen by lmcore,
    the peaks of k − 1, k, k + 1 and nested); the blocks, and (k, A in MiB as written, the
    setting measured, its rows) where the study recorded them."""
    rows = res.rows("step", stem="step_checkpointing", latest=True)
    if not rows:
        blocks = [
            Paragraph(
                f"(b) Measured: not run; {CHECKPOINTING_STUDY.sentence()}, which measures one "
                "block's saved bytes, asks lmcore for the best segment size k and measures the "
                "peaks of segments of k − 1, k and k + 1 blocks and of the nested form."
            )
        ]
        return blocks, None
    record = res.record_of(rows[0])
    first = rows[0]
    study = next((m for note in record.run.notes if (m := _STUDY.search(note))), None)
    setup = (
        f"{first.get(step_keys.size_label) or size_label(first)}, batch {first[step_keys.batch]}, "
        "context "
        f"{first[step_keys.ctx]:,}, {first[step_keys.precision]}, {first[step_keys.attention]} "
        "attention, "
        f"{first[step_keys.loss]} loss, {first[step_keys.optimizer]} AdamW, on one "
        f"{record.run.env.get('device_name')}"
    )
    text = f"(b) Measured with bench-step's checkpointing study ({setup}): "
    if study:
        saved, inputs, n, k = study.groups()
        text += (
            f"one block saves A = {saved} MiB for backward and takes b = {inputs} MiB of "
            f"input; `lmcore.memory_optimal_segment_size({n}, b, A)` chooses k = {k}. "
        )

    def found(r: dict[str, Any]) -> str:
        if r.get(step_keys.status) == OOM:
            predicted = num(r, step_keys.pred_act_mib)
            extra = f" (predicted activations {fmt(predicted)} MiB)" if predicted else ""
            return f"out of memory{extra}"
        return (
            f"peak {fmt(r[step_keys.peak_mib])} MiB ({fmt(r[step_keys.act_mib])} MiB of it "
            "activations), "
            f"{fmt(r[step_keys.step_ms])} ms per step"
        )

    text += (
        "Measured: "
        + "; ".join(
            f"{_describe_form(r[step_keys.activation_checkpointing])}: {found(r)}" for r in rows
        )
        + "."
    )
    one_level = [
        r
        for r in ok(rows)
        if str(r[step_keys.activation_checkpointing]).startswith("segments:")
        and num(r, step_keys.peak_mib)
    ]
    if one_level:
        best = min(one_level, key=lambda r: r[step_keys.peak_mib])
        others = [r for r in one_level if r is not best]
        text += (
            f" Of the one-level forms, {_describe_form(best[step_keys.activation_checkpointing])} "
            f"has the lowest peak"
            + (
                "; "
                + ", ".join(
                    f"{_describe_form(r[step_keys.activation_checkpointing])} needs "
                    f"{fmt(r[step_keys.peak_mib] - best[step_keys.peak_mib])} MiB more"
                    for r in others
                )
                if others
                else ""
            )
        )
        nested = next(
            (r for r in ok(rows) if r[step_keys.activation_checkpointing] == "nested"), None
        )
        if nested and num(nested, step_keys.peak_mib) and num(nested, step_keys.step_ms):
            change = nested[step_keys.peak_mib] - best[step_keys.peak_mib]
            text += (
                f"; nesting {'lowers' if change < 0 else 'raises'} the peak by "
                f"{fmt(abs(change))} MiB at "
                f"{nested[step_keys.step_ms] / best[step_keys.step_ms]:.2f}× the time"
            )
        fixed = [
            best.get(k) for k in (step_keys.param_mib, step_keys.grad_mib, step_keys.state_mib)
        ]
        if all(isinstance(v, int | float) for v in fixed):
            predicted = (
                f", predicted {fmt(best[step_keys.pred_act_mib])} MiB from A and b"
                if num(best, step_keys.pred_act_mib)
                else ""
            )
            text += (
                f". These are whole-step peaks: parameters ({fmt(fixed[0])} MiB), gradients "
                f"(up to {fmt(fixed[1])} MiB) and AdamW state ({fmt(fixed[2])} MiB) sit under "
                "every form, and the forms differ in the activations on top ("
                f"{fmt(best[step_keys.act_mib])} MiB for "
                f"{_describe_form(best[step_keys.activation_checkpointing])}{predicted})"
            )
        text += "."
    setting = f"{first[step_keys.precision]} with {first[step_keys.attention]} attention"
    found = None if study is None else (int(study[4]), study[1], setting, rows)
    return [said(res, text, rows)], found


def model_layers(row: dict[str, Any]) -> int:
    """The number of blocks of the row's size (lmcore's table when the row does not say)."""
    from lmcore import MODEL_SIZES

    layers = row.get("num_layers")
    if layers:
        return int(layers)
    size = MODEL_SIZES.get(str(row.get("size")))
    return size.num_layers if size is not None else 1
