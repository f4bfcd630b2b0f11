"""§9 of the 2026 handout: the leaderboard's training step, on one GPU and on two.

The leaderboard times a full step of its 8B model (34 blocks, context 32,768, batch 2, bf16) on
two B200s. What this project measured and predicts instead, each cited with its file:

- `step_leaderboard_*` (bench-step): the full step on two GPUs (`--preset leaderboard-2026`:
  ours on zero.FSDP and on ZeRO-1 beside the torch-native step on FSDP2), and the model cut to
  the blocks that fit one GPU, ours beside a torch-native step: the time ratio, where the time
  goes, MFU;
- `flash_leaderboard_*` (bench-flash): the attention alone at the leaderboard's shape, fa2
  beside SDPA's flash and cuDNN backends;
- `ops_*` (bench-ops): the two tricks the handout's list suggests that are not attention, the
  fused LM-head loss and fused AdamW, against torch;
- `plan_leaderboard_*` and `plan_check_*` (bench-plan): the prediction for the full step on two
  GPUs, and how far its model was from the measured one-GPU peaks.
"""

from __future__ import annotations

import math
import re

from bench.core.hardware import peak_tflops
from bench.report.claims import direction, speed_against
from bench.report.document import Block, Paragraph
from bench.report.results import SOURCE, Results, Rows, fmt, grouped, num, ok
from bench.report.single_gpu import said
from bench.tools import flash, ops, plan, step
from bench.tools.model.profile import CATEGORIES
from bench.tools.step.profile import kernel_parity
from lmcore import MODEL_SIZES

__all__ = ["FULL_RUN", "answer_leaderboard"]

step_keys, flash_keys, ops_keys, plan_keys = step.KEYS, flash.KEYS, ops.KEYS, plan.KEYS
_MODEL = "leaderboard-8b"
_BLOCKS = MODEL_SIZES[_MODEL].num_layers
# The leaderboard's setting (§9): batch 2 on two GPUs.
_HANDOUT_GPUS, _HANDOUT_BATCH = 2, 2

# What the full step needs, said where nothing measured it.
FULL_RUN = (
    "two GPUs: the leaderboard's own two B200s, or for bench-step's `--preset "
    f"leaderboard-2026` (the {_BLOCKS}-block model, batch 2 over two ranks, ours on zero.FSDP "
    "and on ZeRO-1 beside FSDP2) two GPUs of at least 80 GB such as two H100s or H200s"
)


def answer_leaderboard(res: Results) -> list[Block]:
    """What was run on one GPU, its ratio to torch, where the time goes, MFU, the attention
    and fused-op comparisons, the prediction for the full step, and what was not run."""
    full = _full_step(res)
    out = [
        *full,
        *_step(res),
        *_kernel_split(res),
        *_attention(res),
        *_fused_ops(res),
        *_prediction(res),
    ]
    if out and not full:
        step_runs = res.runs("step", stem="step_leaderboard")
        when = (
            f" for the runs of {str(step_runs[-1].run.date)[:10]}, made on one "
            f"{step_runs[-1].run.env.get('device_name')}"
            if step_runs
            else ""
        )
        out.append(
            Paragraph(
                f"Not run: the leaderboard's own measurement, the full {_BLOCKS}-block step at "
                "batch 2 "
                f"on two GPUs. It needs {FULL_RUN}; two such GPUs were not available{when}."
            )
        )
    return out


