"""bench-plan's implementation: predict memory per device and communication per step of training,
without a GPU, as `run_plan(sweep)` (and `run_check`, `run_leaderboard`, `run_section8`), and the
`TOOL` its command runs.

What it predicts, its modes and the command line: `bench.commands.plan` (`bench-plan --help`).
"""

from __future__ import annotations

import argparse
import itertools
import sys
from collections.abc import Mapping, Sequence
from dataclasses import asdict, replace
from pathlib import Path
from typing import Any

import lmcore
from bench.commands.plan import PlanConfig
from bench.core.cli import usage_errors
from bench.core.layouts import LAYOUTS
from bench.core.memory import GIB
from bench.core.model_options import LOSSES
from bench.core.plots import Bars, hbar_plot, scatter_plot, stacked_bar_plot
from bench.core.results import Keys, Run
from bench.core.tool import Invocation, Tool
from bench.plan import ffn
from bench.plan.check import CHECK_COLUMNS, check_results
from bench.plan.collectives import (
    BANDWIDTH_SOURCE,
    DEFAULT_BANDWIDTH_GBPS,
    alternate_ring_all_reduce_seconds,
    ring_all_reduce_seconds,
)
from bench.plan.fit import (
    checkpointing_candidates,
    largest_batch,
    largest_seq_len,
    least_recompute,
    parse_memory,
)
from bench.plan.memory import (
    Checkpointing,
    MemoryEstimate,
    Phase,
    TrainingPlan,
    estimate_memory,
)
from bench.plan.traffic import StepTraffic, default_tflops, estimate_traffic

__all__ = [
    "KEYS",
    "PLAN_COLUMNS",
    "TOOL",
    "PlanConfig",
    "plot_plan",
    "run_check",
    "run_leaderboard",
    "run_plan",
    "run_section8",
]

# The CS336 spring-2026 leaderboard's step is lmcore's `LEADERBOARD_2026` (the handout's
# `Config` with its own vocabulary and context, its batch over its GPUs), predicted with
# attention through fa2's Triton kernels (a fused kernel; naive attention would hold
# 2·32·32,768² scores per block).
_BOARD = lmcore.LEADERBOARD_2026
_BOARD_ATTENTION = "fa2-triton"
# Its layouts over the two GPUs: each family with the gradient buckets of torch's DDP.
LEADERBOARD_LAYOUTS = ("ddp:torch", "zero1:torch-ddp", "fsdp", "tp")
# Memory per GPU the leaderboard prediction is asked for: an 80 GB H100 and a 141 GB H200.
LEADERBOARD_MEMORY = {"80 GB": parse_memory("80GB"), "141 GB": parse_memory("141GB")}

# The categories a peak is broken into, as (column, the capacity terms it sums).
_CATEGORIES = (
    ("params_gib", ("parameters", "master weights")),
    ("grads_gib", ("gradients",)),
    ("state_gib", ("optimizer state",)),
    ("activations_gib", ("activations", "autocast weight cache")),
    ("loss_gib", ("loss",)),
    ("buffers_gib", ("communication buffers", "buffers")),
    ("temporaries_gib", ("backward working set", "optimizer temporaries")),
)

