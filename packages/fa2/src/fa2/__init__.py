"""FlashAttention-2 for PyTorch: a tiled PyTorch reference and Triton kernels, forward and backward.

Public API:
    flash_attention(q, k, v, *, causal=False, is_causal=None, scale=None, return_lse=False,
        precision=None, deterministic=True): the front door; Triton on CUDA, tiled PyTorch
        elsewhere.
        k and v may have fewer heads than q (grouped-query attention).
    FlashAttention2Triton, FlashAttention2PyTorch: the autograd Functions,
        `.apply(q, k, v, is_causal=False, scale=None, return_lse=False[, precision=None,
        deterministic=True])`
        with positional options.
    attention_reference(q, k, v, causal=False, scale=None): the materialised oracle.
"""

from fa2.api import flash_attention
from fa2.pytorch import FlashAttention2PyTorch
from fa2.reference import attention_reference
from fa2.triton import FlashAttention2Triton

# The package version; pyproject.toml reads it from here (hatch's version source).
__version__ = "0.1.0"

__all__ = [
    "FlashAttention2PyTorch",
    "FlashAttention2Triton",
    "attention_reference",
    "flash_attention",
]
