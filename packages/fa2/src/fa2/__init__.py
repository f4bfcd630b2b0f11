"""FlashAttention-2 for PyTorch: a tiled PyTorch reference and Triton kernels, forward and backward.

Public API:
    flash_attention(q, k, v, *, causal=False, is_causal=None, scale=None, window_size=(-1, -1),
        softcap=0.0, layout="bhsd", return_lse=False, precision=None, deterministic=True,
        implementation="auto"): the front door; Triton on CUDA, tiled PyTorch elsewhere.
        k and v may have fewer heads than q (grouped-query attention).
    flash_attn_func(q, k, v, ...), flash_attn_varlen_func(q, k, v, cu_seqlens_q, ...),
    flash_attn_qkvpacked_func, flash_attn_kvpacked_func, flash_attn_varlen_qkvpacked_func,
    flash_attn_varlen_kvpacked_func, flash_attn_with_kvcache(q, k_cache, v_cache, k, v, ...):
        flash-attn's interface (its (batch, seq, heads, d) and packed layouts, its bottom-right
        causal alignment, `return_attn_probs`' logsumexp), as a drop-in replacement;
        fa2.bert_padding holds its padding helpers (`unpad_input`, `pad_input`).
    FlashAttention2Triton, FlashAttention2PyTorch: the autograd Functions,
        `.apply(q, k, v, is_causal=False, scale=None, return_lse=False, precision=None,
        deterministic=True, window_size=(-1, -1), softcap=0.0, layout="bhsd", ...)` with
        positional options.
    attention_reference(q, k, v, *, causal=False, scale=None, ...), varlen_attention_reference:
        the materialised oracles.
    fa2.hf.register(): fa2 as an attention implementation of Hugging Face transformers.
"""

from fa2.api import flash_attention
from fa2.dropin import flash_attn_func, flash_attn_varlen_func
from fa2.kvcache import flash_attn_with_kvcache
from fa2.packed import (
    flash_attn_kvpacked_func,
    flash_attn_qkvpacked_func,
    flash_attn_varlen_kvpacked_func,
    flash_attn_varlen_qkvpacked_func,
)
from fa2.pytorch import FlashAttention2PyTorch
from fa2.reference import attention_reference, varlen_attention_reference
from fa2.triton import FlashAttention2Triton

# The package version; pyproject.toml reads it from here (hatch's version source).
__version__ = "0.1.0"

__all__ = [
    "FlashAttention2PyTorch",
    "FlashAttention2Triton",
    "attention_reference",
    "flash_attention",
    "flash_attn_func",
    "flash_attn_kvpacked_func",
    "flash_attn_qkvpacked_func",
    "flash_attn_varlen_func",
    "flash_attn_varlen_kvpacked_func",
    "flash_attn_varlen_qkvpacked_func",
    "flash_attn_with_kvcache",
    "varlen_attention_reference",
]
