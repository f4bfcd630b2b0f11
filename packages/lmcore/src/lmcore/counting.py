"""Parameter and FLOP counts of a `TransformerLM`, from its configuration alone (no model needed).

Parameters (vocabulary V, width d, hidden width d_ff, L layers; the LM head is not tied)::

    N = V·d                        token embedding
      + L·(4·d² + 3·d·d_ff + 2·d)  per block: q, k, v, output projections; w1, w2, w3; 2 norms
                                   (with grouped-query attention, 2·d² + 2·d·d_kv for q, k, v,
                                   output; d_kv = num_kv_heads · head_dim)
      + d                          final RMSNorm
      + d·V                        LM head

FLOPs follow the convention of PaLM (Chowdhery et al., 2022, appendix B) that nanoGPT uses for
its MFU estimate: a multiply-add is 2 FLOPs, only matrix multiplications count, and a sequence
of length T costs, per token and per forward pass::

    2·N_matmul + 4·L·T·d       N_matmul = L·(4·d² + 3·d·d_ff) + d·V

`2·N_matmul` is the weights' matmuls (the embedding is a lookup and the norms are elementwise,
so neither counts); `4·L·T·d` is q·kᵀ and softmax·v, 2·T·d each per layer. The convention
counts the full T×T score matrix even though causal attention needs only half of it, so MFU
figures stay comparable with published ones. The backward pass costs twice the forward, so a
training step is 3× the forward: `6·N_matmul + 12·L·T·d` per token.
"""

from __future__ import annotations

from lmcore.config import ModelConfig

__all__ = ["count_parameters", "forward_flops", "forward_flops_per_token", "training_flops"]


def _attention_parameters(config: ModelConfig) -> int:
    """q and output projections d × d; k and v projections d × (kv_heads · head_dim)."""
    d = config.d_model
    return 2 * d * d + 2 * d * config.kv_heads * config.head_dim


def count_parameters(config: ModelConfig) -> int:
    """Number of trainable parameters of `TransformerLM.from_config(config)` (formula above)."""
    d, v = config.d_model, config.vocab_size
    per_block = _attention_parameters(config) + 3 * d * config.d_ff + 2 * d
    return v * d + config.num_layers * per_block + d + d * v


def _matmul_parameters(config: ModelConfig) -> int:
    d = config.d_model
    per_block = _attention_parameters(config) + 3 * d * config.d_ff
    return config.num_layers * per_block + d * config.vocab_size


def _seq_len(config: ModelConfig, seq_len: int | None) -> int:
    if seq_len is None:
        return config.context_length
    if isinstance(seq_len, bool) or not isinstance(seq_len, int) or seq_len < 1:
        raise ValueError(f"seq_len must be a positive integer, got {seq_len!r}")
    return seq_len


def forward_flops_per_token(config: ModelConfig, *, seq_len: int | None = None) -> int:
    """Forward-pass FLOPs per token, `2·N_matmul + 4·L·T·d`, for sequences of `seq_len` tokens.

    Args:
        config: the model's configuration.
        seq_len: sequence length T the attention runs over; defaults to `context_length`.

    Raises:
        ValueError: `seq_len` is not a positive integer.
    """
    t = _seq_len(config, seq_len)
    return 2 * _matmul_parameters(config) + 4 * config.num_layers * t * config.d_model


def forward_flops(config: ModelConfig, *, batch_size: int, seq_len: int | None = None) -> int:
    """Forward-pass FLOPs of one batch of `batch_size` sequences of `seq_len` tokens.

    Raises:
        ValueError: `batch_size` or `seq_len` is not a positive integer.
    """
    if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1:
        raise ValueError(f"batch_size must be a positive integer, got {batch_size!r}")
    t = _seq_len(config, seq_len)
    return batch_size * t * forward_flops_per_token(config, seq_len=t)


def training_flops(config: ModelConfig, *, batch_size: int, seq_len: int | None = None) -> int:
    """FLOPs of one training step (forward + backward = 3× forward) on one batch.

    Divide by the step time and the device's peak FLOP/s to get the model FLOP utilisation.

    Example::

        >>> cfg = model_config("small", context_length=512)
        >>> step_flops = training_flops(cfg, batch_size=8)
        >>> mfu = step_flops / step_seconds / 989e12  # H100 SXM dense bf16 peak
    """
    return 3 * forward_flops(config, batch_size=batch_size, seq_len=seq_len)