PLAN_COLUMNS = [
    "table",
    "size",
    "ctx",
    "batch",
    "precision",
    "layout",
    "mesh",
    "attention",
    "checkpointing",
    "loss",
    "optimizer",
    *(c for c, _ in _CATEGORIES),
    "peak_gib",
    "peak_phase",
    "memory_gib",
    "fits",
    "max_batch",
    "max_ctx",
    "sent_gb",
    "comm_ms",
    "compute_ms",
    "phase",
    "term",
    "gib",
    "formula",
]
LEADERBOARD_COLUMNS = [
    "precision",
    "layout",
    "loss",
    "optimizer",
    "ckpt_80gb",
    "peak_80gb",
    "ckpt_141gb",
    "peak_141gb",
    "min_peak_gib",
    "min_peak_ckpt",
    "sent_gb",
    "comm_ms",
    "compute_ms",
]
SECTION8_COLUMNS = ["strategy", "quantity", "formula", "value", "why"]
# The printed predictions (`--wide`: every column and each configuration's formulas), most
# telling first: the configuration, its peak and fit, its communication.
PLAN_BRIEF = {
    "size": "size", "ctx": "ctx", "batch": "batch", "precision": "precision",
    "layout": "layout", "peak_gib": "peak_gib", "fits": "fits", "attention": "attention",
    "checkpointing": "ckpt", "loss": "loss", "sent_gb": "sent_gb", "comm_ms": "comm_ms",
    "compute_ms": "compute_ms", "max_batch": "max_batch", "max_ctx": "max_ctx", "mesh": "mesh",
    "optimizer": "optimizer", "peak_phase": "peak_phase",
}  # fmt: skip
# Every key of a row, for readers (bench-report).
KEYS = Keys(*PLAN_COLUMNS, *CHECK_COLUMNS, *LEADERBOARD_COLUMNS, *SECTION8_COLUMNS)


# --- predictions ------------------------------------------------------------------------------


def _gib(num_bytes: float | None) -> float | None:
    return None if num_bytes is None else num_bytes / GIB


def _categories(phase: Phase) -> dict[str, float]:
    return {
        column: sum(phase.bytes_of(name) for name in names) / GIB for column, names in _CATEGORIES
    }


def _mesh(plan: TrainingPlan) -> str:
    if plan.family == "single":
        return "1"
    if plan.family == "tp":
        return f"tp{plan.tp}"
    if plan.family == "fsdp-tp":
        return f"dp{plan.dp}×tp{plan.tp}"
    return f"dp{plan.dp}"


def _fits_text(estimate: MemoryEstimate, memory_bytes: int) -> str:
    peak = estimate.peak.total
    if peak <= memory_bytes:
        return f"yes ({(memory_bytes - peak) / GIB:,.1f} GiB free)"
    top = max(estimate.peak.terms, key=lambda t: t.num_bytes)
    return f"no: {(peak - memory_bytes) / GIB:,.1f} GiB over; largest: {top.name}"


def _plan_row(
    label: str,
    plan: TrainingPlan,
    estimate: MemoryEstimate,
    traffic: StepTraffic,
    memory_bytes: int | None,
) -> dict[str, Any]:
    peak = estimate.peak
    row: dict[str, Any] = {
        "table": "Predictions (GiB per device at its peak)",
        "size": label,
        "ctx": plan.tokens_per_sequence,
        "batch": plan.batch,
        "precision": plan.precision,
        "layout": plan.layout,
        "mesh": _mesh(plan),
        "attention": plan.model.attention,
        "checkpointing": plan.activation_checkpointing,
        "loss": plan.loss,
        "optimizer": plan.optimizer,
        **_categories(peak),
        "peak_gib": peak.total / GIB,
        "peak_phase": peak.name,
        "sent_gb": traffic.sent_bytes / 1e9,
        "comm_ms": traffic.communication_s * 1e3,
        "compute_ms": traffic.compute_s * 1e3,
    }
    if memory_bytes is not None:
        row["memory_gib"] = memory_bytes / GIB
        row["fits"] = _fits_text(estimate, memory_bytes)
        row["max_batch"] = largest_batch(plan, memory_bytes)
        row["max_ctx"] = largest_seq_len(plan, memory_bytes)
    return row


