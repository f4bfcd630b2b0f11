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
from bench.core.hardware import gpu_named
from bench.core.layouts import LAYOUTS, PRECISIONS, planned_precision
from bench.core.memory import GIB
from bench.core.model_options import LOSSES
from bench.core.plots import Bars, hbar_plot, scatter_plot, stacked_bar_plot
from bench.core.results import Keys, Run
from bench.core.shapes import size_label
from bench.core.tool import Invocation, Tool
from bench.plan import ffn
from bench.plan.check import CHECK_COLUMNS, check_results
from bench.plan.collectives import (
    alternate_ring_all_reduce_seconds,
    measured_bandwidth_gbps,
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
from bench.plan.traffic import (
    StepTraffic,
    bandwidth_source,
    default_tflops,
    estimate_traffic,
    recomputed_flops_per_sequence,
)

__all__ = [
    "GPU_FIT_COLUMNS",
    "KEYS",
    "PLAN_COLUMNS",
    "TOOL",
    "PlanConfig",
    "plot_plan",
    "run_check",
    "run_gpu_fit",
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
# Seed 003's Kaggle speedrun: "what trains on 2 x T4 (16 GB) in fp16, at which batch and
# context". Its model sizes (the 2025 handout's, whose xl was 1600 wide), its batch of 4 per GPU,
# contexts 256 to 1024; SDPA's attention (Triton 3.6 compiles fa2's matmuls for a T4 on the CUDA
# cores, not its tensor cores: packages/fa2/README.md) and the trainer's CUDA defaults otherwise.
GPU_FIT_SIZES = ("small", "medium", "large", "xl-2025", "2.7B")
GPU_FIT_LAYOUTS = ("ddp", "zero1", "fsdp")
GPU_FIT_CONTEXTS = (256, 512, 1024)
GPU_FIT_CHECKPOINTING = ("none", "blocks")
GPU_FIT_BATCH = 4
# A T4 talks to its neighbour over PCIe Gen3 x16 (no NVLink): the data sheet's 32 GB/s counts
# both directions, so each GPU sends at 16 GB/s.
T4_LINK_GBPS = 16.0
GPU_FIT_COLUMNS = [
    "size", "params_m", "layout", "precision", "checkpointing",
    *(f"max_batch_ctx{c}" for c in GPU_FIT_CONTEXTS), f"max_ctx_b{GPU_FIT_BATCH}",
    "peak_gib", "fits", "comm_ms", "compute_ms",
]  # fmt: skip


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
KEYS = Keys(
    *PLAN_COLUMNS, *CHECK_COLUMNS, *LEADERBOARD_COLUMNS, *SECTION8_COLUMNS, *GPU_FIT_COLUMNS
)


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
    memory = sweep.memory
    for label, plan in sweep.plans():
        estimate = estimate_memory(plan)
        rate = sweep.rate(plan.precision)
        traffic = estimate_traffic(plan, bandwidth_gbps=sweep.bandwidth_gbps, tflops=rate)
        source = traffic.tflops_source
        if sweep.tflops is None and sweep.gpu is not None:
            source = f"the {sweep.gpu}'s data-sheet {plan.precision_spec.compute} peak"
        sources.add(f"{traffic.tflops:g} TFLOP/s ({source})")
        rows.append(_plan_row(label, plan, estimate, traffic, memory))
        if formulas:
            terms += _term_rows(label, estimate, traffic)
    notes = [
        "Memory: the busiest device at the moment of its peak (peak_phase), in GiB (2^30 B); "
        "what torch.cuda.max_memory_allocated would report, without the CUDA context or the "
        "allocator's cache. params includes fp32 master weights; activations the saved "
        "residuals and autocast's bf16 weight copies; buffers DDP buckets, FSDP gathers and "
        "RoPE tables; temporaries a block's backward working set or the optimizer's.",
        f"Communication: GB (10^9 B) sent per device per step at W = {_bandwidth_text(sweep)}; "
        "compute: lmcore's matmul FLOPs at "
        f"{'; '.join(sorted(sources))}.",
    ]
    if memory is not None:
        whose = f" (the {sweep.gpu}'s)" if sweep.memory_bytes is None else ""
        notes.append(
            f"fits: against {memory / 1e9:g} GB{whose} ({memory / GIB:,.1f} GiB) "
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


def _bandwidth_text(sweep: PlanConfig) -> str:
    if sweep.bandwidth_gbps is None:
        return f"the {bandwidth_source(None)}"
    return f"{sweep.bandwidth_gbps:g} GB/s ({bandwidth_source(sweep.bandwidth_gbps)})"


def _sweep_config(sweep: PlanConfig) -> dict[str, Any]:
    config = asdict(sweep)
    config["models"] = [[label, asdict(model)] for label, model in sweep.model_configs()]
    return config


# --- the leaderboard --------------------------------------------------------------------------


def run_leaderboard(
    *,
    command: str | None = None,
    bandwidth_gbps: float | None = None,
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
        bandwidth_gbps, tflops: W and the FLOP rate for the communication and compute columns
            (W by default: the bandwidth measured on as many GPUs as the step runs on).
        checkpointing: the forms to try (default: every form, `_checkpointing_candidates`).

    Returns:
        A `Run` (tool `"plan_leaderboard"`), a row per (precision, layout, loss, optimizer).
        The default checkpointing forms are `bench.plan.fit.checkpointing_candidates`.
    """
    config = _BOARD.config(attention=_BOARD_ATTENTION)
    if bandwidth_gbps is None:
        bandwidth_gbps = measured_bandwidth_gbps(_BOARD.num_gpus)
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
    rate, rate_source = (tflops, "given") if tflops is not None else default_tflops("bf16")
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
        f"{bandwidth_gbps:g} GB/s ({bandwidth_source(bandwidth_gbps)}) and {rate:g} TFLOP/s "
        f"({rate_source}); "
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
    """One sentence per memory: how many combinations fit, the one that recomputes least (the
    fewest recomputed FLOPs, as `bench.plan.fit.least_recompute` chooses; ties: the least
    communication), what never fits; and the near misses of the smaller memory."""
    out = []
    config = _BOARD.config(attention=_BOARD_ATTENTION)
    layers = config.num_layers
    for key, memory in LEADERBOARD_MEMORY.items():
        suffix = key.replace(" ", "").lower()
        fitting = [r for r in rows if r[f"peak_{suffix}"] is not None]
        if not fitting:
            out.append(f"{key} per GPU: nothing fits.")
            continue

        def cost(r: Mapping[str, Any], suffix: str = suffix) -> tuple[int, float, float]:
            spec = Checkpointing.parse(r[f"ckpt_{suffix}"], layers)
            recomputed = recomputed_flops_per_sequence(config, spec, config.context_length)
            return (recomputed, r["sent_gb"], r[f"peak_{suffix}"])

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


# --- what fits a GPU: seed 003's two T4s ------------------------------------------------------


def run_gpu_fit(
    gpu_name: str,
    *,
    devices: int = 2,
    precision: str = "fp16",
    bandwidth_gbps: float = T4_LINK_GBPS,
    command: str | None = None,
) -> Run:
    """What trains on `devices` GPUs of `gpu_name` in `precision`: per model size, layout and
    activation checkpointing, the largest batch per GPU at each context of `GPU_FIT_CONTEXTS`,
    the longest context at `GPU_FIT_BATCH` sequences per GPU, and the peak, fit, communication
    and compute of that batch at the middle context.

    Under FSDP an autocast precision runs as FSDP's mixed precision and is predicted with
    `bf16-master`'s bytes (`bench.core.layouts.planned_precision`); the `precision` column says
    which was predicted.

    Returns:
        A `Run` (tool `"plan_gpu_fit"`), a row per (size, layout, checkpointing).
    """
    gpu = gpu_named(gpu_name)
    memory = gpu.memory_bytes
    rate = gpu.tflops(PRECISIONS[precision].compute)
    middle = GPU_FIT_CONTEXTS[len(GPU_FIT_CONTEXTS) // 2]
    rows = []
    for size, layout, ckpt in itertools.product(
        GPU_FIT_SIZES, GPU_FIT_LAYOUTS, GPU_FIT_CHECKPOINTING
    ):
        predicted = planned_precision(precision, layout)
        config = lmcore.MODEL_SIZES[size].config(context_length=middle, attention="sdpa")
        plan = TrainingPlan(
            config, batch=GPU_FIT_BATCH * devices, precision=predicted, layout=layout,
            dp=devices, activation_checkpointing=ckpt, optimizer="torch-fused",
        )  # fmt: skip
        estimate = estimate_memory(plan)
        traffic = estimate_traffic(plan, bandwidth_gbps=bandwidth_gbps, tflops=rate)
        row: dict[str, Any] = {
            "size": size_label(
                size, (config.d_model, config.d_ff, config.num_layers, config.num_heads)
            ),
            "params_m": lmcore.count_parameters(config) / 1e6,
            "layout": layout,
            "precision": predicted,
            "checkpointing": ckpt,
        }
        for ctx in GPU_FIT_CONTEXTS:
            at_ctx = replace(plan, model=replace(config, context_length=ctx))
            most = largest_batch(at_ctx, memory)
            row[f"max_batch_ctx{ctx}"] = None if most is None else most // devices
        row[f"max_ctx_b{GPU_FIT_BATCH}"] = largest_seq_len(plan, memory)
        row["peak_gib"] = estimate.peak.total / GIB
        row["fits"] = _fits_text(estimate, memory)
        row["comm_ms"] = traffic.communication_s * 1e3
        row["compute_ms"] = traffic.compute_s * 1e3
        rows.append(row)
    notes = [
        f"{devices} x {gpu.name}: {gpu.memory_gb:g} GB each ({memory / GIB:,.1f} GiB), "
        f"{precision} (loss-scaled; float32 weights, gradients and AdamW moments), SDPA attention, "
        "materialized loss, fused torch AdamW. max_batch_ctxN: the most sequences per GPU whose "
        f"step fits at context N (none: not even one); max_ctx_b{GPU_FIT_BATCH}: the longest "
        f"context at {GPU_FIT_BATCH} sequences per GPU; peak, fits, comm and compute: "
        f"{GPU_FIT_BATCH} sequences per GPU at context {middle}.",
        "Memory is what torch.cuda.max_memory_allocated would report: the CUDA context and the "
        "allocator's cache come on top (`bench-plan --check` measures that remainder).",
        f"Communication at W = {bandwidth_gbps:g} GB/s per GPU (PCIe Gen3 x16 each way); "
        f"compute at the {gpu.name}'s data-sheet {PRECISIONS[precision].compute} peak of "
        f"{rate:g} TFLOP/s ({gpu.source}), a floor on the step's time.",
        *_gpu_fit_summary(rows),
    ]
    return Run.create(
        "plan_gpu_fit",
        rows,
        device="cpu",
        config={"gpu": gpu.name, "devices": devices, "precision": precision,
                "memory_bytes": memory, "bandwidth_gbps": bandwidth_gbps, "tflops": rate,
                "sizes": GPU_FIT_SIZES, "contexts": GPU_FIT_CONTEXTS, "batch": GPU_FIT_BATCH},
        command=command,
        title=f"bench-plan: what trains on {devices} x {gpu.name} ({gpu.memory_gb:g} GB) in "
        f"{precision}",
        columns=GPU_FIT_COLUMNS,
        notes=notes,
    )  # fmt: skip


def _gpu_fit_summary(rows: Sequence[Mapping[str, Any]]) -> list[str]:
    """Per size, in one sentence: the layouts whose seed batch fits at the middle context
    without checkpointing, or with it, or that none does."""
    out = []
    for size in dict.fromkeys(r["size"] for r in rows):
        mine = [r for r in rows if r["size"] == size]
        fits = {
            ckpt: [
                r["layout"]
                for r in mine
                if r["checkpointing"] == ckpt and r["fits"].startswith("yes")
            ]
            for ckpt in GPU_FIT_CHECKPOINTING
        }
        if fits["none"]:
            out.append(f"{size}: fits under {', '.join(fits['none'])} without checkpointing.")
        elif any(fits.values()):
            ckpt, layouts = next((k, v) for k, v in fits.items() if v)
            out.append(f"{size}: fits only with checkpointing {ckpt}, under {', '.join(layouts)}.")
        else:
            out.append(f"{size}: does not fit under any layout or checkpointing here.")
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
    if run.tool == "plan_gpu_fit":
        rows = [dict(r, label=f"{r['size'].split(' ')[0]} {r['layout']} {r['checkpointing']}")
                for r in run.rows]  # fmt: skip
        values = tuple((c, c.replace("max_batch_ctx", "context ")) for c in GPU_FIT_COLUMNS
                       if c.startswith("max_batch"))  # fmt: skip
        return hbar_plot(rows, label="label", values=values, path=path, title=run.title,
                         xlabel="largest batch per GPU (sequences)")  # fmt: skip
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
    if args.preset == "t4x2":
        return run_gpu_fit("T4", devices=2, precision="fp16", command=cli.command)
    with usage_errors(cli.parser):
        if args.section8:
            _, model = config.model_configs()[0]
            rate = config.tflops if config.tflops is not None else default_tflops("bf16")[0]
            bandwidth_gbps = config.bandwidth_gbps or measured_bandwidth_gbps(config.dp)
            setting = ffn.FFNSetting(
                batch=config.global_batch * model.context_length, d_model=model.d_model,
                d_ff=model.d_ff, flops_per_s=rate * 1e12, bandwidth=bandwidth_gbps * 1e9,
            )  # fmt: skip
            return run_section8(setting, num_dp=config.dp, num_tp=config.tp, command=cli.command)
        for _, plan in config.plans():  # validate every combination before predicting any
            config.rate(plan.precision)
    return run_plan(config, command=cli.command)


TOOL = Tool(run=_run, config=PlanConfig, preset=_plan_given, plot=plot_plan)
