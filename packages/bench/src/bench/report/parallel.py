"""§5.1, §6 and §7 of the 2026 handout: communication, optimizer-state sharding and FSDP, and
what every distributed run trained (`run_shape`, `run_world`, `run_dims`); DDP's answers read
them in `bench.report.data_parallel`."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from bench.plan.check import dims_on
from bench.report.claims import direction, growth_exponent, ratio_word, speed_against
from bench.report.document import Block, Paragraph, Table
from bench.report.results import (
    DIM_KEYS,
    SOURCE,
    Record,
    Results,
    Rows,
    fmt,
    grouped,
    num,
    ok,
    size_label,
)
from bench.report.runs import (
    ALLREDUCE_GLOO_FULL,
    ALLREDUCE_MORE_GPUS,
    FSDP_PLAN,
    FSDP_TRACES,
    GpuRun,
)
from bench.report.single_gpu import said
from bench.report.trace_timeline import NO_NSIGHT, trace_images
from bench.tools import allreduce, plan, sharding
from lmcore import MODEL_SIZES

__all__ = [
    "answer_allreduce",
    "answer_fsdp_accounting",
    "answer_fsdp_tests",
    "answer_sharding",
    "answer_tests",
    "run_dims",
    "run_shape",
    "run_world",
]

allreduce_keys, zero_keys = allreduce.KEYS, sharding.KEYS
plan_keys = plan.KEYS


def run_dims(record: Record) -> dict[str, int] | None:
    """The dimensions a distributed run trained: its config's `shape` where it recorded one,
    else what its size's name meant on its date (`bench.plan.check.dims_on`); None when the
    run names no size lmcore knows."""
    config = record.run.config
    shape: dict[str, Any] = config.get("shape") or {}
    if all(shape.get(k) is not None for k in DIM_KEYS):
        return {k: int(shape[k]) for k in DIM_KEYS}
    name = config.get("size") or shape.get("name")
    if name not in MODEL_SIZES:
        return None
    return dict(zip(DIM_KEYS, dims_on(name, str(record.run.date)), strict=True))


def run_world(record: Record) -> int:
    """The ranks a distributed run used: its config's `world_size` or `nproc`, else the GPUs
    its machine had (2 when it says neither)."""
    config, env = record.run.config, record.run.env
    return int(config.get("world_size") or config.get("nproc") or env.get("gpu_count") or 2)


def run_shape(record: Record) -> str:
    """The model a distributed run trained, with its dimensions (names changed in 2026), its
    context and batch per rank."""
    config = record.run.config
    name = config.get("size") or (config.get("shape") or {}).get("name") or "?"
    dims = run_dims(record)
    label = size_label({"size": name, **(dims or {})}, date=str(record.run.date))
    return f"{label}, context {config.get('context_length')}, batch {config.get('batch')}"


def _setup(res: Results, rows: Rows) -> str:
    records = {id(res.record_of(r)): res.record_of(r) for r in rows}.values()
    return "; ".join(
        f"{run_shape(rec)} on {run_world(rec)}× {rec.run.env.get('device_name')}" for rec in records
    )


def answer_allreduce(res: Results) -> list[Block]:
    """The table of every (backend, processes) column, what was not run and why, and what the
    rows say of latency, bandwidth and process count (words from `claims`)."""
    k = allreduce_keys
    rows = res.rows("allreduce")  # gloo's cells measured on a CPU alone included
    if not rows:
        return []
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
    gaps = _allreduce_not_run(res, rows, measured, combos, sizes)
    if gaps:
        out.append(Paragraph(gaps))
    for (backend,), group in grouped(measured, k.backend).items():
        text = _allreduce_reading(backend, group)
        if text:
            out.append(said(res, text, group))
    return out


# The handout's grid: gloo and NCCL on 2, 4 and 6 processes (§5.1).
_HANDOUT_COMBOS = tuple((b, w) for b in ("gloo", "nccl") for w in (2, 4, 6))


def _allreduce_not_run(
    res: Results, rows: Rows, measured: Rows, combos: list[tuple[str, int]], sizes: list[float]
) -> str:
    """The table's empty cells and why: a whole column the machines could not hold (NCCL needs a
    GPU per process, and no run here had that many), or cells a run skipped, with the reason
    the tool recorded and the command that fills them."""
    k = allreduce_keys
    done = {(r[k.backend], r[k.world_size], r[k.size_mb]) for r in measured}
    gpus = max(
        [
            int(rec.run.env.get("gpu_count") or 0)
            for rec in res.runs("allreduce")
            if res.current(rec)
        ]
        + [r[k.world_size] for r in measured if r[k.backend] == "nccl"],
        default=0,
    )
    parts, too_few, skipped = [], [], []
    skipped_sizes: set[float] = set()
    for backend, world in combos:
        empty = [s for s in sizes if (backend, world, s) not in done]
        if not empty:
            continue
        if backend == "nccl" and world > gpus:
            too_few.append(world)
            parts.append(
                f"nccl at {world} processes (a GPU per process on one node; the machines "
                f"these runs had held at most {gpus})"
            )
            continue
        reasons = {
            str(r[k.status]).removeprefix("skipped: ")
            for r in rows
            if (r[k.backend], r[k.world_size]) == (backend, world)
            and r[k.size_mb] in empty
            and r[k.status] != "ok"
        }
        why = "; ".join(sorted(reasons)) or "not in the run"
        where = (
            "" if len(empty) == len(sizes) else " at " + ", ".join(f"{fmt(s)} MB" for s in empty)
        )
        parts.append(f"{backend} at {world} processes{where} ({why})")
        if backend == "gloo":
            skipped.append(world)
            skipped_sizes.update(empty)
    if not parts:
        return ""
    text = "Not run: " + "; ".join(parts) + "."
    if too_few:
        text += (
            f" NCCL at {' and '.join(map(str, too_few))} processes needs that many GPUs on one "
            f"node: {_filled(ALLREDUCE_MORE_GPUS, too_few).sentence()}."
        )
        if max(too_few) > _LENT_GPUS:
            text += (
                f" Machines of more than {_LENT_GPUS} GPUs were not lent for these runs, so "
                "those columns stay empty."
            )
    if skipped:
        text += (
            " gloo runs on the CPU and needs no GPU, so its empty cells are runs not made, not "
            f"hardware missing: {_filled(ALLREDUCE_GLOO_FULL, skipped, skipped_sizes).sentence()}."
        )
    return text


# The most GPUs of one machine lent for the measured runs (allreduce_4xh200_2026-11-28).
_LENT_GPUS = 4


def _filled(run: GpuRun, nproc: list[int], sizes: set[float] | None = None) -> GpuRun:
    """`run` with the process counts (and sizes) a table lacks filled into its command."""
    sizes_mb = " ".join(f"{s:g}" for s in sorted(sizes or ()))
    return replace(run, command=run.command.format(nproc=" ".join(map(str, nproc)), sizes=sizes_mb))


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
    # more processes, within the one result that measured the most process counts (rows of
    # two runs, on two machines, are not set against each other); the newest on a tie
    runs = grouped(group, SOURCE)
    if runs:
        (_, widest) = max(
            runs.items(), key=lambda run: (len({r[k.world_size] for r in run[1]}), run[0])
        )
        counts = sorted({r[k.world_size] for r in widest})
        by = {(r[k.world_size], r[k.size_mb]): r for r in widest}
        common = [s for s in sorted({s for _, s in by}) if all((w, s) in by for w in counts)]
        if len(counts) >= 2 and common:
            parts.append(
                _process_reading(by[(counts[0], common[-1])], by[(counts[-1], common[-1])])
            )
    if not parts:
        return ""
    return f"{backend}: " + "; ".join(parts) + "."


def _process_reading(first: dict[str, Any], last: dict[str, Any]) -> str:
    """What more processes do to one size's all-reduce: the time against what a ring's traffic
    alone predicts (each rank sends 2(n−1)/n of the data), and the bus bandwidth's direction."""
    k = allreduce_keys
    n0, n1, size = first[k.world_size], last[k.world_size], first[k.size_mb]
    text = (
        f"at {fmt(size)} MB, going from {n0} to {n1} processes the time "
        f"{direction(first[k.ms], last[k.ms])} ({fmt(first[k.ms])} to {fmt(last[k.ms])} ms)"
    )
    if not (num(first, k.busbw_gbps) and num(last, k.busbw_gbps)):
        return text
    ring = (2 * (n1 - 1) / n1) / (2 * (n0 - 1) / n0)
    bus = direction(first[k.busbw_gbps], last[k.busbw_gbps])
    text += (
        f": each rank of a ring sends 2(n−1)/n of the data, {ring:.2g}× as much at {n1} as at "
        f"{n0}, and the time grows {last[k.ms] / first[k.ms]:.2g}×, so the bus bandwidth "
        f"{bus} ({fmt(first[k.busbw_gbps])} to {fmt(last[k.busbw_gbps])} GB/s)"
    )
    return (
        text
        + {
            "rises": ": more ranks move data at once",
            "stays level": ": the links run as fast with more ranks",
            "falls": ": the ranks contend for the links (gloo: for the host's memory, cores)",
        }[bus]
    )