def _term_rows(label: str, estimate: MemoryEstimate, traffic: StepTraffic) -> list[dict]:
    table = f"Formulas: {label}, {estimate.plan.describe()}"
    rows = [
        {
            "table": table,
            "phase": "where",
            "term": term.name,
            "gib": term.num_bytes / GIB if term.num_bytes else None,
            "formula": term.formula,
        }
        for term in estimate.definitions
    ]
    rows += [
        {
            "table": table,
            "phase": estimate.peak.name,
            "term": term.name,
            "gib": term.num_bytes / GIB,
            "formula": term.formula,
        }
        for term in estimate.peak.terms
        if term.num_bytes
    ]
    rows += [
        {
            "table": table,
            "phase": "step communication",
            "term": f"{c.kind}: {c.what}" + (f" [{c.axis}]" if c.axis != "dp" else ""),
            "gib": c.sent_bytes / GIB,
            "formula": f"{c.formula}; {c.seconds(traffic.bandwidth_gbps) * 1e3:,.2f} ms",
        }
        for c in traffic.collectives
    ]
    return rows


def run_plan(sweep: PlanConfig, *, command: str | None = None, formulas: bool = True) -> Run:
    """Predict every configuration of `sweep`.

    Args:
        sweep: the configurations.
        command: the command line to record; the process's own when None.
        formulas: add each configuration's peak terms and collectives with their formulas.

    Returns:
        A `Run` (tool `"plan"`): a row per configuration (table "Predictions ...") with the peak
        broken into `_CATEGORIES` in GiB, the peak's phase, fit, largest batch and context, GB
        sent per device and ms of communication and compute; and, with `formulas`, a row per term
        of each peak and per collective (`term`, `gib`, `formula`).
    """
    rows: list[dict[str, Any]] = []
    terms: list[dict[str, Any]] = []
    sources: set[str] = set()
    default_bandwidth = sweep.bandwidth_gbps == DEFAULT_BANDWIDTH_GBPS
    bandwidth_source = BANDWIDTH_SOURCE if default_bandwidth else "given"
    for label, plan in sweep.plans():
        estimate = estimate_memory(plan)
        traffic = estimate_traffic(plan, bandwidth_gbps=sweep.bandwidth_gbps, tflops=sweep.tflops)
        sources.add(f"{traffic.tflops:g} TFLOP/s ({traffic.tflops_source})")
        rows.append(_plan_row(label, plan, estimate, traffic, sweep.memory_bytes))
        if formulas:
            terms += _term_rows(label, estimate, traffic)
    notes = [
        "Memory: the busiest device at the moment of its peak (peak_phase), in GiB (2^30 B); "
        "what torch.cuda.max_memory_allocated would report, without the CUDA context or the "
        "allocator's cache. params includes fp32 master weights; activations the saved "
        "residuals and autocast's bf16 weight copies; buffers DDP buckets, FSDP gathers and "
        "RoPE tables; temporaries a block's backward working set or the optimizer's.",
        f"Communication: GB (10^9 B) sent per device per step at W = {sweep.bandwidth_gbps:g} "
        f"GB/s ({bandwidth_source}); compute: lmcore's matmul FLOPs at "
        f"{'; '.join(sorted(sources))}.",
    ]
    if sweep.memory_bytes is not None:
        notes.append(
            f"fits: against {sweep.memory_bytes / 1e9:g} GB ({sweep.memory_bytes / GIB:,.1f} GiB) "
            "per device; max_batch and max_ctx: the largest batch (a multiple of dp) and context "
            "that fit with everything else unchanged."
        )
    return Run.create(
        "plan",
        [*rows, *terms],
        device="cpu",
        config=_sweep_config(sweep),
        command=command,
        title=f"bench-plan: predicted memory and communication ({sweep.mode})",
        columns=PLAN_COLUMNS,
        group_by="table",
        notes=notes,
        brief=PLAN_BRIEF,
    )


def _sweep_config(sweep: PlanConfig) -> dict[str, Any]:
    config = asdict(sweep)
    config["models"] = [[label, asdict(model)] for label, model in sweep.model_configs()]
    return config


# --- the leaderboard --------------------------------------------------------------------------


