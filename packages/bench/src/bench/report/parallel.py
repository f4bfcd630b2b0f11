"""§5–§7 and §9 of the 2026 handout: communication, DDP, optimizer-state sharding, FSDP and the
leaderboard."""

from __future__ import annotations

from typing import Any

from bench.report.claims import direction, growth_exponent, ratio_word, speed_against
from bench.report.document import Block, Paragraph, Table
from bench.report.results import (
    DIM_KEYS,
    Record,
    Results,
    Rows,
    fmt,
    grouped,
    num,
    ok,
    size_label,
)
from bench.report.runs import ALLREDUCE_MORE_GPUS, DDP_TRACES, FSDP_PLAN, FSDP_TRACES
from bench.report.single_gpu import said
from bench.report.trace_timeline import NO_NSIGHT, trace_images
from bench.tools import allreduce, data_parallel, plan, sharding
from lmcore import describe_size

__all__ = [
    "answer_allreduce",
    "answer_ddp",
    "answer_fsdp_accounting",
    "answer_fsdp_tests",
    "answer_sharding",
    "answer_tests",
    "run_shape",
]

allreduce_keys, ddp_keys, zero_keys = allreduce.KEYS, data_parallel.KEYS, sharding.KEYS
plan_keys = plan.KEYS


def run_shape(record: Record) -> str:
    """The model a distributed run trained, with its dimensions (names changed in 2026)."""
    shape: dict[str, Any] = record.run.config.get("shape") or {}
    if not shape:
        return str(record.run.config.get("size", "?"))
    return (
        f"{size_label({'size': shape.get('name'), **shape})}, "
        f"context {record.run.config.get('context_length')}, batch "
        f"{record.run.config.get('batch')}"
    )


def _setup(res: Results, rows: Rows) -> str:
    records = {id(res.record_of(r)): res.record_of(r) for r in rows}.values()
    return "; ".join(
        f"{run_shape(rec)} on {rec.run.env.get('gpu_count')}× {rec.run.env.get('device_name')}"
        for rec in records
    )


def answer_allreduce(res: Results) -> list[Block]:
    """The table of every (backend, processes) column, what was not run and why, and what the
    rows say of latency, bandwidth and process count (words from `claims`)."""
    rows = res.rows("allreduce")
    if not rows:
        return []
    k = allreduce_keys
    combos = sorted({(r[k.backend], r[k.world_size]) for r in rows} | set(_HANDOUT_COMBOS))
    sizes = sorted({r[k.size_mb] for r in rows})
    found = {(r[k.backend], r[k.world_size], r[k.size_mb]): r for r in rows}
    table = [
        {
            "size_mb": size,
            **{
                f"{b} ×{w} (ms)": (
                    found[(b, w, size)][k.ms]
                    if num(found.get((b, w, size), {}), k.ms) is not None
                    else "not run"
                )
                for b, w in combos
            },
        }
        for size in sizes
    ]
    out: list[Block] = [
        said(res, "All-reduce of float32 tensors, median time of the slowest rank:", rows),
        Table(table, list(table[0])),
    ]
    measured = [r for r in ok(rows) if num(r, k.ms)]
    missing = [
        (b, w)
        for b, w in combos
        if not any((r[k.backend], r[k.world_size]) == (b, w) for r in measured)
    ]
    if missing:
        out.append(Paragraph(_allreduce_not_run(rows, missing)))
    for (backend,), group in grouped(measured, k.backend).items():
        text = _allreduce_reading(backend, group)
        if text:
            out.append(said(res, text, group))
    return out


# The handout's grid: gloo and NCCL on 2, 4 and 6 processes (§5.1).
_HANDOUT_COMBOS = tuple((b, w) for b in ("gloo", "nccl") for w in (2, 4, 6))


