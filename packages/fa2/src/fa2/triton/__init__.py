"""The Triton implementation: kernels (imported on first use), custom ops, autograd Function."""

from fa2.triton.function import FlashAttention2Triton, interpreting

__all__ = ["FlashAttention2Triton", "interpreting"]