def run_leaderboard(
    *,
    command: str | None = None,
    bandwidth_gbps: float = DEFAULT_BANDWIDTH_GBPS,
    tflops: float | None = None,
    checkpointing: Sequence[str] | None = None,
) -> Run:
    """The leaderboard's step on 2 GPUs: what fits in 80 GB and in 141 GB per GPU, and with what.

    For each precision (`bf16`: the handout's model in bf16 with AdamW's moments in bf16;
    `bf16-master`: float32 master weights and moments), layout over the 2 GPUs (DDP, ZeRO-1,
    FSDP, TP), loss and optimizer, every activation-checkpointing form is predicted; each memory
    gets the one that recomputes least among those that fit (ties: the smaller peak), and the
    row gives the smallest peak any form reaches.

    Args:
        command: the command line to record; the process's own when None.
        bandwidth_gbps, tflops: W and the FLOP rate for the communication and compute columns.
        checkpointing: the forms to try (default: every form, `_checkpointing_candidates`).

    Returns:
        A `Run` (tool `"plan_leaderboard"`), a row per (precision, layout, loss, optimizer).
        The default checkpointing forms are `bench.plan.fit.checkpointing_candidates`.
    """
    config = _BOARD.config(attention=_BOARD_ATTENTION)
    candidates = list(checkpointing or checkpointing_candidates(config.num_layers))
    rows = []
    for precision, layout, loss, optimizer in itertools.product(
        ("bf16", "bf16-master"), LEADERBOARD_LAYOUTS, LOSSES, ("lmcore", "lmcore-fused")
    ):
        tensor = LAYOUTS[layout].tensor_parallel
        degrees = {"tp": _BOARD.num_gpus} if tensor else {"dp": _BOARD.num_gpus}
        base = TrainingPlan(
            config, batch=_BOARD.batch_size, precision=precision, layout=layout, loss=loss,
            optimizer=optimizer, **degrees,
        )  # fmt: skip
        estimates = [estimate_memory(replace(base, activation_checkpointing=c)) for c in candidates]
        row: dict[str, Any] = {
            "precision": precision,
            "layout": layout,
            "loss": loss,
            "optimizer": optimizer,
        }
        for key, memory in LEADERBOARD_MEMORY.items():
            best = least_recompute(estimates, memory)
            suffix = key.replace(" ", "").lower()
            row[f"ckpt_{suffix}"] = best.plan.activation_checkpointing if best else "does not fit"
            row[f"peak_{suffix}"] = _gib(best.peak.total) if best else None
        smallest = min(estimates, key=lambda e: e.peak.total)
        row["min_peak_gib"] = smallest.peak.total / GIB
        row["min_peak_ckpt"] = smallest.plan.activation_checkpointing
        chosen = next(
            (e.plan for e in estimates if e.plan.activation_checkpointing == row["ckpt_80gb"]),
            smallest.plan,
        )
        traffic = estimate_traffic(chosen, bandwidth_gbps=bandwidth_gbps, tflops=tflops)
        row["sent_gb"] = traffic.sent_bytes / 1e9
        row["comm_ms"] = traffic.communication_s * 1e3
        row["compute_ms"] = traffic.compute_s * 1e3
        rows.append(row)
    rate, rate_source = (tflops, "given") if tflops else default_tflops("bf16")
    notes = [
        f"Model: the handout's leaderboard Config, {config.d_model}/{config.d_ff}/"
        f"{config.num_layers}L/{config.num_heads}H, vocabulary {config.vocab_size:,}, "
        f"{lmcore.count_parameters(config):,} parameters; batch {_BOARD.batch_size} × "
        f"{config.context_length:,} tokens on {_BOARD.num_gpus} GPUs (DDP, ZeRO-1, FSDP: one "
        "sequence per GPU; TP: both on each), causal attention through fa2's Triton kernels.",
        "ckpt_80gb / ckpt_141gb: the activation checkpointing that recomputes least among those "
        "whose predicted peak fits 80 GB / 141 GB (decimal) per GPU, and its peak in GiB; "
        "min_peak: the smallest peak any form reaches. bf16: weights, gradients and AdamW "
        "moments in bf16 (the handout's torch_dtype; lmcore-fused as bench runs it, with "
        "moment_dtype=torch.bfloat16); bf16-master: float32 masters and moments. FSDP is "
        "zero.FSDP, the embedding and the head units of their own.",
        f"Communication and compute for the 80 GB choice (or the smallest peak) at W = "
        f"{bandwidth_gbps:g} GB/s ({BANDWIDTH_SOURCE}) and {rate:g} TFLOP/s ({rate_source}); "
        "the leaderboard itself runs on B200s.",
        *_leaderboard_summary(rows),
    ]
    return Run.create(
        "plan_leaderboard",
        rows,
        device="cpu",
        config={"model": asdict(config), "batch": _BOARD.batch_size,
                "devices": _BOARD.num_gpus,
                "memory_bytes": dict(LEADERBOARD_MEMORY), "bandwidth_gbps": bandwidth_gbps,
                "tflops": rate},
        command=command,
        title="bench-plan: the CS336 2026 leaderboard step (8B, 32,768 tokens, batch 2) on 2 GPUs",
        columns=LEADERBOARD_COLUMNS,
        brief=dict(zip(LEADERBOARD_COLUMNS, LEADERBOARD_COLUMNS, strict=True)),
        notes=notes,
    )  # fmt: skip