def _kernel_split(res: Results) -> list[Block]:
    """The newest `bench-step --profile` run: each of ours' rows beside the torch-native row,
    rank 0's whole step, kernel time by category (`bench.tools.step.profile`)."""
    rows = res.rows("step-profile", latest=True)
    step_rows = [r for r in rows if r.get("rank") == 0 and r.get("phase") == "all"]
    by_row: dict[str, dict[str, dict]] = {}
    for r in step_rows:
        key = r["category"] if r.get("kind") == "category" else "phase"
        by_row.setdefault(r["row"], {})[key] = r
    native = next((v for k, v in by_row.items() if k.startswith("torch-native")), None)
    ours = {k: v for k, v in by_row.items() if k.startswith("ours")}
    if native is None or not ours or "phase" not in native:
        return []
    run = res.record_of(step_rows[0]).run
    at_parity = {p["row"]: p for p in kernel_parity(rows) if p["rank"] == 0}
    out: list[Block] = []
    for label, mine in ours.items():
        if "phase" not in mine:
            continue
        parts = [
            f"{cat} {fmt(mine[cat]['total_ms'] if cat in mine else 0)} against "
            f"{fmt(native[cat]['total_ms'] if cat in native else 0)} ms"
            for cat in CATEGORIES
            if cat in mine or cat in native
        ]
        text = (
            f"Kernel by kernel (`bench-step --profile`: one more step per row under "
            f"torch.profiler, rank 0, on {run.env.get('device_name')}): ours ({label}) runs "
            f"{fmt(mine['phase']['kernel_ms'])} ms of kernels in its step against the "
            f"torch-native step's {fmt(native['phase']['kernel_ms'])} ms; by category, "
            + ", ".join(parts)
            + "."
        )
        parity = at_parity.get(label)
        if parity is not None:
            text += (
                f" With every category at the faster of the two rows' time (ours' own exposed "
                f"communication and idle time kept: `kernel_parity`), ours' step would take "
                f"{fmt(parity['at_parity_ms'])} ms, {parity['at_parity_vs_native']:.3f}× the "
                f"torch-native step's {fmt(parity['native_step_ms'])} ms: as far as matching "
                "the faster kernels alone could take it."
            )
        cited = [mine["phase"], native["phase"], *(v for k, v in mine.items() if k != "phase")]
        out.append(said(res, text, cited))
    return out


def _is_full(row: dict) -> bool:
    """A row of the full step: every block, on two ranks or more."""
    return row.get(step_keys.num_layers) == _BLOCKS and (row.get("world_size") or 1) > 1


def _when(res: Results, row: dict) -> tuple[str, int]:
    """When a row's run was made (the date its file records, then its place by name)."""
    return str(res.record_of(row).run.date), row[SOURCE]


def _newest(res: Results, rows: Rows) -> Rows:
    """The rows of the newest result file among `rows`."""
    if not rows:
        return []
    newest = max(_when(res, r) for r in rows)[1]
    return [r for r in rows if r[SOURCE] == newest]


# How the full step's layouts are named in prose.
_LAYOUT_NAMES = {
    "fsdp": "zero.FSDP (the blocks, the embedding and the LM head as units)",
    "zero1": "ZeRO-1 (ddp.DDPBucketed + zero.ShardedOptimizer)",
    "fsdp:torch": "torch's FSDP2",
}


# What a checkpointing policy other than the plain ones does, said where its rows are.
_POLICY_GLOSS = {
    "selective": "every block recomputed in backward but for its attention, whose output and "
    "logsumexp are kept",
}


def _by_checkpointing(rows: Rows) -> list[Rows]:
    """`rows` split by their checkpointing policy, in the order the policies first appear."""
    groups: dict[str, Rows] = {}
    for r in rows:
        groups.setdefault(r[step_keys.activation_checkpointing], []).append(r)
    return list(groups.values())


def _split(rows: Rows) -> tuple[Rows, Rows]:
    """(ours, torch-native) rows that have a step time."""
    timed = [r for r in rows if num(r, step_keys.step_ms)]
    return (
        [r for r in timed if r[step_keys.impl] == "ours"],
        [r for r in timed if r[step_keys.impl] == "torch-native"],
    )


def _full_step(res: Results) -> list[Block]:
    """The full step on two GPUs or more, one paragraph per world size (two ranks first, the
    handout's) and checkpointing policy, each from the newest run of that policy (the preset's
    policy first): each row's time, first step and peak, ours as ratios to the torch-native row
    of its policy; then what more ranks did to the step and its throughput."""
    full = _every_full_row(res)
    preset = step.PRESETS["leaderboard-2026"]["activation_checkpointing"]
    out: list[Block] = []
    best: list[dict] = []
    for _, rows in sorted(grouped(full, "world_size").items(), key=lambda kv: kv[0][0]):
        groups = [_newest(res, group) for group in _by_checkpointing(rows)]
        groups.sort(key=lambda g: g[0][step_keys.activation_checkpointing] not in preset)
        for index, group in enumerate(groups):
            ours, native = _split(group)
            if ours:
                out.append(_full_step_paragraph(res, ours, native, again=index > 0))
            out += _earlier_peaks(res, rows, group)
        ours = [r for group in groups for r in _split(group)[0]]
        if ours:
            best.append(min(ours, key=lambda r: r[step_keys.step_ms]))
    if len(best) >= 2:
        out.append(_scaling(res, best[0], best[-1]))
    return out + _capped_step(res)


