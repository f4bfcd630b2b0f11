"""The pre-norm Transformer language model of the CS336 handout."""

from __future__ import annotations

import torch
from torch import nn

from lmcore.attention import CausalSelfAttention
from lmcore.config import (
    DEFAULT_ATTENTION,
    DEFAULT_ROPE_THETA,
    VOCAB_SIZE,
    ModelConfig,
    model_config,
)
from lmcore.ffn import SwiGLU
from lmcore.linear import Embedding, Linear
from lmcore.norm import RMSNorm
from lmcore.rope import RotaryEmbedding

__all__ = ["TransformerBlock", "TransformerLM"]

# The index dtypes torch's embedding lookup accepts.
_TOKEN_DTYPES = (torch.int64, torch.int32)


class TransformerBlock(nn.Module):
    """One pre-norm block: `x + Attn(RMSNorm(x))`, then `x + SwiGLU(RMSNorm(x))`."""

    def __init__(self, config: ModelConfig, *, rope: RotaryEmbedding) -> None:
        super().__init__()
        self.ln1 = RMSNorm(config.d_model)
        self.attn = CausalSelfAttention(
            config.d_model,
            config.num_heads,
            rope=rope,
            attention=config.attention,
            num_kv_heads=config.num_kv_heads,
        )
        self.ln2 = RMSNorm(config.d_model)
        self.ffn = SwiGLU(config.d_model, config.d_ff)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Map the residual stream `(batch, seq, d_model)` to the same shape."""
        x = x + self.attn(self.ln1(x))
        x = x + self.ffn(self.ln2(x))
        return x


class TransformerLM(nn.Module):
    """Decoder-only Transformer LM: embedding, pre-norm blocks, final RMSNorm, untied LM head.

    Each block is causal multi-head self-attention with RoPE followed by a SwiGLU feed-forward
    network, both behind an RMSNorm and added to the residual stream. The LM head has its own
    weight (it is not tied to the embedding), as in the handout. The model knows nothing of
    parallelism, activation checkpointing or optimisers: those are applied around it.

    Args:
        vocab_size: number of token ids.
        context_length: longest sequence accepted.
        d_model: residual stream width.
        num_layers: number of blocks.
        num_heads: attention heads; must divide `d_model` into an even head dimension.
        d_ff: SwiGLU hidden width.
        rope_theta: RoPE base wavelength.
        attention: name of the attention backend (`"naive"`, `"sdpa"`, `"fa2-pytorch"`,
            `"fa2-triton"` or any added with `register_attention`).
        num_kv_heads: key/value heads, each shared by `num_heads // num_kv_heads` query heads
            (grouped-query attention; 1 is multi-query); None gives every head its own.

    Raises:
        ValueError: an invalid size (see `ModelConfig`) or an unknown attention backend.

    Example::

        >>> model = TransformerLM.from_size("small", context_length=256, attention="sdpa")
        >>> logits = model(torch.randint(0, 10_000, (4, 256)))  # (4, 256, 10000)

    Building on the meta device and materialising later skips the slow CPU initialisation::

        >>> with torch.device("meta"):
        ...     model = TransformerLM.from_size("xl", context_length=1024)
        >>> model = model.to_empty(device="cuda")
        >>> model.reset_parameters()
    """

    def __init__(
        self,
        vocab_size: int,
        context_length: int,
        d_model: int,
        num_layers: int,
        num_heads: int,
        d_ff: int,
        *,
        rope_theta: float = DEFAULT_ROPE_THETA,
        attention: str = DEFAULT_ATTENTION,
        num_kv_heads: int | None = None,
    ) -> None:
        super().__init__()
        config = ModelConfig(
            vocab_size=vocab_size,
            context_length=context_length,
            d_model=d_model,
            num_layers=num_layers,
            num_heads=num_heads,
            d_ff=d_ff,
            rope_theta=rope_theta,
            attention=attention,
            num_kv_heads=num_kv_heads,
        )
        self.config = config
        rope = RotaryEmbedding(config.head_dim, config.context_length, theta=config.rope_theta)
        self.token_embeddings = Embedding(config.vocab_size, config.d_model)
        self.layers = nn.ModuleList(
            TransformerBlock(config, rope=rope) for _ in range(config.num_layers)
        )
        self.ln_final = RMSNorm(config.d_model)
        self.lm_head = Linear(config.d_model, config.vocab_size)

    @classmethod
    def from_config(cls, config: ModelConfig) -> TransformerLM:
        """Build the model a `ModelConfig` describes."""
        return cls(
            config.vocab_size,
            config.context_length,
            config.d_model,
            config.num_layers,
            config.num_heads,
            config.d_ff,
            rope_theta=config.rope_theta,
            attention=config.attention,
            num_kv_heads=config.num_kv_heads,
        )

    @classmethod
    def from_size(
        cls,
        size: str,
        *,
        context_length: int,
        vocab_size: int = VOCAB_SIZE,
        rope_theta: float = DEFAULT_ROPE_THETA,
        attention: str = DEFAULT_ATTENTION,
        num_kv_heads: int | None = None,
    ) -> TransformerLM:
        """Build a named size of `MODEL_SIZES` ("small", "medium", "large", "xl", "2.7B", "tiny").

        Raises:
            ValueError: unknown size (the message lists the valid ones) or attention backend.
        """
        return cls.from_config(
            model_config(
                size,
                context_length=context_length,
                vocab_size=vocab_size,
                rope_theta=rope_theta,
                attention=attention,
                num_kv_heads=num_kv_heads,
            )
        )

    @torch.no_grad()
    def reset_parameters(self) -> None:
        """Re-initialise every weight and recompute the RoPE tables, on the current device."""
        for module in self.modules():
            if module is not self and hasattr(module, "reset_parameters"):
                module.reset_parameters()

    def forward(self, token_ids: torch.Tensor) -> torch.Tensor:
        """Next-token logits for every position.

        Args:
            token_ids: integer tensor `(batch, seq)` with `1 <= seq <= context_length`.

        Returns:
            Logits `(batch, seq, vocab_size)`; position `i` depends only on tokens `0 … i`.

        Raises:
            TypeError: `token_ids` is not an integer tensor.
            ValueError: `token_ids` is not 2-D or the sequence is empty or too long.
        """
        if not isinstance(token_ids, torch.Tensor) or token_ids.dtype not in _TOKEN_DTYPES:
            raise TypeError(
                "token_ids must be an int64 or int32 tensor of shape (batch, seq), got "
                f"{getattr(token_ids, 'dtype', type(token_ids).__name__)}"
            )
        if token_ids.dim() != 2 or not 1 <= token_ids.shape[1] <= self.config.context_length:
            raise ValueError(
                f"token_ids must have shape (batch, seq) with 1 <= seq <= context_length "
                f"({self.config.context_length}), got {tuple(token_ids.shape)}"
            )
        x = self.token_embeddings(token_ids)  # (batch, seq, d_model)
        for layer in self.layers:
            x = layer(x)
        return self.lm_head(self.ln_final(x))  # (batch, seq, vocab_size)