def _leaderboard_summary(rows: Sequence[Mapping[str, Any]]) -> list[str]:
    """One sentence per memory: how many combinations fit, the one that recomputes least (ties:
    the least communication), what never fits; and the near misses of the smaller memory."""
    out = []
    layers = _BOARD.model_size.num_layers
    for key, memory in LEADERBOARD_MEMORY.items():
        suffix = key.replace(" ", "").lower()
        fitting = [r for r in rows if r[f"peak_{suffix}"] is not None]
        if not fitting:
            out.append(f"{key} per GPU: nothing fits.")
            continue

        def cost(r: Mapping[str, Any], suffix: str = suffix) -> tuple[int, float, float]:
            spec = Checkpointing.parse(r[f"ckpt_{suffix}"], layers)
            return (spec.recomputed_block_forwards, r["sent_gb"], r[f"peak_{suffix}"])

        best = min(fitting, key=cost)
        pairs = {f"{r['precision']} {r['layout']}" for r in rows}
        never = sorted(pairs - {f"{r['precision']} {r['layout']}" for r in fitting})
        out.append(
            f"{key} per GPU: {len(fitting)} of {len(rows)} combinations fit; the least "
            f"recomputation: {best['precision']}, {best['layout'].upper()}, {best['loss']} loss, "
            f"{best['optimizer']}, checkpointing {best[f'ckpt_{suffix}']} (peak "
            f"{best[f'peak_{suffix}']:,.1f} GiB)"
            + (f"; never fits: {', '.join(never)}" if never else "")
            + "."
        )
        near = [
            r for r in rows
            if memory / GIB < r["min_peak_gib"] <= memory / 1e9
        ]  # fmt: skip
        if near:
            listed = ", ".join(
                f"{r['precision']} {r['layout']} {r['loss']} {r['optimizer']} "
                f"({r['min_peak_gib']:,.1f} GiB)"
                for r in near
            )
            out.append(
                f"{key} read as {memory / 1e9:g} GiB (a GPU's capacity is often quoted in GiB): "
                f"also {listed}, with no headroom for the CUDA context and fragmentation."
            )
    return out


# --- the handout's §8 -------------------------------------------------------------------------


