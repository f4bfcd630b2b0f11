"""§8 of the 2026 handout: the analytic problems (ring all-reduce, DP, FSDP, TP, FSDP × TP).

Answered with bench-plan's formulas (`bench.plan.collectives`, `bench.plan.ffn`):
each answer is the formula in the handout's symbols with its one-sentence justification, and its
value at one worked example, so a reader can check the algebra against numbers. The example is
the FFN of the 2026 `xl` (D = 2560, D_FF = 10240) on a batch of 4 × 2048 tokens, with the
project's measured H100 bf16 matmul rate as C and its measured NVLink bus bandwidth as W (both
cited with their result files); no number here is assumed.
"""

from __future__ import annotations

from collections.abc import Callable

import lmcore
from bench.core.hardware import MEASURED_MATMUL_TFLOPS
from bench.plan import ffn
from bench.plan.collectives import (
    BANDWIDTH_SOURCE,
    DEFAULT_BANDWIDTH_GBPS,
    alternate_ring_all_reduce_seconds,
    ring_all_reduce_seconds,
)
from bench.report.document import Block, Paragraph, Table
from bench.report.results import Results

__all__ = ["ANALYTIC_PROBLEMS", "EXAMPLE", "analytic_answers"]

# The worked example: the 2026 xl's FFN on the handout's batch of 4 sequences of 2048 tokens.
_EXAMPLE_SIZE = "xl"
_EXAMPLE_TOKENS = 4 * 2048
_EXAMPLE_DEVICES = 8  # N for the per-device quantities (N_DP, N_FSDP, N_TP)
_EXAMPLE_GRID = (4, 2)  # (N_FSDP, N_TP) for §8.5
EXAMPLE = ffn.FFNSetting(
    batch=_EXAMPLE_TOKENS,
    d_model=lmcore.MODEL_SIZES[_EXAMPLE_SIZE].d_model,
    d_ff=lmcore.MODEL_SIZES[_EXAMPLE_SIZE].d_ff,
    flops_per_s=MEASURED_MATMUL_TFLOPS["H100"]["bf16"] * 1e12,
    bandwidth=DEFAULT_BANDWIDTH_GBPS * 1e9,
)
_COLUMNS = ("part", "answer", "why", "example")


def _value(quantity: str, value: float) -> str:
    if quantity == "flops":
        return f"{value:.4g} FLOPs"
    if quantity == "seconds":
        return f"{value * 1e3:.4g} ms"
    return f"N ≤ {value:.4g}"


def _row(part: str, d: ffn.Derivation, quantity: str) -> dict[str, str]:
    return {"part": part, "answer": d.formula, "why": d.why, "example": _value(quantity, d.value)}


def _calcs_rows(calcs: ffn.ParallelCalcs, parts: dict[str, str]) -> list[dict[str, str]]:
    """Rows for the FLOPs and communication times a problem asks for (`field -> part label`)."""
    kinds = {"flops": "flops", "comm_s": "seconds"}
    rows = []
    for field, part in parts.items():
        kind = next(v for k, v in kinds.items() if field.endswith(k))
        rows.append(_row(part, getattr(calcs, field), kind))
    return rows


def _alternate_ring() -> list[dict[str, str]]:
    s, n, w = EXAMPLE.weight_bytes, _EXAMPLE_DEVICES, EXAMPLE.bandwidth
    ring = ring_all_reduce_seconds(s, n, w)
    return [
        {
            "part": "time",
            "answer": "(N − 1)·S/W",
            "why": "each of the N − 1 steps sends a whole S-byte tensor x((i−t+1) mod N) instead "
            f"of an S/N chunk, so it takes N/2 times the ring all-reduce's 2·(N − 1)/N·S/W "
            f"({ring * 1e3:.4g} ms in the example)",
            "example": _value("seconds", alternate_ring_all_reduce_seconds(s, n, w)),
        }
    ]


def _data_parallel() -> list[dict[str, str]]:
    calcs = ffn.data_parallel(EXAMPLE, _EXAMPLE_DEVICES)
    return [
        *_calcs_rows(calcs, {"backward_flops": "(a) backward FLOPs"}),
        *_calcs_rows(calcs, {"backward_comm_s": "(b) backward communication"}),
        _row("(c) largest N_DP", ffn.data_parallel_max_devices(EXAMPLE), "devices"),
    ]