def _allreduce_not_run(rows: Rows, missing: list[tuple[str, int]]) -> str:
    """The columns without a measurement, with the reason the tool recorded (or none)."""
    k = allreduce_keys
    parts = []
    for backend, world in missing:
        reasons = {
            str(r[k.status]).removeprefix("skipped: ")
            for r in rows
            if (r[k.backend], r[k.world_size]) == (backend, world) and r[k.status] != "ok"
        }
        why = f" ({'; '.join(sorted(reasons))})" if reasons else " (not in the run)"
        parts.append(f"{backend} at {world} processes{why}")
    nccl = sorted(w for b, w in missing if b == "nccl" and w > 2)
    hardware = (
        f" NCCL at {' and '.join(map(str, nccl))} processes needs a GPU per process on one node: "
        f"{ALLREDUCE_MORE_GPUS.sentence()}."
        + (
            " Machines of 8 GPUs, the only ones with 6 or more, were not lent for these runs, so "
            "the 6-process column stays empty."
            if max(nccl) > 4
            else ""
        )
        if nccl
        else ""
    )
    return "Not run: " + ", ".join(parts) + "." + hardware


def _allreduce_reading(backend: str, group: Rows) -> str:
    """Latency- or bandwidth-bound from the growth of time with size (at the fewest processes),
    and what more processes do at the largest size measured at every process count."""
    k = allreduce_keys
    worlds = sorted({r[k.world_size] for r in group})
    # one row a size (the last one read, where two results measured it)
    few = sorted(
        {r[k.size_mb]: r for r in group if r[k.world_size] == worlds[0]}.values(),
        key=lambda r: r[k.size_mb],
    )
    parts = []
    if len(few) >= 2:
        pairs = [(few[0], few[1])] + ([(few[-2], few[-1])] if len(few) > 2 else [])
        for a, b in pairs:
            p = growth_exponent(a[k.size_mb], a[k.ms], b[k.size_mb], b[k.ms])
            bound = (
                "latency-bound (a fixed cost per call dominates)"
                if p < _LATENCY_BOUND
                else "bandwidth-bound"
                if p > _BANDWIDTH_BOUND
                else "between latency- and bandwidth-bound"
            )
            parts.append(
                f"from {fmt(a[k.size_mb])} to {fmt(b[k.size_mb])} MB the time grows "
                f"{b[k.ms] / a[k.ms]:.2g}× for {b[k.size_mb] / a[k.size_mb]:g}× the data: {bound}"
            )
        top = few[-1]
        if num(top, k.busbw_gbps) is not None:
            parts.append(
                f"at {fmt(top[k.size_mb])} MB it moves {fmt(top[k.busbw_gbps])} GB/s (bus)"
            )
    if len(worlds) >= 2:
        common = [
            s
            for s in sorted({r[k.size_mb] for r in group})
            if all(any(r[k.size_mb] == s and r[k.world_size] == w for r in group) for w in worlds)
        ]
        if common:
            size = common[-1]
            at = sorted((r for r in group if r[k.size_mb] == size), key=lambda r: r[k.world_size])
            first, last = at[0], at[-1]
            parts.append(
                f"at {fmt(size)} MB, going from {first[k.world_size]} to {last[k.world_size]} "
                f"processes the time {direction(first[k.ms], last[k.ms])} "
                f"({fmt(first[k.ms])} to {fmt(last[k.ms])} ms)"
                + (
                    f" while the bus bandwidth {direction(first[k.busbw_gbps], last[k.busbw_gbps])}"
                    f" ({fmt(first[k.busbw_gbps])} to {fmt(last[k.busbw_gbps])} GB/s): each rank "
                    "of a ring sends 2(n−1)/n of the data, so the time grows toward twice the "
                    "two-process time at the same bandwidth"
                    if num(first, k.busbw_gbps) and num(last, k.busbw_gbps)
                    else ""
                )
            )
    if not parts:
        return ""
    return f"{backend}: " + "; ".join(parts) + "."


# Time ∝ size^p between two sizes: below this p a fixed per-call cost dominates (ten times the
# data in well under ten times the time), above the other the bytes do.
_LATENCY_BOUND, _BANDWIDTH_BOUND = 0.5, 0.85


# bench-ddp's rows an answer sets beside its own: the model alone, the plain wrappers, torch's.
_COMPARED = ("single", "ddp:naive", "ddp:flat", "ddp:individual", "ddp:torch")


