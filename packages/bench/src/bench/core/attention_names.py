"""The names of the attention implementations bench-attn and bench-flash put side by side
(`bench.core.attention_impls` says what each runs and builds it), in a module of their own so that
the commands offer them without importing torch."""

from __future__ import annotations

__all__ = ["IMPL_NAMES"]

IMPL_NAMES = (
    "naive",
    "compiled",
    "sdpa",
    "sdpa-flash",
    "sdpa-cudnn",
    "fa2-pytorch",
    "fa2-triton",
    "fa2-triton-compiled",
    "fa2-triton-nondet",
)
