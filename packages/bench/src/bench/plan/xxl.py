"""The 2025 handout's XXL accounting (`communication_accounting`): memory of a stack of
two-matmul FFNs, sharded over FSDP, and the batch that keeps FSDP × TP compute-bound on TPU v5p.

The handout's model: `num_blocks` blocks of two linear layers, (d_model → d_ff) then
(d_ff → d_model), no attention, embeddings, activation function or checkpointing; master
weights, accumulated gradients and AdamW's two moments in FP32 (16 bytes a parameter);
activations and gradient communication in BF16. Saved for backward per block and token: the
block's input (d_model values, for the first weight's gradient) and the first layer's output
(d_ff values, for the second's), 2·(d_model + d_ff) bytes.

Part (c) follows the TPU Scaling Book's mixed FSDP + model-parallel analysis, per layer and
pass, with X the FSDP axis, Y the TP axis (N = X·Y devices), B the global batch in tokens,
W_ici the one-way link bandwidth and M_X, M_Y the links per axis:

    T_math = 4·B·D·F / (N·C)
    T_FSDP = 4·D·F / (Y·W_ici·M_X)      (the weights' TP slice all-gathered over X, in BF16)
    T_TP   = 4·B·D / (X·W_ici·M_Y)      (the activations reduced and gathered over Y, in BF16)

Compute-bound when T_math ≥ both: T_math ≥ T_FSDP gives a per-device batch
`B/N ≥ C / (W_ici·M_X·Y)`; T_math ≥ T_TP gives `Y ≤ F·W_ici·M_Y / C`, independent of the batch.

Example::

    >>> XXL.parameters
    219848638464
    >>> compute_bound_batch(XXL, TPU_V5P).value  # tokens per device
    319.4...
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from bench.plan.ffn import Derivation

__all__ = [
    "H100_BYTES",
    "TPU_V5P",
    "TPU_V5P_BYTES",
    "XXL",
    "FFNStack",
    "Mesh",
    "activation_bytes_per_token",
    "compute_bound_batch",
    "fsdp_devices",
    "state_bytes",
]

# Bytes per parameter kept in FP32: master weight, accumulated gradient, AdamW's two moments.
STATE_BYTES_PER_PARAMETER = 4 + 4 + 2 * 4
# BF16 activations.
ACTIVATION_BYTES = 2
# The handout's device memories: an H100 "80GB" and a TPU v5p's 95 GB (decimal, as written).
H100_BYTES = 80e9
TPU_V5P_BYTES = 95e9


@dataclass(frozen=True)
class FFNStack:
    """`num_blocks` blocks of (d_model → d_ff) and (d_ff → d_model) linear layers."""

    d_model: int
    d_ff: int
    num_blocks: int

    @property
    def parameters(self) -> int:
        return 2 * self.d_model * self.d_ff * self.num_blocks


@dataclass(frozen=True)
class Mesh:
    """The handout's TPU v5p mesh (part (c)): FLOP/s, link bandwidth, axes and their links."""

    flops_per_s: float
    link_bandwidth: float
    fsdp: int  # X
    tp: int  # Y
    fsdp_links: int  # M_X
    tp_links: int  # M_Y

    @property
    def devices(self) -> int:
        return self.fsdp * self.tp


XXL = FFNStack(d_model=16384, d_ff=53248, num_blocks=126)
# The handout's numbers for TPU v5p (from the TPU Scaling Book): W_ici = 2·9·10^10 B/s,
# C = 4.6·10^14 FLOP/s, a 3-D mesh with M_X = 2, M_Y = 1, X = 16 (FSDP), Y = 4 (TP).
TPU_V5P = Mesh(flops_per_s=4.6e14, link_bandwidth=2 * 9e10, fsdp=16, tp=4, fsdp_links=2, tp_links=1)


def state_bytes(model: FFNStack) -> Derivation:
    """(a) Master weights, gradients and optimizer state in FP32: `16·P` bytes."""
    return Derivation(
        STATE_BYTES_PER_PARAMETER * model.parameters,
        "(4 + 4 + 2·4)·P, P = 2·d_model·d_ff·num_blocks",
        "FP32 master weight, accumulated gradient and AdamW's two moments per parameter",
    )


def activation_bytes_per_token(model: FFNStack) -> Derivation:
    """(a) What the forward saves for backward, per token: `2·(d_model + d_ff)·num_blocks`."""
    return Derivation(
        ACTIVATION_BYTES * (model.d_model + model.d_ff) * model.num_blocks,
        "2·(d_model + d_ff)·num_blocks bytes per token",
        "each block keeps its input (for the first weight's gradient) and the first layer's "
        "output (for the second's), in BF16",
    )


def fsdp_devices(model: FFNStack, memory_bytes: float, *, tokens: int = 0) -> Derivation:
    """(b) The fewest FSDP devices whose per-device memory fits `memory_bytes`, with the state
    and half the activations of `tokens` tokens sharded and the other half kept whole:
    `(16·P + A/2)/N + A/2 ≤ M`.

    Raises:
        ValueError: the unsharded half of the activations alone exceeds `memory_bytes`.
    """
    state = state_bytes(model).value
    half = activation_bytes_per_token(model).value * tokens / 2
    if half >= memory_bytes:
        raise ValueError(
            f"half the activations of {tokens:,} tokens ({half / 1e9:.3g} GB) already exceed "
            f"{memory_bytes / 1e9:.3g} GB per device; use fewer tokens per device"
        )
    return Derivation(
        math.ceil((state + half) / (memory_bytes - half)),
        "N ≥ (16·P + A/2) / (M − A/2), A = activations of the batch",
        "per device (16·P + A/2)/N sharded plus A/2 kept whole must fit M",
    )


def compute_bound_batch(model: FFNStack, mesh: Mesh) -> Derivation:
    """(c) The per-device batch (tokens) from which the forward is compute-bound:
    `C / (W_ici·M_X·Y)` (see the module).

    Raises:
        ValueError: Y above `F·W_ici·M_Y / C`: the TP communication alone outlasts the math.
    """
    limit = model.d_ff * mesh.link_bandwidth * mesh.tp_links / mesh.flops_per_s
    if mesh.tp > limit:
        raise ValueError(
            f"TP of {mesh.tp} exceeds F·W·M_Y/C = {limit:.3g}: compute-bound at no batch"
        )
    return Derivation(
        mesh.flops_per_s / (mesh.link_bandwidth * mesh.fsdp_links * mesh.tp),
        "B/N ≥ C / (W_ici·M_X·Y)",
        f"T_math = 4·B·D·F/(N·C) ≥ T_FSDP = 4·D·F/(Y·W_ici·M_X); T_TP is below T_math for "
        f"any batch since Y = {mesh.tp} ≤ F·W_ici·M_Y/C = {limit:.3g}",
    )