# Time ∝ size^p between two sizes: below this p a fixed per-call cost dominates (ten times the
# data in well under ten times the time), above the other the bytes do.
_LATENCY_BOUND, _BANDWIDTH_BOUND = 0.5, 0.85


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
    # §6's rows in fp32 (bench-plan's prediction is fp32): FSDP rows of another dtype left out
    measured = {
        r.get(zero_keys.variant): r
        for r in ok(res.rows("zero"))
        if r.get(zero_keys.compute_dtype) in (None, "fp32")
        and r.get(zero_keys.storage_dtype) in (None, "fp32")
    }
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
    dims = run_dims(res.record_of(row)) or {}
    return "({}/{}/{}L/{}H".format(*(dims.get(k) for k in DIM_KEYS))


def _fsdp_traces(res: Results) -> list[Block]:
    """(b): whether the all-gathers finish in time, from the newest run whose FSDP rows were
    traced (or the newest FSDP rows): per compute dtype, zero.FSDP's step and the share of its
    all-gather time beside compute, against the same without prefetching and torch's FSDP2;
    then the timelines, in place of Nsight Systems screenshots."""
    k = zero_keys
    fsdp = [r for r in ok(res.rows("zero")) if str(r.get(k.variant, "")).startswith("fsdp")]
    if not fsdp:
        return [Paragraph(f"(b) Not run: {FSDP_TRACES.sentence()}. {NO_NSIGHT}")]
    traced = [r for r in fsdp if num(r, k.gather_overlap) is not None]
    record = res.record_of((traced or fsdp)[-1])
    rows = [r for r in fsdp if res.record_of(r) is record]
    images = trace_images(res, record, variants=[r[k.variant] for r in rows])
    parts = [
        _gather_reading(group, compute, storage)
        for (compute, storage), group in grouped(rows, k.compute_dtype, k.storage_dtype).items()
    ]
    text = f"(b) ({_setup(res, rows)}) " + "; ".join(p for p in parts if p) + "."
    text += f" {NO_NSIGHT} " + (
        "One more step of each FSDP row ran under torch.profiler; its timeline below stands in "
        "for them, rank 0's compute and communication (NCCL) lanes on one time axis (the share "
        "in each timeline's title counts every collective, the reduce-scatters too, so it "
        "differs from the all-gathers' share above)."
        if images
        else f"No trace was kept: {FSDP_TRACES.sentence()}."
    )
    return [said(res, text, rows), *images]


