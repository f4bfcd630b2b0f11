"""§8 of the 2026 handout: the analytic problems (ring all-reduce, DP, FSDP, TP, FSDP × TP).

These are answered with bench-plan's formulas (the analytic memory and communication model in
`bench/core/`, built on another branch). Until it is wired in, `analytic_answers` is the one
place the report produces these sections: it states that they are answered by bench-plan and
lists what each problem needs from it.
"""

from __future__ import annotations

from bench.core.document import Block, Paragraph
from bench.handout.results import Results

__all__ = ["ANALYTIC_NEEDS", "analytic_answers"]

# What each §8 problem needs from bench-plan's model, in the handout's symbols: B batch (tokens),
# D and D_FF the widths, W bytes/s of egress per device, C FLOP/s per device, N devices, S bytes.
ANALYTIC_NEEDS: dict[str, str] = {
    "alternate_ring_all_reduce": (
        "the time of the alternate ring all-reduce (each device forwards whole tensors x_i "
        "for N − 1 steps) in terms of S, N and W, beside the reduce-scatter + all-gather "
        "ring's 2·(N − 1)/N · S/W"
    ),
    "data_parallel_calcs": (
        "(a) backward FLOPs of the FFN with N_DP data parallelism, (b) the gradient "
        "all-reduce's time (3·D·D_FF fp16 weights), (c) the largest N_DP before "
        "communication exceeds compute (an inequality in B, D, D_FF, C, W)"
    ),
    "fsdp_calcs": (
        "(a) forward and backward FLOPs, (b) the all-gather (forward, backward) and "
        "reduce-scatter (backward) times, (c) the largest N_FSDP for forward and backward"
    ),
    "tp_calcs": (
        "(a) the backward equations of the column/row-parallel FFN (dW_i, dx with one "
        "all-reduce), (b) forward and backward FLOPs, (c) the all-reduce times, (d) the "
        "largest N_TP for forward and backward"
    ),
    "fsdp_tp_calcs": (
        "(a) forward FLOPs on the N_FSDP × N_TP grid, (b) the forward's communication time as "
        "the max of the FSDP all-gathers and the TP all-reduce, (c) the largest N = N_TP·N_FSDP "
        "at the optimal split with overlapped axes, (d) the same when the axes share the network"
    ),
}


def analytic_answers(problem: str):
    """The answer of §8 problem `problem`.

    THE LEAD WIRES BENCH-PLAN IN HERE: replace the body of `answer` with bench-plan's
    derivation and values for `problem` (formulas from `bench/core/`'s analytic model, numbers
    at the handout's example sizes), returning `Paragraph`s / `Table`s. Until then each §8
    section states that it is answered by bench-plan and what it needs.

    Raises:
        KeyError: `problem` is not one of §8's problems (`ANALYTIC_NEEDS`).
    """
    needs = ANALYTIC_NEEDS[problem]

    def answer(res: Results) -> list[Block]:
        return [
            Paragraph(
                f"Answered by bench-plan (the analytic communication model in `bench/core/`, "
                f"not yet wired into this report). Needs: {needs}."
            )
        ]

    return answer