# How far (relative) a torch-native peak measured again may be from an earlier one before the
# report says that it moved.
_PEAK_MOVED = 0.05


def _every_full_row(res: Results, *, capped: bool = False) -> Rows:
    """The full step's rows of every run, earlier ones too (which `Results.rows` leaves out),
    each tagged with its source: the runs on whole GPUs, or (`capped`) those whose ranks'
    allocators `--memory` capped (stand-ins for smaller GPUs), out-of-memory rows included."""
    index = {id(r): i for i, r in enumerate(res.records)}
    return [
        {**row, SOURCE: index[id(record)]}
        for record in res.runs("step", stem="step_leaderboard")
        if bool(_cap(record)) == capped
        for row in (record.run.rows if capped else ok(record.run.rows))
        if _is_full(row)
    ]


def _cap(record) -> int | None:
    """The `--memory` a full step ran with, or None: bench-step caps each rank's allocator at it
    (the leaderboard's GPUs all have more), so the run stands in for smaller GPUs."""
    return record.run.config.get("memory_bytes")


def _capped_step(res: Results) -> list[Block]:
    """The newest full step run with each rank's allocator capped: each row's time and peak, or
    that it ran out of memory."""
    rows = _newest(res, _every_full_row(res, capped=True))
    if not rows:
        return []
    run = res.record_of(rows[0]).run
    cap, world = _cap(res.record_of(rows[0])), rows[0].get("world_size")

    def row_text(r: dict) -> str:
        layout = _LAYOUT_NAMES.get(r.get("layout"), r.get("layout"))
        if not num(r, step_keys.step_ms):
            return f"{layout}: out of memory"
        text = f"{layout}: {fmt(r[step_keys.step_ms])} ms, peak {fmt(r[step_keys.peak_mib])} MiB"
        if num(r, step_keys.time_vs_native):
            text += f" ({r[step_keys.time_vs_native]:.2f}× the torch-native step's time)"
        return text

    text = (
        f"The same step with each rank's allocator capped at {cap / 1e9:g} GB (`--memory`, "
        f"on {world} {run.env.get('device_name')} GPUs: a stand-in for {world} GPUs of that "
        "memory, whose CUDA context and NCCL buffers come on top of it there too): "
        + "; ".join(row_text(r) for r in rows)
        + "."
    )
    return [said(res, text, rows)]


def _earlier_peaks(res: Results, rows: Rows, newest: Rows) -> list[Block]:
    """Where an earlier run among `rows` (one world size's, every run's) of the same rows
    (checkpointing, layout) as `newest` measured the torch-native peak more than `_PEAK_MOVED`
    away from the newest run's: both peaks, ours beside them, so a peak ratio is read as one
    run's."""
    source, world, now_when = newest[0][SOURCE], newest[0].get("world_size"), _when(res, newest[0])
    same = (step_keys.activation_checkpointing, "layout")
    out: list[Block] = []
    for now in newest:
        if now[step_keys.impl] != "torch-native" or not num(now, step_keys.peak_mib):
            continue
        before = [
            r
            for r in rows
            if _when(res, r) < now_when
            and r[step_keys.impl] == "torch-native"
            and all(r.get(k) == now.get(k) for k in same)
            and num(r, step_keys.peak_mib)
        ]
        moved = [
            r
            for r in before
            if abs(r[step_keys.peak_mib] / now[step_keys.peak_mib] - 1) > _PEAK_MOVED
        ]
        if not moved:
            continue
        old = max(moved, key=lambda r: _when(res, r))
        ours = {
            r[SOURCE]: r
            for r in rows
            if r[SOURCE] in (source, old[SOURCE])
            and r[step_keys.impl] == "ours"
            and r.get("layout") == "fsdp"
            and r[step_keys.activation_checkpointing] == now[step_keys.activation_checkpointing]
        }
        text = (
            f"The torch-native peak of the {now[step_keys.activation_checkpointing]}-checkpointed "
            f"step on {world} GPUs is not the same from run to run: an earlier run measured "
            f"{fmt(old[step_keys.peak_mib])} MiB where this one measured "
            f"{fmt(now[step_keys.peak_mib])} MiB"
        )
        if len(ours) == 2:
            a, b = ours[old[SOURCE]], ours[source]
            text += (
                f", while ours on zero.FSDP measured {fmt(a[step_keys.peak_mib])} and "
                f"{fmt(b[step_keys.peak_mib])} MiB"
            )
        out.append(said(res, text + "; a peak ratio is one run's.", [old, now, *ours.values()]))
    return out