def answer_ddp(variant: str, label: str):
    """An answer quoting one DDP variant's step and communication time against the others."""

    def answer(res: Results) -> list[Block]:
        rows = [r for r in ok(res.rows("ddp")) if num(r, ddp_keys.step_ms)]
        mine = [r for r in rows if r.get(ddp_keys.variant) == variant]
        if not mine:
            return []
        r = mine[0]
        text = (
            f"{label} ({_setup(res, [r])}): {fmt(r[ddp_keys.step_ms])} ms per step"
            + (
                f", {fmt(r[ddp_keys.comm_ms])} ms of it communicating"
                if num(r, ddp_keys.comm_ms)
                else ""
            )
            + (
                f", {fmt(r[ddp_keys.overhead_ms])} ms beyond one GPU"
                if num(r, ddp_keys.overhead_ms)
                else ""
            )
        )
        others = [o for o in rows if o is not r and o.get(ddp_keys.variant) in _COMPARED]
        if others:
            text += "; beside " + ", ".join(
                f"{o[ddp_keys.case]} {fmt(o[ddp_keys.step_ms])} ms" for o in others
            )
        if num(r, ddp_keys.hidden_e2e) is not None:
            hidden = r[ddp_keys.hidden_e2e]
            text += f"; it hides {hidden:.0%} of a standalone all-reduce of the gradients"
        out: list[Block] = [said(res, text + ".", [r, *others])]
        if variant == "ddp:naive":
            out.append(_size_note(res, rows))
        if variant == "ddp:flat":
            out += _flat_against_naive(res, rows)
        if variant == "ddp:individual":
            out += [*_individual_against_others(res, rows), *_ddp_traces(res)]
        return out

    return answer


def _flat_against_naive(res: Results, rows: Rows) -> list[Block]:
    """§5.3.1's comparison: one all-reduce of the flattened gradients against one per gradient."""
    k = ddp_keys
    flat, naive = (_variant(rows, v) for v in ("ddp:flat", "ddp:naive"))
    if flat is None or naive is None:
        return []
    ratio = naive[k.step_ms] / flat[k.step_ms]
    text = (
        "Batching the gradients into one all-reduce makes the step "
        f"{speed_against(ratio, 'one all-reduce per gradient')}: {fmt(flat[k.step_ms])} against "
        f"{fmt(naive[k.step_ms])} ms"
    )
    if num(flat, k.comm_ms) is not None and num(naive, k.comm_ms) is not None:
        text += (
            f", communicating {fmt(flat[k.comm_ms])} against {fmt(naive[k.comm_ms])} ms"
            + ratio_word(
                naive[k.comm_ms] / flat[k.comm_ms],
                more=f": one call pays the per-call cost once instead of "
                f"{naive.get(k.collectives) or 'once per gradient'} times, and a large message "
                "runs at the link's bandwidth",
                less=": here the many small calls took less time than the one large one",
                same=": the call count does not change the communication time here",
            )
        )
    return [said(res, text + ".", [flat, naive])]


def _individual_against_others(res: Results, rows: Rows) -> list[Block]:
    """§5.3.2 (a)'s comparison: overlapping each gradient's all-reduce with the backward against
    naive and flat DDP, with what the rows say of why."""
    k = ddp_keys
    ind, flat, naive = (_variant(rows, v) for v in ("ddp:individual", "ddp:flat", "ddp:naive"))
    if ind is None or flat is None:
        return []
    versus = f"flat DDP's {fmt(flat[k.step_ms])} ms"
    if naive is not None:
        versus += f" and naive DDP's {fmt(naive[k.step_ms])} ms"
    text = (
        "(a) Overlapping each gradient's all-reduce with the backward makes the step "
        f"{speed_against(flat[k.step_ms] / ind[k.step_ms], 'flat DDP')}: {fmt(ind[k.step_ms])} "
        f"ms against {versus}"
    )
    wait, overhead = num(ind, k.wait_ms), num(ind, k.overhead_ms)
    if wait is not None and overhead is not None and num(ind, k.comm_ms) is not None:
        slower = overhead - wait
        text += (
            f". Its {ind.get(k.collectives)} all-reduces take {fmt(ind[k.comm_ms])} ms in all "
            f"(flat's one: {fmt(flat[k.comm_ms]) if num(flat, k.comm_ms) else '?'} ms), "
            f"and only {fmt(wait)} ms of them are left after the backward; but the step is "
            f"{fmt(overhead)} ms longer than one GPU's, so the backward itself ran "
            f"{fmt(slower)} ms longer"
            + ratio_word(
                slower / max(wait, 1e-9),
                more=": the many small collectives, each latency-bound, share the GPU with the "
                "backward's kernels and slow it by more than the overlap hides",
                less=": the overlap hides most of the communication",
                same=", as much as the wait it saved",
            )
        )
    return [said(res, text + ".", [r for r in (ind, flat, naive) if r is not None])]