def _fsdp() -> list[dict[str, str]]:
    calcs = ffn.fsdp(EXAMPLE, _EXAMPLE_DEVICES)
    backward, forward = ffn.fsdp_max_devices(EXAMPLE)
    return [
        *_calcs_rows(
            calcs,
            {
                "backward_flops": "(a) backward FLOPs",
                "forward_flops": "(a) forward FLOPs",
                "backward_comm_s": "(b) backward communication",
                "forward_comm_s": "(b) forward communication",
            },
        ),
        _row("(c) largest N_FSDP, backward", backward, "devices"),
        _row("(c) largest N_FSDP, forward", forward, "devices"),
    ]


def _tensor_parallel() -> list[dict[str, str]]:
    calcs = ffn.tensor_parallel(EXAMPLE, _EXAMPLE_DEVICES)
    backward, forward = ffn.tensor_parallel_max_devices(EXAMPLE)
    equations = [
        {"part": "(a) backward pass", "answer": line, "why": "", "example": ""}
        for line in ffn.tensor_parallel_backward_equations()
    ]
    return [
        *equations,
        *_calcs_rows(
            calcs,
            {
                "forward_flops": "(b) forward FLOPs",
                "backward_flops": "(b) backward FLOPs",
                "forward_comm_s": "(c) forward communication",
                "backward_comm_s": "(c) backward communication",
            },
        ),
        _row("(d) largest N_TP, backward", backward, "devices"),
        _row("(d) largest N_TP, forward", forward, "devices"),
    ]


def _fsdp_tp() -> list[dict[str, str]]:
    n_fsdp, n_tp = _EXAMPLE_GRID
    calcs = ffn.fsdp_tp(EXAMPLE, n_fsdp, n_tp)
    return [
        *_calcs_rows(
            calcs,
            {
                "forward_flops": "(a) forward FLOPs",
                "forward_comm_s": "(b) forward communication, axes overlapped",
            },
        ),
        _row(
            "(c) largest N, axes overlapped",
            ffn.fsdp_tp_max_devices(EXAMPLE, overlap=True),
            "devices",
        ),
        _row(
            "(d) largest N, shared network",
            ffn.fsdp_tp_max_devices(EXAMPLE, overlap=False),
            "devices",
        ),
    ]


# Each §8 problem: the rows of its answer, and the device counts its example uses.
ANALYTIC_PROBLEMS: dict[str, tuple[Callable[[], list[dict[str, str]]], str]] = {
    "alternate_ring_all_reduce": (_alternate_ring, f"N = {_EXAMPLE_DEVICES}, S = 3·D·D_FF·2 B"),
    "data_parallel_calcs": (_data_parallel, f"N_DP = {_EXAMPLE_DEVICES}"),
    "fsdp_calcs": (_fsdp, f"N_FSDP = {_EXAMPLE_DEVICES}"),
    "tp_calcs": (_tensor_parallel, f"N_TP = {_EXAMPLE_DEVICES}"),
    "fsdp_tp_calcs": (_fsdp_tp, f"N_FSDP = {_EXAMPLE_GRID[0]}, N_TP = {_EXAMPLE_GRID[1]}"),
}


def analytic_answers(problem: str) -> Callable[[Results], list[Block]]:
    """The section of §8 problem `problem`: each part's formula, justification and example value.

    Raises:
        KeyError: `problem` is not one of §8's problems (`ANALYTIC_PROBLEMS`).
    """
    rows_of, devices = ANALYTIC_PROBLEMS[problem]

    def answer(res: Results) -> list[Block]:
        s = EXAMPLE
        text = (
            "Formulas in the handout's symbols (B tokens, D, D_FF, N devices, C FLOP/s, W "
            "bytes/s of egress per device, FP16 weights and activations, communication "
            "overlapped with compute), from bench-plan's model (`bench-plan --section8`). "
            f"Example: the FFN of `{lmcore.describe_size(_EXAMPLE_SIZE)}`, "
            f"B = {s.batch:,} tokens (4 × 2048), {devices}; C = "
            f"{s.flops_per_s / 1e12:g} TFLOP/s, the measured H100 bf16 matmul rate "
            f"(`docs/results/matmul_ceiling_h100_2026-11-23.json`); W = "
            f"{s.bandwidth / 1e9:g} GB/s, the {BANDWIDTH_SOURCE}."
        )
        return [
            Paragraph(f"{text} {res.cite_mentioned(text)}".rstrip()),
            Table(rows_of(), _COLUMNS),
        ]

    return answer