def _full_step_paragraph(res: Results, ours: Rows, native: Rows, *, again: bool = False) -> Block:
    """One policy's rows of one run; `again`: the run's setting was said for another policy."""
    first = ours[0]
    device = res.record_of(first).run.env.get("device_name")
    world = first.get("world_size")
    handout = world == _HANDOUT_GPUS and first[step_keys.batch] * world == _HANDOUT_BATCH
    policy = first[step_keys.activation_checkpointing]
    gloss = f" ({_POLICY_GLOSS[policy]})" if policy in _POLICY_GLOSS else ""

    def row_text(r: dict) -> str:
        layout = _LAYOUT_NAMES.get(r.get("layout"), r.get("layout"))
        text = (
            f"{layout}: {fmt(r[step_keys.step_ms])} ms a step (first step "
            f"{fmt(r[step_keys.first_step_ms])} ms), peak {fmt(r[step_keys.peak_mib])} MiB on "
            "the busiest rank"
        )
        if num(r, step_keys.time_vs_native) and num(r, step_keys.peak_vs_native):
            text += (
                f", {r[step_keys.time_vs_native]:.2f}× the torch-native step's time ("
                f"{speed_against(1 / r[step_keys.time_vs_native], 'it')}) and "
                f"{r[step_keys.peak_vs_native]:.2f}× its peak"
            )
        return text

    if again:
        what = f"The same step on the same {world} GPUs with {policy} checkpointing{gloss}"
    else:
        what = (
            "The leaderboard's own step, measured" if handout else "The full step on more GPUs"
        ) + (
            f": all {_BLOCKS} blocks, batch {first[step_keys.batch] * world} over {world} "
            f"{device} GPUs (one sequence per rank), {first[step_keys.ctx]:,} tokens a sequence, "
            f"{first[step_keys.precision]}, each block compiled, {policy} checkpointing{gloss}"
            + ("; the leaderboard itself runs on two B200s" if handout else "")
        )
    text = (
        f"{what}. Ours ({first[step_keys.attention]} attention, {first[step_keys.loss]} loss, "
        f"{first[step_keys.optimizer]} AdamW with moments in the parameters' dtype) on "
        + "; on ".join(row_text(r) for r in ours)
        + "."
    )
    if native:
        n = native[0]
        text += (
            f" The torch-native step ({n[step_keys.attention]} attention, {n[step_keys.loss]} "
            f"cross-entropy, {n[step_keys.optimizer]} AdamW) on {row_text(n)}."
        )
    return said(res, text, [*ours, *native])


def _scaling(res: Results, few: dict, many: dict) -> Block:
    """Ours at the fewest and the most ranks: the same batch per rank, so a step that keeps its
    time multiplies the throughput by the ranks' ratio (words from `claims`)."""
    k = step_keys
    n0, n1 = few["world_size"], many["world_size"]
    text = (
        f"From {n0} to {n1} GPUs, one sequence per rank either way, our fastest step "
        f"{direction(few[k.step_ms], many[k.step_ms])} ({fmt(few[k.step_ms])} to "
        f"{fmt(many[k.step_ms])} ms) and its peak {direction(few[k.peak_mib], many[k.peak_mib])} "
        f"({fmt(few[k.peak_mib])} to {fmt(many[k.peak_mib])} MiB, the shards of parameters, "
        f"gradients and AdamW state {n0}/{n1} as large)"
    )
    if num(few, k.tokens_per_s) and num(many, k.tokens_per_s):
        gain = many[k.tokens_per_s] / few[k.tokens_per_s]
        text += (
            f"; tokens per second grow {gain:.2f}× for {n1 / n0:g}× the GPUs "
            f"({gain / (n1 / n0):.0%} scaling efficiency)"
        )
    return said(res, text + ".", [few, many])