def _variant(rows: Rows, variant: str) -> dict[str, Any] | None:
    return next((r for r in rows if r.get(ddp_keys.variant) == variant), None)


def _ddp_traces(res: Results) -> list[Block]:
    """§5.3.2 (b): the traced steps of naive and overlapped DDP drawn as timelines, in place of
    Nsight Systems screenshots; or the command that makes them."""
    k = ddp_keys
    traced = [r for r in ok(res.rows("ddp")) if num(r, k.comm_overlap) is not None]
    images = [img for rec in res.runs("ddp") if res.current(rec) for img in trace_images(res, rec)]
    if not images:
        return [Paragraph(f"(b) {NO_NSIGHT} Not run: {DDP_TRACES.sentence()}.")]
    text = (
        f"(b) {NO_NSIGHT} A torch.profiler trace of one step per wrapper stands in for them, "
        "drawn below as its compute and communication lanes (rank 0)"
    )
    if traced:
        text += ": the share of all-reduce kernel time that ran beside compute is " + ", ".join(
            f"{r[k.case]} {r[k.comm_overlap]:.0%}" for r in traced
        )
    return [said(res, text + ".", traced), *images]


def _sharding_reading(sharded: dict[str, Any], world: int) -> str:
    """(a)'s "as expected" and (b)'s "slower" from the sharded row's ratios to DDP."""
    k = zero_keys
    text = ""
    if num(sharded, k.state_vs_ddp) is not None:
        share = sharded[k.state_vs_ddp]
        text += f", {share:.2f}× plain DDP's" + ratio_word(
            share * world,
            more=f", more than the 1/{world} of ZeRO stage 1",
            less=f", less than the 1/{world} of ZeRO stage 1",
            same=f", the 1/{world} ZeRO stage 1 keeps",
        )
    return text


def _sharding_time(sharded: dict[str, Any]) -> str:
    k = zero_keys
    if num(sharded, k.time_vs_ddp) is None:
        return ""
    ratio = sharded[k.time_vs_ddp]
    return f"(b) A step takes {fmt(sharded[k.step_ms])} ms, {ratio:.2f}× DDP's: " + ratio_word(
        ratio,
        more="slower, as the broadcast of the updated parameters adds a transfer DDP does not "
        "make.",
        less="faster, though the broadcast of the updated parameters adds a transfer DDP does "
        "not make: stepping half the optimizer state saves more than it costs.",
        same="about DDP's, though the broadcast of the updated parameters adds a transfer "
        "DDP does not make: it is small beside the step.",
    )


def _size_note(res: Results, rows: Rows) -> Paragraph:
    return Paragraph(
        f"These runs trained {_setup(res, rows)}. The 2026 handout's "
        f"{describe_size('xl')} needs `bench-ddp --size xl` on two GPUs of one node; that run "
        "has not been made."
    )


