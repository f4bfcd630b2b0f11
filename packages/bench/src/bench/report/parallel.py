"""§5–§7 and §9 of the 2026 handout: communication, DDP, optimizer-state sharding, FSDP and the
leaderboard."""

from __future__ import annotations

from typing import Any

from bench.report.document import Block, Paragraph, Table
from bench.report.results import Record, Results, Rows, fmt, grouped, num, ok, size_label
from bench.report.single_gpu import said
from bench.tools import allreduce, data_parallel, sharding
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
    rows = [r for r in ok(res.rows("allreduce")) if num(r, allreduce_keys.ms)]
    out: list[Block] = []
    for (backend, world), group in grouped(
        rows, allreduce_keys.backend, allreduce_keys.world_size
    ).items():
        group.sort(key=lambda r: r[allreduce_keys.size_mb])
        items = ", ".join(
            f"{fmt(r[allreduce_keys.size_mb])} MB {fmt(r[allreduce_keys.ms])} ms"
            + (
                f" ({fmt(r[allreduce_keys.busbw_gbps])} GB/s bus)"
                if num(r, allreduce_keys.busbw_gbps)
                else ""
            )
            for r in group
        )
        out.append(said(res, f"{backend}, {world} processes (median): {items}.", group))
    if rows:
        worlds = sorted({r[allreduce_keys.world_size] for r in rows})
        out.append(
            Paragraph(
                "Small tensors are bound by latency (the time barely changes from 1 MB to 10 "
                "MB), large ones by bandwidth, where NCCL over NVLink runs at hundreds of GB/s "
                "and gloo over host memory at a few; "
                + (
                    "more processes were not available on the machine measured "
                    f"(process counts {', '.join(map(str, worlds))}), the handout's 4 and 6 "
                    "need a node with that many GPUs."
                    if max(worlds) < 6
                    else "more processes move more data per rank around the ring."
                )
            )
        )
    return out


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
        return out

    return answer


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
            + (
                f", {sharded[zero_keys.state_vs_ddp]:.2f}× plain DDP's"
                if num(sharded, zero_keys.state_vs_ddp)
                else ""
            )
            + f"; parameters ({fmt(sharded[zero_keys.param_mib])} MiB) and gradients "
            f"({fmt(sharded[zero_keys.grad_mib])} MiB) stay whole, as expected of ZeRO stage 1. "
            + (
                f"(b) A step takes {fmt(sharded[zero_keys.step_ms])} ms, "
                f"{sharded[zero_keys.time_vs_ddp]:.2f}× "
                "DDP's: the broadcast of the updated parameters replaces nothing DDP does."
                if num(sharded, zero_keys.time_vs_ddp)
                else ""
            )
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
    rows = [r for r in ok(res.rows("zero")) if str(r.get(zero_keys.variant, "")).startswith("fsdp")]
    if not rows:
        return []
    r = rows[0]
    text = (
        f"(a) ({_setup(res, [r])}) FSDP keeps {fmt(r[zero_keys.param_mib])} MiB of parameters, "
        f"{fmt(r[zero_keys.grad_mib])} MiB of gradients and {fmt(r[zero_keys.state_mib])} MiB of "
        "optimizer "
        "state per rank, each 1/N of the whole"
        + (
            f"; its peak is {r[zero_keys.peak_vs_ddp]:.2f}× DDP's"
            if num(r, zero_keys.peak_vs_ddp)
            else ""
        )
        + "."
    )
    return [said(res, text, rows)]