def _step(res: Results) -> list[Block]:
    rows = _newest(
        res, [r for r in ok(res.rows("step", stem="step_leaderboard")) if not _is_full(r)]
    )
    groups = [(ours, native) for ours, native in map(_split, _by_checkpointing(rows)) if ours]
    if not groups:
        return []
    every_ours = [r for ours, _ in groups for r in ours]
    every_native = [r for _, native in groups for r in native]
    best = min(every_ours, key=lambda r: r[step_keys.step_ms])
    device = res.record_of(best).run.env.get("device_name")
    full = _BLOCKS
    label = best.get(step_keys.size_label) or best[step_keys.size]
    blocks = (
        f"the handout's leaderboard model fits one {device} whole with its AdamW state, so "
        f"bench-step ran all {full} blocks ({label})"
        if best[step_keys.num_layers] >= full
        else f"the handout's leaderboard model does not fit one {device} with its AdamW "
        f"state, so bench-step ran it cut to {best[step_keys.num_layers]} of its {full} blocks "
        f"({label}), the most whose predicted peak fits (`--num-layers fit`)"
    )
    policies = [ours[0][step_keys.activation_checkpointing] for ours, _ in groups]
    optimizers = list(dict.fromkeys(r[step_keys.optimizer] for r in every_ours))
    native = every_native[0] if every_native else None
    what = (
        f"On one GPU: {blocks}, on one sequence "
        f"of {best[step_keys.ctx]:,} tokens (batch {best[step_keys.batch]}), "
        f"{best[step_keys.precision]}: ours ({best[step_keys.attention]} attention, "
        f"{best[step_keys.loss]} loss, "
        f"{' and '.join(policies)} checkpointing, "
        f"{'compiled' if best.get(step_keys.compiled) else 'eager'}) with "
        + " and with ".join(f"{name} AdamW" for name in optimizers)
        + (
            f", beside a torch-native step ({native[step_keys.attention]}, "
            f"{native[step_keys.loss]} "
            f"cross-entropy, {native[step_keys.optimizer]} AdamW, the same checkpointing)."
            if native
            else "."
        )
    )
    out = [said(res, what, [best, *every_native])]
    for ours, natives in groups:
        if not natives:
            continue
        n = natives[0]
        policy = n[step_keys.activation_checkpointing]
        lead = (
            f"With {policy} checkpointing"
            + (f" ({_POLICY_GLOSS[policy]})" if policy in _POLICY_GLOSS else "")
            + ": the"
            if len(groups) > 1
            else "The"
        )
        each = "; ".join(
            f"with {r[step_keys.optimizer]} AdamW {fmt(r[step_keys.step_ms])} ms, "
            f"{n[step_keys.step_ms] / r[step_keys.step_ms]:.2f}× as fast as the torch-native step "
            "(peak "
            f"{fmt(r[step_keys.peak_mib])} MiB, {fmt(r[step_keys.state_mib])} MiB of it AdamW "
            "state)"
            for r in ours
        )
        out.append(
            said(
                res,
                f"{lead} ratio to the torch-native step, which takes {fmt(n[step_keys.step_ms])} "
                f"ms (peak {fmt(n[step_keys.peak_mib])} MiB, {fmt(n[step_keys.state_mib])} MiB "
                f"of it AdamW state): ours {each}.",
                [*ours, n],
            )
        )
    phases = [best.get(k) for k in (step_keys.fwd_ms, step_keys.bwd_ms, step_keys.opt_ms)]
    if all(isinstance(p, int | float) for p in phases):
        fwd, bwd, opt = phases
        text = (
            f"Where the time goes (ours, {best[step_keys.activation_checkpointing]} "
            f"checkpointing, {best[step_keys.optimizer]} AdamW): forward {fmt(fwd)} "
            "ms, "
            f"backward with its recomputation {fmt(bwd)} ms, optimizer {fmt(opt)} ms"
        )
        if num(best, step_keys.attn_ms) and num(best, step_keys.attn_time_share):
            text += (
                f"; the attention alone {fmt(best[step_keys.attn_ms])} ms, "
                f"{best[step_keys.attn_time_share]:.0%} of the step"
                + (
                    f" for {best[step_keys.attn_flop_share]:.0%} of its FLOPs"
                    if num(best, step_keys.attn_flop_share)
                    else ""
                )
            )
        out.append(said(res, text + ".", [best]))
    if num(best, step_keys.mfu) and num(best, step_keys.mfu_ceiling_tflops):
        mfu, ceiling = best[step_keys.mfu], best[step_keys.mfu_ceiling_tflops]
        peak = peak_tflops(str(device), "bf16")
        if peak and math.isclose(ceiling, peak):  # bench-step had no measured ceiling
            against = (
                f"the data sheet's dense bf16 peak, {fmt(peak)} TFLOP/s (no matmul ceiling of "
                f"the {device} is measured here)"
            )
        else:
            of_peak = (
                f" ({mfu * ceiling / peak:.0%} of the data sheet's dense bf16 peak, "
                f"{fmt(peak)} TFLOP/s)"
                if peak
                else ""
            )
            against = f"the GPU's measured bf16 matmul ceiling, {fmt(ceiling)} TFLOP/s{of_peak}"
        text = f"MFU: {mfu:.0%} of {against}; matmul FLOPs only, recomputation not counted."
        out.append(said(res, text, [best]))
    return out