def answer_sharding(res: Results) -> list[Block]:
    rows = ok(res.rows("zero"))
    if not rows:
        return []
    table = [
        {
            k: r.get(k)
            for k in (
                zero_keys.variant,
                zero_keys.init_mib,
                zero_keys.before_step_mib,
                zero_keys.after_step_mib,
                zero_keys.param_mib,
                zero_keys.grad_mib,
                zero_keys.state_mib,
                zero_keys.step_ms,
            )
        }
        for r in rows
        if r.get(zero_keys.variant) in ("ddp:torch", "zero1:torch-ddp", "zero1:torch")
    ]
    sharded = next((r for r in rows if r.get(zero_keys.variant) == "zero1:torch-ddp"), None)
    out: list[Block] = [Table(table, list(table[0]))] if table else []
    if sharded:
        text = (
            f"(a) ({_setup(res, [sharded])}) With the optimizer state sharded each rank keeps "
            f"{fmt(sharded[zero_keys.state_mib])} MiB of AdamW state"
            + _sharding_reading(sharded, _world(res, sharded))
            + f"; parameters ({fmt(sharded[zero_keys.param_mib])} MiB) and gradients "
            f"({fmt(sharded[zero_keys.grad_mib])} MiB) stay whole, as ZeRO stage 1 leaves them. "
            + _sharding_time(sharded)
        )
        out.insert(0, said(res, text, rows))
    out.append(
        Paragraph(
            "(c) ZeRO stage 1 (P_os) reduce-scatters the gradients, so each rank receives only "
            "its shard's averaged gradients, steps its shard and all-gathers the parameters: "
            "the same communication volume as DDP's all-reduce (a reduce-scatter plus an "
            "all-gather). This implementation keeps DDP's full all-reduce and then broadcasts "
            "each updated parameter from its owner, one more full-model transfer per step, and "
            "shards whole parameters (balanced by size) rather than a flat buffer."
        )
    )
    return out


def answer_tests(prefixes: tuple[str, ...], what: str):
    """An answer quoting the official suites' outcome for tests whose module is in `prefixes`."""

    def answer(res: Results) -> list[Block]:
        rows = [r for r in res.rows("official_tests") if r.get("test", "").startswith(prefixes)]
        if not rows:
            return []
        by_suite = grouped(rows, "suite")
        parts = []
        for (suite,), group in by_suite.items():
            passed = sum(r["outcome"] == "passed" for r in group)
            failed = [r["test"] for r in group if r["outcome"] in ("failed", "error")]
            parts.append(
                f"{suite}: {passed} of {len(group)} passed"
                + (f" (failed: {', '.join(failed)})" if failed else "")
            )
        return [said(res, f"{what} The official suites' tests: " + "; ".join(parts) + ".", rows)]

    return answer


def answer_fsdp_tests(res: Results) -> list[Block]:
    out = answer_tests(("test_fsdp",), "`zero.FSDP` (`get_fsdp`).")(res)
    rows = res.rows("fsdp_last_bit")
    if rows:
        step0 = [r for r in rows if r["step"] == 0 and r["parameter"] == "linear1.weight"]
        differ = [r for r in rows if r["param_differ"]]
        if step0:
            r = step0[0]
            text = (
                f"`test_fsdp_correctness[fp32]` compares with `torch.equal`, which no exact FSDP "
                f"can pass on this CPU: the ideal average of the two ranks' gradients, "
                f"(g0 + g1) / 2, computed in one process, differs from the full-batch gradient "
                f"in {r['grad_differ']:,} of {r['numel']:,} elements of linear1.weight at step 0 "
                f"(at most {r['grad_max_abs']:.3g}), {r['param_differ']} of them still differ "
                f"after the SGD step, and {len(differ)} of {len(rows)} (threads, step, "
                "parameter) cells differ after the step (see `packages/zero/README.md`)."
            )
            out.append(said(res, text, rows))
    return out


def answer_fsdp_accounting(res: Results) -> list[Block]:
    """(a) from bench-plan's memory model, checked on §6's measured peaks; (b) the traced FSDP
    steps (all-gather beside compute), or what makes them."""
    return [*_fsdp_saving(res), *_fsdp_traces(res)]