def run_section8(
    setting: ffn.FFNSetting, *, num_dp: int, num_tp: int, command: str | None = None
) -> Run:
    """The handout's §8 answers for `setting`, with `num_dp` data-parallel (or FSDP) and
    `num_tp` tensor-parallel devices: each quantity's formula, value and justification."""
    rows = []

    def add(strategy: str, quantity: str, d: ffn.Derivation) -> None:
        rows.append(
            {"strategy": strategy, "quantity": quantity, "formula": d.formula, "value": d.value,
             "why": d.why}
        )  # fmt: skip

    s = setting
    size = s.weight_bytes
    add("ring", f"alternate all-reduce of S = {size:,.0f} B on N = {num_dp} (s)", ffn.Derivation(
        alternate_ring_all_reduce_seconds(size, num_dp, s.bandwidth), "(N-1)·S/W",
        "each of N-1 steps forwards a whole S-byte tensor instead of an S/N chunk, "
        f"N/2 times the ring all-reduce's "
        f"{ring_all_reduce_seconds(size, num_dp, s.bandwidth):.3g} s",
    ))  # fmt: skip
    for calcs in (
        ffn.data_parallel(s, num_dp),
        ffn.fsdp(s, num_dp),
        ffn.tensor_parallel(s, num_tp),
        ffn.fsdp_tp(s, num_dp, num_tp),
        ffn.fsdp_tp(s, num_dp, num_tp, overlap=False),
    ):
        name = calcs.strategy
        for field_name in ("forward_flops", "backward_flops", "forward_comm_s", "backward_comm_s"):
            add(name, field_name, getattr(calcs, field_name))
    add("DP", "max devices", ffn.data_parallel_max_devices(s))
    backward, forward = ffn.fsdp_max_devices(s)
    add("FSDP", "max devices (backward)", backward)
    add("FSDP", "max devices (forward)", forward)
    backward, forward = ffn.tensor_parallel_max_devices(s)
    add("TP", "max devices (backward)", backward)
    add("TP", "max devices (forward)", forward)
    add("FSDP+TP", "max devices, axes overlapped", ffn.fsdp_tp_max_devices(s, overlap=True))
    add("FSDP+TP", "max devices, shared network", ffn.fsdp_tp_max_devices(s, overlap=False))
    for line in ffn.tensor_parallel_backward_equations():
        rows.append({"strategy": "TP", "quantity": "backward equation", "formula": line})
    return Run.create(
        "plan_section8",
        rows,
        device="cpu",
        config=asdict(setting) | {"num_dp": num_dp, "num_tp": num_tp},
        command=command,
        title=f"bench-plan: the handout's §8 FFN analysis, B={s.batch:,}, D={s.d_model:,}, "
        f"F={s.d_ff:,}, C={s.flops_per_s / 1e12:g} TFLOP/s, W={s.bandwidth / 1e9:g} GB/s",
        columns=SECTION8_COLUMNS,
        brief=dict(zip(SECTION8_COLUMNS, SECTION8_COLUMNS, strict=True)),
        notes=[
            "Values in FLOPs, seconds or devices; weights and activations in FP16 (2 bytes); "
            "communication overlapped with compute unless said otherwise.",
        ],
    )


def run_check(folder: str | Path, *, command: str | None = None) -> Run:
    """`bench.plan.check.check_results` of `folder` as a run (tool `"plan_check"`).

    Raises:
        ValueError: `folder` is not a directory.
    """
    result = check_results(folder)
    return Run.create(
        "plan_check",
        result.rows,
        device="cpu",
        config={"folder": str(folder), "files": result.files},
        command=command,
        title="bench-plan against measurement: predicted and measured memory per device",
        columns=CHECK_COLUMNS,
        brief=dict(zip(CHECK_COLUMNS, CHECK_COLUMNS, strict=True)),
        notes=result.notes,
    )


# --- plots ------------------------------------------------------------------------------------


_LOSS_SHORT = {"materialized": "mat. loss", "fused": "fused loss"}