def _attention(res: Results) -> list[Block]:
    rows = ok(res.rows("flash", stem="flash_leaderboard", latest=True))
    by_impl = {r[flash_keys.impl]: r for r in rows if num(r, flash_keys.fwd_bwd_ms)}
    ours = by_impl.get("fa2-triton")
    if ours is None:
        return []
    others = [r for name, r in by_impl.items() if name.startswith("sdpa")]
    parts = "; ".join(
        f"{r[flash_keys.impl]} {fmt(r[flash_keys.fwd_bwd_ms])} ms ({_against(ours, r)})"
        for r in others
    )
    text = (
        f"Attention alone at the leaderboard's shape ({ours[flash_keys.batch]} sequence-heads of "
        f"{ours[flash_keys.seq]:,} tokens, d {ours[flash_keys.d]}, causal, "
        f"{ours[flash_keys.dtype]}): fa2-triton's "
        f"forward + backward takes {fmt(ours[flash_keys.fwd_bwd_ms])} ms (backward "
        f"{fmt(ours[flash_keys.bwd_ms])} ms); {parts}."
    )
    return [said(res, text, [ours, *others])]


def _against(ours: dict, other: dict) -> str:
    """Who is faster, fa2 or `other`, and by how much, forward + backward (backward apart)."""
    ratio = other[flash_keys.fwd_bwd_ms] / ours[flash_keys.fwd_bwd_ms]
    faster = (
        f"fa2 is {ratio:.2f}× as fast as it"
        if ratio >= 1
        else f"{other[flash_keys.impl]} is {1 / ratio:.2f}× as fast as fa2"
    )
    return f"{faster}; backward {fmt(other[flash_keys.bwd_ms])} ms"


def _fused_ops(res: Results) -> list[Block]:
    rows = ok(res.rows("ops", latest=True))
    loss = [
        r
        for r in rows
        if r.get(ops_keys.study) == "loss" and r.get(ops_keys.shape) == "leaderboard"
    ]
    adamw = [r for r in rows if r.get(ops_keys.study) == "adamw"]
    fused_loss = next((r for r in loss if r[ops_keys.impl] == "fused"), None)
    biggest = max((r[ops_keys.shape] for r in adamw), key=lambda s: _params(adamw, s), default=None)
    fused_adamw = next(
        (r for r in adamw if r[ops_keys.impl] == "lmcore-fused" and r[ops_keys.shape] == biggest),
        None,
    )
    if fused_loss is None and fused_adamw is None:
        return []
    parts = []
    cited: Rows = []
    if fused_loss is not None:
        parts.append(
            f"the fused LM-head loss at the leaderboard's shape ({fused_loss[ops_keys.about]}, "
            f"vocabulary {fused_loss[ops_keys.vocab]:,}) takes {fmt(fused_loss[ops_keys.ms])} ms, "
            f"{fused_loss[ops_keys.vs_baseline]:.2f}× as fast as torch's compiled loss, and needs "
            f"{fmt(fused_loss[ops_keys.extra_mib])} MiB beyond its inputs, "
            f"{fused_loss[ops_keys.extra_vs_baseline]:.2f}× the compiled loss's (which holds the "
            f"{fmt(fused_loss[ops_keys.logits_mib])} MiB of logits)"
        )
        cited.append(fused_loss)
    if fused_adamw is not None:
        parts.append(
            f"lmcore's fused AdamW steps {fused_adamw[ops_keys.size]} in "
            f"{fmt(fused_adamw[ops_keys.ms])} ms, "
            f"{fused_adamw[ops_keys.vs_baseline]:.2f}× as fast as torch's fused AdamW"
        )
        cited.append(fused_adamw)
    text = (
        'Two of the handout\'s suggestions for the leaderboard (§9: "Implement fused AdamW" '
        'and a kernel that "fuses the LM head and your cross-entropy loss"), measured '
        "against torch: " + "; ".join(parts) + "."
    )
    return [said(res, text, cited)]


