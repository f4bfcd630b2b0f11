"""What one training step of a `TrainingPlan` sends per device, and how long that and its math take.

Per layout, the collectives of one step on the busiest device (sizes from the parameter list of
`bench.plan.params`, costs from the ring formulas of `bench.plan.collectives`):

- `ddp`: one all-reduce of every gradient (in buckets; the total is what counts).
- `zero1` (`zero.ShardedOptimizer`): the same all-reduce, then each owner broadcasts the
  parameters it stepped: `(N−1)/N` of the model per device, as an all-gather. (ZeRO's own stage 1
  reduce-scatters the gradients instead, `(N−1)/N` of them: DDP's volume in all.)
- `fsdp` (`zero.FSDP`, one unit per block): all-gather every sharded weight in the compute dtype
  for forward, again for backward except the root unit (embedding, LM head), which stays gathered;
  reduce-scatter the gradients in the compute dtype; all-reduce the replicated norm gains'
  gradients. Activation checkpointing is assumed to recompute inside the backward's gather.
- `tp` (Megatron-style, no sequence parallelism): per block two all-reduces of the (tokens, d)
  activations in forward (after the attention output and the FFN output projections) and two of
  their gradients in backward, two more per recomputed block forward; one all-reduce of the
  vocabulary-parallel embedding's output; one of the LM head input's gradient; three of a float32
  per token in the vocabulary-parallel cross-entropy (max, sum of exponentials, target logit).
- `fsdp-tp`: FSDP's collectives over the `dp` axis on each rank's tensor-parallel slice, TP's over
  the `tp` axis on its micro-batch.

Compute: `lmcore.training_flops` (forward + backward = 3 forwards) of the device's micro-batch,
divided by the TP ranks, plus one block forward per recomputed block. Time at a FLOP rate (the
measured bf16 matmul ceiling of an H100 by default; the data sheet's fp32 peak for fp32).

Example::

    >>> traffic = estimate_traffic(TrainingPlan(config, batch=8, layout="fsdp", dp=2))
    >>> traffic.communication_s, traffic.compute_s
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import lmcore
from bench.core.hardware import MEASURED_MATMUL_TFLOPS, peak_tflops
from bench.plan.activations import compute_bytes, residual_bytes
from bench.plan.collectives import (
    BANDWIDTH_SOURCE,
    DEFAULT_BANDWIDTH_GBPS,
    MEASURED_BANDWIDTH_SOURCE,
    Collective,
)
from bench.plan.memory import Checkpointing, TrainingPlan
from bench.plan.params import model_parameters

__all__ = [
    "StepTraffic",
    "bandwidth_source",
    "default_tflops",
    "estimate_traffic",
    "recomputed_flops_per_sequence",
    "step_collectives",
    "step_flops",
]


def default_tflops(precision_regime: str) -> tuple[float, str]:
    """The FLOP rate (TFLOP/s) a step's matmuls are assumed to run at, and where it comes from.

    bf16 (autocast or a bf16 model): the measured bf16 matmul ceiling of an H100
    (`bench.core.hardware.MEASURED_MATMUL_TFLOPS`); fp32: the H100 data sheet's fp32 peak
    (PyTorch's default, no TF32).
    """
    if precision_regime == "fp32":
        return peak_tflops("H100", "fp32"), "H100 SXM data-sheet fp32 peak (no TF32)"
    return (
        MEASURED_MATMUL_TFLOPS["H100"]["bf16"],
        "bf16 matmul ceiling measured on an H100 "
        "(docs/results/matmul_ceiling_h100_2026-11-23.json)",
    )


def _fsdp_collectives(plan: TrainingPlan, training: bool) -> list[Collective]:
    prec = plan.precision_spec
    c = prec.compute_bytes
    n = plan.dp
    params = model_parameters(plan.model)

    def padded(p) -> int:
        return -(-p.tp_numel(plan.tp) // n) * n

    sharded = [p for p in params if p.kind != "norm"]
    every = sum(padded(p) for p in sharded)
    blocks = sum(padded(p) for p in sharded if p.block is not None)
    norms = sum(p.tp_numel(plan.tp) for p in params if p.kind == "norm")
    out = [Collective("all-gather", f"weights for forward ({c} B)", c * every, n)]
    if training:
        out += [
            Collective("all-gather", f"block weights again for backward ({c} B)", c * blocks, n),
            Collective("reduce-scatter", f"weight gradients ({c} B)", c * every, n),
            Collective("all-reduce", f"norm gains' gradients ({prec.shard_bytes} B)",
                       prec.shard_bytes * norms, n),
        ]  # fmt: skip
    return out


def _tp_collectives(plan: TrainingPlan, training: bool) -> list[Collective]:
    m = plan.model
    t = plan.tp
    regime = plan.precision_spec.regime
    c = compute_bytes(regime)
    tokens = plan.micro_batch * plan.tokens_per_sequence
    act = c * tokens * m.d_model
    embedding = residual_bytes(regime) * tokens * m.d_model
    recomputed = plan.checkpointing.recomputed_block_forwards if training else 0
    out = [
        Collective("all-reduce", "embedding output (vocab-parallel)", embedding, t, axis="tp"),
        Collective("all-reduce", "block outputs: attention and FFN (forward)", act, t,
                   count=2 * m.num_layers, axis="tp"),
        Collective("all-reduce", "cross-entropy: max, sum of exp, target logit (fp32)",
                   4 * tokens, t, count=3, axis="tp"),
    ]  # fmt: skip
    if training:
        out += [
            Collective("all-reduce", "LM head input's gradient", act, t, axis="tp"),
            Collective("all-reduce", "block inputs' gradients (backward)", act, t,
                       count=2 * m.num_layers, axis="tp"),
        ]  # fmt: skip
        if recomputed:
            out.append(
                Collective("all-reduce", "recomputed block outputs (checkpointing)", act, t,
                           count=2 * recomputed, axis="tp")
            )  # fmt: skip
    return out


def step_collectives(plan: TrainingPlan) -> list[Collective]:
    """The collectives one step of `plan` runs, as the busiest device sees them."""
    training = plan.mode != "forward"
    prec = plan.precision_spec
    layout = plan.family
    params = model_parameters(plan.model)
    numel = sum(p.tp_numel(plan.tp) for p in params)
    out: list[Collective] = []
    if layout in ("ddp", "zero1") and training:
        out.append(
            Collective("all-reduce", f"gradients ({prec.grad_bytes} B)", prec.grad_bytes * numel,
                       plan.dp)
        )  # fmt: skip
        if layout == "zero1" and plan.mode == "train-step":
            out.append(
                Collective("broadcast", f"updated parameters from their owners "
                           f"({prec.param_bytes} B)", prec.param_bytes * numel, plan.dp)
            )  # fmt: skip
    if layout in ("fsdp", "fsdp-tp"):
        out += _fsdp_collectives(plan, training)
    if layout in ("tp", "fsdp-tp"):
        out += _tp_collectives(plan, training)
    return out


def _block_forward_flops_per_token(config: lmcore.ModelConfig, seq_len: int) -> int:
    """One block's forward FLOPs per token: lmcore's count for two layers minus one."""
    two = dataclasses.replace(config, num_layers=2)
    one = dataclasses.replace(config, num_layers=1)
    return lmcore.forward_flops_per_token(two, seq_len=seq_len) - lmcore.forward_flops_per_token(
        one, seq_len=seq_len
    )


def recomputed_flops_per_sequence(
    config: lmcore.ModelConfig, checkpointing: Checkpointing, seq_len: int
) -> int:
    """Matmul FLOPs backward's recomputation adds per sequence of `seq_len` tokens: a block
    forward per recomputed block, less q·kᵀ and softmax·v (4·T·d per token, lmcore's
    convention) where `selective` keeps attention's output."""
    recomputed = checkpointing.recomputed_block_forwards
    kept = recomputed - checkpointing.recomputed_attention_forwards(config.attention)
    block = recomputed * _block_forward_flops_per_token(config, seq_len)
    return seq_len * (block - kept * 4 * seq_len * config.d_model)


def step_flops(plan: TrainingPlan) -> int:
    """Matmul FLOPs of one step on one device (lmcore's count; recomputation included)."""
    b, s = plan.micro_batch, plan.tokens_per_sequence
    count = lmcore.forward_flops if plan.mode == "forward" else lmcore.training_flops
    flops = count(plan.model, batch_size=b, seq_len=s)
    if plan.mode != "forward":
        flops += b * recomputed_flops_per_sequence(plan.model, plan.checkpointing, s)
    return flops // plan.tp


@dataclass(frozen=True)
class StepTraffic:
    """Communication and compute of one step on one device.

    Attributes:
        collectives: every collective, with its size and cost.
        flops: matmul FLOPs (`step_flops`).
        bandwidth_gbps: W, egress per device in GB/s; None: each collective at the bandwidth
            measured for its ring's size (`bench.plan.collectives.measured_bandwidth_gbps`).
        tflops: the FLOP rate assumed.
        bandwidth_source, tflops_source: where those two come from.
    """

    collectives: tuple[Collective, ...]
    flops: int
    bandwidth_gbps: float | None
    tflops: float
    bandwidth_source: str
    tflops_source: str

    @property
    def sent_bytes(self) -> float:
        """Bytes each device sends in one step."""
        return sum(c.sent_bytes for c in self.collectives)

    def axis_seconds(self, axis: str) -> float:
        """Communication time on one mesh axis (`"dp"` or `"tp"`)."""
        return sum(c.seconds(self.bandwidth_gbps) for c in self.collectives if c.axis == axis)

    @property
    def communication_s(self) -> float:
        """Communication time, the two axes overlapped (the slower one counts)."""
        return max(self.axis_seconds("dp"), self.axis_seconds("tp"))

    @property
    def compute_s(self) -> float:
        """Matmul time at `tflops`."""
        return self.flops / (self.tflops * 1e12)


def bandwidth_source(bandwidth_gbps: float | None) -> str:
    """Where a bandwidth W comes from, in words: the measurement it is, or `"given"`."""
    if bandwidth_gbps is None:
        return MEASURED_BANDWIDTH_SOURCE
    return BANDWIDTH_SOURCE if bandwidth_gbps == DEFAULT_BANDWIDTH_GBPS else "given"


def estimate_traffic(
    plan: TrainingPlan,
    *,
    bandwidth_gbps: float | None = None,
    tflops: float | None = None,
) -> StepTraffic:
    """The collectives and FLOPs of one step of `plan`, with their times.

    Args:
        plan: the configuration.
        bandwidth_gbps: W, each device's egress in GB/s (default: the NVLink bus bandwidth
            measured for each collective's ring size; see `bench.plan.collectives`).
        tflops: matmul rate in TFLOP/s (default: `default_tflops` of the plan's precision).

    Raises:
        ValueError: a bandwidth or rate that is not positive.
    """
    if bandwidth_gbps is not None and not bandwidth_gbps > 0:
        raise ValueError(f"bandwidth_gbps must be positive, got {bandwidth_gbps!r}")
    rate, source = default_tflops(plan.precision_spec.regime)
    if tflops is not None:
        if not tflops > 0:
            raise ValueError(f"tflops must be positive, got {tflops!r}")
        rate, source = tflops, "given"
    bw_source = bandwidth_source(bandwidth_gbps)
    return StepTraffic(
        tuple(step_collectives(plan)), step_flops(plan), bandwidth_gbps, rate, bw_source, source
    )