def plot_plan(run: Run, path: Path) -> Path:
    """The figure of any bench-plan run: memory breakdown bars (plan, leaderboard) or predicted
    against measured (check).

    Raises:
        ValueError: a section-8 run (nothing to draw) or no rows.
    """
    if run.tool == "plan_check":
        rows = [dict(r, kind=r["quantity"].replace(" (implied)", "")) for r in run.rows]
        return scatter_plot(
            rows, x="measured_mib", y="predicted_mib", series="kind", path=path,
            title=run.title, xlabel="measured (MiB)", ylabel="predicted (MiB)",
        )  # fmt: skip
    if run.tool == "plan_leaderboard":
        rows = [
            dict(
                r, label=f"{r['precision']} {r['layout']} {_LOSS_SHORT[r['loss']]} {r['optimizer']}"
            )
            for r in run.rows
        ]
        values = (("min_peak_gib", "smallest peak"), ("peak_80gb", "80 GB choice"))
        return hbar_plot(rows, label="label", values=values, path=path, title=run.title,
                         xlabel="GiB per GPU (80 GB = 74.5 GiB)")  # fmt: skip
    if run.tool != "plan":
        raise ValueError("the §8 answers are a table; nothing to plot")
    rows = [r for r in run.rows if r.get("peak_gib") is not None]
    labelled = [
        dict(r, label=f"{r['size'].split(' ')[0]} {r['precision']} {r['layout']} {r['mesh']}\n"
             f"b{r['batch']} ctx{r['ctx']} {r['checkpointing']} {r['loss']}")
        for r in rows
    ]  # fmt: skip
    panels = (
        Bars(tuple((c, c.removesuffix("_gib")) for c, _ in _CATEGORIES), ylabel="GiB per device",
             title="memory at the peak"),
        Bars((("comm_ms", "communication"), ("compute_ms", "compute")), ylabel="ms per step",
             title="communication and compute (stacked)"),
    )  # fmt: skip
    return stacked_bar_plot(labelled, label="label", panels=panels, path=path, title=run.title)


# --- the command line -------------------------------------------------------------------------


# The gradient buckets the old `--ddp-buckets torch` chose, as the layouts now name them.
_TORCH_BUCKETS = {"ddp": "ddp:torch", "zero1": "zero1:torch-ddp"}


def _plan_given(args: argparse.Namespace, given: dict[str, Any]) -> dict[str, Any]:
    """The fields given, with the old `--ddp-buckets` folded into the layouts' names, and a note
    where `--batch` (per rank now) meets a data-parallel layout."""
    layouts = given.get("layouts", ("single",))
    if args.ddp_buckets is not None:
        print(
            "bench-plan: --ddp-buckets is part of the layout's name now (ddp, zero1: "
            "DDPBucketed's views; ddp:torch, zero1:torch-ddp: torch DDP's buckets)",
            file=sys.stderr,
        )
        if args.ddp_buckets == "torch":
            layouts = tuple(dict.fromkeys(_TORCH_BUCKETS.get(n, n) for n in layouts))
            given = {**given, "layouts": layouts}
    if given.get("batches") and any(LAYOUTS[n].data_parallel for n in layouts):
        print(
            "bench-plan: --batch counts sequences per data-parallel rank, as in every command; "
            "the batch in all is --global-batch",
            file=sys.stderr,
        )
    return given


def _run(config: PlanConfig | None, cli: Invocation) -> Run:
    args, config = cli.args, config or PlanConfig()
    if args.check is not None:
        return run_check(args.check, command=cli.command)
    if args.preset == "leaderboard-2026":
        return run_leaderboard(command=cli.command, bandwidth_gbps=config.bandwidth_gbps,
                               tflops=config.tflops)  # fmt: skip
    with usage_errors(cli.parser):
        if args.section8:
            _, model = config.model_configs()[0]
            rate = config.tflops or default_tflops("bf16")[0]
            setting = ffn.FFNSetting(
                batch=config.global_batch * model.context_length, d_model=model.d_model,
                d_ff=model.d_ff, flops_per_s=rate * 1e12, bandwidth=config.bandwidth_gbps * 1e9,
            )  # fmt: skip
            return run_section8(setting, num_dp=config.dp, num_tp=config.tp, command=cli.command)
        config.plans()  # validate every combination before predicting any
    return run_plan(config, command=cli.command)


TOOL = Tool(run=_run, config=PlanConfig, preset=_plan_given, plot=plot_plan)