def _fsdp_saving(res: Results) -> list[Block]:
    """(a): bench-plan's predicted peaks of DDP, ZeRO-1 and FSDP at §6's setting, the saving,
    and how close the same model came to §6's measured peaks."""
    k = plan_keys
    plan = [r for r in res.rows("plan", stem="plan_fsdp", latest=True) if num(r, k.peak_gib)]
    if not plan:
        return [Paragraph(f"(a) Not predicted yet: {FSDP_PLAN.sentence()}.")]
    measured = {r.get(zero_keys.variant): r for r in ok(res.rows("zero"))}
    out: list[Block] = []
    for (size,), group in grouped(plan, k.size).items():
        by_layout = {r[k.layout]: r for r in group}
        fsdp = by_layout.get("fsdp")
        if fsdp is None:
            continue
        first = group[0]
        parts = [
            f"{layout} {fmt(by_layout[layout][k.peak_gib] * 1024)} MiB"
            for layout in ("ddp:torch", "zero1:torch-ddp", "fsdp")
            if layout in by_layout
        ]
        text = (
            f"(a) bench-plan's memory model for {size} at §6's setting (context {first[k.ctx]}, "
            f"a global batch of {first[k.batch]} over {first[k.mesh]}, {first[k.precision]}, "
            f"{first[k.optimizer]} AdamW) predicts peaks per GPU of " + ", ".join(parts)
        )
        zero1 = by_layout.get("zero1:torch-ddp")
        if zero1 is not None:
            saved = (zero1[k.peak_gib] - fsdp[k.peak_gib]) * 1024
            text += ratio_word(
                zero1[k.peak_gib] / fsdp[k.peak_gib],
                more=f": FSDP saves {fmt(saved)} MiB ({saved / (zero1[k.peak_gib] * 1024):.0%}) "
                "of ZeRO-1's peak, since it shards the parameters and gradients as well as the "
                "optimizer state (each 1/N), leaving only the gathered units and activations "
                "whole",
                less=f": FSDP's peak is {fmt(-saved)} MiB above ZeRO-1's here, its gathered "
                "units and staging outweighing what sharding saves",
                same=": FSDP's peak is about ZeRO-1's here",
            )
        cited = list(group)
        checks = []
        for layout, row in by_layout.items():
            seen = measured.get(layout)
            if seen is None or not num(seen, zero_keys.after_step_mib):
                continue
            if _dims(seen, res) not in first[k.size]:
                continue
            error = row[k.peak_gib] * 1024 / seen[zero_keys.after_step_mib] - 1
            checks.append(f"{layout} {error:+.1%}")
            cited.append(seen)
        if checks:
            text += (
                ". The same model predicted §6's measured peaks of this size within "
                + ", ".join(checks)
                + " (predicted against measured)"
            )
        out.append(said(res, text + ".", cited))
    return out


def _dims(row: dict[str, Any], res: Results) -> str:
    """The dimensions a bench-zero row trained, as bench-plan's size labels write them."""
    shape = res.record_of(row).run.config.get("shape") or {}
    return "({}/{}/{}L/{}H".format(*(shape.get(k) for k in DIM_KEYS))


def _fsdp_traces(res: Results) -> list[Block]:
    """(b): the all-gathers of a traced FSDP step beside compute, or what makes them."""
    k = zero_keys
    rows = [r for r in ok(res.rows("zero")) if str(r.get(k.variant, "")).startswith("fsdp")]
    traced = [r for r in rows if num(r, k.gather_overlap) is not None]
    images = [img for rec in res.runs("zero") if res.current(rec) for img in trace_images(res, rec)]
    if not rows:
        return [Paragraph(f"(b) Not run: {FSDP_TRACES.sentence()}. {NO_NSIGHT}")]
    text = f"(b) ({_setup(res, rows)}) " + "; ".join(
        f"{r[k.variant]} ({r[k.compute_dtype]}): {fmt(r[k.step_ms])} ms per step"
        + (
            f", {r[k.gather_overlap]:.0%} of its all-gather kernel time beside compute"
            if num(r, k.gather_overlap) is not None
            else ""
        )
        for r in rows
    )
    text += f". {NO_NSIGHT}" + (
        " The traced step of each FSDP row stands in for them, drawn below as compute and "
        "communication lanes (rank 0)."
        if images
        else f" No trace was kept: {FSDP_TRACES.sentence()}."
    )
    return [said(res, text, traced or rows), *images]


def _world(res: Results, row: dict[str, Any]) -> int:
    """The ranks of the run a row came from (2 when it does not say)."""
    return int(res.record_of(row).run.config.get("world_size") or 2)
