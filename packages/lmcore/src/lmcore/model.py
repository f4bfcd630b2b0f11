"""The pre-norm Transformer language model of the CS336 handout."""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch
from torch import nn

from lmcore.attention import CausalSelfAttention
from lmcore.config import DEFAULT_ATTENTION, DEFAULT_ROPE_THETA, ModelConfig, model_config
from lmcore.ffn import SwiGLU
from lmcore.linear import Embedding, LMHead
from lmcore.norm import RMSNorm
from lmcore.rope import RotaryEmbedding

if TYPE_CHECKING:
    from lmcore.documents import Documents
    from lmcore.kv_cache import KVCache, LayerKVCache

__all__ = ["BlockStack", "TransformerBlock", "TransformerLM"]

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

    def forward(
        self,
        x: torch.Tensor,
        *,
        kv_cache: LayerKVCache | None = None,
        documents: Documents | None = None,
    ) -> torch.Tensor:
        """Map the residual stream `(batch, seq, d_model)` to the same shape (with `kv_cache`:
        new tokens after the cached ones; with `documents`: packed rows)."""
        x = x + self.attn(self.ln1(x), kv_cache=kv_cache, documents=documents)
        x = x + self.ffn(self.ln2(x))
        return x


class BlockStack(nn.ModuleList):
    """The model's blocks, run in order: `x ← block(x)` for each.

    A `ModuleList` (blocks are `layers[i]`, state-dict keys `layers.i.…`) that is also callable,
    so that what runs the stack can be swapped without renaming a parameter:
    `apply_activation_checkpointing` replaces it with a subclass that runs segments of blocks
    under checkpoints.
    """

    def forward(
        self,
        x: torch.Tensor,
        *,
        kv_cache: KVCache | None = None,
        documents: Documents | None = None,
    ) -> torch.Tensor:
        """Run every block in order on `x` `(batch, seq, d_model)`, block i with layer i of
        `kv_cache` when decoding with one, each with `documents` of packed rows."""
        for i, block in enumerate(self):
            if kv_cache is not None:
                x = block(x, kv_cache=kv_cache.layer(i))
            else:
                x = block(x) if documents is None else block(x, documents=documents)
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
        >>> loss = model(tokens[:, :-1], targets=tokens[:, 1:])  # fused: no logits held

    Building on the meta device and materialising later skips the slow CPU initialisation::

        >>> with torch.device("meta"):
        ...     model = TransformerLM.from_size("xl", context_length=2048)
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
        self.layers = BlockStack(
            TransformerBlock(config, rope=rope) for _ in range(config.num_layers)
        )
        self.ln_final = RMSNorm(config.d_model)
        self.lm_head = LMHead(config.d_model, config.vocab_size)

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
        context_length: int | None = None,
        vocab_size: int | None = None,
        rope_theta: float = DEFAULT_ROPE_THETA,
        attention: str = DEFAULT_ATTENTION,
        num_kv_heads: int | None = None,
    ) -> TransformerLM:
        """Build a named size of `MODEL_SIZES` (see `model_config` for the arguments).

        Raises:
            ValueError: unknown size (the message lists the valid ones) or attention backend,
                or no context length for a size without its own.
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

    def forward(
        self,
        token_ids: torch.Tensor,
        targets: torch.Tensor | None = None,
        *,
        kv_cache: KVCache | None = None,
        documents: Documents | None = None,
    ) -> torch.Tensor:
        """Next-token logits for every position, or, given targets, the loss without the logits.

        Args:
            token_ids: integer tensor `(batch, seq)` with `1 <= seq <= context_length`.
            targets: integer tensor `(batch, seq)` of next-token ids (or -100 for a position
                to leave out), or None.
            kv_cache: decode against a `KVCache`: `token_ids` are the tokens after the
                `kv_cache.length` cached ones (positions from there on), which they attend to;
                their keys and values are added to the cache. None: the sequence from position 0.
            documents: the rows are documents packed one after another (`Documents`, e.g.
                `Documents.from_tokens(token_ids, eot_id=...)`): each token attends only within
                its document and has its position there. Not with `kv_cache`.

        Returns:
            Without targets, logits `(batch, seq, vocab_size)`; position `i` depends only on
            tokens `0 … i`. With targets, the mean cross-entropy (0-dim float32) computed by
            `fused_linear_cross_entropy`, which never holds the `(batch, seq, vocab_size)`
            logits: the same value as `cross_entropy(model(token_ids), targets)`.

        Raises:
            TypeError: `token_ids` or `targets` is not an integer tensor.
            ValueError: `token_ids` is not 2-D, the sequence is empty or too long (with the
                cached tokens, for the context or the cache), `targets` has another shape, or
                both `kv_cache` and `documents` are given.
        """
        _check_tokens("token_ids", token_ids)
        if token_ids.dim() != 2 or not 1 <= token_ids.shape[1] <= self.config.context_length:
            raise ValueError(
                f"token_ids must have shape (batch, seq) with 1 <= seq <= context_length "
                f"({self.config.context_length}), got {tuple(token_ids.shape)}"
            )
        if targets is not None:
            _check_tokens("targets", targets)
            if targets.shape != token_ids.shape:
                raise ValueError(
                    f"targets must have the shape of token_ids {tuple(token_ids.shape)}, got "
                    f"{tuple(targets.shape)}"
                )
        if kv_cache is not None:
            if documents is not None:
                raise ValueError("decode one sequence with kv_cache, or train on documents")
            kv_cache.check_room(token_ids.shape[1])
        x = self.token_embeddings(token_ids)  # (batch, seq, d_model)
        if kv_cache is None:
            x = self.layers(x) if documents is None else self.layers(x, documents=documents)
        else:
            x = self.layers(x, kv_cache=kv_cache)
            kv_cache.advance(token_ids.shape[1])
        # (batch, seq, vocab_size) logits, or the loss of the targets under them
        return self.lm_head(self.ln_final(x), targets)


def _check_tokens(name: str, tokens: object) -> None:
    if not isinstance(tokens, torch.Tensor) or tokens.dtype not in _TOKEN_DTYPES:
        raise TypeError(
            f"{name} must be an int64 or int32 tensor of shape (batch, seq), got "
            f"{getattr(tokens, 'dtype', type(tokens).__name__)}"
        )