def _params(rows: Rows, shape: str) -> float:
    return max((num(r, ops_keys.params) or 0.0) for r in rows if r[ops_keys.shape] == shape)


def _prediction(res: Results) -> list[Block]:
    rows = res.rows("plan_leaderboard", latest=True)
    if not rows:
        return []
    config = res.record_of(rows[0]).run.config
    model = config.get("model", {})
    out: list[Block] = []
    for size in ("80gb", "141gb"):
        peak_key = f"peak_{size}"
        fits = [r for r in rows if num(r, peak_key) is not None]
        if not fits:
            continue
        forms = "; ".join(
            f"{r[plan_keys.precision]} {r[plan_keys.layout]} {r[plan_keys.loss]} loss "
            f"{r[plan_keys.optimizer]} AdamW, "
            f"checkpointing {r[f'ckpt_{size}']}: {fmt(r[peak_key])} GiB, communication "
            f"{fmt(r[plan_keys.comm_ms])} ms against {fmt(r[plan_keys.compute_ms])} ms of matmuls"
            for r in sorted(fits, key=lambda r: r[peak_key])
        )
        gb = size.removesuffix("gb")
        if size == "80gb":
            out.append(
                said(
                    res,
                    f"Prediction for the full step (bench-plan): all {model.get('num_layers')} "
                    f"blocks, batch {config.get('batch')} × {model.get('context_length'):,} "
                    f"tokens on {config.get('devices')} GPUs, communication at "
                    f"{fmt(config.get('bandwidth_gbps'))} GB/s and matmuls at "
                    f"{fmt(config.get('tflops'))} TFLOP/s (both measured by this project; "
                    f"the matmul time is at that ceiling). With {gb} GB per GPU {len(fits)} of "
                    f"{len(rows)} forms fit: {forms}.",
                    fits,
                )
            )
        else:
            note = next(
                (n for n in res.record_of(rows[0]).run.notes if n.startswith(f"{gb} GB per GPU")),
                None,
            )
            text = (
                f"With {note}" if note else f"With {gb} GB per GPU {len(fits)} of {len(rows)} fit."
            )
            out.append(said(res, text, fits))
    checks = [
        r
        for r in res.rows("plan_check", latest=True)
        if str(r.get(plan_keys.source, "")).startswith("step_leaderboard")
        and r.get(plan_keys.quantity) == "peak"
        and num(r, plan_keys.error_pct) is not None
    ]
    if checks:
        by_file: dict[str, list[str]] = {}
        for r in checks:
            by_file.setdefault(r[plan_keys.source], []).append(
                f"{_checked_row(r[plan_keys.config])}: {r[plan_keys.error_pct]:+.1f} %"
            )
        errors = "; ".join(f"`{name}`: {', '.join(rows)}" for name, rows in by_file.items())
        out.append(
            said(
                res,
                "The same model's predictions of the measured steps' peaks (bench-plan's check; "
                f"positive: it predicted more than was measured): {errors}.",
                checks,
            )
        )
    return out


# The layout in a checked row's configuration (`..., bf16, ZERO1 2, fa2-triton ...`).
_CHECKED_LAYOUT = re.compile(r", (1 device|[A-Z0-9:-]+ \d+),")


def _checked_row(config: str) -> str:
    """A plan-check row of a bench-step result named by its side and layout (`ours (ZERO1 2)`)."""
    side = "torch-native" if "torch-native" in config else "ours"
    layout = _CHECKED_LAYOUT.search(config)
    return f"{side} ({layout[1]})" if layout else side
