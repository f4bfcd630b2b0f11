"""Tile configurations for the kernels, and the small host-side decisions that pick among them.

Each kernel is autotuned over a short list, pruned by head-dim block and element size, so the
first call compiles and times only a handful of variants. The lists were narrowed by sweeping
tile sizes, warps and stages on an H100 (see docs/results/fa2.md). Under Triton's CPU
interpreter a single small config is used: tiles smaller than the test shapes, so that the
masked, ragged and diagonal code paths all run.
"""

from __future__ import annotations

import os

import torch
import triton

__all__ = [
    "INTERPRET",
    "LOG2E",
    "autotuning",
    "block_d",
    "dkdv_configs",
    "dot_precision",
    "dq_configs",
    "forward_configs",
    "prune_dkdv",
    "prune_dq",
    "prune_forward",
    "seq_bucket",
    "upcast",
]

INTERPRET = os.environ.get("TRITON_INTERPRET", "0") == "1"
LOG2E = 1.4426950408889634  # exp(x) = exp2(x * log2(e)): the kernels use the faster exp2


def autotuning() -> bool:
    """Set FA2_AUTOTUNE=0 to skip timing candidates and take each case's first (default) config."""
    return os.environ.get("FA2_AUTOTUNE", "1") != "0"


def block_d(head_dim: int) -> int:
    """Head dim padded to a power of two of at least 16 (the smallest K of a tensor-core dot)."""
    return max(16, triton.next_power_of_2(head_dim))


def seq_bucket(n_q: int, n_k: int) -> int:
    """Autotuning key for the sequence length: tuned once per power of two, from 128 to 16384."""
    return min(max(triton.next_power_of_2(max(n_q, n_k)), 128), 16384)


def upcast(dtype: torch.dtype) -> bool:
    """Triton 3.6's interpreter computes 16-bit `tl.dot` wrongly: upcast there, and only there."""
    return INTERPRET and dtype != torch.float32


def dot_precision(dtype: torch.dtype) -> str:
    """fp32 inputs get exact fp32 dots unless the user allowed TF32 matmuls in torch."""
    if dtype == torch.float32 and not torch.backends.cuda.matmul.allow_tf32:
        return "ieee"
    return "tf32"


def _config(block_m: int, block_n: int, warps: int, stages: int) -> triton.Config:
    meta = {"BLOCK_M": block_m, "BLOCK_N": block_n}
    return triton.Config(meta, num_warps=warps, num_stages=stages)


# (block_m, block_n, warps, stages) candidates by (head-dim block, bytes per element).
# Forward: block_m % block_n == 0 (the causal diagonal starts on a key-tile boundary).
_FORWARD = {
    "small16": [(128, 64, 8, 4), (128, 64, 8, 3), (64, 64, 4, 3), (128, 64, 4, 3)],
    "d128_16": [(128, 64, 8, 3), (128, 64, 8, 2), (128, 128, 8, 2), (64, 64, 4, 3)],
    "d256_16": [(64, 32, 4, 2), (64, 64, 8, 2)],
    "small32": [(64, 32, 4, 2), (64, 64, 4, 2), (32, 32, 4, 2)],
    "large32": [(32, 32, 4, 2), (64, 32, 4, 1)],
}
# dK/dV pass: a program owns block_n keys and walks query tiles of block_m; block_n % block_m == 0.
_DKDV = {
    "small16": [(64, 64, 4, 3), (64, 64, 4, 4), (32, 64, 4, 5), (32, 64, 4, 3)],
    "d128_16": [(64, 64, 8, 2), (64, 64, 4, 3), (32, 64, 4, 3), (64, 128, 8, 2)],
    "d256_16": [(16, 64, 4, 2), (32, 64, 8, 1)],
    "small32": [(32, 64, 4, 2), (32, 32, 4, 2)],
    "large32": [(16, 32, 4, 2), (32, 32, 4, 1)],
}
# dQ pass: a program owns block_m queries and walks key tiles of block_n; block_m % block_n == 0.
_DQ = {
    "small16": [(128, 64, 8, 3), (128, 64, 8, 2), (64, 64, 4, 3), (128, 64, 4, 3)],
    "d128_16": [(128, 64, 8, 2), (64, 64, 4, 3), (128, 32, 8, 2), (64, 32, 4, 3)],
    "d256_16": [(64, 16, 4, 2), (64, 32, 8, 1)],
    "small32": [(64, 32, 4, 2), (32, 32, 4, 2)],
    "large32": [(32, 16, 4, 2), (32, 32, 4, 1)],
}
# The interpreter's one config: tiles smaller than the test shapes, block_m != block_n.
_INTERPRETER = {"forward": (32, 16, 1, 1), "dkdv": (16, 32, 1, 1), "dq": (32, 16, 1, 1)}


def _family(block: int, element_size: int) -> str:
    if element_size == 2:
        return "small16" if block <= 64 else "d128_16" if block == 128 else "d256_16"
    return "small32" if block <= 64 else "large32"


def _all(table: dict[str, list[tuple[int, int, int, int]]], which: str) -> list[triton.Config]:
    if INTERPRET:
        return [_config(*_INTERPRETER[which])]
    unique = dict.fromkeys(entry for entries in table.values() for entry in entries)
    return [_config(*entry) for entry in unique]


def _prune(
    configs: list[triton.Config],
    table: dict[str, list[tuple[int, int, int, int]]],
    named_args: dict,
    kwargs: dict,
) -> list[triton.Config]:
    """Keep the configs listed for this head-dim block and dtype width."""
    wanted = set(table[_family(kwargs["BLOCK_D"], named_args["Q"].element_size())])
    kept = [
        c
        for c in configs
        if (c.kwargs["BLOCK_M"], c.kwargs["BLOCK_N"], c.num_warps, c.num_stages) in wanted
    ] or configs[:1]
    return kept if autotuning() else kept[:1]


def forward_configs() -> list[triton.Config]:
    """Candidate configs of the forward kernel."""
    return _all(_FORWARD, "forward")


def dkdv_configs() -> list[triton.Config]:
    """Candidate configs of the dK/dV kernel."""
    return _all(_DKDV, "dkdv")


def dq_configs() -> list[triton.Config]:
    """Candidate configs of the dQ kernel."""
    return _all(_DQ, "dq")


def prune_forward(configs, named_args, **kwargs):
    """Autotuner hook: the forward configs for this head-dim block and dtype width."""
    return _prune(configs, _FORWARD, named_args, kwargs)


def prune_dkdv(configs, named_args, **kwargs):
    """Autotuner hook: the dK/dV configs for this head-dim block and dtype width."""
    return _prune(configs, _DKDV, named_args, kwargs)


def prune_dq(configs, named_args, **kwargs):
    """Autotuner hook: the dQ configs for this head-dim block and dtype width."""
    return _prune(configs, _DQ, named_args, kwargs)