def _gather_reading(rows: Rows, compute: str | None, storage: str | None) -> str:
    """One compute dtype's FSDP rows: zero.FSDP's step and hidden all-gather share, against
    no prefetching and torch's FSDP2 (words from `claims`)."""
    k = zero_keys
    by = {r[k.variant]: r for r in rows}
    ours = by.get("fsdp")
    if ours is None:
        return ""
    stored = f", stored in {storage}" if storage and storage != "fp32" else ""
    text = f"{compute} compute{stored}: zero.FSDP takes {fmt(ours[k.step_ms])} ms a step"
    share = num(ours, k.gather_overlap)
    if share is not None:
        text += (
            f", {share:.0%} of its all-gather kernel time beside a compute kernel (hidden), "
            f"{1 - share:.0%} with none (exposed)"
        )
    for variant, name, against in (
        ("fsdp:no-prefetch", "without prefetching", "the same without prefetching"),
        ("fsdp:torch", "torch's FSDP2", "FSDP2"),
    ):
        other = by.get(variant)
        if other is None:
            continue
        text += (
            f"; {name} {fmt(other[k.step_ms])} ms"
            + (
                f" with {other[k.gather_overlap]:.0%} beside compute"
                if num(other, k.gather_overlap) is not None
                else ""
            )
            + f", so zero.FSDP is {speed_against(other[k.step_ms] / ours[k.step_ms], against)}"
        )
    return text


def _world(res: Results, row: dict[str, Any]) -> int:
    """The ranks of the run a row came from."""
    return run_world(res.record_of(row))
